"""Can this engine be loaded here? Backend name/version rules and plugin requirements (pure Python).

Rules (tensorrt-facts.md §1.10, §6):
- The backend that deserializes must be the one that built (`tensorrt` engines are not `tensorrt_rtx`
  engines and vice versa).
- TensorRT-RTX: engines are not compatible across RTX releases -> same major.minor.patch.
- TensorRT: same major.minor.patch, unless the engine was built version-compatible
  (`build_options["version_compatible"]`): then the runtime must be the same or a newer version of the same
  major, or exactly one major newer for the documented pairs 8 -> 10 and 10 -> 11.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from trtforge.errors import UserError

# Cross-major pairs documented for version-compatible engines (facts §1.10): built-with -> runs-on.
_VC_CROSS_MAJOR = {(8, 10), (10, 11)}

# Plugin namespaces trtforge itself provides, and the function that registers their creators.
PLUGIN_PROVIDERS: dict[str, str] = {"trtforge": "trtforge.plugins.attention.plugin:register_plugins"}


def _release(version: str) -> tuple[int, ...]:
    """'11.1.0.7' -> (11, 1, 0); non-numeric parts stop the parse."""
    out = []
    for part in str(version).split(".")[:3]:
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def check_backend_compat(
    built: dict[str, Any], runtime_name: str, runtime_version: str, *, version_compatible: bool, engine: str
) -> None:
    """UserError when an engine built by `built` (manifest backend dict) cannot run on this backend."""
    b_name, b_ver = str(built.get("name", "?")), str(built.get("version", "?"))
    fix = f"Rebuild the engine here with `trtforge compile` ({runtime_name} {runtime_version})"
    if b_name != runtime_name:
        raise UserError(
            f"{engine} was built with {b_name} {b_ver}, but the TensorRT backend here is {runtime_name} "
            f"{runtime_version}; engines do not move between TensorRT and TensorRT-RTX. {fix}, or install "
            f"{b_name} {b_ver} and set TRTFORGE_BACKEND={b_name}."
        )
    b, r = _release(b_ver), _release(runtime_version)
    if len(b) < 3 or len(r) < 3:
        raise UserError(
            f"{engine}: cannot compare backend versions {b_name} {b_ver!r} (built) and {runtime_version!r} "
            f"(here). {fix}."
        )
    if b == r:
        return
    if runtime_name == "tensorrt_rtx":
        raise UserError(
            f"{engine} was built with TensorRT-RTX {b_ver}; this is TensorRT-RTX {runtime_version}. "
            "RTX engines are not compatible across RTX releases. "
            f"{fix}, or install tensorrt-rtx=={'.'.join(map(str, b))}."
        )
    if not version_compatible:
        raise UserError(
            f"{engine} was built with TensorRT {b_ver}; this is TensorRT {runtime_version}. Engines run "
            "only on the TensorRT version that built them unless built version-compatible. "
            f"{fix}, or install tensorrt=={'.'.join(map(str, b))}."
        )
    same_major_newer = b[0] == r[0] and r >= b
    if not (same_major_newer or (b[0], r[0]) in _VC_CROSS_MAJOR):
        raise UserError(
            f"{engine} is a version-compatible engine from TensorRT {b_ver}; TensorRT {runtime_version} "
            "cannot run it (supported: the same or a newer version of the same major, or 8->10, 10->11). "
            + fix
            + "."
        )


def plugin_key(p: dict[str, Any]) -> tuple[str, str, str]:
    """(name, version, namespace) of a manifest plugin entry."""
    return str(p.get("name", "")), str(p.get("version", "1")), str(p.get("namespace", ""))


def _provider(namespace: str) -> Callable[..., Any] | None:
    spec = PLUGIN_PROVIDERS.get(namespace)
    if spec is None:
        return None
    module_name, func = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(
            f"the engine needs trtforge plugins (namespace '{namespace}') but '{module_name}' cannot be "
            f"imported ({e}). Install trtforge with its plugins, or rebuild with `--attention native`."
        ) from e
    fn = getattr(module, func, None)
    if fn is None:
        raise UserError(f"'{module_name}' has no '{func}'; this trtforge install is incomplete.")
    return fn


def register_required_plugins(
    plugins: Sequence[dict[str, Any]], backend: Any, missing: Callable[[list[tuple[str, str, str]]], list]
) -> None:
    """Call trtforge's plugin registration for namespaces the engine uses, then require every creator.

    `missing(keys)` returns the (name, version, namespace) keys with no creator in the backend's plugin
    registry (a TensorRT call, kept in trt_context). A provider is called as `register_plugins(backend)`
    when it takes an argument, else `register_plugins()`.
    """
    if not plugins:
        return
    keys = [plugin_key(p) for p in plugins]
    for ns in sorted({k[2] for k in keys}):
        fn = _provider(ns)
        if fn is not None:
            fn(backend) if inspect.signature(fn).parameters else fn()
    absent = missing(keys)
    if absent:
        listed = ", ".join(f"{n} v{v} (namespace '{ns}')" for n, v, ns in absent)
        raise UserError(
            f"the engine needs plugin(s) {listed} that are not registered with "
            f"{getattr(backend, 'name', 'TensorRT')}. Load the plugin library first "
            "(trt.get_plugin_registry().load_library(path)) or rebuild without custom plugins."
        )


__all__ = ["PLUGIN_PROVIDERS", "check_backend_compat", "plugin_key", "register_required_plugins"]
