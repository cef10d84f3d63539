"""The compile policy: option groups (export, passes, precision) defined once, with their defaults,
CLI flags and help as field metadata, and the rules that decide what a request means.

The API (`trtforge.compile`), `compile`, `optimize`, `calibrate` and `report` all build these
dataclasses; the CLI generates its click options from the fields (`trtforge.cli._options`), so a
default exists in exactly one place. Build options live beside the builder (`compiler.build`).

Attention follows precision: TensorRT's fused attention layer needs FP16/BF16 (an FP32 `Attention`
node fails the build, measured with TensorRT-RTX), so `native` is the strategy only where the graph
is FP16/BF16 (fp16, bf16, int8 with an FP16/BF16 rest) and `none` (the decomposed form) elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trtforge.errors import UserError

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8", "int4")
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16")
# FP8 W8A8 and INT4 weight-only exist for decoder step graphs only (trtforge.llm.compile.lowbit).
GENERATE_ONLY_PRECISIONS = ("fp8", "int4")
ATTENTION = ("native", "plugin", "paged", "none")
CALIB_METHODS = ("max", "percentile", "entropy", "mse")
EXPORTERS = ("auto", "dynamo", "legacy")
# The most concurrent lanes (compile --streams, session(streams=)): more than a GPU's hardware work queues
# (32) cannot run concurrently, and each profile copy adds build time and engine size (10000 copies were
# still building after 60 s); a session of a static engine made a context a lane, however many.
MAX_STREAMS = 32


def cli(*flags: str, help: str, **click: Any) -> dict[str, Any]:  # noqa: A002 - click's own word
    """Field metadata for a CLI option: flags, help, and click settings the generator understands
    (choices, min, max, multiple, metavar, csv, path, secondary). The default is the field's."""
    return {"cli": {"flags": flags, "help": help, **click}}


@dataclass(frozen=True)
class ExportOptions:
    """How a torch module (nn.Module, module:factory, .pt2) becomes ONNX; refused for an .onnx source."""

    dynamic: Any = field(
        default=None, metadata=cli("--dynamic", metavar="AXES", help="dynamic axes, e.g. batch,seq.")
    )
    output_names: Sequence[str] | None = field(
        default=None, metadata=cli("--output-name", multiple=True, help="name the ONNX outputs, in order.")
    )
    opset: int | None = field(
        default=None, metadata=cli("--opset", min=7, help="ONNX opset (default: the exporter's).")
    )
    exporter: str = field(
        default="auto", metadata=cli("--exporter", choices=EXPORTERS, help="the torch.onnx exporter.")
    )


@dataclass(frozen=True)
class PassOptions:
    """Fusion passes: `names=None` runs the default pipeline; `attention=None` picks by precision."""

    names: Sequence[str] | None = field(
        default=None,
        metadata=cli(
            "--passes",
            csv=True,
            metavar="LIST",
            help="Comma-separated fusion passes, in order (default: the full pipeline).",
        ),
    )
    attention: str | None = field(
        default=None,
        metadata=cli(
            "--attention",
            choices=ATTENTION,
            help="Attention lowering: native (ONNX Attention -> TensorRT's fused layer; FP16/BF16 "
            "graphs only), plugin (trtforge's kernel, datacenter TensorRT), paged (decode steps over a "
            "paged KV cache -> trtforge PagedAttention; optimize only), none (keep). "
            "Default: native for FP16/BF16 graphs, none for FP32.",
        ),
    )
    verify: bool = field(
        default=True,
        metadata=cli(
            "--verify/--no-verify",
            help="Check every pass with ONNX Runtime (skipped automatically above 2 GiB of weights).",
        ),
    )
    debug: bool = field(
        default=False, metadata=cli("--debug", help="Record why candidate matches were rejected.")
    )


