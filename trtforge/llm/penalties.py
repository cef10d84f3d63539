"""Batched logits processing before sampling: a grammar bitmask, OpenAI's logit bias, repetition /
presence / frequency penalties, min_p, and the logprobs a request asked for; torch (CPU or CUDA) or
numpy, one pass for all rows.

The order is vLLM's: the grammar mask (its allowed tokens), then the logit bias, then the penalties,
then temperature and min_p / top-k / top-p. So a banned or masked token stays out whatever its bias
(``-inf + 100`` is ``-inf``), and a penalty scales a biased logit (a repeated token with +5 and
repetition penalty 2 gets ``(x + 5) / 2`` when positive). Greedy rows take the argmax of the
processed logits, and the logprobs (:class:`TokenLogprobs`) are of them too.

Semantics are vLLM's (and OpenAI's for presence/frequency and logit_bias):
- ``logit_bias`` {token id: b}, b in [-100, 100]: ``logit += b`` for those ids (one scatter-add of
  every biased row's entries; the ids are checked against the vocabulary when the request is queued);
- ``repetition_penalty`` r over the prompt *and* output tokens: a seen token's logit is divided by r
  when positive and multiplied by r when not; any r > 0 is served (vLLM's range): where a penalised
  logit would leave float32 (a tiny r dividing, a huge one multiplying; an r float32 cannot hold is
  taken as its nearest normal float32) it saturates at float32's largest magnitude, so a tiny r all but
  forces the seen tokens with a positive logit (tied) and a huge one puts the seen ones last, finite
  (inf - inf was NaN: NaN logprobs and a garbage token, even one the grammar forbids);
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

_F32 = np.finfo(np.float32)
# float32's largest finite magnitude: penalised logits saturate there (see the module docstring)
F32_MAX = float(_F32.max)
# the least logprob reported (:class:`TokenLogprobs`): OpenAI's API and vLLM's server report an
# impossible token (-inf) as -9999.0
LOGPROB_FLOOR = -9999.0


class RowHistory(NamedTuple):
    """The token ids a row's penalties look at: its prompt and what it generated so far."""

    prompt: Sequence[int]
    output: Sequence[int]


