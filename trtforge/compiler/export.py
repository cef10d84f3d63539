"""torch -> ONNX: the dynamo exporter first, the legacy TorchScript exporter as a recorded fallback,
then onnx.checker and an ONNX Runtime run compared with torch on the example inputs.

The other accepted sources (an existing `.onnx` file, a torch.export `.pt2` archive) become the same
artifact in `trtforge.compiler.sources`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from trtforge._usercode import eval_mode, raised_by_trtforge, user_code
from trtforge.core import onnx_io
from trtforge.errors import ExportError, ModelNotExportable, UserError, is_int, shown

# A dynamic-axes spec: None (static), "batch", "batch,seq" (dim 0 / dims 0,1 of every input; an empty
# entry keeps its axis static: "batch,,height,width"), or
# {input_name: {axis: dim_name}} / {input_name: [dim_name or None per axis]}.
DynamicSpec = None | str | Sequence[str] | Mapping[str, Mapping[int, str] | Sequence[str | None]]

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-4


@dataclass
class ExportRecord:
    """What the export stage did: exporter used (and why a fallback happened), names, opset, errors."""

    source_kind: str
    exporter: str
    fallback_reason: str | None = None
    opset: int | None = None
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    external_data: bool = False
    seconds: float = 0.0
    verified: bool = False
    max_abs_error: dict[str, float] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        d["dynamic_axes"] = {k: {str(a): n for a, n in v.items()} for k, v in self.dynamic_axes.items()}
        return d


@dataclass
class OnnxArtifact:
    """An ONNX model on disk (with its external data, if any) plus the record of how it was made."""

    path: Path
    record: ExportRecord

    def load(self) -> Any:
        """The onnx.ModelProto, with external data loaded."""
        return onnx_io.load_onnx(self.path)


# ----------------------------------------------------------------------------- input normalisation
def normalize_inputs(module: Any, example_inputs: Any) -> dict[str, Any]:
    """Turn a tensor, tuple/list or dict of example inputs into {forward-parameter name: tensor}."""
    import torch

    if isinstance(example_inputs, Mapping):
        return _tensors_only(dict(example_inputs))
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)) or not example_inputs:
        raise UserError(
            "example_inputs must be a tensor, a non-empty tuple/list of tensors or a dict "
            f"{{name: tensor}}; got {type(example_inputs).__name__}."
        )
    params = [
        p
        for p in inspect.signature(module.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) < len(example_inputs):
        raise UserError(
            f"{type(module).__name__}.forward takes {len(params)} positional inputs but "
            f"{len(example_inputs)} example inputs were given."
        )
    return _tensors_only({p.name: t for p, t in zip(params, example_inputs)})


def _tensors_only(feeds: dict[str, Any]) -> dict[str, Any]:
    """`feeds`, or a UserError naming each example input that is not a torch.Tensor (a str, a NumPy array)
    and its type: the exporters trace tensors only."""
    import torch

    bad = [f"'{k}' ({type(v).__name__})" for k, v in feeds.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise UserError(
            f"example input(s) {', '.join(bad)} are not torch.Tensors; export needs tensors (convert a "
            "NumPy array with torch.from_numpy)."
        )
    return feeds


def resolve_dynamic(spec: DynamicSpec, inputs: Mapping[str, Any]) -> dict[str, dict[int, str]]:
    """Expand a dynamic-axes spec into {input: {axis: dim_name}}, validating names and axes."""
    if spec is None:
        return {}
    if not isinstance(spec, str | Sequence | Mapping):  # (5 was "'int' object has no attribute 'items'")
        raise UserError(
            f"--dynamic (dynamic) must be dim names per axis ('batch,seq' or a list) or a dict of input name "
            f"-> {{axis: dim name}}, got {type(spec).__name__} {shown(spec)}."
        )
    if isinstance(spec, str) or (isinstance(spec, Sequence) and all(isinstance(s, str) for s in spec)):
        # positional: an empty entry keeps that axis static ("batch,,height,width": NCHW, C fixed)
        names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
        widest = max((t.dim() for t in inputs.values()), default=0)
        past = [f"'{dim}' (axis {axis})" for axis, dim in enumerate(names) if dim and axis >= widest]
        if past:
            raise UserError(
                f"dynamic axes {','.join(names)!r}: {', '.join(past)} lie past every input's rank (the "
                f"widest input has {widest} axes), so nothing would vary there; name one dimension per axis, "
                "in order, for the widest input."
            )
        return {
            name: {axis: dim for axis, dim in enumerate(names) if dim and axis < t.dim()}
            for name, t in inputs.items()
        }
    out: dict[str, dict[int, str]] = {}
    for name, axes in spec.items():
        if name not in inputs:
            raise UserError(f"dynamic axes name input '{name}', but the inputs are {sorted(inputs)}.")
        rank = inputs[name].dim()
        if isinstance(axes, str):  # 'batch,seq' for this input (it was read letter by letter: b, a, t, ...)
            axes = [a.strip() or None for a in axes.split(",")]
        elif not isinstance(axes, Mapping | Sequence):  # (5 was "'int' object is not iterable")
            raise UserError(
                f"dynamic axes of input '{name}' must be {{axis: dim name}}, a list of dim names per axis or "
                f"'batch,seq', got {type(axes).__name__} {shown(axes)}."
            )
        pairs = axes.items() if isinstance(axes, Mapping) else enumerate(axes)
        out[name] = {}
        for axis, dim in pairs:
            if dim is None:
                continue
            if not 0 <= int(axis) < rank:
                raise UserError(f"dynamic axis {axis} of input '{name}' is out of range for rank {rank}.")
            out[name][int(axis)] = str(dim)
    return out


def flatten_outputs(obj: Any) -> list[Any]:
    """Flatten a torch output (tensor, tuple, dict, transformers ModelOutput) in exporter order; UserError
    when it holds no tensor (None, an empty tuple): the exported graph would have no output to run."""
    tensors = [t for _, t in _named_outputs(obj, ())]
    if not tensors:
        got = "None" if obj is None else f"a {type(obj).__name__} holding no tensor"
        raise UserError(
            f"the model returns no tensor (its forward returned {got}); a model to compile needs at least "
            "one tensor output."
        )
    return tensors


def _named_outputs(obj: Any, path: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], Any]]:
    """(path of keys and indices, tensor) for every tensor in `obj`, in exporter order."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if isinstance(obj, Mapping):
        return [x for k, v in obj.items() if v is not None for x in _named_outputs(v, (*path, str(k)))]
    if isinstance(obj, (tuple, list)):
        kept = [v for v in obj if v is not None]
        return [x for i, v in enumerate(kept) for x in _named_outputs(v, (*path, i))]
    if obj is None:
        return []
    kind = type(obj).__name__
    hint = (
        " It is a Hugging Face KV cache: set model.config.use_cache = False (or pass use_cache=False) "
        "to export the encoder-style forward, or compile a causal LM with --generate (generate=True)."
        if kind.endswith("Cache")
        else " Wrap the model so that forward returns only tensors (a tensor, tuple/list or dict of them)."
    )
    raise UserError(f"the model returns an output of type {kind}, not a tensor, tuple or dict.{hint}")


