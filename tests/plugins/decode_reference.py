"""Shared helpers of the decode-attention tests: paged pools with random block placement and the
FP32 SDPA reference over the K/V gathered back through the block table."""

from __future__ import annotations

import torch


def paged_from_contiguous(
    k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, page: int, gen: torch.Generator, spare: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy each sequence's first lens[b] rows of [B, Hkv, S, D] caches into a pool
    [num_blocks, Hkv, page, D] at randomly placed blocks; unused pool blocks and table entries hold
    garbage (NaN rows, out-of-range indices) that a correct kernel never reads."""
    b, hkv, s_max, d = k.shape
    per_seq = [-(-int(n) // page) for n in lens.tolist()]
    max_blocks = -(-s_max // page)
    num_blocks = sum(per_seq) + spare
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((b, max_blocks), num_blocks + 7, dtype=torch.int32)
    k_pool = torch.full((num_blocks, hkv, page, d), float("nan"), dtype=k.dtype)
    v_pool = torch.full_like(k_pool, float("nan"))
    used = 0
    for i, n_blk in enumerate(per_seq):
        for j in range(n_blk):
            blk = int(perm[used])
            used += 1
            table[i, j] = blk
            rows = k[i, :, j * page : (j + 1) * page].cpu()
            k_pool[blk, :, : rows.shape[1]] = rows
            v_pool[blk, :, : rows.shape[1]] = v[i, :, j * page : (j + 1) * page].cpu()
    dev = k.device
    return k_pool.to(dev), v_pool.to(dev), table.to(dev)


def gather_paged(pool: torch.Tensor, table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """Sequence b's first `length` rows [Hkv, length, D], read through the block table."""
    page = pool.shape[2]
    pos = torch.arange(length, device=pool.device)
    blocks = table[b].long()[pos // page]
    return pool[blocks, :, pos % page].transpose(0, 1)


def reference_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """FP32 SDPA per sequence over its gathered K/V with the LOWER_RIGHT causal mask and GQA;
    rows that see no key -> 0."""
    b, hq, s_q, d = q.shape
    out = torch.zeros(b, hq, s_q, d, dtype=torch.float32, device=q.device)
    for i, n in enumerate(lens.tolist()):
        if block_table is None:
            k, v = k_cache[i, :, :n], v_cache[i, :, :n]
        else:
            k, v = gather_paged(k_cache, block_table, i, n), gather_paged(v_cache, block_table, i, n)
        last = n - s_q + torch.arange(s_q, device=q.device)
        keep = torch.arange(n, device=q.device)[None, :] <= last[:, None]
        if n == 0:
            continue
        o = torch.nn.functional.scaled_dot_product_attention(
            q[i : i + 1].float(),
            k[None].float(),
            v[None].float(),
            attn_mask=keep,
            scale=scale,
            enable_gqa=True,
        )
        out[i] = o[0].nan_to_num(0.0)
    return out
