"""Fused layer kernels for Llama-style decoder layers (Triton): fewer, larger kernels per token.

A decode step at batch 1 is ~20 tiny kernels per layer in eager Hugging Face code (RMSNorm alone
is six), and their launch gaps, not the weights' bytes, set its time even inside a CUDA graph.
These are the pieces that cut it down: RMSNorm (one kernel), Qwen3's per-head q/k RMSNorm (one
in-place kernel over the QKV GEMM's output), one kernel that applies RoPE to q and k (only the
leading channels of a partial rotary) and writes k and v into their paged-pool slots, and one
SiLU-and-multiply kernel; the GEMVs with norms and residuals folded in are :mod:`.gemv`, and one
token's norm + QKV GEMV with the RoPE and K/V write as its epilogue over pair-ordered q/k weight rows
(:func:`norm_qkv_rope_cache`, :func:`pair_rows`; off by default: ``FUSED_ROPE`` of the layer). The layer
that strings them together around a model's weights is
:mod:`trtforge.llm.executors.fused_layers`.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtforge.kernels import gemv as _gemv
from trtforge.kernels.fp8_rows import (
    SINGLE_PASS_K,
    cast_e4m3,
    empty_rows,
    hw_cast_default,
    quantize_row_store,
    store_row_scale,
)
from trtforge.kernels.gemv import _norm_rstd, _one_row_sums, _w_chunk, pdl_supported
from trtforge.kernels.kv_quant import inverse_scale
from trtforge.kernels.paged_cache import to_cache
from trtforge.kernels.qweight import Fp8Rows, Fp8Weight


@triton.jit
def _rms_norm_row(x, W, offs, ok, n_cols, eps, DT: tl.constexpr):
    """RMSNorm of one float32 row `x` as transformers' LlamaRMSNorm rounds it: ``x * rsqrt(mean(x^2) +
    eps)`` rounded to the activations' dtype DT, times the weight, rounded again; float32."""
    rstd = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    y = (x * rstd).to(DT).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    return (y * w).to(DT).to(tl.float32)


