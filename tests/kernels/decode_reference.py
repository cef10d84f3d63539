"""Shared helpers of the decode-attention tests: paged pools with random block placement and the
FP32 SDPA reference over the K/V gathered back through the block table."""

from __future__ import annotations

import torch


def attention_inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype, q_gain: float = 1.0):
    """q ``[b, hq, s_q, d]`` (times `q_gain`: the soft-cap tests raise the scores past the cap), k and v
    ``[b, hkv, s_max, d]``, N(0, 1) from `gen`, in `dtype` on `device`."""
    q = (torch.randn(b, hq, s_q, d, generator=gen) * q_gain).to(dtype).to(device)
    k = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(device)
    v = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(device)
    return q, k, v


def paged_from_contiguous(
    k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, page: int, gen: torch.Generator, spare: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy each sequence's blocks of [B, Hkv, S, D] caches (the first ceil(lens[b] / page)) into a
    pool [num_blocks, page, Hkv, D] at randomly placed blocks; spare pool blocks hold NaN and unused
    table entries an out-of-range index, which a correct kernel never reads."""
    b, hkv, s_max, d = k.shape
    max_blocks = -(-s_max // page)
    pad = max_blocks * page - s_max
    per_seq = (lens.cpu().long() + page - 1) // page
    valid = torch.arange(max_blocks)[None, :] < per_seq[:, None]
    num_blocks = int(per_seq.sum()) + spare
    table = torch.full((b, max_blocks), num_blocks + 7, dtype=torch.int32)
    table[valid] = torch.randperm(num_blocks, generator=gen)[: int(per_seq.sum())].to(torch.int32)
    table = table.to(k.device)
    valid = valid.to(k.device)
    pools = []
    for cache in (k, v):
        blocks = torch.nn.functional.pad(cache, (0, 0, 0, pad)).view(b, hkv, max_blocks, page, d)
        pool = torch.full((num_blocks, page, hkv, d), float("nan"), dtype=k.dtype, device=k.device)
        pool[table[valid].long()] = blocks.permute(0, 2, 3, 1, 4)[valid]
        pools.append(pool)
    return pools[0], pools[1], table


def poison_past_lengths(cache: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Set rows at positions >= lens[b] of a contiguous [B, Hkv, S, D] cache to NaN (in place)."""
    past = torch.arange(cache.shape[2], device=cache.device)[None, :] >= lens.to(cache.device)[:, None]
    cache[past[:, None, :, None].expand_as(cache)] = float("nan")
    return cache


def gather_paged(pool: torch.Tensor, table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """Sequence b's first `length` rows [Hkv, length, D], read through the block table of a pool
    [num_blocks, page, Hkv, D]."""
    page = pool.shape[1]
    pos = torch.arange(length, device=pool.device)
    blocks = table[b].long()[pos // page]
    return pool[blocks, pos % page].transpose(0, 1)


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


def windowed_reference(q, k, v, lens, window):
    """FP32 attention of query i (position L - S_q + i) over keys in (its position - window, its position]."""
    b, hq, s_q, d = q.shape
    out = torch.zeros(b, hq, s_q, d, dtype=torch.float32)
    for i, n in enumerate(lens.tolist()):
        pos = n - s_q + torch.arange(s_q)[:, None]
        kpos = torch.arange(n)[None, :]
        keep = (kpos <= pos) & (kpos > pos - window)
        o = torch.nn.functional.scaled_dot_product_attention(
            q[i : i + 1].float().cpu(), k[i : i + 1, :, :n].float().cpu(), v[i : i + 1, :, :n].float().cpu(),
            attn_mask=keep, enable_gqa=True,
        )  # fmt: skip
        out[i] = o[0].nan_to_num(0.0)
    return out


def chunked_reference(q, k, v, lens, chunk):
    """FP32 attention of query i (position p = L - S_q + i) over the keys of its own chunk of `chunk`
    positions, ``p - p % chunk <= j <= p`` (Llama 4's chunked layers); GQA; a row that sees no key -> 0."""
    b, hq, s_q, d = q.shape
    out = torch.zeros(b, hq, s_q, d, dtype=torch.float32)
    for i, n in enumerate(lens.tolist()):
        pos = n - s_q + torch.arange(s_q)[:, None]
        kpos = torch.arange(n)[None, :]
        keep = (kpos <= pos) & (kpos >= pos - pos % chunk)
        o = torch.nn.functional.scaled_dot_product_attention(
            q[i : i + 1].float().cpu(), k[i : i + 1, :, :n].float().cpu(), v[i : i + 1, :, :n].float().cpu(),
            attn_mask=keep, enable_gqa=True,
        )  # fmt: skip
        out[i] = o[0].nan_to_num(0.0)
    return out


def softcapped_reference(q, k, v, lens, softcap, window=None, scale=None, slopes=None, sinks=None):
    """FP32 attention with Gemma 2's attention logit soft-capping over contiguous [B, Hkv, S, D] caches:
    each score s = q . k * scale becomes softcap * tanh(s / softcap) (None: as it is), plus, with ALiBi
    `slopes` ([Hq]), ``slopes[h] * (j - p)`` for query position p and key j; then query i (position
    L - S_q + i) keeps keys j <= its position (and, with `window`, j > position - window); GQA; with
    attention `sinks` ([Hq], gpt-oss) head h's sink logit is one more column of each row's softmax, whose
    probability is dropped (transformers' eager gpt-oss attention); a row that sees no key -> 0."""
    b, hq, s_q, d = q.shape
    group = hq // k.shape[1]
    scale = d**-0.5 if scale is None else scale
    out = torch.zeros(b, hq, s_q, d, dtype=torch.float32)
    for i, n in enumerate(lens.tolist()):
        if n == 0:
            continue
        keys = k[i, :, :n].float().cpu().repeat_interleave(group, 0)
        values = v[i, :, :n].float().cpu().repeat_interleave(group, 0)
        s = q[i].float().cpu() @ keys.transpose(-1, -2) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        pos = n - s_q + torch.arange(s_q)[:, None]
        kpos = torch.arange(n)[None, :]
        if slopes is not None:
            s = s + slopes.float().cpu()[:, None, None] * (kpos - pos).float()
        keep = kpos <= pos
        if window is not None:
            keep &= kpos > pos - window
        s = s.masked_fill(~keep, float("-inf"))
        if sinks is not None:
            sink = sinks.float().cpu()[:, None, None].expand(-1, s_q, 1)
            p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
        else:
            p = torch.softmax(s, -1).nan_to_num(0.0)
        out[i] = p @ values
    return out
