"""A model split at its attention calls, the torch executor's unit of work: embed, each layer up to
attention (q out, K/V written into the layer's pool), each layer after it, and the LM head.

It runs the family adapter's layer math (:mod:`trtforge.llm.models`) on the flat tokens ``[T, H]`` of
a ragged step, or the fused Llama-style layers (:mod:`.fused_layers`) where the executor made them.
It is :class:`~.piecewise.StepLayers`, so the same object serves eager steps and piecewise graphs.
FP8 pools (``kv_scales`` given) get each layer's K/V quantized with its scales as they are written.
"""

from __future__ import annotations

from typing import Any

import torch

from trtforge.llm.executors.kv_cache import KVScales, write_reference
from trtforge.llm.models.base import DecoderAdapter


class ModelLayers:
    """The model split at its attention calls (:class:`~.piecewise.StepLayers`), fused where it can be."""

    def __init__(
        self,
        adapter: DecoderAdapter,
        fused: Any,
        k_pools: list,
        v_pools: list,
        kv_scales: KVScales | None = None,
    ) -> None:
        self.adapter, self.fused, self.k_pools, self.v_pools = adapter, fused, k_pools, v_pools
        self.num_layers = len(k_pools)
        self.hkv, self.d = adapter.num_kv_heads, adapter.head_dim
        n = self.num_layers
        self.kv_scales = [kv_scales.layer(i) for i in range(n)] if kv_scales is not None else [(1.0, 1.0)] * n

    def embed(
        self, ids: torch.Tensor, positions: torch.Tensor, rope_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Any]:
        """Hidden states and rotary tables (``[T, R]`` for the fused kernels, otherwise what the adapter's
        ``rotary_over_heads`` makes of them: ``[T, 1, R]`` to broadcast over heads); `rope_lens` (each
        token's dynamic-rotary length) only matters to dynamic rotary."""
        if self.fused is None:
            ids, positions = ids.long(), positions.long()
        h = self.adapter.embed(ids, positions)
        rope = self.adapter.rotary(positions, h.dtype, rope_lens)
        return h, rope if self.fused is not None else self.adapter.rotary_over_heads(rope)

    def layer_in(
        self, i: int, h: torch.Tensor, extra: Any, slots: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        kp, vp = self.k_pools[i], self.v_pools[i]
        k_scale, v_scale = self.kv_scales[i]
        if self.fused is not None:
            return self.fused.attention_input(i, h, extra, slots, kp, vp, k_scale, v_scale, out=out)
        q, k, v = self.adapter.qkv(i, h)
        q, k = self.adapter.rotate(i, q, k, extra)
        slots = slots.long()
        write_reference(kp, slots, k, k_scale)
        write_reference(vp, slots, v, v_scale)
        return q if out is None else out.copy_(q)

    def layer_out(
        self, i: int, h: torch.Tensor, o: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.fused is not None:
            return self.fused.finish(i, h, o, out=out)
        x = self.adapter.finish_block(i, h, self.adapter.gated(i, h, o.reshape(h.shape[0], -1)))
        return x if out is None else out.copy_(x)

    def head(self, h: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """LM-head logits of `h`: float32, or in the model's dtype with `float32` False."""
        logits = (self.adapter if self.fused is None else self.fused).logits(h)
        return logits.float() if float32 else logits