@triton.jit
def _rms_norm_kernel(X, W, Out, stride_x, stride_o, n_cols, eps, BLOCK: tl.constexpr):
    """One row: x * rsqrt(mean(x^2) + eps) rounded to the input dtype, times the weight (as HF does)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n_cols
    x = tl.load(X + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    y = _rms_norm_row(x, W, offs, ok, n_cols, eps, Out.dtype.element_ty)
    tl.store(Out + row * stride_o + offs, y, mask=ok)


@triton.jit
def _norm_quant_kernel(
    X, Delta, W, H, Q, S, M, n_cols, eps, stride_x, stride_d, stride_h, stride_q,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, HW_CAST: tl.constexpr,
):  # fmt: skip
    """Grid (Mp,): row r's RMSNorm quantized per token into Q / S (the next W8A8 GEMM's input); with
    HAS_DELTA the row is first ``x + delta`` rounded to x's dtype (a residual add) and stored to H (may
    be X: each program reads its row before it writes it). Rows M.. of the padding: zero codes, scale 1."""
    row = tl.program_id(0)
    live = row < M
    r = row.to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n_cols
    x = tl.load(X + r * stride_x + offs, mask=ok & live, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = (x + tl.load(Delta + r * stride_d + offs, mask=ok & live, other=0.0).to(tl.float32)).to(
            H.dtype.element_ty
        )
        tl.store(H + r * stride_h + offs, x, mask=ok & live)
        x = x.to(tl.float32)
    y = _rms_norm_row(x, W, offs, ok, n_cols, eps, X.dtype.element_ty)
    quantize_row_store(y, Q + r * stride_q, S + row, offs, ok, live, HW_CAST)


@triton.jit
def _qk_norm_kernel(QKV, WQ, WK, stride_t, num_heads, eps_q, eps_k, D: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (T, Hq + Hkv), in place: RMSNorm of token t's head h of ``qkv`` with q_norm's weight for a
    query head and k_norm's for a key head (rounded as HF's per-head RMSNorm)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    ok = offs < D
    ptr = QKV + t * stride_t + h * D + offs
    x = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
    is_q = h < num_heads
    rstd = tl.rsqrt(tl.sum(x * x, 0) / D + tl.where(is_q, eps_q, eps_k))
    y = (x * rstd).to(QKV.dtype.element_ty).to(tl.float32)
    wq = tl.load(WQ + offs, mask=ok & is_q, other=0.0).to(tl.float32)
    wk = tl.load(WK + offs, mask=ok & (h >= num_heads), other=0.0).to(tl.float32)
    tl.store(ptr, (y * tl.where(is_q, wq, wk)).to(QKV.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_part(GU_row, offs, mask, inter, DT: tl.constexpr):
    """``silu(gate) * up`` at columns `offs` of one ``[gate | up]`` row, each op rounded to DT as eager
    16-bit torch rounds it; float32."""
    g = tl.load(GU_row + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU_row + inter + offs, mask=mask, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(DT).to(tl.float32)
    return (act * u).to(DT).to(tl.float32)


@triton.jit
def _silu_mul_kernel(GU, Out, stride_gu, stride_o, inter, BLOCK: tl.constexpr):
    """out = silu(gate) * up over [T, 2I] rows holding gate then up; each rounded like eager fp16 ops."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    y = _silu_mul_part(GU + row * stride_gu, offs, ok, inter, Out.dtype.element_ty)
    tl.store(Out + row * stride_o + offs, y.to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_quant_kernel(
    GU, Q, S, M, inter, stride_gu, stride_q, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
    HW_CAST: tl.constexpr,
):  # fmt: skip
    """Grid (Mp,): row r's ``silu(gate) * up`` (as :func:`_silu_mul_kernel` rounds it) quantized per token
    into Q / S. ONE_PASS: the row in registers; longer rows find the peak in a first pass and compute the
    products again in the second (they are cheap; the row comes back from L2)."""
    row = tl.program_id(0)
    live = row < M
    r = row.to(tl.int64)
    gu_row = GU + r * stride_gu
    q_row = Q + r * stride_q
    arange = tl.arange(0, BLOCK)
    dt = GU.dtype.element_ty
    if ONE_PASS:
        ok = arange < inter
        y = _silu_mul_part(gu_row, arange, ok & live, inter, dt)
        quantize_row_store(y, q_row, S + row, arange, ok, live, HW_CAST)
    else:
        peak = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK):
            offs = k0 + arange
            peak = tl.maximum(peak, tl.abs(_silu_mul_part(gu_row, offs, (offs < inter) & live, inter, dt)))
        amax = tl.maximum(tl.max(peak, 0), 1e-12)
        inv = tl.div_rn(448.0, amax)
        for k0 in range(0, inter, BLOCK):
            offs = k0 + arange
            y = _silu_mul_part(gu_row, offs, (offs < inter) & live, inter, dt)
            tl.store(q_row + offs, cast_e4m3(y * inv, Q.dtype.element_ty, HW_CAST), mask=offs < inter)
        store_row_scale(S + row, amax, live)


