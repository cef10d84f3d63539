"""`load()` an engine file with its manifest checked, and the :class:`Engine` that opens sessions.

Loading order (each step fails with a UserError that names the file and the fix, before any TensorRT
work): what an interrupted compile left beside the engine is settled (manifest.read_engine) ->
manifest present and well-formed (types, min <= opt <= max in every profile) -> engine bytes match the
manifest's size and sha256 -> profile layout consistent -> the recorded backend is importable here and
version-compatible -> it can run on this GPU -> required plugins registered -> deserialize through
:mod:`trtforge.runtime.trt_context`.
"""

from __future__ import annotations

import os
from typing import Any

from trtforge._fileio import as_input_path
from trtforge.core.manifest import Manifest, ShapeRange, read_engine
from trtforge.errors import BackendUnavailableError, UserError, checked_call, shown
from trtforge.runtime.compat import check_backend_compat, register_required_plugins
from trtforge.runtime.profiles import InputValidator, IOSpec, ProfileLayout
from trtforge.runtime.protocol import EngineHandle


class Engine:
    """A loaded engine: I/O specs and profile ranges from the manifest, memory needs, and sessions."""

    def __init__(
        self,
        manifest: Manifest,
        handle: EngineHandle,
        *,
        label: str = "engine",
        backend: Any = None,
        host_capable: bool = False,
        default_device: Any = None,
    ):
        self.manifest = manifest
        self.default_device = default_device
        self.handle = handle
        self.backend = backend
        self.label = label
        self.host_capable = host_capable
        self.layout = ProfileLayout.from_manifest(manifest, where=label)
        self.inputs, self.outputs = _io_specs(manifest, label)
        self.data_dependent = frozenset(getattr(handle, "data_dependent_outputs", ()))
        self.validator = InputValidator(self.inputs, self.layout, engine=label)

    @property
    def dynamic_outputs(self) -> bool:
        """True when some output's shape depends on the data (an output allocator is used)."""
        return bool(self.data_dependent)

    @property
    def profiles(self) -> list[dict[str, ShapeRange]]:
        """Base optimization profiles (one copy): input name -> ShapeRange(min, opt, max)."""
        return [dict(p) for p in self.layout.base]

    @property
    def streams(self) -> int:
        """How many lanes can run concurrently (profile copies; unlimited-but-reported 1 for static)."""
        return self.layout.copies

    def device_memory_for_profile(self, base_index: int = 0) -> int:
        """Device memory (bytes) one context needs at the largest shapes of base profile `base_index`."""
        k = self.layout.per_copy
        if isinstance(base_index, bool) or not isinstance(base_index, int) or not 0 <= base_index < k:
            # (an index past the profiles reached TensorRT's getDeviceMemorySizeForProfile unchecked)
            raise UserError(
                f"{self.label}: device_memory_for_profile({shown(base_index)}): base_index is a base "
                f"profile, an integer 0..{k - 1} (this engine has {k} per stream copy)."
            )
        return int(self.handle.device_memory_size_for_profile(self.layout.profile_index(0, base_index)))

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: I/O, profile ranges, memory per profile, streams, backend."""
        return {
            "engine": self.label,
            "inputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in self.inputs],
            "outputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in self.outputs],
            "profiles": [
                {n: {"min": r.min, "opt": r.opt, "max": r.max} for n, r in p.items()}
                for p in self.layout.base
            ],
            "device_memory_per_profile": [
                self.device_memory_for_profile(k) for k in range(self.layout.per_copy)
            ],
            "streams": self.streams,
            "aux_streams": self.handle.num_aux_streams,
            "data_dependent_outputs": sorted(self.data_dependent),
            "backend": dict(self.manifest.backend),
        }

    @checked_call
    def session(
        self,
        streams: int = 1,
        *,
        device: Any = None,
        cuda_graphs: bool = False,
        graph_warmup: int = 1,
        aux_streams: int | None = None,
        torch_allocator: bool = False,
    ) -> Any:
        """Open a :class:`~trtforge.runtime.session.Session` with `streams` lanes.

        Args:
            streams: concurrent lanes; a dynamic-shape engine needs as many profile copies
                (`trtforge compile --streams N`).
            device: CUDA device (default cuda:0).
            cuda_graphs: capture a CUDA graph per (lane, shapes) after `graph_warmup` eager calls, dropped
                when shapes change.
            aux_streams: auxiliary streams per lane (default: what the engine was built with).
            torch_allocator: route the engine's own temporary allocations to torch's caching allocator.
        """
        from trtforge.runtime.session import Session

        return Session(
            self,
            streams,
            device=device,
            cuda_graphs=cuda_graphs,
            graph_warmup=graph_warmup,
            aux_streams=aux_streams,
            torch_allocator=torch_allocator,
        )


def _io_specs(manifest: Manifest, label: str) -> tuple[tuple[IOSpec, ...], tuple[IOSpec, ...]]:
    """The manifest's inputs and outputs as IOSpecs; UserError for a dtype the runtime cannot bind (the
    manifest admits int4 and float4_e2m1, which have no torch dtype: it was a ValueError after
    deserializing)."""
    try:
        return (
            tuple(IOSpec.from_tensor_spec(t) for t in manifest.inputs),
            tuple(IOSpec.from_tensor_spec(t) for t in manifest.outputs),
        )
    except ValueError as e:
        raise UserError(
            f"{label}: I/O tensor {e}. The runtime binds I/O through torch tensors, so it cannot run this "
            "engine; rebuild it with I/O of one of those dtypes."
        ) from None


def _backend_for(manifest: Manifest, label: str) -> Any:
    from trtforge.core.backend import get_backend

    name = str(manifest.backend.get("name", ""))
    try:
        return get_backend(name)
    except BackendUnavailableError as e:
        raise UserError(
            f"{label} was built with {name} {manifest.backend.get('version', '?')}, which is not importable "
            f"here ({e}). Install that backend, or rebuild the engine with the one installed."
        ) from e


@checked_call
def load(path: str | os.PathLike[str], manifest: Manifest | None = None) -> Engine:
    """Load `path` (+ `path.json` manifest): verify it, check the backend, register plugins, deserialize.

    `manifest`: `path`'s manifest when the caller has read it already (read_manifest), so it is read once.
    """
    path = as_input_path(path, "the engine")
    if manifest is not None and not isinstance(manifest, Manifest):  # (was an AttributeError deep inside)
        raise UserError(
            "load(manifest=...) must be the engine's Manifest (trtforge.core.manifest.read_manifest) or "
            f"None, got {type(manifest).__name__}."
        )
    label = f"engine '{path}'"
    manifest, data = read_engine(path, manifest)
    ProfileLayout.from_manifest(manifest, where=label)
    _io_specs(manifest, label)  # before any backend work
    backend = _backend_for(manifest, label)
    check_backend_compat(
        manifest.backend,
        backend.name,
        backend.version,
        version_compatible=bool(manifest.build_options.get("version_compatible")),
        engine=label,
    )
    caps = backend.capabilities
    if not caps.can_run:
        raise UserError(
            f"{label}: {backend.name} {backend.version} cannot run engines here: {caps.run_reason}."
        )
    from trtforge.runtime import trt_context

    register_required_plugins(
        manifest.plugins, backend, lambda keys: trt_context.missing_plugin_creators(backend, keys)
    )
    handle = trt_context.TrtEngine(backend, data, manifest, label=label)
    return Engine(manifest, handle, label=label, backend=backend)


__all__ = ["Engine", "load"]
