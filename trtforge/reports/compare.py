"""Accuracy: each target's outputs against the reference target's, per output, with tolerances.

The statistics and the `Tolerance` are `trtforge.numerics.compare`'s, the ones every verifier uses:
max/mean absolute and relative error, relative L2 error ``||t - r|| / ||r||``, cosine and SNR
(reference power over error power, dB). Each output is compared over all accuracy iterations at once
(arrays flattened and concatenated, so cosine and SNR are global); the worst per-row cosine takes rows
on the first axis (e.g. one sentence embedding). Added here: the error histogram, and top-1/top-5
agreement for classification-shaped outputs (rank 2, ``[rows, classes]``): top-1 is the fraction of
rows with the same argmax, top-5 the fraction whose reference argmax is among the target's five largest.
NaN/inf of the reference that a target reproduces exactly are left out of the statistics (a "non-finite"
check counts them); a NaN/inf in only one of the two fails that check.
ONNX Runtime targets produce these outputs with EXACT sessions (`trtforge.reports.runners`).

Padding: when the inputs carry a padding mask (``attention_mask``, 1 = real token) and an output of
rank >= 3 starts with the mask's ``[batch, seq]`` axes, only real-token positions are compared: what
a model computes at padded positions is discarded by every consumer, and quantized models differ
there most. The row records how many positions were left out.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np

from trtforge.errors import UserError
from trtforge.numerics.compare import compare_arrays, elementwise_failures, row_cosines, topk_agreement
from trtforge.reports.results import (
    FAILED,
    OK,
    AccuracyRow,
    Check,
    Histogram,
    TargetRun,
    Tolerance,
)

NOT_COMPARED = "not_compared"
# Defaults by target precision. FP32 variants must agree closely; reduced precisions are judged by
# global similarity (cosine, SNR), since a few elements near zero always exceed elementwise limits.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-3, min_cosine=0.99999),
    "fp16": Tolerance(min_cosine=0.999, min_snr_db=30.0),
    "bf16": Tolerance(min_cosine=0.995, min_snr_db=20.0),
    "int8": Tolerance(min_cosine=0.99, min_snr_db=15.0),
}
_HIST_BINS = 40
# Valid values per field (atol, rtol and snr default to [0, inf)): a cosine or top-1 rate is at most 1.
_TOLERANCE_RANGES = {"min_cosine": (-1.0, 1.0), "min_top1": (0.0, 1.0), "min_snr_db": (-math.inf, math.inf)}
_TOLERANCE_KEYS = {
    "atol": "atol",
    "rtol": "rtol",
    "cosine": "min_cosine",
    "snr": "min_snr_db",
    "top1": "min_top1",
}


def resolve_tolerance(
    target: str, output: str, precision: str, overrides: Mapping[str, Any] | None
) -> Tolerance:
    """Defaults for `precision`, overlaid by `overrides` keyed "", "OUTPUT", "TARGET/" and "TARGET/OUTPUT"
    (later keys win). A Tolerance value replaces the whole tolerance; a dict overlays its fields."""
    tol = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["fp32"])
    for key in ("", output, f"{target}/", f"{target}/{output}"):
        value = (overrides or {}).get(key)
        if value is None:
            continue
        if isinstance(value, Tolerance):
            tol = value
            continue
        valid = {f.name for f in fields(Tolerance)}
        bad = set(value) - valid
        if bad:
            raise UserError(f"tolerance '{key}': unknown field(s) {sorted(bad)}; expected {sorted(valid)}.")
        tol = replace(tol, **value)
    return tol


def parse_tolerance(text: str) -> tuple[str, dict[str, float | None]]:
    """Parse a CLI `--tolerance [TARGET/]OUTPUT:atol=1e-3,cosine=0.99` (``none`` disables a check)."""
    key, sep, body = text.rpartition(":")
    if not sep or not body:
        raise UserError(
            f"--tolerance '{text}': expected [TARGET/]OUTPUT:name=value,... (an empty OUTPUT means all "
            f"outputs), with names {', '.join(_TOLERANCE_KEYS)}."
        )
    out: dict[str, float | None] = {}
    for item in body.split(","):
        name, eq, value = item.partition("=")
        if not eq or name.strip() not in _TOLERANCE_KEYS:
            raise UserError(
                f"--tolerance '{text}': bad item '{item}'; expected one of {', '.join(_TOLERANCE_KEYS)}."
            )
        try:
            number = None if value.strip() == "none" else float(value)
        except ValueError as e:
            raise UserError(f"--tolerance '{text}': '{value}' is not a number.") from e
        field_name = _TOLERANCE_KEYS[name.strip()]
        low, high = _TOLERANCE_RANGES.get(field_name, (0.0, math.inf))
        if number is not None and not low <= number <= high:  # NaN fails too: it would pass nothing
            raise UserError(
                f"--tolerance '{text}': {name.strip()} must be in [{low:g}, {high:g}], got {value.strip()}."
            )
        out[field_name] = number
    return key, out


def _histogram(diff: np.ndarray) -> Histogram:
    nonzero = diff[diff > 0]
    zeros = int(diff.size - nonzero.size - np.isnan(diff).sum())
    if nonzero.size == 0:
        return Histogram(edges=[], counts=[], zeros=zeros)
    finite = nonzero[np.isfinite(nonzero)]
    lo = max(float(finite.min()) if finite.size else 1e-12, 1e-12)
    hi = max(float(finite.max()) if finite.size else lo, lo * 1.0001)
    edges = np.geomspace(lo, hi, _HIST_BINS + 1)
    counts, _ = np.histogram(finite, bins=edges)
    return Histogram(edges=[float(e) for e in edges], counts=[int(c) for c in counts], zeros=zeros)


def is_classification(arrays: list[np.ndarray], name: str, classification: Collection[str] | None) -> bool:
    """Rank-2 float outputs with >= 2 columns, unless an explicit list of output names is given."""
    if classification is not None:
        return name in classification
    a = arrays[0]
    return a.ndim == 2 and a.shape[1] >= 2 and a.dtype.kind == "f"


def _checks(row: AccuracyRow, tol: Tolerance, elemwise_passed: bool | None) -> list[Check]:
    checks = []
    if elemwise_passed is not None:
        detail = (
            f"max abs {row.max_abs:.3g} (atol {tol.atol or 0:g}), "
            f"max rel {row.max_rel:.3g} (rtol {tol.rtol or 0:g})"
        )
        checks.append(Check("elementwise", elemwise_passed, detail))
    if tol.min_cosine is not None:
        ok = row.cosine is not None and not math.isnan(row.cosine) and row.cosine >= tol.min_cosine
        checks.append(Check("cosine", ok, f"{row.cosine:.6f} >= {tol.min_cosine:g}"))
    if tol.min_snr_db is not None:
        ok = row.snr_db is not None and not math.isnan(row.snr_db) and row.snr_db >= tol.min_snr_db
        checks.append(Check("snr", ok, f"{row.snr_db:.2f} dB >= {tol.min_snr_db:g} dB"))
    if tol.min_top1 is not None and row.top1 is not None:
        checks.append(Check("top1", row.top1 >= tol.min_top1, f"{row.top1:.4f} >= {tol.min_top1:g}"))
    return checks


def _set_aside_nonfinite(
    ref: list[np.ndarray], tgt: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray], int, int]:
    """NaN/inf the target reproduces exactly (NaN where the reference has NaN, the same infinity) set to 0
    in both, so cosine, SNR and the errors measure the finite elements; with the counts of those matched
    and of the elements non-finite in one of the two only (a mismatch every check must see)."""
    matched = mismatched = 0
    r_out, t_out = [], []
    for a, b in zip(ref, tgt):
        r, t = a.astype(np.float64), b.astype(np.float64)
        same = (np.isnan(r) & np.isnan(t)) | (np.isinf(r) & (r == t))
        matched += int(same.sum())
        mismatched += int((~(np.isfinite(r) & np.isfinite(t)) & ~same).sum())
        r_out.append(np.where(same, 0.0, r))
        t_out.append(np.where(same, 0.0, t))
    return r_out, t_out, matched, mismatched


def _compare_output(
    row: AccuracyRow, ref: list[np.ndarray], tgt: list[np.ndarray], tol: Tolerance, classify: bool
) -> None:
    ref, tgt, matched, mismatched = _set_aside_nonfinite(ref, tgt)
    r = np.concatenate([a.astype(np.float64).ravel() for a in ref])
    t = np.concatenate([a.astype(np.float64).ravel() for a in tgt])
    m = compare_arrays(r, t)
    row.elements = m.elements
    row.max_abs, row.mean_abs, row.max_rel, row.mean_rel = m.max_abs, m.mean_abs, m.max_rel, m.mean_rel
    row.rel_l2, row.cosine, row.snr_db = m.rel_l2, m.cosine, m.snr_db
    rows = [(a, b) for a, b in zip(ref, tgt) if a.ndim >= 2]
    row.min_row_cosine = (
        float(min(row_cosines(a, b).min() for a, b in rows)) if rows and len(rows) == len(ref) else None
    )
    if classify:
        row.top1, row.top5 = topk_agreement(
            np.concatenate([a.reshape(-1, a.shape[-1]) for a in ref]),
            np.concatenate([a.reshape(-1, a.shape[-1]) for a in tgt]),
        )
    with np.errstate(invalid="ignore"):  # inf - inf where only one of the two is non-finite
        row.histogram = _histogram(np.abs(t - r))
    row.tolerance = tol
    elemwise = not elementwise_failures(r, t, tol).any() if tol.elementwise else None
    row.checks = _checks(row, tol, elemwise)
    if matched or mismatched:
        kept = f"{matched} NaN/inf element(s) of the reference reproduced exactly, left out of the statistics"
        detail = (
            f"{mismatched} element(s) NaN/inf in only one of target and reference; {kept}"
            if mismatched
            else kept
        )
        row.checks.append(Check("non-finite", not mismatched, detail))
        row.reason = detail
    row.passed = all(c.passed for c in row.checks) if row.checks else None


def _real_tokens(
    ref: list[np.ndarray], tgt: list[np.ndarray], masks: Sequence[np.ndarray | None] | None
) -> tuple[list[np.ndarray], list[np.ndarray], int | None]:
    """Keep only positions the padding masks mark as real, for outputs shaped [batch, seq, ...]."""
    if not masks or len(masks) != len(ref) or any(m is None or m.ndim != 2 for m in masks):
        return ref, tgt, None
    if any(a.ndim < 3 or a.shape[:2] != m.shape for a, m in zip(ref, masks)):
        return ref, tgt, None
    keep = [np.asarray(m) != 0 for m in masks]
    excluded = int(sum(k.size - k.sum() for k in keep))
    return [a[k] for a, k in zip(ref, keep)], [a[k] for a, k in zip(tgt, keep)], excluded


def compare_target(
    reference: TargetRun,
    target: TargetRun,
    precision: str,
    *,
    tolerances: Mapping[str, Any] | None = None,
    classification: Collection[str] | None = None,
    masks: Sequence[np.ndarray | None] | None = None,
) -> list[AccuracyRow]:
    """Accuracy rows for every reference output of `target`; rows say why when nothing was compared.

    masks: per accuracy iteration, the padding mask of the inputs (or None); see the module docstring.
    """

    def whole(reason: str) -> list[AccuracyRow]:
        return [AccuracyRow(target.name, "*", reference.name, status=NOT_COMPARED, reason=reason)]

    if reference.error is not None:
        return whole(f"reference '{reference.name}' did not run: {reference.error}")
    if target.error is not None:
        return whole(f"target did not run: {target.error}")
    if len(reference.outputs) != len(target.outputs):
        return whole(f"{len(target.outputs)} iterations vs {len(reference.outputs)} for the reference")
    if not reference.outputs:
        return whole("no accuracy inputs were run (no input specs to generate them from)")
    rows = []
    for name in reference.outputs[0]:
        row = AccuracyRow(target.name, name, reference.name)
        ref = [it[name] for it in reference.outputs]
        row.shape = list(ref[0].shape)
        missing = [i for i, it in enumerate(target.outputs) if name not in it]
        if missing:
            row.status = FAILED
            row.reason = f"target has no output '{name}' (it has {sorted(target.outputs[0])})"
            rows.append(row)
            continue
        tgt = [it[name] for it in target.outputs]
        bad = next((i for i, (a, b) in enumerate(zip(ref, tgt)) if a.shape != b.shape), None)
        if bad is not None:
            row.status = FAILED
            row.reason = f"shape {list(tgt[bad].shape)} != reference {list(ref[bad].shape)} (iteration {bad})"
            rows.append(row)
            continue
        tol = resolve_tolerance(target.name, name, precision, tolerances)
        classify = is_classification(ref, name, classification)
        ref, tgt, row.padding_excluded = _real_tokens(ref, tgt, masks)
        if not any(a.size for a in ref):  # an empty axis (or nothing but padding): a check of nothing
            row.status = NOT_COMPARED
            row.reason = f"no elements to compare (shape {row.shape}" + (
                f", {row.padding_excluded} padded position(s) left out)" if row.padding_excluded else ")"
            )
            rows.append(row)
            continue
        _compare_output(row, ref, tgt, tol, classify)
        row.status = OK
        rows.append(row)
    return rows
