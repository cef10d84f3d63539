"""ONNX -> serialized TensorRT engine through the backend adapter (EngineFromOnnx).

Parses with node-level error reporting, sets optimization profiles (N copies for N concurrent
streams), optimization level, workspace, timing cache (datacenter TensorRT only) and aux streams,
and shows builder progress. Returns the engine bytes plus a record; writing files is the caller's job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trtforge._fileio import atomic_write_bytes
from trtforge.compiler.network import (
    check_custom_ops,
    check_io,
    network_io,
    parse_onnx,
    register_plugins_if_needed,
)
from trtforge.core.backend import Backend, get_backend
from trtforge.core.manifest import ShapeRange, TensorSpec
from trtforge.core.policy import MAX_STREAMS, cli
from trtforge.core.shapes import (
    ShapeLimits,
    limits_to_dict,
    normalize_shapes,
    resolve_profile,
)
from trtforge.core.tensor_spec import graph_inputs, graph_outputs
from trtforge.errors import BuildError, UserError, is_int

# What TensorRT's builder says when an IAttention has no fused kernel and is not marked decomposable.
_ATTENTION_NO_KERNEL = "Attention operation was not supported by a dedicated kernel"


@dataclass
class BuildOptions:
    """Builder settings, one group for the API and every command (CLI flags are field metadata).
    None means the backend's default."""

    shapes: Mapping[str, ShapeRange] | Sequence[str] | None = field(
        default=None,
        metadata=cli(
            "--shape",
            multiple=True,
            metavar="NAME:MIN:OPT:MAX",
            help="Profile range of a dynamic input, dims as 1x16 (like trtexec). Repeatable.",
        ),
    )
    opt_level: int | None = field(
        default=None, metadata=cli("--opt-level", min=0, max=5, help="Builder optimization level 0-5.")
    )
    workspace_mb: int | None = field(
        default=None, metadata=cli("--workspace", min=1, help="Workspace limit in MiB.")
    )
    timing_cache: str | os.PathLike[str] | None = field(
        default=None, metadata=cli("--timing-cache", path=True, help="Timing cache to reuse.")
    )
    streams: int = field(
        default=1,
        metadata=cli(
            "--streams",
            min=1,
            max=MAX_STREAMS,
            help="Copies of each profile, so N execution contexts can run concurrently.",
        ),
    )
    aux_streams: int | None = field(
        default=None, metadata=cli("--aux-streams", min=0, help="Max auxiliary streams per context.")
    )
    targets: Sequence[str] | None = field(
        default=None,
        metadata=cli(
            "--target", multiple=True, metavar="SMxx", help="TensorRT-RTX target compute capability."
        ),
    )
    backend: str | None = field(
        default=None,
        metadata=cli(
            "--backend",
            choices=("tensorrt", "tensorrt_rtx"),
            help="Force a backend (default: $TRTFORGE_BACKEND, else tensorrt, else tensorrt_rtx).",
        ),
    )
    progress: bool = True
    version_compatible: bool = field(
        default=False,
        metadata=cli(
            "--version-compatible",
            help="Datacenter TensorRT: an engine later TensorRT versions can load (lean-runtime ops only).",
        ),
    )

    def __post_init__(self) -> None:
        """Normalize what the API accepts (one --shape string, a target string) and refuse wrong types and
        ranges here, before any export or pass runs, naming the option."""
        self.shapes = normalize_shapes(self.shapes)
        if isinstance(self.targets, str):
            self.targets = [self.targets]
        if self.targets is not None and not (
            isinstance(self.targets, (list, tuple)) and all(isinstance(t, str) for t in self.targets)
        ):
            shown = list(self.targets) if isinstance(self.targets, (list, tuple)) else self.targets
            raise UserError(f"--target expects names such as 'SM89', got {shown!r}.")
        if self.targets is not None:  # 'SM86,SM89' as well as repeated --target
            self.targets = [
                t.strip() for ts in self.targets for t in ts.split(",") if t.strip() or not ts.strip()
            ]
        if self.targets:  # against the backend's list now, before any export or pass runs
            self.targets = get_backend(self.backend).check_build_targets(self.targets)
        self.streams = _integer(self.streams, "--streams")
        for name, flag in (
            ("opt_level", "--opt-level"),
            ("workspace_mb", "--workspace"),
            ("aux_streams", "--aux-streams"),
        ):
            if getattr(self, name) is not None:
                setattr(self, name, _integer(getattr(self, name), flag))
        if not 1 <= self.streams <= MAX_STREAMS:
            raise UserError(
                f"--streams must be 1..{MAX_STREAMS}, got {self.streams}: each stream is a copy of the "
                f"profile, and a GPU runs at most {MAX_STREAMS} streams concurrently."
            )
        if self.opt_level is not None and not 0 <= self.opt_level <= 5:
            raise UserError(f"--opt-level must be 0..5, got {self.opt_level}.")
        if self.workspace_mb is not None and not 0 < self.workspace_mb < 2**43:
            raise UserError(f"--workspace must be 1..{2**43 - 1} MiB, got {self.workspace_mb}.")
        if self.aux_streams is not None and not 0 <= self.aux_streams <= MAX_DIM:
            raise UserError(f"--aux-streams must be 0..{MAX_DIM}, got {self.aux_streams}.")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with shapes in --shape syntax when given as strings; `progress` (display only)
        is left out so the same request records the same options from the API and the CLI."""
        d = asdict(self)
        del d["progress"]
        if isinstance(self.shapes, Mapping):
            d["shapes"] = {k: asdict(v) for k, v in self.shapes.items()}
        elif self.shapes is not None:
            d["shapes"] = list(self.shapes)
        d["timing_cache"] = str(self.timing_cache) if self.timing_cache else None
        d["targets"] = list(self.targets) if self.targets else None
        return d


def _integer(value: Any, flag: str) -> int:

    if not is_int(value):
        raise UserError(f"{flag} must be an integer, got {value!r} ({type(value).__name__}).")
    return int(value)


@dataclass
class BuildRecord:
    """What the build stage did."""

    backend: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    profiles: list[dict[str, ShapeRange]]
    derived_shapes: dict[str, ShapeRange]
    layers: int
    layer_types: dict[str, int]
    targets: list[str]
    timing_cache: str | None
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    engine_bytes: int = 0
    shape_limits: dict[str, Any] = field(default_factory=dict)
    shape_check: dict[str, Any] | None = None
    attention_decomposed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _named(spec: TensorSpec, symbols: Mapping[str, tuple[str | None, ...]]) -> TensorSpec:
    """`spec` with its axis names from `symbols` (the ONNX graph's), when the graph gives that many axes."""
    named = symbols.get(spec.name, ())
    return replace(spec, symbols=tuple(named)) if len(named) == len(spec.shape) else spec


@contextlib.contextmanager
def _progress(backend: Backend, config: Any, enabled: bool, cancel: threading.Event) -> Iterator[None]:
    """Attach an IProgressMonitor (where the binding has it) that cancels the build once `cancel` is set,
    and show builder phases with rich when `enabled`."""
    bar: Any = None
    tasks: dict[str, Any] = {}

    def on_event(kind: str, phase: str, parent: str | None, n: int) -> None:
        if bar is None:
            return
        if kind == "start":
            tasks[phase] = bar.add_task(f"  {phase}", total=max(n, 1))
        elif kind == "step" and phase in tasks:
            bar.update(tasks[phase], completed=n + 1)
        elif kind == "finish" and phase in tasks:
            bar.remove_task(tasks.pop(phase))

    monitor = backend.make_progress_monitor(on_event, keep_going=lambda: not cancel.is_set())
    if monitor is not None:
        config.progress_monitor = monitor
    try:
        if not enabled:
            yield
            return
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            transient=True,
        ) as bar:
            top = bar.add_task(f"building engine ({backend.name})", total=None)
            try:
                yield
            finally:
                bar.remove_task(top)
    finally:
        if monitor is not None:
            config.progress_monitor = None


