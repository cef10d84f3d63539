"""A 16-bit GEMM for decode-sized batches (tens to hundreds of rows) on Hopper, in Triton: ``x @ w^T``
with the bias or the residual add folded into its FP32 epilogue.

Why: a served decode step of an 8B model multiplies 64-512 rows by each projection. There cuBLAS's
BF16 GEMMs ran far below their large-M rate on the H200 (``bench_quant_speed.py``, session 13, at
M = 256: qkv 456, o 346, gate_up 601, down 565 TFLOP/s, against 700-750 at M = 4096). The narrow
projections give few output tiles: at M = 256 and N = 4096, 128 x 128 tiles make 64 programs for
132 SMs. The decode steps of issue #29's decode-bound rows (128/128: 241 rows, 9.8 ms against a
4.4 ms roofline) are mostly these GEMMs. This kernel picks tiles by the output's size, so the programs
fill the SMs (:func:`default_mid_config`), and splits K where even small tiles cannot.

:func:`mid_gemm_fp8` is the same kernel on E4M3 codes (W8A8, per-row activation and weight scales in
the epilogue), for the batches above the skinny FP8 GEMM's 64 rows, where cuBLASLt's FP8 GEMMs reached
480-990 TFLOP/s at 256 rows (session 13) against a ~1,979 peak.

Dispatched only where asked: ``trtforge.llm.executors.fused_layers`` routes 16-bit projections of
``MID_GEMM_MIN_TOKENS..MID_GEMM_MAX_TOKENS`` tokens here on Hopper, and ``trtforge.llm.quant.linear``
W8A8 up to ``FP8_MID_MAX_TOKENS`` where :func:`fp8_mid_wins`. On the H200 (session 17,
``benchmarks/sweep_mid_gemm.py``) the 16-bit kernel lost to cuBLAS on every 8B projection at 128-512
rows (0.73-0.99x), so the 16-bit dispatch stays off; the FP8 one won on the narrow outputs.

Numerics: the products of the 16-bit inputs summed in FP32 on the tensor cores (wgmma on sm_90), the
bias or residual (16-bit) added to the FP32 sum, one rounding to the output dtype. Split-K
(``MidConfig.split_k`` > 1) sums each K slice into an FP32 workspace ``[slices, M, N]`` and a second
small kernel adds the slices in order and applies the epilogue: bitwise reproducible, in CUDA graphs
too (the same choice as :mod:`trtforge.kernels.fp8_skinny`).

Program order: the output tiles of one weight tile (its column block, every row block) are
consecutive program ids, so the row blocks that read the same weights run together and the second
read of a weight tile comes from L2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trtforge.kernels import interpreting, num_sms
from trtforge.kernels.fp8_rows import check_w8a8

_DTYPES = (torch.bfloat16, torch.float16)
PRECISE_ACC_K = 128  # FP8: products a wgmma chain sums before they join the FP32 accumulator
_REDUCE_BLOCK = 1024  # elements per program of the split-K reduction


@dataclass(frozen=True)
class MidConfig:
    """Launch parameters: output rows and columns per program, K chunk, warps, pipeline stages, K
    splits (each a program of its own; FP32 partials summed by a second kernel)."""

    block_m: int = 128
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1

    def __post_init__(self) -> None:
        allowed = {
            "block_m": (64, 128),
            "block_n": (32, 64, 128, 256),
            "block_k": (32, 64, 128),
            "num_warps": (4, 8),
            "num_stages": (2, 3, 4, 5),
            "split_k": (1, 2, 3, 4),
        }
        for name, values in allowed.items():
            if getattr(self, name) not in values:
                raise ValueError(f"MidConfig.{name} must be one of {values}, got {getattr(self, name)}")


def default_mid_config(m: int, n: int, k: int, num_sms: int = 132, fp8: bool = False) -> MidConfig:
    """The launch parameters for ``[m, k] x [n, k]^T``.

    `fp8` (measured: the H200 sweep of session 17, ``sweep_mid_gemm.py --fp8 --quick``; within 8% of
    the best config on every 8B projection and row count that :func:`fp8_mid_wins` sends here): 64-row
    tiles, chunks of 128, 4 warps, 4 stages; 128 columns where K is long (>= 8192: a wider tile reads
    each row of x for more outputs) or the 64-column tiles would number 2x the SMs, else 64; K split
    in two while the tiles number under 1.5x the SMs. 16-bit: a guess (the same sweep found cuBLAS
    faster on every shape, so nothing dispatches to it): block_m 128 (64 for at most 64 rows), block_n
    the widest of 256/128/64 whose tiles still number at least `num_sms`, K split while the tiles fill
    under half the SMs."""
    if fp8:
        rows = triton.cdiv(m, 64)
        wide = k >= 8192 or rows * triton.cdiv(n, 64) >= 2 * num_sms
        bn = 128 if wide else 64
        tiles = rows * triton.cdiv(n, bn)
        split = 2 if tiles * 2 < 3 * num_sms and triton.cdiv(k, 128) >= 16 else 1
        return MidConfig(block_m=64, block_n=bn, block_k=128, num_warps=4, num_stages=4, split_k=split)
    bm = 64 if m <= 64 else 128
    rows = triton.cdiv(m, bm)
    bn = next((c for c in (256, 128) if rows * triton.cdiv(n, c) >= num_sms), 64)
    tiles = rows * triton.cdiv(n, bn)
    chunks = triton.cdiv(k, 64)
    split = 1
    while split < 3 and tiles * split < num_sms // 2 and chunks >= 8 * (split + 1):
        split += 1
    return MidConfig(block_m=bm, block_n=bn, block_k=64, num_warps=8 if bn == 256 else 4, split_k=split)


def fp8_mid_wins(m: int, n: int, num_sms: int = 132) -> bool:
    """Whether :func:`mid_gemm_fp8` beats cuBLASLt's FP8 GEMM (``torch._scaled_mm``) at this output size:
    where 64 x 64 tiles of the ``[m, n]`` output number under 2x the SMs, cuBLASLt leaves SMs idle and
    this kernel's small tiles and split K fill them. On the H200 (session 17 sweep, 8B projections)
    that held for o and down at 128 and 256 rows (1.09-1.68x, with their residual add folded here
    against ``_scaled_mm`` and a separate add); qkv at 128 rows lost 4%; every wider output (gate_up;
    qkv at 256, everything at 512) lost 3-24%."""
    return triton.cdiv(m, 64) * triton.cdiv(n, 64) < 2 * num_sms


@triton.jit
def _mid_gemm_kernel(
    X,
    W,
    SX,
    WS,
    Bias,
    Res,
    Out,
    Part,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_rm,
    stride_om,
    k_split,
    EPILOGUE: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_F32: tl.constexpr,
    SCALED: tl.constexpr,
    IMPRECISE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid (row blocks x column blocks, SPLIT): program (id, s) makes output tile id over K slice s;
    ids run over the row blocks first, so the programs sharing a weight tile are neighbours.

    EPILOGUE 0: none, 1: + bias[n], 2: + residual[m, n]. Rows past M and columns past N wrap to valid
    addresses (no masks on the loads along M and N); their outputs are not stored. SPLIT 1: the
    epilogue here; more: the FP32 sum of this K slice into Part[slice, :M, :N]. DOT_F32 (the interpreter
    with BF16, whose dot multiplies BF16's raw bits): the tiles widened to FP32 first, exactly. SCALED
    (W8A8: E4M3 x and w): the FP32 sum times SX[m] * WS[n] before the bias or residual; IMPRECISE: the
    products a wgmma chain sums before they join the FP32 accumulator (None: the whole K)."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    row_blocks = tl.cdiv(M, BLOCK_M)
    pid_m = pid % row_blocks
    pid_n = pid // row_blocks
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    arange_k = tl.arange(0, BLOCK_K)
    x_rows = X + (offs_m % M).to(tl.int64)[:, None] * stride_xm
    w_rows = W + (offs_n % N).to(tl.int64)[:, None] * stride_wn
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + arange_k
        if EVEN_K:
            x = tl.load(x_rows + offs_k[None, :])
            w = tl.load(w_rows + offs_k[None, :])
        else:
            k_ok = offs_k[None, :] < K
            x = tl.load(x_rows + offs_k[None, :], mask=k_ok, other=0.0)
            w = tl.load(w_rows + offs_k[None, :], mask=k_ok, other=0.0)
        if DOT_F32:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=IMPRECISE)
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        if SCALED:
            sx = tl.load(SX + offs_m, mask=m_ok, other=0.0)
            acc = acc * sx[:, None] * tl.load(WS + offs_n, mask=n_ok, other=0.0)[None, :]
        if EPILOGUE == 1:
            acc += tl.load(Bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if EPILOGUE == 2:
            res = Res + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :]
            acc += tl.load(res, mask=ok, other=0.0).to(tl.float32)
        out = Out + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(Out.dtype.element_ty), mask=ok)
    else:
        part = Part + (pid_k * M + offs_m).to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(part, acc, mask=ok)


@triton.jit
def _mid_reduce_kernel(
    Part,
    SX,
    WS,
    Bias,
    Res,
    Out,
    M,
    N,
    stride_rm,
    stride_om,
    EPILOGUE: tl.constexpr,
    SPLIT: tl.constexpr,
    SCALED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The SPLIT FP32 partials ``[SPLIT, M, N]`` summed in slice order, then the epilogue."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    m = offs // N
    n = offs % N
    acc = tl.load(Part + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(Part + s * M * N + offs, mask=ok, other=0.0)
    if SCALED:
        acc = acc * tl.load(SX + m, mask=ok, other=0.0) * tl.load(WS + n, mask=ok, other=0.0)
    if EPILOGUE == 1:
        acc += tl.load(Bias + n, mask=ok, other=0.0).to(tl.float32)
    if EPILOGUE == 2:
        acc += tl.load(Res + m * stride_rm + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + m * stride_om + n, acc.to(Out.dtype.element_ty), mask=ok)


def _refuse(name: str, want: str, t: torch.Tensor) -> ValueError:
    return ValueError(f"mid_gemm: {name} must be {want}, got {t.dtype} {tuple(t.shape)}")


def _check(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None
) -> None:
    """ValueError naming the argument that is not what the kernel takes."""
    if x.dim() != 2 or x.dtype not in _DTYPES or 0 in x.shape or x.stride(1) != 1:
        raise _refuse("x", "a BF16 or FP16 [M >= 1, K >= 1] with unit stride along K", x)
    m, k = int(x.shape[0]), int(x.shape[1])
    if w.dim() != 2 or w.dtype != x.dtype or int(w.shape[1]) != k or w.stride(1) != 1:
        raise _refuse("w", f"{x.dtype} [N, {k}] (x's dtype and K) with unit stride along K", w)
    _check_epilogue(m, int(w.shape[0]), bias, residual, {"x": x, "w": w})


def _check_epilogue(
    m: int, n: int, bias: torch.Tensor | None, residual: torch.Tensor | None, tensors: dict
) -> None:
    """The bias or residual's shape, and every tensor on one device."""
    if bias is not None and residual is not None:
        raise ValueError("mid_gemm: give a bias or a residual, not both")
    if bias is not None and (
        tuple(bias.shape) != (n,) or not bias.is_contiguous() or not bias.is_floating_point()
    ):
        raise _refuse("bias", f"a contiguous float [{n}]", bias)
    if residual is not None and (
        tuple(residual.shape) != (m, n) or residual.stride(1) != 1 or not residual.is_floating_point()
    ):
        raise _refuse("residual", f"a float [{m}, {n}] with unit stride along N", residual)
    tensors = tensors | {"bias": bias, "residual": residual}
    devices = {name: str(t.device) for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) != 1:
        raise ValueError(f"mid_gemm: the tensors are on different devices: {devices}")


