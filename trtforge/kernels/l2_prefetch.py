"""Weights requested into L2 ahead of the projection that reads them, while the memory would idle.

A one-row decode step streams every weight of the model once. Between a layer's QKV GEMV and its
output projection the attention kernels (RoPE and the cache write, the split-KV decode, its reduction)
read a few MB of keys and values in several microseconds: the DRAM idles for that phase. A
:func:`plan` lists the next projections' bytes as chunk descriptors on the device (made once a weight,
outside any CUDA-graph capture); a kernel of that phase runs :func:`issue` in programs of its own, each
thread one ``cp.async.bulk.prefetch.L2`` (Hopper and later; no registers, no wait), and the projection
then finds the first of its weights in L2. The descriptors are ordered so that any prefix of them
covers the same leading share of every region: programs of a GEMV take its rows in order, so a budget
smaller than the weight covers its first programs whole.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK_BYTES = 16384  # bytes one thread requests (one bulk prefetch)
THREADS = 128  # descriptors one prefetching program issues (4 warps, one a thread)


def supported(device: torch.device) -> bool:
    """Whether `device` has ``cp.async.bulk.prefetch.L2`` (an NVIDIA GPU of compute capability 9.0+)."""
    return (
        device.type == "cuda"
        and torch.version.hip is None
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def _chunks(t: torch.Tensor, chunk: int) -> list[tuple[float, int, int]]:
    """(relative position, address, bytes) of `t`'s storage in `chunk`-byte pieces; sizes and the start
    in whole 16-byte units, as the instruction takes them (a trailing partial unit is left out, never read
    past). An empty tensor or a start off 16 bytes gives none."""
    total = t.numel() * t.element_size() // 16 * 16
    base = t.data_ptr()
    if total == 0 or base % 16:
        return []
    return [(lo / total, base + lo, min(chunk, total - lo)) for lo in range(0, total, chunk)]


def plan(groups: list[list[torch.Tensor]], chunk: int = CHUNK_BYTES) -> torch.Tensor:
    """int64 ``[C, 2]`` (address, bytes) descriptors of the tensors of `groups`, on their device: group by
    group (the order the kernels read them), and within a group interleaved by relative position, so a
    prefix covers every tensor's leading share alike. The tensors must be contiguous and must outlive the
    plan (it holds addresses, not references)."""
    if chunk <= 0 or chunk % 16:
        raise ValueError(f"l2_prefetch.plan: chunk must be a positive multiple of 16 bytes, got {chunk}")
    rows: list[tuple[int, int]] = []
    device = None
    for group in groups:
        pieces = []
        for t in group:
            if not t.is_contiguous():
                raise ValueError(f"l2_prefetch.plan: tensor {tuple(t.shape)} is not contiguous")
            if device is not None and t.device != device:
                raise ValueError(f"l2_prefetch.plan: tensors on {device} and {t.device}")
            device = t.device
            pieces += _chunks(t, chunk)
        rows += [(addr, size) for _, addr, size in sorted(pieces, key=lambda p: p[0])]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 2).to(device or "cpu")


def programs(n_chunks: int) -> int:
    """Prefetching programs that issue `n_chunks` descriptors (:data:`THREADS` a program)."""
    return triton.cdiv(max(n_chunks, 0), THREADS)


@triton.jit
def issue(Chunks, n_chunks, first, NT: tl.constexpr):
    """Descriptors ``first .. first + NT`` of `Chunks` (of `n_chunks`) requested into L2, one a thread
    (``cp.async.bulk.prefetch.L2.global``: asynchronous, no registers, nothing to wait for)."""
    c = first + tl.arange(0, NT)
    ok = c < n_chunks
    addr = tl.load(Chunks + 2 * c, mask=ok, other=0)
    size = tl.load(Chunks + 2 * c + 1, mask=ok, other=0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; } // dummy $0",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
