"""A stand-in engine: the Context protocol with real work on the bound addresses and stream, no TensorRT.

It lets the session machinery (lanes, streams, events, arenas, staging, graphs, futures) be proven on a
real GPU where no TensorRT engine can run (architecture.md, verification matrix). Like TensorRT it
receives raw device addresses and a stream handle, allocates nothing for bound tensors, and it is
stricter than TensorRT where TensorRT would silently misbehave:

- a dynamic-shape profile may be selected by one live context only (tensorrt-facts.md §4.3);
- input shapes must lie inside the selected profile; every I/O address and enough device memory
  (256-byte aligned) must be bound before an enqueue; never on the default stream (§4.2);
- device memory of two contexts must not overlap (§4.2).

The network: input ``x`` float32 ``(B, D)``; outputs ``y = x * 2 + 1`` ``(B, D)`` and ``s = y.sum(-1)``
``(B,)``; optionally ``pos`` int64 ``(N,)`` = rows where ``x[:, 0] > 0`` (data-dependent, via the output
sink). ``x * 2`` goes through the context's device memory, whose required size is ``memory_fn(B)``
(default ``B * D * 4`` bytes), so arena sizing is load-bearing. With aux streams the reduction runs on aux
stream 0, joined by events the way TensorRT joins its aux streams (§4.4). ``spin_cycles`` adds a
single-thread kernel (``torch.cuda._sleep``) that occupies one SM for that long: a small-batch engine
whose kernels leave most of the GPU idle.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trtforge.core.manifest import Manifest, ShapeRange, TensorSpec
from trtforge.runtime._device import CudaDevice, HostDevice
from trtforge.runtime.engine import Engine
from trtforge.runtime.protocol import GpuAllocator, OutputSink

_VIEW_CACHE_LIMIT = 1024


def standin_manifest(
    *,
    batch: tuple[int, int, int] = (1, 8, 32),
    features: int = 64,
    streams: int = 1,
    dds: bool = False,
    static_batch: int | None = None,
) -> Manifest:
    """A manifest for the stand-in: dynamic batch (min, opt, max) x `features`, `streams` profile copies."""
    b = -1 if static_batch is None else static_batch
    outputs = [TensorSpec("y", "float32", [b, features]), TensorSpec("s", "float32", [b])]
    if dds:
        outputs.append(TensorSpec("pos", "int64", [-1]))
    if static_batch is None:
        rng = ShapeRange([batch[0], features], [batch[1], features], [batch[2], features])
        profiles = [{"x": rng} for _ in range(streams)]
    else:
        profiles = []
    return Manifest(
        engine_file="standin.engine",
        engine_sha256="0" * 64,
        engine_bytes=0,
        backend={"name": "standin", "version": "0"},
        inputs=[TensorSpec("x", "float32", [b, features])],
        outputs=outputs,
        profiles=profiles,
        source={"kind": "standin"},
        trtforge_version="0",
        streams=streams,
    )


class StandinContext:
    """Implements the Context protocol; does its work with torch on views of the bound addresses."""

    def __init__(self, engine: StandinEngine):
        self._e = engine
        self.profile: int | None = None
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.memory = (0, 0)
        self.addresses: dict[str, int] = {}
        self.sinks: dict[str, OutputSink] = {}
        self.aux: list[Any] = []
        self.allocator: GpuAllocator | None = None
        self.enqueues = 0
        self._busy = threading.Lock()
        self._views: dict[tuple, torch.Tensor] = {}
        self._events: list[Any] = []

    # -- protocol -------------------------------------------------------------------------------------
    def set_optimization_profile(self, index: int, stream: int) -> None:
        self._e.claim_profile(self, index, self.profile)
        self.profile, self.shapes = index, {}

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if self.profile is None:
            raise RuntimeError("stand-in: set_input_shape before an optimization profile was selected")
        rng = self._e.ranges(self.profile).get(name)
        if rng is not None and not all(lo <= d <= hi for d, lo, hi in zip(shape, rng.min, rng.max)):
            raise RuntimeError(f"stand-in: shape {shape} of '{name}' is outside profile {self.profile}")
        self.shapes[name] = tuple(shape)

    def device_memory_size(self) -> int:
        return int(self._e.memory_fn(self.shapes["x"][0]))

    def set_device_memory(self, address: int, size: int) -> None:
        if address % 256:
            raise RuntimeError(f"stand-in: device memory {address:#x} is not 256-byte aligned")
        self._e.claim_memory(self, address, size)
        self.memory = (address, size)

    def output_shape(self, name: str) -> tuple[int, ...]:
        b, d = self.shapes["x"]
        return {"y": (b, d), "s": (b,), "pos": (-1,)}[name]

    def set_tensor_address(self, name: str, address: int) -> None:
        self.addresses[name] = address
        if self._e.work == "compute" and "x" in self.shapes and name in ("x", "y", "s"):
            b, d = self.shapes["x"]
            self._view(address, torch.float32, (b, d) if name != "s" else (b,))  # outside any graph capture

    def set_output_sink(self, name: str, sink: OutputSink) -> None:
        self.sinks[name] = sink

    def set_aux_streams(self, streams: Sequence[int]) -> None:
        if any(s == 0 for s in streams) or len(set(streams)) != len(streams):
            raise RuntimeError("stand-in: aux streams must be distinct, non-default streams (facts §4.4)")
        self.aux = list(streams)

    def set_temporary_allocator(self, allocator: GpuAllocator) -> None:
        self.allocator = allocator

    def graph_capturable(self, stream: int) -> bool:
        return not self.sinks

    def execute_async(self, stream: int) -> bool:
        if stream == 0:
            raise RuntimeError("stand-in: enqueue on the default stream (facts §4.2 says use another)")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("stand-in: one execution context used by two threads at once")
        try:
            self._check_bound()
            self.enqueues += 1
            if self._e.work == "none":
                return True
            self._compute(stream)
            return True
        finally:
            self._busy.release()

    # -- internals ------------------------------------------------------------------------------------
    def _check_bound(self) -> None:
        if self.profile is None or "x" not in self.shapes:
            raise RuntimeError("stand-in: enqueue before the profile and input shapes were set")
        need = self.device_memory_size()
        if (self.memory[0] == 0 and need) or self.memory[1] < need:
            raise RuntimeError(f"stand-in: {self.memory[1]} bytes of device memory bound, {need} needed")
        wanted = ["x", "y", "s"]
        missing = [n for n in wanted if not self.addresses.get(n)]
        if missing:
            raise RuntimeError(f"stand-in: no address bound for {missing}")

    def _view(self, address: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A `dtype`/`shape` tensor over the bound address, cached (addresses repeat: caching allocator)."""
        key = (address, dtype, shape)
        t = self._views.get(key)
        if t is None:
            n = 1
            for d in shape:
                n *= d
            if len(self._views) >= _VIEW_CACHE_LIMIT:
                self._views.clear()
            t = self._views[key] = self._e.device.view(address, n * dtype.itemsize).view(dtype).view(shape)
        return t

    def _compute(self, stream: int) -> None:
        b, d = self.shapes["x"]
        x = self._view(self.addresses["x"], torch.float32, (b, d))
        y = self._view(self.addresses["y"], torch.float32, (b, d))
        s = self._view(self.addresses["s"], torch.float32, (b,))
        scratch = self._view(self.memory[0], torch.float32, (b, d))
        e = self._e
        cuda = isinstance(e.device, CudaDevice)
        main = e.external(stream) if cuda else None
        with torch.cuda.stream(main) if cuda else contextlib.nullcontext():
            torch.mul(x, 2.0, out=scratch)
            if e.spin_cycles and cuda:
                torch.cuda._sleep(e.spin_cycles)
            torch.add(scratch, 1.0, out=y)
            if self.aux and cuda:
                aux = e.external(self.aux[0])
                start, end = self._aux_events()
                start.record(main)
                aux.wait_event(start)
                with torch.cuda.stream(aux):
                    torch.sum(y, dim=-1, out=s)
                    end.record(aux)
                main.wait_event(end)
            else:
                torch.sum(y, dim=-1, out=s)
            if self.allocator is not None:
                self._use_temporary(s, b)
            if "pos" in self.sinks:
                self._data_dependent(x)

    def _aux_events(self) -> tuple[Any, Any]:
        if not self._events:
            self._events = [torch.cuda.Event(), torch.cuda.Event()]
        return self._events[0], self._events[1]

    def _use_temporary(self, s: torch.Tensor, b: int) -> None:
        """Round-trip `s` through an engine-owned temporary allocation (exercises the allocator route)."""
        address = self.allocator.allocate(b * 4, 256)
        if not address:
            raise RuntimeError("stand-in: temporary allocation failed")
        tmp = self._e.device.view(address, b * 4).view(torch.float32)
        tmp.copy_(s)
        s.copy_(tmp)
        self.allocator.deallocate(address)

    def _data_dependent(self, x: torch.Tensor) -> None:
        mask = x[:, 0] > 0
        rows = torch.nonzero(mask).flatten()
        n = int(rows.numel())  # a host sync, as TensorRT does for data-dependent shapes
        sink = self.sinks["pos"]
        address = sink.reallocate("pos", n * 8, 256)
        if not address:
            raise RuntimeError("stand-in: output sink refused the data-dependent output 'pos'")
        if n:
            self._e.device.view(address, n * 8).view(torch.int64).copy_(rows)
        sink.notify_shape("pos", (n,))