@dataclass(frozen=True)
class PrecisionOptions:
    """Compute precision. For int8, `int8_rest` is the precision of what stays unquantized.

    `int8_rest` defaults to fp16 for the API and every command: INT8 is asked for speed, and an FP32
    rest would keep attention decomposed (TensorRT's fused attention needs FP16/BF16) and run every
    non-GEMM op at twice the bytes. Pass `fp32` for the most accurate INT8 graph.
    INT8 defaults to entropy calibration with SmoothQuant 0.8: measured on MiniLM (benchmarks/results/
    calibration.md) entropy alone gave 0.911 mean cosine, with SmoothQuant 0.997, every MatMul INT8.
    """

    mode: str = field(
        default="fp32",
        metadata=cli(
            "--precision",
            choices=PRECISIONS,
            help="Compute precision written into the graph (fp8 = E4M3 W8A8 Q/DQ and int4 = weight-only "
            "blocked INT4: --generate step graphs only).",
        ),
    )
    keep_fp32: Sequence[str] = field(
        default=(),
        metadata=cli(
            "--keep-fp32",
            multiple=True,
            metavar="NODE_OR_OPTYPE",
            help="Keep this node or op type in FP32 (FP16/BF16 graphs). Repeatable.",
        ),
    )
    keep_io_types: bool = field(
        default=True,
        metadata=cli(
            "--keep-io-types/--low-precision-io",
            help="Graph inputs/outputs stay FP32 (FP16/BF16 graphs).",
        ),
    )
    data: Any = field(
        default=None,
        metadata=cli(
            "--precision-data",
            metavar="DATA",
            help="Sample inputs for the FP16/BF16 range check (.npz, directory, sentences.txt with "
            "--tokenizer, module:function). Default: generated from the input specs.",
        ),
    )
    int8_rest: str = field(
        default="fp16",
        metadata=cli(
            "--int8-rest",
            choices=FLOAT_PRECISIONS,
            help="INT8: precision of what stays unquantized (fp16: fused attention, half the bytes).",
        ),
    )
    calib_data: Any = field(
        default=None,
        metadata=cli(
            "--calib-data",
            metavar="DATA",
            help="INT8 calibration data: .npz, directory, sentences.txt (+ --tokenizer), module:function.",
        ),
    )
    calib_method: str = field(
        default="entropy",
        metadata=cli("--calib-method", choices=CALIB_METHODS, help="INT8: activation range method."),
    )
    calib_samples: int | None = field(
        default=None, metadata=cli("--calib-samples", min=1, help="INT8: calibrate on at most N samples.")
    )
    calib_cache: str | None = field(
        default=None,
        metadata=cli(
            "--calib-cache",
            path=True,
            help="INT8: TensorRT-format calibration cache: read if it exists (skips statistics), "
            "else written. Its header holds a fingerprint of the model and data it was computed for; "
            "a cache of another model or other data is refused.",
        ),
    )
    accuracy_target: float | None = field(
        default=None,
        metadata=cli(
            "--accuracy-target", min=0.0, max=1.0, help="INT8: return layers to float until cosine >= this."
        ),
    )
    smoothquant: float | None = field(
        default=0.8,
        metadata=cli(
            "--smoothquant",
            min=0.0,
            max=1.0,
            metavar="ALPHA",
            secondary="--no-smoothquant",
            help="INT8: SmoothQuant migration strength for MatMuls (0.8 took MiniLM from 0.911 to "
            "0.997 cosine); --no-smoothquant turns it off.",
        ),
    )
    tokenizer: Any = field(
        default=None,
        metadata=cli(
            "--tokenizer",
            help="Tokenizer for text data: a local Hugging Face directory, 'demo', or a Hub name "
            "(org/name; the local cache first, HF_HUB_OFFLINE respected).",
        ),
    )
    progress: bool = True

    def low_precision(self) -> str | None:
        """The float type the graph ends up in (None: FP32 throughout)."""
        if self.mode in ("fp16", "bf16"):
            return self.mode
        if self.mode == "int8" and self.int8_rest in ("fp16", "bf16"):
            return self.int8_rest
        return None


CALIBRATION_FIELDS = (
    "calib_data",
    "calib_method",
    "calib_samples",
    "calib_cache",
    "accuracy_target",
    "smoothquant",
)
FLOAT_FIELDS = ("keep_fp32", "keep_io_types", "data")


def default_attention(precision: PrecisionOptions) -> str:
    """`native` when the graph will be FP16/BF16 around attention, else `none` (see module doc)."""
    return "native" if precision.low_precision() else "none"


def flag(cls: type, name: str, value: Any = None) -> str:
    """The CLI flag of field `name` for messages the API and CLI share; for an on/off pair, the
    spelling that sets `value` (e.g. --no-verify for False)."""
    meta = {f.name: f for f in dataclasses.fields(cls)}[name].metadata.get("cli")
    if not meta:
        return name
    on, _, off = meta["flags"][0].partition("/")
    if value is None and "secondary" in meta:
        return meta["secondary"]
    return off if off and value is False else on