def default_output_names(obj: Any, input_names: Sequence[str] = ()) -> list[str]:
    """Names for a module's flattened outputs: a dict's (or ModelOutput's) keys, joined by '.' when
    nested ('logits', 'hidden_states.0'); without keys, or where keys would repeat or reuse an input
    name, output_0, output_1, ..."""
    named = _named_outputs(obj, ())
    plain = [f"output_{i}" for i in range(len(named))]
    if not any(isinstance(k, str) for path, _ in named for k in path):
        return plain
    names = [".".join(str(k) for k in path) or f"output_{i}" for i, (path, _) in enumerate(named)]
    if len(set(names)) != len(names) or set(names) & set(input_names):
        return plain
    return names


# ------------------------------------------------------------------------------------- exporters
def _export_dynamo(module, feeds, dynamic, opset, input_names, output_names, path: Path) -> None:
    import torch

    dims: dict[str, Any] = {}
    dynamic_shapes = {
        name: {
            axis: dims.setdefault(dim, torch.export.Dim(_dim_ident(dim), min=1)) for axis, dim in axes.items()
        }
        for name, axes in dynamic.items()
    }
    for name in feeds:
        dynamic_shapes.setdefault(name, None)
    program = torch.onnx.export(
        module,
        (),
        kwargs=dict(feeds),
        dynamo=True,
        dynamic_shapes=dynamic_shapes if dynamic else None,
        input_names=input_names,
        output_names=output_names,
        opset_version=opset,
        verbose=False,
    )
    if program is None:
        raise ExportError("the dynamo exporter returned no program")
    # external_data=None: ONNXProgram.save writes weights externally only when the model exceeds 2 GB.
    program.save(str(path), external_data=None)
    if opset is not None:  # its version converter gives up quietly, keeping the opset it exported at
        import onnx

        imports = onnx.load(str(path), load_external_data=False).opset_import
        got = next((o.version for o in imports if o.domain in ("", "ai.onnx")), None)
        if got != opset:
            raise ExportError(f"it wrote opset {got}, not the --opset {opset} asked for (no conversion down)")


