"""Dynamic per-token FP8 activation quantization in one Triton kernel (the FP8 GEMMs' input).

:func:`quantize_rows_fp8_padded` computes what :func:`trtforge.kernels.qweight.quantize_rows_fp8`
does (each row's largest magnitude -> scale ``amax / 448``, values ``round(x * 448 / amax)`` to E4M3,
half to even, saturated to +-448) in one launch, and writes the rows out padded to a multiple of 16
(zero rows, scale 1), the row granularity of cuBLASLt's FP8 GEMMs (``torch._scaled_mm``).

One program per row, enough warps that a row of up to :data:`SINGLE_PASS_K` elements sits in
registers (~32 a thread): the row is read once, its peak found, and the same registers quantized and
stored, so a call costs one read of x and one write of the codes at any M. Longer rows take a second
pass over K. On a GPU the rounding is the hardware's float32 -> E4M3 conversion (``cvt.rn.satfinite``:
nearest even, finite); Triton's interpreter converts to float8 by rounding half up without carrying
into the exponent, so there the value is first rounded exactly by bit arithmetic (:func:`round_e4m3`)
and the cast only changes the type. Both divisions are IEEE (``tl.div_rn``): Triton's ``/`` on
float32 is ``div.full.f32`` on the GPU (up to 2 ulp off), so ``448 / 448`` need not be 1 and values on
a rounding boundary would round away from torch's codes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtforge.kernels import interpreting
from trtforge.kernels.qweight import Fp8Rows

SINGLE_PASS_K = 16384  # rows up to this long are quantized from registers in one pass


@triton.jit
def round_e4m3(v):
    """float32 `v` rounded to the nearest E4M3 value (half to even, saturating at +-448), as float32.

    Bit arithmetic rather than a cast to float8: exact in Triton's interpreter too (whose float8 cast
    does not carry a mantissa overflow into the exponent). Below E4M3's smallest normal 2^-6 the grid
    is 2^-9: there the value times 2^9 (exact) is rounded to an integer in one IEEE addition of 2^23
    (nearest even) and scaled back. (Adding 2^-6 first, as an earlier version did, rounded twice: a
    value a hair off a subnormal tie lost the hair in the addition and then rounded as the tie.)"""
    a = tl.minimum(tl.abs(v), 448.0)
    bits = a.to(tl.int32, bitcast=True)
    r = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0) * 0.001953125
    r = tl.where(a < 0.015625, sub, r)
    return tl.where(v < 0, -r, r)


@triton.jit
def cast_e4m3(v, DST: tl.constexpr, HW_CAST: tl.constexpr):
    """float32 `v` (already scaled) as E4M3 of type DST: the hardware conversion after a clamp to the
    finite range, or (HW_CAST off) the exact bit-arithmetic rounding first."""
    if HW_CAST:
        return tl.minimum(tl.maximum(v, -448.0), 448.0).to(DST)
    return round_e4m3(v).to(DST)


@triton.jit
def store_row_scale(S_row, amax, live):
    """A row's scale ``amax / 448`` (IEEE division) at `S_row`; 1 for a padding row (`live` false)."""
    tl.store(S_row, tl.where(live, tl.div_rn(amax, 448.0), 1.0))


@triton.jit
def quantize_row_store(y, Q_row, S_row, offs, ok, live, HW_CAST: tl.constexpr):
    """Store one row `y` (float32, zeros where masked) as E4M3 codes at ``Q_row + offs`` and its scale at
    `S_row` (:func:`store_row_scale`). The fused producers (:mod:`trtforge.kernels.fused_layer`) end in
    this, so their codes are this module's."""
    amax = tl.maximum(tl.max(tl.abs(y), 0), 1e-12)
    tl.store(Q_row + offs, cast_e4m3(y * tl.div_rn(448.0, amax), Q_row.dtype.element_ty, HW_CAST), mask=ok)
    store_row_scale(S_row, amax, live)


@triton.jit
def _quant_rows_kernel(
    X, Q, S, M, K, stride_xm, stride_qm, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr, HW_CAST: tl.constexpr
):
    row = tl.program_id(0)
    live = row < M
    arange = tl.arange(0, BLOCK_K)
    x_row = X + row.to(tl.int64) * stride_xm
    q_row = Q + row.to(tl.int64) * stride_qm
    dst = Q.dtype.element_ty
    if ONE_PASS:  # the whole row in registers: one read
        ok = arange < K
        x = tl.load(x_row + arange, mask=ok & live, other=0.0).to(tl.float32)
        quantize_row_store(x, q_row, S + row, arange, ok, live, HW_CAST)
    else:
        peak = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs = k0 + arange
            x = tl.load(x_row + offs, mask=(offs < K) & live, other=0.0).to(tl.float32)
            peak = tl.maximum(peak, tl.abs(x))
        amax = tl.maximum(tl.max(peak, 0), 1e-12)
        inv = tl.div_rn(448.0, amax)
        for k0 in range(0, K, BLOCK_K):
            offs = k0 + arange
            x = tl.load(x_row + offs, mask=(offs < K) & live, other=0.0).to(tl.float32)
            tl.store(q_row + offs, cast_e4m3(x * inv, dst, HW_CAST), mask=offs < K)
        store_row_scale(S + row, amax, live)


