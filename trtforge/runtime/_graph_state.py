"""CUDA-graph record/replay/reset decisions as a pure function (testable without a GPU).

One graph per lane at most: a captured graph freezes shapes, tensor addresses and the profile, so it is
dropped when the shape key changes or the lane's device memory moves (tensorrt-facts.md §4.7). NVIDIA
warms up with one plain enqueue before capturing ("avoid capturing initialization calls"), so a key is
recorded only after `warmup` eager calls in a row with that key. Engines with data-dependent output shapes
(an IOutputAllocator) are never captured, and a key whose capture failed is not tried again.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field, replace


class GraphAction(enum.Enum):
    """What the lane does for this call."""

    EAGER = "eager"  # plain enqueue, no graph involvement
    WARMUP = "warmup"  # plain enqueue that counts towards recording this key
    RECORD = "record"  # drop any graph, capture this key, then launch it
    REPLAY = "replay"  # launch the captured graph


@dataclass(frozen=True)
class GraphState:
    """Per-lane graph bookkeeping; replaced, never mutated."""

    key: Hashable | None = None  # key of the captured graph, or of the key being warmed up
    captured: bool = False
    warm_calls: int = 0
    memory_generation: int = 0  # lane device-memory generation the graph was captured with
    failed: frozenset = field(default_factory=frozenset)


@dataclass(frozen=True)
class GraphDecision:
    """The action, whether an existing graph must be dropped first, and the state after the call."""

    action: GraphAction
    drop: bool
    state: GraphState


def decide(
    state: GraphState,
    key: Hashable,
    *,
    enabled: bool,
    memory_generation: int,
    dynamic_outputs: bool = False,
    warmup: int = 1,
) -> GraphDecision:
    """Decide how the next call with shape key `key` runs; pure: returns the new state, mutates nothing."""
    if not enabled or dynamic_outputs or key in state.failed:
        drop = state.captured
        keep = GraphState(failed=state.failed) if drop else state
        return GraphDecision(GraphAction.EAGER, drop, keep)
    if state.captured and state.key == key and state.memory_generation == memory_generation:
        return GraphDecision(GraphAction.REPLAY, False, state)
    drop = state.captured
    warm = state.warm_calls + 1 if state.key == key and state.memory_generation == memory_generation else 1
    if state.captured and state.key == key:
        # Same shapes but the device memory moved: recapture right away, the key is already warm.
        warm = warmup + 1
    if warm > warmup:
        return GraphDecision(
            GraphAction.RECORD,
            drop,
            GraphState(
                key=key,
                captured=True,
                warm_calls=warm,
                memory_generation=memory_generation,
                failed=state.failed,
            ),
        )
    return GraphDecision(
        GraphAction.WARMUP,
        drop,
        GraphState(
            key=key, captured=False, warm_calls=warm, memory_generation=memory_generation, failed=state.failed
        ),
    )


def record_failed(state: GraphState, key: Hashable) -> GraphState:
    """State after a capture of `key` failed: no graph, and `key` stays eager from now on."""
    return replace(state, key=None, captured=False, warm_calls=0, failed=state.failed | {key})


__all__ = ["GraphAction", "GraphDecision", "GraphState", "decide", "record_failed"]