def _dim_ident(dim: str) -> str:
    ident = "".join(c if c.isalnum() else "_" for c in dim)
    return ident if ident[:1].isalpha() else f"d_{ident}"


def _export_legacy(module, feeds, dynamic, opset, input_names, output_names, path: Path) -> None:
    import torch

    axes = {name: dict(a) for name, a in dynamic.items()}
    # The TorchScript tracer feeds inputs positionally; an adapter maps them back to keyword names so
    # forward signatures with extra keyword parameters (transformers models) trace correctly.
    torch.onnx.export(
        _positional_adapter()(module, list(feeds)),
        tuple(feeds.values()),
        str(path),
        input_names=input_names,
        output_names=output_names,
        dynamic_axes=axes or None,
        opset_version=opset or 17,
        dynamo=False,
        do_constant_folding=True,
    )


def run_quietly(fn: Any, *args: Any) -> None:
    """Run an exporter without its progress chatter, tracer warnings and the log lines of torch.onnx and
    onnxscript (whose version converter logs a traceback when it cannot reach an --opset). stderr too:
    torch.export prints the partial FX graph of a failed export there (500 lines for a small Longformer)
    before it raises; the failure itself reaches the user as the exception, in one line. File descriptor
    2 as well, where torch's log handlers write (they hold the real stderr) and where the TorchScript
    exporter's C++ log is pointed: it printed "Torch IR graph at exception: ..." (the whole graph) to
    stdout when it failed, since torch leaves that log on after the first legacy export."""
    import torch

    from trtforge.core.backend import native_stderr

    set_stream = getattr(torch._C, "_jit_set_onnx_log_output_stream", None)
    if set_stream is not None:
        set_stream("stderr")  # (std::cerr, unbuffered: caught below; std::cout's buffer outlived a redirect)
    with native_stderr([]):
        _run_quietly(fn, *args)


