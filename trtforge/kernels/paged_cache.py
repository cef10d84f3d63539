"""Reshape-and-cache: write a step's new K/V rows into their cache slots, in place (Triton).

New rows ``k_new/v_new [B, Hkv, S_new, D]`` (any strides, e.g. views of a packed projection) go
either to logical positions ``start[b] + i`` of sequence b (:func:`write_kv_cache`): in a contiguous
cache ``[B, Hkv, S_max, D]`` at that position, in a paged pool ``[num_blocks, block_size, Hkv, D]``
at slot ``pos % block_size`` of block ``block_table[b, pos // block_size]``; or to the flat pool slots
``slot_mapping[b, i]`` = block * block_size + offset that the step graph carries
(:func:`write_kv_slots`; a negative slot is skipped). :func:`paged_attention_step` is the
PagedAttention op: the slot write, then the decode (S_q = 1) or chunked-prefill kernel.
The caller guarantees the positions fit the cache (the launch does not check them).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from trtforge.kernels.device_tensor import pool_heads_major
from trtforge.kernels.kv_quant import FP8_KV_DTYPE, inverse_scale

__all__ = ["paged_attention_step", "to_cache", "write_kv_cache", "write_kv_slots"]


@triton.jit
def to_cache(x, inv_scale, DST: tl.constexpr):
    """`x` (float32) as a cache element of type DST: for FP8 E4M3 ``x * inv_scale`` saturated to ±448,
    then rounded to nearest even (:func:`trtforge.kernels.kv_quant.quantize_fp8` in torch); other
    types just rounded."""
    if tl.float8e4nv == DST:
        x = tl.minimum(tl.maximum(x * inv_scale, -448.0), 448.0)
    return x.to(DST)


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
    k_inv_scale,
    v_inv_scale,
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
        k = to_cache(k.to(tl.float32), k_inv_scale, KC.dtype.element_ty)
        v = to_cache(v.to(tl.float32), v_inv_scale, VC.dtype.element_ty)
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
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Copy k_new/v_new [B, Hkv, S_new, D] into the caches at positions start[b] + offset + i
    (start int32 [B]; pass the lengths after the append with offset = -S_new). With `counts`
    (int32 [B]) only rows i < counts[b] are written: ragged chunks padded to S_new.

    Contiguous caches are [B, Hkv, S_max, D]; with `block_table` (int32 [B, max_blocks]) they are a
    block pool [num_blocks, block_size, Hkv, D]. FP8 caches (float8_e4m3fn) store ``x / k_scale`` and
    ``x / v_scale``, saturated (:mod:`trtforge.kernels.kv_quant`); other caches ignore the scales.
    Launches on the current stream; returns nothing.
    """
    if block_table is not None:
        k_cache, v_cache = pool_heads_major(k_cache), pool_heads_major(v_cache)
    b, hkv, s_new, d = _new_rows_shape(k_new, v_new, k_cache, v_cache, "cache")
    if tuple(k_cache.shape) != tuple(v_cache.shape) or tuple(k_cache.shape[1:2]) != (hkv,):
        raise ValueError(f"caches need one shape, {hkv} kv heads; got {k_cache.shape}, {v_cache.shape}")
    if int(k_cache.shape[3]) != d:
        raise ValueError(f"cache head dim {int(k_cache.shape[3])} differs from the new rows' {d}")
    _check_dtypes(k_new, v_new, k_cache, v_cache, "caches")
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
    block_d, block_h = _copy_tiles(d, hkv)
    _write_kv_kernel[(b * s_new, triton.cdiv(hkv, block_h))](
        k_new, v_new, k_cache, v_cache, start, counts if counts is not None else start, table,
        *k_new.stride(), *v_new.stride(), *k_cache.stride(), *v_cache.stride(), stride_tb,
        hkv, s_new, int(offset), inverse_scale(k_scale), inverse_scale(v_scale),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=block_h, PAGE_SIZE=page, HAS_COUNTS=counts is not None,
        num_warps=4,
    )  # fmt: skip


