"""The acceptance rules of speculative decoding, per sequence, on the host.

Greedy: accept the longest prefix of the proposals that equals the target's argmax at each position,
then emit the target's argmax after it (the bonus token): the output is token for token what plain
greedy decoding gives. Sampling: the standard rejection-sampling rule (Leviathan et al. 2023, Chen et
al. 2023): accept proposal t at position j with probability min(1, p_j(t) / q_j(t)); on the first
rejection draw from the residual normalise(max(0, p_j - q_j)) and stop; when all are accepted, draw
a bonus token from p_k. Each emitted token is then distributed exactly as the target's p, whatever q
is; q one-hot (a proposer without probabilities, e.g. prompt lookup) makes the residual p with the
proposed token removed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def verify_greedy(draft: Sequence[int], argmax: Sequence[int]) -> list[int]:
    """The tokens a greedy row emits: the proposals matching `argmax` (``len(draft) + 1`` target
    argmaxes, one per verified position), then the target's argmax after the last match."""
    out: list[int] = []
    for d, t in zip(draft, argmax):
        if d != t:
            break
        out.append(int(d))
    out.append(int(argmax[len(out)]))
    return out


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalise(max(0, p - q)): where a rejected position draws from (p itself if it has no mass)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from `probs` (inverse CDF with one uniform of `rng`)."""
    cum = np.cumsum(probs)
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(probs) - 1))


def rejection_sample(
    p: np.ndarray, draft: Sequence[int], q: np.ndarray | None, rng: np.random.Generator
) -> list[int]:
    """The tokens a sampled row emits: `p` float64 ``[k+1, vocab]`` the target's distributions at the
    k proposals' positions and the one after, `draft` the k proposals, `q` ``[k, vocab]`` the
    distributions they were drawn from (None: each proposal had probability 1), `rng` the request's
    generator (one uniform per accept test, one per residual or bonus draw)."""
    out: list[int] = []
    for j, t in enumerate(draft):
        t = int(t)
        qt = 1.0 if q is None else float(q[j, t])
        if rng.random() * qt < p[j, t]:  # accept with probability min(1, p/q)
            out.append(t)
            continue
        if q is None:
            qj = np.zeros_like(p[j])
            qj[t] = 1.0
        else:
            qj = q[j]
        out.append(_draw(_residual(p[j], qj), rng))
        return out
    out.append(_draw(p[len(draft)], rng))
    return out
