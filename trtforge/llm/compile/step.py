"""The step modules: one forward of a decoder over new tokens that reads and extends its KV cache,
either a per-row slot cache (:class:`DecoderStep`) or paged block pools (:class:`PagedDecoderStep`).

Prefill (S = prompt length, past_lens = 0) and decode (S = 1) are the same forward with different
shapes. See :mod:`trtforge.llm.compile` for the input/output contracts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trtforge.llm.compile.ops import kv_cache_write, paged_cache_write, paged_gather, step_attention
from trtforge.llm.models.base import alibi_bias, visible_keys
from trtforge.llm.models.families import DecoderSpec, adapter_for


def step_mask(
    past_lens: Tensor,
    new_lens: Tensor,
    seq: Tensor,
    max_seq: int,
    window: int | None,
    chunk: int | None = None,
) -> Tensor:
    """bool [B,1,S,S_max]: query j of row b sees key k iff k <= past+j, k < past+new (and within window, and
    within its chunk)."""
    keys = torch.arange(max_seq, dtype=torch.int64, device=past_lens.device)
    return keys_mask(past_lens, new_lens, seq, keys, window, chunk)


def relative_positions(position_ids: Tensor, keys: Tensor) -> Tensor:
    """float [B,S,L]: each key's position (`keys` [L]) minus each new token's (`position_ids` [B,S]: past +
    j for the real tokens), for ALiBi (whose models read their positions nowhere else)."""
    return (keys[None, None, :] - position_ids.to(torch.int64)[:, :, None]).float()


def keys_mask(
    past_lens: Tensor,
    new_lens: Tensor,
    seq: Tensor,
    keys: Tensor,
    window: int | None,
    chunk: int | None = None,
) -> Tensor:
    """bool [B,1,S,L] for key positions `keys` [L] (the step_mask rule); `chunk` C (Llama 4's chunked
    layers): the query at position p sees only keys >= p - p % C."""
    keys = keys[None, None, :]
    query_pos = (past_lens[:, None] + seq[None, :])[:, :, None]
    return visible_keys(keys, query_pos, window, chunk, end=(past_lens + new_lens)[:, None, None])[:, None]


class DecoderStep(nn.Module):
    """Wraps a HF causal LM: (ids, positions, lengths, caches) -> (logits, updated caches)."""

    def __init__(self, model: nn.Module, max_seq: int, *, all_logits: bool = False):
        super().__init__()
        self.model = model
        self.adapter = adapter_for(model)
        self.adapter.require_fixed_rotary()
        # MoE MLPs as plain ops with fixed shapes: every expert on every token, masked by the routing
        # weights (exact, num_experts / top_k times the expert FLOPs; llm.models.moe)
        self.adapter.moe_formulation = "dense"
        self.spec: DecoderSpec = self.adapter.spec
        self.max_seq = int(max_seq)
        self.all_logits = all_logits
        self.eval()  # inference graph (export_step gives the caller's model its modes back afterwards)

    def cache_shape(self, batch: int) -> tuple[int, int, int, int]:
        """[B, Hkv, S_max, D] of every key_cache.i / value_cache.i."""
        return (batch, self.spec.num_kv_heads, self.max_seq, self.spec.head_dim)

    def _logits(self, x: Tensor, new_lens: Tensor) -> Tensor:
        """FP32 logits of each row's last real new token (or of every position with all_logits)."""
        if not self.all_logits:
            last = (new_lens - 1).clamp(min=0)[:, None, None].expand(-1, 1, x.shape[-1])
            x = torch.gather(x, 1, last)[:, 0]
        return self.adapter.logits(x).float()

    def _embed(self, input_ids: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, Any]:
        """arange(S) (traced as a dynamic size), the hidden states and the rotary tables [B,1,S,R] (the
        adapter's ``rotary_over_heads``)."""
        seq = torch.cumsum(torch.ones_like(input_ids[0]), 0) - 1
        x = self.adapter.embed(input_ids, position_ids)
        return seq, x, self.adapter.rotary_over_heads(self.adapter.rotary(position_ids, x.dtype))

    def _heads(self, i: int, x: Tensor, rope: Any) -> tuple[Tensor, Tensor, Tensor]:
        """Layer i's rotated q, k and v [B, heads, S, D]."""
        q, k, v = (t.transpose(1, 2) for t in self.adapter.qkv(i, x))
        q, k = self.adapter.rotate(i, q, k, rope)
        return q, k, v

    def _key_bounds(self) -> list[tuple[int | None, int | None]]:
        """Each layer's (sliding window, attention chunk): what bounds the keys its mask shows."""
        chunks = self.spec.attention_chunks or [None] * self.spec.num_layers
        return list(zip(self.spec.sliding_windows, chunks))

    def _bias(self, i: int, biases: dict[int, Tensor], relative: Any) -> Tensor | None:
        """Layer i's ALiBi bias [B,H,S,L] (None without slopes), built once a step for each slopes tensor
        the layers share from `relative` (a callable giving :func:`relative_positions`)."""
        slopes = self.adapter.alibi_slopes[i]
        if slopes is None:
            return None
        if id(slopes) not in biases:
            biases[id(slopes)] = alibi_bias(slopes, relative())
        return biases[id(slopes)]

    def _finish(
        self, i: int, x: Tensor, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, bias: Tensor | None
    ) -> Tensor:
        """Attention of layer i (its scale, soft-cap, ALiBi `bias` and attention sinks) over `keys`/`values`
        under `mask`, gated where the family gates it, then the rest of its block."""
        a = self.adapter
        out = step_attention(q, keys, values, mask, a.scales[i], a.softcaps[i], bias, a.sinks[i])
        return a.finish_block(i, x, a.gated(i, x, out.transpose(1, 2).flatten(2)))

    def forward(
        self, input_ids: Tensor, position_ids: Tensor, past_lens: Tensor, new_lens: Tensor, *caches: Tensor
    ) -> tuple[Tensor, ...]:
        seq, x, rope = self._embed(input_ids, position_ids)
        masks: dict[tuple[int | None, int | None], Tensor] = {}
        biases: dict[int, Tensor] = {}
        updated: list[Tensor] = []

        def relative() -> Tensor:
            keys = torch.arange(self.max_seq, dtype=torch.int64, device=past_lens.device)
            return relative_positions(position_ids, keys)

        for i, bound in enumerate(self._key_bounds()):
            if bound not in masks:
                masks[bound] = step_mask(past_lens, new_lens, seq, self.max_seq, *bound)
            q, k, v = self._heads(i, x, rope)
            key_cache = kv_cache_write(caches[2 * i], k, past_lens)
            value_cache = kv_cache_write(caches[2 * i + 1], v, past_lens)
            bias = self._bias(i, biases, relative)
            x = self._finish(i, x, q, key_cache, value_cache, masks[bound], bias)
            updated += [key_cache, value_cache]
        return (self._logits(x, new_lens), *updated)


