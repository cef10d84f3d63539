"""One set of output metrics and one `Tolerance`, shared by every verifier and the reports.

All metrics compute in float64 on the reference `ref` and the candidate `got`:

- elementwise: |got - ref| <= atol + rtol * |ref| (numpy.allclose's rule); NaN where both are NaN
  counts as equal, any other non-finite difference fails.
- max/mean abs error; max/mean relative error |got - ref| / |ref| (2e-16 stands in for a zero ref);
  peak-relative error: max abs error / max finite |ref| (one number that does not blow up near zeros);
  relative L2 error ||got - ref|| / ||ref||; SNR = 10 log10(mean ref^2 / mean (got - ref)^2) dB.
- cosine over all elements, and per row (rows: the first axis, e.g. one sample; the rest flattened;
  two all-zero rows agree, cosine 1.0).
- top-1 / top-5 agreement of the argmax over the last axis (classification-shaped outputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_ZERO_REF = 2e-16  # stands in for a zero reference value in relative errors


@dataclass
class Tolerance:
    """Pass/fail limits for one output; None disables that check.

    atol/rtol: elementwise, |got - ref| <= atol + rtol * |ref| (None counts as 0 when the other is set).
    min_cosine: cosine over all elements. min_snr_db: reference power / error power, in dB.
    min_top1: fraction of rows whose argmax agrees (classification-shaped outputs only).
    """

    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    min_snr_db: float | None = None
    min_top1: float | None = None

    @property
    def elementwise(self) -> bool:
        """True when atol or rtol is set."""
        return self.atol is not None or self.rtol is not None


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def abs_diff(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """|got - ref| in float64; 0 where both are NaN (or the same infinity), inf where only one is NaN."""
    r, g = _f64(ref), _f64(got)
    with np.errstate(invalid="ignore"):
        d = np.abs(g - r)
    same = (np.isnan(r) & np.isnan(g)) | (np.isinf(r) & (r == g))
    d = np.where(same, 0.0, d)
    return np.where(np.isnan(d), np.inf, d)


def elementwise_failures(ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Boolean mask of elements outside atol + rtol * |ref| (see the module doc)."""
    bound = (tol.atol or 0.0) + (tol.rtol or 0.0) * np.abs(np.nan_to_num(_f64(ref)))
    return ~(abs_diff(ref, got) <= bound)


def row_cosines(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Cosine per row (first axis; a rank-0/1 array is one row); 1.0 where both rows are all zero."""
    r, g = _f64(ref), _f64(got)
    r = r.reshape(r.shape[0], math.prod(r.shape[1:])) if r.ndim > 1 else r.reshape(1, -1)  # 0 rows too
    g = g.reshape(g.shape[0], math.prod(g.shape[1:])) if g.ndim > 1 else g.reshape(1, -1)
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1)
    both_zero = ~r.any(axis=1) & ~g.any(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(norms > 0, np.einsum("ij,ij->i", r, g) / np.where(norms > 0, norms, 1.0), 0.0)
    return np.where(both_zero, 1.0, cos)


def cosine(ref: np.ndarray, got: np.ndarray) -> float:
    """Cosine similarity over all elements (1.0 when both are all zero)."""
    return float(row_cosines(_f64(ref).ravel(), _f64(got).ravel())[0])


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10 log10(mean ref^2 / mean error^2); inf for an exact match."""
    r, g = _f64(ref), _f64(got)
    noise = float(np.mean((g - r) ** 2)) if r.size else 0.0
    signal = float(np.mean(r**2)) if r.size else 0.0
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def topk_agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float | None]:
    """(top-1, top-5) agreement of rows over the last axis; top-5 is None with <= 5 classes."""
    r = _f64(ref).reshape(-1, ref.shape[-1])
    g = _f64(got).reshape(-1, got.shape[-1])
    ref_top = r.argmax(axis=1)
    top1 = float(np.mean(g.argmax(axis=1) == ref_top))
    if r.shape[1] <= 5:
        return top1, None
    top5 = np.argpartition(-g, 5, axis=1)[:, :5]
    return top1, float(np.mean((top5 == ref_top[:, None]).any(axis=1)))


@dataclass
class Metrics:
    """Every figure of one comparison (see the module doc for their definitions)."""

    elements: int
    max_abs: float
    mean_abs: float
    max_rel: float
    mean_rel: float
    peak_rel: float
    rel_l2: float
    cosine: float
    min_row_cosine: float
    snr_db: float
    finite: bool  # the candidate is finite wherever the reference is


def compare_arrays(ref: np.ndarray, got: np.ndarray) -> Metrics:
    """All metrics of `got` against `ref` (same shape)."""
    with np.errstate(all="ignore"):
        return _compare(_f64(ref), _f64(got))


def _compare(r: np.ndarray, g: np.ndarray) -> Metrics:
    if r.shape != g.shape:
        raise ValueError(f"cannot compare shape {list(g.shape)} with reference shape {list(r.shape)}")
    d = abs_diff(r, g)
    rel = d / np.where(r == 0, _ZERO_REF, np.abs(r)) if r.size else d
    finite_ref = np.abs(r[np.isfinite(r)])
    peak = float(finite_ref.max()) if finite_ref.size else 0.0
    max_abs = float(d.max()) if d.size else 0.0
    norm = float(np.linalg.norm(r))
    rel_l2 = float(np.linalg.norm(g - r) / norm) if norm > 0 else (0.0 if not g.any() else math.inf)
    return Metrics(
        elements=int(r.size),
        max_abs=max_abs,
        mean_abs=float(d.mean()) if d.size else 0.0,
        max_rel=float(rel.max()) if rel.size else 0.0,
        mean_rel=float(rel.mean()) if rel.size else 0.0,
        peak_rel=max_abs / peak if peak > 0 else max_abs,
        rel_l2=rel_l2,
        cosine=cosine(r, g) if r.size else 1.0,
        min_row_cosine=float(row_cosines(r, g).min()) if r.size else 1.0,
        snr_db=snr_db(r, g),
        finite=bool(np.isfinite(g[np.isfinite(r)]).all()),
    )


def masked_rows(ref: np.ndarray, got: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Zero padded positions (mask 0) of outputs shaped [batch, seq, ...] in both; others unchanged."""
    r, g = _f64(ref), _f64(got)
    if mask is None or r.ndim < 2 or r.shape[:2] != np.shape(mask):
        return r, g
    m = np.asarray(mask).reshape(np.shape(mask) + (1,) * (r.ndim - 2)).astype(np.float64)
    return r * m, g * m
