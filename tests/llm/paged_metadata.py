"""Paged-attention metadata of a ragged prefill+decode batch over randomly placed blocks (shared by tests)."""

from __future__ import annotations

import numpy as np
import torch

from trtforge.llm.executors.paged_attention import AttentionMetadata


def mixed_metadata(device, g, bs, nblocks, ctx_lens, q_lens) -> tuple[AttentionMetadata, list[list[int]]]:
    """Metadata for sequences of context lengths `ctx_lens` bringing `q_lens` new tokens, their blocks
    drawn by a random permutation of the pool (from generator `g`); also each sequence's block list."""
    perm = torch.randperm(nblocks, generator=g).tolist()
    tables, used = [], 0
    for c in ctx_lens:
        n = -(-c // bs)
        tables.append(perm[used : used + n])
        used += n
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    meta = AttentionMetadata(
        query_start_loc=torch.from_numpy(qsl).to(device),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=device),
        block_tables=table.to(device),
        query_start_loc_host=qsl,
        context_lens_host=np.array(ctx_lens, dtype=np.int32),
        max_query_len=max(q_lens),
        max_context_len=max(ctx_lens),
        block_size=bs,
    )
    return meta, tables


def mixed_batch(device, ctx_lens, q_lens, seed: int):
    """A mixed step over 64 random FP16 pool blocks of 16 (8 query heads on 2 kv heads of 32), sequences
    of `ctx_lens` keys with `q_lens` new tokens: its metadata, the pools, the queries and the head dim."""
    g = torch.Generator().manual_seed(seed)
    bs, hq, hkv, d, nblocks = 16, 8, 2, 32, 64
    meta, _ = mixed_metadata(device, g, bs, nblocks, ctx_lens, q_lens)
    k_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half().to(device)
    v_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half().to(device)
    q = torch.randn(sum(q_lens), hq, d, generator=g).half().to(device)
    return meta, k_pool, v_pool, q, d
