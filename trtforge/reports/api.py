"""`build_report`: prepare targets, run them (accuracy feeds, then the latency sweep), compare, render.

Runners produce outputs and timings; `compare` turns outputs into accuracy rows; the renderers read
only the resulting :class:`~trtforge.reports.results.Report`. A target that fails to prepare, load or
accept the inputs keeps its row, with the reason, and the report still renders; but a torch module the
exporters refuse raises ModelNotExportable (a UserError) before anything is written, since every target
starts from its export.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtforge._fileio import as_path, show_path, work_directory
from trtforge.core.policy import PrecisionOptions
from trtforge.errors import UserError, checked_call, is_int, shown
from trtforge.reports.compare import compare_target
from trtforge.reports.inputs import Feed, ReportInput, fit_sizes, generate_feed, load_feeds, static_batch
from trtforge.reports.latency import MemoryProbe, measure_point, sweep_points
from trtforge.reports.results import FAILED, OK, AccuracyRow, LatencyPoint, Report, TargetRun
from trtforge.reports.targets import (
    EXTERNAL,
    INT8_TARGETS,
    NOTHING_TO_QUANTIZE,
    TRT_TARGETS,
    Preparer,
    Source,
    Target,
    cannot_run,
    default_targets,
    load_source,
    runnable_here,
    validate_names,
)

DEFAULT_WARMUP = 3
DEFAULT_RUNS = 20
ACCURACY_ITERATIONS = 2  # generated accuracy feeds when no data is given


@dataclass
class ReportResult:
    """Paths of the written report files and the in-memory results they were rendered from."""

    html_path: Path
    markdown_path: Path
    json_path: Path
    report: Report
    runs: dict[str, TargetRun] = field(default_factory=dict)


def _check_args(
    batch_sizes: Any, seq_lens: Any, warmup: Any, runs: Any, targets: Any, tolerances: Any
) -> None:
    """The argument kinds and ranges, each named (a str batch_sizes, runs='3' or tolerances=[..] was a
    TypeError from a comparison deep inside; targets='ort' was read letter by letter, as target 'o')."""
    for name, values, what in (
        ("batch_sizes", batch_sizes, "batch sizes"),
        ("seq_lens", seq_lens, "sequence lengths"),
    ):
        if (
            isinstance(values, (str, bytes))
            or not isinstance(values, Sequence)
            or not values
            or not all(is_int(v) and v >= 1 for v in values)
        ):
            raise UserError(f"{name} ({what}) must be a list of positive integers, got {shown(values)}.")
    for name, value, low in (("warmup", warmup, 0), ("runs", runs, 1)):
        if not is_int(value) or value < low:
            raise UserError(f"{name} must be an integer >= {low}, got {shown(value)}.")
    if targets is not None and (
        isinstance(targets, (str, bytes))
        or not isinstance(targets, Collection)
        or not all(isinstance(t, str) for t in targets)
    ):
        raise UserError(
            f"targets must be a list of target names (or None: all that apply), got {shown(targets)}."
        )
    if tolerances is not None and not isinstance(tolerances, Mapping):
        raise UserError(
            f"tolerances must be a mapping of output keys to limits (or None), got {shown(tolerances)}."
        )


def check_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse a report directory path that names a file, before any work (created only at the end)."""
    p = as_path(out_dir, "out_dir (the report directory)")
    if p.exists() and not p.is_dir():
        raise UserError(f"report directory '{p}' exists and is not a directory.")
    return p


