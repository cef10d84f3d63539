"""The OPT adapter (``OPTForCausalLM``): learned positions offset by 2, optional projections between a
narrower word embedding and the hidden size (OPT-350m), LayerNorm blocks applied before (most sizes) or
after (OPT-350m) each sublayer, ReLU MLP, multi-head attention whose query is scaled as it is projected.

fairseq's other pre-LN decoders (BioGPT, XGLM: :mod:`trtforge.llm.models.fairseq`) are this block with
another position table, final-norm name and attention-scale placement; they subclass :class:`OptStyle`
through its hooks rather than restate it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.llm.models.base import DecoderAdapter, DecoderSpec


class OptStyle(DecoderAdapter):
    """OPT: transformers' ``OPTDecoder`` math around the attention, which runs at scale 1 (the query is
    multiplied by ``head_dim**-0.5`` as HF does, after its projection and bias).

    Hooks for the fairseq relatives: ``body`` (the module holding ``layers`` and the embeddings),
    :attr:`query_prescaled` (False: the attention applies each layer's ``scaling`` to the scores),
    :meth:`_position_table` and :meth:`_final_layer_norm`."""

    family = "opt"
    #: the query is scaled as it is projected and the attention runs at scale 1 (OPT, XGLM); otherwise
    #: the attention scales the scores by the layer's ``scaling`` (BioGPT)
    query_prescaled: bool = True

    def __init__(self, model: nn.Module, user: str = "--generate", body: nn.Module | None = None) -> None:
        body = model.model.decoder if body is None else body
        super().__init__(model, list(body.layers), user)
        self.body = body
        attn = self.layers[0].self_attn
        self.num_heads = self.num_kv_heads = int(attn.num_heads)
        self.head_dim = int(attn.head_dim)
        self.pre_norm = bool(getattr(self.config, "do_layer_norm_before", True))
        prescaled = self.query_prescaled
        self.scales = [1.0 if prescaled else float(layer.self_attn.scaling) for layer in self.layers]
        self._count_rank_heads()

    def _position_table(self) -> tuple[Tensor, int]:
        """The learned position table and the offset added to position ids before indexing it."""
        table = self.body.embed_positions
        return table.weight, int(table.offset)

    def _final_layer_norm(self) -> nn.Module | None:
        """The LayerNorm after the last block (OPT-350m, a post-LN model, has none)."""
        return self.body.final_layer_norm

    def mlp_module(self, i: int) -> nn.Module:
        """The layer itself: OPT's fc1/fc2 sit on it, beside the attention (no MLP module)."""
        return self.layers[i]

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(positions="learned", rotary=None, max_positions=self.max_length)

    @property
    def max_length(self) -> int:
        table, offset = self._position_table()
        return int(table.shape[0] - offset)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.body.embed_tokens(input_ids)
        project_in = getattr(self.body, "project_in", None)
        if project_in is not None:
            x = project_in(x)
        table, offset = self._position_table()
        return x + nn.functional.embedding(position_ids + offset, table)

    def rotary(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> None:
        return None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        layer = self.layers[i]
        attn = layer.self_attn
        h = layer.self_attn_layer_norm(x) if self.pre_norm else x
        q = attn.q_proj(h) * attn.scaling if self.query_prescaled else attn.q_proj(h)
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, attn.k_proj(h), attn.v_proj(h)))  # type: ignore[return-value]

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.out_proj(attn_out)
        if not self.pre_norm:
            x = layer.self_attn_layer_norm(x)
        h = layer.final_layer_norm(x) if self.pre_norm else x
        x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
        return x if self.pre_norm else layer.final_layer_norm(x)

    def final_norm(self, x: Tensor) -> Tensor:
        norm = self._final_layer_norm()
        if norm is not None:
            x = norm(x)
        project_out = getattr(self.body, "project_out", None)
        return x if project_out is None else project_out(x)
