"""Penalties, min_p, logprobs and the grammar bitmask in the batched sampler, against per-row references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from trtforge.errors import UserError
from trtforge.llm.penalties import RowHistory, apply_bitmask, apply_penalties
from trtforge.llm.sampling import SamplingParams, child_seed, sample, sample_async, sample_with_logprobs

VOCAB = 40


def _logits(n=5, vocab=VOCAB, seed=0):
    return np.random.default_rng(seed).normal(size=(n, vocab)).astype(np.float32) * 3


def _histories(n, seed=1, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, rng.integers(1, 12)).tolist() for _ in range(n)]
    return [RowHistory(prompts[r], rng.integers(0, vocab, r * 3).tolist()) for r in range(n)]


def _reference_row(logits, p, hist):
    """vLLM's penalties, written out for one row with Python loops over its tokens."""
    x = [float(v) for v in logits]
    for t in set(hist.prompt) | set(hist.output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(hist.output):
        c = list(hist.output).count(t)
        x[t] -= p.frequency_penalty * c + p.presence_penalty
    return np.array(x)


ROW_PARAMS = [
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.7, presence_penalty=0.5),
    SamplingParams(frequency_penalty=0.8),
    SamplingParams(),
    SamplingParams(presence_penalty=-1.0, frequency_penalty=0.3, repetition_penalty=1.1),
]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_penalties_match_the_per_row_reference(kind):
    x = _logits()
    hist = _histories(len(ROW_PARAMS))
    got = apply_penalties(x if kind == "numpy" else torch.from_numpy(x), ROW_PARAMS, hist)
    got = np.asarray(got)
    for r, p in enumerate(ROW_PARAMS):
        np.testing.assert_allclose(got[r], _reference_row(x[r], p, hist[r]), rtol=1e-6, atol=1e-6)
    assert (got[3] == x[3]).all()  # the neutral row is untouched
    assert not np.array_equal(got[2], x[2])  # and the others did change


def test_neutral_penalties_return_the_same_logits_and_need_no_history():
    x = _logits()
    assert apply_penalties(x, [SamplingParams()] * 5, None) is x


def test_greedy_with_penalties_avoids_repeats():
    x = np.zeros((1, VOCAB), dtype=np.float32)
    x[0, 7], x[0, 9] = 3.0, 2.5
    hist = [RowHistory([1], [7, 7])]
    p = SamplingParams(frequency_penalty=1.0)
    assert sample(x, [p], [p.make_generator(0)], hist)[0] == 9
    assert sample(x, [SamplingParams()], [p.make_generator(0)])[0] == 7


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_min_p_keeps_exactly_the_tokens_above_its_share_of_the_top(kind):
    x = _logits(n=1)
    p = SamplingParams(temperature=1.0, min_p=0.2)
    probs = np.exp(x[0] - x[0].max())
    allowed = set(np.flatnonzero(probs >= 0.2).tolist())
    gen = np.random.default_rng(3)
    inp = x if kind == "numpy" else torch.from_numpy(x)
    seen = {int(sample(inp, [p], [gen])[0]) for _ in range(400)}
    assert seen == allowed and len(allowed) > 1


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_logprobs_are_the_processed_distribution_sorted_and_normalised(kind):
    x = _logits(n=3)
    params = [
        SamplingParams(logprobs=5, temperature=0.7, seed=1),
        SamplingParams(),
        SamplingParams(logprobs=0, repetition_penalty=1.5),
    ]
    hist = _histories(3)
    gens = [p.make_generator(0) for p in params]
    inp = x if kind == "numpy" else torch.from_numpy(x)
    tokens, lps = sample_with_logprobs(inp, params, gens, hist)
    assert lps[1] is None and len(lps[2].top) == 0
    ref0 = x[0].astype(np.float64) / 0.7
    ref0 = ref0 - np.log(np.exp(ref0).sum())
    top = lps[0].top
    assert [t for t, _ in top] == np.argsort(-ref0, kind="stable")[:5].tolist()
    np.testing.assert_allclose([v for _, v in top], np.sort(ref0)[::-1][:5], rtol=1e-9)
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(top))
    assert lps[0].token_id == tokens[0]
    assert lps[0].logprob == pytest.approx(ref0[tokens[0]])
    assert lps[0].rank == int((ref0 > ref0[tokens[0]]).sum()) + 1
    ref2 = _reference_row(x[2], params[2], hist[2])
    ref2 = ref2 - np.log(np.exp(ref2).sum())
    assert math.isclose(np.exp(ref2).sum(), 1.0)
    assert lps[2].token_id == int(np.argmax(ref2)) == tokens[2]
    assert lps[2].logprob == pytest.approx(ref2.max(), abs=1e-6) and lps[2].rank == 1


