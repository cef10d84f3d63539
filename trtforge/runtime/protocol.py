"""The small surface the session machinery talks to instead of TensorRT.

:mod:`trtforge.runtime.trt_context` implements it over TensorRT's ``ICudaEngine``/``IExecutionContext``;
:mod:`trtforge.runtime.standin` implements it with real CUDA work written in torch, so streams, memory,
binding and threading are exercised on a GPU without an engine. Addresses are plain ints (device
pointers) and streams are CUDA stream handles (``torch.cuda.Stream.cuda_stream``), exactly what TensorRT
receives. :class:`SessionEngine` is what a session reads from its engine
(:class:`~trtforge.runtime.engine.Engine` implements it), so the session never imports the engine module
that creates it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from trtforge.runtime.profiles import InputValidator, IOSpec, ProfileLayout


@runtime_checkable
class OutputSink(Protocol):
    """Receives data-dependent outputs (what TensorRT's IOutputAllocator calls, tensorrt-facts.md §4.5)."""

    def reallocate(self, name: str, size: int, alignment: int) -> int:
        """Return a device address of at least `size` bytes for output `name` (0 on failure)."""
        ...

    def notify_shape(self, name: str, shape: Sequence[int]) -> None:
        """Record the final shape of output `name`."""
        ...


@runtime_checkable
class GpuAllocator(Protocol):
    """Allocates device memory for the engine's own needs (TensorRT's IGpuAllocator, facts §4.6)."""

    def allocate(self, size: int, alignment: int) -> int:
        """Return an address of `size` bytes (0 on failure or for size 0)."""
        ...

    def deallocate(self, address: int) -> bool:
        """Free an address from :meth:`allocate`."""
        ...


@runtime_checkable
class Context(Protocol):
    """One execution context: holds shapes, addresses and device memory of one lane."""

    def set_optimization_profile(self, index: int, stream: int) -> None:
        """Select profile `index`, enqueued on `stream` (before any input shape is set)."""
        ...

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Set the runtime shape of input `name`."""
        ...

    def device_memory_size(self) -> int:
        """Bytes of device memory the next enqueue needs, given the shapes set so far."""
        ...

    def set_device_memory(self, address: int, size: int) -> None:
        """Hand the context `size` bytes of scratch at `address` (256-byte aligned)."""
        ...

    def output_shape(self, name: str) -> tuple[int, ...]:
        """Resolved shape of output `name` (-1 where it depends on the data)."""
        ...

    def set_tensor_address(self, name: str, address: int) -> None:
        """Bind input or output `name` to device `address`."""
        ...

    def set_output_sink(self, name: str, sink: OutputSink) -> None:
        """Route data-dependent output `name` to `sink`."""
        ...

    def set_aux_streams(self, streams: Sequence[int]) -> None:
        """Auxiliary streams for intra-inference parallelism."""
        ...

    def set_temporary_allocator(self, allocator: GpuAllocator) -> None:
        """Route the context's own temporary allocations to `allocator`."""
        ...

    def graph_capturable(self, stream: int) -> bool:
        """Whether an enqueue on `stream` may be captured into a CUDA graph (failures are handled too)."""
        ...

    def execute_async(self, stream: int) -> bool:
        """Enqueue one inference on `stream`; False if the enqueue failed."""
        ...


class EngineHandle(Protocol):
    """A deserialized engine: creates contexts and reports memory needs."""

    num_aux_streams: int

    def create_context(self) -> Context:
        """A new context whose device memory the caller provides."""
        ...

    def device_memory_size_for_profile(self, profile: int) -> int:
        """Bytes a context needs at the largest shapes of `profile`."""
        ...


class SessionEngine(Protocol):
    """What a session reads from its engine: handle, I/O specs, profile layout and input validation."""

    label: str
    handle: EngineHandle
    layout: ProfileLayout
    validator: InputValidator
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    data_dependent: frozenset[str]
    host_capable: bool
    default_device: Any

    @property
    def dynamic_outputs(self) -> bool:
        """True when some output's shape depends on the data."""
        ...

    def device_memory_for_profile(self, base_index: int = 0) -> int:
        """Device memory (bytes) one context needs at the largest shapes of base profile `base_index`."""
        ...


__all__ = ["Context", "EngineHandle", "GpuAllocator", "OutputSink", "SessionEngine"]
