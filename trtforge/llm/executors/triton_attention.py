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


# Up to this much work (batch x kv heads x the table's key capacity) a decode launch runs un-split: one
# program per (sequence, kv head) walks all the keys, and no partials are written or reduced. At batch 1
# (TinyLlama-1.1B shapes: 4 kv heads, 512-1024 keys) the split launch plus its reduction kernel took
# 7.8 us a layer on the H200 (benchmarks/results/decode_layer.json), most of it two launches' latency.
SMALL_DECODE_WORK = 4 * 2048
SMALL_DECODE_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 3, "num_splits": 1}  # a DecodeConfig


class TritonDecodeAttention:
    """Decode attention (one query per sequence) through trtforge's split-KV kernel; CUDA-graph safe.

    The launch configuration is fixed per shape (`config`, else :data:`SMALL_DECODE_CONFIG` for small
    work and the kernel's default for the head dim beyond), chosen from the block table's width (the
    bucket's key capacity), never from the context lengths on the device: graph capture never
    triggers autotuning, and every replay of a bucket runs the kernel it captured.
    """

    def __init__(
        self, config: Any = None, small_config: Any = "default", small_work: int = SMALL_DECODE_WORK
    ):
        from trtforge.plugins.attention.decode_kernel import DecodeConfig

        self.config, self.small_work = config, small_work
        self.small_config = DecodeConfig(**SMALL_DECODE_CONFIG) if small_config == "default" else small_config

    def config_for(self, batch: int, kv_heads: int, head_dim: int, max_keys: int) -> Any:
        """The DecodeConfig for `batch` sequences of `kv_heads` heads over up to `max_keys` keys."""
        from trtforge.plugins.attention.decode_kernel import default_decode_config

        if self.config is not None:
            return self.config
        if self.small_config is not None and batch * kv_heads * max_keys <= self.small_work:
            return self.small_config
        return default_decode_config(head_dim)

    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        from trtforge.llm.executors.gemv_kernels import pdl_supported
        from trtforge.plugins.attention.decode_kernel import decode_attention

        max_keys = int(block_tables.shape[1]) * int(k_pool.shape[1])
        config = self.config_for(int(q.shape[0]), int(k_pool.shape[2]), int(q.shape[-1]), max_keys)
        out = decode_attention(
            q.unsqueeze(2),
            k_pool,
            v_pool,
            context_lens,
            block_tables,
            scale=scale,
            config=config,
            window=sliding_window,
            pdl=pdl_supported(q.device),
        )
        return out.squeeze(2)


class TritonPagedAttention:
    """Mixed prefill/decode attention: all decode rows in one decode launch, one prefill launch per chunk.

    The chunk launches take strided views of the flat ``[T, Hq, D]`` query and output (no copies);
    the per-step plan (which rows decode, chunk bounds) is built once per step from the host-side
    metadata and reused by every layer.
    """

    def __init__(self, decode: TritonDecodeAttention | None = None) -> None:
        self.decode = decode or TritonDecodeAttention()
        self._plan_for: AttentionMetadata | None = None
        self._plan: tuple[Any, ...] = ()

    def _make_plan(self, meta: AttentionMetadata, device: torch.device) -> tuple[Any, ...]:
        qsl = meta.query_start_loc_host
        qlens = qsl[1:] - qsl[:-1]
        bs = meta.block_size
        decode = [i for i, n in enumerate(qlens) if n == 1]
        decode_plan = None
        if decode:
            width = -(-max(int(meta.context_lens_host[i]) for i in decode) // bs)
            idx = to_device(np.array([[int(qsl[i]) for i in decode], decode], dtype=np.int64), device)
            decode_plan = (idx[0], idx[1], width)
        chunks = []
        for i, n in enumerate(qlens):
            if n > 1:
                width = -(-int(meta.context_lens_host[i]) // bs)
                chunks.append((i, int(qsl[i]), int(qsl[i + 1]), width))
        return decode_plan, chunks

    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        from trtforge.plugins.attention.chunked_prefill import chunked_prefill_attention

        if self._plan_for is not meta:
            self._plan, self._plan_for = self._make_plan(meta, q.device), meta
        decode_plan, chunks = self._plan
        if sliding_window is not None and chunks:
            return paged_attention_reference(q, k_pool, v_pool, meta, scale, sliding_window)
        out = torch.empty_like(q)
        if decode_plan is not None:
            rows, seqs, width = decode_plan
            tables = meta.block_tables.index_select(0, seqs)[:, :width]
            got = self.decode(
                q.index_select(0, rows),
                k_pool,
                v_pool,
                tables,
                meta.context_lens.index_select(0, seqs),
                scale,
                sliding_window,
            )
            out.index_copy_(0, rows, got)
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
