"""Targets: what a report compares, and how each one is prepared into a runner.

Names: ``torch`` (eager, CPU), ``torch-cuda``, ``ort`` (the exported FP32 graph in ONNX Runtime),
``ort-fused`` (after `trtforge.passes`), ``ort-fp16`` / ``ort-bf16`` (precision conversion of the
fused graph), ``ort-int8`` (Q/DQ from `trtforge.calibration`), ``trt`` / ``trt-fp16`` / ``trt-int8``
(a TensorRT engine of the matching graph, or the given engine), and ``onnx=PATH`` (any other ONNX
file, e.g. one quantized elsewhere). A target that cannot be prepared keeps its row, with the reason.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtforge.core.policy import PrecisionOptions, default_attention
from trtforge.errors import ModelNotExportable, UserError
from trtforge.reports.inputs import ReportInput, specs_from_manifest, specs_from_onnx, vocab_sizes
from trtforge.reports.results import FAILED, NOT_RUN, TargetInfo

GRAPH_TARGETS = ("ort", "ort-fused", "ort-fp16", "ort-bf16", "ort-int8")
TRT_TARGETS = {"trt": "ort", "trt-fp16": "ort-fp16", "trt-int8": "ort-int8"}
TORCH_TARGETS = ("torch", "torch-cuda")
KNOWN = (*TORCH_TARGETS, *GRAPH_TARGETS, *TRT_TARGETS)
EXTERNAL = "onnx="
_PRECISION = {"ort-fp16": "fp16", "ort-bf16": "bf16", "ort-int8": "int8"}
INT8_TARGETS = ("ort-int8", "trt-int8")
NOTHING_TO_QUANTIZE = "nothing to quantize"  # how calibration refuses a model with no quantizable node


@dataclass
class Source:
    """What the report is about: a module (+ example inputs), an ONNX file, or an engine."""

    kind: str  # module | onnx | engine
    label: str
    module: Any = None
    example_inputs: Any = None
    onnx_path: Path | None = None
    engine_path: Path | None = None
    manifest: Any = None
    output_names: list[str] | None = None  # for module sources: names given to the exported outputs


@dataclass
class Target:
    """A prepared target: its table row, input specs, and a runner factory when it can run."""

    info: TargetInfo
    specs: list[ReportInput] | None = None
    make_runner: Callable[[], Any] | None = None
    memory: str = "rss"  # rss (host process) | cuda (torch CUDA allocator)


@dataclass
class _Graph:
    path: Path | None = None
    proto: Any = None
    error: str | None = None
    derived_from: str | None = None
    records: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def default_targets(source: Source) -> list[str]:
    """Targets used when none are named: everything that applies to the source kind (the INT8 ones are
    left out again, with a note, when the model has nothing to quantize: reports.api)."""
    graphs = ["ort", "ort-fused", "ort-fp16", "ort-int8", "trt", "trt-fp16", "trt-int8"]
    if source.kind == "module":
        return ["torch", *graphs]
    if source.kind == "onnx":
        return graphs
    return ["ort", "trt"] if source.onnx_path is not None else ["trt"]


def split_targets(values: Sequence[str]) -> list[str]:
    """Target names from `--targets A,B,...` values (the option is repeatable). A comma separates two
    targets only where the text after it is a known name, ``onnx=...`` or nothing (``ort,,trt``): inside
    an ``onnx=PATH`` it is part of the path (``onnx=runs/a,b.onnx``). A value that is ``onnx=`` and an
    existing file as a whole is that one target, whatever follows its commas."""
    out: list[str] = []
    for value in values:
        if value.strip().startswith(EXTERNAL) and Path(value.strip()[len(EXTERNAL) :]).is_file():
            out.append(value)
            continue
        for i, piece in enumerate(value.split(",")):
            starts = piece.strip() in KNOWN or piece.strip().startswith(EXTERNAL) or not piece.strip()
            if i and not starts and out[-1].strip().startswith(EXTERNAL):
                out[-1] += f",{piece}"
            else:
                out.append(piece)
    return [n for n in out if n.strip()]


def validate_names(names: Sequence[str]) -> list[str]:
    """Check target names (UserError naming the bad one and the valid ones); drops duplicates."""
    out: list[str] = []
    for n in names:
        n = n.strip()
        if not n:
            continue
        if n not in KNOWN and not n.startswith(EXTERNAL):
            raise UserError(f"unknown report target '{n}'; expected one of {', '.join(KNOWN)} or onnx=PATH.")
        if n.startswith(EXTERNAL) and not Path(n[len(EXTERNAL) :]).is_file():
            raise UserError(f"target '{n}': ONNX file '{n[len(EXTERNAL) :]}' does not exist.")
        if n not in out:
            out.append(n)
    if not out:
        raise UserError("no report targets given.")
    return out


def _optional(module: str, attr: str) -> Callable[..., Any]:
    """A trtforge stage function, or UserError saying it is not available in this build."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise UserError(f"{module}.{attr} is not available ({type(e).__name__}: {e})") from e


