"""The garbage collector's pauses inside a timed window (``gc.callbacks``), for the serving benchmarks.

A full collection walks every tracked object of the process while holding the GIL; in a process that has
loaded a model and captured its graphs that is 0.1 s or more, during which the engine launches nothing.
Knowing how many ran inside a window, and how long they took, tells a stall from a slow kernel.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from typing import Any


class GcWatch:
    """Records each collection (generation, start offset, seconds) between ``__enter__`` and ``__exit__``.

    ``diagnose=True`` also says what each full collection walked and freed: the unfrozen objects of the
    oldest generation when it began, and the types of the garbage it found. The garbage is kept
    (``gc.DEBUG_SAVEALL``) and freed after the pause is timed, so a diagnosed pause leaves out the
    deallocation: set beside an undiagnosed run's pauses, the difference is what freeing costs."""

    def __init__(self, diagnose: bool = False) -> None:
        self.events: list[tuple[int, float, float]] = []
        self.diagnosis: list[dict[str, Any]] = []
        self.diagnose = diagnose
        self._started: dict[int, float] = {}
        self._walked = 0
        self._t0 = 0.0
        self.frozen = 0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        thread = threading.get_ident()
        full = int(info["generation"]) == 2
        if phase == "start":
            if self.diagnose and full:
                self._walked = len(gc.get_objects(2))  # before the clock starts: not part of the pause
                gc.set_debug(gc.get_debug() | gc.DEBUG_SAVEALL)
            self._started[thread] = time.perf_counter()
            return
        now = time.perf_counter()
        if thread not in self._started:
            return
        begun = self._started.pop(thread)
        self.events.append((int(info["generation"]), begun - self._t0, now - begun))
        if self.diagnose and full:
            gc.set_debug(gc.get_debug() & ~gc.DEBUG_SAVEALL)
            garbage, gc.garbage[:] = list(gc.garbage), []
            kinds = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in garbage)
            self.diagnosis.append(
                {
                    "at_s": begun - self._t0,
                    "seconds": now - begun,
                    "thread": threading.current_thread().name,
                    "unfrozen_objects": self._walked,
                    "garbage": len(garbage),
                    "garbage_types": kinds.most_common(12),
                }
            )
            del garbage  # freed here, after the pause was timed

    def __enter__(self) -> GcWatch:
        self._t0 = time.perf_counter()
        self.frozen = gc.get_freeze_count()  # the objects the collections skip in this window
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)
        if self.diagnose:
            gc.set_debug(gc.get_debug() & ~gc.DEBUG_SAVEALL)

    def summary(self, until_s: float | None = None) -> dict[str, Any]:
        """Collections and seconds by generation, the longest pause, and every full collection's time;
        those that began within `until_s` of the start, where given (and, diagnosed, what each walked
        and freed)."""
        events = [e for e in self.events if until_s is None or e[1] <= until_s]
        by_gen = {g: [s for gen, _, s in events if gen == g] for g in (0, 1, 2)}
        out = {
            "collections": {str(g): len(v) for g, v in by_gen.items()},
            "seconds": {str(g): sum(v) for g, v in by_gen.items()},
            "max_pause_s": max((s for *_, s in events), default=0.0),
            "full": [{"at_s": at, "seconds": s} for gen, at, s in events if gen == 2],
            "frozen_objects": self.frozen,
        }
        if self.diagnose:
            out["diagnosis"] = [d for d in self.diagnosis if until_s is None or d["at_s"] <= until_s]
        return out


def describe(summary: dict[str, Any]) -> str:
    """One line: the full collections in the window and what they cost."""
    full = summary["full"]
    total = sum(e["seconds"] for e in full)
    return (
        f"gc: {len(full)} full collection(s) {total * 1e3:.0f} ms in the window "
        f"(longest pause {summary['max_pause_s'] * 1e3:.0f} ms; {summary['frozen_objects']:,} objects frozen)"
    ) + _diagnosis_text(summary.get("diagnosis"))


def _diagnosis_text(diagnosis: list[dict[str, Any]] | None) -> str:
    """`--gc-diagnose`'s part of the line: what the full collections walked and freed (medians)."""
    if not diagnosis:
        return ""
    walked = sorted(d["unfrozen_objects"] for d in diagnosis)[len(diagnosis) // 2]
    freed = sorted(d["garbage"] for d in diagnosis)[len(diagnosis) // 2]
    pause = sorted(d["seconds"] for d in diagnosis)[len(diagnosis) // 2]
    kinds: Counter[str] = Counter()
    for d in diagnosis:
        kinds.update(dict(d["garbage_types"]))
    top = ", ".join(f"{name} {n:,}" for name, n in kinds.most_common(4))
    return (
        f"; diagnosed: each walked ~{walked:,} unfrozen objects and freed ~{freed:,} "
        f"in {pause * 1e3:.1f} ms, deallocation left out (freed in all: {top or 'nothing'})"
    )