# After Ctrl-C / SIGTERM, how long to wait for the builder to honour the cancel before giving up on it
# (TensorRT-RTX can run 20 s and more between two progress callbacks; the CLI then exits regardless).
CANCEL_GRACE_S = 2.0
BUILD_THREAD_NAME = "trtforge-build"
MAX_DIM = 2**31 - 1


def build_cancellable(run: Callable[[], Any], cancel: threading.Event) -> Any:
    """Run `run()` (the TensorRT build) in a worker thread while this thread waits for it and handles
    SIGINT/SIGTERM: a signal sets `cancel` (the progress monitor then stops the build), and once the build
    has returned, or `CANCEL_GRACE_S` passed, the signal is raised again with the caller's own handlers
    (KeyboardInterrupt for Ctrl-C), so cleanup runs as for any interrupt. The builder itself swallows
    exceptions raised inside its callbacks, which is why a plain KeyboardInterrupt was lost there."""
    if threading.current_thread() is not threading.main_thread():
        return run()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = run()
        except BaseException as e:  # re-raised in the calling thread below
            box["error"] = e

    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)
        cancel.set()

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):
            old[sig] = signal.signal(sig, on_signal)
    worker = threading.Thread(target=target, name=BUILD_THREAD_NAME, daemon=True)
    try:
        worker.start()
        deadline = None
        while worker.is_alive():
            worker.join(0.05)
            if received and deadline is None:
                deadline = time.monotonic() + CANCEL_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                break
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if received:
        signal.raise_signal(received[0])  # the caller's handler: KeyboardInterrupt, or the CLI's SIGTERM
        raise KeyboardInterrupt  # a handler that returned: the build is cancelled all the same
    if "error" in box:
        raise box["error"]
    return box.get("value")


