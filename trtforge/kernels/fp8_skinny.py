"""Skinny W8A8 FP8 GEMM for 1..64 rows on Hopper's FP8 tensor cores (wgmma e4m3 x e4m3), in Triton.

Why: decode batches of 2..64 tokens are where FP8 serving lives, and both of today's FP8 paths are
far from the H200's 4.8 TB/s there. At one token the weight-only GEMV (:mod:`trtforge.kernels.gemv`)
widens E4M3 codes in registers and multiplies in FP32: instruction-bound, 1.2-3.1 TB/s. Above one
token ``torch._scaled_mm`` (cuBLASLt) after the activation quantization
(:mod:`trtforge.kernels.fp8_rows`) reached only ~38 TFLOP/s at 16 rows on the QKV shape (6144 x
4096), ~1.2 TB/s of weight bytes. A projection at <= 64 rows is a weight stream: this kernel reads
each weight tile once, straight into the tensor cores (no conversion of the codes), with the rows of
x zero-padded to one wgmma tile.

Dispatched only where asked: :func:`trtforge.llm.quant.linear.quant_linear` routes W8A8 at up to
``linear.FP8_SKINNY_MAX_TOKENS`` (64) tokens here on Hopper: on the H200 it beat quantize +
``_scaled_mm`` by 1.1-1.6x per 8B projection at 64 rows (``benchmarks/sweep_fp8_skinny.py``,
session 16); at one token the weight-only GEMV is faster still and keeps it.
:func:`default_skinny_config` is the rule that sweep fits.

Numerics: W8A8 with per-token x scales and per-channel w scales, as the ``_scaled_mm`` path:
``out = (xq @ w_data^T) * sx[:, None] * w_scale[None, :] (+ bias)``, the products of E4M3 codes
exact and summed in FP32 on the tensor cores, the scales (and bias) applied to the FP32 sum, one
rounding to ``out_dtype``. It equals :func:`trtforge.kernels.qweight.fp8_linear_reference` on the same
codes up to FP32 summation order. On sm_90 Triton lets FP8 wgmma chains accumulate at the tensor
cores' reduced internal precision by default (``max_num_imprecise_acc``); unless
``SkinnyConfig.fast_accum`` is set, the partial sum is instead added into the FP32 accumulator every
:data:`PRECISE_ACC_K` products, as cuBLASLt does for ``_scaled_mm(use_fast_accum=False)``. Those adds
read the wgmma results, so ptxas waits for each chunk's wgmma before them (its note C7517); the
sweep times ``fast_accum`` beside the best config to price that.

On sm_90 (compiled on the CPU: tests/kernels/test_fp8_skinny.py) the default config at 64 rows of the
QKV shape is four ``wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3`` a 128-wide chunk, its x
and weight tiles brought by 16-byte ``cp.async`` through a 4-stage pipeline (48 KB of shared memory),
no conversion of the codes, no spills.

Orientation (``SkinnyConfig.swap_ab``): by default x is the wgmma's A operand, a 64-row tile
(rows past M loaded as zeros) times ``block_n`` weight rows. Swapped, the weight tile is A
(``block_n`` >= 64 rows) and x, padded only to 16/32/64 rows, is B (wgmma N): a quarter of the
x tile's shared-memory traffic at up to 16 rows. Both are candidates for the sweep.

Split-K (``split_k`` > 1, for N too narrow to give every SM a program): each program sums a K slice of
whole chunks into an FP32 workspace ``[slices, M, N]`` and a second small kernel adds the slices in
order and applies the epilogue. Chosen over ``tl.atomic_add`` into an FP32 buffer, which would need a
zeroing launch and a cast launch as well and sums in whatever order the programs finish: the
workspace costs the same two extra passes over an ``[M, N]`` tile (small beside the weights) and
gives bitwise-reproducible outputs, inside CUDA graphs too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trtforge.kernels import num_sms
from trtforge.kernels.fp8_rows import check_w8a8

MAX_ROWS = 64  # rows of x one launch takes: one wgmma tile
PRECISE_ACC_K = 128  # products a wgmma chain sums before they join the FP32 accumulator (not fast_accum)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_REDUCE_BLOCK = 1024  # elements per program of the split-K reduction


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch parameters: weight rows (output columns) per program, K chunk, warps, pipeline stages,
    K splits (each a program of its own; FP32 partials summed by a second kernel), the orientation
    (``swap_ab``: the weight tile is the wgmma's A operand) and whether FP8 wgmma chains may
    accumulate at the tensor cores' reduced precision over the whole K (``fast_accum``)."""

    block_n: int = 32
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1
    swap_ab: bool = False
    fast_accum: bool = False

    def __post_init__(self) -> None:
        allowed = {
            "block_n": (16, 32, 64, 128),
            "block_k": (64, 128, 256),
            "num_warps": (4, 8),
            "num_stages": (1, 2, 3, 4, 5),
            "split_k": (1, 2, 4),
        }
        for name, values in allowed.items():
            if getattr(self, name) not in values:
                raise ValueError(f"SkinnyConfig.{name} must be one of {values}, got {getattr(self, name)}")
        if self.swap_ab and self.block_n < 16 * self.num_warps:
            raise ValueError(
                f"SkinnyConfig(swap_ab=True): the weight tile is the wgmma's A operand, 16 rows a warp: "
                f"block_n must be >= {16 * self.num_warps} at {self.num_warps} warps, got {self.block_n}"
            )