def changed(obj: Any, names: Sequence[str]) -> list[str]:
    """Fields among `names` whose value differs from the dataclass default."""
    defaults = {f.name: f.default for f in dataclasses.fields(obj)}
    out = []
    for n in names:
        value, default = getattr(obj, n), defaults[n]
        if isinstance(value, (list, tuple)) and not value and default in (None, ()):
            continue
        if value != default:
            out.append(n)
    return out


def check_precision(precision: PrecisionOptions) -> None:
    """Refuse values and options that do not apply to the requested precision, naming them."""
    if precision.mode not in PRECISIONS:
        raise UserError(f"--precision {precision.mode!r}: expected one of {', '.join(PRECISIONS)}.")
    if precision.mode in GENERATE_ONLY_PRECISIONS:
        raise UserError(
            f"--precision {precision.mode} is made for decoder step graphs only (compile MODEL --generate, "
            "a causal LM); for other models use fp32, fp16, bf16 or int8."
        )
    if precision.int8_rest not in FLOAT_PRECISIONS:
        raise UserError(f"--int8-rest {precision.int8_rest!r}: expected fp32, fp16 or bf16.")
    if precision.calib_method not in CALIB_METHODS:
        expected = ", ".join(CALIB_METHODS)
        raise UserError(f"--calib-method {precision.calib_method!r}: expected one of {expected}.")
    if precision.mode == "int8":
        if precision.calib_data is None and precision.calib_cache is None:
            raise UserError(
                "--precision int8 needs calibration data: pass --calib-data DATA (or --calib-cache FILE)."
            )
    else:
        extra = changed(precision, (*CALIBRATION_FIELDS, "int8_rest"))
        if extra:
            names = ", ".join(flag(PrecisionOptions, n, getattr(precision, n)) for n in extra)
            raise UserError(
                f"{names} {'is' if len(extra) == 1 else 'are'} only used with --precision int8 (got "
                f"--precision {precision.mode}); drop {'it' if len(extra) == 1 else 'them'} or ask for int8."
            )
    if precision.low_precision() is None:
        extra = changed(precision, FLOAT_FIELDS)
        if extra:
            names = ", ".join(flag(PrecisionOptions, n, getattr(precision, n)) for n in extra)
            why = (
                "the unquantized rest stays FP32 (--int8-rest fp32)"
                if precision.mode == "int8"
                else ("the graph stays FP32")
            )
            raise UserError(
                f"{names} only {'applies' if len(extra) == 1 else 'apply'} to FP16/BF16 graphs, but {why}."
            )


def resolve_attention(passes: PassOptions | None, precision: PrecisionOptions) -> str | None:
    """The attention strategy of a request (None when passes do not run); refuses native in FP32."""
    if passes is None:
        return None
    if passes.attention is not None and passes.attention not in ATTENTION:
        raise UserError(f"--attention {passes.attention!r}: expected one of {', '.join(ATTENTION)}.")
    attention = passes.attention or default_attention(precision)
    if attention == "native" and precision.low_precision() is None:
        graph = "int8 with an FP32 rest" if precision.mode == "int8" else precision.mode
        raise UserError(
            f"--attention native needs an FP16/BF16 graph, but this one is {graph}: TensorRT's fused "
            "attention does not build in FP32. Use --precision fp16/bf16 (or --int8-rest fp16), or "
            "--attention none."
        )
    return attention


def check_source(source: Any, export: ExportOptions, example_inputs: Any = None) -> None:
    """Refuse export options (and example inputs) for a source that is already ONNX: they would
    change nothing."""
    text = str(source) if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__") else None
    if text is None or not text.lower().endswith(".onnx"):
        return
    extra = changed(export, [f.name for f in dataclasses.fields(export)])
    if example_inputs is not None:
        raise UserError(
            f"example_inputs only apply when exporting a torch module, but '{text}' is already ONNX; "
            "its input shapes come from the file (profile ranges: shapes=... / --shape)."
        )
    if extra:
        names = ", ".join(flag(ExportOptions, n) for n in extra)
        verb = "applies" if len(extra) == 1 else "apply"
        raise UserError(
            f"{names} only {verb} when exporting a torch module (module:factory, nn.Module, .pt2), but "
            f"'{text}' is already ONNX; its input axes and output names are fixed in the file "
            "(profile ranges: --shape)."
        )