def create_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Create the directories above the report directory, once the report is ready (a failed run leaves
    no empty directory); the report directory itself is put in place whole by `render.write_report`."""
    p = check_out_dir(out_dir)
    try:
        p.absolute().parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create report directory '{p}': {e.strerror}.") from e
    return p


class StepProgress:
    """A rich progress bar on stderr (or nothing): :meth:`step` names what runs and advances it (the
    encoder report and the LLM report share it)."""

    def __init__(self, enabled: bool, total: int):
        self._bar = self._task = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task("report", total=total)

    @contextlib.contextmanager
    def running(self) -> Iterator[StepProgress]:
        if self._bar is None:
            yield self
            return
        with self._bar:
            yield self

    def step(self, description: str, advance: int = 0) -> None:
        if self._bar is not None:
            from rich.markup import escape  # a target's name holds a path: data, not markup

            self._bar.update(self._task, description=escape(description), advance=advance)


def environment(threads: int | None) -> dict[str, Any]:
    """Where a report ran: Python, platform, CPU and its ISA, the threads asked for, package versions."""
    import importlib.metadata as md

    versions = {}
    for pkg in ("trtforge", "torch", "onnx", "onnxruntime", "polygraphy", "numpy"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    from trtforge.numerics.cpu import cpu_isa

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu or platform.processor(),
        "cpu_isa": dict(cpu_isa()),
        "cpu_count": os.cpu_count(),
        "threads_requested": threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "packages": versions,
    }


def _pick_reference(names: list[str], reference: str | None, src: Source) -> tuple[list[str], str]:
    """The reference target (added to `names` when missing). One named by the caller must be able to run
    here (a reference that cannot run compares nothing): else a UserError naming why and the targets
    that can. The default is the first of torch, ort, trt among `names`, else the first of `names`,
    skipping targets this machine cannot run while one that can is left."""
    if reference is None:
        preferred = ["torch", "ort", "trt"] if src.kind == "module" else ["ort", "trt"]
        order = [n for n in preferred if n in names] + [n for n in names if n not in preferred]
        reference = next((n for n in order if cannot_run(n, src) is None), order[0])
    else:
        reference = validate_names([reference])[0]
        why = cannot_run(reference, src)
        if why is not None:
            here = runnable_here(src)
            can = (
                f"targets that can serve as the reference here: {', '.join(here)} (or onnx=PATH)"
                if here
                else "no named target can run for this source here: give its ONNX file as onnx=PATH"
            )
            raise UserError(
                f"--reference '{reference}' cannot run here ({why}), so nothing could be "
                f"compared with it; {can}."
            )
    if reference not in names:
        names = [reference, *names]
    return names, reference


def _accuracy_feeds(
    data: Any, specs: list[ReportInput] | None, batch: int, seq: int, tokenizer: Any
) -> tuple[list[Feed], str]:
    if data is not None:
        return load_feeds(data, specs or [], tokenizer=tokenizer)
    if specs is None:
        return [], "none: no target could be prepared to read input specs from"
    batch = static_batch(specs) or batch
    feeds = [generate_feed(specs, batch, seq, seed=i) for i in range(ACCURACY_ITERATIONS)]
    return feeds, f"{len(feeds)} generated batches (batch {batch}, sequence {seq}) from the input specs"


def _run_target(
    target: Target, feeds: list[Feed], points: list[tuple], warmup: int, runs: int
) -> tuple[TargetRun, list[LatencyPoint]]:
    """Accuracy outputs, then latency points, with one activation of the runner."""
    info, run = target.info, TargetRun(target.info.name)
    latency: list[LatencyPoint] = []
    if target.make_runner is None:
        run.error = info.reason or "not prepared"
        return run, latency
    memory = MemoryProbe(target.memory)
    memory.before_load()
    try:
        runner = target.make_runner()
        runner.activate()
    except Exception as e:
        info.status, info.reason = FAILED, f"could not load: {type(e).__name__}: {str(e).strip()[:500]}"
        run.error = info.reason
        return run, latency
    try:
        try:
            run.outputs = [{k: v.copy() for k, v in runner.infer(f).items()} for f in feeds]
        except Exception as e:
            run.outputs = []
            run.error = f"{type(e).__name__}: {str(e).strip()[:500]}"
            info.status, info.reason = FAILED, f"accuracy inputs rejected or run failed: {run.error}"
        for batch, seq in points:
            latency.append(
                measure_point(
                    runner, target.specs or [], info.name, batch, seq, warmup=warmup, runs=runs, memory=memory
                )
            )
    finally:
        runner.deactivate()
    return run, latency


@checked_call
def build_report(
    source: Any,
    *,
    targets: Sequence[str] | None = None,
    data: Any = None,
    out_dir: str | os.PathLike[str],
    reference: str | None = None,
    batch_sizes: Sequence[int] = (1, 8),
    seq_lens: Sequence[int] = (128,),
    warmup: int = DEFAULT_WARMUP,
    runs: int = DEFAULT_RUNS,
    tolerances: Mapping[str, Any] | None = None,
    progress: bool = True,
    calibration_data: Any = None,
    tokenizer: Any = None,
    threads: int | None = None,
    classification: Collection[str] | None = None,
    title: str | None = None,
    output_names: Sequence[str] | None = None,
    calibration_options: Mapping[str, Any] | None = None,
    padding_mask: str | None = "attention_mask",
    int8_rest: str = PrecisionOptions.int8_rest,
    check_report: Callable[[Report], None] | None = None,
) -> ReportResult:
    """Compare targets of `source` for accuracy and latency; write report.html/.md/.json into `out_dir`.

    Args:
        source: an .onnx path, an engine path (with its manifest), or (nn.Module, example_inputs).
        targets: target names (see `trtforge.reports.targets`); None: all that apply to the source.
        data: accuracy inputs: .npz, a calibration dataset (dir, text file + `tokenizer`,
            module:function), a feed dict or an iterable of them. None: generated from the input specs.
        reference: the target others are compared with (default torch for modules, else ort; a target
            this machine cannot run is skipped). One named that cannot run here is a UserError.
        batch_sizes, seq_lens: the latency sweep; warmup/runs: per point.
        tolerances: per-output limits, keys "", "OUTPUT", "TARGET/", "TARGET/OUTPUT" (see compare.py).
        calibration_data: INT8 calibration data (default: `data`, else generated inputs).
        threads: ONNX Runtime intra-op threads and torch threads (None: library defaults).
        classification: output names that get top-1/top-5 agreement (None: rank-2 float outputs).
        output_names: names for a module's outputs when it is exported (default output_0, ...).
        calibration_options: keyword arguments for `calibrate_model` (method, smoothquant, ...) over
            the compile policy's defaults (`trtforge.core.policy.PrecisionOptions`).
        int8_rest: precision of what INT8 leaves unquantized (the policy's default, as `compile`).
        padding_mask: input whose zeros mark padding; token outputs are compared on real tokens only
            (None: compare every position).
        check_report: called with the finished report before anything is written; what it raises
            leaves `out_dir` as it was (the CLI refuses --data the reference rejected this way).
    """
    _check_args(batch_sizes, seq_lens, warmup, runs, targets, tolerances)
    # each size once, in the order given (a repeated one measured its points again: duplicate rows)
    batch_sizes, seq_lens = (list(dict.fromkeys(int(v) for v in vs)) for vs in (batch_sizes, seq_lens))
    try:
        from trtforge.reports.runners import preload, quiet_polygraphy
    except ImportError as e:
        raise UserError(
            f"reports need Polygraphy's runners and comparator ({e}); install it: pip install polygraphy"
        ) from e
    src = load_source(source)
    if output_names and src.kind != "module":
        raise UserError(
            f"--output-name only applies to a torch module source (it names the exported outputs), but "
            f"'{src.label}' is an {src.kind} whose outputs are already named."
        )
    src.output_names = list(output_names) if output_names else None
    if src.output_names:  # a bad name list is the caller's input, not a target that failed (exit 3)
        from trtforge.compiler.export import check_forward, check_output_names, normalize_inputs

        n_outputs = len(check_forward(src.module, src.example_inputs))
        inputs = list(normalize_inputs(src.module, src.example_inputs))
        check_output_names(src.output_names, n_outputs, inputs)
    names = validate_names(list(targets) if targets else default_targets(src))
    names, reference = _pick_reference(names, reference, src)
    check_out_dir(out_dir)
    _check_data_path(data, "--data")
    _check_data_path(calibration_data, "--calib-data")
    _check_tokenizer_read(tokenizer, data, calibration_data)
    if calibration_data is not None and not set(names) & set(INT8_TARGETS):
        raise UserError(
            f"--calib-data feeds only the INT8 targets ({', '.join(INT8_TARGETS)}), and none of this "
            f"report's targets ({', '.join(names)}) is one: add one to --targets, or drop --calib-data."
        )
    notes: list[str] = []
    with work_directory("trtforge-report-") as workdir:
        bar = StepProgress(progress, 2 * len(names))
        with bar.running(), torch_threads(threads), quiet_polygraphy():
            prep = Preparer(
                src,
                workdir,
                threads=threads,
                calibration=lambda: calib(prep),
                tokenizer=tokenizer,
                calibration_options=calibration_options,
                engine_shapes=lambda specs: _engine_shapes(specs, batch_sizes, sweep_seqs),
                int8_rest=int8_rest,
                feed_shapes=lambda specs: _feed_shapes(specs, acc_batch, acc_seq),
            )
            base_specs = prep.base_specs()
            outputs = _reference_outputs(prep, reference)
            if outputs is not None:  # before any target is prepared or run (calibration, builds: minutes)
                _check_tolerance_keys(tolerances, names, outputs)
            acc_batch, acc_seq, sweep_seqs = max(batch_sizes), int(seq_lens[0]), list(seq_lens)
            if base_specs:
                acc_batch, acc_seq, sweep_seqs, fit_notes = fit_sizes(base_specs, batch_sizes, seq_lens)
                notes += fit_notes
            _check_calibration_data(prep, calibration_data, tokenizer)
            calib = _calibration_source(calibration_data, data, tokenizer, acc_seq, notes)
            prepared: dict[str, Target] = {}
            for n in names:
                bar.step(f"preparing {n}")
                prepared[n] = prep.prepare(n)
                bar.step(f"prepared {n}", advance=1)
            if not targets:
                names = _drop_unquantizable(names, prepared, notes)
            ref_specs = prepared[reference].specs  # ([] for a model without inputs: feeds are {})
            if ref_specs is None:
                ref_specs = next((t.specs for t in prepared.values() if t.specs is not None), None)
            feeds, data_label = _accuracy_feeds(data, ref_specs, acc_batch, acc_seq, tokenizer)
            preload()
            runs_by_name: dict[str, TargetRun] = {}
            latency: list[LatencyPoint] = []
            for n in names:
                bar.step(f"running {n}")
                t = prepared[n]
                points = sweep_points(t.specs or [], batch_sizes, sweep_seqs) if t.specs else []
                runs_by_name[n], lat = _run_target(t, feeds, points, warmup, runs)
                latency.extend(lat)
                bar.step(f"ran {n}", advance=1)
    ref_run = runs_by_name[reference]
    if outputs is None and ref_run.outputs:  # (not known before it ran)
        outputs = list(ref_run.outputs[0])
    if outputs is not None:  # again: the INT8 targets may have left the default targets since
        _check_tolerance_keys(tolerances, names, outputs)
    accuracy: list[AccuracyRow] = []
    for n in names:
        if n != reference:
            accuracy += compare_target(
                runs_by_name[reference],
                runs_by_name[n],
                prepared[n].info.precision,
                tolerances=tolerances,
                classification=classification,
                masks=[f.get(padding_mask) for f in feeds] if padding_mask else None,
            )
    report = Report(
        title=title or f"trtforge report: {Path(src.label).name}",
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        source={"kind": src.kind, "label": src.label},
        reference=reference,
        settings={
            "targets": names,
            "batch_sizes": [int(b) for b in batch_sizes],
            "seq_lens": [int(s) for s in sweep_seqs],
            "warmup": warmup,
            "runs": runs,
            "threads": threads,
            "accuracy_data": data_label,
            "accuracy_iterations": len(feeds),
            "padding_mask": padding_mask,
            "accuracy_input_shapes": [{k: list(v.shape) for k, v in f.items()} for f in feeds[:4]],
        },
        environment=environment(threads),
        targets=[prepared[n].info for n in names],
        accuracy=accuracy,
        latency=latency,
        notes=notes,
    )
    from trtforge.reports.render import write_report

    if check_report is not None:
        check_report(report)
    html_path, md_path, json_path = write_report(report, create_out_dir(out_dir))
    return ReportResult(html_path, md_path, json_path, report, runs_by_name)


def check_threads(threads: int | None) -> None:
    """UserError for a thread count above the CPU cores this process may run on: more only slows a
    measurement down, and thousands of torch/ONNX Runtime threads exhaust memory (the process is killed)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads is not None and not 1 <= threads <= cores:
        raise UserError(
            f"--threads {threads} is outside 1..{cores}: this process runs on {cores} CPU core(s), and "
            "threads beyond the cores only slow the measurement down."
        )


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with torch on `threads` threads (None or 0: as it is), restoring the count after;
    a count :func:`check_threads` refuses is a UserError before anything runs."""
    if not threads:
        yield
        return
    check_threads(threads)
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _drop_unquantizable(names: list[str], prepared: Mapping[str, Target], notes: list[str]) -> list[str]:
    """Default targets only: leave out the INT8 targets, with a note, when INT8 has nothing to quantize.

    A model too small for INT8 is not a failed report; a target the user names still fails honestly.
    """
    int8 = prepared.get("ort-int8")
    reason = (int8.info.reason or "") if int8 is not None else ""
    if int8 is None or int8.info.status != FAILED or not reason.startswith(NOTHING_TO_QUANTIZE):
        return names
    gone = [n for n in names if n in INT8_TARGETS]
    notes[:] = [n for n in notes if not n.startswith("INT8 was calibrated")]
    notes.append(f"{' and '.join(gone)} left out of the default targets: {reason}")
    return [n for n in names if n not in gone]


def _check_tolerance_keys(
    tolerances: Mapping[str, Any] | None, targets: list[str], outputs: list[str]
) -> None:
    """A tolerance keyed by an output or target this report does not have would silently check nothing.

    Keys are matched whole, as `resolve_tolerance` looks them up: "", "OUTPUT", "TARGET/", "TARGET/OUTPUT"
    (output names hold '/' and ':' in graphs from many exporters, and an onnx=PATH target's name a path)."""
    valid = {"", *outputs, *(f"{t}/" for t in targets), *(f"{t}/{o}" for t in targets for o in outputs)}
    for key in tolerances or {}:
        if key in valid:
            continue
        target = next((t for t in sorted(targets, key=len, reverse=True) if key.startswith(f"{t}/")), None)
        if target is None and "/" in key:
            raise UserError(
                f"--tolerance '{key}': no output '{key}' and no target '{key.split('/')[0]}' in this report "
                f"(targets: {targets}; outputs: {outputs})."
            )
        output = key if target is None else key[len(target) + 1 :]
        raise UserError(f"--tolerance '{key}': the model has no output '{output}' (outputs: {outputs}).")


def _reference_outputs(prep: Preparer, reference: str) -> list[str] | None:
    """The output names the reference target will return, read before anything runs: its own graph for
    an onnx=PATH, an engine source's manifest for trt, else the exported (or given) graph, whose names
    every derived graph, engine and the torch runner keep. None where that graph is not available."""
    src = prep.source
    if src.kind == "engine" and reference in TRT_TARGETS:
        return [t.name for t in src.manifest.outputs]
    g = prep.graph(reference if reference.startswith(EXTERNAL) else "ort")
    return None if g.error is not None else [o.name for o in g.proto.graph.output]


def _check_data_path(value: Any, option: str) -> None:
    """A data path that does not exist, said by its option before any target is prepared (it would
    otherwise surface later, named as calibration data)."""
    if not isinstance(value, (str, os.PathLike)) or Path(value).exists():
        return
    if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", str(value)):
        return  # module:function, imported when used
    raise UserError(
        f"{option} '{show_path(value)}' does not exist; expected an .npz file, a directory of .npz/.npy "
        "files, a text file (with --tokenizer) or module:function."
    )


def _is_text_file(value: Any) -> bool:
    """Whether data `value` is read as a text file of sentences (a file, or a pipe, holding no arrays)."""
    if not isinstance(value, (str, os.PathLike)) or not Path(value).exists() or Path(value).is_dir():
        return False
    from trtforge.calibration.sources import array_file_kind

    return array_file_kind(Path(value)) is None


def _check_tokenizer_read(tokenizer: Any, data: Any, calibration_data: Any) -> None:
    """A tokenizer only tokenizes a text file of sentences given as --data or --calib-data; one
    given where neither is such a file was dropped without a word (the inputs came from arrays, or were
    generated), so a report meant to measure the user's sentences measured other inputs. Refused."""
    if tokenizer is None or _is_text_file(data) or _is_text_file(calibration_data):
        return
    given = []
    for option, value in (("--data", data), ("--calib-data", calibration_data)):
        if isinstance(value, (str, os.PathLike)):
            given.append(f"{option} '{show_path(value)}'")
        elif value is not None:
            given.append(f"{option} ({_describe(value)})")
    where = (
        f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} not one (arrays or module:function)"
        if given
        else "no --data or --calib-data is given (inputs are generated from the model's input specs)"
    )
    name = type(tokenizer).__name__
    if isinstance(tokenizer, (str, os.PathLike)):
        name = shown(os.fspath(tokenizer))
    raise UserError(
        f"--tokenizer (tokenizer=) {name} would not be used: it only tokenizes a text file of sentences "
        f"given as --data or --calib-data, and {where}. Drop --tokenizer, or give the sentences file."
    )


def _check_calibration_data(prep: Preparer, calibration_data: Any, tokenizer: Any) -> None:
    """--calib-data that does not fit the model is bad input, a UserError before any target is
    prepared (inside the INT8 target it failed only that row, and the report exited 3, a failed check)."""
    if calibration_data is None or prep.graph("ort").error is not None:
        return  # (no graph to check against: the targets' rows say why)
    from trtforge.calibration.data import input_specs_from_model, load_dataset

    specs = input_specs_from_model(prep.graph("ort").proto)
    load_dataset(calibration_data, specs, tokenizer=tokenizer, what="--calib-data")


def _calibration_source(calibration_data: Any, data: Any, tokenizer: Any, seq: int, notes: list[str]):
    """A callable giving (INT8 calibration data, its description) when the INT8 target needs it."""

    def get(prep: Preparer) -> tuple[Any, str]:
        if calibration_data is not None:
            return calibration_data, _describe(calibration_data)
        if data is not None:
            notes.append("INT8 was calibrated on the accuracy data itself; its accuracy is optimistic.")
            return data, "the accuracy data"
        from trtforge.reports.inputs import specs_from_onnx

        specs = specs_from_onnx(prep.graph("ort").proto)
        notes.append(
            "INT8 was calibrated on generated random inputs: its accuracy here says little about real data. "
            "Pass calibration_data (CLI: --calib-data)."
        )
        return [generate_feed(specs, 4, seq, seed=100 + i) for i in range(4)], "generated random inputs"

    return get


def _describe(data: Any) -> str:
    if isinstance(data, (str, os.PathLike)):
        return str(data)
    if isinstance(data, (list, tuple)):
        return f"{len(data)} feed dicts"
    return type(data).__name__


def _feed_shapes(specs: list[ReportInput], batch: int, seq: int) -> dict[str, tuple[int, ...]] | None:
    """The accuracy feeds' input shapes (for pass verification to fall back to: a model that cannot run at
    its small generated sizes runs at these), or None where the specs cannot take them."""
    from trtforge.reports.inputs import resolve_shape

    try:
        return {s.name: resolve_shape(s, static_batch(specs) or batch, seq) for s in specs}
    except UserError:
        return None


def _engine_shapes(
    specs: list[ReportInput], batch_sizes: Sequence[int], seq_lens: Sequence[int]
) -> list[str]:
    """`--shape` strings covering the sweep within the model's limits: min 1 (or the limit's), opt and
    max at the largest batch / sequence the model takes."""
    out = []
    for s in specs:
        lo, hi = [], []
        for axis, d in enumerate(s.shape):
            if isinstance(d, int) and d >= 0:  # static (0: an empty axis)
                lo.append(d)
                hi.append(d)
            else:
                a, b = s.limits[axis] if s.limits else (1, None)
                want = max(batch_sizes) if axis == 0 else max(seq_lens)
                lo.append(a)
                hi.append(max(a, min(want, b)) if b is not None else want)
        fmt = "x".join
        out.append(f"{s.name}:{fmt(map(str, lo))}:{fmt(map(str, hi))}:{fmt(map(str, hi))}")
    return out


__all__ = ["DEFAULT_RUNS", "DEFAULT_WARMUP", "OK", "ReportResult", "build_report"]
