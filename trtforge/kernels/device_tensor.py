"""Strided views of raw device buffers (what TensorRT hands a plugin) and of the packed QKV tensor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DeviceTensor", "packed_qkv_views"]


@dataclass(frozen=True)
class DeviceTensor:
    """A raw device buffer seen as a strided tensor; exposes ``data_ptr()``/``dtype`` for Triton.

    ``strides`` are in elements, like ``torch.Tensor.stride()``. Nothing is owned: the caller keeps
    the memory alive while the kernel runs.
    """

    ptr: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def data_ptr(self) -> int:
        return self.ptr

    def stride(self, dim: int | None = None) -> Any:
        return self.strides if dim is None else self.strides[dim]

    def view(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int = 0,
        dtype: torch.dtype | None = None,
    ) -> DeviceTensor:
        """Another strided view of the same buffer; ``offset`` in this view's elements; `dtype` reads the
        bytes as another type of the same size (int32 counters in a float32 workspace)."""
        dtype = dtype or self.dtype
        if _itemsize(dtype) != _itemsize(self.dtype):
            raise ValueError(f"a {dtype} view of a {self.dtype} buffer must have the same element size")
        return DeviceTensor(self.ptr + offset * _itemsize(self.dtype), dtype, tuple(shape), tuple(strides))

    @classmethod
    def contiguous(cls, ptr: int, dtype: torch.dtype, shape: tuple[int, ...]) -> DeviceTensor:
        """A dense row-major buffer of `shape` at `ptr` (TensorRT's LINEAR format)."""
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= max(int(n), 1)
        return cls(int(ptr), dtype, tuple(int(n) for n in shape), tuple(reversed(strides)))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def packed_qkv_views(qkv: Any, num_heads: int) -> tuple[Any, Any, Any]:
    """q, k, v as [B, H, S, D] strided views of a packed QKV tensor [B, S, 3·H·D] (no copy).

    Works on torch tensors and on :class:`DeviceTensor`. The packed last axis is ordered
    (3, H, D): first all query heads, then all key heads, then all value heads.
    """
    b, s, width = (int(n) for n in qkv.shape)
    if width % (3 * num_heads):
        raise ValueError(f"packed QKV width {width} is not divisible by 3·num_heads = {3 * num_heads}")
    d = width // (3 * num_heads)
    sb, ss, sw = (int(x) for x in qkv.stride())
    shape, strides = (b, num_heads, s, d), (sb, d * sw, ss, sw)
    if isinstance(qkv, DeviceTensor):
        return tuple(qkv.view(shape, strides, offset=i * num_heads * d * sw) for i in range(3))
    return tuple(
        torch.as_strided(qkv, shape, strides, storage_offset=qkv.storage_offset() + i * num_heads * d * sw)
        for i in range(3)
    )


def pool_heads_major(pool: Any) -> Any:
    """A block pool [num_blocks, block_size, Hkv, D] as a [num_blocks, Hkv, block_size, D] view (no copy).

    The kernels index pools with element strides in that axis order; works on torch tensors and on
    :class:`DeviceTensor`."""
    if len(pool.shape) != 4:
        raise ValueError(f"a block pool must be [num_blocks, block_size, Hkv, D]; got {tuple(pool.shape)}")
    if isinstance(pool, DeviceTensor):
        (n, bs, h, d), (s0, s1, s2, s3) = pool.shape, pool.strides
        return pool.view((n, h, bs, d), (s0, s2, s1, s3))
    return pool.permute(0, 2, 1, 3)
