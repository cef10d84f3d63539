"""Without a CUDA device the Triton kernels run in Triton's CPU interpreter (set up as for the plugins)."""

import tests.kernels.conftest  # noqa: F401  (sets TRITON_INTERPRET and patches the interpreter)