def block_rows(m: int, config: SkinnyConfig) -> int:
    """Rows of the x tile: 64 (wgmma M) in the default orientation; swapped, M rounded up to a power of
    two >= 16 (wgmma N; Triton's tl.dot takes no fewer than 16)."""
    return max(16, triton.next_power_of_2(m)) if config.swap_ab else MAX_ROWS


def default_skinny_config(m: int, n: int, k: int, num_sms: int = 132) -> SkinnyConfig:
    """The launch parameters for ``[m, k] x [n, k]^T`` (m <= 64), the rule the H200 sweep
    (``benchmarks/sweep_fp8_skinny.py``, session 16: Llama-3-8B's projections at 1 and 64 rows) fits
    within 4% of the fastest of 40 candidates on every shape:

    - N wide enough for two programs of 64 columns per SM (gate/up, 28672): swapped, 64 columns, K
      chunks of 128, 3 stages, no split (x at 64 rows as well as at one).
    - Otherwise up to 16 rows: swapped (x is the narrow wgmma N), 64 columns, chunks of 256, 4 stages.
    - Otherwise (17..64 rows): x the 64-row A tile, 32 columns, chunks of 256 for K >= 8192 (down)
      else 128, 4 stages.

    K is split in two while the programs number fewer than three per SM and each slice keeps >= 2
    chunks (N 4096 or 6144: 64-192 programs, two slices measured fastest)."""
    if triton.cdiv(n, 64) >= 2 * num_sms:
        bn, bk, stages, swap = 64, 128, 3, True
    elif m <= 16:
        bn, bk, stages, swap = 64, 256, 4, True
    else:
        bn, bk, stages, swap = 32, 256 if k >= 8192 else 128, 4, False
    bk = min(bk, max(64, triton.next_power_of_2(k)))  # (a short K: no chunk wider than it)
    split = 2 if triton.cdiv(n, bn) < 3 * num_sms and triton.cdiv(k, bk) >= 4 else 1
    return SkinnyConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=stages, split_k=split, swap_ab=swap)