@triton.jit
def _write_slots_kernel(
    KN,
    VN,
    KC,
    VC,
    Slots,
    stride_knb,
    stride_knh,
    stride_knm,
    stride_knd,
    stride_vnb,
    stride_vnh,
    stride_vnm,
    stride_vnd,
    stride_kcb,
    stride_kcn,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vcn,
    stride_vch,
    stride_vcd,
    stride_sb,
    stride_sm,
    num_kv_heads,
    seq_new,
    k_inv_scale,
    v_inv_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    """Grid (B·S_new, cdiv(Hkv, BLOCK_H)): one program copies BLOCK_H heads of one new token."""
    pid = tl.program_id(0)
    b = (pid // seq_new).to(tl.int64)
    i = (pid % seq_new).to(tl.int64)
    flat = tl.load(Slots + b * stride_sb + i * stride_sm).to(tl.int64)
    if flat >= 0:
        blk = flat // PAGE_SIZE
        slot = flat % PAGE_SIZE
        offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        ok = (offs_h < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
        h = offs_h.to(tl.int64)[:, None]
        d = offs_d[None, :]
        k = tl.load(KN + b * stride_knb + h * stride_knh + i * stride_knm + d * stride_knd, mask=ok)
        v = tl.load(VN + b * stride_vnb + h * stride_vnh + i * stride_vnm + d * stride_vnd, mask=ok)
        k_dst = KC + blk * stride_kcb + slot * stride_kcn + h * stride_kch + d * stride_kcd
        v_dst = VC + blk * stride_vcb + slot * stride_vcn + h * stride_vch + d * stride_vcd
        tl.store(k_dst, to_cache(k.to(tl.float32), k_inv_scale, KC.dtype.element_ty), mask=ok)
        tl.store(v_dst, to_cache(v.to(tl.float32), v_inv_scale, VC.dtype.element_ty), mask=ok)


def write_kv_slots(
    k_new: Any,
    v_new: Any,
    k_pool: Any,
    v_pool: Any,
    slot_mapping: Any,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Copy k_new/v_new [B, Hkv, S_new, D] into pools [num_blocks, block_size, Hkv, D] at the flat
    slots slot_mapping[b, i] (int32 [B, S_new], block * block_size + offset; negative: skipped).
    FP8 pools store ``x / k_scale`` and ``x / v_scale``, saturated, as :func:`write_kv_cache` does.

    Every row is written, right-padding rows too (the step graph points them at a scratch slot; where
    several share one, which lands is unspecified). Launches on the current stream; returns nothing.
    """
    b, hkv, s_new, d = _new_rows_shape(k_new, v_new, k_pool, v_pool, "pool")
    if tuple(k_pool.shape) != tuple(v_pool.shape) or tuple(int(n) for n in k_pool.shape[2:]) != (hkv, d):
        raise ValueError(
            f"pools must be [num_blocks, block_size, {hkv}, {d}] each; got {k_pool.shape}, {v_pool.shape}"
        )
    _check_dtypes(k_new, v_new, k_pool, v_pool, "pools")
    if tuple(slot_mapping.shape) != (b, s_new) or slot_mapping.dtype != torch.int32:
        raise ValueError(
            f"slot_mapping must be int32 [B, S_new] = [{b}, {s_new}]; got {slot_mapping.dtype} "
            f"{tuple(slot_mapping.shape)}"
        )
    page = int(k_pool.shape[1])
    if page < 1:
        raise ValueError(f"block size {page} must be >= 1")
    if b == 0 or s_new == 0 or hkv == 0:
        return
    block_d, block_h = _copy_tiles(d, hkv)
    _write_slots_kernel[(b * s_new, triton.cdiv(hkv, block_h))](
        k_new, v_new, k_pool, v_pool, slot_mapping,
        *k_new.stride(), *v_new.stride(), *k_pool.stride(), *v_pool.stride(), *slot_mapping.stride(),
        hkv, s_new, inverse_scale(k_scale), inverse_scale(v_scale),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=block_h, PAGE_SIZE=page, num_warps=4,
    )  # fmt: skip


def _new_rows_shape(
    k_new: Any, v_new: Any, k_cache: Any, v_cache: Any, what: str
) -> tuple[int, int, int, int]:
    """(B, Hkv, S_new, D) of the new rows, after checking that they and the caches (named ``k_{what}``,
    ``v_{what}`` in the message) are 4-D and that v_new has k_new's shape."""
    for name, t in (("k_new", k_new), ("v_new", v_new), (f"k_{what}", k_cache), (f"v_{what}", v_cache)):
        if len(t.shape) != 4:
            raise ValueError(f"{name} must be 4-D; got shape {tuple(t.shape)}")
    b, hkv, s_new, d = (int(n) for n in k_new.shape)
    if tuple(v_new.shape) != (b, hkv, s_new, d):
        raise ValueError(f"v_new must match k_new's shape {(b, hkv, s_new, d)}; got {tuple(v_new.shape)}")
    return b, hkv, s_new, d


def _copy_tiles(head_dim: int, kv_heads: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_H) of both copy kernels: the head dim padded to a power of two (>= 16), and as many
    heads a program as keep it near 2,048 elements."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    return block_d, min(triton.next_power_of_2(kv_heads), max(1, 2048 // block_d))


def _check_dtypes(k_new: Any, v_new: Any, k_cache: Any, v_cache: Any, what: str) -> None:
    """New rows share one dtype, and the caches either that one or FP8 E4M3 (both the same)."""
    if k_new.dtype != v_new.dtype or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k and v must share one dtype; got {k_new.dtype}/{v_new.dtype}, {k_cache.dtype}/{v_cache.dtype}"
        )
    if k_cache.dtype not in (k_new.dtype, FP8_KV_DTYPE):
        raise ValueError(
            f"{what} must be {k_new.dtype} like the new rows, or {FP8_KV_DTYPE}; got {k_cache.dtype}"
        )


def paged_attention_step(
    q: Any,
    k_new: Any,
    v_new: Any,
    k_pool: Any,
    v_pool: Any,
    block_table: Any,
    slot_mapping: Any,
    seq_lens: Any,
    query_lens: Any,
    *,
    scale: float,
    out: Any | None = None,
    config: Any | None = None,
) -> Any:
    """The PagedAttention op on torch tensors: write this step's S_q new K/V rows at their slots
    (in place), then attend query i < query_lens[b] of row b over keys j <= seq_lens[b] -
    query_lens[b] + i of its block table (S_q = 1: the split-KV decode kernel; else chunked prefill).
    Query rows past query_lens[b] (right padding) are left unwritten. Returns the output [B, Hq, S_q, D]."""
    from trtforge.kernels.chunked_prefill import chunked_prefill_attention
    from trtforge.kernels.decode_attention import decode_attention

    write_kv_slots(k_new, v_new, k_pool, v_pool, slot_mapping)
    if int(q.shape[2]) == 1:
        return decode_attention(q, k_pool, v_pool, seq_lens, block_table, scale=scale, out=out, config=config)
    return chunked_prefill_attention(
        q, k_pool, v_pool, seq_lens, block_table, q_lens=query_lens, scale=scale, out=out
    )
