"""The BLOOM adapter (``model_type`` "bloom": ``BloomForCausalLM``, bloom-560m ... bloom-176b, BLOOMZ).

ALiBi positions (no position embedding: each head's slope times the key's distance to its query, added
to the scaled scores: :func:`~trtforge.llm.models.base.bloom_alibi_slopes` on every layer, which every
attention consumer applies), a LayerNorm after the word embeddings (``word_embeddings_layernorm``), the
fused ``query_key_value`` laid out per head as ``[q, k, v]`` (``[heads, 3, head_dim]``), pre-norm blocks
whose residual is the normed input when ``apply_residual_connection_post_layernorm`` is set, BLOOM's tanh
GELU, an LM head tied to the embeddings; no window. With ``pretraining_tp`` > 1 and ``slow_but_exact``
the output projections are summed slice by slice without their biases, as transformers' BLOOM does.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.base import DecoderAdapter, DecoderSpec, bloom_alibi_slopes

# BLOOM's training sequence length (its configs record none; ALiBi itself bounds no position): the
# default cache length of an executor that is given none
TRAINED_LENGTH = 2048


def bloom_gelu(x: Tensor) -> Tensor:
    """BLOOM's tanh GELU, written as transformers' ``bloom_gelu_forward`` writes it (the same operations,
    so the same values in any dtype)."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class BloomStyle(DecoderAdapter):
    """BLOOM (``BloomForCausalLM``, body ``model.transformer``; see the module docstring)."""

    family = "bloom"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.transformer.h), user)
        self.body = model.transformer
        attn = self.layers[0].self_attention
        self.num_heads = self.num_kv_heads = int(attn.num_heads)
        self.head_dim = int(attn.head_dim)
        self.scales = [float(layer.self_attention.inv_norm_factor) for layer in self.layers]
        slopes = bloom_alibi_slopes(self.num_heads)
        self.alibi_slopes = [slopes] * self.num_layers
        c = self.config
        self.post_norm_residual = bool(c.apply_residual_connection_post_layernorm)
        # transformers' slow_but_exact: output projections summed over pretraining_tp slices, no bias
        self.tp_slices = int(c.pretraining_tp) if int(c.pretraining_tp) > 1 and c.slow_but_exact else 0
        self._count_rank_heads()

    def attention(self, i: int) -> nn.Module:
        return self.layers[i].self_attention

    def check_shard(self, world: int) -> None:
        """The general check (each rank takes its heads' ALiBi slopes), and UserError under slow_but_exact,
        whose output projections sum their input in ``pretraining_tp`` slices of the whole width."""
        if self.tp_slices:
            raise UserError(
                f"tensor parallelism is not supported for this bloom model {type(self.model).__name__}: its "
                f"config sets slow_but_exact with pretraining_tp={self.tp_slices}, whose output projections "
                "sum their whole input width in slices (bias dropped), which a rank's share of the columns "
                "does not hold. Set slow_but_exact false, or use tensor_parallel_size=1."
            )
        super().check_shard(world)

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(positions="alibi", rotary=None, max_positions=None)

    @property
    def max_length(self) -> int:
        return int(getattr(self.config, "seq_length", None) or TRAINED_LENGTH)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.word_embeddings_layernorm(self.body.word_embeddings(input_ids))

    def rotary(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> None:
        return None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused ``query_key_value`` viewed as ``[heads, 3, head_dim]``: each head's q, k and v."""
        layer = self.layers[i]
        fused = layer.self_attention.query_key_value(layer.input_layernorm(x))
        q, k, v = fused.unflatten(-1, (self.num_heads, 3, self.head_dim)).unbind(-2)
        return q, k, v

    def _project(self, linear: nn.Linear, x: Tensor) -> Tensor:
        """`linear` of `x`, or with slow_but_exact its input slices' products summed in order, no bias
        (transformers' BLOOM drops the bias there)."""
        if not self.tp_slices:
            return linear(x)
        width = linear.weight.shape[-1] / self.tp_slices
        out = None
        for j in range(self.tp_slices):
            lo, hi = int(j * width), int((j + 1) * width)
            part = nn.functional.linear(x[..., lo:hi], linear.weight[:, lo:hi])
            out = part if out is None else out + part
        return out

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """``h = residual + dense(attn)``, then ``h' = post_attention_layernorm(h)`` and ``residual' +
        mlp(h')``; each residual the block's input (``h``), or its normed form with
        apply_residual_connection_post_layernorm (recomputed: the torch executor runs the two halves of a
        block as separate pieces)."""
        layer = self.layers[i]
        residual = layer.input_layernorm(x) if self.post_norm_residual else x
        h = residual + self._project(layer.self_attention.dense, attn_out)
        normed = layer.post_attention_layernorm(h)
        residual = normed if self.post_norm_residual else h
        mlp = layer.mlp
        return residual + self._project(mlp.dense_4h_to_h, bloom_gelu(mlp.dense_h_to_4h(normed)))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.ln_f(x)
