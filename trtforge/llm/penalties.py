"""Batched logits processing before sampling: repetition / presence / frequency penalties, a grammar
bitmask, min_p, and the logprobs a request asked for; torch (CPU or CUDA) or numpy, one pass for all rows.

Semantics are vLLM's (and OpenAI's for presence/frequency):
- ``repetition_penalty`` r over the prompt *and* output tokens: a seen token's logit is divided by r
  when positive and multiplied by r when not;
- ``frequency_penalty`` f and ``presence_penalty`` p over the output tokens only:
  ``logit -= f * count + p * (count > 0)``;
- ``min_p`` (after temperature): tokens whose probability is below ``min_p`` times the largest one's
  are dropped, which is ``logit < max_logit + log(min_p)`` on the scaled logits.

Token counts come from each row's history (prompt ids, output ids) as one flat index built on the
host and one scatter-add into a ``[rows, vocab]`` tensor on the logits' device: no per-row loop over
the vocabulary. Rows whose parameters are neutral are left untouched, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from trtforge.llm.host_to_device import to_device


class RowHistory(NamedTuple):
    """The token ids a row's penalties look at: its prompt and what it generated so far."""

    prompt: Sequence[int]
    output: Sequence[int]


class TokenLogprobs(NamedTuple):
    """The sampled token's logprob and rank (1 = likeliest) and the `top` likeliest (id, logprob) pairs.

    Logprobs are of the distribution the sampler draws from before truncation: the logits after the
    penalties, the grammar mask and the temperature (temperature 0 counts as 1), log-softmaxed over
    the whole vocabulary; top-k, top-p and min_p do not change them (vLLM's "processed_logprobs").
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def penalized(p: Any) -> bool:
    """Whether SamplingParams `p` has any penalty set (so its row needs its token history)."""
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _counts_index(
    histories: Sequence[RowHistory], rows: np.ndarray, vocab: int, outputs_only: bool
) -> np.ndarray:
    """Flat positions ``row * vocab + id`` of every counted token of `rows` (one entry per occurrence)."""
    parts = []
    for r in rows.tolist():
        h = histories[r]
        ids = h.output if outputs_only else list(h.prompt) + list(h.output)
        if len(ids):
            parts.append(np.asarray(ids, dtype=np.int64) + r * vocab)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def apply_penalties(logits: Any, params: Sequence[Any], histories: Sequence[RowHistory] | None) -> Any:
    """`logits` ``[N, vocab]`` with each row's penalties applied; the same object when no row has any.

    A changed batch comes back as a new float32 tensor/array (the input is never written).
    """
    rows = np.array([i for i, p in enumerate(params) if penalized(p)], dtype=np.int64)
    if not len(rows):
        return logits
    if histories is None or len(histories) != len(params):
        raise ValueError("penalties need one RowHistory per row")
    n, vocab = int(logits.shape[0]), int(logits.shape[1])
    rep = np.ones(n, dtype=np.float32)
    freq = np.zeros(n, dtype=np.float32)
    pres = np.zeros(n, dtype=np.float32)
    for i in rows.tolist():
        rep[i] = params[i].repetition_penalty
        freq[i] = params[i].frequency_penalty
        pres[i] = params[i].presence_penalty
    seen_idx = _counts_index(histories, rows[rep[rows] != 1.0], vocab, outputs_only=False)
    out_idx = _counts_index(histories, rows[(freq[rows] != 0) | (pres[rows] != 0)], vocab, outputs_only=True)
    if isinstance(logits, np.ndarray):
        x = logits.astype(np.float32, copy=True)
        seen = np.bincount(seen_idx, minlength=n * vocab).reshape(n, vocab) > 0
        counts = np.bincount(out_idx, minlength=n * vocab).reshape(n, vocab).astype(np.float32)
        factor = np.where(seen, rep[:, None], np.float32(1.0))
        x = np.where(x > 0, x / factor, x * factor)
        return x - freq[:, None] * counts - pres[:, None] * (counts > 0)
    import torch

    dev = logits.device
    x = logits.float().clone()
    settings = to_device(np.stack([rep, freq, pres]), dev)
    rep_t, freq_t, pres_t = settings[0], settings[1], settings[2]
    seen = torch.zeros(n * vocab, dtype=torch.float32, device=dev)
    seen.index_add_(0, to_device(seen_idx, dev), torch.ones(len(seen_idx), device=dev))
    counts = torch.zeros(n * vocab, dtype=torch.float32, device=dev)
    counts.index_add_(0, to_device(out_idx, dev), torch.ones(len(out_idx), device=dev))
    seen, counts = seen.view(n, vocab), counts.view(n, vocab)
    factor = torch.where(seen > 0, rep_t[:, None], torch.ones((), device=dev))
    x = torch.where(x > 0, x / factor, x * factor)
    return x - freq_t[:, None] * counts - pres_t[:, None] * (counts > 0)


def apply_bitmask(logits: Any, bitmask: Any) -> Any:
    """`logits` with the tokens a packed int32 bitmask ``[N, ceil(vocab / 32)]`` forbids set to -inf.

    Bit ``t % 32`` of word ``t // 32`` set means token t is allowed (xgrammar's layout). Returns a new
    float32 tensor/array on the logits' device.
    """
    vocab = int(logits.shape[1])
    if isinstance(logits, np.ndarray):
        words = np.asarray(bitmask, dtype=np.int32).view(np.uint32)
        bits = (words[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1
        allowed = bits.reshape(words.shape[0], -1)[:, :vocab].astype(bool)
        return np.where(allowed, logits.astype(np.float32), np.float32(-np.inf))
    import torch

    words = torch.as_tensor(bitmask).to(logits.device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((words[:, :, None] >> shifts) & 1).reshape(words.shape[0], -1)[:, :vocab].bool()
    return logits.float().masked_fill(~allowed, -math.inf)


def min_p_floor(x: Any, min_p: Any) -> Any:
    """The per-row logit floor of min_p on temperature-scaled logits `x` (``-inf`` where min_p is 0)."""
    if isinstance(x, np.ndarray):
        with np.errstate(divide="ignore"):
            return x.max(-1) + np.log(min_p)
    return x.max(-1).values + min_p.log()


def compute_logprobs(x: Any, tokens: Any, k: int) -> tuple[Any, Any, Any, Any]:
    """Logprobs of `x` ``[N, vocab]`` (already processed and scaled): per row the sampled `tokens`' logprob
    and rank, and the top `k` ids and logprobs (ties by lower id), all on x's device."""
    if isinstance(x, np.ndarray):
        shifted = x - x.max(-1, keepdims=True)
        lp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        chosen = np.take_along_axis(lp, tokens[:, None], 1)[:, 0]
        rank = (lp > chosen[:, None]).sum(-1) + 1
        order = np.argsort(-lp, axis=-1, kind="stable")[:, :k]
        return chosen, rank, order, np.take_along_axis(lp, order, 1)
    import torch

    lp = torch.log_softmax(x.double(), dim=-1)
    chosen = lp.gather(1, tokens[:, None])[:, 0]
    rank = (lp > chosen[:, None]).sum(-1) + 1
    top, order = torch.sort(lp, dim=-1, descending=True, stable=True)
    return chosen, rank, order[:, :k], top[:, :k]
