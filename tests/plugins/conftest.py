"""Plugin tests: Triton kernels run in the CPU interpreter without a GPU (set up in tests/kernels)."""

import tests.kernels.conftest  # noqa: F401  (sets TRITON_INTERPRET and patches the interpreter)
