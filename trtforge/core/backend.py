"""The one place that imports TensorRT: picks `tensorrt` or `tensorrt_rtx` lazily and papers over
their differences (TensorRT 10 vs 11 vs TensorRT-RTX; see shared/docs/tensorrt-facts.md §1, §6).

Nothing here imports TensorRT at module import time. Everything else in trtforge goes through
:func:`get_backend` and the small surface of :class:`Backend`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from trtforge.errors import BackendUnavailableError, UserError

#: TensorRT's own log (every ILogger message, and what the library prints on stderr itself during a
#: build: :func:`native_stderr`) at Python's levels: VERBOSE -> DEBUG, INFO -> INFO, WARNING -> WARNING,
#: ERROR -> ERROR, INTERNAL_ERROR -> CRITICAL. A library's logger: nothing is shown unless the application
#: configures logging (the CLI shows the warnings); a failed build's errors are raised as a BuildError.
TRT_LOG = logging.getLogger("trtforge.tensorrt")
TRT_LOG.addHandler(logging.NullHandler())
_LEVELS = (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)
# TensorRT warnings about what trtforge always does right, logged at INFO (still kept with the others):
# the ONNX parser's reminder for every INT64 input (a step engine's input_ids, position_ids, ...); the
# runtime binds each tensor at the dtype the engine reports
_ROUTINE_WARNINGS = ("has Int64 binding.",)
BACKEND_ENV = "TRTFORGE_BACKEND"
BACKEND_NAMES = ("tensorrt", "tensorrt_rtx")
_PIP_HINT = {
    "tensorrt": "pip install tensorrt   (datacenter TensorRT; needs an NVIDIA GPU to build and run)",
    "tensorrt_rtx": "pip install tensorrt-rtx   (TensorRT-RTX; builds engines on the CPU)",
}
# TensorRT-RTX runs engines on these compute capabilities by default (tensorrt-facts.md §6).
_RTX_RUNTIME_CCS = ((8, 0), (8, 6), (8, 9))
_RTX_MIN_BLACKWELL = (12, 0)
# TensorRT DataType member name -> the numpy-style dtype name manifests use.
TRT_DTYPE_NAMES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
    "FP8": "float8_e4m3fn",
    "INT4": "int4",
    "FP4": "float4_e2m1",
}
# Every dtype name a manifest may hold (what trt_dtype_name writes, plus the names of older builds).
MANIFEST_DTYPES = frozenset(TRT_DTYPE_NAMES.values()) | {"float64", "float8_e5m2"}


@dataclass(frozen=True)
class GpuInfo:
    """The first CUDA device seen through the driver API, or why none was seen."""

    present: bool
    name: str = ""
    compute_capability: tuple[int, int] | None = None
    reason: str = ""


@dataclass(frozen=True)
class Capabilities:
    """What this backend can do on this machine, with the reason when it cannot."""

    can_build: bool
    build_reason: str
    can_run: bool
    run_reason: str
    can_host_plugins: bool
    plugin_reason: str
    timing_cache: bool
    strongly_typed_only: bool


@functools.lru_cache(maxsize=1)
def probe_gpu() -> GpuInfo:
    """Ask the CUDA driver (libcuda, via ctypes) for device 0; cheap and needs neither torch nor TensorRT."""
    for lib in ("libcuda.so.1", "libcuda.so"):
        try:
            cuda = ctypes.CDLL(lib)
            break
        except OSError:
            continue
    else:
        return GpuInfo(False, reason="no CUDA driver (libcuda) on this machine")
    if cuda.cuInit(0) != 0:
        return GpuInfo(False, reason="CUDA driver present but cuInit failed (no usable GPU)")
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return GpuInfo(False, reason="CUDA driver reports no devices")
    dev = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # ..._MINOR
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, dev)
    return GpuInfo(True, name.value.decode(errors="replace"), (major.value, minor.value))


class Backend:
    """A loaded TensorRT flavour: the module, a logger, and the calls that differ between flavours."""

    def __init__(self, name: str, module: ModuleType):
        self.name = name
        self.trt = module
        self.version: str = getattr(module, "__version__", "unknown")
        self.major = int(self.version.split(".")[0]) if self.version[:1].isdigit() else 0
        self.is_rtx = name == "tensorrt_rtx"
        self.logger = _make_logger(module)

    # -- capabilities ---------------------------------------------------------------------------
    @functools.cached_property
    def capabilities(self) -> Capabilities:
        """Decide what can be built, run and hosted here (GPU presence and compute capability)."""
        gpu = probe_gpu()
        if self.is_rtx:
            can_build, build_reason = True, "TensorRT-RTX builds ahead-of-time on the CPU"
        elif gpu.present:
            can_build, build_reason = True, f"GPU {gpu.name} present"
        else:
            can_build, build_reason = False, f"datacenter TensorRT builds on the target GPU; {gpu.reason}"
        if not gpu.present:
            can_run, run_reason = False, gpu.reason
        elif self.is_rtx and not (
            gpu.compute_capability in _RTX_RUNTIME_CCS or gpu.compute_capability >= _RTX_MIN_BLACKWELL
        ):
            cc = "{}.{}".format(*gpu.compute_capability)
            can_run, run_reason = False, f"TensorRT-RTX does not run on compute capability {cc} ({gpu.name})"
        else:
            can_run, run_reason = True, f"GPU {gpu.name}"
        plugins = hasattr(self.trt.INetworkDefinition, "add_plugin_v3")
        plugin_reason = (
            "INetworkDefinition.add_plugin_v3 available"
            if plugins
            else f"{self.name} {self.version} cannot host custom plugins (no add_plugin_v3)"
        )
        return Capabilities(
            can_build=can_build,
            build_reason=build_reason,
            can_run=can_run,
            run_reason=run_reason,
            can_host_plugins=plugins,
            plugin_reason=plugin_reason,
            timing_cache=not self.is_rtx,
            strongly_typed_only=self.is_rtx or self.major >= 11,
        )

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for manifests and `trtforge inspect`."""
        return {"name": self.name, "version": self.version, "capabilities": asdict(self.capabilities)}

    # -- build surface ----------------------------------------------------------------------------
    def create_builder(self) -> Any:
        """A new IBuilder bound to this backend's logger."""
        return self.trt.Builder(self.logger)

    def create_network(self, builder: Any) -> Any:
        """A strongly typed network: the flag is required on TensorRT 10.x and ignored on 11.x / RTX."""
        flags = 1 << int(self.trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        return builder.create_network(flags)

    def create_parser(self, network: Any) -> Any:
        """An ONNX parser for `network` (keep it alive while the network is used)."""
        return self.trt.OnnxParser(network, self.logger)

    def parser_supports(self, op_types: Iterable[str]) -> set[str]:
        """Those of `op_types` the ONNX parser has a built-in importer for."""
        parser = self.create_parser(self.create_network(self.create_builder()))
        return {op for op in op_types if parser.supports_operator(op)}

    def plugin_creators(self) -> list[tuple[str, str, str]]:
        """(name, version, namespace) of every registered plugin creator: the parser maps an op it has no
        importer for to the creator named like the op (version and namespace from the node's attributes)."""
        registry = self.trt.get_plugin_registry()
        creators = getattr(registry, "all_creators_recursive", None) or registry.all_creators
        return [(c.name, str(c.plugin_version), str(c.plugin_namespace)) for c in creators]

    def check_build_targets(self, targets: Sequence[str] | None) -> list[str]:
        """The --target names upper-cased and deduplicated, or a UserError naming the bad ones and the valid
        ones, so a bad target is refused before any export or pass runs."""
        if not targets:
            return []
        if not self.is_rtx:
            raise BackendUnavailableError(
                f"--target {','.join(targets)} needs TensorRT-RTX; {self.name} builds for the GPU it runs on "
                "(drop --target, or use --backend tensorrt_rtx)."
            )
        members = self.trt.ComputeCapability.__members__
        valid = ["CURRENT", *(n for n in members if n not in ("NONE", "CURRENT"))]
        names = list(dict.fromkeys(str(t).strip().upper() for t in targets))
        bad = [t for t in targets if str(t).strip().upper() not in valid]
        if bad:
            raise UserError(
                f"--target {', '.join(repr(t) for t in bad)}: not a compute capability {self.name} "
                f"{self.version} builds for; expected one or more of {', '.join(valid)} (repeat --target "
                "for several, e.g. --target SM86 --target SM89)."
            )
        if "CURRENT" in names and not probe_gpu().present:
            raise UserError(
                f"--target CURRENT builds for this machine's GPU, and there is none ({probe_gpu().reason}); "
                f"name the target GPUs instead, e.g. --target SM89 (valid: {', '.join(valid[1:])})."
            )
        return names

    def set_build_targets(self, config: Any, targets: list[str] | None) -> list[str]:
        """RTX only: choose compute-capability targets (e.g. ['SM86', 'SM89']); returns what was set.

        With no targets, RTX keeps its default (8.0, 8.6, 8.9, 12.x). Datacenter TensorRT builds for the
        GPU it runs on and ignores this.
        """
        names = self.check_build_targets(targets)
        if not names:
            return []
        members = self.trt.ComputeCapability.__members__
        config.num_compute_capabilities = len(names)
        for i, t in enumerate(names):
            config.set_compute_capability(members[t], i)
        return names

    def mark_attention_decomposable(self, network: Any) -> list[str]:
        """Let every IAttention of `network` fall back to separate kernels where TensorRT has no fused
        kernel for its head size or dtype (`IAttention.decomposable`); returns their names. A binding
        without IAttention (TensorRT < 10.14) has nothing to mark."""
        boundary = getattr(self.trt, "IAttentionBoundaryLayer", None)
        kinds = {getattr(self.trt.LayerType, k, None) for k in ("ATTENTION_INPUT", "ATTENTION_OUTPUT")} - {
            None
        }
        if boundary is None or not kinds:
            return []
        names: list[str] = []
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if layer.type not in kinds:
                continue
            layer.__class__ = boundary  # the binding's documented downcast
            attention = layer.attention
            if not attention.decomposable:
                attention.decomposable = True
                names.append(attention.name)
        return names

    def engine_device_memory_size(self, engine: Any) -> int:
        """Device memory an engine needs (`device_memory_size_v2`; v1 was removed in TensorRT 11)."""
        if hasattr(engine, "device_memory_size_v2"):
            return int(engine.device_memory_size_v2)
        return int(engine.device_memory_size)

    def make_progress_monitor(self, on_event: Any, keep_going: Any = None) -> Any | None:
        """An IProgressMonitor subclass instance forwarding events to `on_event(kind, phase, parent, n)`;
        the build is cancelled at the next step once `keep_going()` returns False.

        Built in a factory because the base class lives in the lazily imported module. Returns None
        where the binding lacks IProgressMonitor.
        """
        base = getattr(self.trt, "IProgressMonitor", None)
        if base is None:
            return None

        class _Monitor(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                base.__init__(self)

            def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
                on_event("start", phase_name, parent_phase, num_steps)

            def step_complete(self, phase_name: str, step: int) -> bool:
                on_event("step", phase_name, None, step)
                return keep_going is None or bool(keep_going())

            def phase_finish(self, phase_name: str) -> None:
                on_event("finish", phase_name, None, 0)

        return _Monitor()


def trt_dtype_name(dtype: Any) -> str:
    """TensorRT DataType -> numpy-style name used in manifests."""
    key = str(dtype).rsplit(".", 1)[-1]
    return TRT_DTYPE_NAMES.get(key, key.lower())


def _make_logger(trt: ModuleType) -> Any:
    """An ILogger that passes every message on to :data:`TRT_LOG` at its level and keeps the warnings and
    errors (for error messages and build records); it prints nothing itself."""

    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[tuple[str, str]] = []

        def log(self, severity: Any, msg: str) -> None:
            level = _LEVELS[min(max(int(severity), 0), len(_LEVELS) - 1)]
            if level == logging.WARNING and msg.rstrip().endswith(_ROUTINE_WARNINGS):
                level = logging.INFO
            if TRT_LOG.isEnabledFor(level):
                TRT_LOG.log(level, "%s", msg)
            if int(severity) <= int(trt.ILogger.WARNING):
                self.messages.append((str(severity).rsplit(".", 1)[-1], msg))
                del self.messages[:-200]

        def take(self) -> list[tuple[str, str]]:
            out, self.messages = self.messages, []
            return out

    return CapturingLogger()


def _is_fd2(stream: Any) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # (pytest's capsys, a closed stream, an io.StringIO)
        return False


@contextlib.contextmanager
def native_stderr(lines: list[str]) -> Iterator[None]:
    """Collect into `lines` what the TensorRT library writes to file descriptor 2 itself, past the ILogger
    (TensorRT-RTX prints "Internal Error: MyelinCheckException ..." there when an attention layer has no
    fused kernel, an error its ILogger gets too and the build then recovers from). Python's own stderr
    keeps going where it went meanwhile (a dup of the real descriptor), so trtforge's messages, warnings
    and tracebacks are not caught with it. Where descriptor 2 cannot be redirected, nothing is collected."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):
        yield
        return
    python_stderr = sys.stderr
    own: io.TextIOWrapper | None = None
    try:
        with tempfile.TemporaryFile() as sink:
            if _is_fd2(python_stderr):
                own = io.TextIOWrapper(
                    io.FileIO(os.dup(saved), "w"),
                    encoding=python_stderr.encoding,
                    errors=python_stderr.errors,
                    line_buffering=True,
                )
                sys.stderr = own
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                if own is not None:
                    # flushed, not closed: a thread or handler that took sys.stderr meanwhile (a progress
                    # bar's refresh, a StreamHandler made during the build) may still write to it; it closes
                    # its descriptor when the last of them lets it go
                    sys.stderr = python_stderr
                    with contextlib.suppress(OSError, ValueError):
                        own.flush()
                sink.seek(0)
                text = sink.read().decode(errors="replace")
                lines.extend(line.rstrip() for line in text.splitlines() if line.strip())
    finally:
        os.close(saved)


def _import(name: str) -> ModuleType:
    return importlib.import_module(name)


def _missing_message(requested: str | None, from_env: bool) -> str:
    """Why no backend loads; a requested one is named as it was asked for: by $TRTFORGE_BACKEND, or by
    argument (`--backend`, `backend=`, an engine's manifest), where the variable is not set at all."""
    if requested:
        how, undo = (
            (f"{BACKEND_ENV}={requested} was requested", f", or unset {BACKEND_ENV}")
            if from_env
            else (f"TensorRT backend '{requested}' was requested", "")
        )
        return (
            f"{how} but Python module '{requested}' is not importable. "
            f"Install it with: {_PIP_HINT[requested]}{undo}."
        )
    return (
        "No TensorRT backend is installed. trtforge needs one to build engines; install either "
        f"{_PIP_HINT['tensorrt_rtx']} or {_PIP_HINT['tensorrt']} (or `pip install trtforge[rtx]`)."
    )


@functools.lru_cache(maxsize=4)
def _load(requested: str | None, from_env: bool = False) -> Backend:
    candidates = [requested] if requested else list(BACKEND_NAMES)
    for name in candidates:
        try:
            module = _import(name)
        except ImportError:
            continue
        return Backend(name, module)
    raise BackendUnavailableError(_missing_message(requested, from_env))


def get_backend(name: str | None = None) -> Backend:
    """Return the TensorRT backend: `name`, else $TRTFORGE_BACKEND, else `tensorrt`, else `tensorrt_rtx`."""
    requested = name or os.environ.get(BACKEND_ENV) or None
    if requested is not None and requested not in BACKEND_NAMES:
        raise BackendUnavailableError(
            f"unknown TensorRT backend '{requested}' (from {'argument' if name else BACKEND_ENV}); "
            f"expected one of {', '.join(BACKEND_NAMES)}."
        )
    return _load(requested, from_env=not name and requested is not None)


def backend_available(name: str | None = None) -> bool:
    """True when :func:`get_backend` would succeed (used by test markers and `--version`)."""
    try:
        get_backend(name)
    except BackendUnavailableError:
        return False
    return True