def _run_quietly(fn: Any, *args: Any) -> None:
    buf = io.StringIO()
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1 if logger.name == "onnxscript" else logging.ERROR)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*args)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def export_module(
    module: Any,
    example_inputs: Any,
    workdir: str | os.PathLike[str],
    *,
    dynamic: DynamicSpec = None,
    output_names: Sequence[str] | None = None,
    opset: int | None = None,
    exporter: str = "auto",
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    verify: bool = True,
    strict_dynamic: bool = True,
) -> OnnxArtifact:
    """Export an nn.Module to `workdir/model.onnx` and check it against torch.

    `strict_dynamic`: raise a UserError when an axis of `dynamic` comes out fixed (the model's code
    specializes it); False keeps the fixed axis (callers that only guessed the dynamic axes).

    `exporter`: "auto" (dynamo, falling back to legacy with the reason recorded), "dynamo" or "legacy".
    Raises ModelNotExportable (a UserError) when every exporter tried refuses the model, or the graph the
    legacy fallback wrote disagrees with torch; ExportError when ONNX Runtime disagrees with the graph
    of the exporter asked for. An exporter failing in trtforge's own code is raised as it is (a bug).
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise UserError(f"expected a torch.nn.Module to export, got {type(module).__name__}.")
    if exporter not in ("auto", "dynamo", "legacy"):
        raise UserError(f"exporter must be auto, dynamo or legacy; got '{exporter}'.")
    opset = check_opset(opset)
    feeds = normalize_inputs(module, example_inputs)
    _check_exportable(module, feeds)
    dynamic_axes = resolve_dynamic(dynamic, feeds)
    input_names = list(feeds)
    raw = _forward(module, feeds)
    reference = flatten_outputs(raw)
    if isinstance(output_names, str):  # one output's name (it was read letter by letter: 'out' -> o, u, t)
        output_names = [output_names]
    elif output_names is not None and not isinstance(output_names, Sequence):
        raise UserError(
            f"--output-name (output_names) must be a list of names, got {type(output_names).__name__} "
            f"{shown(output_names)}."
        )
    names = list(output_names) if output_names else default_output_names(raw, input_names)
    check_output_names(names, len(reference), input_names)
    _check_outputs(module, reference, names)
    path = Path(workdir) / "model.onnx"
    record = ExportRecord(
        source_kind="module",
        exporter="dynamo",
        input_names=input_names,
        output_names=names,
        dynamic_axes=dynamic_axes,
    )
    t0 = time.perf_counter()
    attempts = ["dynamo", "legacy"] if exporter == "auto" else [exporter]
    failures: list[Exception] = []
    for i, which in enumerate(attempts):
        fn = _export_dynamo if which == "dynamo" else _export_legacy
        try:
            with eval_mode(module):
                run_quietly(fn, module, feeds, dynamic_axes, opset, input_names, names, path)
            record.exporter = which
            break
        except Exception as e:
            failures.append(e)
            reason = f"{which} exporter failed: {export_failure(e)}"
            if i == len(attempts) - 1:
                prior = f" (after: {record.fallback_reason})" if record.fallback_reason else ""
                refuse_unexportable(
                    failures, f"could not export {type(module).__name__} to ONNX; {reason}{prior}"
                )
            record.fallback_reason = reason
    record.seconds = time.perf_counter() - t0
    if strict_dynamic:
        _check_dynamic_kept(path, dynamic_axes)
    try:
        finish_artifact(path, record, feeds, reference, rtol=rtol, atol=atol, verify=verify)
    except ExportError as e:
        if record.fallback_reason is None:
            raise
        refuse_unexportable(failures, f"{e} {_fallback_note(record.fallback_reason)}", cause=e)
    return OnnxArtifact(path, record)


def refuse_unexportable(
    failures: Sequence[Exception], message: str, cause: BaseException | None = None
) -> NoReturn:
    """Raise for a model the exporters tried (`failures`: how each failed) and could not export
    faithfully (`message`, from `cause`: the last failure by default). ModelNotExportable, a UserError,
    when they refused the model; but a failure that trtforge's own code raised by mistake is raised as it
    was: a bug, not the model's (exit 1, with its trace)."""
    bug = next((f for f in failures if raised_by_trtforge(f)), None)
    if bug is not None:
        raise bug
    raise ModelNotExportable(message) from (cause or failures[-1])