@triton.jit
def _rope_cache_kernel(
    QKV,
    Cos,
    Sin,
    Slots,
    QOut,
    KPool,
    VPool,
    stride_t,
    stride_cos,
    stride_qo_t,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_vd,
    num_heads,
    num_kv_heads,
    k_inv_scale,
    v_inv_scale,
    PAGE: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    PDL: tl.constexpr = False,
    PAIRS: tl.constexpr = False,
):
    """Grid (T, 2): program 0 ropes token t's query heads into QOut; program 1 ropes its key heads and
    writes keys and values to pool slot Slots[t] (block Slots[t] // PAGE, offset Slots[t] % PAGE).
    The rotation covers a head's first 2 * HALF channels; channels 2 * HALF .. D (a partial rotary's
    rest; none when D is 2 * HALF) pass through unrotated. FP8 pools get k * k_inv_scale and
    v * v_inv_scale, saturated (:func:`~trtforge.kernels.paged_cache.to_cache`).
    PDL: launched early (programmatic dependent launch), it waits for the previous kernel's writes.
    PAIRS (D == 2 * HALF): qkv's q and k heads are in pair order (:func:`pair_rows`: channel j at column
    2 j, channel HALF + j at 2 j + 1); v and the outputs are in the natural order."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_ok = offs_d < HALF
    c1 = tl.load(Cos + t * stride_cos + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    c2 = tl.load(Cos + t * stride_cos + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    s1 = tl.load(Sin + t * stride_cos + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    s2 = tl.load(Sin + t * stride_cos + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    row = QKV + t * stride_t
    d2 = D
    offs_p = 2 * HALF + tl.arange(0, BLOCK_PASS)
    p_ok = offs_p < D
    if part == 0:
        ok = (offs_h < num_heads)[:, None] & d_ok[None, :]
        base = row + offs_h[:, None] * d2 + offs_d[None, :] * (2 if PAIRS else 1)
        x1 = tl.load(base, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(base + (1 if PAIRS else HALF), mask=ok, other=0.0).to(tl.float32)
        dst = QOut + t * stride_qo_t + offs_h[:, None] * d2 + offs_d[None, :]
        tl.store(dst, (x1 * c1[None, :] - x2 * s1[None, :]).to(QOut.dtype.element_ty), mask=ok)
        tl.store(dst + HALF, (x2 * c2[None, :] + x1 * s2[None, :]).to(QOut.dtype.element_ty), mask=ok)
        if D > 2 * HALF:
            pok = (offs_h < num_heads)[:, None] & p_ok[None, :]
            src = row + offs_h[:, None] * d2 + offs_p[None, :]
            dst_p = QOut + t * stride_qo_t + offs_h[:, None] * d2 + offs_p[None, :]
            tl.store(dst_p, tl.load(src, mask=pok, other=0.0), mask=pok)
    else:
        slot = tl.load(Slots + t).to(tl.int64)
        blk = slot // PAGE
        off = slot % PAGE
        ok = (offs_h < num_kv_heads)[:, None] & d_ok[None, :]
        kbase = row + (num_heads + offs_h[:, None]) * d2 + offs_d[None, :] * (2 if PAIRS else 1)
        vbase = row + (num_heads + num_kv_heads + offs_h[:, None]) * d2 + offs_d[None, :]
        x1 = tl.load(kbase, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(kbase + (1 if PAIRS else HALF), mask=ok, other=0.0).to(tl.float32)
        k_row = KPool + blk * stride_kb + off * stride_kn + offs_h[:, None] * stride_kh
        v_row = VPool + blk * stride_vb + off * stride_vn + offs_h[:, None] * stride_vh
        kd = k_row + offs_d[None, :] * stride_kd
        kt = KPool.dtype.element_ty
        vt = VPool.dtype.element_ty
        # K is rounded to the activations' type first, as the unfused path (and a 16-bit pool) has it
        k1 = (x1 * c1[None, :] - x2 * s1[None, :]).to(QKV.dtype.element_ty).to(tl.float32)
        k2 = (x2 * c2[None, :] + x1 * s2[None, :]).to(QKV.dtype.element_ty).to(tl.float32)
        tl.store(kd, to_cache(k1, k_inv_scale, kt), mask=ok)
        tl.store(kd + HALF * stride_kd, to_cache(k2, k_inv_scale, kt), mask=ok)
        vd = v_row + offs_d[None, :] * stride_vd
        v1 = tl.load(vbase, mask=ok, other=0.0).to(tl.float32)
        v2 = tl.load(vbase + HALF, mask=ok, other=0.0).to(tl.float32)
        tl.store(vd, to_cache(v1, v_inv_scale, vt), mask=ok)
        tl.store(vd + HALF * stride_vd, to_cache(v2, v_inv_scale, vt), mask=ok)
        if D > 2 * HALF:
            pok = (offs_h < num_kv_heads)[:, None] & p_ok[None, :]
            kp = k_row + offs_p[None, :] * stride_kd
            vp = v_row + offs_p[None, :] * stride_vd
            ksrc = row + (num_heads + offs_h[:, None]) * d2 + offs_p[None, :]
            vsrc = row + (num_heads + num_kv_heads + offs_h[:, None]) * d2 + offs_p[None, :]
            tl.store(
                kp, to_cache(tl.load(ksrc, mask=pok, other=0.0).to(tl.float32), k_inv_scale, kt), mask=pok
            )
            tl.store(
                vp, to_cache(tl.load(vsrc, mask=pok, other=0.0).to(tl.float32), v_inv_scale, vt), mask=pok
            )


@triton.jit
def _qkv_rope_cache_kernel(
    X, W, Bias, NormW, WScale, Cos, Sin, Slots, QOut, KPool, VPool,
    K, stride_wn, stride_kb, stride_kn, stride_kh, stride_kd, stride_vb, stride_vn, stride_vh, stride_vd,
    num_heads, num_kv_heads, k_inv_scale, v_inv_scale, eps,
    HALF: tl.constexpr, PAGE: tl.constexpr, FP8: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, REDUCE: tl.constexpr, DEFER: tl.constexpr,
    LATE_DEPENDENTS: tl.constexpr = False,
):  # fmt: skip
    """One token's RMSNorm + QKV GEMV with :func:`_rope_cache_kernel` as its epilogue, over q and k rows
    in pair order (:func:`pair_rows`: row ``h * D + 2 j + t`` holds channel ``t * HALF + j`` of head h)
    and v rows as they are. Each program streams BLOCK_N adjacent weight rows, as the served one-row GEMV
    does, so its BLOCK_N / 2 row pairs are rotation pairs (q, k) or adjacent channels (v). The sums are
    rounded to the activations' dtype (the unfused GEMV's output), then q heads are rotated into QOut,
    k heads rotated and v heads copied into pool slot Slots[0], as :func:`_rope_cache_kernel` computes
    them, at their channels in the natural layout."""
    pid = tl.program_id(0)
    D: tl.constexpr = 2 * HALF
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < (num_heads + 2 * num_kv_heads) * D
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
    w0, wu0 = _w_chunk(w_rows, 0, tl.arange(0, BLOCK_K), n_ok, K, stride_wn, 0, False)
    if PDL:
        gdc_wait()
        if not LATE_DEPENDENTS:
            gdc_launch_dependents()
    dtype = QOut.dtype.element_ty
    m_ok = tl.arange(0, 1) < 1
    PROLOGUE: tl.constexpr = not DEFER
    rstd = _norm_rstd(X + tl.arange(0, 1), m_ok, K, eps, PROLOGUE, 1, BLOCK_K)
    acc, _ = _one_row_sums(w0, wu0, w_rows, n_ok, X + tl.arange(0, 1), NormW, K, rstd, eps, stride_wn, 0,
                           True, False, REDUCE, DEFER, dtype, BLOCK_K)  # fmt: skip
    if PDL and LATE_DEPENDENTS:
        gdc_launch_dependents()
    x = tl.sum(acc, 0)
    if FP8:
        x = x * tl.load(WScale + offs_n, mask=n_ok, other=0.0)
    if HAS_BIAS:
        x += tl.load(Bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    x1, x2 = tl.split(tl.reshape(x.to(dtype).to(tl.float32), [BLOCK_N // 2, 2]))  # rows 2p and 2p + 1
    offs_j = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    j_ok = offs_j < (num_heads + 2 * num_kv_heads) * HALF
    head = offs_j // HALF
    d = offs_j % HALF
    c1 = tl.load(Cos + d, mask=j_ok, other=0.0).to(tl.float32)
    c2 = tl.load(Cos + HALF + d, mask=j_ok, other=0.0).to(tl.float32)
    s1 = tl.load(Sin + d, mask=j_ok, other=0.0).to(tl.float32)
    s2 = tl.load(Sin + HALF + d, mask=j_ok, other=0.0).to(tl.float32)
    r1 = x1 * c1 - x2 * s1
    r2 = x2 * c2 + x1 * s2
    is_q = j_ok & (head < num_heads)
    q_dst = QOut + head * D + d
    tl.store(q_dst, r1.to(dtype), mask=is_q)
    tl.store(q_dst + HALF, r2.to(dtype), mask=is_q)
    slot = tl.load(Slots).to(tl.int64)
    blk = slot // PAGE
    off = slot % PAGE
    kh = head - num_heads
    is_k = j_ok & (kh >= 0) & (kh < num_kv_heads)
    k_dst = KPool + blk * stride_kb + off * stride_kn + kh * stride_kh + d * stride_kd
    kt = KPool.dtype.element_ty
    # K is rounded to the activations' type first, as the unfused path (and a 16-bit pool) has it
    tl.store(k_dst, to_cache(r1.to(dtype).to(tl.float32), k_inv_scale, kt), mask=is_k)
    tl.store(k_dst + HALF * stride_kd, to_cache(r2.to(dtype).to(tl.float32), k_inv_scale, kt), mask=is_k)
    vh = kh - num_kv_heads
    is_v = j_ok & (vh >= 0)
    v_dst = VPool + blk * stride_vb + off * stride_vn + vh * stride_vh + 2 * d * stride_vd  # natural order
    vt = VPool.dtype.element_ty
    tl.store(v_dst, to_cache(x1, v_inv_scale, vt), mask=is_v)
    tl.store(v_dst + stride_vd, to_cache(x2, v_inv_scale, vt), mask=is_v)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows of `x` ``[T, H]`` (as transformers' LlamaRMSNorm computes it)."""
    out = torch.empty_like(x)
    n = int(x.shape[-1])
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](
            x, weight, out, x.stride(0), out.stride(0), n, float(eps),
            BLOCK=triton.next_power_of_2(n), num_warps=8 if n >= 2048 else 4,
        )  # fmt: skip
    return out


