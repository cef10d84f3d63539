"""The compile pipeline: source -> ONNX -> graph stages -> engine + manifest.

Graph stages (fusion passes, then FP16/BF16 casts or INT8 Q/DQ) plug in between export and build;
`trtforge.compiler.stages.build_stages` decides which run. Each takes an onnx.ModelProto and returns
a new one plus a JSON-ready record, which lands in the manifest's `records`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtforge._fileio import sha256_file, show_path
from trtforge._usercode import load_factory
from trtforge.compiler import export as export_mod
from trtforge.compiler import sources
from trtforge.compiler.build import BuildOptions, build_engine
from trtforge.compiler.session import CompileResult, CompileSession, source_files
from trtforge.compiler.shape_check import check_profile
from trtforge.compiler.stages import PassOptions, PrecisionOptions, build_stages
from trtforge.core import onnx_io
from trtforge.core.manifest import ShapeRange
from trtforge.core.policy import ExportOptions, check_source
from trtforge.core.shape_limits import source_limits
from trtforge.core.shapes import format_range, onnx_input_descs, resolve_profile
from trtforge.errors import UserError, checked_call, shown

Log = Callable[[str], None]


def _source_artifact(model: Any, example_inputs: Any, workdir: Path, export_kwargs: dict[str, Any], log: Log):
    """Turn any accepted model form into an ONNX artifact on disk, plus example shapes and the torch
    module where known."""
    if isinstance(model, bytes):
        model = os.fsdecode(model)
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        path = Path(text)
        suffix = path.suffix.lower()  # (m.ONNX, as some tools save it)
        if suffix == ".onnx":
            return sources.from_onnx_file(path, encoder_only=True), None, None
        if suffix == ".pt2":
            log(f"exporting torch.export archive {path} to ONNX")
            return sources.from_pt2(path, workdir, **export_kwargs), None, None
        if path.exists() or ":" not in text:
            if not path.exists():
                raise UserError(
                    f"model file '{path}' does not exist "
                    "(expected an .onnx or .pt2 file, or a package.module:factory reference)."
                )
            raise sources.unsupported_source(path)
        module, example_inputs = load_factory(text)
        model = module
    import torch

    if not isinstance(model, torch.nn.Module):
        raise UserError(
            "model must be a torch.nn.Module, an .onnx or .pt2 file path, or a 'package.module:factory' "
            f"reference; got {type(model).__name__} {shown(model)}."
        )
    if example_inputs is None:
        raise UserError("exporting an nn.Module needs example_inputs (a tensor, tuple or dict of tensors).")
    log(f"exporting {type(model).__name__} to ONNX")
    art = export_mod.export_module(model, example_inputs, workdir, **export_kwargs)
    feeds = export_mod.normalize_inputs(model, example_inputs)
    return art, {k: list(v.shape) for k, v in feeds.items()}, model


_BUILD = BuildOptions()
_EXPORT = ExportOptions()


@checked_call
def compile_model(
    model: Any,
    example_inputs: Any = None,
    output: str | os.PathLike[str] | None = None,
    *,
    dynamic: export_mod.DynamicSpec = _EXPORT.dynamic,
    output_names: Sequence[str] | None = _EXPORT.output_names,
    opset: int | None = _EXPORT.opset,
    exporter: str = _EXPORT.exporter,
    shapes: Mapping[str, ShapeRange] | Sequence[str] | None = _BUILD.shapes,
    opt_level: int | None = _BUILD.opt_level,
    workspace_mb: int | None = _BUILD.workspace_mb,
    timing_cache: str | os.PathLike[str] | None = _BUILD.timing_cache,
    streams: int = _BUILD.streams,
    aux_streams: int | None = _BUILD.aux_streams,
    targets: Sequence[str] | None = _BUILD.targets,
    backend: str | None = _BUILD.backend,
    version_compatible: bool = _BUILD.version_compatible,
    passes: PassOptions | None = PassOptions(),  # noqa: B008 - frozen dataclass, immutable default
    precision: PrecisionOptions | str = PrecisionOptions.mode,
    save_onnx: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: bool = _BUILD.progress,
    log: Log | None = None,
) -> CompileResult:
    """Compile `model` (nn.Module, .onnx, .pt2 path, or 'module:factory') into `output` (an .engine).

    Defaults are the policy's (`core.policy`, `compiler.build.BuildOptions`), shared with the CLI.
    `passes=None` skips the fusion passes; `precision` is "fp32"|"fp16"|"bf16"|"int8" or a
    PrecisionOptions (calibration data, FP32 islands, ...). Options that do not apply to the source
    or precision are refused. Writes the engine and `<output>.json` atomically; nothing is left
    behind on failure.
    """
    for name, flag in (("force", force), ("progress", progress), ("version_compatible", version_compatible)):
        if not isinstance(flag, bool):  # force="no" or progress="no" read as true
            raise UserError(f"{name} must be True or False, got {type(flag).__name__} {shown(flag)}.")
    if log is not None and not callable(log):
        raise UserError(f"log must be a function taking a message (or None), got {type(log).__name__}.")
    log = log or (lambda _msg: None)
    precision, passes = _api_options(precision, passes, progress)
    build_options = BuildOptions(
        shapes=shapes,
        opt_level=opt_level,
        workspace_mb=workspace_mb,
        timing_cache=timing_cache,
        streams=streams,
        aux_streams=aux_streams,
        targets=targets,
        backend=backend,
        progress=progress,
        version_compatible=version_compatible,
    )
    check_source(model, ExportOptions(dynamic, output_names, opset, exporter), example_inputs)
    stages, precision_summary = build_stages(passes, precision)
    if precision_summary["attention"] == "paged":
        raise UserError(
            "--attention paged rewrites decode-step attention into trtforge's PagedAttention node, which "
            "`trtforge optimize` writes; compile does not register the paged plugin with the builder yet. "
            "Use --attention native, plugin or none."
        )
    if precision_summary["attention"] == "plugin":
        from trtforge.core.backend import get_backend
        from trtforge.plugins.attention.plugin import check_plugin_support

        check_plugin_support(get_backend(backend))
    session = CompileSession(
        output,
        save_onnx=save_onnx,
        force=force,
        caches={"--timing-cache": timing_cache, "--calib-cache": precision.calib_cache},
        log=log,
    )
    with session:
        export_kwargs = {
            "dynamic": dynamic,
            "output_names": output_names,
            "opset": opset,
            "exporter": exporter,
        }
        with session.stage("export"):
            art, example_shapes, module = _source_artifact(
                model, example_inputs, session.workdir, export_kwargs, log
            )
            # of what is compiled, checked again before publishing (the file alone first: it may no
            # longer parse)
            source_hash, file_hash = onnx_io.source_sha256(art.path), sha256_file(art.path)
            # after the source is read and checked: its external data is known; the timing cache is
            # read, then rewritten after the build
            session.refuse_overwriting(_input_files(model, precision), {"--timing-cache": timing_cache})
            ort_runs = [
                s.name for s in stages if s.name != "passes" or (passes is not None and passes.verify)
            ]
            _check_ops(art.path, model, build_options.backend, ort_runs)
            limits = source_limits(art.path, module)
            # --shape checked against the exported inputs and their limits now, not after the graph stages
            descs = onnx_input_descs(art.path)
            opt_shapes = given_ranges = None
            if descs is not None:
                profile, derived = resolve_profile(descs, build_options.shapes, example_shapes, limits)
                opt_shapes = {name: list(rng.opt) for name, rng in profile.items()}
                given_ranges = {name: rng for name, rng in profile.items() if name not in derived}
        session.records["export"] = art.record.to_dict()
        onnx_path = art.path
        if stages:
            proto = art.load()
            for stage in stages:
                with session.stage(stage.name, f"running stage {stage.name}"):
                    extra = {"profile": given_ranges} if stage.takes_profile else {}
                    proto, session.records[stage.name] = stage.fn(proto, opt_shapes, **extra)
            onnx_path = onnx_io.save_onnx(proto, session.workdir / "staged.onnx")
        plugins = _plugins_used(onnx_path)

        def on_derived(derived: dict[str, ShapeRange]) -> None:
            for name, rng in derived.items():
                log(f"derived profile --shape {name}:{format_range(rng)} (override with --shape)")

        with session.stage("build", "building engine"):
            data, build_record = build_engine(
                onnx_path,
                build_options,
                example_shapes=example_shapes,
                on_derived=on_derived,
                limits=limits,
                check_profile=lambda profile: check_profile(onnx_path, profile),
                source=_staged_name(model, [s.name for s in stages]) if onnx_path != art.path else None,
                on_warning=lambda message: log(f"warning: {message}"),
            )
        session.records["build"] = build_record.to_dict()
        manifest = session.manifest(
            data,
            backend=build_record.backend | {"targets": build_record.targets},
            inputs=build_record.inputs,
            outputs=build_record.outputs,
            profiles=build_record.profiles,
            source={
                "kind": art.record.source_kind,
                "path": str(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__,
                "onnx_sha256": source_hash,
                "opset": art.record.opset,
            },
            build_options=build_options.to_dict()
            | {"exporter": exporter, "stages": [s.name for s in stages]},
            precision=precision_summary,
            plugins=plugins,
            streams=build_options.streams,  # (an int: a NumPy one failed the manifest's JSON after the build)
        )
        if sha256_file(art.path) != file_hash or onnx_io.source_sha256(art.path) != source_hash:
            raise UserError(
                f"the model file '{show_path(art.path)}' changed while it was being compiled (its bytes, or "
                "its external data's, differ from when compile read them); nothing was written. Re-run once "
                "it is no longer being modified."
            )
        return session.publish(
            data, manifest, lambda path: onnx_io.save_onnx_atomic(onnx_io.load_onnx(onnx_path), path)
        )


def _api_options(precision: Any, passes: Any, progress: bool) -> tuple[PrecisionOptions, PassOptions | None]:
    """`precision` as a name or PrecisionOptions, `passes` as PassOptions, a list (or comma-separated
    string) of pass names, or None (no passes); UserError naming the argument for anything else."""
    if isinstance(precision, str):
        precision = PrecisionOptions(mode=precision.lower(), progress=progress)
    elif not isinstance(precision, PrecisionOptions):
        raise UserError(
            f"precision must be 'fp32', 'fp16', 'bf16', 'int8' or a PrecisionOptions, got {precision!r}."
        )
    if isinstance(passes, str):
        passes = [p.strip() for p in passes.split(",") if p.strip()]
    if isinstance(passes, (list, tuple)):
        if not all(isinstance(p, str) for p in passes):
            raise UserError(f"passes must be pass names, got {list(passes)!r}.")
        passes = PassOptions(names=tuple(passes))
    elif passes is not None and not isinstance(passes, PassOptions):
        raise UserError(
            f"passes must be a PassOptions, a list of pass names or None (no passes), got {passes!r}."
        )
    return precision, passes


def _staged_name(model: Any, stages: list[str]) -> str:
    """How messages name the staged graph: the user's model and the stages it went through."""
    name = f"'{show_path(model)}'" if isinstance(model, (str, os.PathLike)) else type(model).__name__
    return f"the graph of {name} after {', '.join(stages) or 'export'}"


