"""Runtime: load engines, run them on several CUDA streams with dynamic tensor memory.

``trtforge.runtime.load(path) -> Engine``; ``engine.session(streams=N) -> Session`` with ``run`` /
``submit`` / ``memory_stats``. Importing this package is cheap: torch and TensorRT load on first use.
May import ``trtforge.core`` (manifest, backend adapter), ``kernels`` and ``plugins``; never ``compiler``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtforge._lazy import lazy_attributes

if TYPE_CHECKING:
    from trtforge.runtime.engine import Engine, load
    from trtforge.runtime.session import Session, SessionClosedError

__all__ = ["Engine", "Session", "SessionClosedError", "load"]

_LAZY = {
    "Engine": "trtforge.runtime.engine",
    "load": "trtforge.runtime.engine",
    "Session": "trtforge.runtime.session",
    "SessionClosedError": "trtforge.runtime.session",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
