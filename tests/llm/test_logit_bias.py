"""OpenAI's logit_bias: SamplingParams' checks, the batched pass (numpy and torch), and the engine end to
end on both loops (greedy ban and force, sampled bans, unbiased neighbours, logprobs, speculation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.llm.serving_models import VOCAB, make_executor, small_engine, tiny_llama
from trtforge.errors import UserError
from trtforge.llm.engine import LLMEngine
from trtforge.llm.penalties import RowHistory, apply_logit_bias
from trtforge.llm.sampling import SamplingParams, sample_with_logprobs
from trtforge.llm.sched.scheduler import SchedulerConfig

PROMPTS = [[5, 17, 42, 99, 7, 3], [250, 11, 11, 60], [8, 9, 10, 11, 12, 13, 14]]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def engine(request):
    with small_engine(request.param) as eng:
        yield eng


def _greedy(max_tokens: int = 10, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)


def _reference_logits(tokens: list[int]) -> np.ndarray:
    """The tiny model's last-position logits for `tokens` (one full forward, float64)."""
    with torch.no_grad():
        return tiny_llama()(torch.tensor([tokens])).logits[0, -1].numpy()


def _reference_greedy(prompt: list[int], bias: dict[int, float], max_tokens: int) -> list[int]:
    """Greedy decoding with the bias added per token in a Python loop: the definition, not the batch."""
    out: list[int] = []
    for _ in range(max_tokens):
        logits = _reference_logits(prompt + out).copy()
        for t, b in bias.items():
            logits[t] += b
        out.append(int(np.argmax(logits)))
    return out


# ---- SamplingParams ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bias",
    [
        [1, 2],
        "13",
        {-1: 1.0},
        {True: 1.0},
        {"13": 1.0},
        {1.0: 1.0},
        {13: 100.5},
        {13: -101},
        {13: math.nan},
        {13: math.inf},
        {13: "5"},
        {13: None},
    ],
)
def test_a_bad_logit_bias_is_refused_naming_the_field(bias):
    with pytest.raises(UserError, match=r"SamplingParams\.logit_bias must be .*\[-100, 100\]"):
        SamplingParams(logit_bias=bias)


def test_logit_bias_is_normalised_and_an_empty_map_is_none():
    p = SamplingParams(logit_bias={np.int64(3): 2, 7: -100, 9: 100.0})
    assert p.logit_bias == {3: 2.0, 7: -100.0, 9: 100.0}
    assert all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())
    ids, vals = p.logit_bias_arrays
    assert ids.tolist() == [3, 7, 9] and vals.tolist() == [2.0, -100.0, 100.0]
    assert SamplingParams(logit_bias={}).logit_bias is None and SamplingParams().logit_bias_arrays is None
    assert SamplingParams(logit_bias={}) == SamplingParams()
    source = {1: 1.0}
    q = SamplingParams(logit_bias=source)
    source[2] = 5.0  # the params keep their own copy
    assert q.logit_bias == {1: 1.0}
    assert [s.logit_bias for s in SamplingParams(n=3, logit_bias={4: -1}).expand()] == [{4: -1.0}] * 3


# ---- the batched pass ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "torch", "float64", "bfloat16"])
def test_the_bias_is_added_in_one_pass_and_unbiased_rows_keep_their_bits(kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 50)).astype(np.float32) * 3
    params = [
        SamplingParams(),
        SamplingParams(logit_bias={0: -100, 49: 2.5, 7: 100}),
        SamplingParams(temperature=0.7, seed=1),
        SamplingParams(temperature=1.0, logit_bias={3: -0.25}),
    ]
    inputs = {
        "numpy": x,
        "torch": torch.from_numpy(x),
        "float64": x.astype(np.float64),
        "bfloat16": torch.from_numpy(x).to(torch.bfloat16),
    }
    logits = inputs[kind]
    got = apply_logit_bias(logits, params)
    host = np.asarray(got if isinstance(got, np.ndarray) else got.numpy())
    base = np.asarray(logits if isinstance(logits, np.ndarray) else logits.float().numpy(), dtype=host.dtype)
    assert host.dtype == (np.float64 if kind == "float64" else np.float32)
    assert host[[0, 2]].tobytes() == base[[0, 2]].tobytes()  # bit for bit
    want = base.copy()
    want[1, 0] -= 100
    want[1, 49] += 2.5
    want[1, 7] += 100
    want[3, 3] -= 0.25
    np.testing.assert_array_equal(host, want)
    if kind == "numpy":
        assert got is not logits and np.array_equal(logits, x)  # the input is never written
    assert apply_logit_bias(logits, [SamplingParams()] * 4) is logits


