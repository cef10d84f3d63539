"""Plugin tests: Triton kernels run in the CPU interpreter without a GPU (set up in tests/kernels).

``backend`` and ``trt``: the TensorRT backend installed here and its bindings, for the tests that run
against the real bindings (each such module skips itself where none is importable).
"""

import pytest

import tests.kernels.conftest  # noqa: F401  (sets TRITON_INTERPRET and patches the interpreter)


@pytest.fixture(scope="module")
def backend():
    from trtforge.core.backend import get_backend

    return get_backend()


@pytest.fixture(scope="module")
def trt(backend):
    return backend.trt
