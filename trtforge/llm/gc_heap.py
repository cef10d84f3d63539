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
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_holders = 0


def freeze() -> None:
    """Collect, then freeze every object alive now (:func:`gc.freeze`); one :func:`thaw` per call."""
    global _holders
    with _lock:
        gc.collect()
        gc.freeze()
        _holders += 1


def thaw() -> None:
    """Let go of one :func:`freeze`; the last one moves the frozen objects back into the collected heap."""
    global _holders
    with _lock:
        if _holders <= 0:
            raise RuntimeError("gc_heap.thaw() without a matching freeze()")
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()


def holders() -> int:
    """How many :func:`freeze` calls are not yet thawed."""
    return _holders
