"""Keep Python's full garbage collections short while an engine serves: the heap alive at its start is frozen.

A serving process holds a large, long-lived heap (torch, transformers, Triton's launchers, the captured
graphs' Python objects): 200 k objects after importing torch and transformers alone, and a full (oldest
generation) collection walks all of them, 0.1 s on the CPU box. CPython runs one whenever enough objects
have survived into the oldest generation, which a running batch's requests do, and the collection holds
the GIL, so the engine thread launches nothing meanwhile: the device idles. ``gc.freeze()`` moves every
live object into a permanent generation that collections skip (vLLM's engine does the same at start-up).

:func:`freeze` collects first (cycles that are garbage already are freed, not frozen), then freezes;
:func:`thaw` undoes it when the last holder lets go, so that objects frozen while an engine ran (an
executor dropped since, say) become collectable again once no engine needs the freeze.

The freeze does not make full collections short enough by itself. A collection traverses every
container it walks element by element, and a serving heap's young containers are large: each request's
token lists (1,000 requests of 1,000 + 1,000 tokens: 2 M references). On the H200 an 8B FP8 run's full
collections walked ~28k unfrozen objects, freed nothing, and took 40-150 ms each, one every 3-5 s
(BENCHMARKS.md, session 39). So while an engine holds the freeze, a full collection waits for
:data:`MIDDLE_COLLECTIONS_PER_FULL` middle-generation ones instead of CPython's 10: a tenth as many, for
garbage cycles that live a few tens of seconds longer.
"""

from __future__ import annotations

import gc
import threading

# Middle-generation collections between two full ones while a freeze is held (CPython's threshold2: 10).
MIDDLE_COLLECTIONS_PER_FULL = 100

_lock = threading.Lock()
_holders = 0
_thresholds: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (before the first freeze, as set by it)


def freeze() -> None:
    """Collect, then freeze every object alive now (:func:`gc.freeze`), and space full collections out
    (:data:`MIDDLE_COLLECTIONS_PER_FULL`); one :func:`thaw` per call."""
    global _holders
    with _lock:
        gc.collect()
        gc.freeze()
        if _holders == 0:
            before = gc.get_threshold()
            if len(before) == 3 and before[2] < MIDDLE_COLLECTIONS_PER_FULL:
                gc.set_threshold(before[0], before[1], MIDDLE_COLLECTIONS_PER_FULL)
            _thresholds.append((before, gc.get_threshold()))
        _holders += 1


def thaw() -> None:
    """Let go of one :func:`freeze`; the last one moves the frozen objects back into the collected heap
    and puts back the collection thresholds (unless something else has changed them since)."""
    global _holders
    with _lock:
        if _holders <= 0:
            raise RuntimeError("gc_heap.thaw() without a matching freeze()")
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()
            before, ours = _thresholds.pop()
            if gc.get_threshold() == ours:
                gc.set_threshold(*before)


def holders() -> int:
    """How many :func:`freeze` calls are not yet thawed."""
    return _holders
