"""Dtype names used in manifests (NumPy spellings) mapped to torch and NumPy dtypes.

Manifests record dtypes as NumPy names (`float32`, `int64`, ...); `bfloat16` and the FP8 names have no
NumPy dtype, so such inputs can only be fed as torch tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_TORCH: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _TORCH[_name] = getattr(torch, _name)


def torch_dtype(name: str, *, where: str = "tensor") -> torch.dtype:
    """The torch dtype for a manifest dtype name (UserError-free: unknown names are a manifest bug)."""
    try:
        return _TORCH[name]
    except KeyError:
        raise ValueError(
            f"{where}: dtype {name!r} has no torch equivalent; known: {sorted(_TORCH)}"
        ) from None


def numpy_dtype(name: str) -> np.dtype[Any] | None:
    """The NumPy dtype for a manifest dtype name, or None where NumPy has none (bfloat16, FP8)."""
    try:
        return np.dtype(name)
    except TypeError:
        return None


def dtype_name(dtype: torch.dtype | np.dtype[Any]) -> str:
    """Manifest-style name of a torch or NumPy dtype (`torch.float32` -> `float32`)."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return np.dtype(dtype).name
