"""Python's cyclic garbage collector paused while a CUDA graph is captured.

A collection that runs inside a capture (any allocation of Python objects can trigger one) may free
an unreachable ``torch.cuda.CUDAGraph`` of an earlier executor or session. Its destructor destroys the
graph's executable, which CUDA does not permit while a stream captures, and the capture in progress is
then invalidated: the step that captured fails. torch >= 2.9 no longer collects before a capture
(pytorch/pytorch#161037), so every capture in trtforge runs inside :func:`gc_paused`; the garbage is
collected after it instead.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = True


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic garbage collection inside this block, in any thread; nested and concurrent blocks
    resume it (if it was on) when the last one ends."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