def _fallback_note(reason: str) -> str:
    """What a failed check of a legacy-exported graph means when the dynamo exporter failed first: the
    TorchScript tracer records the one path its example inputs took, and may mis-trace in-place writes
    into views, so the fix is in the model's code or a hand-made ONNX file, not a tolerance."""
    return (
        f"The graph was written by the legacy TorchScript exporter, because the {reason}. The tracer "
        "records the single path the example inputs took through Python control flow on tensor values, "
        "and in-place writes into slices can trace wrongly. Make that code independent of tensor values "
        "so that --exporter dynamo succeeds, or export the ONNX file yourself and compile that."
    )


def _check_dynamic_kept(path: Path, dynamic_axes: Mapping[str, Mapping[int, str]]) -> None:
    """UserError when an axis asked to be dynamic came out of the exporter as a fixed size. The dynamo
    exporter does that quietly where the model's code specializes the size (torch.export alone raises
    "your code specialized it to be a constant"); the engine would then take that one size only."""
    import onnx

    if not dynamic_axes:
        return
    graph = onnx.load(str(path), load_external_data=False).graph
    fixed = []
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        for axis, name in sorted(dynamic_axes.get(value.name, {}).items()):
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                fixed.append(f"input '{value.name}' axis {axis} ('{name}') fixed to {dims[axis].dim_value}")
    if fixed:
        names = sorted({n for axes in dynamic_axes.values() for n in axes.values()})
        raise UserError(
            f"the export fixed axes asked to be dynamic: {'; '.join(fixed)}. The model's code specializes "
            "that size (e.g. a Python branch on it), so the exported graph takes no other size "
            f"there. Leave it static (drop it from --dynamic {','.join(names)}) or change the "
            "model."
        )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(e: BaseException) -> str:
    text = _ANSI.sub("", str(e)).strip()
    first = text.splitlines()[0][:300].removesuffix(" Next steps:") if text else "(no message)"
    return f"{type(e).__name__}: {first}"