@triton.jit
def _skinny_kernel(
    X,
    SX,
    W,
    WS,
    Bias,
    Out,
    Part,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    k_split,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    SWAP: tl.constexpr,
    IMPRECISE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_N), SPLIT): the BLOCK_N output columns of program 0 over K slice 1.

    x rows past M load as zeros (their outputs are not stored); weight rows past N wrap to rows < N
    (valid addresses, so the weight loads carry no row mask; those columns are not stored either).
    SPLIT 1: the epilogue here; more: the FP32 sum of this K slice into Part[slice, :M, :N]."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    arange_k = tl.arange(0, BLOCK_K)
    x_rows = X + offs_m[:, None] * stride_xm
    w_rows = W + (offs_n % N).to(tl.int64)[:, None] * stride_wn
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + arange_k
        if EVEN_K:
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None], other=0.0)
            w = tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first")
        else:
            k_ok = offs_k < K
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w_ok = k_ok[None, :]
            w = tl.load(w_rows + offs_k[None, :], mask=w_ok, other=0.0, eviction_policy="evict_first")
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=IMPRECISE)
        else:
            acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=IMPRECISE)
    if SWAP:
        acc = tl.trans(acc)
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        sx = tl.load(SX + offs_m, mask=m_ok, other=0.0)
        ws = tl.load(WS + offs_n, mask=n_ok, other=0.0)
        acc = acc * sx[:, None] * ws[None, :]
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = Out + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(Out.dtype.element_ty), mask=ok)
    else:
        part = Part + (pid_k * M + offs_m)[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(part, acc, mask=ok)


@triton.jit
def _split_reduce_kernel(
    Part, SX, WS, Bias, Out, M, N, stride_om, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr
):
    """The SPLIT FP32 partials ``[SPLIT, M, N]`` summed in slice order, then the skinny epilogue."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    m = offs // N
    n = offs % N
    acc = tl.load(Part + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(Part + s * M * N + offs, mask=ok, other=0.0)
    acc = acc * tl.load(SX + m, mask=ok, other=0.0) * tl.load(WS + n, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(Bias + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + m * stride_om + n, acc.to(Out.dtype.element_ty), mask=ok)


def _refuse(name: str, want: str, t: torch.Tensor) -> ValueError:
    return ValueError(f"fp8_skinny_gemm: {name} must be {want}, got {t.dtype} {tuple(t.shape)}")


def _check(
    xq: torch.Tensor,
    sx: torch.Tensor,
    w_data: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> None:
    """ValueError naming the argument that is not what the kernel takes."""
    _, n, _ = check_w8a8("fp8_skinny_gemm", xq, sx, w_data, w_scale, max_rows=MAX_ROWS)
    if bias is not None and (
        tuple(bias.shape) != (n,) or not bias.is_contiguous() or not bias.is_floating_point()
    ):
        raise _refuse("bias", f"a contiguous float [{n}]", bias)
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"fp8_skinny_gemm: out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    tensors = {"xq": xq, "sx": sx, "w_data": w_data, "w_scale": w_scale, "bias": bias}
    devices = {name: str(t.device) for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) != 1:
        raise ValueError(f"fp8_skinny_gemm: the tensors are on different devices: {devices}")


def fp8_skinny_gemm(
    xq: torch.Tensor,
    sx: torch.Tensor,
    w_data: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    config: SkinnyConfig | None = None,
) -> torch.Tensor:
    """``(xq * sx) @ (w_data * w_scale)^T (+ bias)`` as `out_dtype` ``[M, N]``: xq E4M3 ``[M, K]``
    (M <= 64) with float32 per-row scales sx ``[M]`` (what :func:`~trtforge.kernels.fp8_rows.
    quantize_rows_fp8_padded` makes, its first M rows), w_data E4M3 ``[N, K]`` with float32 per-row
    scales w_scale ``[N]`` (an :class:`~trtforge.kernels.qweight.Fp8Weight`'s data and scale)."""
    _check(xq, sx, w_data, w_scale, bias, out_dtype)
    m, k = int(xq.shape[0]), int(xq.shape[1])
    n = int(w_data.shape[0])
    cfg = config or default_skinny_config(m, n, k, num_sms(xq.device))
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    sxf = sx.reshape(m)
    bk = cfg.block_k
    k_split = triton.cdiv(triton.cdiv(k, bk), cfg.split_k) * bk  # whole chunks per K slice
    split = triton.cdiv(k, k_split)  # (fewer slices than asked when K holds fewer chunks)
    part = torch.empty((split, m, n), dtype=torch.float32, device=xq.device) if split > 1 else out
    has_bias = bias is not None
    dummy = w_scale
    _skinny_kernel[(triton.cdiv(n, cfg.block_n), split)](
        xq, sxf, w_data, w_scale, bias if has_bias else dummy, out, part,
        m, n, k, xq.stride(0), w_data.stride(0), out.stride(0), k_split,
        HAS_BIAS=has_bias, SPLIT=split, EVEN_K=k % bk == 0, SWAP=cfg.swap_ab,
        IMPRECISE=None if cfg.fast_accum else min(PRECISE_ACC_K, bk),
        BLOCK_M=block_rows(m, cfg), BLOCK_N=cfg.block_n, BLOCK_K=bk,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        _split_reduce_kernel[(triton.cdiv(m * n, _REDUCE_BLOCK),)](
            part, sxf, w_scale, bias if has_bias else dummy, out, m, n, out.stride(0),
            HAS_BIAS=has_bias, SPLIT=split, BLOCK=_REDUCE_BLOCK, num_warps=4,
        )  # fmt: skip
    return out
