"""Old import paths of modules that moved in the two-wings layout, kept for code written against them.

A shim module calls :func:`moved` and holds nothing else: importing the old path returns the new
module object itself (one module, so patches, isinstance checks and torch op registrations see one copy).
"""

from __future__ import annotations

import sys
from importlib import import_module


def moved(old: str, new: str) -> None:
    """Make ``import old`` give the module ``new`` (call it from the shim module ``old``)."""
    sys.modules[old] = import_module(new)
