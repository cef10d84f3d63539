"""Small-M (decode) projections of a Llama-style layer as Triton GEMVs with the small ops folded in.

At 1..8 tokens a projection is a weight stream: ``[N, K]`` FP16 weights read once for a handful of
rows, so its time is bytes / bandwidth if enough loads are in flight. cuBLAS at M=1 plus the separate
RMSNorm, SiLU*mul and residual kernels cost several times that. One kernel family covers the layer:

- RMSNorm prologue + GEMV (QKV, lm_head): each program recomputes its rows' rstd from ``x``;
- RMSNorm prologue + gate/up GEMV + ``silu(gate) * up`` epilogue (gate row n and up row I+n in one
  program, output ``[M, I]``);
- GEMV + residual-add epilogue (o_proj, down_proj).

Each program owns ``BLOCK_N`` output columns and streams their weight rows along K: at one row as
FP32 FMAs into a ``[BLOCK_N, BLOCK_K]`` register tile reduced once at the end, at more rows as FMAs
reduced per chunk or (``dot``) on the tensor cores with the rows padded to 16. Roundings follow
the eager FP16 path (HF): ``x * rstd`` is rounded to the input dtype before the norm weight
multiply, the norm output to the input dtype before the GEMV, gate and up to the dtype before SiLU,
SiLU's output before the multiply; sums are FP32 and the residual is added to the FP32 sum.

Quantized weights (:mod:`trtforge.kernels.qweight`) are weight-only here: the activations stay 16-bit
and the float reference is float32 ``x @ dequantize(W)^T``. FP8 (W8A16): E4M3 codes widened to FP32
in registers (a hardware conversion on Hopper, exact), FMAs with x, each row's scale applied to the
FP32 sum. INT4: the packed bytes read as int32 words of eight codes; per group of 128,
``scale * sum(q * x) + offset * sum(x)``, the codes turned into floats by OR-ing them into the
mantissa of 2^23 and subtracting it (no int-to-float conversion), so an element costs its unpack and
one FMA; at one row most INT4 projections run on the tensor cores instead
(:mod:`trtforge.kernels.int4_mma`, chosen in :func:`_launch`). (W8A8, the FP8 tensor cores' path for
more tokens, is ``torch._scaled_mm``: :mod:`trtforge.llm.quant.linear`.)

On Hopper and later the launches are programmatic dependent launches (:func:`pdl_supported`): a
one-row program requests its first weight chunk, then waits (``griddepcontrol.wait``) for the previous
kernel's writes before it reads x or the residual, so the weight stream overlaps that kernel's tail.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtforge.kernels import interpreting
from trtforge.kernels.qweight import INT4_GROUP, Fp8Weight, Int4Weight, QuantWeight

MAX_ROWS = 16  # rows (tokens) one launch takes: the row block is at most 16


@dataclass(frozen=True)
class GemvConfig:
    """Launch parameters: output columns per program, K chunk, warps, pipeline stages, whether the
    chunk product runs on the tensor cores (``tl.dot`` over rows padded to 16) or as FP32 FMAs, and
    (one row, 16-bit or FP8 weights) whether each chunk's products are summed as they come (`reduce`:
    ``[BLOCK_N]`` partials rather than ``[BLOCK_N, BLOCK_K]``, so fewer registers and more programs an
    SM; the sums' order differs, not bit-identical)."""

    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    dot: bool = False
    reduce: bool = False


