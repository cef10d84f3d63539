"""Plugin tests: without a CUDA device, the Triton kernel runs in Triton's CPU interpreter.

TRITON_INTERPRET must be set before the kernel module is imported (triton.jit reads it at
decoration time), hence here, at collection. Triton 3.6's interpreter converts scalar tensors with
``int(array)``, which NumPy >= 2.4 rejects for 1-element 1-D arrays; the same fix as upstream
Triton (``.item()``) is applied to the interpreter only.
"""

from __future__ import annotations

import importlib.util
import os


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if importlib.util.find_spec("triton") is not None and not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from triton.runtime import interpreter as _interpreter

    _original_patch = getattr(_interpreter, "_patch_lang_tensor", None)  # Triton 3.6's name

    def _patch_lang_tensor(tensor, scope):  # type: ignore[no-untyped-def]
        _original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    if _original_patch is not None:
        _interpreter._patch_lang_tensor = _patch_lang_tensor