def qk_norm_(qkv: torch.Tensor, q_norm: Any, k_norm: Any, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """In place: RMSNorm each query head of ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` with `q_norm` and each key
    head with `k_norm` (Qwen3's per-head norms, modules with ``weight`` [D] and ``variance_epsilon``)."""
    t, d = int(qkv.shape[0]), int(q_norm.weight.shape[0])
    if t:
        _qk_norm_kernel[(t, num_heads + num_kv_heads)](
            qkv, q_norm.weight, k_norm.weight, qkv.stride(0), num_heads,
            float(q_norm.variance_epsilon), float(k_norm.variance_epsilon),
            D=d, BLOCK=triton.next_power_of_2(d), num_warps=1 if d <= 256 else 4,
        )  # fmt: skip
    return qkv


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[T, 2I]`` (gate in the first I columns) -> ``[T, I]``."""
    t, inter = int(gate_up.shape[0]), int(gate_up.shape[1]) // 2
    out = torch.empty((t, inter), dtype=gate_up.dtype, device=gate_up.device)
    if t:
        block = 1024
        _silu_mul_kernel[(t, triton.cdiv(inter, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4
        )
    return out


def _check_rows(fn: str, name: str, t: torch.Tensor, cols: int | None = None) -> None:
    if t.dim() != 2 or t.stride(1) != 1 or t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(
            f"{fn}: {name} must be a float [T, N] tensor with unit stride along N, got {t.dtype} "
            f"{tuple(t.shape)} strides {t.stride()}"
        )
    if cols is not None and int(t.shape[1]) != cols:
        raise ValueError(f"{fn}: {name} must have {cols} columns, got {tuple(t.shape)}")


def rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    delta: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Fp8Rows]:
    """RMSNorm of the rows of `x` ``[T, H]`` (as :func:`rms_norm`) quantized per token for a W8A8 GEMM,
    in one kernel: the codes equal ``quantize_rows_fp8_padded(rms_norm(h))``. With `delta` the rows are
    first ``h = x + delta`` (a residual add, rounded as torch's), written into `out` (a new tensor if
    None; `x` itself to update the residual stream in place). Returns ``(h, rows)`` (h is `x` without
    a delta)."""
    _check_rows("rms_norm_fp8", "x", x)
    t, n = int(x.shape[0]), int(x.shape[1])
    if tuple(weight.shape) != (n,):
        raise ValueError(f"rms_norm_fp8: weight must be [{n}] (x's columns), got {tuple(weight.shape)}")
    h = x
    if delta is not None:
        _check_rows("rms_norm_fp8", "delta", delta, n)
        h = torch.empty_like(x) if out is None else out
        _check_rows("rms_norm_fp8", "out", h, n)
        if delta.dtype != x.dtype or h.dtype != x.dtype or int(delta.shape[0]) != t or int(h.shape[0]) != t:
            raise ValueError(f"rms_norm_fp8: delta and out must be {x.dtype} [{t}, {n}] like x")
    rows = empty_rows(t, n, x.dtype, x.device)
    block = triton.next_power_of_2(n)
    _norm_quant_kernel[(int(rows.q.shape[0]),)](
        x, x if delta is None else delta, weight, h, rows.q, rows.s, t, n, float(eps),
        x.stride(0), 0 if delta is None else delta.stride(0), h.stride(0), rows.q.stride(0),
        HAS_DELTA=delta is not None, BLOCK=block, HW_CAST=hw_cast_default(x.device),
        num_warps=8 if n >= 2048 else 4,
    )  # fmt: skip
    return h, rows


def silu_mul_fp8(gate_up: torch.Tensor) -> Fp8Rows:
    """``silu(gate) * up`` of ``gate_up`` ``[T, 2I]`` (as :func:`silu_mul`) quantized per token for a W8A8
    GEMM, in one kernel: the codes equal ``quantize_rows_fp8_padded(silu_mul(gate_up))``."""
    _check_rows("silu_mul_fp8", "gate_up", gate_up)
    t, inter = int(gate_up.shape[0]), int(gate_up.shape[1]) // 2
    if int(gate_up.shape[1]) % 2:
        raise ValueError(f"silu_mul_fp8: gate_up [T, 2I] needs an even width, got {tuple(gate_up.shape)}")
    rows = empty_rows(t, inter, gate_up.dtype, gate_up.device)
    one_pass = inter <= SINGLE_PASS_K
    block = triton.next_power_of_2(inter) if one_pass else 4096
    _silu_mul_quant_kernel[(int(rows.q.shape[0]),)](
        gate_up, rows.q, rows.s, t, inter, gate_up.stride(0), rows.q.stride(0),
        BLOCK=block, ONE_PASS=one_pass, HW_CAST=hw_cast_default(gate_up.device),
        num_warps=max(4, min(16, block // 1024)),
    )  # fmt: skip
    return rows


def _q_buffer(
    fn: str, out: torch.Tensor | None, shape: tuple[int, int, int], like: torch.Tensor
) -> torch.Tensor:
    """The rotated q's destination ``[T, Hq, D]`` in `like`'s dtype: `out` (a piecewise step's static
    buffer: rows of whole heads, any row stride) when given and of that form, else a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if tuple(out.shape) != shape or out.dtype != like.dtype or out.stride()[1:] != (shape[2], 1):
        raise ValueError(
            f"{fn}: out must be {list(shape)} {like.dtype} with rows of contiguous heads, got "
            f"{list(out.shape)} {out.dtype} strides {out.stride()}"
        )
    return out


def rope_and_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    pairs: bool = False,
) -> torch.Tensor:
    """Rotate q and k of ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` by ``cos``/``sin`` ``[T, R]`` (rotate-half RoPE
    over each head's first R <= D channels, R even), write k and v at pool slots ``slots`` ``[T]`` (pools
    ``[nb, bs, Hkv, D]`` of any strides: qkv's dtype, or FP8 E4M3 storing k / k_scale and v / v_scale);
    return q ``[T, Hq, D]``, written into `out` when given (a piecewise step's static buffer: no copy).
    `pairs`: qkv's q and k columns are in :func:`pair_rows` order (the product of weights permuted for
    :func:`norm_qkv_rope_cache`; a rotary over whole heads only), read in that order at no extra cost."""
    t = int(qkv.shape[0])
    d, rot = int(k_pool.shape[-1]), int(cos.shape[-1])
    if rot % 2 or rot > d:
        raise ValueError(f"rope_and_cache: rotary width {rot} must be even and at most the head dim {d}")
    if pairs and rot != d:
        raise ValueError(
            f"rope_and_cache: q and k in pair order need a rotary over whole heads (width {d}), got {rot}"
        )
    q = _q_buffer("rope_and_cache", out, (t, num_heads, d), qkv)
    if t:
        half = rot // 2
        pdl = pdl_supported(qkv.device)
        _rope_cache_kernel[(t, 2)](
            qkv, cos, sin, slots, q, k_pool, v_pool,
            qkv.stride(0), cos.stride(0), q.stride(0),
            *k_pool.stride(), *v_pool.stride(),
            num_heads, num_kv_heads, inverse_scale(k_scale), inverse_scale(v_scale),
            PAGE=int(k_pool.shape[1]), HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_H=triton.next_power_of_2(max(num_heads, num_kv_heads)),
            D=d, BLOCK_PASS=triton.next_power_of_2(max(d - rot, 1)), PDL=pdl, PAIRS=pairs, num_warps=4,
            launch_pdl=pdl,
        )  # fmt: skip
    return q