@triton.jit
def _w_chunk(w_rows, k0, arange_k, n_ok, K, stride_wn, up_rows, GATED: tl.constexpr):
    """One K chunk of the weight rows (and of the up rows when gated), as stored (16-bit floats or
    E4M3 codes); streamed, so evicted first. Loaded 8 elements at a time, as x is: E4M3 codes in
    16-byte vectors would get a register layout of their own and a shuffle through shared memory."""
    offs_k = k0 + (arange_k // 8) * 8 + arange_k % 8  # (contiguous in runs of 8 for the analysis)
    w_ok = n_ok[:, None] & (offs_k < K)[None, :]
    w = tl.load(w_rows + offs_k[None, :], mask=w_ok, other=0.0, eviction_policy="evict_first")
    wu = w
    if GATED:
        wu = tl.load(w_rows + up_rows * stride_wn + offs_k[None, :], mask=w_ok, other=0.0,
                     eviction_policy="evict_first")  # fmt: skip
    return w, wu


@triton.jit
def _add_chunk(part, w, xf, REDUCE: tl.constexpr):
    """`part` plus one chunk's products ``w * x``: the ``[BLOCK_N, BLOCK_K]`` partials, or (REDUCE) their
    sums over the chunk, ``[BLOCK_N]``: fewer registers, so more programs (and loads in flight) an SM."""
    prod = w.to(tl.float32) * xf
    if REDUCE:
        out = part + tl.sum(prod, 1)
    else:
        out = part + prod
    return out


@triton.jit
def _row_chunk(part, part_up, sq, w, wu, x_rows, k0, arange_k, NormW, K, rstd, NORM: tl.constexpr,
               GATED: tl.constexpr, REDUCE: tl.constexpr, dtype: tl.constexpr,
               DEFERRED: tl.constexpr):  # fmt: skip
    """One K chunk of the one-row loop: x's columns from `k0` (normalized under NORM; DEFERRED: times the
    norm weight only, their squares added to `sq`) times the weight rows `w` (and the up rows `wu`,
    GATED), added to `part` (`part_up`) by :func:`_add_chunk`."""
    offs_k = k0 + arange_k
    k_ok = offs_k < K
    if DEFERRED:
        xf, sq = _x_deferred(x_rows[:, None] + offs_k[None, :], k_ok[None, :], NormW, offs_k[None, :],
                             k_ok[None, :], sq, REDUCE)  # fmt: skip
    else:
        x = _x_at(x_rows[:, None] + offs_k[None, :], k_ok[None, :], NormW, offs_k[None, :], k_ok[None, :],
                  rstd[:, None], NORM, dtype)  # fmt: skip
        xf = x.to(tl.float32)
    part = _add_chunk(part, w, xf, REDUCE)
    if GATED:
        part_up = _add_chunk(part_up, wu, xf, REDUCE)
    return part, part_up, sq


@triton.jit
def _x_deferred(x_ptrs, ok, NormW, offs_k, k_ok, sq, REDUCE: tl.constexpr):
    """x at `x_ptrs` times the norm weight, in FP32 and not yet scaled by rstd (:data:`DEFER_NORM`), and
    `sq` plus its squares (REDUCE: summed over the chunk, as the products are): the sum of squares comes
    from the loads the products need anyway."""
    x = tl.load(x_ptrs, mask=ok, other=0.0).to(tl.float32)
    nw = tl.load(NormW + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    if REDUCE:
        sq = sq + tl.sum(x * x, 1)
    else:
        sq = sq + x * x
    return x * nw, sq


@triton.jit
def _x_at(x_ptrs, ok, NormW, offs_k, k_ok, rstd, NORM: tl.constexpr, dtype: tl.constexpr):
    """x at `x_ptrs` (columns `offs_k`, valid where `k_ok`), normalized under NORM as the eager path
    rounds it: x * rstd rounded to the dtype, times the norm weight, rounded; `rstd` broadcasts."""
    x = tl.load(x_ptrs, mask=ok, other=0.0)
    if NORM:
        nw = tl.load(NormW + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        xn = (x.to(tl.float32) * rstd).to(dtype).to(tl.float32)
        x = (xn * nw).to(dtype)
    return x


@triton.jit
def _int4_load(w_rows, s_rows, o_rows, g0, n_ok, NG, G: tl.constexpr, GROUP: tl.constexpr):
    """G groups of the weight rows from group g0: the INT4 codes as int32 words ``[G, BLOCK_N, GROUP/8]``
    (nibble i of a group's word j holds its k = i * GROUP/8 + j: :func:`~trtforge.kernels.qweight.
    pack_int4`) and float32 scales and offsets ``[G, BLOCK_N]``. Groups lead, rows in the middle: the
    x chunk ``[G, 1, GROUP/8]`` then gets the words' register layout (no shuffles between them)."""
    groups = g0 + tl.arange(0, G)
    g_ok = (groups < NG)[:, None] & n_ok[None, :]
    words = groups[:, None, None] * (GROUP // 8) + tl.arange(0, GROUP // 8)[None, None, :]
    q = tl.load(w_rows[None, :, :] + words, mask=g_ok[:, :, None], other=0, eviction_policy="evict_first")
    s = tl.load(s_rows[None, :] + groups[:, None], mask=g_ok, other=0.0).to(tl.float32)
    o = tl.load(o_rows[None, :] + groups[:, None], mask=g_ok, other=0.0).to(tl.float32)
    return q, s, o


@triton.jit
def _int4_nibble(q, q12, i: tl.constexpr, ASM: tl.constexpr):
    """Nibble `i` of the int32 words `q` (`q12`: the words shifted right by 12) as float32, times
    2^(4p): the nibble kept in place at bits 4p..4p+3 (p = i for i < 5, i - 3 from `q12`), OR-ed into
    the mantissa of 2^23, minus 2^23 (exact). A logic op and an add, no shift or int-to-float
    conversion per element; the x it multiplies is pre-scaled by 2^-4p (:func:`_int4_chunk`). ASM
    (CUDA): the mask and the OR as one ``lop3`` (ptxas splits ``(w & m) | c`` with two immediates)."""
    w = q if i < 5 else q12
    mask = 15 << (4 * (i if i < 5 else i - 3))
    if ASM:
        bits = tl.inline_asm_elementwise(
            "lop3.b32 $0, $1, $2, 0x4B000000, 0xEA;", "=r,r,r", [w, tl.full(w.shape, mask, tl.int32)],
            dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        bits = (w & mask) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _int4_row(m, q, s, o, qu, su, ou, q12, qu12, acc, acc_up, X, stride_xm, NormW, cols, k_ok, M, rstd,
              GATED: tl.constexpr, NORM: tl.constexpr, dtype: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, G: tl.constexpr, GROUP: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """Row `m` of x against G groups of INT4 rows (:func:`_int4_chunk`): its products added to row m
    of `acc` (`acc_up`)."""
    WPG: tl.constexpr = GROUP // 8
    offs_m = tl.arange(0, BLOCK_M)
    rstd_m = tl.sum(tl.where(offs_m == m, rstd, 0.0), 0)
    dot = tl.zeros([G, BLOCK_N, WPG], dtype=tl.float32)
    dot_up = tl.zeros([G, BLOCK_N, WPG], dtype=tl.float32)
    xsum = tl.zeros([G, 1, WPG], dtype=tl.float32)
    for i in tl.static_range(8):
        offs = tl.max_contiguous(cols + i * WPG, [1, 1, 4])
        x = _x_at(X + m * stride_xm + offs, k_ok & (m < M), NormW, offs, k_ok, rstd_m, NORM,
                  dtype).to(tl.float32)  # fmt: skip
        xsum += x
        xp = x * (1.0 / (1 << (4 * (i if i < 5 else i - 3))))  # exact: a power of two
        dot += _int4_nibble(q, q12, i, ASM) * xp
        if GATED:
            dot_up += _int4_nibble(qu, qu12, i, ASM) * xp
    xg = tl.sum(xsum, 2)  # [G, 1]: x summed over each group
    part = tl.sum(tl.sum(dot, 2) * s + o * xg, 0)
    acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
    if GATED:
        part_up = tl.sum(tl.sum(dot_up, 2) * su + ou * xg, 0)
        acc_up = tl.where(offs_m[:, None] == m, acc_up + part_up[None, :], acc_up)
    return acc, acc_up


@triton.jit
def _int4_chunk(q, s, o, qu, su, ou, acc, acc_up, X, stride_xm, NormW, g0, M, NG, rstd, GATED: tl.constexpr,
                NORM: tl.constexpr, dtype: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                G: tl.constexpr, GROUP: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """`acc` (`acc_up`) ``[BLOCK_M, BLOCK_N]`` plus the products of x with G groups of INT4 rows (of the
    up rows when gated). Per row of x and group: ``scale * sum(q * x) + offset * sum(x)``, so an
    element costs its unpack and one FMA; nibble i of the words meets x[i * GROUP/8 + j], contiguous
    in j (loaded 4 at a time, as the words are, so both share one register layout). Rows of x past
    the first run in a loop, not unrolled: 16 unrolled rows (x 8 nibbles, x 2 when gated) took
    minutes of compilation on sm_90."""
    WPG: tl.constexpr = GROUP // 8  # words a group
    groups = g0 + tl.arange(0, G)
    cols = groups[:, None, None] * GROUP + tl.arange(0, WPG)[None, None, :]  # k of each word's nibble 0
    k_ok = (groups < NG)[:, None, None]
    q12 = q >> 12
    qu12 = qu >> 12
    if BLOCK_M == 1:
        acc, acc_up = _int4_row(0, q, s, o, qu, su, ou, q12, qu12, acc, acc_up, X, stride_xm, NormW, cols,
                                k_ok, M, rstd, GATED, NORM, dtype, BLOCK_M, BLOCK_N, G, GROUP,
                                ASM)  # fmt: skip
    else:
        for m in range(M):
            acc, acc_up = _int4_row(m, q, s, o, qu, su, ou, q12, qu12, acc, acc_up, X, stride_xm, NormW, cols,
                                    k_ok, M, rstd, GATED, NORM, dtype, BLOCK_M, BLOCK_N, G, GROUP,
                                    ASM)  # fmt: skip
    return acc, acc_up


@triton.jit
def _norm_rstd(x_rows, m_ok, K, eps, NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The RMSNorm prologue: each row's ``rsqrt(mean(x^2) + eps)`` ``[BLOCK_M]`` from a pass over x
    (zeros without NORM)."""
    if NORM:
        arange_k = tl.arange(0, BLOCK_K)
        sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + arange_k
            xs = tl.load(x_rows[:, None] + offs_k[None, :], mask=m_ok[:, None] & (offs_k < K)[None, :],
                         other=0.0).to(tl.float32)  # fmt: skip
            sq += tl.sum(xs * xs, 1)
        rstd = tl.rsqrt(sq / K + eps)
    else:
        rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    return rstd


@triton.jit
def _one_row_sums(w0, wu0, w_rows, n_ok, x_rows, NormW, K, rstd, eps, stride_wn, up_rows, NORM: tl.constexpr,
                  PAIRED: tl.constexpr, REDUCE: tl.constexpr, DEFERRED: tl.constexpr, dtype: tl.constexpr,
                  BLOCK_K: tl.constexpr):  # fmt: skip
    """The one-row loop over K: the first chunk's weight rows `w0` (`wu0`, PAIRED: the rows `up_rows`
    on) already loaded, ``[BLOCK_N, BLOCK_K]`` partial products kept in registers and reduced once after
    the loop (REDUCE: each chunk summed into ``[BLOCK_N]`` as it goes). DEFERRED: the sums scaled by the
    rstd of the squares summed on the way (exact in FP32 up to order). Returns ``[1, BLOCK_N]`` sums."""
    arange_k = tl.arange(0, BLOCK_K)
    k_ok = arange_k < K
    if REDUCE:
        sq = tl.zeros([1], dtype=tl.float32)
    else:
        sq = tl.zeros([1, BLOCK_K], dtype=tl.float32)
    if DEFERRED:
        xf, sq = _x_deferred(x_rows[:, None] + arange_k[None, :], k_ok[None, :], NormW, arange_k[None, :],
                             k_ok[None, :], sq, REDUCE)  # fmt: skip
    else:
        x0 = _x_at(x_rows[:, None] + arange_k[None, :], k_ok[None, :], NormW, arange_k[None, :],
                   k_ok[None, :], rstd[:, None], NORM, dtype)  # fmt: skip
        xf = x0.to(tl.float32)
    part = w0.to(tl.float32) * xf
    part_up = wu0.to(tl.float32) * xf
    if REDUCE:
        part = tl.sum(part, 1)
        part_up = tl.sum(part_up, 1)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w, wu = _w_chunk(w_rows, k0, arange_k, n_ok, K, stride_wn, up_rows, PAIRED)
        part, part_up, sq = _row_chunk(part, part_up, sq, w, wu, x_rows, k0, arange_k, NormW, K, rstd, NORM,
                                       PAIRED, REDUCE, dtype, DEFERRED)  # fmt: skip
    if REDUCE:
        acc = part[None, :]
        acc_up = part_up[None, :]
    else:
        acc = tl.sum(part, 1)[None, :]
        acc_up = tl.sum(part_up, 1)[None, :]
    if DEFERRED:
        rstd = tl.rsqrt((sq if REDUCE else tl.sum(sq, 1)) / K + eps)
        acc = acc * rstd[:, None]
        acc_up = acc_up * rstd[:, None]
    return acc, acc_up


@triton.jit
def _gemv_kernel(
    X,
    W,
    Out,
    Res,
    Bias,
    NormW,
    WScale,
    WOffset,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    stride_rm,
    up_rows,
    eps,
    NORM: tl.constexpr,
    GATED: tl.constexpr,
    HAS_RES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT: tl.constexpr,
    PDL: tl.constexpr,
    WFMT: tl.constexpr,
    GROUP: tl.constexpr,
    ASM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    REDUCE: tl.constexpr = False,
    DEFER: tl.constexpr = False,
):
    """Out[m, n] = epilogue(sum_k prologue(X)[m, k] * W[n, k]) for the BLOCK_N columns of this program.
    REDUCE (one row, 16-bit or FP8 weights): each chunk's products are summed as they come
    (:attr:`GemvConfig.reduce`). DEFER (:data:`DEFER_NORM`; NORM, one row, 16-bit or FP8 weights): no
    prologue; the sums over ``x * norm_w`` are scaled by rstd at the end, the squares summed in the loop.

    WFMT 0: 16-bit weights. WFMT 1 (FP8 weight-only): E4M3 codes widened to float32 in registers, the
    sum over the (normalized) 16-bit x, times each row's scale in the epilogue. WFMT 2 (INT4): int32
    words of eight codes, ``BLOCK_K // GROUP`` groups a chunk (:func:`_int4_chunk`)."""
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    arange_k = tl.arange(0, BLOCK_K)
    x_rows = X + offs_m * stride_xm
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
    dtype = Out.dtype.element_ty
    G: tl.constexpr = BLOCK_K // GROUP  # INT4 groups a chunk
    NG = K // GROUP
    if WFMT == 2:  # the first chunk's weights are requested before the wait (PDL) and the norm prologue
        s_rows = WScale + offs_n.to(tl.int64) * stride_sn
        o_rows = WOffset + offs_n.to(tl.int64) * stride_sn
        q0, s0, o0 = _int4_load(w_rows, s_rows, o_rows, 0, n_ok, NG, G, GROUP)
        qu0, su0, ou0 = q0, s0, o0
        if GATED:
            qu0, su0, ou0 = _int4_load(w_rows + up_rows * stride_wn, s_rows + up_rows * stride_sn,
                                       o_rows + up_rows * stride_sn, 0, n_ok, NG, G, GROUP)  # fmt: skip
    elif BLOCK_M == 1 and not DOT:
        w0, wu0 = _w_chunk(w_rows, 0, arange_k, n_ok, K, stride_wn, up_rows, GATED)
    if PDL:
        gdc_wait()  # the previous kernel's writes (x, the residual) are visible from here on
        gdc_launch_dependents()  # the next kernel may start (and prefetch its own weights)
    DEFERRED: tl.constexpr = DEFER and NORM and WFMT < 2 and BLOCK_M == 1 and not DOT
    PROLOGUE: tl.constexpr = NORM and not DEFERRED
    rstd = _norm_rstd(x_rows, m_ok, K, eps, PROLOGUE, BLOCK_M, BLOCK_K)
    if WFMT == 2:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc, acc_up = _int4_chunk(q0, s0, o0, qu0, su0, ou0, acc, acc, X, stride_xm, NormW, 0, M, NG, rstd,
                                  GATED, NORM, dtype, BLOCK_M, BLOCK_N, G, GROUP, ASM)  # fmt: skip
        for k0 in range(BLOCK_K, K, BLOCK_K):
            g0 = k0 // GROUP
            q, s, o = _int4_load(w_rows, s_rows, o_rows, g0, n_ok, NG, G, GROUP)
            qu, su, ou = q, s, o
            if GATED:
                qu, su, ou = _int4_load(w_rows + up_rows * stride_wn, s_rows + up_rows * stride_sn,
                                        o_rows + up_rows * stride_sn, g0, n_ok, NG, G, GROUP)  # fmt: skip
            acc, acc_up = _int4_chunk(q, s, o, qu, su, ou, acc, acc_up, X, stride_xm, NormW, g0, M, NG, rstd,
                                      GATED, NORM, dtype, BLOCK_M, BLOCK_N, G, GROUP, ASM)  # fmt: skip
    elif BLOCK_M == 1 and not DOT:
        acc, acc_up = _one_row_sums(w0, wu0, w_rows, n_ok, x_rows, NormW, K, rstd, eps, stride_wn, up_rows,
                                    NORM, GATED, REDUCE, DEFERRED, dtype, BLOCK_K)  # fmt: skip
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            w, wu = _w_chunk(w_rows, k0, arange_k, n_ok, K, stride_wn, up_rows, GATED)
            offs_k = k0 + arange_k
            k_ok = offs_k < K
            x = _x_at(x_rows[:, None] + offs_k[None, :], m_ok[:, None] & k_ok[None, :], NormW,
                      offs_k[None, :], k_ok[None, :], rstd[:, None], NORM, dtype)  # fmt: skip
            if DOT:
                acc += tl.dot(x, tl.trans(w))
                if GATED:
                    acc_up += tl.dot(x, tl.trans(wu))
            else:
                xf = x.to(tl.float32)[:, None, :]
                acc += tl.sum(xf * w.to(tl.float32)[None, :, :], 2)
                if GATED:
                    acc_up += tl.sum(xf * wu.to(tl.float32)[None, :, :], 2)
    if WFMT == 1:  # the per-row E4M3 scales
        acc = acc * tl.load(WScale + offs_n, mask=n_ok, other=0.0)[None, :]
        if GATED:
            acc_up = acc_up * tl.load(WScale + up_rows + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        g = acc.to(dtype).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        acc = act * acc_up.to(dtype).to(tl.float32)
    if HAS_RES:
        r = tl.load(Res + offs_m[:, None] * stride_rm + offs_n[None, :], mask=m_ok[:, None] & n_ok[None, :])
        acc += r.to(tl.float32)
    out = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


PROGRAMS_PER_SM = 4  # one-row GEMVs: enough programs that every SM has loads in flight
# One-row GEMVs: weight rows per program. The H200 sweep (benchmarks/results/decode_layer.json, TinyLlama
# shapes) found 4 rows best for QKV and 2 gate/up pairs for gate_up (15.3 us; 16 rows: 16.5), and the
# lm_head at 4 rows took 34.7 us against 37.7 at 16. With this rule and PDL (decode_layer_single.json):
# QKV 4.8 us, o_proj 3.4, gate_up 12.6, down 8.0, lm_head 32.5.
MAX_ROWS_PER_PROGRAM = 4


@functools.cache
def _num_sms(device: torch.device) -> int:
    """SMs of a CUDA device; 1 elsewhere (Triton's interpreter runs the programs one after another)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether launches on `device` use programmatic dependent launch (Hopper and later, CUDA; off with
    ``TRTFORGE_PDL=0``): the kernel may start while the previous one finishes, requests its first
    weights, then waits for that kernel's writes (``griddepcontrol.wait``) before reading its inputs."""
    if device.type != "cuda" or os.environ.get("TRTFORGE_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


# Quantized GEMVs at one row, from the H200 sweep (benchmarks/sweep_quant_gemv.py --quick,
# results/sweep_quant_gemv_s13.json; Llama-3-8B shapes, CUDA-graph timed, L2 defeated). FP8: 4 weight
# rows (or 4 gate/up pairs) x 1024 columns over 4 warps: gate_up 38.7 us (3.04 TB/s) against 48.5 at
# 2 pairs x 2048 over 8 warps, down 16.0 us (3.67 TB/s), o 6.0, qkv 12.0 (11.1 at 2048). INT4: 8 rows x
# 4096 columns (4 pairs gated), not halved for want of programs: o 5.5 us against 6.5 at 4 rows, down
# 16.8 against 19.0; chunks of 2048 took twice as long at every shape.
QUANT_ROWS_PER_PROGRAM = {"fp8": 4, "int4": 8}
QUANT_BLOCK_K = {"fp8": 1024, "int4": 4096}
# One-row FP8 GEMVs with at least this many programs an SM (at 4 weight rows a program) sum each chunk as
# it comes (GemvConfig.reduce), over chunks of FP8_REDUCE_CHUNK_CODES codes: 8 weight rows a program (gate
# and up count two) where that still leaves as many programs, else 4. The H200 loop sweeps (results/
# sweep_quant_gemv_loops_s19.json, sweep_quant_gemv_head_s19.json; 4 warps): qkv (11.6 programs an SM) 9.74
# us at 4 rows x 4,096 against the plain loop's best 11.03; gate_up (27) 30.9 at 4 pairs x 2,048 against
# 38.6; the FP8 lm_head 115 us at 8 rows x 2,048 (4.56 TB/s) against 143 at 4 x 2,048 and 147 plain. o and
# down (7.8) lose with it (6.15 against 5.91, 17.0 against 15.9). 16-bit weights: no loop wins beyond
# noise, so they stay plain.
FP8_REDUCE_MIN_PROGRAMS_PER_SM = 10
FP8_REDUCE_CHUNK_CODES = 16384
# A reducing one-row FP8 GEMV (not gated) takes 8 weight rows a program where that still leaves this many
# programs an SM. H200 sweep (sweep_quant_gemv.py, results/sweep_quant_gemv_fp8_s24.json): qkv (5.8 programs
# an SM at 8 rows) 8.27 us at 8 rows x 2,048 against 9.83 at 4 x 4,096.
FP8_REDUCE_WIDE_MIN_PROGRAMS_PER_SM = 5


def default_config(
    m: int, n: int, k: int, gated: bool, num_sms: int = 132, weight_kind: str = "plain"
) -> GemvConfig:
    """The launch parameters for an ``[m, k] x [n, k]^T`` projection (gated: n gate/up row pairs).

    16-bit weights, one row: the widest column block of at most ``MAX_ROWS_PER_PROGRAM`` weight rows
    (gate and up count two) that still gives ``PROGRAMS_PER_SM`` programs per SM, and the longest K
    chunk (<= 1024) keeping ~32 FP32 partials a thread; more rows: the tensor cores. Quantized weights
    (`weight_kind` "fp8" or "int4") take FP32 FMAs at every row count: ``QUANT_ROWS_PER_PROGRAM`` rows
    (FP8: rows or gate/up pairs, halved while programs are too few) and ``QUANT_BLOCK_K`` columns a
    chunk (FP8: shorter per row of x past one; one row with many programs: the reducing loop over
    chunks of ``FP8_REDUCE_CHUNK_CODES`` codes, 8 rows a program where programs stay many).
    """
    rows_per_pair = 2 if gated else 1
    if weight_kind in QUANT_ROWS_PER_PROGRAM:
        rows = QUANT_ROWS_PER_PROGRAM[weight_kind]
        if weight_kind == "int4" and m > 1:  # each row of x re-reads the unpacked words: 4 rows fit
            rows = 4  # in registers (sm_90: 220 of them at 4 rows; 8 rows spill)
        if weight_kind == "fp8":  # FP8 counts gate/up pairs (the sweep: 4 pairs beat 2)
            bn = rows
            while bn > 1 and triton.cdiv(n, bn) < PROGRAMS_PER_SM * num_sms:
                bn //= 2
        else:
            bn = rows // rows_per_pair
        bk = min(QUANT_BLOCK_K[weight_kind], triton.next_power_of_2(k))
        if weight_kind == "int4":  # one row of x at a time: the registers do not grow with m
            return GemvConfig(block_n=bn, block_k=max(bk, INT4_GROUP), num_warps=4, num_stages=1, dot=False)
        many = FP8_REDUCE_MIN_PROGRAMS_PER_SM * num_sms
        if m == 1 and triton.cdiv(n, bn) >= many:
            if not gated and triton.cdiv(n, 2 * bn) >= FP8_REDUCE_WIDE_MIN_PROGRAMS_PER_SM * num_sms:
                bn *= 2  # 8 rows a program, as gate_up's 4 pairs
            bk = min(FP8_REDUCE_CHUNK_CODES // (bn * rows_per_pair), triton.next_power_of_2(k))
            return GemvConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=1, dot=False, reduce=True)
        bk = max(64, bk // triton.next_power_of_2(m))  # FMAs over [m, rows, chunk]
        return GemvConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=1 if m == 1 else 2, dot=False)
    if m == 1:
        bn = MAX_ROWS_PER_PROGRAM // rows_per_pair
        while bn > 1 and triton.cdiv(n, bn) < PROGRAMS_PER_SM * num_sms:
            bn //= 2
        bk = min(1024, triton.next_power_of_2(k), max(64, 16384 // (bn * rows_per_pair)))
        return GemvConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=1, dot=False)
    return GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3, dot=True)


def _weight_args(
    w: torch.Tensor | QuantWeight,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """The kernel's view of a weight: codes (INT4: the packed bytes as int32 words of eight codes),
    per-row (FP8) or per-group (INT4) scales and offsets, WFMT."""
    if isinstance(w, Fp8Weight):
        return w.data, w.scale, None, 1
    if isinstance(w, Int4Weight):
        if w.group_size != INT4_GROUP:
            raise ValueError(f"the INT4 GEMV takes groups of {INT4_GROUP}, got {w.group_size}")
        return w.packed.view(torch.int32), w.scale, w.offset, 2
    return w, None, None, 0


def _check(x: torch.Tensor, w: torch.Tensor | QuantWeight, what: str) -> None:
    shape = tuple(w.shape)
    codes = _weight_args(w)[0]
    if x.dim() != 2 or len(shape) != 2 or x.shape[1] != shape[1]:
        raise ValueError(f"{what}: x {tuple(x.shape)} and weight {shape} are not [M, K] and [N, K]")
    if not 0 < x.shape[0] <= MAX_ROWS:
        raise ValueError(f"{what}: takes 1..{MAX_ROWS} rows, got {x.shape[0]}")
    if x.stride(1) != 1 or codes.stride(1) != 1:
        raise ValueError(f"{what}: x and weight need unit stride along K")


# True: one-row RMSNorm GEMVs with 16-bit or FP8 weights (QKV, gate/up, the LM head) skip the prologue
# that sums x's squares before the loop. They sum ``w * x * norm_w`` and the squares in the same loop, from
# the same loads, and scale the sums by rstd at the end. Exact in FP32 up to summation order; the eager
# path's two roundings of the normalized x to the 16-bit dtype are left out (closer to the exact result:
# tests/kernels/test_gemv_kernels.py). H100, session 54 (bench_quant_speed.py --ab, 8B single stream,
# results/quant_speed_s54_ab_h100.json): BF16 5.402 -> 5.235 ms/token, FP8 + FP8 head 3.095 -> 3.009;
# INT4's norm GEMVs are int4_mma's and unchanged. False: the prologue form, for A/B timing.
DEFER_NORM = True

# One-row INT4 GEMVs run on the tensor cores (:mod:`trtforge.kernels.int4_mma`) where it takes them and no
# config is given; False: always the FMA kernel here (for A/B timing).
INT4_MMA = True


@functools.cache
def _int4_mma():
    """:mod:`trtforge.kernels.int4_mma`, imported on first use; None where Triton has no Gluon (before
    3.4): the FMA kernel then serves every INT4 projection."""
    import importlib.util

    if importlib.util.find_spec("triton.experimental.gluon") is None:
        return None
    from trtforge.kernels import int4_mma

    return int4_mma


def prepare(weight: torch.Tensor | QuantWeight, *, gated: bool = False, norm: bool = False) -> None:
    """Ready `weight` for the one-row kernels before a CUDA graph captures them: an INT4 weight that the
    tensor-core kernel takes in this form (`gated`: gate/up rows; `norm`: RMSNorm prologue) on its GPU
    gets its packing now (:func:`trtforge.kernels.int4_mma.mma_words`); the dispatch never packs."""
    if not (INT4_MMA and isinstance(weight, Int4Weight) and weight.packed.is_cuda):
        return
    mod = _int4_mma()
    n = int(weight.shape[0]) // (2 if gated else 1)
    if mod is not None and mod.eligible(weight, n, gated, norm, weight.packed.device):
        mod.mma_words(weight)


def _launch(x, w, out, n, *, res=None, bias=None, norm_w=None, eps=0.0, up_rows=0, config=None) -> None:
    m, k = int(x.shape[0]), int(x.shape[1])
    if (
        INT4_MMA
        and config is None
        and bias is None
        and isinstance(w, Int4Weight)
        and not interpreting()
        and (mma := _int4_mma()) is not None
        and mma.supported(x, w, n, up_rows > 0, norm_w is not None)
    ):
        mma.launch(
            x, w, out, n, res=res, norm_w=norm_w, eps=eps, up_rows=up_rows, pdl=pdl_supported(x.device)
        )
        return
    codes, scale, offset, wfmt = _weight_args(w)
    kind = ("plain", "fp8", "int4")[wfmt]
    cfg = config or default_config(m, n, k, up_rows > 0, _num_sms(x.device), kind)
    if wfmt and cfg.dot:
        raise ValueError("quantized weights run on FP32 FMAs: GemvConfig(dot=False)")
    if wfmt == 2 and (cfg.block_k % INT4_GROUP or cfg.block_k & (cfg.block_k - 1)):
        raise ValueError(f"INT4 weights need block_k a power of two >= {INT4_GROUP}, got {cfg.block_k}")
    block_m = 16 if cfg.dot else triton.next_power_of_2(m)
    pdl = pdl_supported(x.device)
    dummy = out
    _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, codes, out,
        res if res is not None else dummy,
        bias if bias is not None else dummy,
        norm_w if norm_w is not None else dummy,
        scale if scale is not None else dummy,
        offset if offset is not None else dummy,
        m, n, k,
        x.stride(0), codes.stride(0), scale.stride(0) if scale is not None and scale.dim() == 2 else 0,
        out.stride(0), res.stride(0) if res is not None else 0,
        up_rows, float(eps),
        NORM=norm_w is not None, GATED=up_rows > 0, HAS_RES=res is not None, HAS_BIAS=bias is not None,
        DOT=cfg.dot, PDL=pdl, WFMT=wfmt, GROUP=INT4_GROUP, ASM=x.device.type == "cuda" and not interpreting(),
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        REDUCE=cfg.reduce and wfmt < 2 and block_m == 1 and not cfg.dot, DEFER=DEFER_NORM,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor | QuantWeight,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """``linear(x, weight, bias)`` for ``x`` ``[M, K]`` (M <= 16), ``weight`` ``[N, K]`` or quantized."""
    _check(x, weight, "gemv")
    n = int(weight.shape[0])
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _launch(x, weight, out, n, bias=bias, config=config)
    return out


def norm_gemv(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor | QuantWeight,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """``linear(rms_norm(x), weight, bias)`` for ``x`` ``[M, K]`` (M <= 16), ``weight`` ``[N, K]``
    (or quantized: :mod:`trtforge.kernels.qweight`)."""
    _check(x, weight, "norm_gemv")
    n = int(weight.shape[0])
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _launch(x, weight, out, n, bias=bias, norm_w=norm_weight, eps=eps, config=config)
    return out


def norm_gate_up_silu(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up: torch.Tensor | QuantWeight,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """``silu(g) * u`` for ``[g | u] = linear(rms_norm(x), gate_up)``, gate_up ``[2I, K]`` -> ``[M, I]``."""
    _check(x, gate_up, "norm_gate_up_silu")
    if gate_up.shape[0] % 2:
        raise ValueError(f"norm_gate_up_silu: gate_up has an odd row count {gate_up.shape[0]}")
    inter = int(gate_up.shape[0]) // 2
    out = torch.empty((x.shape[0], inter), dtype=x.dtype, device=x.device)
    _launch(x, gate_up, out, inter, norm_w=norm_weight, eps=eps, up_rows=inter, config=config)
    return out


def gemv_residual(
    x: torch.Tensor,
    weight: torch.Tensor | QuantWeight,
    residual: torch.Tensor,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """``residual + x @ weight.T`` (one rounding, as ``addmm``); x ``[M, K]``, weight ``[N, K]``."""
    _check(x, weight, "gemv_residual")
    n = int(weight.shape[0])
    if tuple(residual.shape) != (x.shape[0], n) or residual.stride(1) != 1:
        raise ValueError(f"gemv_residual: residual {tuple(residual.shape)} is not [{x.shape[0]}, {n}]")
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _launch(x, weight, out, n, res=residual, config=config)
    return out
