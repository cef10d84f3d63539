"""Benchmark tests: the kernel modules some of them import run in the CPU interpreter without a GPU."""

import tests.kernels.conftest  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is imported)