def serialize_network(
    backend: Backend, builder: Any, network: Any, config: Any, progress: bool, what: str
) -> tuple[bytes, list[tuple[str, str]]]:
    """Build the serialized engine under the progress monitor, cancellable by Ctrl-C/SIGTERM
    (:func:`build_cancellable`); returns (plan bytes, the logger's messages). A failed build raises a
    BuildError naming `what` with TensorRT's last errors."""
    from trtforge.core.backend import TRT_LOG, native_stderr

    cancel = threading.Event()
    printed: list[str] = []  # what the library wrote to stderr itself, past the logger
    with _progress(backend, config, progress, cancel), native_stderr(printed):
        plan = build_cancellable(lambda: builder.build_serialized_network(network, config), cancel)
    messages = backend.logger.take()
    logged = " ".join(m for _, m in messages)
    # (TensorRT-RTX's "Internal Error: MyelinCheckException ..." repeats an ERROR the logger got: a failed
    # build's error names it; a build that went on past it, or a retry that succeeds, does not print it)
    printed = [line for line in printed if line.split(": ", 1)[-1][:60] not in logged]
    for line in printed:
        TRT_LOG.log(logging.WARNING if plan is not None else logging.ERROR, "%s", line)
    if plan is None:
        errs = [m for sev, m in messages if sev in ("ERROR", "INTERNAL_ERROR")] or [m for _, m in messages]
        errs += printed
        raise BuildError(
            f"{backend.name} {backend.version} failed to build {what}:\n  " + "\n  ".join(errs[-10:])
        )
    return bytes(memoryview(plan)), messages + [("WARNING", line) for line in printed]


def _collapsed_axes(before: Mapping[str, ShapeRange], after: Mapping[str, ShapeRange]) -> list[str]:
    """'input axis k' for each axis that had a range before and has a single size after narrowing."""
    out = []
    for name, r in after.items():
        b = before[name]
        out += [
            f"{name} axis {k}" for k in range(len(r.min)) if b.min[k] != b.max[k] and r.min[k] == r.max[k]
        ]
    return out


