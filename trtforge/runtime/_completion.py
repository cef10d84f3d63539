"""Resolve submit() futures when their GPU work has finished, one waiter thread per lane.

A lane's requests finish in the order they were enqueued on its stream, so a FIFO per lane matches
the GPU's own order. The waiter blocks in ``event.synchronize()`` (which releases the GIL), then builds
the result and resolves the future. The submitting thread never waits: it enqueues and returns.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any


class Completer:
    """FIFO of (event, future, finish, keep-alive) for one lane, drained by a lazily started thread."""

    def __init__(self, name: str):
        self._name = name
        self._queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, event: Any, finish: Callable[[], Any], keep: Any) -> concurrent.futures.Future:
        """A running future resolved with `finish()` once `event` completes; `keep` lives until then."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # the work is already enqueued: it cannot be cancelled
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                    self._thread.start()
        self._queue.put((event, future, finish, keep))
        return future

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            event, future, finish, _keep = item
            try:
                event.synchronize()
                future.set_result(finish())
            except BaseException as e:  # delivered to the caller through the future
                future.set_exception(e)

    def close(self) -> None:
        """Resolve everything queued, then stop the thread (called from the thread itself, from a future's
        done-callback, it stops after what is queued, unjoined: a thread cannot join itself)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            if thread is not threading.current_thread():
                thread.join()
