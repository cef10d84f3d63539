"""`calibrate_model`: an FP32 ONNX model plus a dataset -> the same model with INT8 Q/DQ, and a record.

Steps: validate the options and the dataset (cheap, first); plan the placement; optionally smooth
(SmoothQuant); stream the data through ONNX Runtime for activation histograms (or read a
calibration cache); pick ranges with the chosen method; insert Q/DQ; optionally return the most
sensitive nodes to float until a held-out accuracy target holds; write the cache if asked.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtforge.calibration.cache import (
    Fingerprint,
    data_fingerprint,
    header_algorithm,
    model_fingerprint,
    read_calibration_cache,
    write_calibration_cache,
)
from trtforge.calibration.methods import FORMAT_MAX, METHODS, compute_amax, scale_from_amax
from trtforge.calibration.placement import SUPPORTED_OP_TYPES, Decision, name_nodes, plan_placement
from trtforge.errors import UserError, checked_call, shown

if TYPE_CHECKING:
    import onnx

_MIN_HOLDOUT, _MAX_HOLDOUT = 8, 64


@dataclass
class CalibrationRecord:
    """What calibration did; `to_dict()` is JSON-ready (manifests, reports, the CLI summary)."""

    method: str
    percentile: float | None
    samples: int
    batches: int
    seconds: float
    statistics_seconds: float
    source: str
    only_real_tokens: bool
    dropped_values: int
    tensors_quantized: int
    weights_quantized: int
    matmuls_quantized: int
    matmuls_total: int
    quantized_by_op: dict[str, int]
    decisions: list[dict[str, Any]]
    fallback: list[dict[str, Any]] = field(default_factory=list)
    accuracy: dict[str, Any] | None = None
    smoothquant: dict[str, Any] | None = None
    cache: dict[str, Any] = field(default_factory=dict)
    format: str = "int8"
    activation_scales: dict[str, float] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the per-tensor scales (those go to the calibration cache)."""
        d = {k: v for k, v in self.__dict__.items() if k != "activation_scales"}
        d["fallback_decisions"] = [x for x in self.decisions if not x["quantized"]]
        return d


def _check_options(
    method: str, percentile: Any, smoothquant: Any, accuracy_target: Any, samples: Any, batch_size: Any
) -> None:
    """Each option's kind and range, named (percentile='99' or samples='8' was a TypeError from a
    comparison)."""
    if method not in METHODS:
        raise UserError(f"unknown calibration method '{method}'; expected one of {', '.join(METHODS)}.")
    for name, value, optional in (
        ("percentile", percentile, False),
        ("smoothquant", smoothquant, True),
        ("accuracy_target", accuracy_target, True),
    ):
        if (value is not None or not optional) and (
            not isinstance(value, numbers.Real) or isinstance(value, bool)
        ):
            raise UserError(f"{name} must be a number{' or None' if optional else ''}, got {shown(value)}.")
    if not 0.0 < percentile <= 100.0:
        raise UserError(f"percentile must be in (0, 100], got {percentile}.")
    if smoothquant is not None and not 0.0 <= smoothquant <= 1.0:
        raise UserError(f"--smoothquant alpha must be in [0, 1], got {smoothquant}.")
    if accuracy_target is not None and not 0.0 < accuracy_target <= 1.0:
        raise UserError(f"--accuracy-target is a cosine in (0, 1], got {accuracy_target}.")
    for name, value, optional in (("samples", samples, True), ("batch_size", batch_size, False)):
        if value is None and optional:
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise UserError(
                f"{name} must be an integer >= 1{' or None' if optional else ''}, got {shown(value)}."
            )


