"""Every Triton kernel of trtforge with its launch helpers: flash attention (Triton and the Gluon Hopper
kernel), split-KV decode, chunked prefill, paged cache write, GEMV and fused layer pieces, row argmax.

May import ``trtforge.errors`` and ``trtforge.core`` only; never TensorRT. Importing this package is
cheap: each module loads torch/Triton itself.
"""

import functools
import os


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``: the tests), where
    inline PTX, hardware float8 casts and TMA are unavailable."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def num_sms(device) -> int:
    """SMs of a CUDA `device` (a ``torch.device``): the program counts the kernels' default launch
    rules aim at; 132 elsewhere (an H100/H200's count), so the interpreter runs the configs a GPU would."""
    if device.type != "cuda":
        return 132
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def has_wgmma(device) -> bool:
    """Whether CUDA `device` has Hopper's wgmma (compute capability 9.x), which the skinny FP8 and the
    mid-sized GEMMs are written in (Ada's 8.9 FP8 tensor cores take cuBLASLt instead)."""
    if device.type != "cuda":
        return False
    import torch

    return torch.cuda.get_device_capability(device)[0] == 9
