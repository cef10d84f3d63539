"""Reference paged attention in torch: gather each sequence's blocks, then SDPA with a length/causal mask.

The executor calls an attention function of this signature, so a fused paged kernel (a Triton
decode kernel on CUDA) can replace it: ``fn(q, k_pool, v_pool, meta, scale, sliding_window) -> out``
with ``q``/``out`` ``[T, Hq, D]`` (new tokens, sequence after sequence) and pools
``[num_blocks, block_size, Hkv, D]`` that already hold this step's K/V.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Device tensors describing one step's ragged batch (see :class:`trtforge.llm.executor.StepBatch`)."""

    query_start_loc: torch.Tensor  # int32 [B+1]
    context_lens: torch.Tensor  # int32 [B], K/V length after this step
    block_tables: torch.Tensor  # int32 [B, W]
    token_seq: torch.Tensor  # int64 [T], sequence of each new token
    token_offset: torch.Tensor  # int64 [T], index of each new token within its sequence's query
    max_query_len: int
    max_context_len: int
    block_size: int

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class AttentionFn(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor: ...


def paged_attention_reference(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attend each new token to its sequence's cached keys at positions <= its own (bottom-right causal).

    Queries are padded to ``[B, max_query_len]`` and keys gathered to ``[B, blocks * block_size]``
    through the block table; positions past a sequence's length are masked, and with
    `sliding_window` W a query at position p sees keys at positions > p - W.
    """
    num_seqs = meta.context_lens.shape[0]
    _, bs, hkv, d = k_pool.shape
    hq = q.shape[1]
    nblk = -(-meta.max_context_len // bs)
    table = meta.block_tables[:, :nblk].long()
    k = k_pool[table].reshape(num_seqs, nblk * bs, hkv, d).transpose(1, 2)
    v = v_pool[table].reshape(num_seqs, nblk * bs, hkv, d).transpose(1, 2)
    qp = q.new_zeros(num_seqs, meta.max_query_len, hq, d)
    qp[meta.token_seq, meta.token_offset] = q
    ctx = meta.context_lens.long()
    qlen = (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).long()
    qpos = (ctx - qlen)[:, None] + torch.arange(meta.max_query_len, device=q.device)[None, :]
    kpos = torch.arange(nblk * bs, device=q.device)
    mask = (kpos[None, None, :] <= qpos[:, :, None]) & (kpos[None, None, :] < ctx[:, None, None])
    if sliding_window is not None:
        mask &= kpos[None, None, :] > qpos[:, :, None] - sliding_window
    out = torch.nn.functional.scaled_dot_product_attention(
        qp.transpose(1, 2), k, v, attn_mask=mask[:, None], scale=scale, enable_gqa=hq != hkv
    )
    return out.transpose(1, 2)[meta.token_seq, meta.token_offset]
