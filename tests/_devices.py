"""The two devices a Triton kernel test runs on: Triton's CPU interpreter, or CUDA for real (``-m gpu``).

Without CUDA the ``interpreter`` case runs (the conftest of tests/kernels and tests/llm sets
TRITON_INTERPRET); on a CUDA machine it skips, because there the ``cuda`` case runs the same checks on
the real kernels. Parametrize with :data:`DEVICES` and call :func:`skip_unless_runs_here` first.
"""

from __future__ import annotations

import pytest

DEVICES = [
    pytest.param("cpu", id="interpreter"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def skip_unless_runs_here(device: str) -> str:
    """Skip the interpreter case on a CUDA machine and the CUDA case without one; return `device`."""
    import torch

    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the interpreter run is for machines without CUDA (the kernels then run for real)")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return device
