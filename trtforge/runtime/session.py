"""Session: N lanes (execution context + CUDA stream + profile copy + memory arena) serving run/submit.

Stream discipline, per call:
1. Validate inputs against the profile (names, dtype, rank, range) before touching any lane; UserError.
2. Take a free lane (a thread-safe pool; each lane is used by one thread at a time).
3. Select the lane's profile and input shapes on its context (only when they change), size the lane's
   arena from the actual shapes and rebind it if it moved.
4. Allocate outputs on the caller's stream, then record an event on the caller's stream and make the lane
   stream wait for it: inputs produced there and every block handed out by the caching allocator are then
   ready/free before the lane touches them.
5. Bind addresses and enqueue on the lane stream (or replay a captured CUDA graph).
6. Make the caller's stream wait for the lane (run() returns without a host sync, like any torch op);
   submit() futures resolve after the lane's work has finished.

Non-contiguous torch inputs are made contiguous (a copy on the caller's stream, counted in
``memory_stats()["contiguous_copies"]``); caller-provided outputs must be contiguous and share no memory
with an input or another output (refused otherwise, since the engine writes them in place). NumPy arrays
and CPU tensors are staged through per-lane pinned buffers and copied on the lane stream; when every input
is NumPy the outputs come back as NumPy arrays.

Concurrency: ``submit()`` from one thread keeps every lane busy (the lane is free again as soon as the request
is enqueued; a per-lane waiter thread resolves the future). ``run()`` follows torch stream semantics, so
threads that call ``run()`` concurrently should each use their own CUDA stream: calls issued on one shared
stream are ordered one after another by that stream.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trtforge.errors import UserError, checked_call, is_int, shown
from trtforge.runtime._completion import Completer
from trtforge.runtime._graph_state import GraphState
from trtforge.runtime._graphs import graph_step
from trtforge.runtime.allocator import OutputCollector, TorchAllocator
from trtforge.runtime.arena import Arena

if TYPE_CHECKING:
    from trtforge.runtime.protocol import SessionEngine

_STAGED = 1  # prepared input kind: host data to copy through pinned staging


def _check_options(cuda_graphs: Any, graph_warmup: Any, aux_streams: Any, torch_allocator: Any) -> None:
    """UserError naming the session option that has the wrong kind or range, before any lane is made:
    cuda_graphs="no" and torch_allocator="no" were read as true, aux_streams=-1 as none and "two" was
    int()'s ValueError, graph_warmup="1" a TypeError from a comparison."""
    for name, flag in (("cuda_graphs", cuda_graphs), ("torch_allocator", torch_allocator)):
        if not isinstance(flag, bool):
            raise UserError(f"session({name}={shown(flag)}): {name} must be True or False.")
    if not is_int(graph_warmup) or graph_warmup < 1:
        raise UserError(
            f"session(graph_warmup={shown(graph_warmup)}): an integer >= 1; at least one plain enqueue must "
            "precede a CUDA-graph capture (tensorrt-facts.md §4.7)."
        )
    if aux_streams is not None and (not is_int(aux_streams) or aux_streams < 0):
        raise UserError(
            f"session(aux_streams={shown(aux_streams)}): auxiliary streams per lane, an integer >= 0 "
            "(or None: what the engine was built with)."
        )


