"""The Falcon adapter (``FalconForCausalLM``) for its rotary forms: falcon-7b (``multi_query``: one
key/value head after the queries, ``parallel_attn`` with one ``input_layernorm``), falcon-40b/180b
(``new_decoder_architecture``: ``num_kv_heads`` groups, each laid out as its queries then its key and
value, with ``ln_attn`` and ``ln_mlp``, or one ``input_layernorm`` when ``num_ln_in_parallel_attn`` is
1), per-head ``[q, k, v]`` without either, and the serial block (``parallel_attn`` false:
``post_attention_layernorm`` before the MLP). Llama-style rotary tables, LayerNorm, GELU MLP, optional
biases, an LM head without bias (tied by default), no window.

falcon-rw (``alibi``: falcon-rw-1b / 7b, serial blocks with per-head ``[q, k, v]``) has no rotary: ALiBi
position biases instead, BLOOM's slopes (:func:`~trtforge.llm.models.base.bloom_alibi_slopes`) as
transformers' Falcon applies them: rounded to bfloat16, and divided by sqrt(head_dim) (its bias is added
to the mask and so scaled with the scores). transformers multiplies each rounded slope by the key's
position in bfloat16 too, which rounds the product where it needs more than bfloat16's 8 significant
bits (positions past 256, or slopes that are no power of two: more than 8 heads); the adapter's biases are
the exact products (in float32), as trained. The layer forms transformers' own forward cannot run are
refused.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.base import TP_RULE, DecoderSpec, bloom_alibi_slopes, softmax_scale
from trtforge.llm.models.rotary import RotaryDecoder


class FalconStyle(RotaryDecoder):
    """Falcon (``FalconForCausalLM``, body ``model.transformer``; see the module docstring)."""

    family = "falcon"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        c, name = model.config, type(model).__name__
        where = f"{user} cannot run this falcon model {name}"
        super().__init__(model, list(model.transformer.h), user)
        self.body = model.transformer
        self.new = bool(c.new_decoder_architecture)
        self.parallel = bool(c.parallel_attn)
        # 2: ln_attn and ln_mlp (the new architecture's default; its layers write it into the config)
        self.two_norms = c.num_ln_in_parallel_attn == 2
        runs = (self.new and self.parallel and c.num_ln_in_parallel_attn in (1, 2)) or (
            not self.new and not (self.parallel and self.two_norms)
        )
        if not runs:
            raise UserError(
                f"{where}: new_decoder_architecture={c.new_decoder_architecture}, parallel_attn="
                f"{c.parallel_attn} with num_ln_in_parallel_attn={c.num_ln_in_parallel_attn} is a layer "
                "form transformers' own FalconDecoderLayer cannot run (it reads norms it did not make). "
                "Supported: the new architecture with parallel_attn and 1 or 2 norms; the old one serial, "
                "or parallel with one norm."
            )
        attn = self.layers[0].self_attention
        self.num_heads = int(attn.num_heads)
        self.head_dim = int(attn.head_dim)
        self.multi_query = not self.new and bool(c.multi_query)
        self.num_kv_heads = int(c.num_kv_heads) if self.new else 1 if self.multi_query else self.num_heads
        if not self.new and not self.multi_query and int(c.num_kv_heads) != self.num_heads:
            raise UserError(
                f"{where}: num_kv_heads={c.num_kv_heads} with multi_query and new_decoder_architecture off, "
                f"whose fused projection yields one key/value head per query head ({self.num_heads}); "
                "transformers' attention cannot group them either. Set num_kv_heads to "
                f"num_attention_heads ({self.num_heads})."
            )
        self.scales = [softmax_scale(layer.self_attention, self.head_dim) for layer in self.layers]
        self.alibi = bool(getattr(c, "alibi", False))
        if self.alibi:  # transformers': bfloat16 slopes, the bias divided by sqrt(head_dim)
            slopes = bloom_alibi_slopes(self.num_heads).bfloat16().float() / math.sqrt(self.head_dim)
            self.alibi_slopes = [slopes] * self.num_layers
        else:
            self._use_rotary(self.body.rotary_emb)
        self._count_rank_heads()

    @property
    def spec(self) -> DecoderSpec:
        if not self.alibi:
            return super().spec
        return self._spec(positions="alibi", rotary=None, max_positions=self.max_length)

    @property
    def max_length(self) -> int:
        """The trained length (max_position_embeddings; ALiBi itself bounds no position)."""
        return int(self.config.max_position_embeddings) if self.alibi else super().max_length

    @property
    def position_reach(self) -> tuple[int, str] | None:
        """None with ALiBi (nothing bounds its positions), the rotary's reach otherwise."""
        return None if self.alibi else super().position_reach

    def rotary(
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> tuple[Tensor, Tensor] | None:
        """The rotary module's tables; none with ALiBi (falcon-rw)."""
        return None if self.alibi else super().rotary(position_ids, dtype, rope_lens)

    def attention(self, i: int) -> nn.Module:
        """Layer i's attention module (``self_attention``)."""
        return self.layers[i].self_attention

    def attention_layout(self, i: int) -> str | None:
        """The new architecture's ``query_key_value`` is "grouped" (whole KV groups a rank); the MHA forms'
        (falcon-rw, the serial form) "per_head", as the module's names tell."""
        return "grouped" if self.new else super().attention_layout(i)

    def check_shard(self, world: int) -> None:
        """falcon-7b's multi-query form is refused (UserError: its one KV head cannot be split); the grouped
        (falcon-40b/180b) and per-head forms split whole groups or heads a rank (the base class's checks)."""
        if self.multi_query:
            raise UserError(
                f"tensor parallelism is not supported for falcon models ({type(self.model).__name__}) in "
                f"their multi-query form (falcon-7b: multi_query, one KV head after the queries): {TP_RULE} "
                "the single KV head cannot be split over the ranks. Use tensor_parallel_size=1."
            )
        super().check_shard(world)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.word_embeddings(input_ids)

    def _attention_norm(self, i: int, x: Tensor) -> Tensor:
        """What layer i's attention reads: ``ln_attn`` (the new architecture's two norms), else
        ``input_layernorm``."""
        layer = self.layers[i]
        return layer.ln_attn(x) if self.new and self.two_norms else layer.input_layernorm(x)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused ``query_key_value`` viewed as heads of D and cut by the layout (module docstring)."""
        fused = self.layers[i].self_attention.query_key_value(self._attention_norm(i, x))
        heads = fused.unflatten(-1, (-1, self.head_dim))
        if self.new:  # [..., kv, per group + 2, D]: each group's queries, then its key and value
            grouped = heads.unflatten(-2, (self.num_kv_heads, -1))
            return grouped[..., :-2, :].flatten(-3, -2), grouped[..., -2, :], grouped[..., -1, :]
        if self.multi_query:
            q, k, v = heads.split([self.num_heads, 1, 1], dim=-2)
            return q, k, v
        q, k, v = heads.unflatten(-2, (self.num_heads, 3)).unbind(-2)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Parallel: ``x + (mlp(norm) + attn)``, the MLP's norm ``ln_mlp`` or the attention's (recomputed:
        the torch executor runs the two halves of a block as separate pieces); serial: ``h = x + attn``,
        then ``h + mlp(post_attention_layernorm(h))``. HF's sum order."""
        layer = self.layers[i]
        if not self.parallel:
            h = x + layer.self_attention.dense(attn_out)
            return h + layer.mlp(layer.post_attention_layernorm(h))
        return self.parallel_block(
            x,
            lambda: layer.self_attention.dense(attn_out),
            lambda: layer.mlp(layer.ln_mlp(x) if self.new and self.two_norms else self._attention_norm(i, x)),
            lambda attn, mlp: x + (mlp + attn),
        )

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.ln_f(x)
