"""The garbage collector's pauses inside a timed window (``gc.callbacks``), for the serving benchmarks.

A full collection walks every tracked object of the process while holding the GIL; in a process that has
loaded a model and captured its graphs that is 0.1 s or more, during which the engine launches nothing.
Knowing how many ran inside a window, and how long they took, tells a stall from a slow kernel.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any


class GcWatch:
    """Records each collection (generation, start offset, seconds) between ``__enter__`` and ``__exit__``."""

    def __init__(self) -> None:
        self.events: list[tuple[int, float, float]] = []
        self._started: dict[int, float] = {}
        self._t0 = 0.0
        self.frozen = 0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        thread = threading.get_ident()
        if phase == "start":
            self._started[thread] = now
        elif thread in self._started:
            begun = self._started.pop(thread)
            self.events.append((int(info["generation"]), begun - self._t0, now - begun))

    def __enter__(self) -> GcWatch:
        self._t0 = time.perf_counter()
        self.frozen = gc.get_freeze_count()  # the objects the collections skip in this window
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self, until_s: float | None = None) -> dict[str, Any]:
        """Collections and seconds by generation, the longest pause, and every full collection's time;
        those that began within `until_s` of the start, where given."""
        events = [e for e in self.events if until_s is None or e[1] <= until_s]
        by_gen = {g: [s for gen, _, s in events if gen == g] for g in (0, 1, 2)}
        return {
            "collections": {str(g): len(v) for g, v in by_gen.items()},
            "seconds": {str(g): sum(v) for g, v in by_gen.items()},
            "max_pause_s": max((s for *_, s in events), default=0.0),
            "full": [{"at_s": at, "seconds": s} for gen, at, s in events if gen == 2],
            "frozen_objects": self.frozen,
        }


def describe(summary: dict[str, Any]) -> str:
    """One line: the full collections in the window and what they cost."""
    full = summary["full"]
    total = sum(e["seconds"] for e in full)
    return (
        f"gc: {len(full)} full collection(s) {total * 1e3:.0f} ms in the window "
        f"(longest pause {summary['max_pause_s'] * 1e3:.0f} ms; {summary['frozen_objects']:,} objects frozen)"
    )