class TokenLogprobs(NamedTuple):
    """The sampled token's logprob and rank (1 = likeliest) and the `top` likeliest (id, logprob) pairs.

    Logprobs are of the distribution the sampler draws from before truncation: the logits after the
    grammar mask, the logit bias, the penalties and the temperature (temperature 0 counts as 1),
    log-softmaxed over the whole vocabulary; top-k, top-p and min_p do not change them (vLLM's
    "processed_logprobs"). A greedy row's token is the argmax of the same logits: rank 1. Logprobs are
    at least :data:`LOGPROB_FLOOR` (OpenAI's and vLLM's server's -9999.0), so a token the grammar
    forbids, -inf, is listed as -9999.0: JSON has no infinities (the OpenAI server answered 500).
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def penalized(p: Any) -> bool:
    """Whether SamplingParams `p` has any penalty set (so its row needs its token history)."""
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def biased(p: Any) -> bool:
    """Whether SamplingParams `p` carries a logit bias (its row's logits change before sampling)."""
    return bool(getattr(p, "logit_bias", None))


def apply_logit_bias(logits: Any, params: Sequence[Any]) -> Any:
    """`logits` ``[N, vocab]`` with each row's ``logit_bias`` added; the same object when no row has one.

    Every biased row's (flat position, bias) pairs are concatenated on the host and added in one
    scatter on the logits' device; a changed batch comes back as a new contiguous tensor/array of
    float32 (float64 stays float64), so rows without a bias keep their values bit for bit.
    """
    rows = [i for i, p in enumerate(params) if biased(p)]
    if not rows:
        return logits
    vocab = int(logits.shape[1])
    flat, values = [], []
    for i in rows:
        ids, bias = params[i].logit_bias_arrays
        if int(ids.max()) >= vocab:
            raise ValueError(
                f"row {i}: logit_bias holds token id {int(ids.max())}, outside the vocabulary [0, {vocab})"
            )
        flat.append(ids + i * vocab)
        values.append(bias)
    idx, val = np.concatenate(flat), np.concatenate(values)
    if isinstance(logits, np.ndarray):
        x = np.array(logits, dtype=np.result_type(logits.dtype, np.float32), order="C")
        x.reshape(-1)[idx] += val.astype(x.dtype)  # (ids are unique within a row: no repeated position)
        return x
    import torch

    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
    dev = x.device
    host_val = val.astype(np.float64 if dtype == torch.float64 else np.float32)
    x.view(-1).index_add_(0, to_device(idx, dev), to_device(host_val, dev))
    return x


def _counts_index(
    histories: Sequence[RowHistory], rows: np.ndarray, vocab: int, outputs_only: bool
) -> np.ndarray:
    """Flat positions ``row * vocab + id`` of every counted token of `rows` (one entry per occurrence).
    A prompt id at or past the logits' width `vocab` (an LM head pruned to a prefix of the vocabulary)
    has no logit to penalize, so it is skipped rather than landing in the next row."""
    parts = []
    for r in rows.tolist():
        h = histories[r]
        ids = np.asarray(h.output if outputs_only else list(h.prompt) + list(h.output), dtype=np.int64)
        ids = ids[ids < vocab]
        if len(ids):
            parts.append(ids + r * vocab)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def apply_penalties(logits: Any, params: Sequence[Any], histories: Sequence[RowHistory] | None) -> Any:
    """`logits` ``[N, vocab]`` with each row's penalties applied; the same object when no row has any.

    A changed batch comes back as a new float32 tensor/array (the input is never written); a finite
    logit stays finite (saturating at :data:`F32_MAX`), a masked (-inf) one stays -inf.
    """
    rows = np.array([i for i, p in enumerate(params) if penalized(p)], dtype=np.int64)
    if not len(rows):
        return logits
    if histories is None or len(histories) != len(params):
        raise ValueError("penalties need one RowHistory per row")
    n, vocab = int(logits.shape[0]), int(logits.shape[1])
    rep64 = np.ones(n, dtype=np.float64)
    freq = np.zeros(n, dtype=np.float32)
    pres = np.zeros(n, dtype=np.float32)
    for i in rows.tolist():
        rep64[i] = params[i].repetition_penalty
        freq[i] = params[i].frequency_penalty
        pres[i] = params[i].presence_penalty
    # a penalty that float32 rounds to 0 or inf would make -inf * 0 and 0 * inf NaN
    rep = np.clip(rep64, _F32.tiny, _F32.max).astype(np.float32)
    seen_idx = _counts_index(histories, rows[rep[rows] != 1.0], vocab, outputs_only=False)
    out_idx = _counts_index(histories, rows[(freq[rows] != 0) | (pres[rows] != 0)], vocab, outputs_only=True)
    if isinstance(logits, np.ndarray):
        x = logits.astype(np.float32, copy=True)
        seen = np.bincount(seen_idx, minlength=n * vocab).reshape(n, vocab) > 0
        counts = np.bincount(out_idx, minlength=n * vocab).reshape(n, vocab).astype(np.float32)
        factor = np.where(seen, rep[:, None], np.float32(1.0))
        with np.errstate(over="ignore"):
            y = np.where(x > 0, x / factor, x * factor)
        y = y - freq[:, None] * counts - pres[:, None] * (counts > 0)
        return np.where(np.isfinite(x), np.clip(y, -F32_MAX, F32_MAX), y)
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
    y = torch.where(x > 0, x / factor, x * factor)
    y = y - freq_t[:, None] * counts - pres_t[:, None] * (counts > 0)
    return torch.where(x.isfinite(), y.clamp(-F32_MAX, F32_MAX), y)


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

    words = to_device(np.ascontiguousarray(bitmask, dtype=np.int32), logits.device)
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
    and rank, and the top `k` ids and logprobs (ties by lower id), all on x's device; the logprobs
    floored at :data:`LOGPROB_FLOOR` (the ranks are of the exact ones)."""
    if isinstance(x, np.ndarray):
        shifted = x - x.max(-1, keepdims=True)
        lp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        chosen = np.take_along_axis(lp, tokens[:, None], 1)[:, 0]
        rank = (lp > chosen[:, None]).sum(-1) + 1
        order = np.argsort(-lp, axis=-1, kind="stable")[:, :k]
        top = np.take_along_axis(lp, order, 1)
        return np.maximum(chosen, LOGPROB_FLOOR), rank, order, np.maximum(top, LOGPROB_FLOOR)
    import torch

    lp = torch.log_softmax(x.double(), dim=-1)
    chosen = lp.gather(1, tokens[:, None])[:, 0]
    rank = (lp > chosen[:, None]).sum(-1) + 1
    top, order = torch.sort(lp, dim=-1, descending=True, stable=True)
    return chosen.clamp(min=LOGPROB_FLOOR), rank, order[:, :k], top[:, :k].clamp(min=LOGPROB_FLOOR)