def _names(value: Any, what: str) -> tuple[str, ...]:
    """op_types / exclude_nodes as a tuple of names: one str is one name (it was read letter by letter)."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{what} must be a list of names, got {shown(value)}.")
    return tuple(value)


@checked_call
def calibrate_model(
    model: onnx.ModelProto | str | os.PathLike[str],
    data: Any,
    *,
    method: str = "entropy",
    percentile: float = 99.99,
    samples: int | None = None,
    op_types: tuple[str, ...] = SUPPORTED_OP_TYPES,
    exclude_nodes: tuple[str, ...] = (),
    smoothquant: float | None = None,
    accuracy_target: float | None = None,
    calib_cache: str | os.PathLike[str] | None = None,
    only_real_tokens: bool | None = None,
    progress: bool = True,
    batch_size: int = 8,
    tokenizer: Any = None,
    shuffle_seed: int | None = None,
    fmt: str = "int8",
) -> tuple[onnx.ModelProto, CalibrationRecord]:
    """Quantize `model` to INT8 Q/DQ calibrated on `data` (a CalibrationDataset or anything
    `load_dataset` takes). `calib_cache`: read when the file exists (statistics are skipped for the
    tensors it holds; refused when its fingerprint names another model or other data), else written
    after calibration with the fingerprint (`record.cache`). `fmt` "fp8" writes FP8 E4M3 Q/DQ instead
    (scales amax / 448; no calibration cache: TensorRT's cache format is INT8's). Returns (new model,
    record)."""
    import onnx

    from trtforge.calibration.calibrator import collect_statistics, has_mask_input
    from trtforge.calibration.data import CalibrationDataset, input_specs_from_model, load_dataset
    from trtforge.calibration.qdq import insert_qdq
    from trtforge.core.tensor_spec import drop_initializer_inputs

    t0 = time.perf_counter()
    if isinstance(model, (str, os.PathLike)):  # a path is read (and checked) here
        from trtforge.core.onnx_io import load_onnx

        model = load_onnx(model)
    if not isinstance(model, onnx.ModelProto):
        raise UserError(f"model must be an onnx.ModelProto or an ONNX file path, got {type(model).__name__}.")
    _check_options(method, percentile, smoothquant, accuracy_target, samples, batch_size)
    op_types, exclude_nodes = _names(op_types, "op_types"), _names(exclude_nodes, "exclude_nodes")
    if fmt not in FORMAT_MAX:
        raise UserError(f"Q/DQ format {fmt!r}: expected one of {', '.join(FORMAT_MAX)}.")
    if fmt != "int8" and (calib_cache is not None or accuracy_target is not None):
        what = "a calibration cache (it holds INT8 scales)" if calib_cache else "--accuracy-target"
        raise UserError(f"{what} is INT8-only; it cannot be used for {fmt.upper()} Q/DQ.")
    qdq = [
        n.name or n.op_type for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
    ]
    if qdq:
        raise UserError(
            f"the model is already quantized ({len(qdq)} Q/DQ nodes, e.g. {qdq[:2]}); "
            "calibrate the float model."
        )
    work = onnx.ModelProto()
    work.CopyFrom(model)
    drop_initializer_inputs(work)
    name_nodes(work)
    _refuse_low_precision(work, op_types)
    dataset: CalibrationDataset | None = None
    if data is None:
        if not (calib_cache and Path(calib_cache).exists()):
            raise UserError("no calibration data: pass a dataset, or an existing calibration cache to read.")
        if accuracy_target is not None or smoothquant is not None:
            what = "--accuracy-target" if accuracy_target is not None else "SmoothQuant (on by default)"
            raise UserError(
                f"{what} needs calibration data, not only the cache '{calib_cache}': give --calib-data, "
                "or drop --accuracy-target and pass --no-smoothquant to quantize from the cache alone."
            )
    elif isinstance(data, CalibrationDataset):
        dataset = data.take(samples) if samples else data
    else:
        dataset = load_dataset(
            data,
            input_specs_from_model(work),
            batch_size=batch_size,
            max_samples=samples,
            shuffle_seed=shuffle_seed,
            tokenizer=tokenizer,
        )
    mask = has_mask_input(work)
    real_tokens = mask if only_real_tokens is None else only_real_tokens
    if real_tokens and not mask:
        raise UserError(
            "--real-tokens (only_real_tokens=True) needs a rank-2 'attention_mask' model input to tell real "
            "tokens from padding; this model has none. Drop it (or pass --all-tokens)."
        )
    cache_in = Path(calib_cache) if calib_cache and Path(calib_cache).exists() else None
    if cache_in is not None and smoothquant is not None:
        raise UserError(
            "--calib-cache cannot be read back with --smoothquant (smoothing needs fresh statistics)."
        )
    plan = plan_placement(work, op_types=tuple(op_types), exclude_nodes=tuple(exclude_nodes))
    if not plan.targets:
        raise UserError(
            f"nothing to quantize: no {list(op_types)} node qualifies ({len(plan.decisions)} candidates; "
            f"kept in float: {sorted({d.reason for d in plan.decisions})})."
        )
    holdout = None
    if accuracy_target is not None:
        n_hold = min(_MAX_HOLDOUT, max(_MIN_HOLDOUT, dataset.num_samples // 5))
        if dataset.num_samples < 2 * n_hold:
            raise UserError(
                f"--accuracy-target holds out {n_hold} samples for checking; {dataset.num_samples} samples "
                f"are too few (need at least {2 * n_hold})."
            )
        dataset, holdout = dataset.split(n_hold)
    # what the scales are computed for (before SmoothQuant rewrites the graph): the cache's fingerprint
    fingerprint = None
    if fmt == "int8":
        fingerprint = Fingerprint(
            model_fingerprint(work),
            data_fingerprint(dataset) if dataset is not None else None,
            _scale_settings(method, percentile, real_tokens if mask else None),
        )
    targets = plan.targets
    sq_summary = None
    stats_seconds = 0.0
    if smoothquant is not None:
        from trtforge.calibration.smoothquant import apply_smoothquant, smoothable_groups

        groups = list(smoothable_groups(targets))
        pre = collect_statistics(
            work,
            dataset,
            groups,
            real_tokens=real_tokens,
            channel_tensors=groups,
            progress=progress,
            description="smoothquant statistics",
            histograms=False,
        )
        stats_seconds += pre.seconds
        channel = {t: s.channel_amax for t, s in pre.tensors.items() if s.channel_amax is not None}
        work, targets, sq_summary = apply_smoothquant(work, targets, channel, smoothquant)
    tensors = list(dict.fromkeys(a for t in targets for a in t.activations))
    scales: dict[str, float] = {}
    if cache_in is not None:
        header, cached = read_calibration_cache(cache_in)
        _refuse_other_method(header, method, cache_in)
        _refuse_other_settings(header, fingerprint, cache_in)
        _refuse_foreign_cache(cached, work, cache_in)
        _refuse_stale_cache(header, fingerprint, cache_in, dataset)
        scales = {t: cached[t] for t in tensors if t in cached}
    missing = [t for t in tensors if t not in scales]
    n_samples, n_batches, dropped = 0, 0, 0
    if missing and dataset is None:
        raise UserError(
            f"calibration cache '{calib_cache}' has no scale for {len(missing)} tensor(s) to quantize "
            f"(e.g. {missing[:3]}); pass calibration data to compute them."
        )
    if missing:
        assert dataset is not None
        stats = collect_statistics(
            work, dataset, missing, real_tokens=real_tokens, progress=progress, histograms=method != "max"
        )
        stats_seconds += stats.seconds
        n_samples, n_batches = stats.samples, stats.batches
        dropped = sum(s.dropped for s in stats.tensors.values())
        _refuse_unseen_ranges(stats.tensors, targets, dataset.source, real_tokens)
        for t, s in stats.tensors.items():
            scales[t] = float(scale_from_amax(compute_amax(s, method, percentile=percentile), fmt))
    fallback, accuracy = [], None
    if holdout is not None:
        from trtforge.calibration.fallback import accuracy_fallback

        res = accuracy_fallback(
            work, targets, scales, holdout, accuracy_target, real_tokens=real_tokens, progress=progress
        )
        targets, fallback, accuracy = res.kept, res.returned, res.accuracy
    quantized = insert_qdq(work, targets, scales, fmt)
    used_scales = {t: scales[t] for t in dict.fromkeys(a for x in targets for a in x.activations)}
    cache_info: dict[str, Any] = {
        "path": str(calib_cache) if calib_cache else None,
        "read": cache_in is not None,
    }
    cache_info["tensors_from_cache"] = len(tensors) - len(missing)
    if calib_cache and cache_in is None:
        write_calibration_cache(calib_cache, used_scales, method, fingerprint)
    cache_info["written"] = bool(calib_cache and cache_in is None)
    cache_info["fingerprint"] = dataclasses.asdict(fingerprint) if fingerprint else None
    by_op = Counter(t.op_type for t in targets)
    return quantized, CalibrationRecord(
        format=fmt,
        method=method,
        percentile=percentile if method == "percentile" else None,
        samples=n_samples,
        batches=n_batches,
        seconds=time.perf_counter() - t0,
        statistics_seconds=stats_seconds,
        source=dataset.source if dataset is not None else f"calibration cache {calib_cache}",
        only_real_tokens=real_tokens,
        dropped_values=dropped,
        tensors_quantized=len(used_scales),
        weights_quantized=len({(t.weight, t.weight_axis) for t in targets if t.weight}),
        matmuls_quantized=by_op.get("MatMul", 0),
        matmuls_total=sum(1 for n in model.graph.node if n.op_type == "MatMul"),
        quantized_by_op=dict(by_op),
        decisions=[_decision_dict(d, targets) for d in plan.decisions],
        fallback=fallback,
        accuracy=accuracy,
        smoothquant=sq_summary,
        cache=cache_info,
        activation_scales=used_scales,
    )


def _refuse_low_precision(model: onnx.ModelProto, op_types: Any) -> None:
    """UserError for a model that computes in FP16/BF16: the Q/DQ written here (FP32 scales, opset-13
    QuantizeLinear) and SmoothQuant's scales are FP32, so such a graph came out invalid (ONNX Runtime:
    "Type parameter (T) ... bound to different types") or crashed calibration."""
    from onnx import TensorProto

    low = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
    found = [
        f"input '{i.name}' is {low[i.type.tensor_type.elem_type]}"
        for i in model.graph.input
        if i.type.tensor_type.elem_type in low
    ]
    inits = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in op_types:
            found += [
                f"{node.op_type} '{node.name}' weight '{name}' is {low[inits[name]]}"
                for name in node.input
                if inits.get(name) in low
            ]
    if found:
        more = "; ..." if len(found) > 3 else ""
        raise UserError(
            "INT8 calibration needs an FP32 model; this one computes in reduced precision "
            f"({'; '.join(found[:3])}{more}). Start from its FP32 export: `compile --precision int8` "
            "converts what stays unquantized to FP16 itself (--int8-rest)."
        )


def _refuse_other_method(header: str, method: str, path: Path) -> None:
    """UserError when the cache's header names another of our methods' algorithms than `method`: its
    scales are that method's. Before: they were used (and, with data, mixed with `method`'s own for the
    tensors it lacked) while the record, the manifest and the summary said `method`. TensorRT's
    calibrators, too, do not take a cache of another algorithm. A header of an algorithm trtforge does
    not write (TensorRT's LegacyCalibration, EntropyCalibration) is read as it is."""
    from trtforge.calibration.cache import ALGORITHMS

    algorithm = header_algorithm(header)
    by_algorithm = {v: k for k, v in ALGORITHMS.items()}
    cached = by_algorithm.get(algorithm)
    if cached is not None and cached != method:
        raise UserError(
            f"calibration cache '{path}' holds {algorithm} scales (method '{cached}'), and this run "
            f"calibrates with method '{method}': pass method '{cached}' (calibrate --method {cached}, "
            f"compile --calib-method {cached}) to use them, or a --calib-cache path that does not exist "
            "yet to calibrate afresh."
        )


#: the calibration settings a cache's header records (:func:`_scale_settings`) -> how a run passes them
_SETTING_FLAGS = {
    "percentile": "--percentile (percentile=)",
    "real_tokens": "--real-tokens or --all-tokens (only_real_tokens=True or False)",
}


def _scale_settings(method: str, percentile: float, real_tokens: bool | None) -> dict[str, str]:
    """The settings besides the method that change a cache's scales, as its header records them: the
    percentile (method 'percentile' only) and whether statistics skip padding (`real_tokens`; None for a
    model without an attention mask, where they cannot)."""
    settings: dict[str, str] = {}
    if method == "percentile":
        settings["percentile"] = repr(float(percentile))
    if real_tokens is not None:
        settings["real_tokens"] = "yes" if real_tokens else "no"
    return settings


def _refuse_other_settings(header: str, fingerprint: Fingerprint | None, path: Path) -> None:
    """UserError when the cache's header records a setting (:func:`_scale_settings`) at another value than
    this run's: its scales are not this run's (before, a cache computed at another --percentile was read
    silently). A setting the header does not record (a cache of an older trtforge, or another tool's) is
    not checked, as a fingerprint that is not there is not."""
    cached = Fingerprint.from_header(header)
    if cached is None or fingerprint is None:
        return
    for name, value in cached.settings.items():
        ours = fingerprint.settings.get(name)
        if ours is not None and ours != value:
            raise UserError(
                f"calibration cache '{path}' was computed with {name}={value}, and this run calibrates with "
                f"{name}={ours}: its scales are not this run's. Pass {name}={value} "
                f"({_SETTING_FLAGS[name]}) to use them, or a --calib-cache path that does not exist yet "
                "(it is written then)."
            )


def _refuse_stale_cache(header: str, fingerprint: Fingerprint | None, path: Path, dataset: Any) -> None:
    """UserError when the cache's header carries a fingerprint of another model (graph or weights: a
    retrained or re-exported model keeps its tensor names) or, when data is given, of other calibration
    batches. Before: a cache was keyed by its path alone, so one left beside a changed model put that
    model's ranges into this one's Q/DQ without a word. A cache without a fingerprint (TensorRT's,
    ModelOpt's, an older trtforge's) is read as it is."""
    cached = Fingerprint.from_header(header)
    if cached is None or fingerprint is None:
        return
    fresh = "delete it, or pass a --calib-cache path that does not exist yet (it is written then)"
    if cached.model != fingerprint.model:
        raise UserError(
            f"calibration cache '{path}' was computed for another model (fingerprint model={cached.model}; "
            f"this model's graph and weights give {fingerprint.model}): its scales are that model's "
            f"ranges, not this one's. To calibrate this model, {fresh}."
        )
    if fingerprint.data is not None and cached.data is not None and cached.data != fingerprint.data:
        raise UserError(
            f"calibration cache '{path}' was computed from other calibration data (fingerprint "
            f"data={cached.data}; {dataset.source} gives {fingerprint.data}): its scales are not this "
            f"data's. To calibrate on this data, {fresh}; to quantize from the cache's scales as they "
            "are, give no calibration data (compile without --calib-data, with --no-smoothquant)."
        )


def _refuse_foreign_cache(cached: dict[str, float], model: onnx.ModelProto, path: Path) -> None:
    """UserError when a calibration cache names tensors `model` does not have: it was written for another
    model (or another export of this one, or after SmoothQuant added its smoothed tensors). Before: the
    names that matched took that model's ranges and the rest were computed from the data, the record
    saying the cache was read, so another model's scales went into this one's Q/DQ without a word."""
    g = model.graph
    known = {i.name for i in g.input} | {t.name for t in g.initializer}
    known |= {o for n in g.node for o in n.output}
    foreign = [t for t in cached if t not in known]
    if not foreign:
        return
    smoothed = any("_smoothed" in t for t in foreign)
    why = (
        "it was written after SmoothQuant (on by default), whose smoothed tensors only that run's graph has, "
        "so it cannot be read back: calibrate from the data again (a --calib-cache path that does not exist "
        "yet is written)"
        if smoothed
        else "it was written for another model (or another export of this one), whose ranges must not go "
        "into this model's Q/DQ: pass this model's cache, or a --calib-cache path that does not exist yet "
        "to calibrate afresh and write it"
    )
    raise UserError(
        f"calibration cache '{path}' holds scales for {len(foreign)} of its {len(cached)} tensors that this "
        f"model does not have (e.g. [{', '.join(shown(t) for t in foreign[:3])}]); {why}."
    )


def _refuse_unseen_ranges(
    tensors: dict[str, Any], targets: list[Any], source: str, real_tokens: bool = False
) -> None:
    """UserError for an activation calibration saw no value of: every one dropped as NaN/inf or
    mask-sized, or none there at all (every attention_mask position 0 with real-token statistics, or
    samples with a zero-length axis). Its range is unknown, and quantizing it with a made-up scale (1/127,
    what an empty histogram gave, written to the cache as if measured) would silently wreck the model."""
    for name, stats in tensors.items():
        if stats.count:
            continue
        nodes = sorted({x.node for x in targets if name in x.activations})
        if stats.dropped:
            raise UserError(
                f"calibration data {source} gave activation '{name}' (input of node(s) {nodes}) no finite "
                f"value: all {stats.dropped} were NaN/inf or of attention-mask magnitude (>= 1e30), so its "
                "INT8 range is unknown. The data likely overflows float32 inside the model (check its "
                "scale), or keep those nodes in float (calibrate --exclude NODE)."
            )
        why = (
            "statistics cover real tokens only and no sample has one (its attention_mask is 0 at every "
            "position, or its sequence has 0 tokens): give samples with real tokens (mask 1)"
            if real_tokens
            else "its samples hold no value of it (a zero-length axis, e.g. sequences of 0 tokens): give "
            "samples with at least one element on every axis"
        )
        raise UserError(
            f"calibration data {source} gave activation '{name}' (input of node(s) {nodes}) no value at "
            f"all, so its INT8 range is unknown: {why}. A tensor empty by design stays in float with "
            "calibrate --exclude NODE."
        )


def _decision_dict(d: Decision, kept: list[Any]) -> dict[str, Any]:
    out = d.to_dict()
    if d.quantized and d.node not in {t.node for t in kept}:
        out.update(quantized=False, rule="accuracy_fallback", reason="returned to float by --accuracy-target")
    return out