def export_failure(e: BaseException) -> str:
    """One line on why an exporter failed: the exception's first line without terminal colour codes,
    plus the root cause it wraps (torch's ConversionError says only which export step failed; the
    cause says what in the model did)."""
    root, seen = e, {id(e)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    line = _first_line(e)
    cause = "" if root is e else f" (caused by {_first_line(root)})"
    where = _CAUSED_AT.search(_ANSI.sub("", str(root)))
    return f"{line}{cause}" + (f" at {where.group(1)}" if where and not _in_torch(where.group(1)) else "")


def _in_torch(where: str) -> bool:
    """Whether torch's "Caused by" line is torch's own code (a path relative to its package, e.g.
    ``_export/non_strict_utils.py``) rather than the model's."""
    import torch

    return (Path(torch.__file__).parent / where.split(":", 1)[0]).is_file()


# torch.export names the source line of a data-dependent guard: "Caused by: (path.py:549 in forward)"
_CAUSED_AT = re.compile(r"Caused by: \(([^()\n]+:\d+ in [\w.<>]+)\)")


def _check_exportable(module: Any, feeds: Mapping[str, Any]) -> None:
    """UserError for a module or example inputs the exporters cannot turn into a checked FP32 graph:
    weights without data (meta device), half-precision weights (ONNX Runtime, the reference every
    check uses, has no CPU kernels for much of BF16 and rounds FP16 differently from torch; precision
    is trtforge's job: --precision fp16/bf16 keeps FP32 islands), or a size-0 example axis (the
    exporters trace shapes from the examples)."""
    import torch

    tensors = [("parameter", n, t) for n, t in module.named_parameters()]
    tensors += [("buffer", n, t) for n, t in module.named_buffers()]
    meta = [f"{kind} '{n}'" for kind, n, t in tensors if t.is_meta]
    meta += [f"example input '{n}'" for n, t in feeds.items() if t.is_meta]
    if meta:
        raise UserError(
            f"{type(module).__name__} has tensors on the meta device (no data): {', '.join(meta[:3])}"
            f"{' ...' if len(meta) > 3 else ''}. Load real weights (e.g. load_state_dict(..., assign=True) "
            "or to_empty() and initialize) and give CPU example inputs."
        )
    half = sorted({str(t.dtype) for _, _, t in tensors if t.dtype in (torch.float16, torch.bfloat16)})
    if half:
        raise UserError(
            f"{type(module).__name__} has {', '.join(half)} weights; export the FP32 model (model.float()) "
            "and choose the engine's precision with --precision fp16/bf16 (precision=...), which keeps "
            "FP32 where half precision would overflow."
        )
    cplx = [f"'{n}' ({t.dtype})" for n, t in feeds.items() if t.is_complex()]
    if cplx:
        raise UserError(
            f"example input(s) {', '.join(cplx)} are complex; TensorRT has no complex types. Feed "
            "torch.view_as_real(x) (a trailing axis of 2) and call torch.view_as_complex inside forward."
        )
    empty = [f"'{n}' {tuple(t.shape)}" for n, t in feeds.items() if t.numel() == 0]
    if empty:
        raise UserError(
            f"example input(s) {', '.join(empty)} have a size-0 axis; the exporters trace shapes from the "
            "examples, so give every axis at least one element (and --dynamic for axes that vary)."
        )


def check_output_names(names: Sequence[str], n_outputs: int, input_names: Sequence[str]) -> None:
    """UserError unless `names` (--output-name, output_names=) are one distinct, non-empty name per
    output that no input also has: the exported graph would otherwise fail ONNX's checker on a file in
    trtforge's work directory, or the exporter would rename a repeated name quietly ('a' -> 'a.1')."""
    if len(names) != n_outputs:
        raise UserError(
            f"--output-name (output_names): {len(names)} name(s) {list(names)} given for a model with "
            f"{n_outputs} output(s); give one name per output, in order."
        )
    kinds = [f"{type(n).__name__} {shown(n)}" for n in names if not isinstance(n, str)]
    if kinds:  # ([1] failed inside both exporters, reported as an export error)
        raise UserError(f"--output-name (output_names) must be names (strings), got {', '.join(kinds)}.")
    problems = []
    if any(not str(n).strip() for n in names):
        problems.append("an empty name")
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        problems.append(f"{twice} more than once")
    clash = sorted(set(names) & set(input_names))
    if clash:
        problems.append(f"{clash}, which the model's inputs are also named")
    if problems:
        raise UserError(
            f"--output-name (output_names) {list(names)} has {' and '.join(problems)}; give every output its "
            "own non-empty name that is not an input's."
        )


def _check_outputs(module: Any, reference: list[Any], names: list[str]) -> None:
    """UserError for outputs no engine can produce: complex tensors (TensorRT has no complex types;
    the exporters write them as a trailing axis of 2, which the torch check then calls a mismatch)."""
    cplx = [f"'{n}' ({t.dtype})" for n, t in zip(names, reference) if t.is_complex()]
    if cplx:
        raise UserError(
            f"{type(module).__name__} returns complex output(s) {', '.join(cplx)}; TensorRT has no complex "
            "types. Return torch.view_as_real(y) (a trailing axis of 2), or y.abs() / y.angle(), instead."
        )


def check_opset(opset: Any) -> int | None:
    """--opset within what the installed onnx knows (the exporters would otherwise ignore it quietly), as
    an int (a NumPy integer too)."""
    if opset is None:
        return None
    if not is_int(opset):  # ('17': a comparison's TypeError)
        raise UserError(
            f"--opset (opset) must be an integer or None, got {type(opset).__name__} {shown(opset)}."
        )
    opset = int(opset)
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not 7 <= opset <= newest:
        raise UserError(
            f"--opset {opset} is out of range: this onnx {onnx.__version__} knows opsets 7..{newest}."
        )
    return opset


def check_forward(module: Any, example_inputs: Any) -> list[Any]:
    """Run the user's model on its own example inputs (eval mode, no grad) and return the flattened
    outputs; whatever its forward raises is reported as the user's (UserCodeError, exit code 2)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise UserError(f"expected a torch.nn.Module, got {type(module).__name__}.")
    feeds = normalize_inputs(module, example_inputs)
    return flatten_outputs(_forward(module, feeds))


def _forward(module: Any, feeds: Mapping[str, Any]) -> Any:
    """The module's raw output on `feeds` (eval mode, no grad); what it raises is the user's."""
    import torch

    with eval_mode(module), torch.no_grad(), user_code(_forward_what(module, feeds)):
        return module(**feeds)


def _forward_what(module: Any, feeds: Mapping[str, Any]) -> str:
    """How a failing forward on the example inputs is named in the error."""
    args = ", ".join(f"{k}={tuple(v.shape)}" for k, v in feeds.items())
    return f"{type(module).__name__}.forward({args}) on its own example inputs"


def finish_artifact(
    path: Path, record: ExportRecord, feeds, reference, *, rtol: float, atol: float, verify: bool
) -> None:
    """checker, opset and names from the file, then ORT vs torch."""
    import onnx

    onnx_io.check_model(path, where=f"exported model '{path}'")
    proto = onnx.load(str(path), load_external_data=False)
    record.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    record.input_names = [i.name for i in proto.graph.input]
    record.output_names = [o.name for o in proto.graph.output]
    record.external_data = bool(onnx_io.external_data_files(path))
    if verify:
        record.tolerance = {"rtol": rtol, "atol": atol}
        record.max_abs_error = compare_with_ort(
            path, feeds, reference, record.output_names, rtol=rtol, atol=atol
        )
        record.verified = True


def compare_with_ort(
    path: Path, feeds, reference, output_names, *, rtol: float, atol: float
) -> dict[str, float]:
    """Run ONNX Runtime (an EXACT session) on `feeds` and compare with torch's `reference`; ExportError
    beyond |ort - torch| <= atol + rtol * |torch| (`trtforge.numerics.compare`)."""
    from trtforge.numerics.compare import Tolerance, compare_arrays, elementwise_failures
    from trtforge.numerics.sessions import exact_session, run

    sess = exact_session(path)
    got = run(sess, {k: v.detach().cpu().numpy() for k, v in feeds.items()})
    if len(got) != len(reference):
        raise ExportError(f"ONNX model has {len(got)} outputs, torch returned {len(reference)}.")
    tol = Tolerance(atol=atol, rtol=rtol)
    errors: dict[str, float] = {}
    for name, g, r in zip(output_names, got, reference):
        r = r.detach().cpu().numpy()
        if g.shape != r.shape:
            raise ExportError(f"output '{name}': ONNX Runtime shape {g.shape} != torch shape {r.shape}.")
        errors[name] = compare_arrays(r, g).max_abs
        if elementwise_failures(r, g, tol).any():
            raise ExportError(
                f"ONNX Runtime output '{name}' differs from torch: max abs error {errors[name]:.3g} "
                f"exceeds atol={atol:g} + rtol={rtol:g}*|ref|. The export is not faithful."
            )
    return errors


@contextlib.contextmanager
def torch_logs_silenced():
    """Keep torch's own logger from printing a traceback for a failure we report ourselves."""
    torch_logger = logging.getLogger("torch")
    level = torch_logger.level
    torch_logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        torch_logger.setLevel(level)


@functools.cache
def _positional_adapter() -> type:
    """An nn.Module wrapper class, built once torch is imported."""
    import torch

    class PositionalToKeywords(torch.nn.Module):
        """forward(*args) -> inner(**{name: arg}): lets the legacy tracer call keyword-only models."""

        def __init__(self, inner: Any, names: list[str]):
            super().__init__()
            self.inner, self.names = inner, names

        def forward(self, *args: Any) -> Any:
            return self.inner(**dict(zip(self.names, args)))

    return PositionalToKeywords
