"""Per-lane device-memory arena for a context's activations (user-managed memory, facts §4.2).

Each lane owns one arena because a context's device memory is in use from enqueue until the work finishes,
and sharing it with a concurrently running context is undefined behaviour (tensorrt-facts.md §4.2). The
arena grows only when a call needs more than it holds (to the request, 256-byte aligned), never shrinks on
its own, and can be trimmed. Blocks come from torch's caching allocator, stream-ordered on the lane's
stream, so a freed block is never reused before the lane's queued work that used it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALIGNMENT = 256


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """Round `n` up to a multiple of `alignment`."""
    return (n + alignment - 1) // alignment * alignment


@dataclass
class ArenaStats:
    """What one arena did: current size, largest request, and how often it moved."""

    capacity: int = 0
    peak_request: int = 0
    last_request: int = 0
    grow_count: int = 0
    trim_count: int = 0
    generation: int = 0  # bumps whenever the address changes (graphs captured over it are stale)


class Arena:
    """Grow-only device scratch for one lane; not thread-safe (a lane is used by one thread at a time)."""

    def __init__(self, device: Any, stream: Any):
        self._device = device
        self._stream = stream
        self.address = 0
        self.stats = ArenaStats()

    @property
    def capacity(self) -> int:
        """Bytes currently held."""
        return self.stats.capacity

    def ensure(self, nbytes: int) -> bool:
        """Make at least `nbytes` available; True when the address changed (rebind the context)."""
        st = self.stats
        st.last_request = nbytes
        if nbytes > st.peak_request:
            st.peak_request = nbytes
        if nbytes <= st.capacity:
            return False
        size = align_up(nbytes)
        new = self._device.alloc(size, self._stream)
        if self.address:
            self._device.free(self.address)
        self.address = new
        st.capacity = size
        st.grow_count += 1
        st.generation += 1
        return True

    def trim(self, keep: int = 0) -> bool:
        """Release memory above `keep` bytes (0: all); True when the address changed."""
        st = self.stats
        if st.capacity <= keep:
            return False
        if self.address:
            self._device.free(self.address)
        self.address = 0
        st.capacity = 0
        st.trim_count += 1
        st.generation += 1
        if keep:
            self.address = self._device.alloc(align_up(keep), self._stream)
            st.capacity = align_up(keep)
        return True

    def release(self) -> None:
        """Free everything (session close)."""
        if self.address:
            self._device.free(self.address)
        self.address = 0
        self.stats.capacity = 0


__all__ = ["ALIGNMENT", "Arena", "ArenaStats", "align_up"]
