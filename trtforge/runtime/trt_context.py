"""Every TensorRT call of the runtime, each with the section of shared/docs/tensorrt-facts.md it follows.

:class:`TrtEngine` deserializes and inspects an engine; :class:`TrtContext` implements the
:class:`~trtforge.runtime.protocol.Context` protocol over one ``IExecutionContext`` created with
user-managed device memory. TensorRT is reached only through ``backend.trt`` (compiler/backend.py).
No engine can run on the machines this was written on (tensorrt-facts.md §6: TensorRT-RTX refuses CC 9.0
and the datacenter wheels are not installable), so this module is reviewed against the facts document and
exercised by the ``trt_run`` tests on a GPU that TensorRT runs on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtforge.core.backend import trt_dtype_name
from trtforge.core.manifest import Manifest
from trtforge.errors import UserError
from trtforge.runtime.protocol import GpuAllocator, OutputSink


def missing_plugin_creators(backend: Any, keys: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """(name, version, namespace) keys with no creator in the plugin registry (§5.1 `get_creator`)."""
    registry = backend.trt.get_plugin_registry()  # §5.1
    return [k for k in keys if registry.get_creator(k[0], k[1], k[2]) is None]  # §5.1


def _make_output_allocator(trt: Any, sink: OutputSink) -> Any:
    """An IOutputAllocator forwarding to `sink` (§4.5: subclass, call base __init__, return int address)."""

    class _OutputAllocator(trt.IOutputAllocator):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)  # §4.5

        def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int | None:
            return sink.reallocate(tensor_name, size, alignment) or None  # §4.5 (None on failure)

        def reallocate_output_async(
            self, tensor_name: str, memory: int, size: int, alignment: int, stream: int
        ) -> int | None:
            return sink.reallocate(tensor_name, size, alignment) or None  # §4.5

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            sink.notify_shape(tensor_name, tuple(shape))  # §4.5

    return _OutputAllocator()


def _make_gpu_allocator(trt: Any, inner: GpuAllocator) -> Any:
    """An IGpuAllocator forwarding to `inner` (§4.6: override every method; None for size 0/failure)."""

    class _GpuAllocator(trt.IGpuAllocator):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IGpuAllocator.__init__(self)  # §4.6

        def allocate(self, size: int, alignment: int, flags: int) -> int | None:
            return inner.allocate(size, alignment) or None  # §4.6

        def reallocate(self, address: int, alignment: int, new_size: int) -> None:
            return None  # §4.6: "return None if unsupported"

        def deallocate(self, memory: int) -> bool:
            return inner.deallocate(memory)  # §4.6

        def allocate_async(self, size: int, alignment: int, *stream_and_flags: Any) -> int | None:
            # §4.6 caution: the trampoline passes (size, alignment, stream, flags), the docs say
            # (size, alignment, flags, stream); only the first two are used, so the order does not matter.
            return inner.allocate(size, alignment) or None

        def deallocate_async(self, memory: int, stream: int) -> bool:
            return inner.deallocate(memory)  # §4.6

    return _GpuAllocator()


class TrtContext:
    """The Context protocol over one IExecutionContext with user-managed device memory (§4.2)."""

    def __init__(self, engine: TrtEngine):
        trt, eng = engine.trt, engine.engine
        self._trt = trt
        self._engine = engine
        if hasattr(eng, "create_runtime_config"):
            rc = eng.create_runtime_config()  # §4.2
            rc.set_execution_context_allocation_strategy(
                trt.ExecutionContextAllocationStrategy.USER_MANAGED  # §4.2
            )
            ctx = eng.create_execution_context(rc)  # §4.2
        else:
            ctx = eng.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)  # §4.2
        if ctx is None:
            raise RuntimeError(
                f"{engine.label}: TensorRT could not create an execution context (see its log)"
            )
        self._ctx = ctx
        self._profile = 0
        self._keep: list[Any] = []  # Python allocator objects TensorRT holds by pointer

    def set_optimization_profile(self, index: int, stream: int) -> None:
        # §4.2: before any set_input_shape; enqueued on `stream`, which is the lane's enqueue stream.
        if not self._ctx.set_optimization_profile_async(index, stream):
            raise RuntimeError(f"{self._engine.label}: could not select optimization profile {index}")
        self._profile = index

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self._ctx.set_input_shape(name, tuple(shape)):  # §4.2
            raise UserError(
                f"{self._engine.label}: TensorRT rejected shape {tuple(shape)} for input '{name}'"
            )

    def device_memory_size(self) -> int:
        # §4.2: after profile and all input shapes; returns 0 on error -> fall back to the profile maximum.
        size = 0
        if hasattr(self._ctx, "update_device_memory_size_for_shapes"):
            size = int(self._ctx.update_device_memory_size_for_shapes())  # §4.2
        return size or self._engine.device_memory_size_for_profile(self._profile)

    def set_device_memory(self, address: int, size: int) -> None:
        self._ctx.set_device_memory(address, size)  # §4.2 (256-byte aligned: arena.ALIGNMENT)

    def output_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._ctx.get_tensor_shape(name))  # §4.2 resolved output shape (-1: data-dependent)

    def set_tensor_address(self, name: str, address: int) -> None:
        if not self._ctx.set_tensor_address(name, address):  # §4.2
            raise RuntimeError(f"{self._engine.label}: TensorRT rejected the address of tensor '{name}'")

    def set_output_sink(self, name: str, sink: OutputSink) -> None:
        alloc = _make_output_allocator(self._trt, sink)
        self._keep.append(alloc)
        if not self._ctx.set_output_allocator(name, alloc):  # §4.5
            raise RuntimeError(f"{self._engine.label}: could not set an output allocator for '{name}'")

    def set_aux_streams(self, streams: Sequence[int]) -> None:
        self._ctx.set_aux_streams(list(streams))  # §4.4 (non-default, distinct handles)

    def set_temporary_allocator(self, allocator: GpuAllocator) -> None:
        alloc = _make_gpu_allocator(self._trt, allocator)
        self._keep.append(alloc)
        self._ctx.temporary_allocator = alloc  # §4.6 per-context allocator

    def graph_capturable(self, stream: int) -> bool:
        # §4.7 / §6: TensorRT-RTX answers up front; datacenter TensorRT reports a failed enqueue instead.
        if hasattr(self._ctx, "is_stream_capturable"):
            return bool(self._ctx.is_stream_capturable(stream))  # §6
        return True

    def execute_async(self, stream: int) -> bool:
        return bool(self._ctx.execute_async_v3(stream))  # §4.2 (releases the GIL, §4.3)


class TrtEngine:
    """A deserialized engine (the EngineHandle protocol), its Runtime kept alive beside it (§4.1)."""

    def __init__(self, backend: Any, data: bytes, manifest: Manifest, *, label: str = "engine"):
        trt = backend.trt
        self.trt = trt
        self.label = label
        self.runtime = trt.Runtime(backend.logger)  # §4.1: keep the Runtime alive as long as the engine
        if manifest.build_options.get("version_compatible"):
            self.runtime.engine_host_code_allowed = True  # §1.10: VC engines embed host code
        if hasattr(self.runtime, "get_engine_validity"):
            validity, diagnostics = self.runtime.get_engine_validity(data)  # §6 (TensorRT-RTX only)
            if validity == trt.EngineValidity.INVALID:
                raise UserError(
                    f"{label}: {backend.name} {backend.version} reports the engine invalid here "
                    f"(diagnostics bitmask {int(diagnostics)}: version, compute capability, driver, memory "
                    "or a malformed file). Rebuild it for this GPU and TensorRT-RTX release."
                )
        engine = self.runtime.deserialize_cuda_engine(data)  # §4.1: None on failure
        if engine is None:
            raise UserError(
                f"{label}: {backend.name} {backend.version} could not deserialize it (see its log)."
            )
        self.engine = engine
        self.num_aux_streams = int(engine.num_aux_streams)  # §1.7
        self._check_io(manifest)
        self.data_dependent_outputs = self._probe_data_dependent(manifest)

    def _io(self) -> dict[str, tuple[bool, str, tuple[int, ...]]]:
        eng, trt = self.engine, self.trt
        out = {}
        for i in range(eng.num_io_tensors):  # §4.1
            name = eng.get_tensor_name(i)  # §4.1
            is_input = eng.get_tensor_mode(name) == trt.TensorIOMode.INPUT  # §4.1
            out[name] = (
                is_input,
                trt_dtype_name(eng.get_tensor_dtype(name)),
                tuple(eng.get_tensor_shape(name)),
            )
        return out

    def _check_io(self, manifest: Manifest) -> None:
        io = self._io()
        want = {t.name: (True, t.dtype) for t in manifest.inputs} | {
            t.name: (False, t.dtype) for t in manifest.outputs
        }
        got = {n: (v[0], v[1]) for n, v in io.items()}
        if got != want:
            raise UserError(
                f"{self.label}: the engine's I/O {sorted(got.items())} does not match its manifest "
                f"{sorted(want.items())}; the manifest belongs to another engine. "
                "Rebuild with `trtforge compile`."
            )

    def _probe_data_dependent(self, manifest: Manifest) -> frozenset[str]:
        """Outputs whose shape stays -1 with every input shape set (data-dependent, §4.5)."""
        if not any(d < 0 for t in manifest.outputs for d in t.shape):
            return frozenset()
        ctx = TrtContext(self)
        opt = manifest.profiles[0] if manifest.profiles else {}
        for t in manifest.inputs:
            shape = tuple(opt[t.name].opt) if t.name in opt else tuple(t.shape)
            ctx.set_input_shape(t.name, shape)
        return frozenset(t.name for t in manifest.outputs if any(d < 0 for d in ctx.output_shape(t.name)))

    def aliased_input(self, output: str) -> str | None:
        """The input whose memory output `output` shares (in-place ops, e.g. KV-cache updates), or None."""
        query = getattr(self.engine, "get_aliased_input_tensor", None)  # llm-decoding-facts (TRT >= 10.15)
        return (query(output) or None) if query is not None else None

    def device_memory_size_for_profile(self, profile: int) -> int:
        if hasattr(self.engine, "get_device_memory_size_for_profile_v2"):
            return int(self.engine.get_device_memory_size_for_profile_v2(profile))  # §4.2
        return int(self.engine.device_memory_size_v2)  # §4.2 (max over profiles)

    def create_context(self) -> TrtContext:
        return TrtContext(self)


__all__ = ["TrtContext", "TrtEngine", "missing_plugin_creators"]
