"""CUDA-graph capture and replay for one lane, driven by the pure decision in _graph_state.

A graph is captured over lane-owned static input/output buffers after a plain warm-up enqueue, replayed
while the shapes (and the lane's device memory) stay the same, and dropped when they change (facts §4.7).
Engines with data-dependent outputs are never captured. A capture that fails is recorded in the
session's ``graph_failures`` list and that shape stays eager. Binding and plain enqueues are the lane's
own methods (``lane.bind``/``lane.enqueue``), so this module never imports the session.

Captures call ``CUDAGraph.capture_begin/capture_end`` directly: ``torch.cuda.graph`` synchronizes the
whole device and empties the allocator cache on entry, which stalls every other lane of a serving
process and can break a capture another lane's thread has in progress (the likely cause of one
H200 run in which no lane of a 4-thread session ended with a graph; not isolated). Captures are
also serialized in the process, a cheap precaution: they happen once per lane and shape.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from trtforge.core.cuda_capture import gc_paused
from trtforge.runtime._graph_state import GraphAction, decide, record_failed

_CAPTURE_LOCK = threading.Lock()  # one stream capture at a time in this process (see above)


def graph_step(
    lane: Any,
    feeds: dict,
    outputs: dict,
    key: tuple,
    *,
    dynamic_outputs: bool,
    warmup: int,
    failures: list[str],
) -> None:
    """Eager, warm-up, record or replay, as the pure decision function says; failed captures go to `failures`.

    `dynamic_outputs` and `warmup` are the engine's and session's settings; `failures` is the session's list.
    """
    decision = decide(
        lane.graph_state,
        key,
        enabled=True,
        memory_generation=lane.arena.stats.generation,
        dynamic_outputs=dynamic_outputs,
        warmup=warmup,
    )
    if decision.drop:
        lane.graph, lane.graph_io = None, None
    lane.graph_state = decision.state
    if decision.action is GraphAction.REPLAY:
        _replay(lane, feeds, outputs)
    elif decision.action is GraphAction.RECORD:
        _record(lane, feeds, outputs, key, failures)
    else:
        lane.enqueue(feeds, outputs)


def _record(lane: Any, feeds: dict, outputs: dict, key: tuple, failures: list[str]) -> None:
    """Capture one enqueue into a CUDA graph over lane-owned static buffers, then launch it."""
    with torch.cuda.stream(lane.stream):
        static_in = {n: torch.empty_like(t) for n, t in feeds.items()}
        static_out = {n: torch.empty_like(t) for n, t in outputs.items()}
    lane.bind(static_in, static_out)
    graph = torch.cuda.CUDAGraph()
    ok = lane.context.graph_capturable(lane.stream.cuda_stream)
    if ok:
        try:
            with _CAPTURE_LOCK, gc_paused(), torch.cuda.stream(lane.stream):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    ok = lane.context.execute_async(lane.stream.cuda_stream)
                finally:
                    graph.capture_end()
        except RuntimeError as e:
            # Not capturable (facts §4.7): recorded in memory_stats, this key stays eager.
            failures.append(f"lane {lane.index}, shapes {key}: {e}")
            ok = False
    if not ok:
        lane.graph_state = record_failed(lane.graph_state, key)
        lane.enqueue(feeds, outputs)
        return
    lane.graph, lane.graph_io = graph, (static_in, static_out)
    _replay(lane, feeds, outputs)


def _replay(lane: Any, feeds: dict, outputs: dict) -> None:
    """Copy inputs into the static buffers, launch the graph, copy the static outputs out (lane stream)."""
    static_in, static_out = lane.graph_io  # type: ignore[misc]
    with torch.cuda.stream(lane.stream):
        for n, t in feeds.items():
            static_in[n].copy_(t, non_blocking=True)
        lane.graph.replay()
        for n, t in outputs.items():
            t.copy_(static_out[n], non_blocking=True)
