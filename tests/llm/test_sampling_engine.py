"""The sampling options end to end through the engine (plan -> execute + sample -> update), both loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.llm.serving_models import VOCAB, small_engine, tiny_llama
from trtforge.errors import UserError
from trtforge.llm.sampling import SamplingParams


def _prompts(n, seed, lo=2, hi=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def engine(request):
    with small_engine(request.param) as eng:
        yield eng


def _reference_greedy(prompt, p, max_tokens):
    """Greedy decoding with vLLM's penalties, one full forward per token and a per-token Python loop."""
    model, out = tiny_llama(), []
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1].tolist()
        for t in set(prompt) | set(out):
            logits[t] = (
                logits[t] / p.repetition_penalty if logits[t] > 0 else logits[t] * p.repetition_penalty
            )
        for t in set(out):
            logits[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
        out.append(int(np.argmax(logits)))
    return out


def test_greedy_penalties_match_the_reference_decode(engine):
    p = SamplingParams(max_tokens=12, ignore_eos=True, repetition_penalty=1.8, frequency_penalty=0.7)
    q = SamplingParams(max_tokens=12, ignore_eos=True, presence_penalty=1.5)
    prompts = _prompts(2, 1)
    got = engine.generate(prompts, [p, q])
    assert list(got[0].token_ids) == _reference_greedy(prompts[0], p, 12)
    assert list(got[1].token_ids) == _reference_greedy(prompts[1], q, 12)
    plain = engine.generate(prompts[:1], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert got[0].token_ids != plain.token_ids, "a strong repetition penalty should change the greedy output"


def test_neutral_options_leave_outputs_token_for_token(engine):
    prompts = _prompts(4, 2)
    base = [SamplingParams(max_tokens=10), SamplingParams(max_tokens=10, temperature=0.9, seed=5)]
    neutral = [
        SamplingParams(
            max_tokens=10,
            temperature=b.temperature,
            seed=b.seed,
            n=1,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            min_p=0.0,
            stop=(),
        )
        for b in base
    ]
    for b, nt in zip(base, neutral):
        assert [c.token_ids for c in engine.generate(prompts, b)] == [
            c.token_ids for c in engine.generate(prompts, nt)
        ]


def test_seeded_penalised_request_is_reproducible_whatever_its_neighbours(engine):
    prompt = _prompts(1, 3)[0]
    p = SamplingParams(
        max_tokens=16, temperature=1.0, seed=42, min_p=0.05, presence_penalty=0.6, repetition_penalty=1.2
    )
    alone = engine.generate([prompt], p)[0].token_ids
    for seed in (7, 8):
        others = _prompts(5, seed)
        mates = [SamplingParams(max_tokens=int(9 + seed), temperature=1.3, frequency_penalty=1.0)] * 5
        got = engine.generate([*others[:2], prompt, *others[2:]], [*mates[:2], p, *mates[2:]])
        assert got[2].token_ids == alone
    assert len(set(alone)) > 3


def test_logprobs_are_the_models_log_softmax_and_ranked(engine):
    prompt = _prompts(1, 4)[0]
    p = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3)
    c = engine.generate([prompt], p)[0]
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids) == 6
    model, out = tiny_llama(), []
    for tok, lp in zip(c.token_ids, c.logprobs):
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([prompt + out])).logits[0, -1], -1)
        assert lp.token_id == tok and lp.rank == 1
        assert lp.logprob == pytest.approx(float(ref[tok]), abs=1e-6)
        assert [t for t, _ in lp.top] == torch.topk(ref, 3).indices.tolist()
        out.append(tok)
    assert engine.generate([prompt], SamplingParams(max_tokens=3))[0].logprobs is None


def test_ignore_eos_runs_past_the_end_token(engine):
    prompt = _prompts(1, 5)[0]
    first = engine.generate([prompt], SamplingParams(max_tokens=1))[0].token_ids[0]
    stopped = engine.generate([prompt], SamplingParams(max_tokens=8, eos_token_id=first))[0]
    assert stopped.token_ids == (first,) and stopped.finish_reason == "stop"
    ignored = engine.generate([prompt], SamplingParams(max_tokens=8, eos_token_id=first, ignore_eos=True))[0]
    assert len(ignored.token_ids) == 8 and ignored.finish_reason == "length"


def test_n_gives_independent_samples_reproducible_from_seed_and_index(engine):
    prompt = _prompts(1, 6, lo=20, hi=21)[0]
    p = SamplingParams(max_tokens=10, temperature=1.0, seed=3, n=3, ignore_eos=True)
    got = engine.generate([prompt, prompt], [p, SamplingParams(max_tokens=4)])
    assert (
        len(got) == 4
        and got[3].token_ids == engine.generate([prompt], SamplingParams(max_tokens=4))[0].token_ids
    )
    samples = [c.token_ids for c in got[:3]]
    assert len(set(samples)) == 3
    assert samples[0] == engine.generate([prompt], SamplingParams(**{**_fields(p), "n": 1}))[0].token_ids
    assert samples == [c.token_ids for c in engine.generate([prompt], p)]
    with pytest.raises(UserError, match="SamplingParams.n"):
        engine._scheduler.make_sequence("x", prompt, p)


def _fields(p):
    return {k: getattr(p, k) for k in ("max_tokens", "temperature", "seed", "ignore_eos")}


def test_response_format_without_a_tokenizer_is_refused(engine):
    with pytest.raises(UserError, match="response_format needs the model's tokenizer"):
        engine.submit([5, 6], SamplingParams(response_format={"type": "json_object"}))


def test_only_sampled_requests_make_their_random_stream_and_seeded_ones_stay_reproducible(engine):
    made: list = []
    sched = engine._scheduler
    original = sched.make_sequence

    def spy(*args, **kwargs):
        seq = original(*args, **kwargs)
        made.append(seq)
        return seq

    sched.make_sequence = spy
    greedy = SamplingParams(max_tokens=5, ignore_eos=True)
    seeded = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.9, seed=17)
    outs = engine.generate(_prompts(3, seed=4), [greedy, seeded, greedy])
    assert all(o.error is None and len(o.token_ids) == 5 for o in outs)
    assert [s._generator is None for s in made] == [True, False, True], "a greedy request made a generator"
    again = engine.generate([_prompts(3, seed=4)[1]], seeded)[0]
    assert again.token_ids == outs[1].token_ids