def _check_narrowing_derived(
    check_profile: Callable[[dict[str, ShapeRange]], dict[str, Any]],
    profile: dict[str, ShapeRange],
    derived: Mapping[str, ShapeRange],
) -> tuple[dict[str, ShapeRange], dict[str, Any], dict[str, ShapeRange]]:
    """Run `check_profile`; where the model cannot run at an end of ranges trtforge derived itself
    (no --shape: a Wav2Vec2 conv front end needs more than 1 sample), narrow those ranges to the
    furthest shapes that ran and check again. A range the user gave is never changed: its failure
    raises, naming a --shape to pass. Returns (profile, check record, the narrowed ranges)."""
    from trtforge.compiler.shape_check import ProfileRangeError

    narrowed: dict[str, ShapeRange] = {}
    for _ in range(2):  # MIN, then MAX
        try:
            return profile, check_profile(profile), narrowed
        except ProfileRangeError as e:
            if not e.runs or any(name not in derived for name in e.runs):
                raise
            before, profile = profile, e.narrowed(profile)
            collapsed = _collapsed_axes(before, profile)
            if collapsed:
                raise UserError(
                    f"{e} The graph ran at no other size of {', '.join(collapsed)} than the example's: the "
                    "export fixed that size (the legacy exporter traces Python ints, e.g. in "
                    "nn.MultiheadAttention's reshapes); export with --exporter dynamo, or drop that axis "
                    "from --dynamic."
                ) from e
            narrowed.update({name: profile[name] for name in e.runs})
    return profile, check_profile(profile), narrowed


