"""Dynamic per-token FP8 activation quantization in one Triton kernel (the FP8 GEMMs' input).

:func:`quantize_rows_fp8_padded` computes what :func:`trtforge.kernels.qweight.quantize_rows_fp8`
does (each row's largest magnitude -> scale ``amax / 448``, values ``round(x * 448 / amax)`` to E4M3,
half to even) in one launch instead of six elementwise ones, and writes the rows out padded to a
multiple of 16 (zero rows, scale 1), the row granularity of cuBLASLt's FP8 GEMMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtforge.kernels.gemv import _round_e4m3


@triton.jit
def _quant_rows_kernel(X, Q, S, M, K, stride_xm, stride_qm, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    live = row < M
    arange = tl.arange(0, BLOCK_K)
    peak = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + arange
        x = tl.load(X + row * stride_xm + offs, mask=(offs < K) & live, other=0.0).to(tl.float32)
        peak = tl.maximum(peak, tl.abs(x))
    amax = tl.maximum(tl.max(peak, 0), 1e-12)
    inv = 448.0 / amax
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + arange
        x = tl.load(X + row * stride_xm + offs, mask=(offs < K) & live, other=0.0).to(tl.float32)
        q = _round_e4m3(x * inv)  # exact E4M3 values: the cast below does not round
        tl.store(Q + row * stride_qm + offs, q.to(Q.dtype.element_ty), mask=offs < K)
    tl.store(S + row, tl.where(live, amax / 448.0, 1.0))


def quantize_rows_fp8_padded(x: torch.Tensor, multiple: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 rows ``[Mp, K]`` and float32 scales ``[Mp, 1]`` of `x` ``[M, K]``, Mp = M rounded up to
    `multiple` (rows past M: zeros, scale 1)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(
            f"quantize_rows_fp8_padded: x must be [M, K] with unit stride along K, got {tuple(x.shape)}"
        )
    m, k = int(x.shape[0]), int(x.shape[1])
    mp = -(-max(m, 1) // multiple) * multiple
    q = torch.empty((mp, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((mp, 1), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(k), 4096)
    _quant_rows_kernel[(mp,)](x, q, s, m, k, x.stride(0), q.stride(0), BLOCK_K=block, num_warps=4)
    return q, s
