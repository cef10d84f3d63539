"""Every Triton kernel of trtforge with its launch helpers: flash attention (Triton and the Gluon Hopper
kernel), split-KV decode, chunked prefill, paged cache write, GEMV and fused layer pieces.

May import ``trtforge.errors`` and ``trtforge.core`` only; never TensorRT. Importing this package is
cheap: each module loads torch/Triton itself.
"""

import os


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``: the tests), where
    inline PTX, hardware float8 casts and TMA are unavailable."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
