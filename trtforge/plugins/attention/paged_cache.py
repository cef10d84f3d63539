"""Reshape-and-cache: write a step's new K/V rows into their cache slots, in place (Triton).

New rows ``k_new/v_new [B, Hkv, S_new, D]`` (any strides, e.g. views of a packed projection) go to
logical positions ``start[b] + i`` of sequence b: in a contiguous cache ``[B, Hkv, S_max, D]`` at
that position, in a paged pool ``[num_blocks, Hkv, block_size, D]`` at slot ``pos % block_size`` of
block ``block_table[b, pos // block_size]``. A negative start skips the sequence (an idle batch slot).
:func:`paged_decode_step` is the PagedAttention op: this write, then the decode kernel.
The caller guarantees ``start[b] + S_new`` fits the cache (the launch checks it only when asked to).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["write_kv_cache"]


@triton.jit
def _write_kv_kernel(
    KN,
    VN,
    KC,
    VC,
    Start,
    Counts,
    Table,
    stride_knb,
    stride_knh,
    stride_knm,
    stride_knd,
    stride_vnb,
    stride_vnh,
    stride_vnm,
    stride_vnd,
    stride_kcb,
    stride_kch,
    stride_kcn,
    stride_kcd,
    stride_vcb,
    stride_vch,
    stride_vcn,
    stride_vcd,
    stride_tb,
    num_kv_heads,
    seq_new,
    offset,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_COUNTS: tl.constexpr,
):
    """Grid (B·S_new, cdiv(Hkv, BLOCK_H)): one program copies BLOCK_H heads of one new token."""
    pid = tl.program_id(0)
    b = (pid // seq_new).to(tl.int64)
    i = pid % seq_new
    start = tl.load(Start + b) + offset
    if HAS_COUNTS:
        count = tl.load(Counts + b)
    else:
        count = seq_new
    if (start >= 0) & (i < count):
        pos = (start + i).to(tl.int64)
        offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        ok = (offs_h < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
        h = offs_h.to(tl.int64)[:, None]
        d = offs_d[None, :]
        k = tl.load(KN + b * stride_knb + h * stride_knh + i * stride_knm + d * stride_knd, mask=ok)
        v = tl.load(VN + b * stride_vnb + h * stride_vnh + i * stride_vnm + d * stride_vnd, mask=ok)
        if PAGE_SIZE > 0:
            blk = tl.load(Table + b * stride_tb + pos // PAGE_SIZE).to(tl.int64)
            slot = pos % PAGE_SIZE
            k_dst = KC + blk * stride_kcb + slot * stride_kcn
            v_dst = VC + blk * stride_vcb + slot * stride_vcn
        else:
            k_dst = KC + b * stride_kcb + pos * stride_kcn
            v_dst = VC + b * stride_vcb + pos * stride_vcn
        tl.store(k_dst + h * stride_kch + d * stride_kcd, k, mask=ok)
        tl.store(v_dst + h * stride_vch + d * stride_vcd, v, mask=ok)


def write_kv_cache(
    k_new: Any,
    v_new: Any,
    k_cache: Any,
    v_cache: Any,
    start: Any,
    block_table: Any | None = None,
    *,
    offset: int = 0,
    counts: Any | None = None,
) -> None:
    """Copy k_new/v_new [B, Hkv, S_new, D] into the caches at positions start[b] + offset + i
    (start int32 [B]; pass the lengths after the append with offset = -S_new). With `counts`
    (int32 [B]) only rows i < counts[b] are written: ragged chunks padded to S_new.

    Contiguous caches are [B, Hkv, S_max, D]; with `block_table` (int32 [B, max_blocks]) they are a
    block pool [num_blocks, Hkv, block_size, D]. Launches on the current stream; returns nothing.
    """
    for name, t in (("k_new", k_new), ("v_new", v_new), ("k_cache", k_cache), ("v_cache", v_cache)):
        if len(t.shape) != 4:
            raise ValueError(f"{name} must be 4-D; got shape {tuple(t.shape)}")
    b, hkv, s_new, d = (int(n) for n in k_new.shape)
    if tuple(v_new.shape) != (b, hkv, s_new, d):
        raise ValueError(f"v_new must match k_new's shape {(b, hkv, s_new, d)}; got {tuple(v_new.shape)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape) or tuple(k_cache.shape[1:2]) != (hkv,):
        raise ValueError(f"caches need one shape, {hkv} kv heads; got {k_cache.shape}, {v_cache.shape}")
    if int(k_cache.shape[3]) != d:
        raise ValueError(f"cache head dim {int(k_cache.shape[3])} differs from the new rows' {d}")
    if len({k_new.dtype, v_new.dtype, k_cache.dtype, v_cache.dtype}) != 1:
        raise ValueError("new rows and caches must share one dtype")
    if tuple(start.shape) != (b,) or start.dtype != torch.int32:
        raise ValueError(f"start must be int32 [B] = [{b}]; got {start.dtype} {tuple(start.shape)}")
    page = 0
    stride_tb = 0
    table = start
    if block_table is not None:
        page = int(k_cache.shape[2])
        if page < 1 or page & (page - 1):
            raise ValueError(f"block size {page} must be a power of two")
        if len(block_table.shape) != 2 or int(block_table.shape[0]) != b or block_table.dtype != torch.int32:
            raise ValueError(f"block_table must be int32 [B, max_blocks] with B = {b}")
        table, stride_tb = block_table, int(block_table.stride(0))
    elif int(k_cache.shape[0]) != b:
        raise ValueError(f"a contiguous cache must be [B={b}, Hkv, S_max, D]; got {tuple(k_cache.shape)}")
    if counts is not None and (tuple(counts.shape) != (b,) or counts.dtype != torch.int32):
        raise ValueError(f"counts must be int32 [B] = [{b}]; got {counts.dtype} {tuple(counts.shape)}")
    if b == 0 or s_new == 0 or hkv == 0:
        return
    block_d = max(16, triton.next_power_of_2(d))
    block_h = min(triton.next_power_of_2(hkv), max(1, 2048 // block_d))
    _write_kv_kernel[(b * s_new, triton.cdiv(hkv, block_h))](
        k_new, v_new, k_cache, v_cache, start, counts if counts is not None else start, table,
        *k_new.stride(), *v_new.stride(), *k_cache.stride(), *v_cache.stride(), stride_tb,
        hkv, s_new, int(offset),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=block_h, PAGE_SIZE=page, HAS_COUNTS=counts is not None,
        num_warps=4,
    )  # fmt: skip


def paged_decode_step(
    q: Any,
    k_new: Any,
    v_new: Any,
    k_pool: Any,
    v_pool: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    scale: float,
    out: Any | None = None,
    config: Any | None = None,
) -> Any:
    """The PagedAttention op on torch tensors: append this step's S_q new K/V rows at positions
    seq_lens[b] - S_q .. seq_lens[b] - 1 of the pools (in place), then attend q over each sequence's
    seq_lens[b] keys (LOWER_RIGHT causal). Returns the attention output [B, Hq, S_q, D]."""
    from trtforge.plugins.attention.decode_kernel import decode_attention

    write_kv_cache(k_new, v_new, k_pool, v_pool, seq_lens, block_table, offset=-int(k_new.shape[2]))
    return decode_attention(q, k_pool, v_pool, seq_lens, block_table, scale=scale, out=out, config=config)
