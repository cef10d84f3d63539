"""Reference paged attention in torch: gather each sequence's blocks, then SDPA with a length/causal mask.

The executor calls an attention function of this signature, so a fused paged kernel (a Triton
decode kernel on CUDA) can replace it: ``fn(q, k_pool, v_pool, meta, scale, sliding_window) -> out``
with ``q``/``out`` ``[T, Hq, D]`` (new tokens, sequence after sequence) and pools
``[num_blocks, block_size, Hkv, D]`` that already hold this step's K/V. Over FP8 pools the executor
also passes the layer's ``k_scale`` and ``v_scale`` (keywords); the references then attend in float32
over the dequantized K/V (:mod:`.kv_cache`). A soft-capped layer (Gemma 2's attention logit
soft-capping, :attr:`~trtforge.llm.models.base.DecoderAdapter.softcaps`) gets its cap as ``softcap``
(keyword; none is passed where a layer has no cap): each score s = q . k * scale becomes
``softcap * tanh(s / softcap)`` before the masks. An ALiBi layer (BLOOM, MPT, falcon-rw:
:attr:`~trtforge.llm.models.base.DecoderAdapter.alibi_slopes`) gets its slopes as ``alibi_slopes``
(keyword, a float32 ``[Hq]`` tensor on the pools' device): the score of the query at position p and the
key at position j gets ``slope * (j - p)`` added after any cap, before the masks. A layer with attention
sinks (gpt-oss: :attr:`~trtforge.llm.models.base.DecoderAdapter.sinks`) gets them as ``sinks`` (keyword, a
float32 ``[Hq]`` tensor on the pools' device): head h's sink logit joins each of its rows' softmax as one
more column that gives no value. A chunked layer (Llama 4's:
:attr:`~trtforge.llm.models.base.DecoderAdapter.chunks`) gets its chunk size C as ``chunk`` (keyword): the
query at position p sees only the keys j <= p with ``j >= p - p % C`` (its own chunk of positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trtforge.llm.executors.kv_cache import read_reference
from trtforge.llm.models.base import alibi_bias, visible_keys


@dataclass(frozen=True)
class AttentionMetadata:
    """Device tensors describing one step's ragged batch (see :class:`~.base.StepBatch`)."""

    query_start_loc: torch.Tensor  # int32 [B+1]
    context_lens: torch.Tensor  # int32 [B], K/V length after this step
    block_tables: torch.Tensor  # int32 [B, W]
    query_start_loc_host: Any  # the same on the host (numpy), to plan without a device sync
    context_lens_host: Any
    max_query_len: int
    max_context_len: int
    block_size: int

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class DecodeAttentionFn(Protocol):
    """One query per sequence: ``q`` ``[B, Hq, D]``, tables ``[B, W]``, lengths ``[B]`` -> ``[B, Hq, D]``."""

    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        softcap: float | None = None,
        alibi_slopes: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor: ...


