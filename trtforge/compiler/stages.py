"""Graph stages between export and build: fusion passes, then precision (FP16/BF16 casts or INT8
Q/DQ). Each wraps a stage owned by another subpackage and returns (model, JSON-ready record).

What a request means (defaults, attention by precision, inapplicable options) is decided in
`trtforge.core.policy`; this module only orders the stages.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtforge.core.policy import (
    PRECISIONS,
    PassOptions,
    PrecisionOptions,
    check_precision,
    default_attention,
    resolve_attention,
)

__all__ = ["PRECISIONS", "GraphStage", "PassOptions", "PrecisionOptions", "build_stages", "default_attention"]


# Concrete shapes of the graph inputs the model runs at (the build profile's OPT), or None.
FeedShapes = Mapping[str, Sequence[int]] | None


@dataclass
class GraphStage:
    """A named ONNX -> ONNX transform run between export and build; `fn(model, shapes) -> (model, record)`.

    `shapes` (the build profile's OPT shapes) is what stages that run the graph on generated inputs
    fall back to when the model cannot run at their small default sizes.
    """

    name: str
    fn: Callable[..., tuple[Any, dict[str, Any]]]
    # fn also takes profile= ({input: ShapeRange} of the inputs --shape gave: the engine runs within them)
    takes_profile: bool = False


def _passes_stage(opts: PassOptions, attention: str) -> GraphStage:
    def run(model: Any, shapes: FeedShapes = None) -> tuple[Any, dict[str, Any]]:
        from trtforge.passes.pipeline import optimize_model

        out, ledger = optimize_model(
            model,
            passes=list(opts.names) if opts.names is not None else None,
            attention=attention,
            verify=opts.verify,
            debug=opts.debug,
            feed_shapes=shapes,
        )
        return out, ledger.to_dict()

    return GraphStage("passes", run)


def _load_data(spec: Any, model: Any, tokenizer: Any) -> Any:
    """A dataset path/spec -> feed-dict iterable (via calibration.data); other values pass through."""
    if spec is None or not isinstance(spec, (str, os.PathLike)):
        return spec
    from trtforge.calibration.data import input_specs_from_model, load_dataset

    specs = input_specs_from_model(model)
    return load_dataset(str(spec), specs, tokenizer=tokenizer, what="--precision-data")


def _float_stage(opts: PrecisionOptions, precision: str) -> GraphStage:
    def run(model: Any, shapes: FeedShapes = None) -> tuple[Any, dict[str, Any]]:
        from trtforge.passes.precision import convert_precision

        data = _load_data(opts.data, model, opts.tokenizer)
        out, record = convert_precision(
            model,
            precision,
            keep_fp32=tuple(opts.keep_fp32),
            data=data,
            keep_io_types=opts.keep_io_types,
            feed_shapes=shapes,
        )
        return out, record.to_dict()

    return GraphStage(precision, run)


_TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # [batch, seq] of a tokenizer


def _int8_stage(opts: PrecisionOptions) -> GraphStage:
    def run(
        model: Any, shapes: FeedShapes = None, profile: Mapping[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        from trtforge.calibration.api import calibrate_model
        from trtforge.calibration.data import (
            TEXT_MAX_LENGTH,
            CalibrationDataset,
            check_profile,
            input_specs_from_model,
            load_dataset,
        )

        data = opts.calib_data
        if profile and data is not None:  # samples outside the --shape ranges are refused by input
            if not isinstance(data, CalibrationDataset):
                # text is tokenized to at most the tokens the engine takes (default 128)
                tokens = [r for n, r in profile.items() if n in _TOKEN_INPUTS and len(r.max) == 2]
                longest = [int(r.max[1]) for r in tokens]
                data = load_dataset(
                    data,
                    input_specs_from_model(model),
                    max_samples=opts.calib_samples,
                    tokenizer=opts.tokenizer,
                    max_length=min([TEXT_MAX_LENGTH, *longest]),
                    what="--calib-data",
                )
            check_profile(data, profile)
        out, record = calibrate_model(
            model,
            data,
            method=opts.calib_method,
            samples=opts.calib_samples,
            calib_cache=opts.calib_cache,
            accuracy_target=opts.accuracy_target,
            smoothquant=opts.smoothquant,
            tokenizer=opts.tokenizer,
            progress=opts.progress,
        )
        return out, record.to_dict()

    return GraphStage("int8", run, takes_profile=True)


def build_stages(passes: PassOptions | None, precision: PrecisionOptions) -> tuple[list[GraphStage], dict]:
    """The ordered graph stages for a compile, plus a precision summary for the manifest."""
    check_precision(precision)
    attention = resolve_attention(passes, precision)
    stages: list[GraphStage] = []
    if passes is not None:
        stages.append(_passes_stage(passes, attention))
    if precision.mode == "int8":
        stages.append(_int8_stage(precision))
    low = precision.low_precision()
    if low:
        stages.append(_float_stage(precision, low))
    summary = {
        "mode": precision.mode,
        "float": low or "fp32",
        "attention": attention,
        "keep_fp32": list(precision.keep_fp32),
        "keep_io_types": precision.keep_io_types,
        "int8_rest": precision.int8_rest if precision.mode == "int8" else None,
    }
    return stages, summary