class StandinEngine:
    """The EngineHandle of the stand-in; tracks profile and memory ownership across its contexts."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        device: str = "cuda",
        work: str = "compute",
        spin_cycles: int = 0,
        memory_fn: Callable[[int], int] | None = None,
        num_aux_streams: int = 0,
    ):
        if work not in ("compute", "none"):
            raise ValueError(f"work must be 'compute' or 'none', not {work!r}")
        self.manifest = manifest
        self.device = HostDevice() if device == "cpu" else CudaDevice(torch.device(device).index or 0)
        self.work = work
        self.spin_cycles = int(spin_cycles)
        features = manifest.inputs[0].shape[1]
        self.memory_fn = memory_fn or (lambda b: b * features * 4)
        self.num_aux_streams = num_aux_streams
        self.data_dependent_outputs = frozenset(o.name for o in manifest.outputs if o.name == "pos")
        self.dynamic = any(d < 0 for d in manifest.inputs[0].shape)
        self.contexts: list[StandinContext] = []
        self._lock = threading.Lock()
        self._profile_owner: dict[int, StandinContext] = {}
        self._memory: dict[StandinContext, tuple[int, int]] = {}
        self._streams: dict[int, Any] = {}

    def ranges(self, profile: int) -> dict[str, ShapeRange]:
        return self.manifest.profiles[profile] if self.manifest.profiles else {}

    def create_context(self) -> StandinContext:
        ctx = StandinContext(self)
        self.contexts.append(ctx)
        return ctx

    def device_memory_size_for_profile(self, profile: int) -> int:
        rng = self.ranges(profile).get("x")
        return int(self.memory_fn(rng.max[0] if rng else self.manifest.inputs[0].shape[0]))

    def claim_profile(self, ctx: StandinContext, index: int, previous: int | None) -> None:
        n = max(1, len(self.manifest.profiles))
        if not 0 <= index < n:
            raise RuntimeError(f"stand-in: profile {index} does not exist ({n} profiles)")
        if not self.dynamic:
            return
        with self._lock:
            owner = self._profile_owner.get(index)
            if owner is not None and owner is not ctx:
                raise RuntimeError(
                    f"stand-in: profile {index} is already used by another context (facts §4.3)"
                )
            if previous is not None and self._profile_owner.get(previous) is ctx:
                del self._profile_owner[previous]
            self._profile_owner[index] = ctx

    def claim_memory(self, ctx: StandinContext, address: int, size: int) -> None:
        with self._lock:
            for other, (a, n) in self._memory.items():
                if other is not ctx and a < address + size and address < a + n:
                    raise RuntimeError("stand-in: device memory overlaps another context's (facts §4.2)")
            self._memory[ctx] = (address, size)

    def external(self, handle: int) -> Any:
        s = self._streams.get(handle)
        if s is None:
            s = self._streams[handle] = torch.cuda.ExternalStream(handle)
        return s


def load_standin(manifest: Manifest | None = None, **options: Any) -> Engine:
    """An :class:`Engine` over a :class:`StandinEngine` (options as StandinEngine's keywords)."""
    manifest = manifest or standin_manifest()
    handle = StandinEngine(manifest, **options)
    device = options.get("device", "cuda")
    return Engine(manifest, handle, label="stand-in engine", host_capable=True, default_device=device)


__all__ = ["StandinContext", "StandinEngine", "load_standin", "standin_manifest"]