class AttentionFn(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        softcap: float | None = None,
        alibi_slopes: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor: ...


def _gather(pool: torch.Tensor, table: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``[B, W]`` block ids -> ``[B, Hkv, W * block_size, D]`` keys or values (FP8: dequantized with
    `scale` to float32)."""
    num_seqs, width = table.shape
    _, bs, hkv, d = pool.shape
    return read_reference(pool[table].reshape(num_seqs, width * bs, hkv, d).transpose(1, 2), scale)


def _sdpa(
    q,
    k,
    v,
    mask,
    scale,
    softcap: float | None = None,
    bias: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
):
    """SDPA with a bool `mask`; with `softcap`, an ALiBi `bias` (float32, broadcasting against the scores)
    or attention sinks (`sink`: float32, broadcasting against the scores' ``[..., :1]``: each row's sink
    logit), the same in plain torch: scores ``softcap * tanh(s / softcap)`` in the inputs' dtype, as
    transformers' eager Gemma 2 attention computes them, plus the bias in float32, then masked and
    softmaxed in float32 (the sink as one more column, dropped after). (q and k share their heads
    there.)"""
    if softcap is None and bias is None and sink is None:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.float() if bias is None else scores.float() + bias
    scores = scores.masked_fill(~mask, float("-inf"))
    if sink is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        column = sink.expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(weights.to(v.dtype), v)


def _grouped_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
    slopes: torch.Tensor | None = None,
    relative: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
):
    """``q`` ``[S, Hq, D]`` against ``k``/``v`` ``[1, Hkv, L, D]`` with ``mask`` ``[S, L]`` -> ``[S, Hq, D]``
    (`softcap`: :func:`_sdpa`'s; ALiBi `slopes` ``[Hq]`` over each key's position minus its query's,
    `relative` ``[S, L]``; attention `sinks` ``[Hq]``).

    The G query heads of a KV head are stacked as G*S query rows of that head, so GQA runs as plain
    multi-head attention (backends without a GQA kernel then need no repeated K/V).
    """
    s_q, hq, d = q.shape
    hkv = k.shape[1]
    groups = hq // hkv
    qg = q.permute(1, 0, 2).reshape(1, hkv, groups * s_q, d)
    bias = None if slopes is None else _grouped_bias(slopes, relative[None], hkv)
    sink = None if sinks is None else _grouped_sinks(sinks, hkv, s_q)
    out = _sdpa(qg, k, v, mask.repeat(groups, 1)[None, None], scale, softcap, bias, sink)
    return out.reshape(hq, s_q, d).transpose(0, 1)


def _grouped_bias(slopes: torch.Tensor, relative: torch.Tensor, hkv: int) -> torch.Tensor:
    """The ALiBi bias of `relative` ``[B, S, L]`` laid out as the grouped query rows: ``[B, Hkv, G * S, L]``
    (row g * S + s: query head kv * G + g at query s)."""
    bias = alibi_bias(slopes, relative)  # [B, Hq, S, L]
    b, hq, s, n = bias.shape
    return bias.reshape(b, hkv, (hq // hkv) * s, n)


def _grouped_sinks(sinks: torch.Tensor, hkv: int, s: int) -> torch.Tensor:
    """Each grouped query row's sink logit (float32 ``[Hkv, G * S, 1]``; row g * S + s: query head
    kv * G + g), from the layer's `sinks` ``[Hq]``."""
    per_row = sinks.float().reshape(hkv, -1, 1).expand(-1, -1, s)
    return per_row.reshape(hkv, -1, 1)


def paged_decode_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    q_len: int = 1,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """One query per sequence (``q`` ``[B, Hq, D]``) over the first `context_lens` keys of its blocks.

    With `q_len` S > 1, ``q`` is ``[B * S, Hq, D]``: each sequence's last S positions, attended
    LOWER_RIGHT causally (query i sees keys ``j <= L - S + i``); a query that sees no key gets zeros,
    as from the kernel. Shapes depend only on ``block_tables.shape`` (no host sync), so it can be
    captured in a CUDA graph. FP8 pools: float32 attention over K/V dequantized with `k_scale` /
    `v_scale`. `softcap`, `alibi_slopes`, `sinks` and `chunk`: the layer's attention logit soft-cap, ALiBi
    slopes, attention sinks and attention chunk size (module docstring).
    """
    num_seqs, hq, d = q.shape[0] // q_len, q.shape[1], q.shape[2]
    bs, hkv = k_pool.shape[1], k_pool.shape[2]
    table = block_tables.long()
    k, v = _gather(k_pool, table, k_scale), _gather(v_pool, table, v_scale)
    kpos = torch.arange(table.shape[1] * bs, device=q.device)
    last = context_lens.long()[:, None] - q_len + torch.arange(q_len, device=q.device)[None, :]  # [B, S]
    mask = visible_keys(kpos[None, None, :], last[:, :, None], sliding_window, chunk)
    seen = mask.any(-1)  # [B, S]: a query with no key would be NaN in SDPA: it sees all, then gets zeros
    mask |= ~seen[:, :, None]
    # the query heads sharing a KV head become that head's query rows: GQA without repeating K/V
    groups = q.reshape(num_seqs, q_len, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4).to(k.dtype)
    groups = groups.reshape(num_seqs, hkv, (hq // hkv) * q_len, d)
    masks = mask[:, None, None].expand(-1, 1, hq // hkv, -1, -1).reshape(num_seqs, 1, -1, mask.shape[-1])
    bias = None
    if alibi_slopes is not None:
        bias = _grouped_bias(alibi_slopes, (kpos[None, None, :] - last[:, :, None]).float(), hkv)
    sink = None if sinks is None else _grouped_sinks(sinks, hkv, q_len)
    out = _sdpa(groups, k, v, masks, scale, softcap, bias, sink).reshape(num_seqs, hkv, hq // hkv, q_len, d)
    out = out.permute(0, 3, 1, 2, 4).reshape(num_seqs * q_len, hq, d).to(q.dtype)
    if q_len == 1:
        return out
    return out * seen.reshape(-1, 1, 1).to(out.dtype)


def paged_attention_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Attend each new token to its sequence's cached keys at positions <= its own (bottom-right causal).

    Sequences with one new token go through :func:`paged_decode_reference` together; each longer one
    (a prompt chunk) gathers its blocks and runs SDPA with its own causal mask, so no padded
    ``[B, max_query, max_context]`` score tensor is ever formed. With `sliding_window` W a query at
    position p sees keys at positions > p - W. FP8 pools: float32 attention over K/V dequantized with
    `k_scale` / `v_scale`. `softcap`, `alibi_slopes`, `sinks` and `chunk`: the layer's attention logit
    soft-cap, ALiBi slopes, attention sinks and attention chunk size (module docstring).
    """
    out = torch.empty_like(q)
    qsl = meta.query_start_loc_host
    qlens = qsl[1:] - qsl[:-1]
    bs = k_pool.shape[1]
    decode = [i for i, n in enumerate(qlens) if n == 1]
    if decode:
        rows = torch.as_tensor([int(qsl[i]) for i in decode], device=q.device)
        sel = torch.as_tensor(decode, device=q.device)
        width = -(-max(int(meta.context_lens_host[i]) for i in decode) // bs)
        out[rows] = paged_decode_reference(
            q[rows],
            k_pool,
            v_pool,
            meta.block_tables[sel, :width],
            meta.context_lens[sel],
            scale,
            sliding_window,
            k_scale=k_scale,
            v_scale=v_scale,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
            chunk=chunk,
        )
    for i, n in enumerate(qlens):
        if n == 1:
            continue
        lo, hi = int(qsl[i]), int(qsl[i + 1])
        ctx = int(meta.context_lens_host[i])
        table = meta.block_tables[i : i + 1, : -(-ctx // bs)].long()
        k, v = _gather(k_pool, table, k_scale)[:, :, :ctx], _gather(v_pool, table, v_scale)[:, :, :ctx]
        qpos = torch.arange(ctx - (hi - lo), ctx, device=q.device)[:, None]
        kpos = torch.arange(ctx, device=q.device)[None, :]
        mask = visible_keys(kpos, qpos, sliding_window, chunk)
        rel = (kpos - qpos).float()
        out[lo:hi] = _grouped_sdpa(
            q[lo:hi].to(k.dtype), k, v, mask, scale, softcap, alibi_slopes, rel, sinks
        ).to(q.dtype)
    return out
