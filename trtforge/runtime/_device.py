"""Device primitives the session uses: streams, events, raw allocations, pinned staging, pointer views.

:class:`CudaDevice` is the real thing (torch CUDA streams and the caching allocator). :class:`HostDevice`
runs the same session code on the CPU with no-op streams so the machinery (validation, lanes, arenas,
output binding, futures) is covered by CPU tests with the stand-in; it is not a production path.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import numpy as np
import torch


class _CudaArray:
    """Exposes a raw device range through __cuda_array_interface__ (version 2: no stream sync)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "strides": None,
            "version": 2,
        }


class CudaDevice:
    """torch CUDA: one device index, streams, events and the caching allocator."""

    kind = "cuda"

    def __init__(self, index: int = 0):
        self.index = index
        self.torch_device = torch.device("cuda", index)

    def new_stream(self) -> torch.cuda.Stream:
        """A new non-default stream (TensorRT syncs the device on the default stream, facts §4.2)."""
        return torch.cuda.Stream(self.torch_device)

    def current_stream(self) -> torch.cuda.Stream:
        """The calling thread's current stream on this device."""
        return torch.cuda.current_stream(self.torch_device)

    def new_event(self) -> torch.cuda.Event:
        """A timing-free event (cheaper to record)."""
        return torch.cuda.Event()

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make `stream` current for torch allocations and ops in the block."""
        return torch.cuda.stream(stream)

    def alloc(self, nbytes: int, stream: Any) -> int:
        """Raw bytes from torch's caching allocator, stream-ordered on `stream`."""
        return int(torch.cuda.caching_allocator_alloc(nbytes, self.index, stream))

    def free(self, address: int) -> None:
        """Return an `alloc` block to the caching allocator (reused in `stream` order)."""
        torch.cuda.caching_allocator_delete(address)

    def pinned(self, nbytes: int) -> torch.Tensor:
        """Page-locked host bytes for asynchronous copies."""
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def view(self, address: int, nbytes: int) -> torch.Tensor:
        """A uint8 tensor over `nbytes` of device memory at `address` (no ownership)."""
        return torch.as_tensor(_CudaArray(address, nbytes), device=self.torch_device)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        """Tell the caching allocator `t` is used on `stream` too."""
        t.record_stream(stream)


class _HostStream:
    cuda_stream = 0

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event or _HostEvent()


class _HostEvent:
    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class HostDevice:
    """CPU stand-in for CudaDevice: same calls, synchronous, handles are plain host pointers (tests)."""

    kind = "cpu"

    def __init__(self) -> None:
        self.index = -1
        self.torch_device = torch.device("cpu")
        self._blocks: dict[int, torch.Tensor] = {}
        self._next_handle = 1

    def new_stream(self) -> _HostStream:
        s = _HostStream()
        s.cuda_stream = self._next_handle
        self._next_handle += 1
        return s

    def current_stream(self) -> _HostStream:
        return _HostStream()

    def new_event(self) -> _HostEvent:
        return _HostEvent()

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def alloc(self, nbytes: int, stream: Any) -> int:
        t = torch.empty(nbytes + 255, dtype=torch.uint8)
        address = (t.data_ptr() + 255) // 256 * 256  # cudaMalloc-like 256-byte alignment
        self._blocks[address] = t
        return address

    def free(self, address: int) -> None:
        del self._blocks[address]

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def view(self, address: int, nbytes: int) -> torch.Tensor:
        buf = (ctypes.c_uint8 * nbytes).from_address(address)
        return torch.from_numpy(np.frombuffer(buf, dtype=np.uint8))

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        pass


Device = CudaDevice | HostDevice


def make_device(device: str | int | torch.device | None, what: str = "device") -> Device:
    """'cuda', 'cuda:1', 1, torch.device or None (-> cuda:0) -> CudaDevice; 'cpu' -> HostDevice (tests).

    Anything else, or a GPU index this machine does not have, is a UserError naming `what`
    (:func:`trtforge.core.devices.resolve_device`), before any stream or context is made.
    """
    from trtforge.core.devices import resolve_device

    if device is None:
        device = 0
    if isinstance(device, str | torch.device) and str(device) == "cpu":
        return HostDevice()
    d = resolve_device(
        device,
        what,
        kinds=("cuda",),
        runs_on="an engine runs on a CUDA device",
        expected="expected 'cuda', 'cuda:N' or a GPU index N",
        ints=True,
        no_gpu_later=True,  # (load() refused first: a TensorRT engine cannot run on no GPU)
    )
    return CudaDevice(0 if d.index is None else d.index)


__all__ = ["CudaDevice", "Device", "HostDevice", "make_device"]