def _input_files(model: Any, precision: PrecisionOptions) -> dict[str, str | os.PathLike[str] | None]:
    """The files compile reads: the model (and its external data), sample and calibration data files (a
    data directory's .npz/.npy files too: before, -o DIR/x.npy --force replaced one with the engine)."""
    from trtforge.calibration.data import data_files

    files = source_files(model)
    for what, data in (("--precision-data", precision.data), ("--calib-data", precision.calib_data)):
        files |= data_files(data, what)
    return files


def _check_ops(path: Path, model: Any, backend: str | None, ort_runs: list[str]) -> None:
    """Custom ops TensorRT cannot build, then (when the stages `ort_runs` will run it) ONNX Runtime cannot
    run, refused by node before any stage runs."""
    from trtforge._custom_ops import refuse_unknown_to_onnxruntime
    from trtforge.compiler.network import check_custom_ops
    from trtforge.core.backend import get_backend

    where = f"'{show_path(model)}'" if isinstance(model, (str, os.PathLike)) else "the exported model"
    check_custom_ops(path, get_backend(backend), where)
    if ort_runs:
        import onnx

        refuse_unknown_to_onnxruntime(
            onnx.load(str(path), load_external_data=False),
            where,
            f"compile runs the graph in ONNX Runtime to verify {' and '.join(ort_runs)}: "
            "compile it with --no-passes (or --no-verify) and --precision fp32, or give ONNX Runtime "
            "the op as an ONNX local function.",
        )


def _plugins_used(onnx_path: Path) -> list[dict[str, str]]:
    """Plugins the final graph needs: custom-domain nodes the TensorRT parser maps to plugins."""
    import onnx

    from trtforge.plugins.attention.spec import DOMAIN, OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION

    proto = onnx.load(str(onnx_path), load_external_data=False)
    if any(n.domain == DOMAIN and n.op_type == OP_TYPE for n in proto.graph.node):
        return [{"name": OP_TYPE, "namespace": PLUGIN_NAMESPACE, "version": PLUGIN_VERSION}]
    return []