def empty_rows(m: int, k: int, dtype: torch.dtype, device: torch.device, multiple: int = 16) -> Fp8Rows:
    """Uninitialized :class:`Fp8Rows` for `m` rows of `k` (padded to `multiple` rows) that a kernel fills."""
    mp = -(-max(m, 1) // multiple) * multiple
    q = torch.empty((mp, k), dtype=torch.float8_e4m3fn, device=device)
    return Fp8Rows(q, torch.empty((mp, 1), dtype=torch.float32, device=device), m, dtype)


def hw_cast_default(device: torch.device) -> bool:
    """Whether kernels on `device` take the hardware float8 conversion (a GPU outside the interpreter)."""
    return device.type == "cuda" and not interpreting()


def quantize_rows_fp8_padded(
    x: torch.Tensor, multiple: int = 16, hw_cast: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 rows ``[Mp, K]`` and float32 scales ``[Mp, 1]`` of `x` ``[M, K]``, Mp = M rounded up to
    `multiple` (rows past M: zeros, scale 1). `hw_cast` (default: on a GPU outside the interpreter)
    picks the hardware float8 conversion over the bit-arithmetic rounding; both give the same codes."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(
            f"quantize_rows_fp8_padded: x must be [M, K] with unit stride along K, got {tuple(x.shape)}"
        )
    if hw_cast is None:
        hw_cast = hw_cast_default(x.device)
    m, k = int(x.shape[0]), int(x.shape[1])
    rows = empty_rows(m, k, x.dtype, x.device, multiple)
    q, s, mp = rows.q, rows.s, int(rows.q.shape[0])
    one_pass = k <= SINGLE_PASS_K
    block = triton.next_power_of_2(k) if one_pass else 4096
    warps = max(4, min(16, block // 1024))  # ~32 elements a thread
    _quant_rows_kernel[(mp,)](
        x, q, s, m, k, x.stride(0), q.stride(0), BLOCK_K=block, ONE_PASS=one_pass, HW_CAST=hw_cast,
        num_warps=warps,
    )  # fmt: skip
    return q, s


def check_w8a8(
    fn: str,
    xq: torch.Tensor,
    sx: torch.Tensor,
    w_data: torch.Tensor,
    w_scale: torch.Tensor,
    max_rows: int | None = None,
) -> tuple[int, int, int]:
    """The W8A8 GEMMs' operand contract (this module's codes and scales times an ``Fp8Weight``'s),
    checked once for every kernel that takes it: ValueError naming `fn` and the argument otherwise.
    Returns ``(M, N, K)``."""

    def refuse(name: str, want: str, t: torch.Tensor) -> ValueError:
        return ValueError(f"{fn}: {name} must be {want}, got {t.dtype} {tuple(t.shape)}")

    e4m3 = torch.float8_e4m3fn
    if xq.dim() != 2 or xq.dtype != e4m3 or 0 in xq.shape or xq.stride(1) != 1:
        raise refuse("xq", "float8_e4m3fn [M >= 1, K >= 1] with unit stride along K", xq)
    m, k = int(xq.shape[0]), int(xq.shape[1])
    if max_rows is not None and m > max_rows:
        raise refuse("xq", f"1..{max_rows} rows", xq)
    if w_data.dim() != 2 or w_data.dtype != e4m3 or int(w_data.shape[1]) != k or w_data.stride(1) != 1:
        raise refuse("w_data", f"float8_e4m3fn [N, {k}] (xq's K) with unit stride along K", w_data)
    n = int(w_data.shape[0])
    if sx.dtype != torch.float32 or tuple(sx.shape) not in ((m,), (m, 1)) or not sx.is_contiguous():
        raise refuse("sx", f"contiguous float32 [{m}] (or [{m}, 1])", sx)
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) != (n,) or not w_scale.is_contiguous():
        raise refuse("w_scale", f"contiguous float32 [{n}]", w_scale)
    return m, n, k