def test_an_id_past_the_logits_width_is_an_error_not_a_silent_write():
    with pytest.raises(ValueError, match="logit_bias holds token id 50"):
        apply_logit_bias(np.zeros((1, 50), np.float32), [SamplingParams(logit_bias={50: 1})])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sampling_reads_the_biased_logits_and_leaves_the_other_rows_bit_identical(kind):
    """Greedy rows take the biased argmax, sampled rows never draw a banned token, and the rows without
    a bias give the same tokens and logprobs, bit for bit, as a batch where no row has one."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 64)).astype(np.float32) * 2
    top = x.argmax(-1)
    biased = [
        SamplingParams(logprobs=3),
        SamplingParams(logprobs=3, logit_bias={int(top[1]): -100}),
        SamplingParams(temperature=1.0, seed=3, logprobs=2),
        SamplingParams(temperature=2.0, seed=4, logit_bias={int(t): -100 for t in np.argsort(-x[3])[:8]}),
    ]
    plain = [SamplingParams(logprobs=3), SamplingParams()]
    plain += [SamplingParams(temperature=1.0, seed=3, logprobs=2), SamplingParams(temperature=2.0, seed=4)]
    logits = x if kind == "numpy" else torch.from_numpy(x)
    gens = [None, None, biased[2].make_generator(0), biased[3].make_generator(0)]
    tokens, lps = sample_with_logprobs(logits, biased, gens)
    ref_gens = [None, None, plain[2].make_generator(0), plain[3].make_generator(0)]
    ref_tokens, ref_lps = sample_with_logprobs(logits, plain, ref_gens)
    assert tokens[1] != top[1] and tokens[1] == np.argsort(-x[1], kind="stable")[1]
    assert (tokens[0], tokens[2]) == (ref_tokens[0], ref_tokens[2])
    assert lps[0] == ref_lps[0] and lps[2] == ref_lps[2]  # float equality of every field
    # the biased greedy row's logprobs are of the biased distribution: its pick is rank 1
    assert lps[1].rank == 1 and lps[1].top[0][0] == tokens[1] and top[1] not in [t for t, _ in lps[1].top]
    banned = set(biased[3].logit_bias)
    draws = []
    gen = biased[3].make_generator(0)
    for _ in range(300):
        t, _ = sample_with_logprobs(logits[3:], biased[3:], [gen])
        draws.append(int(t[0]))
    assert not banned & set(draws)
    gen = plain[3].make_generator(0)
    free = [int(sample_with_logprobs(logits[3:], plain[3:], [gen])[0][0]) for _ in range(300)]
    assert banned & set(free), "the banned tokens are the likeliest: unbiased sampling must draw some"


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_the_bias_comes_before_the_penalties(kind):
    """vLLM's order: a repetition penalty divides a biased positive logit, (x + b) / r, not x / r + b."""
    x = np.array([[1.0, 0.5, 0.0, -1.0]], dtype=np.float32)
    p = SamplingParams(repetition_penalty=2.0, logit_bias={0: 3.0, 3: 2.0}, logprobs=4)
    logits = x if kind == "numpy" else torch.from_numpy(x)
    _, lps = sample_with_logprobs(logits, [p], [None], [RowHistory([0, 3], [])])
    processed = np.array([(1.0 + 3.0) / 2.0, 0.5, 0.0, (-1.0 + 2.0) / 2.0])
    want = processed - np.log(np.exp(processed).sum())
    got = dict(lps[0].top)
    assert [got[i] for i in range(4)] == pytest.approx(want.tolist(), abs=1e-6)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_token_the_grammar_masks_stays_out_whatever_its_bias(kind):
    """The grammar mask comes first (vLLM's allowed tokens): -inf + 100 is -inf, so +100 on a masked
    token does not bring it back, and the greedy pick is the best allowed one."""
    x = np.array([[0.0, 5.0, 1.0, 2.0] + [0.0] * 28], dtype=np.float32)
    mask = np.array([[0b1101]], dtype=np.int32)  # tokens 0, 2, 3 allowed; 1 (the maximum) masked
    p = SamplingParams(logit_bias={1: 100, 2: 1.5}, logprobs=2)
    logits = x if kind == "numpy" else torch.from_numpy(x)
    tokens, lps = sample_with_logprobs(logits, [p], [None], None, mask)
    assert tokens.tolist() == [2] and [t for t, _ in lps[0].top] == [2, 3]


# ---- the engine ----------------------------------------------------------------------------------


def test_a_minus_100_bias_bans_the_greedy_pick_and_plus_100_forces_a_token(engine):
    plain = [c.token_ids for c in engine.generate(PROMPTS, _greedy())]
    first = plain[0][0]
    banned = engine.generate([PROMPTS[0]], _greedy(logit_bias={first: -100}))[0].token_ids
    assert first not in banned
    assert list(banned) == _reference_greedy(PROMPTS[0], {first: -100.0}, 10)
    forced = engine.generate(PROMPTS, _greedy(logit_bias={123: 100}))
    assert all(list(c.token_ids) == [123] * 10 for c in forced)
    nudged = engine.generate([PROMPTS[2]], _greedy(logit_bias={plain[2][1]: -4.0, 200: 3.0}))[0].token_ids
    assert list(nudged) == _reference_greedy(PROMPTS[2], {plain[2][1]: -4.0, 200: 3.0}, 10)