def mid_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    config: MidConfig | None = None,
) -> torch.Tensor:
    """``x @ w^T`` (+ `bias` ``[N]``, or + `residual` ``[M, N]``) in `x`'s dtype: x ``[M, K]`` and w
    ``[N, K]`` BF16 or FP16 (the same), summed in FP32, one rounding (what ``F.linear`` and
    ``torch.addmm(residual, x, w.t())`` compute, up to FP32 summation order)."""
    _check(x, w, bias, residual)
    m, k, n = int(x.shape[0]), int(x.shape[1]), int(w.shape[0])
    cfg = config or default_mid_config(m, n, k, num_sms(x.device))
    dot_f32 = interpreting() and x.dtype == torch.bfloat16
    return _launch(x, w, None, None, bias, residual, x.dtype, cfg, dot_f32=dot_f32, imprecise=None)


def mid_gemm_fp8(
    xq: torch.Tensor,
    sx: torch.Tensor,
    w_data: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    config: MidConfig | None = None,
) -> torch.Tensor:
    """W8A8: ``(xq * sx) @ (w_data * w_scale)^T`` (+ bias or + residual) as `out_dtype`: E4M3 codes
    xq ``[M, K]`` with float32 per-row scales sx ``[M]`` (or ``[M, 1]``; :mod:`trtforge.kernels.fp8_rows`)
    and w_data ``[N, K]`` with per-row scales w_scale ``[N]`` (an :class:`~trtforge.kernels.qweight.
    Fp8Weight`), the products summed in FP32 (every :data:`PRECISE_ACC_K` of them joining the FP32
    accumulator, as ``_scaled_mm(use_fast_accum=False)``), scaled, one rounding."""
    m, n, k = check_w8a8("mid_gemm_fp8", xq, sx, w_data, w_scale)
    if out_dtype not in (*_DTYPES, torch.float32):
        raise ValueError(f"mid_gemm_fp8: out_dtype must be BF16, FP16 or FP32, got {out_dtype}")
    _check_epilogue(m, n, bias, residual, {"xq": xq, "sx": sx, "w_data": w_data, "w_scale": w_scale})
    cfg = config or default_mid_config(m, n, k, num_sms(xq.device), fp8=True)
    return _launch(
        xq, w_data, sx.reshape(m), w_scale, bias, residual, out_dtype, cfg, dot_f32=False,
        imprecise=min(PRECISE_ACC_K, cfg.block_k),
    )  # fmt: skip


