"""SamplingParams at hostile but type-valid values: each either samples a sane token with finite logprobs
(JSON cannot encode NaN or infinities: the OpenAI server answered 500) or is refused naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.llm.serving_models import VOCAB, make_executor
from trtforge.errors import UserError
from trtforge.llm.engine import LLMEngine
from trtforge.llm.penalties import LOGPROB_FLOOR, RowHistory, apply_penalties
from trtforge.llm.sampling import SamplingParams, sample_with_logprobs
from trtforge.llm.sched.scheduler import SchedulerConfig

V = 40
FMAX = float(np.finfo(np.float32).max)
# a repetition penalty that is 0 in float32 (1e-300, 1e-46), whose division overflows it (1e-38), that
# overflows float32 itself (1e39, 1e300), or whose product overflows it (1e37 times a logit of -40)
EXTREME_PENALTIES = [1e-300, 1e-46, 1e-38, 1e37, 1e39, 1e300]


def _logits(seed=0, vocab=V):
    return (np.random.default_rng(seed).normal(size=(1, vocab)) * 3).astype(np.float32)


def _as(kind, x):
    return x if kind == "numpy" else torch.from_numpy(x)


def _finite(lp):
    return math.isfinite(lp.logprob) and all(math.isfinite(v) for _, v in lp.top)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("rp", EXTREME_PENALTIES)
def test_an_extreme_repetition_penalty_keeps_the_logits_finite(kind, rp):
    """Before: 1e-300 is 0 in float32, a positive logit / 0 is inf, and the sampler's inf - inf NaN; 1e39
    is inf, 0 * inf is NaN and every seen negative logit -inf (all of them NaN once softmaxed). Now the
    penalised logits saturate at float32's largest magnitude: seen positive tokens all but forced by a
    tiny penalty, seen ones pushed to the bottom by a huge one."""
    x = _logits() * 40
    x[0, :4] = [0.0, 5.0, -5.0, 2.0]
    hist = [RowHistory(list(range(V)), [])]  # every token seen
    got = np.asarray(apply_penalties(_as(kind, x), [SamplingParams(repetition_penalty=rp)], hist))
    assert np.isfinite(got).all()
    if rp < 1:
        assert (got[x > 0] >= x[x > 0]).all() and (got[x <= 0] <= 0).all() and got.max() > 1e30
    else:
        assert (got[x > 0] <= x[x > 0]).all() and (got[x < 0] <= x[x < 0]).all() and got.min() < -1e30
    assert got[0, 0] == 0.0  # 0 / r and 0 * r stay 0 (0 * inf was NaN)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("rp", EXTREME_PENALTIES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_extreme_repetition_penalty_samples_a_sane_token_with_finite_logprobs(kind, rp, temperature):
    vocab = 20  # logprobs (at most 20) of the whole vocabulary
    x = _logits(vocab=vocab)
    x[0, 5:9] = [0.0, -3.0, 0.5, -1.0]
    seen = [5, 6, 7, 8, 11, 12]
    p = SamplingParams(repetition_penalty=rp, temperature=temperature, seed=3, logprobs=vocab)
    for hist in ([RowHistory(seen, [])], [RowHistory(list(range(vocab)), [])]):
        tokens, lps = sample_with_logprobs(_as(kind, x), [p], [p.make_generator(0)], hist)
        assert 0 <= tokens[0] < vocab and _finite(lps[0]), (tokens, lps)
        assert lps[0].token_id == tokens[0] and len(lps[0].top) == vocab
    # a tiny penalty all but forces a seen token with a positive logit (7 here); greedy, a huge one
    # takes the likeliest unseen token
    tokens, _ = sample_with_logprobs(_as(kind, x), [p], [p.make_generator(0)], [RowHistory(seen, [])])
    seen_positive = {t for t in seen if x[0, t] > 0}
    if rp < 1:
        assert tokens[0] in seen_positive
    elif temperature == 0:
        assert tokens[0] == max(set(range(vocab)) - set(seen), key=lambda t: x[0, t])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_tiny_repetition_penalty_keeps_the_grammar_mask(kind):
    """Before: -inf (a masked token) * 0 is NaN, and greedy argmax took the NaN: a token the grammar
    forbids (3 here, of the allowed 0, 1, 2)."""
    x = _logits()
    mask = np.zeros((1, 2), dtype=np.int32)
    mask[0, 0] = 0b111
    p = SamplingParams(repetition_penalty=1e-300, logprobs=2)
    tokens, lps = sample_with_logprobs(_as(kind, x), [p], [None], [RowHistory(list(range(V)), [])], mask)
    assert tokens[0] in (0, 1, 2) and math.isfinite(lps[0].logprob)


def test_sane_repetition_penalties_are_unchanged_bit_for_bit():
    x = _logits() * 5
    hist = [RowHistory([1, 2, 3, 9, 20], [4, 4, 30])]
    for rp in (0.5, 1.1, 1.3, 2.0):
        p = SamplingParams(repetition_penalty=rp, presence_penalty=0.5, frequency_penalty=-0.3)
        factor = np.where(np.isin(np.arange(V), [1, 2, 3, 9, 20, 4, 30]), np.float32(rp), np.float32(1))
        want = np.where(x > 0, x / factor, x * factor)
        counts = np.bincount([4, 4, 30], minlength=V).astype(np.float32)
        want = want - np.float32(-0.3) * counts - np.float32(0.5) * (counts > 0)
        for kind in ("numpy", "torch"):
            got = np.asarray(apply_penalties(_as(kind, x), [p], hist))
            assert got.tobytes() == want.astype(np.float32).tobytes()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_top_logprobs_of_masked_tokens_are_finite(kind):
    """Before: the top logprobs of tokens the grammar forbids were -inf (a JSON-schema request with
    top_logprobs 20 at a position where fewer than 20 tokens are allowed: the server answered 500).
    Now they are -9999.0, OpenAI's and vLLM's value for an impossible token."""
    x = _logits()
    mask = np.zeros((1, 2), dtype=np.int32)
    mask[0, 0] = 0b111
    p = SamplingParams(logprobs=20)
    tokens, lps = sample_with_logprobs(_as(kind, x), [p], [None], None, mask)
    lp = lps[0]
    assert tokens[0] in (0, 1, 2) and lp.rank == 1 and _finite(lp)
    assert LOGPROB_FLOOR == -9999.0 and [v for _, v in lp.top][3:] == [LOGPROB_FLOOR] * 17
    assert {t for t, _ in lp.top[:3]} == {0, 1, 2} and all(v > LOGPROB_FLOOR for _, v in lp.top[:3])


@pytest.fixture(scope="module")
def engine():
    eng = LLMEngine(make_executor(num_blocks=128), SchedulerConfig(max_num_seqs=8, max_prefill_chunk=64))
    yield eng
    eng.close()


@pytest.mark.parametrize("rp", [1e-300, 1e-40, 1e39, 1e300])
def test_an_extreme_repetition_penalty_through_the_engine(engine, rp):
    """The torch executor on the tiny random Llama, a prompt that holds every token id: before, 1e-300
    and 1e-40 gave NaN logprobs (and greedy took the argmax of NaNs)."""
    prompt = [*range(3, VOCAB), 7, 8, 9]
    for temperature in (0.0, 0.8):
        p = SamplingParams(
            max_tokens=4, ignore_eos=True, repetition_penalty=rp, temperature=temperature, seed=1, logprobs=20
        )
        c = engine.generate([prompt], p)[0]
        assert c.error is None and len(c.token_ids) == 4 and all(0 <= t < VOCAB for t in c.token_ids)
        assert all(_finite(lp) for lp in c.logprobs), c.logprobs
        if rp < 1:  # every token but 0, 1, 2 is seen: a positive seen one is all but forced
            assert all(t >= 3 for t in c.token_ids), c.token_ids


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [  # before: OverflowError (int too large to convert to float), naming nothing
        ({"temperature": 10**400}, "temperature"),
        ({"repetition_penalty": 10**400}, "repetition_penalty"),
        ({"logit_bias": {3: 10**400}}, "logit_bias"),
        ({"logit_bias": {3: -(10**400)}}, "logit_bias"),
        # before: accepted, then OverflowError building the int64 ids when the request was queued
        ({"logit_bias": {2**64: 1.0}}, "logit_bias"),
        ({"logit_bias": {2**63: 1.0}}, "logit_bias"),
        # before: ValueError (Exceeds the limit (4300 digits) for integer string conversion) writing
        # the message
        ({"n": 10**5000}, "n"),
        ({"seed": -(10**5000)}, "seed"),
        ({"top_k": -(10**5000)}, "top_k"),
        ({"max_tokens": -(10**5000)}, "max_tokens"),
        ({"logprobs": 10**5000}, "logprobs"),
        ({"stop_token_ids": [10**5000, -1]}, "stop_token_ids"),
        ({"presence_penalty": 10**5000}, "presence_penalty"),
    ],
)
def test_huge_integers_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(UserError, match=rf"^SamplingParams\.{field} must be .*, got ") as e:
        SamplingParams(**kwargs)
    assert len(str(e.value)) < 400, str(e.value)


def test_a_refused_long_list_is_shown_shortened():
    """Before: the message held the whole list (a million ids: 8 MB)."""
    shortened = r"SamplingParams\.stop_token_ids must be .*, got \[0, 1, 2, .*… \(1,000,001 items\)$"
    with pytest.raises(UserError, match=shortened) as e:
        SamplingParams(stop_token_ids=[*range(1_000_000), -1])
    assert len(str(e.value)) < 400


def test_the_largest_int64_token_id_and_huge_integer_settings_still_work():
    assert SamplingParams(logit_bias={2**63 - 1: 1.0}).logit_bias_arrays[0].tolist() == [2**63 - 1]
    p = SamplingParams(max_tokens=10**30, top_k=10**30, temperature=10**300, stop_token_ids=[10**30])
    assert p.max_tokens == 10**30 and p.temperature == 10**300 and not p.greedy
