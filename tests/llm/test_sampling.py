"""SamplingParams validation and the batched sampler: greedy, filtering, seeds independent of batch mates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtforge.errors import UserError
from trtforge.llm.sampling import SamplingParams, sample


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"stop_token_ids": [1, -2]}, "stop_token_ids"),
        ({"stop_token_ids": "abc"}, "stop_token_ids"),
        ({"stop_sequences": [[]]}, "stop_sequences"),
        ({"stop_sequences": ["end"]}, "stop_sequences"),
        ({"eos_token_id": -1}, "eos_token_id"),
    ],
)
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(UserError, match=rf"SamplingParams\.{field} must be"):
        SamplingParams(**kwargs)


def test_defaults_are_greedy_and_lists_are_normalised():
    p = SamplingParams(stop_token_ids=[3, 4], stop_sequences=[[1, 2]])
    assert p.greedy and p.stop_token_ids == (3, 4) and p.stop_sequences == ((1, 2),)


def _logits(n=6, vocab=50, seed=0):
    return np.random.default_rng(seed).normal(size=(n, vocab)).astype(np.float32) * 2


def test_greedy_takes_argmax_and_top_k_1_is_greedy():
    x = _logits()
    params = [SamplingParams()] * 3 + [SamplingParams(temperature=1.0, top_k=1, seed=i) for i in range(3)]
    gens = [p.make_generator(0) for p in params]
    assert (sample(x, params, gens) == x.argmax(-1)).all()
    assert (sample(torch.from_numpy(x), params, gens) == x.argmax(-1)).all()


def test_seeded_rows_do_not_depend_on_batch_mates_and_numpy_matches_torch():
    x = _logits(n=8)
    p = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1234)

    def run(rows, others_seed, as_torch):
        params = [p if r == 0 else SamplingParams(temperature=1.3, seed=others_seed + r) for r in rows]
        gens = [q.make_generator(0) for q in params]
        out = []
        for _ in range(20):
            batch = x[rows]
            out.append(int(sample(torch.from_numpy(batch) if as_torch else batch, params, gens)[0]))
        return out

    alone = run([0], 0, False)
    assert run([0, 3, 5, 1], 10, False) == alone
    assert run([0, 7], 99, True) == alone
    assert len(set(alone)) > 1, "a temperature-0.8 sampler over 20 tokens should not be constant"


def test_top_k_and_top_p_restrict_the_support():
    x = _logits(n=1, vocab=30)
    top5 = set(np.argsort(-x[0])[:5].tolist())
    gen = np.random.default_rng(0)
    p = SamplingParams(temperature=5.0, top_k=5)
    seen = {int(sample(x, [p], [gen])[0]) for _ in range(300)}
    assert seen == top5
    probs = np.exp(x[0] - x[0].max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    nucleus = set(order[: int(np.searchsorted(np.cumsum(probs[order]), 0.5) + 1)].tolist())
    p = SamplingParams(temperature=1.0, top_p=0.5)
    seen = {int(sample(torch.from_numpy(x), [p], [gen])[0]) for _ in range(300)}
    assert seen <= nucleus and len(seen) == len(nucleus)


def test_sampled_frequencies_follow_the_softmax():
    x = np.array([[2.0, 1.0, 0.0, -1.0]], dtype=np.float32)
    p = SamplingParams(temperature=1.0)
    gen = np.random.default_rng(5)
    counts = np.bincount([int(sample(x, [p], [gen])[0]) for _ in range(1500)], minlength=4)
    expected = np.exp(x[0]) / np.exp(x[0]).sum()
    assert np.abs(counts / 1500 - expected).max() < 0.05