class PagedDecoderStep(DecoderStep):
    """The same decoder over paged pools [num_blocks, block_size, Hkv, D] addressed by block tables."""

    def __init__(self, model: nn.Module, max_seq: int, block_size: int, *, all_logits: bool = False):
        super().__init__(model, max_seq, all_logits=all_logits)
        self.block_size = int(block_size)

    def pool_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        """[num_blocks, block_size, Hkv, D] of every key_pool.i / value_pool.i."""
        return (num_blocks, self.block_size, self.spec.num_kv_heads, self.spec.head_dim)

    def forward(  # type: ignore[override]
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        past_lens: Tensor,
        new_lens: Tensor,
        block_tables: Tensor,
        slot_mapping: Tensor,
        *pools: Tensor,
    ) -> tuple[Tensor, ...]:
        seq, x, rope = self._embed(input_ids, position_ids)
        masks: dict[tuple[int | None, int | None], Tensor] = {}
        biases: dict[int, Tensor] = {}
        updated: list[Tensor] = []
        for i, bound in enumerate(self._key_bounds()):
            q, k, v = self._heads(i, x, rope)
            key_pool = paged_cache_write(pools[2 * i], k, slot_mapping)
            value_pool = paged_cache_write(pools[2 * i + 1], v, slot_mapping)
            keys = paged_gather(key_pool, block_tables)
            values = paged_gather(value_pool, block_tables)
            if bound not in masks:
                masks[bound] = keys_mask(past_lens, new_lens, seq, _key_positions(keys), *bound)
            bias = self._bias(i, biases, lambda k=keys: relative_positions(position_ids, _key_positions(k)))
            x = self._finish(i, x, q, keys, values, masks[bound], bias)
            updated += [key_pool, value_pool]
        return (self._logits(x, new_lens), *updated)


def _key_positions(keys: Tensor) -> Tensor:
    """0..L-1 for gathered keys [B, Hkv, L, D] (traced as a dynamic size)."""
    return torch.cumsum(torch.ones_like(keys[0, 0, :, 0], dtype=torch.int64), 0) - 1