# The fused QKV + RoPE kernel lets the next kernel (the decode attention) launch after its loop, not at
# its start: the attention's programs then wait on SMs the GEMV still streams on for less long. H100,
# session 60 (the kernel over rows HALF apart): late, FP8 +23 us a token against +64 early; BF16 +2
# against +28. False: launched at its start, as the served GEMVs launch theirs (A/B).
ROPE_LATE_DEPENDENTS = True


def pair_rows(num_heads: int, num_kv_heads: int, head_dim: int, device: Any = None) -> torch.Tensor:
    """The pair order of a QKV projection's ``(Hq + 2 Hkv) * D`` rows that :func:`norm_qkv_rope_cache`
    reads: ``weight[pair_rows(...)]`` holds, in each q and k head h, channel j at row ``h * D + 2 j`` and
    its rotation partner ``HALF + j`` at ``h * D + 2 j + 1``, so the partners are adjacent rows (one
    program's block, as the served GEMV streams them); v rows stay where they are. int64 ``[rows]``."""
    half = head_dim // 2
    qk = torch.arange((num_heads + num_kv_heads) * head_dim, device=device)
    qk = qk.view(-1, 2, half).transpose(1, 2).reshape(-1)
    v = torch.arange(qk.numel(), qk.numel() + num_kv_heads * head_dim, device=device)
    return torch.cat([qk, v])


