"""Range (amax) selection from an |x| histogram: max, percentile, entropy (TensorRT's classic KL
calibrator) and MSE. Symmetric: scale = amax / 127 for INT8, amax / 448 for FP8 E4M3, zero point 0.

Entropy follows TensorRT's IInt8EntropyCalibrator2 recipe as published in NVIDIA's
pytorch-quantization (`_compute_amax_entropy`): for each candidate threshold bin i >= 128, fold the
outliers into bin i-1 (reference P), quantize bins[:i] into 128 levels spreading each level's mass
over its non-empty bins (Q), and pick the i minimizing KL(P || Q) (the last minimum on ties).
"""

from __future__ import annotations

import numpy as np

from trtforge.calibration.histogram import TensorHistogram

METHODS = ("max", "percentile", "entropy", "mse")
INT8_MAX = 127
FP8_E4M3_MAX = 448.0  # the largest finite E4M3 value (TensorRT's FP8)
# Q/DQ formats: the largest quantized magnitude of each (the scale maps amax onto it).
FORMAT_MAX = {"int8": float(INT8_MAX), "fp8": FP8_E4M3_MAX}
_QUANT_LEVELS = 128
_START_BIN = 128


def compute_amax(stats: TensorHistogram, method: str, *, percentile: float = 99.99) -> float:
    """The clipping range of one tensor for `method` (never larger than the observed max)."""
    if stats.amax == 0.0 or method == "max":
        return stats.amax
    hist, width = stats.trimmed()
    if method == "percentile":
        amax = _percentile(hist, width, percentile)
    elif method == "entropy":
        amax = _entropy(hist, width)
    elif method == "mse":
        amax = _mse(hist, width)
    else:
        raise ValueError(f"unknown calibration method {method!r}; expected one of {METHODS}")
    return float(min(amax, stats.amax))


def _percentile(hist: np.ndarray, width: float, pct: float) -> float:
    cdf = np.cumsum(hist) / hist.sum()
    i = int(np.searchsorted(cdf, pct / 100.0))
    return (min(i, hist.size - 1) + 1) * width


def _entropy(hist: np.ndarray, width: float) -> float:
    n = hist.size
    if n <= _START_BIN:
        return n * width
    bins = hist.copy()
    bins[0] = bins[1]
    stride = max(1, (n - _START_BIN) // 1024)
    best_i, best_kl = n, np.inf
    tail = np.concatenate([np.cumsum(bins[::-1])[::-1], [0.0]])  # tail[i] = sum(bins[i:])
    for i in range(_START_BIN, n + 1, stride):
        p = bins[:i].copy()
        p[-1] += tail[i]
        level = (np.arange(i) * _QUANT_LEVELS) // i
        nonzero = bins[:i] > 0
        mass = np.bincount(level, weights=bins[:i], minlength=_QUANT_LEVELS)
        cnt = np.bincount(level, weights=nonzero, minlength=_QUANT_LEVELS)
        q = np.where(nonzero, mass[level] / np.maximum(cnt[level], 1), 0.0)
        kl = _kl(p, q)
        if kl <= best_kl:
            best_kl, best_i = kl, i
    return best_i * width


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    ps, qs = p.sum(), q.sum()
    if ps == 0 or qs == 0:
        return np.inf
    p = p / ps
    q = q / qs
    m = p > 0
    if np.any(q[m] == 0):
        return np.inf
    return float(np.sum(p[m] * np.log(p[m] / q[m])))


def _mse(hist: np.ndarray, width: float) -> float:
    n = hist.size
    centers = (np.arange(n) + 0.5) * width
    cands = np.arange(max(1, n // 16), n + 1, max(1, n // 1024)) * width
    best, best_err = n * width, np.inf
    for chunk in np.array_split(cands, max(1, cands.size // 128)):
        scale = chunk[:, None] / INT8_MAX
        q = np.clip(np.round(centers[None, :] / scale), 0, INT8_MAX) * scale
        err = ((centers[None, :] - q) ** 2 * hist[None, :]).sum(axis=1)
        k = int(np.argmin(err))
        if err[k] < best_err:
            best_err, best = float(err[k]), float(chunk[k])
    return best


def scale_from_amax(amax: float | np.ndarray, fmt: str = "int8") -> np.ndarray:
    """Symmetric scale(s) amax / qmax of format `fmt` (int8: 127, fp8: 448), float32, never zero (an
    all-zero tensor gets scale 1 / qmax)."""
    qmax = FORMAT_MAX[fmt]
    a = np.asarray(amax, dtype=np.float64)
    s = np.where(a > 0, a / qmax, 1.0 / qmax)
    return np.maximum(s, 1e-12).astype(np.float32)
