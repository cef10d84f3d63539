"""Paged split-KV decode attention over FP8 pools with both products on FP8 tensor cores (an experiment).

The serving decode kernel (:mod:`trtforge.kernels.decode_attention`) widens every K and V code to FP16
before its products: over FP8 pools it reads ~3.35 TB/s on the H200 against ~4.3 over BF16 pools
(BENCHMARKS.md, sessions 25-27), and removing its byte-wide shared loads did not help. This kernel
converts nothing: each query row is quantized to E4M3 with its own scale (amax / 448), Q·Kᵀ runs on the
K codes as they are, and the softmax numerators (times 448) are quantized to E4M3 for P·V on the V
codes. On sm_90, with 64 query rows (a kv head's group padded) and 4 warps, Triton emits ``wgmma ...
e4m3.e4m3`` for both products (tests/kernels/test_fp8_native_decode.py checks the sm_90 code). At
the default launch (128-key tiles, 4 warps; no config of 4 or 8 warps x 32-128 keys spills) K tiles
arrive by 16-byte ``cp.async``, pipelined; V tiles by 16-byte loads that are then stored transposed into
shared memory a byte at a time (128 ``st.shared.b8`` a tile), because FP8 wgmma takes its B operand
K-major only. A V pool stored keys-major (``[N, Hkv, D, page]`` behind the logical view: session 26's
layout, which serving does not allocate) is read as it lies: V^T tiles by 16-byte ``cp.async``, no
transpose. Its masks then cover whole pages (the block index stays constant over each, which keeps
those loads wide), so a sequence's last page is read past its length: weighted by P = 0, which needs
finite codes there (the FP8 cache writes saturate; pools start zeroed).

Quality: the same rounding, emulated on the reference path over the trained 21M model, costs +0.06%
perplexity over the served FP8 cache (``benchmarks/bench_kv_fp8_quality.py --fp8-native-attention``:
+0.45% against the FP32 cache; issue #28 allows 0.5%).

Scope: one query per sequence, paged pools ``[N, page, Hkv, D]`` in E4M3, GQA groups of up to 64 query
heads, head dims 16..256 (powers of two), no sliding window. Grid (splits, B·Hkv); with more than one
split the partials are combined by the decode kernel's reduction. Serving uses it only where
``triton_attention.FP8_NATIVE_DECODE`` is set (off): its speed on the H200 is unmeasured
(``benchmarks/bench_fp8_native_decode.py`` times it against the serving launch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtforge.kernels.decode_attention import (
    _decode_reduce_kernel,
    _num_sms,
    _reduce_options,
    num_splits_for,
)
from trtforge.kernels.kv_quant import FP8_KV_DTYPE

__all__ = ["BLOCK_M", "fp8_native_paged_decode"]

BLOCK_M = 64  # query rows a program holds: wgmma's M (a group of G query heads, padded)
Q_CODE_MAX = 448.0  # E4M3's largest finite value: a query row's amax maps onto it
P_CODE_SCALE = 256.0  # softmax numerators (<= 1) times this before E4M3: a power of two, below 448


@triton.jit(do_not_specialize=["num_splits", "stride_tb"])
def _fp8_native_decode_kernel(
    Q,
    K,
    V,
    SeqLens,
    Table,
    Out,
    MidO,
    MidL,
    stride_qb,
    stride_qh,
    stride_kn,
    stride_kp,
    stride_kh,
    stride_vn,
    stride_vp,
    stride_vh,
    stride_vd,
    stride_tb,
    stride_ob,
    stride_oh,
    qk_scale,
    v_scale,
    num_splits,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    Q_MAX: tl.constexpr,
    P_SCALE: tl.constexpr,
    V_KEYS_MAJOR: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Grid (num_splits, B·Hkv): one program attends kv head h's query group of sequence b to one
    contiguous run of whole BLOCK_N-key tiles. `qk_scale` is softmax scale x k_scale x log2(e).
    One split: the normalized output goes to Out; more: the partial and its log2-sum-exp to MidO / MidL
    (rows ((b·Hq + hq)·num_splits + split), as the decode kernel's reduction reads them)."""
    if PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes
        gdc_wait()
        gdc_launch_dependents()
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // NUM_KV_HEADS
    h = bh % NUM_KV_HEADS
    seq_len = tl.load(SeqLens + b)
    tiles = tl.cdiv(seq_len, BLOCK_N)
    per_split = tl.cdiv(tiles, num_splits)
    lo = split * per_split * BLOCK_N
    hi = tl.minimum(lo + per_split * BLOCK_N, seq_len)

    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < GROUP
    hq = h * GROUP + rows
    q = tl.load(
        Q + b * stride_qb + hq[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0
    ).to(tl.float32)
    q_amax = tl.max(tl.abs(q), 1)
    q_step = tl.where(q_amax > 0.0, q_amax / Q_MAX, 1.0)  # a row's scale: its amax onto E4M3's largest
    q8 = (q / q_step[:, None]).to(tl.float8e4nv)
    row_scale = q_step * qk_scale

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    table = Table + b.to(tl.int64) * stride_tb
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        key_ok = offs_n < seq_len
        if V_KEYS_MAJOR:  # whole pages, so the block index is constant over each and V loads stay wide
            load_ok = (offs_n // PAGE) * PAGE < seq_len
        else:
            load_ok = key_ok
        block = tl.load(table + offs_n // PAGE, mask=load_ok, other=0).to(tl.int64)
        slot = offs_n % PAGE
        k = tl.load(
            K + block[:, None] * stride_kn + slot[:, None] * stride_kp + h * stride_kh + offs_d[None, :],
            mask=load_ok[:, None],
            other=0.0,
        )
        s = tl.dot(q8, tl.trans(k)) * row_scale[:, None]
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_base = V + h * stride_vh
        if V_KEYS_MAJOR:  # V^T [D, BLOCK_N] with the keys contiguous: K-major for the FP8 wgmma's B
            vt = tl.load(
                v_base + block[None, :] * stride_vn + slot[None, :] + offs_d[:, None] * stride_vd,
                mask=load_ok[None, :],
                other=0.0,
            )
            v = tl.trans(vt)
        else:
            v = tl.load(
                v_base + block[:, None] * stride_vn + slot[:, None] * stride_vp + offs_d[None, :],
                mask=load_ok[:, None],
                other=0.0,
            )
        acc = acc * alpha[:, None] + tl.dot((p * P_SCALE).to(tl.float8e4nv), v)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc * (v_scale / P_SCALE) / l_safe[:, None]
    if num_splits == 1:
        o_ptrs = Out + b * stride_ob + hq[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        mid = (b * NUM_KV_HEADS * GROUP + hq) * num_splits + split
        tl.store(MidO + mid[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))
        tl.store(MidL + mid, lse, mask=row_ok)


def fp8_native_paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int = 128,
    num_warps: int = 4,
    num_stages: int = 2,
    pdl: bool | None = None,
) -> torch.Tensor:
    """Decode attention of ``q`` ``[B, Hq, D]`` (one query a sequence) over its first `seq_lens` keys in
    E4M3 pools ``[N, page, Hkv, D]`` through `block_table` ``[B, W]``, into `out` (same shape as q).
    `num_splits` None: the decode kernel's heuristic (:func:`num_splits_for`). `pdl` None: programmatic
    dependent launches where the GPU has them (as the serving decode launch does)."""
    if k_pool.dtype != FP8_KV_DTYPE or v_pool.dtype != FP8_KV_DTYPE:
        raise ValueError(f"pools must be {FP8_KV_DTYPE}; got {k_pool.dtype} and {v_pool.dtype}")
    if q.dim() != 3 or k_pool.dim() != 4 or tuple(v_pool.shape) != tuple(k_pool.shape):
        raise ValueError(
            f"q must be [B, Hq, D] and the pools one [N, page, Hkv, D] shape; got {tuple(q.shape)}, "
            f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}"
        )
    b, hq, d = (int(n) for n in q.shape)
    _, page, hkv, dk = (int(n) for n in k_pool.shape)
    if dk != d or hq % hkv or hq // hkv > BLOCK_M or d < 16 or d > 256 or d & (d - 1):
        raise ValueError(
            f"head dim {d} (pools: {dk}) must be a power of two in 16..256 and the group Hq / Hkv = "
            f"{hq} / {hkv} a whole number up to {BLOCK_M}"
        )
    v_keys_major = int(v_pool.stride(1)) == 1 and page > 1  # V stored [N, Hkv, D, page]: keys innermost
    v_ok = int(v_pool.stride(3)) == 1 or v_keys_major
    if int(q.stride(2)) != 1 or int(k_pool.stride(3)) != 1 or not v_ok:
        raise ValueError("q and K need a unit head-dim stride, V a unit head-dim or slot stride")
    if tuple(seq_lens.shape) != (b,) or block_table.dim() != 2 or int(block_table.shape[0]) != b:
        raise ValueError(f"seq_lens must be [{b}] and block_table [{b}, W]")
    out = torch.empty_like(q) if out is None else out
    if tuple(out.shape) != (b, hq, d) or int(out.stride(2)) != 1:
        raise ValueError(f"out must be [{b}, {hq}, {d}] with a unit last stride; got {tuple(out.shape)}")
    if b == 0:
        return out
    if pdl is None:
        from trtforge.kernels.gemv import pdl_supported

        pdl = pdl_supported(q.device)
    max_keys = int(block_table.shape[1]) * page
    splits = int(num_splits) if num_splits else num_splits_for(b * hkv, max_keys, _num_sms(), block_n)
    mid_o = q.new_empty((b * hq * splits, d), dtype=torch.float32) if splits > 1 else out
    mid_l = q.new_empty((b * hq * splits,), dtype=torch.float32) if splits > 1 else out
    _fp8_native_decode_kernel[(splits, b * hkv)](
        q, k_pool, v_pool, seq_lens, block_table, out, mid_o, mid_l,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), v_pool.stride(3), block_table.stride(0),
        out.stride(0), out.stride(1), float(scale) * float(k_scale) * 1.4426950408889634, float(v_scale),
        splits, NUM_KV_HEADS=hkv, GROUP=hq // hkv, HEAD_DIM=d, BLOCK_N=block_n, PAGE=page,
        BLOCK_M=BLOCK_M, Q_MAX=Q_CODE_MAX, P_SCALE=P_CODE_SCALE, V_KEYS_MAJOR=v_keys_major, PDL=bool(pdl),
        num_warps=num_warps, num_stages=num_stages, launch_pdl=bool(pdl),
    )  # fmt: skip
    if splits > 1:
        out4 = out.view(b, hq, 1, d)
        _decode_reduce_kernel[(b * hq,)](
            mid_o, mid_l, out4, *out4.stride(), hq, splits, **_reduce_options(1, d, splits, bool(pdl))
        )
    return out
