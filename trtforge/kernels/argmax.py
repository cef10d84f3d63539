"""Row argmax of a few rows of a wide vocabulary: greedy decoding's last kernel.

``torch.argmax`` over one row of 128,256 logits runs as one reduction CTA (``reduce_kernel<512, 1>``):
21-27 us a token in the H200 single-stream profile (BENCHMARKS.md, session 21), against a weight stream
of 2-4 ms. Here a row is split over many programs (BLOCK elements each, the first occurrence of the
chunk's maximum), then one program a row picks among the partials, with torch's rules: the first index
of the maximum; a NaN counts as the maximum (its first index wins); a row of -inf gives index 0.

On by default (:data:`FAST_ARGMAX`); :func:`argmax_rows` takes ``torch.argmax`` where it is off or the
rows are not eligible.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtforge.kernels import interpreting

# True: argmax_rows runs the split kernels where eligible (CUDA or the interpreter, few wide rows). H200, 8B
# single stream, same call (results/quant_speed_s22_fix.json): BF16 4.034 -> 4.015 ms/token, INT4 + FP8
# head 2.062 -> 2.036, FP8 + FP8 head 2.480 -> 2.456; its GPU tests pass.
FAST_ARGMAX = True
BLOCK = 4096  # elements a program: 32 programs a row at 128,256
MAX_ROWS = 64  # more rows: torch's reduction already spreads over CTAs
MIN_WIDTH = 16384  # narrower rows: one CTA is enough


@triton.jit
def _argmax_partial(X, PV, PI, V, stride_x, P, BLOCK: tl.constexpr):
    """Program (row, part): the maximum of its chunk and the chunk's first index of it (NaN first)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    offs = part * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    x = tl.load(X + row.to(tl.int64) * stride_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
    nan = (x != x) & ok
    nan_idx = tl.min(tl.where(nan, offs, 2147483647), 0)
    mx = tl.max(tl.where(nan, float("-inf"), x), 0)
    idx = tl.min(tl.where((x == mx) & ok, offs, 2147483647), 0)
    has_nan = nan_idx < 2147483647
    tl.store(PV + row * P + part, tl.where(has_nan, float("nan"), mx))
    tl.store(PI + row * P + part, tl.where(has_nan, nan_idx, idx))


@triton.jit
def _argmax_final(PV, PI, Out, P, BLOCK_P: tl.constexpr):
    """Program row: the first partial's index among the largest (a NaN partial first)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_P)
    ok = offs < P
    v = tl.load(PV + row * P + offs, mask=ok, other=float("-inf"))
    i = tl.load(PI + row * P + offs, mask=ok, other=2147483647)
    nan = (v != v) & ok
    nan_i = tl.min(tl.where(nan, i, 2147483647), 0)
    mx = tl.max(tl.where(nan, float("-inf"), v), 0)
    best = tl.min(tl.where((v == mx) & ok & ~nan, i, 2147483647), 0)
    tl.store(Out + row, tl.where(nan_i < 2147483647, nan_i, best).to(tl.int64))


def eligible(x: torch.Tensor) -> bool:
    """Whether :func:`argmax_rows` splits `x`'s rows: FAST_ARGMAX, a CUDA tensor (or the interpreter's
    CPU one), 2-D, 1..MAX_ROWS rows of at least MIN_WIDTH floats, unit stride along a row."""
    return (
        FAST_ARGMAX
        and (x.device.type == "cuda" or interpreting())
        and x.dim() == 2
        and 0 < int(x.shape[0]) <= MAX_ROWS
        and int(x.shape[1]) >= MIN_WIDTH
        and x.stride(1) == 1
        and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
    )


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` (int64 ``[M]``) of `x` ``[M, V]``, split over programs where :func:`eligible`."""
    if not eligible(x):
        return x.argmax(-1)
    m, v = int(x.shape[0]), int(x.shape[1])
    parts = triton.cdiv(v, BLOCK)
    pv = torch.empty((m, parts), dtype=torch.float32, device=x.device)
    pi = torch.empty((m, parts), dtype=torch.int32, device=x.device)
    out = torch.empty((m,), dtype=torch.int64, device=x.device)
    _argmax_partial[(m, parts)](x, pv, pi, v, x.stride(0), parts, BLOCK=BLOCK, num_warps=4)
    _argmax_final[(m,)](pv, pi, out, parts, BLOCK_P=max(2, triton.next_power_of_2(parts)), num_warps=1)
    return out
