"""The acceptance rules: greedy longest prefix, and rejection sampling checked by chi-square with a mutant."""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.llm.sampling import SamplingParams, probabilities, sample
from trtforge.llm.spec import verify
from trtforge.llm.spec.verify import rejection_sample, verify_greedy

# chi-square critical value for 5 degrees of freedom (6 categories) at significance 1e-3
CHI2_CRIT_DF5 = 20.515
DRAWS = 20000

P = np.array([[0.40, 0.30, 0.10, 0.10, 0.05, 0.05], [0.05, 0.05, 0.10, 0.10, 0.30, 0.40]])
Q = np.array([[0.10, 0.10, 0.40, 0.30, 0.05, 0.05], [0.30, 0.05, 0.05, 0.20, 0.20, 0.20]])


def _chi2(samples: list[int], p: np.ndarray) -> float:
    counts = np.bincount(np.asarray(samples, dtype=np.int64), minlength=len(p))
    expected = p * len(samples)
    return float(((counts - expected) ** 2 / expected).sum())


def test_greedy_accepts_the_longest_matching_prefix_then_the_targets_token():
    assert verify_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted + bonus
    assert verify_greedy([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # first mismatch: the target's token
    assert verify_greedy([5, 6, 7], [1, 6, 7, 8]) == [1]
    assert verify_greedy([], [3]) == [3]


def _run(draws: int, seed: int, one_hot: bool) -> tuple[list[int], list[int]]:
    """First emitted tokens, and second ones where the first proposal was accepted (k = 2)."""
    rng = np.random.default_rng(seed)
    first, second = [], []
    for _ in range(draws):
        if one_hot:  # a proposer without probabilities (prompt lookup): fixed proposals
            draft, q = [0, 3], None
        else:
            draft = [int(rng.choice(6, p=Q[0])), int(rng.choice(6, p=Q[1]))]
            q = Q
        out = rejection_sample(np.vstack([P, P[:1]]), draft, q, rng)
        first.append(out[0])
        if out[0] == draft[0] and len(out) > 1:
            second.append(out[1])
    return first, second


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-q", "one-hot-q"])
def test_rejection_sampling_keeps_the_targets_distribution_and_a_mutant_fails(monkeypatch, one_hot):
    first, second = _run(DRAWS, seed=7, one_hot=one_hot)
    assert _chi2(first, P[0]) < CHI2_CRIT_DF5
    assert len(second) > 2000
    assert _chi2(second, P[1]) < CHI2_CRIT_DF5
    # mutation: on rejection, resample from p instead of the residual max(0, p - q)
    monkeypatch.setattr(verify, "_residual", lambda p, q: p)
    first, _ = _run(DRAWS, seed=7, one_hot=one_hot)
    assert _chi2(first, P[0]) > 10 * CHI2_CRIT_DF5


def test_rejection_sampling_is_reproducible_from_the_seed():
    a, _ = _run(200, seed=3, one_hot=False)
    b, _ = _run(200, seed=3, one_hot=False)
    assert a == b


def test_probabilities_are_the_distribution_sample_draws_from():
    """The rejection sampler's p: plain sampling's temperature / top-k / top-p / min_p processing."""
    logits = np.log(np.array([0.30, 0.25, 0.20, 0.10, 0.08, 0.07]))
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05)
    p = probabilities(logits[None], [params])[0]
    assert p.sum() == pytest.approx(1.0)
    assert p[4] == p[5] == 0.0  # cut by top-k
    rows = np.repeat(logits[None], DRAWS, axis=0)
    gens = [np.random.default_rng(i) for i in range(DRAWS)]
    drawn = sample(rows, [params] * DRAWS, gens)
    keep = p > 0
    counts = np.bincount(drawn, minlength=6)
    assert counts[~keep].sum() == 0
    chi2 = float(((counts[keep] - p[keep] * DRAWS) ** 2 / (p[keep] * DRAWS)).sum())
    assert chi2 < 16.27  # 3 degrees of freedom at 1e-3
    with pytest.raises(ValueError, match="greedy"):
        probabilities(logits[None], [SamplingParams()])
