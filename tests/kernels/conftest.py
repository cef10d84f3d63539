"""Plugin tests: without a CUDA device, the Triton kernel runs in Triton's CPU interpreter.

TRITON_INTERPRET must be set before the kernel module is imported (triton.jit reads it at
decoration time), hence here, at collection. Triton 3.6's interpreter converts scalar tensors with
``int(array)``, which NumPy >= 2.4 rejects for 1-element 1-D arrays; the same fix as upstream
Triton (``.item()``) is applied to the interpreter only. Its float conversions to and from FP8 E4M3
(``float8e4nv``) are bit arithmetic that rounds half-up without carrying into the exponent (31.94 ->
16, not 32), and its float32 -> BF16 conversion truncates; those conversions go through torch's
round-to-nearest-even casts instead, which is what the GPU's ``cvt.rn`` (``.satfinite`` for E4M3) does
to the in-range values the kernels convert.
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

    _original_convert = _interpreter._convert_float

    def _convert_float(input, input_dtype, output_dtype, rounding_mode):  # type: ignore[no-untyped-def]  # noqa: A002
        import numpy as np
        import torch
        import triton.language as tl

        if not {tl.float8e4nv, tl.bfloat16} & {input_dtype, output_dtype}:
            return _original_convert(input, input_dtype, output_dtype, rounding_mode)
        as_torch = {
            tl.float8e4nv: (np.uint8, torch.uint8, torch.float8_e4m3fn),
            tl.float16: (np.float16, torch.float16, torch.float16),
            tl.bfloat16: (np.uint16, torch.int16, torch.bfloat16),
            tl.float32: (np.float32, torch.float32, torch.float32),
        }
        np_in, _, t_in = as_torch[input_dtype]
        _, raw_out, t_out = as_torch[output_dtype]
        bits = np.ascontiguousarray(input).view(np_in)
        src = torch.from_numpy(bits.view(np.int16) if np_in is np.uint16 else bits).view(t_in)
        out = src.to(t_out).view(raw_out).numpy()
        width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[out.dtype.itemsize]
        return out.view(width).reshape(input.shape)

    _interpreter._convert_float = _convert_float