class _Lane:
    """One execution context with its own stream(s), profile copy, arena and staging buffers."""

    def __init__(self, index: int, session: Session, aux: int):
        dev = session.device
        self.index = index
        self.label = session.engine.label
        self.stream = dev.new_stream()
        self.aux_streams = [dev.new_stream() for _ in range(aux)]
        self.context = session.engine.handle.create_context()
        self.arena = Arena(dev, self.stream)
        self.ready = dev.new_event()
        self.done = dev.new_event()
        self.staged = dev.new_event()
        self.pinned: dict[str, torch.Tensor] = {}
        self.profile = -1
        self.shapes: tuple | None = None
        self.bound_memory = (0, 0)
        self.collector = OutputCollector(dev, self.stream) if session.engine.dynamic_outputs else None
        self.allocator = TorchAllocator(dev, self.stream) if session.torch_allocator else None
        self.graph_state = GraphState()
        self.graph: Any = None
        self.graph_io: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        self.calls = 0
        self.last_feeds: dict[str, torch.Tensor] = {}
        if self.aux_streams:
            self.context.set_aux_streams([s.cuda_stream for s in self.aux_streams])
        if self.collector is not None:
            for name in sorted(session.engine.data_dependent):
                self.context.set_output_sink(name, self.collector)
        if self.allocator is not None:
            self.context.set_temporary_allocator(self.allocator)

    def reset(self) -> None:
        """Forget cached context state after a failure so the next call sets everything again."""
        self.profile, self.shapes, self.graph, self.graph_io = -1, None, None, None
        self.graph_state = GraphState(failed=self.graph_state.failed)

    def bind(self, feeds: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> None:
        """Point the context's inputs and outputs at these tensors' device addresses."""
        for name, t in feeds.items():
            self.context.set_tensor_address(name, t.data_ptr())
        for name, t in outputs.items():
            self.context.set_tensor_address(name, t.data_ptr())

    def enqueue(self, feeds: dict, outputs: dict) -> None:
        """Bind, then enqueue one inference on the lane stream; RuntimeError if the enqueue fails."""
        self.bind(feeds, outputs)
        if not self.context.execute_async(self.stream.cuda_stream):
            raise RuntimeError(f"{self.label}: enqueue failed on lane {self.index} (see the TensorRT log)")


class SessionClosedError(UserError, RuntimeError):
    """A call on a session after :meth:`Session.close` (or the end of its ``with`` block): the caller's to
    fix (exit code 2 from the CLI). Still a RuntimeError, as this error was before, so ``except
    RuntimeError`` keeps catching it."""


def _closed(label: str) -> SessionClosedError:
    return SessionClosedError(
        f"{label}: the session is closed (its close() ran, or its `with` block ended) and runs nothing "
        "more; open a new one with engine.session(...), on an engine from trtforge.runtime.load(path)."
    )


class Session:
    """Runs one engine on `streams` lanes; thread-safe. Create with :meth:`Engine.session`."""

    def __init__(
        self,
        engine: SessionEngine,
        streams: int = 1,
        *,
        device: Any = None,
        cuda_graphs: bool = False,
        graph_warmup: int = 1,
        aux_streams: int | None = None,
        torch_allocator: bool = False,
    ):
        from trtforge.runtime._device import make_device

        streams = engine.layout.check_lanes(streams, engine=engine.label)
        _check_options(cuda_graphs, graph_warmup, aux_streams, torch_allocator)
        self.engine = engine
        self.device = make_device(engine.default_device if device is None else device)
        if self.device.kind == "cpu" and not engine.host_capable:
            raise UserError(f"{engine.label}: a TensorRT engine runs on a CUDA device, not on 'cpu'.")
        self.cuda_graphs = cuda_graphs and self.device.kind == "cuda"
        self.graph_warmup = int(graph_warmup)
        self.torch_allocator = torch_allocator
        aux = engine.handle.num_aux_streams if aux_streams is None else int(aux_streams)
        self._out_cache: dict[tuple, tuple[int, tuple[tuple[int, ...], ...]]] = {}
        self._lanes = [_Lane(i, self, aux) for i in range(streams)]
        self._free: queue.SimpleQueue[_Lane] = queue.SimpleQueue()
        for lane in self._lanes:
            self._free.put(lane)
        self._completers = [Completer(f"trtforge-lane{i}") for i in range(streams)]
        self._closed = threading.Event()  # set by close() and by the finalizer of a dropped session
        self._all_lanes = threading.Lock()  # one taker of every lane at a time (trim, close)
        # closed when dropped unclosed too: its arenas (raw caching-allocator blocks) and waiter threads
        # were never freed, and a session opened per request leaked both
        self._finalizer = weakref.finalize(
            self, _shut_down, self._closed, self._lanes, self._free, self._completers, self._all_lanes
        )
        self.contiguous_copies = 0
        self.graph_failures: list[str] = []

    # -- public API -----------------------------------------------------------------------------------
    @property
    def streams(self) -> int:
        """Number of lanes (execution contexts / CUDA streams)."""
        return len(self._lanes)

    @checked_call
    def run(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, Any]:
        """Run one inference; returns outputs ordered after the caller's current stream (torch semantics)."""
        base, shapes, prepared, to_numpy = self._prepare(inputs)
        caller = self.device.current_stream()
        lane = self._acquire()
        try:
            result = self._execute(lane, base, shapes, prepared, outputs, caller)
            lane.done.record(lane.stream)
            caller.wait_event(lane.done)
            if to_numpy:
                host = self._host_copies(lane, result)
                lane.stream.synchronize()
                result = {n: v.numpy() for n, v in host.items()}
        except BaseException:
            lane.reset()
            raise
        finally:
            self._free.put(lane)
        return result

    @checked_call
    def submit(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor] | None = None
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Enqueue one inference on the next free lane and return at once; the future resolves when its
        outputs are complete (on any stream). Bad input raises UserError here, in the calling thread.

        The lane is free for the next request as soon as this one is enqueued (its stream keeps the order),
        so one thread can keep every lane busy.
        """
        base, shapes, prepared, to_numpy = self._prepare(inputs)
        caller = self.device.current_stream()
        lane = self._acquire()
        try:
            result = self._execute(lane, base, shapes, prepared, outputs, caller)
            keep = (prepared, lane.last_feeds, result)  # alive until the work has finished
            host = self._host_copies(lane, result) if to_numpy else None
            done = self.device.new_event()
            done.record(lane.stream)
            # queued while the lane is held: once close() holds every lane, every future is queued
            if host is not None:
                return self._completers[lane.index].put(
                    done, lambda: {n: v.numpy() for n, v in host.items()}, keep
                )
            return self._completers[lane.index].put(done, lambda: result, keep)
        except BaseException:
            lane.reset()
            raise
        finally:
            self._free.put(lane)

    @checked_call
    def memory_needed(self, inputs: Mapping[str, Any]) -> int:
        """Device memory (bytes) one lane needs for these input shapes; reads metadata only, runs nothing."""
        if self._closed.is_set():
            raise _closed(self.engine.label)
        base, shapes = self.engine.validator.validate(inputs)
        key = (base, shapes)
        if key not in self._out_cache:
            lane = self._acquire()
            try:
                self._resolve(lane, base, shapes)
            except BaseException:
                lane.reset()
                raise
            finally:
                self._free.put(lane)
        return self._out_cache[key][0]

    def memory_stats(self) -> dict[str, Any]:
        """Arena sizes and growth per lane, pinned staging, graphs, output and allocator traffic (read from
        copies of what submits on other threads may add to meanwhile)."""
        lanes = []
        for lane in self._lanes:
            st = lane.arena.stats
            lanes.append(
                {
                    "lane": lane.index,
                    "calls": lane.calls,
                    "arena_bytes": st.capacity,
                    "arena_peak_request": st.peak_request,
                    "arena_last_request": st.last_request,
                    "arena_grow_count": st.grow_count,
                    "arena_trim_count": st.trim_count,
                    "pinned_bytes": sum(t.numel() for t in list(lane.pinned.values())),
                    "graph_captured": lane.graph is not None,
                    "dds_reallocations": lane.collector.reallocations if lane.collector else 0,
                    "torch_allocator_live_bytes": lane.allocator.live_bytes if lane.allocator else 0,
                }
            )
        return {
            "streams": self.streams,
            "arena_bytes": sum(x["arena_bytes"] for x in lanes),
            "arena_grow_count": sum(x["arena_grow_count"] for x in lanes),
            "pinned_bytes": sum(x["pinned_bytes"] for x in lanes),
            "contiguous_copies": self.contiguous_copies,
            "graph_failures": list(self.graph_failures),
            "profile_max_bytes": [
                self.engine.device_memory_for_profile(i) for i in range(self.engine.layout.per_copy)
            ],
            "lanes": lanes,
        }

    @checked_call
    def trim(self, keep: int = 0) -> None:
        """Release arena memory above `keep` bytes per lane (waits for each lane to be idle)."""
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise UserError(f"trim(keep={shown(keep)}): keep is a number of bytes, an integer >= 0.")
        if self._closed.is_set():
            raise _closed(self.engine.label)
        with _every_lane(self._lanes, self._free, self._all_lanes) as taken:
            if self._closed.is_set():
                raise _closed(self.engine.label)
            for lane in taken:
                lane.stream.synchronize()
                if lane.arena.trim(keep):
                    lane.graph, lane.graph_io = None, None
                    lane.graph_state = GraphState(failed=lane.graph_state.failed)

    def close(self) -> None:
        """Wait for calls in flight on other threads, resolve every submitted future, then free lane memory;
        the session is unusable afterwards. A session dropped unclosed is closed when it is garbage (and at
        interpreter exit)."""
        self._finalizer()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------------
    def _acquire(self) -> _Lane:
        if self._closed.is_set():
            raise _closed(self.engine.label)
        lane = self._free.get()
        if self._closed.is_set():  # closed while this call waited for a lane
            self._free.put(lane)
            raise _closed(self.engine.label)
        return lane

    def _prepare(self, inputs: Mapping[str, Any]) -> tuple[int, tuple, list, bool]:
        """Validate, then classify inputs: device tensors (made contiguous) or host data to stage."""
        if self._closed.is_set():
            raise _closed(self.engine.label)
        base, shapes = self.engine.validator.validate(inputs)
        prepared = []
        n_host = 0
        dev = self.device
        for spec in self.engine.inputs:
            t = inputs[spec.name]
            if isinstance(t, torch.Tensor):
                if t.get_device() == dev.index if t.is_cuda else dev.kind == "cpu":
                    if not t.is_contiguous():
                        t = t.contiguous()
                        self.contiguous_copies += 1
                    prepared.append((0, t))
                    continue
                if t.device.type != "cpu":
                    raise UserError(
                        f"{self.engine.label}: input '{spec.name}' is on {t.device}, the session runs on "
                        f"{dev.torch_device}; move it there (or pass it as a CPU tensor / NumPy array)."
                    )
                prepared.append((_STAGED, t.contiguous()))
            else:
                n_host += 1
                prepared.append((_STAGED, torch.from_numpy(np.ascontiguousarray(t))))
        return base, shapes, prepared, n_host == len(prepared) and n_host > 0

    def _resolve(self, lane: _Lane, base: int, shapes: tuple) -> None:
        """Profile, input shapes, memory size and output shapes on the lane's context (when they change)."""
        ctx = lane.context
        profile = self.engine.layout.profile_index(lane.index, base)
        if lane.profile != profile:
            ctx.set_optimization_profile(profile, lane.stream.cuda_stream)
            lane.profile, lane.shapes = profile, None
        if lane.shapes != shapes:
            for spec, shape in zip(self.engine.inputs, shapes):
                ctx.set_input_shape(spec.name, shape)
            lane.shapes = shapes
            key = (base, shapes)
            if key not in self._out_cache:
                need = ctx.device_memory_size()
                outs = tuple(ctx.output_shape(o.name) for o in self.engine.outputs)
                self._out_cache[key] = (need, outs)

    def _execute(
        self, lane: _Lane, base: int, shapes: tuple, prepared: list, given: Any, caller: Any
    ) -> dict:
        ctx, eng = lane.context, self.engine
        self._resolve(lane, base, shapes)
        need, out_shapes = self._out_cache[(base, shapes)]
        arena = lane.arena
        arena.ensure(need)
        if lane.bound_memory != (arena.address, arena.capacity):
            ctx.set_device_memory(arena.address, arena.capacity)
            lane.bound_memory = (arena.address, arena.capacity)
        direct = {spec.name: t for spec, (kind, t) in zip(eng.inputs, prepared) if kind != _STAGED}
        outputs = self._outputs(out_shapes, given, direct)
        feeds, copies = self._feeds(lane, prepared, shapes)
        lane.last_feeds = feeds  # staged device inputs must outlive the enqueued work (submit keeps them)
        # Everything the lane reads or writes is ready/allocated on the caller's stream before this event.
        lane.ready.record(caller)
        lane.stream.wait_event(lane.ready)
        if copies:
            self._stage(lane, copies)
        lane.calls += 1
        if not self.cuda_graphs:
            lane.enqueue(feeds, outputs)
        else:
            graph_step(
                lane,
                feeds,
                outputs,
                shapes,
                dynamic_outputs=eng.dynamic_outputs,
                warmup=self.graph_warmup,
                failures=self.graph_failures,
            )
        if lane.collector is not None:
            lane.stream.synchronize()  # data-dependent shapes are known once the work ran (facts §4.5)
            for o in eng.outputs:
                if o.name in eng.data_dependent:
                    outputs[o.name] = lane.collector.take(o.name, o.torch_dtype, caller)
        return outputs

    def _outputs(
        self, out_shapes: tuple, given: Mapping[str, torch.Tensor] | None, inputs: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Caller-provided output tensors (checked, also against `inputs`, the caller's tensors bound as
        inputs as they are) or new ones on the caller's stream."""
        dev = self.device.torch_device
        if not given:
            return {
                spec.name: torch.empty(shape, dtype=spec.torch_dtype, device=dev)
                for spec, shape in zip(self.engine.outputs, out_shapes)
                if spec.name not in self.engine.data_dependent
            }
        if not isinstance(given, Mapping):  # (a list's tensors were printed whole as "unknown output names")
            raise UserError(
                f"{self.engine.label}: outputs must be a dict of output name -> torch.Tensor (or None), got "
                f"{type(given).__name__}; the engine's outputs are {[o.name for o in self.engine.outputs]}."
            )
        unknown = set(given) - {o.name for o in self.engine.outputs}
        if unknown:
            raise UserError(
                f"{self.engine.label}: unknown output name(s) {shown(sorted(unknown, key=str))}; outputs are "
                f"{[o.name for o in self.engine.outputs]}."
            )
        dds = sorted(set(given) & self.engine.data_dependent)
        if dds:
            raise UserError(
                f"{self.engine.label}: output(s) {dds} have data-dependent shapes; they are allocated during "
                "the run and cannot be passed in."
            )
        outputs: dict[str, torch.Tensor] = {}
        for spec, shape in zip(self.engine.outputs, out_shapes):
            if spec.name in self.engine.data_dependent:
                continue  # the collector allocates it during the enqueue
            t = given.get(spec.name)
            if t is None:
                outputs[spec.name] = torch.empty(shape, dtype=spec.torch_dtype, device=dev)
                continue
            if not isinstance(t, torch.Tensor):  # (a NumPy array read as "output tensor 'y' is 2(4, 64)")
                raise UserError(
                    f"{self.engine.label}: output '{spec.name}' is a {type(t).__name__}; the engine writes "
                    f"outputs in place, so pass a torch.Tensor of {spec.dtype}{shape} on {dev} (or none and "
                    "use the returned one)."
                )
            if t.dtype is not spec.torch_dtype or tuple(t.shape) != shape or t.device != dev:
                raise UserError(
                    f"{self.engine.label}: output tensor '{spec.name}' is {str(t.dtype)[6:]}{tuple(t.shape)} "
                    f"on {t.device}; this call needs {spec.dtype}{shape} on {dev}."
                )
            if not t.is_contiguous():
                raise UserError(
                    f"{self.engine.label}: output tensor '{spec.name}' is not contiguous; the engine writes "
                    "outputs in place, so pass a contiguous tensor (or none and use the returned one)."
                )
            outputs[spec.name] = t
        self._refuse_shared_memory({n: t for n, t in outputs.items() if given.get(n) is t}, inputs)
        return outputs

    def _refuse_shared_memory(
        self, outputs: Mapping[str, torch.Tensor], inputs: Mapping[str, torch.Tensor]
    ) -> None:
        """UserError naming both tensors when a caller's output shares memory with an input bound as it is
        or with another output (the same tensor, or overlapping views): the engine writes an output while it
        still reads its inputs, and TensorRT runs no engine in place, so the results would be wrong with no
        error. Both are contiguous here, so each spans [data_ptr, data_ptr + nbytes)."""
        seen = [(f"input '{n}'", t) for n, t in inputs.items()]
        for name, t in outputs.items():
            for other, u in seen:
                if _overlap(t, u):
                    raise UserError(
                        f"{self.engine.label}: output '{name}' shares memory with {other} (the same tensor, "
                        "or overlapping views of one); the engine writes each output while it reads its "
                        "inputs and writes its other outputs, so the results would be wrong. Pass a separate "
                        "tensor for each output (or none and use the returned one)."
                    )
            seen.append((f"output '{name}'", t))

    def _feeds(self, lane: _Lane, prepared: list, shapes: tuple) -> tuple[dict[str, torch.Tensor], list]:
        """Device tensors for every input; host data gets a device buffer now and a pinned copy later."""
        feeds: dict[str, torch.Tensor] = {}
        copies = []
        for spec, (kind, t), shape in zip(self.engine.inputs, prepared, shapes):
            if kind != _STAGED:
                feeds[spec.name] = t
                continue
            dst = torch.empty(shape, dtype=spec.torch_dtype, device=self.device.torch_device)
            feeds[spec.name] = dst
            copies.append((spec.name, t, dst))
        return feeds, copies

    def _stage(self, lane: _Lane, copies: list) -> None:
        """Host -> pinned (CPU copy) -> device (async on the lane stream), reusing per-lane pinned buffers."""
        lane.staged.synchronize()  # the previous copies out of these pinned buffers have finished
        with self.device.use_stream(lane.stream):
            for name, src, dst in copies:
                nbytes = src.numel() * src.element_size()
                pinned = lane.pinned.get(name)
                if pinned is None or pinned.numel() < nbytes:
                    pinned = lane.pinned[name] = self.device.pinned(max(nbytes, 1))
                host = pinned[:nbytes].view(src.dtype).view(src.shape)
                host.copy_(src)
                dst.copy_(host, non_blocking=True)
        lane.staged.record(lane.stream)

    def _host_copies(self, lane: _Lane, result: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Enqueue device -> pinned host copies of the outputs on the lane stream (valid after it syncs)."""
        host = {}
        with self.device.use_stream(lane.stream):
            for name, t in result.items():
                nbytes = t.numel() * t.element_size()
                view = self.device.pinned(max(nbytes, 1))[:nbytes].view(t.dtype).view(t.shape)
                view.copy_(t, non_blocking=True)
                host[name] = view
        return host


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when contiguous tensors `a` and `b` share a byte of the same device's memory."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


@contextlib.contextmanager
def _every_lane(lanes: list[_Lane], free: queue.SimpleQueue, lock: threading.Lock) -> Iterator[list[_Lane]]:
    """Hold every lane (calls in flight on other threads finish enqueuing first), then give them back.

    One taker at a time: two takers each holding some lanes and waiting for the other's would wait forever.
    """
    with lock:
        taken: list[_Lane] = []
        try:
            for _ in lanes:  # one by one: a Ctrl-C while waiting for the next gives back those taken
                taken.append(free.get())
            yield taken
        finally:
            for lane in taken:
                free.put(lane)


def _shut_down(
    closed: threading.Event,
    lanes: list[_Lane],
    free: queue.SimpleQueue,
    completers: list[Completer],
    lock: threading.Lock,
) -> None:
    """What :meth:`Session.close` does, once (also for a session that is garbage): wait for calls in flight,
    resolve every queued future, then synchronize each lane and free its arena."""
    closed.set()  # a call that gets a lane after this refuses it (Session._acquire)
    with _every_lane(lanes, free, lock) as taken:
        for completer in completers:
            completer.close()
        for lane in taken:
            lane.stream.synchronize()
            lane.graph, lane.graph_io = None, None
            lane.arena.release()


__all__ = ["Session"]