def qkv_rope_takes(
    weight: Any, bias: torch.Tensor | None, num_heads: int, num_kv_heads: int, head_dim: int, rotary: int
) -> bool:
    """Whether :func:`norm_qkv_rope_cache` takes this QKV projection at one token: 16-bit or FP8
    (weight-only) weights of ``(Hq + 2 Hkv) * D`` rows, a 1-D bias or none, an even head dim and a
    rotary over whole heads (`rotary` channels: no partial rotary)."""
    return (
        isinstance(weight, (Fp8Weight, torch.Tensor))
        and int(weight.shape[0]) == (num_heads + 2 * num_kv_heads) * head_dim
        and rotary == head_dim
        and head_dim % 2 == 0
        and (bias is None or bias.dim() == 1)
    )


def qkv_rope_fusable(
    x: torch.Tensor,
    weight: Any,
    bias: torch.Tensor | None,
    cos: torch.Tensor,
    k_pool: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> bool:
    """Whether :func:`norm_qkv_rope_cache` takes this call: one token, and weights it takes
    (:func:`qkv_rope_takes`) for the pools' head dim and the rotary width of `cos`."""
    d, rot = int(k_pool.shape[-1]), int(cos.shape[-1])
    return int(x.shape[0]) == 1 and qkv_rope_takes(weight, bias, num_heads, num_kv_heads, d, rot)


def norm_qkv_rope_cache(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: Any,
    bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rope_and_cache(norm_gemv(x, ...), ...)`` for one token in one kernel (one launch a layer fewer,
    and qkv never written): RMSNorm, the QKV projection ``weight`` ``[(Hq + 2 Hkv) * D, K]`` (16-bit or
    :class:`~trtforge.kernels.qweight.Fp8Weight`) with its rows (FP8 scales, `bias`) in
    :func:`pair_rows` order, RoPE over whole heads, and the K/V write. The launch is the unfused GEMV's
    (the same adjacent weight rows a program, at least 2, and K chunk), so the results equal the two
    kernels' over the natural rows up to the order of the FP32 sums. Returns q ``[1, Hq, D]`` in the
    natural layout (into `out` when given)."""
    if not qkv_rope_fusable(x, weight, bias, cos, k_pool, num_heads, num_kv_heads):
        raise ValueError(
            "norm_qkv_rope_cache takes one token, 16-bit or FP8 weights of (Hq + 2 Hkv) * D rows and a "
            f"rotary over whole heads; got x {tuple(x.shape)}, weight {type(weight).__name__} "
            f"{tuple(weight.shape)} for Hq={num_heads}, Hkv={num_kv_heads}, D={int(k_pool.shape[-1])}, "
            f"rotary width {int(cos.shape[-1])}"
        )
    _gemv._check(x, weight, "norm_qkv_rope_cache")
    d = int(k_pool.shape[-1])
    rows, k = int(weight.shape[0]), int(x.shape[1])
    q = _q_buffer("norm_qkv_rope_cache", out, (1, num_heads, d), x)
    codes, scale, _, wfmt = _gemv._weight_args(weight)
    kind = ("plain", "fp8")[wfmt]
    cfg = _gemv.default_config(1, rows, k, False, _gemv._num_sms(x.device), kind)
    block_n = max(2, cfg.block_n)  # the unfused launch's rows a program: whole pairs
    pdl = pdl_supported(x.device)
    _qkv_rope_cache_kernel[(triton.cdiv(rows, block_n),)](
        x, codes, bias if bias is not None else x, norm_weight, scale if scale is not None else x,
        cos, sin, slots, q, k_pool, v_pool,
        k, codes.stride(0), *k_pool.stride(), *v_pool.stride(),
        num_heads, num_kv_heads, inverse_scale(k_scale), inverse_scale(v_scale), float(eps),
        HALF=d // 2, PAGE=int(k_pool.shape[1]), FP8=wfmt == 1, HAS_BIAS=bias is not None, PDL=pdl,
        BLOCK_N=block_n, BLOCK_K=cfg.block_k, REDUCE=cfg.reduce, DEFER=_gemv.DEFER_NORM,
        LATE_DEPENDENTS=ROPE_LATE_DEPENDENTS, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        launch_pdl=pdl,
    )  # fmt: skip
    return q