def test_sample_async_carries_the_same_logprobs():
    x = torch.from_numpy(_logits(n=2))
    params = [SamplingParams(logprobs=3, temperature=1.0, seed=5), SamplingParams(logprobs=2)]
    a = sample_async(x, params, [p.make_generator(0) for p in params])
    b = sample_with_logprobs(x, params, [p.make_generator(0) for p in params])
    assert a.result().tolist() == b[0].tolist() and a.logprobs == b[1]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_bitmask_forbids_exactly_its_cleared_bits(kind):
    x = _logits(n=2, vocab=70)
    allowed = [{3, 31, 32, 69}, set(range(70))]
    mask = np.zeros((2, 3), dtype=np.int32)
    for r, ids in enumerate(allowed):
        for t in ids:
            mask[r, t // 32] = (mask[r, t // 32].view(np.uint32) | np.uint32(1 << (t % 32))).view(np.int32)
    inp = x if kind == "numpy" else torch.from_numpy(x)
    got = np.asarray(apply_bitmask(inp, mask))
    assert set(np.flatnonzero(np.isfinite(got[0])).tolist()) == allowed[0]
    assert (got[1] == x[1]).all()
    p = SamplingParams(temperature=2.0)
    gen = np.random.default_rng(0)
    seen = {int(sample(inp[:1], [p], [gen], bitmask=mask[:1])[0]) for _ in range(200)}
    assert seen == allowed[0]


def test_seeded_penalised_request_does_not_depend_on_its_neighbours():
    x = _logits(n=8)
    hist = _histories(8)
    p = SamplingParams(temperature=0.9, min_p=0.05, presence_penalty=0.4, repetition_penalty=1.2, seed=77)

    def run(rows, neighbour_seed, as_torch):
        params = [
            p if r == 0 else SamplingParams(temperature=1.2, frequency_penalty=0.5, seed=neighbour_seed + r)
            for r in rows
        ]
        gens = [q.make_generator(0) for q in params]
        out = []
        for _ in range(15):
            batch = x[rows]
            inp = torch.from_numpy(batch) if as_torch else batch
            out.append(int(sample(inp, params, gens, [hist[r] for r in rows])[0]))
        return out

    alone = run([0], 0, False)
    assert run([0, 4, 2, 7], 11, False) == alone
    assert run([0, 5], 3, True) == alone
    assert len(set(alone)) > 1


def test_neutral_options_leave_greedy_and_seeded_tokens_unchanged():
    x = _logits(n=4)
    plain = [SamplingParams(), SamplingParams(temperature=0.8, seed=3)]
    neutral = [
        SamplingParams(
            temperature=q.temperature,
            seed=q.seed,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            min_p=0.0,
            n=1,
            logprobs=None,
        )
        for q in plain
    ]
    for _ in range(3):
        a = sample(x[:2], plain, [q.make_generator(0) for q in plain])
        b = sample(x[:2], neutral, [q.make_generator(0) for q in neutral], _histories(2))
        assert a.tolist() == b.tolist()


def test_n_expands_into_reproducible_independent_samples():
    p = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=4)
    kids = p.expand()
    assert [k.n for k in kids] == [1, 1, 1] and kids[0].seed == 9
    assert len({k.seed for k in kids}) == 3 and [k.seed for k in p.expand()] == [k.seed for k in kids]
    assert kids[2].seed == child_seed(9, 2) and 0 <= kids[2].seed < 2**63
    assert all(k.seed is None for k in SamplingParams(n=2).expand())
    assert SamplingParams().expand() == [SamplingParams()]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"stop": [""]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
    ],
)
def test_invalid_new_fields_name_the_field(kwargs, field):
    with pytest.raises(UserError, match=rf"SamplingParams\.{field} must be"):
        SamplingParams(**kwargs)


def test_stop_strings_and_text_format_are_normalised():
    assert SamplingParams(stop="END").stop == ("END",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(response_format={"type": "text"}).response_format is None