def _launch(
    x, w, sx, ws, bias, residual, out_dtype, cfg: MidConfig, *, dot_f32: bool, imprecise
) -> torch.Tensor:
    """Both kernels' launch: the GEMM (and, split, the ordered reduction); sx/ws None: unscaled."""
    m, k, n = int(x.shape[0]), int(x.shape[1]), int(w.shape[0])
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    bk = cfg.block_k
    k_split = triton.cdiv(triton.cdiv(k, bk), cfg.split_k) * bk  # whole chunks per K slice
    split = triton.cdiv(k, k_split)  # (fewer slices than asked when K holds fewer chunks)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    epilogue = 1 if bias is not None else 2 if residual is not None else 0
    b = bias if bias is not None else out
    r = residual if residual is not None else out
    scaled = sx is not None
    sx_, ws_ = (sx, ws) if scaled else (part, part)  # (unused pointers)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), split)
    _mid_gemm_kernel[grid](
        x, w, sx_, ws_, b, r, out, part, m, n, k, x.stride(0), w.stride(0), r.stride(0), out.stride(0),
        k_split, EPILOGUE=epilogue, SPLIT=split, EVEN_K=k % bk == 0, DOT_F32=dot_f32, SCALED=scaled,
        IMPRECISE=imprecise, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        _mid_reduce_kernel[(triton.cdiv(m * n, _REDUCE_BLOCK),)](
            part, sx_, ws_, b, r, out, m, n, r.stride(0), out.stride(0),
            EPILOGUE=epilogue, SPLIT=split, SCALED=scaled, BLOCK=_REDUCE_BLOCK, num_warps=4,
        )  # fmt: skip
    return out