def _reason(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if isinstance(e, UserError) else f"{type(e).__name__}: {text}"


class Preparer:
    """Prepares targets lazily, sharing intermediate graphs (fused feeds FP16 and INT8)."""

    def __init__(
        self,
        source: Source,
        workdir: Path,
        *,
        threads: int | None,
        calibration: Callable[[], tuple[Any, str]],
        tokenizer: Any = None,
        calibration_options: Mapping[str, Any] | None = None,
        engine_shapes: Callable[[list[ReportInput]], list[str]] | None = None,
        int8_rest: str = PrecisionOptions.int8_rest,
        feed_shapes: Callable[[list[ReportInput]], dict[str, tuple[int, ...]] | None] | None = None,
    ):
        self.source, self.workdir, self.threads = source, workdir, threads
        self.int8_rest = int8_rest
        self._calibration_options = dict(calibration_options or {})
        self._calibration, self._tokenizer, self._engine_shapes = calibration, tokenizer, engine_shapes
        self._feed_shapes = feed_shapes  # the accuracy feeds' shapes: where the model is known to run
        self._graphs: dict[str, _Graph] = {}
        self._limits: dict[str, Any] | None = None
        self.output_names: list[str] | None = None

    # -- shapes --------------------------------------------------------------------------------
    def limits(self, name: str = "ort") -> Any:
        """Known axis limits of the source's inputs (HF config, graph position tables), or of an
        external ONNX target's own graph."""
        from trtforge.core.shape_limits import source_limits

        if name.startswith(EXTERNAL):
            g = self.graph(name)
            return source_limits(g.proto) if g.error is None else {}
        if self._limits is None:
            g = self.graph("ort")
            module = self.source.module if self.source.kind == "module" else None
            self._limits = source_limits(g.proto, module) if g.error is None else {}
        return self._limits

    def base_specs(self) -> list[ReportInput] | None:
        """The source's input specs with their limits (an engine's profile, else the model's)."""
        if self.source.kind == "engine":
            return specs_from_manifest(self.source.manifest)
        g = self.graph("ort")
        return specs_from_onnx(g.proto, self.limits()) if g.error is None else None

    # -- graphs --------------------------------------------------------------------------------
    def graph(self, name: str) -> _Graph:
        """The ONNX graph behind `name` (ort, ort-fused, ...), built once; errors are kept, not raised,
        but for a torch module the exporters refuse (ModelNotExportable): every target starts from its
        export, so that is the user's model to change (exit 2), not a failed target (exit 3)."""
        if name not in self._graphs:
            t0 = time.perf_counter()
            try:
                g = self._build_graph(name)
            except ModelNotExportable:
                raise
            except Exception as e:
                g = _Graph(error=_reason(e))
            g.seconds = time.perf_counter() - t0
            self._graphs[name] = g
        return self._graphs[name]

    def _save(self, name: str, proto: Any, **kw: Any) -> _Graph:
        from trtforge.core import onnx_io

        path = self.workdir / f"{name}.onnx"
        onnx_io.save_onnx(proto, path)
        return _Graph(path=path, proto=proto, **kw)

    def _fused_name(self, precision: PrecisionOptions) -> str:
        """The fused graph a compile at `precision` starts from: passes with the policy's attention."""
        attention = default_attention(precision)
        return "ort-fused" if attention == default_attention(PrecisionOptions()) else f"ort-fused@{attention}"

    def _base(self, precision: PrecisionOptions) -> tuple[str, _Graph]:
        """The fused graph for `precision`, or the exported one when fusion failed."""
        name = self._fused_name(precision)
        if self.graph(name).error is not None:
            name = "ort"
        base = self.graph(name)
        if base.error is not None:
            raise UserError(f"no graph to derive from: {base.error}")
        return name, base

    def _build_graph(self, name: str) -> _Graph:
        from trtforge.core import onnx_io

        if name == "ort":
            return self._exported()
        if name.startswith(EXTERNAL):
            path = Path(name[len(EXTERNAL) :])
            return _Graph(path=path, proto=onnx_io.load_onnx(path))
        if name.startswith("ort-fused"):
            base = self.graph("ort")
            if base.error is not None:
                raise UserError(f"no graph to derive from: {base.error}")
            attention = name.partition("@")[2] or default_attention(PrecisionOptions())
            optimize = _optional("trtforge.passes.pipeline", "optimize_model")
            specs = self.base_specs() if self._feed_shapes is not None else None
            shapes = self._feed_shapes(specs) if specs else None  # (verification falls back to them)
            proto, ledger = optimize(base.proto, attention=attention, verify=True, feed_shapes=shapes)
            counts = {p.name: p.matches for p in ledger.passes}
            return self._save(
                name.replace("@", "-"),
                proto,
                derived_from="ort",
                records={"passes": counts, "attention": attention},
            )
        if name in ("ort-fp16", "ort-bf16"):
            base_name, base = self._base(PrecisionOptions(mode=_PRECISION[name]))
            convert = _optional("trtforge.passes.precision", "convert_precision")
            proto, record = convert(base.proto, _PRECISION[name])
            return self._save(name, proto, derived_from=base_name, records={"precision": record.summary()})
        if name == "ort-int8":
            policy = PrecisionOptions(mode="int8", int8_rest=self.int8_rest)
            base_name, base = self._base(policy)
            calibrate = _optional("trtforge.calibration.api", "calibrate_model")
            data, data_label = self._calibration()
            options = {
                "progress": False,
                "tokenizer": self._tokenizer,
                "method": policy.calib_method,
                "smoothquant": policy.smoothquant,
            } | self._calibration_options
            proto, record = calibrate(base.proto, data, **options)
            rec = record.to_dict()
            keys = ("method", "samples", "matmuls_quantized", "matmuls_total", "smoothquant")
            records: dict[str, Any] = {"calibration": {k: rec.get(k) for k in keys} | {"data": data_label}}
            low = policy.low_precision()
            if low:
                convert = _optional("trtforge.passes.precision", "convert_precision")
                proto, precision_record = convert(proto, low)
                records["precision"], records["int8_rest"] = precision_record.summary(), low
            return self._save(name, proto, derived_from=base_name, records=records)
        raise UserError(f"no graph for target '{name}'")

    def _exported(self) -> _Graph:
        from trtforge.compiler.export import export_module
        from trtforge.core import onnx_io

        src = self.source
        if src.kind == "module":
            art = export_module(
                src.module,
                src.example_inputs,
                self.workdir,
                dynamic=_dynamic_spec(src.example_inputs),
                output_names=src.output_names,
                strict_dynamic=False,  # a guess, not the user's ask: a model fixing seq keeps it fixed
            )
            self.output_names = art.record.output_names
            return _Graph(path=art.path, proto=art.load(), records={"exporter": art.record.exporter})
        if src.onnx_path is None:
            raise UserError("the source is an engine whose manifest names no ONNX file that exists here")
        return _Graph(path=src.onnx_path, proto=onnx_io.load_onnx(src.onnx_path))

    # -- targets -------------------------------------------------------------------------------
    def prepare(self, name: str) -> Target:
        """Prepare target `name`; its row records failures and unrunnable targets with the reason."""
        t0 = time.perf_counter()
        if name in TORCH_TARGETS:
            target = self._torch(name)
        elif name in TRT_TARGETS:
            target = self._trt(name)
        else:
            target = self._ort(name)
        if target.info.prepare_seconds is None:
            target.info.prepare_seconds = round(time.perf_counter() - t0, 3)
        return target

    def _ort(self, name: str) -> Target:
        from trtforge.reports.runners import make_ort_runner

        precision = _PRECISION.get(name, "fp32" if not name.startswith(EXTERNAL) else "as stored")
        desc = {
            "ort": "exported graph",
            "ort-fused": "fused graph (trtforge.passes)",
            "ort-fp16": "FP16 graph with FP32 islands",
            "ort-bf16": "BF16 graph with FP32 islands",
            "ort-int8": f"INT8 Q/DQ graph (trtforge.calibration), {self.int8_rest.upper()} elsewhere",
        }.get(name, f"ONNX file {name[len(EXTERNAL) :]}")
        info = TargetInfo(name, "onnxruntime", precision, "cpu", f"ONNX Runtime, {desc}")
        g = self.graph(name)
        info.derived_from, info.records = g.derived_from, dict(g.records)
        info.prepare_seconds = round(g.seconds, 3)
        if g.error is not None:
            info.status, info.reason = FAILED, g.error
            return Target(info)
        path = g.path
        _, info.threads = make_ort_runner(path, self.threads, name)
        specs = specs_from_onnx(g.proto, self.limits(name))
        return Target(info, specs, lambda: make_ort_runner(path, self.threads, name)[0])

    def _torch(self, name: str) -> Target:
        import torch

        device = "cuda" if name == "torch-cuda" else "cpu"
        info = TargetInfo(name, "torch", "fp32", device, f"PyTorch {torch.__version__} eager")
        info.threads = {"torch_num_threads": torch.get_num_threads()}
        why = cannot_run(name, self.source)
        if why is not None:
            info.status, info.reason = NOT_RUN, why
            return Target(info)
        g = self.graph("ort")  # the exported graph names the inputs and outputs
        if g.error is not None:
            info.status, info.reason = FAILED, f"export failed, so inputs/outputs are unknown: {g.error}"
            return Target(info)
        from trtforge.reports.runners import TorchRunner

        specs, outs, module = (
            specs_from_onnx(g.proto, self.limits()),
            list(self.output_names or []),
            self.source.module,
        )
        return Target(
            info,
            specs,
            lambda: TorchRunner(module, specs, outs, device=device, name=name),
            memory="cuda" if device == "cuda" else "rss",
        )

    def _trt(self, name: str) -> Target:
        info = TargetInfo(
            name, "tensorrt", _PRECISION.get(TRT_TARGETS[name], "fp32"), "cuda", "TensorRT engine"
        )
        if self.source.kind == "engine" and name == "trt":
            info.precision = str((self.source.manifest.precision or {}).get("mode", "fp32"))
        backend, _ = _trt_backend(self.source)
        if backend is not None:
            info.description = f"TensorRT engine ({backend.name} {backend.version})"
        why = cannot_run(name, self.source)
        if why is not None:
            info.status, info.reason = NOT_RUN, why
            return Target(info)
        from trtforge.reports.runners import TrtEngineRunner

        if self.source.kind == "engine":
            engine, manifest = self.source.engine_path, self.source.manifest
        else:
            try:
                engine, manifest = self._build_engine(name)
            except Exception as e:
                info.status, info.reason = FAILED, f"engine build failed: {_reason(e)}"
                return Target(info)
        onnx_graph = self.graph("ort") if self.source.onnx_path or self.source.kind != "engine" else None
        vocab = vocab_sizes(onnx_graph.proto) if onnx_graph is not None and onnx_graph.error is None else None
        specs = specs_from_manifest(manifest, vocab)
        return Target(info, specs, lambda: TrtEngineRunner(engine, specs, name=name), memory="cuda")

    def _build_engine(self, name: str) -> tuple[Path, Any]:
        graph_name = TRT_TARGETS[name]
        g = self.graph(graph_name)
        if g.error is not None:
            raise UserError(f"graph '{graph_name}' is not available: {g.error}")
        from trtforge.compiler.pipeline import compile_model

        shapes = self._engine_shapes(specs_from_onnx(g.proto, self.limits())) if self._engine_shapes else None
        # The graph is already staged by the policy (passes, precision): the build adds nothing to it.
        result = compile_model(
            str(g.path),
            output=self.workdir / f"{name}.engine",
            shapes=shapes,
            passes=None,
            progress=False,
            force=True,
        )
        return result.engine_path, result.manifest


def _trt_backend(source: Source) -> tuple[Any, str | None]:
    """The TensorRT backend the source's trt targets use (an engine's own), or None and why not."""
    from trtforge.core.backend import get_backend

    try:
        return get_backend(source.manifest.backend.get("name") if source.manifest else None), None
    except UserError as e:
        return None, _reason(e)


def cannot_run(name: str, source: Source) -> str | None:
    """Why target `name` cannot run for `source` on this machine (its row's "not_run" reason), or None
    when it can be attempted here. Build and load failures are found only by preparing it."""
    if name in TORCH_TARGETS:
        if source.kind != "module":
            return f"the source is an {source.kind}, not a torch module"
        if name == "torch-cuda":
            import torch

            if not torch.cuda.is_available():
                return "no CUDA device visible to torch on this machine"
        return None
    if name in TRT_TARGETS:
        backend, error = _trt_backend(source)
        if backend is None:
            return error
        caps = backend.capabilities
        if not caps.can_run:
            return f"{backend.name} {backend.version} cannot run engines here: {caps.run_reason}"
        if source.kind == "engine" and name != "trt":
            return "the source is one engine; only target 'trt' applies"
    return None


def runnable_here(source: Source) -> list[str]:
    """The named targets (of KNOWN) that apply to `source` and can be attempted on this machine; any
    onnx=PATH target runs too (ONNX Runtime on the CPU)."""
    no_graph = source.kind == "engine" and source.onnx_path is None  # an engine whose ONNX is not here
    return [n for n in KNOWN if cannot_run(n, source) is None and not (no_graph and n in GRAPH_TARGETS)]


def _dynamic_spec(example_inputs: Any) -> str:
    """Dynamic axes for export: batch and sequence for token-like (integer, rank >= 2) inputs, else batch."""
    values = example_inputs.values() if isinstance(example_inputs, dict) else example_inputs
    if hasattr(values, "dim"):
        values = [values]
    values = list(values)
    tokens = values and all(
        getattr(v, "dim", lambda: 0)() >= 2 and not getattr(v, "is_floating_point", lambda: True)()
        for v in values
    )
    return "batch,seq" if tokens else "batch"


def load_source(source: Any) -> Source:
    """Classify `source`: (module, example_inputs), an .onnx path, or an engine path (with manifest)."""
    if isinstance(source, tuple) and len(source) == 2 and hasattr(source[0], "forward"):
        return Source("module", type(source[0]).__name__, module=source[0], example_inputs=source[1])
    if hasattr(source, "forward"):
        raise UserError("a torch module needs example inputs: pass source=(module, example_inputs).")
    if not isinstance(source, (str, os.PathLike)):
        raise UserError(
            f"unsupported report source {type(source).__name__}: expected an .onnx path, an engine path "
            "or (nn.Module, example_inputs)."
        )
    from trtforge._fileio import check_input_file, show_path

    path = check_input_file(source, "report source")
    if path.suffix.lower() == ".onnx":
        from trtforge.compiler.sources import from_onnx_file

        return Source("onnx", str(path), onnx_path=from_onnx_file(path).path)
    if path.suffix.lower() == ".pt2":  # (read_manifest called it "a model, not an engine")
        raise UserError(
            f"report source '{show_path(path)}' is a torch.export archive, which report does not take: it "
            "compares an .onnx, an engine or a module:factory. Export it first, e.g. `trtforge compile "
            f"{show_path(path)} -o MODEL.engine --save-onnx MODEL.onnx`, and report on MODEL.onnx or the "
            "engine."
        )
    from trtforge.core.manifest import read_manifest

    manifest = read_manifest(path)  # UserError when it is neither ONNX nor an engine with a manifest
    onnx_path = None
    src = manifest.source or {}
    if src.get("kind") == "onnx" and src.get("path") and Path(src["path"]).is_file():
        onnx_path = Path(src["path"])
    return Source("engine", str(path), engine_path=path, manifest=manifest, onnx_path=onnx_path)
