"""trtforge's Triton attention kernels behind the torch executor's attention functions (CUDA).

Decode rows go through :func:`trtforge.plugins.attention.decode_kernel.decode_attention` (split-KV
over the paged pool, GQA) and prompt chunks through
:func:`trtforge.plugins.attention.chunked_prefill.chunked_prefill_attention` (LOWER_RIGHT causal
over the cached prefix plus the chunk). The executor's pools are ``[num_blocks, block_size, Hkv, D]``,
the layout the kernels' entry points take (they index it through strided views); no K/V is
copied. Sliding-window layers run decode rows through the decode kernel's window; a step with
prompt chunks on such a layer (the prefill kernel has no window) falls back to the torch reference.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
import torch

from trtforge.llm.executors.paged_attention import (
    AttentionMetadata,
    paged_attention_reference,
)
from trtforge.llm.host_to_device import to_device

_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def triton_usable(device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int) -> bool:
    """Whether the Triton kernels can serve pools of this device, dtype, block size and head dim
    (on the CPU only inside Triton's interpreter, ``TRITON_INTERPRET=1``: tests)."""
    return (
        (device.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1")
        and dtype in _KERNEL_DTYPES
        and block_size >= 1
        and block_size & (block_size - 1) == 0
        and 0 < head_dim <= 256
        and importlib.util.find_spec("triton") is not None
    )


class TritonDecodeAttention:
    """Decode attention (one query per sequence) through trtforge's split-KV kernel; CUDA-graph safe.

    The launch configuration is fixed (the kernel's default for the head dim unless `config` is
    given), so graph capture never triggers autotuning and every bucket uses the same kernel.
    """

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of `q` ``[B, Hq, D]``, into `out` (same shape) when given."""
        from trtforge.plugins.attention.decode_kernel import decode_attention, default_decode_config

        config = self.config or default_decode_config(int(q.shape[-1]))
        got = decode_attention(
            q.unsqueeze(2),
            k_pool,
            v_pool,
            context_lens,
            block_tables,
            scale=scale,
            config=config,
            window=sliding_window,
            out=None if out is None else out.unsqueeze(2),
        )
        return got.squeeze(2)


class TritonPagedAttention:
    """Mixed prefill/decode attention: all decode rows in one decode launch, one prefill launch per chunk.

    The chunk launches take strided views of the flat ``[T, Hq, D]`` query and output (no copies);
    the per-step plan (which rows decode and their block tables and lengths, chunk bounds) is built
    once per step from the host-side metadata and reused by every layer. Decode rows that lie
    together (the scheduler puts running sequences first) are read and written in place.
    """

    def __init__(self, decode: TritonDecodeAttention | None = None) -> None:
        self.decode = decode or TritonDecodeAttention()
        self._plan_for: AttentionMetadata | None = None
        self._plan: tuple[Any, ...] = ()

    def _make_plan(self, meta: AttentionMetadata, device: torch.device) -> tuple[Any, ...]:
        qsl = meta.query_start_loc_host
        qlens = qsl[1:] - qsl[:-1]
        bs = meta.block_size
        decode = np.flatnonzero(qlens == 1)
        decode_plan = None
        if len(decode):
            width = -(-int(meta.context_lens_host[decode].max()) // bs)
            rows = qsl[decode].astype(np.int64)
            if len(decode) == len(qlens):
                tables, lens = meta.block_tables[:, :width], meta.context_lens
            else:
                seqs = to_device(decode.astype(np.int64), device)
                tables = meta.block_tables.index_select(0, seqs)[:, :width]
                lens = meta.context_lens.index_select(0, seqs)
            lo = int(rows[0])
            if int(rows[-1]) - lo + 1 == len(rows):  # one stretch of rows: slices, no gather or scatter
                where: Any = slice(lo, lo + len(rows))
            else:
                where = to_device(rows, device)
            decode_plan = (where, tables, lens)
        chunks = []
        for i in np.flatnonzero(qlens > 1):
            width = -(-int(meta.context_lens_host[i]) // bs)
            chunks.append((int(i), int(qsl[i]), int(qsl[i + 1]), width))
        return decode_plan, chunks

    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of the step's tokens `q` ``[T, Hq, D]``, into `out` (same shape) when given."""
        from trtforge.plugins.attention.chunked_prefill import chunked_prefill_attention

        if self._plan_for is not meta:
            self._plan, self._plan_for = self._make_plan(meta, q.device), meta
        decode_plan, chunks = self._plan
        if sliding_window is not None and chunks:
            got = paged_attention_reference(q, k_pool, v_pool, meta, scale, sliding_window)
            return got if out is None else out.copy_(got)
        if out is None:
            out = torch.empty_like(q)
        if decode_plan is not None:
            where, tables, lens = decode_plan
            if isinstance(where, slice):
                self.decode(q[where], k_pool, v_pool, tables, lens, scale, sliding_window, out=out[where])
            else:
                q_rows = q.index_select(0, where)
                got = self.decode(q_rows, k_pool, v_pool, tables, lens, scale, sliding_window)
                out.index_copy_(0, where, got)
        for i, lo, hi, width in chunks:
            chunked_prefill_attention(
                q[lo:hi].permute(1, 0, 2)[None],
                k_pool,
                v_pool,
                meta.context_lens[i : i + 1],
                meta.block_tables[i : i + 1, :width],
                scale=scale,
                out=out[lo:hi].permute(1, 0, 2)[None],
            )
        return out
