"""Lazy package attributes: a package's public names load their modules on first use (PEP 562).

A package whose modules import heavy dependencies (torch, onnx, TensorRT) lists its public names as
``{name: module}`` and sets ``__getattr__ = lazy_attributes(__name__, table)``: importing the package
stays cheap, and ``package.name`` imports ``module`` only when it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for `package` that returns ``table[name]``'s attribute `name` (importing
    that module then), and raises AttributeError for any name not in `table`."""

    def __getattr__(name: str) -> Any:
        if name in table:
            import importlib

            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
