"""Python-side allocators handed to a context: data-dependent outputs and TensorRT's own allocations.

Both are plain classes; :mod:`trtforge.runtime.trt_context` wraps them in TensorRT's ``IOutputAllocator`` /
``IGpuAllocator`` interfaces (tensorrt-facts.md §4.5, §4.6) and the stand-in calls them directly.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from trtforge.runtime.arena import ALIGNMENT


class OutputCollector:
    """Receives data-dependent outputs for one lane: a fresh device buffer per output per call.

    A fresh buffer per call lets the caller keep the returned tensor while the lane runs the next request.
    Buffers come from torch's caching allocator on the lane's stream (the enqueue may run after the caller's
    stream was last synchronized with) and are marked as used on the caller's stream when handed over, so the
    allocator never reuses them early. :meth:`take` turns the buffer into the output.
    """

    def __init__(self, device: Any, stream: Any):
        self._device = device
        self._stream = stream
        self._buffers: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self.reallocations = 0

    def reallocate(self, name: str, size: int, alignment: int) -> int:
        """Allocate `size` bytes for output `name` (alignment <= 256 is what torch guarantees)."""
        if alignment > ALIGNMENT:
            return 0
        with self._device.use_stream(self._stream):
            buf = torch.empty(max(int(size), 1), dtype=torch.uint8, device=self._device.torch_device)
        self._buffers[name] = buf
        self.reallocations += 1
        return buf.data_ptr()

    def notify_shape(self, name: str, shape: Sequence[int]) -> None:
        """Record the final shape of `name`."""
        self._shapes[name] = tuple(int(d) for d in shape)

    def take(self, name: str, dtype: torch.dtype, caller_stream: Any) -> torch.Tensor:
        """Output `name` of the last call as a `dtype` tensor (raises if the context never wrote it)."""
        buf = self._buffers.pop(name, None)
        shape = self._shapes.pop(name, None)
        if shape is None:
            raise RuntimeError(f"the engine did not report a shape for data-dependent output '{name}'")
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        if numel == 0:
            return torch.empty(shape, dtype=dtype, device=self._device.torch_device)
        if buf is None or buf.numel() < nbytes:
            raise RuntimeError(f"data-dependent output '{name}' of shape {shape} has no buffer large enough")
        self._device.record_stream(buf, caller_stream)
        return buf[:nbytes].view(dtype).view(shape)


class TorchAllocator:
    """Routes TensorRT's own allocations to torch's caching allocator on a given stream (facts §4.6).

    Stream-ordered on the lane's stream (torch's allocator is stream-ordered; allocating on the stream that
    runs the enqueue is the design choice recorded in facts §4.6). Thread-safe: callbacks may come from any
    thread holding the GIL.
    """

    def __init__(self, device: Any, stream: Any):
        self._device = device
        self._stream = stream
        self._live: dict[int, int] = {}
        self._lock = threading.Lock()
        self.allocations = 0
        self.peak_bytes = 0

    def allocate(self, size: int, alignment: int) -> int:
        """Return an address of `size` bytes, or 0 for a zero-size request or an unsupported alignment."""
        if size <= 0 or alignment > ALIGNMENT:
            return 0
        address = self._device.alloc(int(size), self._stream)
        with self._lock:
            self._live[address] = int(size)
            self.allocations += 1
            self.peak_bytes = max(self.peak_bytes, sum(self._live.values()))
        return address

    def deallocate(self, address: int) -> bool:
        """Free an address from :meth:`allocate`; False if it is not ours."""
        with self._lock:
            if self._live.pop(int(address), None) is None:
                return False
        self._device.free(int(address))
        return True

    @property
    def live_bytes(self) -> int:
        """Bytes currently allocated through this allocator."""
        with self._lock:
            return sum(self._live.values())


__all__ = ["OutputCollector", "TorchAllocator"]