def build_engine(
    onnx_path: str | os.PathLike[str],
    options: BuildOptions | None = None,
    *,
    example_shapes: Mapping[str, Sequence[int]] | None = None,
    on_derived: Callable[[dict[str, ShapeRange]], None] | None = None,
    limits: ShapeLimits | None = None,
    check_profile: Callable[[dict[str, ShapeRange]], dict[str, Any]] | None = None,
    source: str | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> tuple[bytes, BuildRecord]:
    """Parse `onnx_path` and build a serialized engine; raises UserError for bad models/options.

    `source` names the graph in messages when `onnx_path` is a temporary staged file (what the user gave).
    `on_warning` hears trtforge's own warnings (an ignored timing cache, attention built decomposed) as
    they are recorded, so a caller can show them; TensorRT's own are only kept in the record.

    `limits` bound derived ranges and refuse user ranges beyond them; `check_profile(profile)` runs
    before the builder (the pipeline passes the ONNX Runtime MIN/MAX check) and its record is kept.
    """
    options = options or BuildOptions()
    options.__post_init__()  # fields may have been assigned after construction
    check_io(Path(onnx_path))
    backend = get_backend(options.backend)
    if not backend.capabilities.can_build:
        raise UserError(f"{backend.name} cannot build engines here: {backend.capabilities.build_reason}.")
    onnx_path = Path(onnx_path)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    builder = backend.create_builder()
    network = backend.create_network(builder)
    backend.logger.take()
    register_plugins_if_needed(backend, onnx_path)
    check_custom_ops(onnx_path, backend, source)
    parser = parse_onnx(backend, network, onnx_path, source)
    seconds["parse"] = time.perf_counter() - t0
    inputs, outputs = network_io(network)
    import onnx

    graph = onnx.load(os.fspath(onnx_path), load_external_data=False)
    symbols = {t.name: t.symbols for t in [*graph_inputs(graph), *graph_outputs(graph)]}
    del graph
    # the record keeps each axis's ONNX name (inspect shows them; export-triton reads the batch axis there)
    inputs, outputs = ([_named(t, symbols) for t in specs] for specs in (inputs, outputs))
    descs = [TensorSpec(t.name, t.dtype, tuple(t.shape), symbols.get(t.name, ())) for t in inputs]
    profile, derived = resolve_profile(descs, options.shapes, example_shapes, limits)
    if derived and on_derived is not None:
        on_derived(derived)
    dynamic = any(-1 in d.shape for d in descs)
    checked = None
    if check_profile is not None and dynamic:
        profile, checked, narrowed = _check_narrowing_derived(check_profile, profile, derived)
        if narrowed:
            derived.update(narrowed)
            if on_derived is not None:
                on_derived(narrowed)

    config = builder.create_builder_config()
    needs_profile = any(-1 in t.shape for t in inputs)
    profiles: list[dict[str, ShapeRange]] = []
    if needs_profile:
        for _ in range(options.streams):
            p = builder.create_optimization_profile()
            for name, rng in profile.items():
                _check_dims(name, rng)
                p.set_shape(name, rng.min, rng.opt, rng.max)
            if config.add_optimization_profile(p) < 0:
                raise UserError(f"TensorRT rejected the optimization profile {profile}.")
            profiles.append(dict(profile))
    if options.opt_level is not None:
        config.builder_optimization_level = options.opt_level
    if options.workspace_mb is not None:
        config.set_memory_pool_limit(backend.trt.MemoryPoolType.WORKSPACE, options.workspace_mb << 20)
    if options.aux_streams is not None:
        config.max_aux_streams = options.aux_streams
    targets = backend.set_build_targets(config, list(options.targets or []))
    if options.version_compatible:
        if backend.is_rtx:
            raise UserError(
                "--version-compatible: TensorRT-RTX engines are tied to the RTX release that built them "
                "(tensorrt-facts.md §6); rebuild per release instead, or build with datacenter TensorRT."
            )
        # Lean-runtime operators only; the runtime must allow host code (tensorrt-facts.md §1.10).
        config.set_flag(backend.trt.BuilderFlag.VERSION_COMPATIBLE)
    warnings: list[str] = []
    cache = _attach_timing_cache(backend, config, options.timing_cache, warnings)

    t1 = time.perf_counter()
    decomposed: list[str] = []
    try:
        data, messages = serialize_network(
            backend, builder, network, config, options.progress, f"'{onnx_path}'"
        )
    except BuildError as e:
        if _ATTENTION_NO_KERNEL in str(e):
            decomposed = backend.mark_attention_decomposable(network)
        if not decomposed:
            raise
        data, messages = serialize_network(
            backend, builder, network, config, options.progress, f"'{onnx_path}'"
        )
        warnings.append(
            f"attention {', '.join(decomposed)} built decomposed (MatMul/Softmax kernels, slower): TensorRT "
            "has no fused attention kernel for its shapes or dtype (seen for head size 8, and in INT8 "
            "builds of WavLM, PVT and MobileViT)."
        )
    seconds["build"] = time.perf_counter() - t1
    for warning in warnings if on_warning is not None else ():
        on_warning(warning)
    if cache is not None:
        atomic_write_bytes(options.timing_cache, memoryview(cache.serialize()))
    warnings += [m for sev, m in messages if sev == "WARNING"][:50]
    layer_types = Counter(
        str(network.get_layer(i).type).rsplit(".", 1)[-1] for i in range(network.num_layers)
    )
    del parser
    record = BuildRecord(
        backend=backend.describe(),
        inputs=inputs,
        outputs=outputs,
        profiles=profiles,
        derived_shapes=derived,
        layers=network.num_layers,
        layer_types=dict(sorted(layer_types.items())),
        targets=targets,
        timing_cache=str(options.timing_cache) if cache is not None else None,
        seconds=seconds,
        warnings=warnings,
        engine_bytes=len(data),
        shape_limits=limits_to_dict(limits or {}),
        shape_check=checked,
        attention_decomposed=list(decomposed),
    )
    return data, record


def _check_dims(name: str, rng: ShapeRange) -> None:
    """UserError for a profile dimension TensorRT cannot represent (it would raise a binding TypeError)."""
    big = [d for d in (*rng.min, *rng.opt, *rng.max) if not 0 <= d <= MAX_DIM]
    if big:
        raise UserError(
            f"--shape {name}: dimension {big[0]} is out of range; TensorRT dimensions are 0..{MAX_DIM}."
        )


def _attach_timing_cache(backend: Backend, config: Any, path: Any, warnings: list[str]) -> Any:
    """Load (or start) a timing cache for datacenter TensorRT; on RTX it is a no-op that forces a GPU."""
    if not path:
        return None
    if not backend.capabilities.timing_cache:
        warnings.append(
            f"--timing-cache ignored: {backend.name} deprecates timing caches and using one forces a GPU "
            "query, which breaks CPU-only builds (tensorrt-facts.md §1.5)."
        )
        return None
    p = Path(path)
    blob = p.read_bytes() if p.is_file() else b""
    cache = config.create_timing_cache(blob)
    config.set_timing_cache(cache, False)
    return cache
