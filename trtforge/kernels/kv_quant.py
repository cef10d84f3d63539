"""FP8 (E4M3) K/V cache elements: the one definition of how a value enters and leaves an FP8 pool.

A pool of ``torch.float8_e4m3fn`` stores ``x / scale`` rounded to nearest (even) and saturated to
±448 (E4M3's largest finite value); a read gives back ``stored * scale``. Each layer has one K scale
and one V scale (float32, per tensor). The cache-write kernels quantize as they store
(:func:`trtforge.kernels.paged_cache.to_cache`), the attention kernels load FP8 tiles and widen them
in registers: the K scale folds into the softmax scale (``q . (k * s_k) * sm = (q . k) * (sm * s_k)``)
and the V scale multiplies the normalized output (the split partials combine linearly, so once at
the end). No dequantized copy of a pool is ever made. :func:`quantize_fp8` / :func:`dequantize` are
the same arithmetic in torch (the reference path and the kernels' oracle); this module imports no
Triton, so the CPU reference path runs where Triton is not installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["FP8_KV_DTYPE", "FP8_MAX", "dequantize", "inverse_scale", "is_fp8", "quantize_fp8", "to_e4m3"]

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # E4M3 (fn: no infinities): the largest finite magnitude


def is_fp8(t: Any) -> bool:
    """Whether tensor `t` (or a DeviceTensor) holds FP8 E4M3 K/V."""
    return t.dtype == FP8_KV_DTYPE


def inverse_scale(scale: float) -> float:
    """``1 / scale`` rounded to float32: what a kernel multiplies by (as its float32 argument), so that the
    torch reference's ``x * inv`` is the very same product."""
    scale = float(scale)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"a KV-cache scale must be a positive finite number; got {scale}")
    return float(np.float32(1.0 / scale))


def to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """`v` as E4M3 (``torch.float8_e4m3fn``), rounded to nearest even and saturated at +-448 exactly,
    on any machine: the value is rounded in float32 first (bit arithmetic on normals, ``torch.round``
    on the 2^-9 grid of subnormals), so the cast only changes the type and the codes do not depend on
    how torch's float8 conversion is implemented on this machine's CPU or GPU path."""
    v = v.float()
    a = v.abs().clamp_(max=FP8_MAX)
    r = (a.view(torch.int32) >> 20).bitwise_and_(1).add_(0x7FFFF).add_(a.view(torch.int32))
    r = r.bitwise_and_(-1048576).view(torch.float32)  # normals: nearest even at 3 mantissa bits
    sub = torch.round(a * 512.0).div_(512.0)  # subnormals: the 2^-9 grid (half to even; 2^9 is exact)
    r = torch.where(a < 2.0**-6, sub, r)  # (no data-dependent branch: it may run in a graph capture)
    r.copysign_(v)
    return r.masked_fill_(v.isnan(), float("nan")).to(FP8_KV_DTYPE)


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """`x` in E4M3 with per-tensor `scale` (torch; what the cache-write kernels store for FP8)."""
    return to_e4m3(x.float() * inverse_scale(scale))


def dequantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """FP8 `x` back in float32: ``x * scale``."""
    return x.float() * float(np.float32(scale))