def test_sampled_requests_never_draw_a_banned_token(engine):
    free = engine.generate(PROMPTS, SamplingParams(max_tokens=40, ignore_eos=True, temperature=1.5, seed=9))
    counts = np.bincount(np.concatenate([c.token_ids for c in free]), minlength=VOCAB)
    banned = {int(t): -100.0 for t in np.argsort(-counts)[:6]}
    assert counts[list(banned)].sum() > 0
    params = SamplingParams(max_tokens=40, ignore_eos=True, temperature=1.5, seed=9, n=4, logit_bias=banned)
    drawn = {int(t) for c in engine.generate(PROMPTS, params) for t in c.token_ids}
    assert len(drawn) > 20 and not drawn & set(banned)


def test_unbiased_requests_in_the_batch_are_unchanged_and_logprobs_are_the_biased_ones(engine):
    plain = [_greedy(logprobs=2), SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.9, seed=2)]
    alone = engine.generate(PROMPTS[:2], plain)
    target = alone[0].token_ids[0]
    biased = _greedy(logprobs=3, logit_bias={target: -100, 77: 1.5})
    together = engine.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0]], [*plain, biased])
    assert [c.token_ids for c in together[:2]] == [c.token_ids for c in alone]
    for a, b in zip(together[0].logprobs, alone[0].logprobs):
        assert (a.token_id, a.rank) == (b.token_id, b.rank)
        assert a.logprob == pytest.approx(b.logprob, abs=1e-9)
    got = together[2]
    assert target not in got.token_ids
    assert list(got.token_ids) == _reference_greedy(PROMPTS[0], {target: -100.0, 77: 1.5}, 10)
    prefix = list(PROMPTS[0])
    for token, lp in zip(got.token_ids, got.logprobs):
        logits = _reference_logits(prefix).copy()
        logits[target] -= 100
        logits[77] += 1.5
        ref = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        assert lp.token_id == token and lp.rank == 1
        assert lp.logprob == pytest.approx(ref[token], abs=1e-6)
        assert [t for t, _ in lp.top] == np.argsort(-ref, kind="stable")[:3].tolist()
        prefix.append(int(token))


def test_a_bias_past_the_vocabulary_is_refused_when_queued(engine):
    with pytest.raises(UserError, match=rf"SamplingParams\.logit_bias holds token id {VOCAB}, outside"):
        engine.submit(PROMPTS[0], _greedy(logit_bias={1: 1.0, VOCAB: -100}))
    assert len(engine.generate([PROMPTS[0]], _greedy(logit_bias={VOCAB - 1: 1.0}))[0].token_ids) == 10


def test_speculation_leaves_biased_rows_to_plain_decoding():
    """A biased greedy row beside speculating ones: its tokens are the biased greedy ones (verification
    reads the unbiased argmax, so a proposal accepted for it would emit the banned token)."""
    from trtforge.llm.service import make_proposer
    from trtforge.llm.spec.config import SpeculativeConfig

    prompt = [5, 6, 7, 8, 9] * 8
    config = SchedulerConfig(max_num_seqs=4, async_scheduling=False)
    with LLMEngine(make_executor(num_blocks=64), config) as eng:
        plain = eng.generate([prompt], _greedy(16))[0].token_ids
        banned = {plain[0]: -100.0, plain[1]: -100.0}
        want = eng.generate([prompt], _greedy(16, logit_bias=banned))[0].token_ids
    ex = make_executor(num_blocks=64)
    proposer = make_proposer(SpeculativeConfig.of({"method": "ngram", "num_tokens": 4}), ex)
    asked: list[object] = []
    propose = proposer.propose

    def spy(seqs, ks):
        asked.extend(s.request_id for s in seqs)
        return propose(seqs, ks)

    proposer.propose = spy
    with LLMEngine(ex, config, proposer=proposer) as eng:
        handles = [eng.submit(prompt, _greedy(16)), eng.submit(prompt, _greedy(16, logit_bias=banned))]
        got = [h.result() for h in handles]
        stats = eng.stats
    assert list(want) == _reference_greedy(prompt, banned, 16)
    assert got[0].token_ids == plain and got[1].token_ids == want
    assert not set(banned) & set(got[1].token_ids)
    assert stats.spec_draft_tokens > 0, "the unbiased row should have speculated"
    assert handles[0].request_id in asked and handles[1].request_id not in asked
