"""The OPT adapter (``OPTForCausalLM``): learned positions offset by 2, optional projections between a
narrower word embedding and the hidden size (OPT-350m), LayerNorm blocks applied before (most sizes) or
after (OPT-350m) each sublayer, ReLU MLP, multi-head attention whose query is scaled as it is projected."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.llm.models.base import DecoderAdapter, DecoderSpec


class OptStyle(DecoderAdapter):
    """OPT: transformers' ``OPTDecoder`` math around the attention, which runs at scale 1 (the query is
    multiplied by ``head_dim**-0.5`` as HF does, after its projection and bias)."""

    family = "opt"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.model.decoder.layers), user)
        self.body = model.model.decoder
        attn = self.layers[0].self_attn
        self.num_heads = self.num_kv_heads = int(attn.num_heads)
        self.head_dim = int(attn.head_dim)
        self.pre_norm = bool(self.config.do_layer_norm_before)
        self.scales = [1.0] * len(self.layers)
        self._count_rank_heads()

    def mlp_module(self, i: int) -> nn.Module:
        """The layer itself: OPT's fc1/fc2 sit on it, beside the attention (no MLP module)."""
        return self.layers[i]

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(positions="learned", rotary=None, max_positions=self.max_length)

    @property
    def max_length(self) -> int:
        table = self.body.embed_positions
        return int(table.num_embeddings - table.offset)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.body.embed_tokens(input_ids)
        if self.body.project_in is not None:
            x = self.body.project_in(x)
        table = self.body.embed_positions
        return x + nn.functional.embedding(position_ids + table.offset, table.weight)

    def rotary(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> None:
        return None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        layer = self.layers[i]
        attn = layer.self_attn
        h = layer.self_attn_layer_norm(x) if self.pre_norm else x
        q = attn.q_proj(h) * attn.scaling
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
        if self.body.final_layer_norm is not None:
            x = self.body.final_layer_norm(x)
        return x if self.body.project_out is None else self.body.project_out(x)
