"""Graph stages between export and build: fusion passes, then precision (FP16/BF16 casts or INT8
Q/DQ). Each wraps a stage owned by another subpackage and returns (model, JSON-ready record).

Attention: TensorRT's fused attention layer needs FP16/BF16 (an FP32 `Attention` node fails the
build, measured with TensorRT-RTX), so the default strategy is `native` for fp16/bf16/int8+fp16
and `none` (leave the decomposed form) for fp32 and int8+fp32.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trtforge.errors import UserError

PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass
class GraphStage:
    """A named ONNX -> ONNX transform run between export and build; `fn(model) -> (model, record)`."""

    name: str
    fn: Callable[[Any], tuple[Any, dict[str, Any]]]


@dataclass(frozen=True)
class PassOptions:
    """Fusion passes: `names=None` runs the default pipeline; `attention=None` picks by precision."""

    names: Sequence[str] | None = None
    attention: str | None = None
    verify: bool = True
    debug: bool = False


@dataclass(frozen=True)
class PrecisionOptions:
    """Compute precision. For int8, `int8_rest` is the precision of what stays unquantized.

    INT8 defaults to entropy calibration with SmoothQuant 0.8: measured on MiniLM (benchmarks/results/
    calibration.md) entropy alone gave 0.911 mean cosine, with SmoothQuant 0.997, every MatMul INT8.
    """

    mode: str = "fp32"
    keep_fp32: Sequence[str] = ()
    keep_io_types: bool = True
    data: Any = None
    int8_rest: str = "fp32"
    calib_data: Any = None
    calib_method: str = "entropy"
    calib_samples: int | None = None
    calib_cache: str | None = None
    accuracy_target: float | None = None
    smoothquant: float | None = 0.8
    tokenizer: Any = None
    progress: bool = True

    def low_precision(self) -> str | None:
        """The float type the graph ends up in (None: FP32 throughout)."""
        if self.mode in ("fp16", "bf16"):
            return self.mode
        if self.mode == "int8" and self.int8_rest in ("fp16", "bf16"):
            return self.int8_rest
        return None


def default_attention(precision: PrecisionOptions) -> str:
    """`native` when the graph will be FP16/BF16 around attention, else `none` (see module doc)."""
    return "native" if precision.low_precision() else "none"


def _passes_stage(opts: PassOptions, attention: str) -> GraphStage:
    def run(model: Any) -> tuple[Any, dict[str, Any]]:
        from trtforge.passes.pipeline import optimize_model

        out, ledger = optimize_model(
            model,
            passes=list(opts.names) if opts.names is not None else None,
            attention=attention,
            verify=opts.verify,
            debug=opts.debug,
        )
        return out, ledger.to_dict()

    return GraphStage("passes", run)


def _load_data(spec: Any, model: Any, tokenizer: Any) -> Any:
    """A dataset path/spec -> feed-dict iterable (via calibration.data); other values pass through."""
    if spec is None or not isinstance(spec, (str, os.PathLike)):
        return spec
    from trtforge.calibration.data import input_specs_from_model, load_dataset

    return load_dataset(str(spec), input_specs_from_model(model), tokenizer=tokenizer)


def _float_stage(opts: PrecisionOptions, precision: str) -> GraphStage:
    def run(model: Any) -> tuple[Any, dict[str, Any]]:
        from trtforge.passes.precision import convert_precision

        data = _load_data(opts.data, model, opts.tokenizer)
        out, record = convert_precision(
            model, precision, keep_fp32=tuple(opts.keep_fp32), data=data, keep_io_types=opts.keep_io_types
        )
        return out, record.to_dict()

    return GraphStage(precision, run)


def _int8_stage(opts: PrecisionOptions) -> GraphStage:
    def run(model: Any) -> tuple[Any, dict[str, Any]]:
        from trtforge.calibration.api import calibrate_model

        out, record = calibrate_model(
            model,
            opts.calib_data,
            method=opts.calib_method,
            samples=opts.calib_samples,
            calib_cache=opts.calib_cache,
            accuracy_target=opts.accuracy_target,
            smoothquant=opts.smoothquant,
            tokenizer=opts.tokenizer,
            progress=opts.progress,
        )
        return out, record.to_dict()

    return GraphStage("int8", run)


def build_stages(passes: PassOptions | None, precision: PrecisionOptions) -> tuple[list[GraphStage], dict]:
    """The ordered graph stages for a compile, plus a precision summary for the manifest."""
    if precision.mode not in PRECISIONS:
        raise UserError(f"--precision {precision.mode!r}: expected one of {', '.join(PRECISIONS)}.")
    if precision.mode == "int8" and precision.calib_data is None and precision.calib_cache is None:
        raise UserError(
            "--precision int8 needs calibration data: pass --calib-data DATA (or --calib-cache FILE)."
        )
    if precision.mode != "int8" and precision.calib_data is not None:
        raise UserError(
            f"--calib-data is only used with --precision int8 (got --precision {precision.mode})."
        )
    if precision.int8_rest not in ("fp32", "fp16", "bf16"):
        raise UserError(f"--int8-rest {precision.int8_rest!r}: expected fp32, fp16 or bf16.")
    stages: list[GraphStage] = []
    attention = None
    if passes is not None:
        attention = passes.attention or default_attention(precision)
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
    }
    return stages, summary
