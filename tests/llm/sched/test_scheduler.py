"""Continuous batching over the paged pool, checked against solo runs and transformers' generate().

Solo runs schedule synchronously; the batched runs go both ways (``async_scheduling`` False and True),
so asynchronous scheduling is held to the synchronous mode's exact outputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.llm.serving_models import (
    VOCAB,
    hf_greedy,
    make_executor,
    model_free_facts,
    run_to_completion,
    solo_output,
    tiny_llama,
)
from trtforge.errors import UserError
from trtforge.llm.engine import make_step_loop
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig, StepFailedError


def _workload(n: int, seed: int, max_arrival: int = 40):
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        prompt = rng.integers(0, VOCAB, size=int(rng.integers(1, 72))).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(1, 13)))
        reqs.append((int(rng.integers(0, max_arrival)), f"r{i}", prompt, params))
    return reqs


@pytest.fixture(scope="module")
def workload():
    """64 requests (arrival step, id, prompt, params) and each one's output when run alone."""
    reqs = _workload(64, seed=1)
    executor = make_executor()
    solo = {rid: solo_output(prompt, params, executor) for _, rid, prompt, params in reqs}
    return reqs, solo


def _serve(executor, reqs, config, hook=None):
    sched = make_step_loop(executor, config, hook)
    done, step = {}, 0
    pending = sorted(reqs, key=lambda r: r[0])
    while pending or sched.has_unfinished():
        while pending and pending[0][0] <= step:
            _, rid, prompt, params = pending.pop(0)
            sched.add_request(rid, prompt, params)
        for out in sched.step():
            if out.finished:
                done[out.request_id] = out
        step += 1
    return sched, done


def _waste_hook(sched, batch):
    stats = sched.memory_stats()
    assert stats.waste_slots <= sched.num_running * (stats.block_size - 1), stats
    assert batch.num_tokens <= sched.config.max_num_batched_tokens
    sched.block_manager.check_invariants()


def serve_staggered(executor, workload, *, preempt: bool, async_scheduling: bool | None = None) -> dict:
    """Serve the staggered workload on `executor` (a roomy pool, or a pool of 28 blocks with `preempt`) and
    assert the acceptance: every output equals its solo run, waste <= one block per running sequence at
    every step, all blocks free at the end; with `preempt`, preemption happened (asynchronously: also of
    sequences whose token was in flight). Returns the outputs."""
    reqs, solo = workload
    seqs = 32 if preempt else 24
    config = SchedulerConfig(
        max_num_seqs=seqs, max_num_batched_tokens=160, max_prefill_chunk=32, async_scheduling=async_scheduling
    )
    in_flight_preemptions = []

    def hook(sched, batch):
        _waste_hook(sched, batch)
        in_flight_preemptions.extend(s for s in sched._waiting if s.pending_row >= 0)

    sched, done = _serve(executor, reqs, config, hook)
    if async_scheduling is not None:
        assert sched.async_scheduling is async_scheduling
    assert sorted(done) == sorted(solo)
    for rid, out in done.items():
        assert out.error is None
        assert out.output_token_ids == solo[rid], rid
    if preempt:
        assert sched.stats.preemptions > 0
        assert bool(in_flight_preemptions) == sched.async_scheduling
    else:
        assert sched.stats.max_running >= 12, "requests were expected to overlap"
        assert sched.stats.preemptions == 0
    assert sched.memory_stats().free_blocks == executor.facts.num_blocks
    return done


MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@pytest.mark.parametrize(
    ("async_scheduling", "static"),
    [(False, False), (True, False), (True, True)],
    ids=["sync", "async", "static"],
)
def test_64_staggered_requests_match_their_solo_runs_and_hf_generate(workload, async_scheduling, static):
    executor = TorchExecutor(
        tiny_llama(), num_blocks=256, block_size=8, static_decode=static, max_decode_batch=32
    )
    done = serve_staggered(executor, workload, preempt=False, async_scheduling=async_scheduling)
    for _, rid, prompt, params in workload[0][:4]:
        assert list(done[rid].output_token_ids) == hf_greedy(prompt, params.max_tokens), rid
    assert bool(executor._static) == static, "the static decode path was expected to run"


@MODES
def test_a_pool_too_small_for_everyone_preempts_and_still_matches(workload, async_scheduling):
    executor = make_executor(num_blocks=28, block_size=8)
    serve_staggered(executor, workload, preempt=True, async_scheduling=async_scheduling)


@MODES
def test_a_shared_prefix_is_held_once(async_scheduling):
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, VOCAB, size=200).tolist()
    reqs = [
        (f"p{i}", prefix + rng.integers(0, VOCAB, size=int(rng.integers(1, 12))).tolist()) for i in range(16)
    ]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    executor = make_executor(num_blocks=256, block_size=8)
    seen = []

    def hook(sched, batch):
        if sched.num_running == 16:
            tables = [sched.block_manager.block_table(r) for r in sched.running_request_ids()]
            prefix_blocks = {b for t in tables for b in t[: 200 // 8]}
            seen.append(
                (len(prefix_blocks), len({b for t in tables for b in t}), sched.memory_stats().used_blocks)
            )

    config = SchedulerConfig(max_num_seqs=16, max_prefill_chunk=256, async_scheduling=async_scheduling)
    sched = make_step_loop(executor, config, hook)
    for rid, prompt in reqs:
        sched.add_request(rid, prompt, params)
    done = run_to_completion(sched)
    assert seen, "all 16 requests never ran together"
    for n_prefix, n_distinct, used in seen:
        assert n_prefix == 25, "the 25 full blocks of the 200-token prefix must be held once"
        assert used == n_distinct
    assert sched.stats.prefix_hit_tokens == 15 * 200
    solo_exec = make_executor()
    for rid, prompt in reqs:
        assert done[rid].output_token_ids == solo_output(prompt, params, solo_exec), rid
    assert sched.memory_stats().free_blocks == 256


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "prompt is empty"),
        ([1] * 600, "maximum sequence length is 512"),
        ([1, VOCAB], f"token id {VOCAB} is outside the vocabulary"),
        ([3, -1, 2], "token id -1 is outside the vocabulary"),
        ([1, True], "integer token ids"),
        ("hello", "token id"),
        ([1.5, 2], "integer token ids"),
        ([[1, 2]], "integer token ids"),
        (None, "integer token ids"),
        (np.zeros((2, 2), dtype=np.int64), "integer token ids"),
    ],
)
def test_bad_prompts_are_user_errors_and_queue_nothing(prompt, message):
    sched = make_step_loop(make_executor())
    with pytest.raises(UserError, match=message):
        sched.add_request("bad", prompt)
    assert not sched.has_unfinished()
    sched.add_request("bad", [3, 4], SamplingParams(max_tokens=2))  # the id was not taken
    assert run_to_completion(sched)["bad"].error is None


def test_bad_sampling_params_and_config_are_user_errors():
    sched = make_step_loop(make_executor())
    with pytest.raises(UserError, match="SamplingParams.top_p"):
        sched.add_request("a", [1, 2], SamplingParams(top_p=2.0))
    with pytest.raises(UserError, match="must be a SamplingParams"):
        sched.add_request("a", [1, 2], {"max_tokens": 3})
    with pytest.raises(UserError, match="SchedulerConfig.max_prefill_chunk"):
        make_step_loop(make_executor(), SchedulerConfig(max_prefill_chunk=0))
    assert not sched.has_unfinished()


@MODES
def test_cancel_midway_frees_blocks_and_the_others_finish(async_scheduling):
    executor = make_executor(num_blocks=64)
    rng = np.random.default_rng(3)
    prompts = {f"c{i}": rng.integers(0, VOCAB, size=30).tolist() for i in range(3)}
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    sched = make_step_loop(executor, SchedulerConfig(max_prefill_chunk=16, async_scheduling=async_scheduling))
    for rid, p in prompts.items():
        sched.add_request(rid, p, params)
    for _ in range(5):
        sched.step()
    used_before = sched.memory_stats().used_blocks
    held = len(sched.scheduler.block_manager.block_table("c1"))
    assert sched.abort("c1") and not sched.abort("c1")
    assert not sched.scheduler.block_manager.has_sequence("c1")
    assert sched.memory_stats().used_blocks == used_before - held
    done = run_to_completion(sched)
    assert done["c1"].finish_reason == "abort" and 0 < len(done["c1"].output_token_ids) < 12
    for rid in ("c0", "c2"):
        assert done[rid].output_token_ids == solo_output(prompts[rid], params, executor)
    assert sched.memory_stats().free_blocks == 64


class _FailingExecutor:
    """Delegates to a real executor but raises on chosen step numbers."""

    def __init__(self, inner, fail_on):
        self.inner, self.fail_on, self.calls = inner, set(fail_on), 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, batch):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("injected device fault")
        return self.inner.step(batch)


class _FailingAsyncExecutor(_FailingExecutor):
    def step_async(self, batch, feed):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("injected device fault")
        return self.inner.step_async(batch, feed)


@MODES
def test_an_executor_failure_fails_only_that_steps_requests(async_scheduling):
    inner = make_executor(num_blocks=64)
    executor = (_FailingAsyncExecutor if async_scheduling else _FailingExecutor)(inner, fail_on={3})
    rng = np.random.default_rng(4)
    prompts = {f"f{i}": rng.integers(0, VOCAB, size=int(rng.integers(3, 20))).tolist() for i in range(6)}
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    sched = make_step_loop(executor, SchedulerConfig(max_num_seqs=2))
    assert sched.async_scheduling is async_scheduling  # a class with step_async, else synchronous
    for rid, p in prompts.items():
        sched.add_request(rid, p, params)
    done = run_to_completion(sched)
    failed = {rid for rid, out in done.items() if out.error is not None}
    assert failed == {"f0", "f1"}, "the third step runs the first two requests"
    for rid in failed:
        err = done[rid].error
        assert isinstance(err, StepFailedError) and "injected device fault" in str(err)
        assert isinstance(err.__cause__, RuntimeError) and done[rid].finish_reason == "error"
        # steps 1 and 2 ran (the prompt, then one decode), so each failed request holds 2 tokens
        assert done[rid].output_token_ids == solo_output(prompts[rid], params, inner)[:2]
    for rid in set(prompts) - failed:
        assert done[rid].output_token_ids == solo_output(prompts[rid], params, inner), rid
    assert sched.stats.failed_steps == 1
    assert sched.memory_stats().free_blocks == 64
    sched.scheduler.block_manager.check_invariants()


@MODES
def test_stop_tokens_stop_sequences_and_length(async_scheduling):
    executor = make_executor()
    prompt = [5, 6, 7, 8]
    free_run = list(solo_output(prompt, SamplingParams(max_tokens=10, ignore_eos=True), executor))
    stop_tok = SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=[free_run[3]])
    out = solo_output(prompt, stop_tok, executor)
    assert list(out) == free_run[: free_run.index(free_run[3]) + 1]
    stop_seq = SamplingParams(max_tokens=10, ignore_eos=True, stop_sequences=[free_run[4:6]])
    assert list(solo_output(prompt, stop_seq, executor)) == free_run[:6]
    sched = make_step_loop(executor, SchedulerConfig(max_model_len=8, async_scheduling=async_scheduling))
    sched.add_request("x", prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    out = run_to_completion(sched)["x"]
    assert out.finish_reason == "length" and len(out.output_token_ids) == 4


@MODES
def test_seeded_sampling_does_not_depend_on_batch_mates(async_scheduling):
    executor = make_executor()
    p = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=11, ignore_eos=True)
    alone = solo_output([9, 8, 7], p, executor)
    sched = make_step_loop(executor, SchedulerConfig(async_scheduling=async_scheduling))
    sched.add_request("s", [9, 8, 7], p)
    for i in range(5):
        sched.add_request(i, [i + 1] * (i + 2), SamplingParams(max_tokens=8, temperature=0.7, seed=i))
    assert run_to_completion(sched)["s"].output_token_ids == alone


class _TokenPoolExecutor:
    """A model-free executor whose pool stores token ids: each next token is a hash of what the block
    table reads back, so any wrong slot, block table, copy or position changes the output."""

    vocab_size = 50

    def __init__(self, num_blocks, block_size):
        self.facts = model_free_facts(num_blocks, block_size, self.vocab_size, max_model_len=100)
        self.block_size = block_size
        self.pool = np.full(num_blocks * block_size, -1, dtype=np.int64)

    def step(self, batch):
        bs = self.block_size
        for src, dst in batch.block_copies:
            self.pool[dst * bs : (dst + 1) * bs] = self.pool[src * bs : (src + 1) * bs]
        assert len(set(batch.slot_mapping.tolist())) == batch.num_tokens, "two tokens share a slot"
        self.pool[batch.slot_mapping] = batch.input_ids
        logits = np.zeros((len(batch.logits_indices), self.vocab_size), dtype=np.float32)
        rows = {int(r): i for i, r in enumerate(batch.logits_indices)}
        for b in range(batch.num_seqs):
            lo, hi = batch.query_start_loc[b], batch.query_start_loc[b + 1]
            ctx = int(batch.context_lens[b])
            assert (batch.positions[lo:hi] == np.arange(ctx - (hi - lo), ctx)).all()
            if hi - 1 in rows:
                table = batch.block_tables[b]
                history = self.pool[[table[p // bs] * bs + p % bs for p in range(ctx)]]
                assert (history >= 0).all(), "read a slot nobody wrote"
                h = int.from_bytes(history.tobytes()[-64:], "little") * 2654435761 + ctx
                logits[rows[hi - 1], h % self.vocab_size] = 1.0
        return logits


class _AsyncTokenPoolExecutor(_TokenPoolExecutor):
    """The same, offering step_async: the fed ids are gathered from the previous step's tokens."""

    def step_async(self, batch, feed):
        if feed is not None:
            ids = batch.input_ids.copy()
            ids[feed.rows] = np.asarray(feed.tokens)[feed.sources]
            batch = dataclasses.replace(batch, input_ids=ids)
        return self.step(batch)


@pytest.mark.parametrize("seed", [0, 1])
@MODES
def test_paging_stress_with_shared_prefixes_tiny_pool_preemption_and_aborts(seed, async_scheduling):
    rng = np.random.default_rng(seed)
    templates = [rng.integers(0, 50, size=int(rng.integers(4, 40))).tolist() for _ in range(4)]
    reqs = []
    for i in range(120):
        prefix = templates[int(rng.integers(0, 4))][: int(rng.integers(0, 40))]
        prompt = prefix + rng.integers(0, 50, size=int(rng.integers(1, 12))).tolist()
        reqs.append(
            (int(rng.integers(0, 60)), f"q{i}", prompt, SamplingParams(max_tokens=int(rng.integers(1, 30))))
        )
    solo = {}
    for _, rid, prompt, params in reqs:
        sched = make_step_loop(_TokenPoolExecutor(32, 4), SchedulerConfig(enable_prefix_caching=False))
        sched.add_request(rid, prompt, params)
        solo[rid] = run_to_completion(sched)[rid].output_token_ids
    executor = (_AsyncTokenPoolExecutor if async_scheduling else _TokenPoolExecutor)(
        num_blocks=30, block_size=4
    )
    config = SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=48, max_prefill_chunk=8, watermark=0.05)
    abort_at = {rid: int(rng.integers(0, 80)) for _, rid, _, _ in reqs if rng.random() < 0.1}
    aborted = set(abort_at)

    def hook(sched, batch):
        _waste_hook(sched, batch)
        for rid in list(abort_at):
            if abort_at[rid] <= sched.stats.steps and sched.abort(rid):
                del abort_at[rid]
                sched.block_manager.check_invariants()

    sched, done = _serve(executor, reqs, config, hook)
    assert sched.async_scheduling is async_scheduling
    assert sched.stats.preemptions > 0 and sched.stats.prefix_hit_tokens > 0
    for rid, out in done.items():
        if out.finish_reason == "abort":
            assert rid in aborted and solo[rid][: len(out.output_token_ids)] == out.output_token_ids
        else:
            assert out.output_token_ids == solo[rid], rid
    assert sched.memory_stats().free_blocks == 30


def test_the_async_scheduling_option_is_checked():
    assert make_step_loop(make_executor()).async_scheduling  # the default: on where the executor offers it
    assert not make_step_loop(_TokenPoolExecutor(8, 4)).async_scheduling
    assert not make_step_loop(make_executor(), SchedulerConfig(async_scheduling=False)).async_scheduling
    with pytest.raises(UserError, match="async_scheduling=True needs an executor with step_async"):
        make_step_loop(_TokenPoolExecutor(8, 4), SchedulerConfig(async_scheduling=True))
    with pytest.raises(UserError, match="SchedulerConfig.async_scheduling must be None, True or False"):
        make_step_loop(make_executor(), SchedulerConfig(async_scheduling="yes"))


class _LoggedTokens:
    """A step's sampled tokens that log when the scheduler reads them on the host."""

    def __init__(self, inner, log, step):
        self.inner, self.log, self.step = inner, log, step

    @property
    def tokens(self):
        return self.inner.tokens

    @property
    def logprobs(self):
        return self.inner.logprobs

    def result(self):
        self.log.append(("read", self.step))
        return self.inner.result()


class _LoggedExecutor:
    """Delegates to an asynchronous executor and logs each launch with how many ids it feeds."""

    def __init__(self, inner, log):
        self.inner, self.log, self.launches = inner, log, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step_async(self, batch, feed):
        self.launches += 1
        self.log.append(("launch", self.launches, 0 if feed is None else len(feed)))
        return self.inner.step_async(batch, feed)


def test_async_scheduling_launches_each_step_before_reading_the_one_before(monkeypatch):
    import trtforge.llm.async_loop as async_loop

    log: list[tuple] = []
    executor = _LoggedExecutor(make_executor(), log)
    sample_async = async_loop.sample_async
    monkeypatch.setattr(
        async_loop,
        "sample_async",
        lambda *args: _LoggedTokens(sample_async(*args), log, executor.launches),
    )
    rng = np.random.default_rng(5)
    prompts = {f"o{i}": rng.integers(0, VOCAB, size=int(rng.integers(2, 20))).tolist() for i in range(4)}
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    sched = make_step_loop(executor)
    for rid, prompt in prompts.items():
        sched.add_request(rid, prompt, params)
    done = run_to_completion(sched)
    for rid, prompt in prompts.items():
        assert done[rid].output_token_ids == solo_output(prompt, params, executor.inner), rid
    launches = [e for e in log if e[0] == "launch"]
    assert [e[1] for e in log if e[0] == "read"] == [e[1] for e in launches], "each step read once, in order"
    # 8 steps for 8 tokens: none is launched for a sequence whose token in flight reaches its length
    assert len(launches) == 8 and all(fed == 4 for _, _, fed in launches[1:]), launches
    for n in range(2, len(launches) + 1):  # step n went to the device before step n-1's tokens were read
        assert log.index(("launch", n, 4)) < log.index(("read", n - 1)), log


def _sampling_workload(executor, seed: int):
    """Requests mixing greedy and seeded/unseeded temperature, top-k and top-p sampling, with stop tokens,
    stop sequences and EOS taken from each prompt's greedy run (so they hit mid-batch), and lengths."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(32):
        prompt = rng.integers(0, VOCAB, size=int(rng.integers(1, 30))).tolist()
        free = solo_output(prompt, SamplingParams(max_tokens=16, ignore_eos=True), executor)
        kind = i % 4
        stops = {
            0: {"stop_token_ids": [free[int(rng.integers(2, 12))]]},
            1: {"stop_sequences": [list(free[5:7]), [free[0], 299]]},
            2: {"eos_token_id": free[int(rng.integers(1, 10))]},
            3: {"ignore_eos": True},
        }[kind]
        sampling = {}
        if i % 3:
            sampling = {
                "temperature": float(rng.choice([0.6, 1.0, 1.4])),
                "top_k": int(rng.choice([0, 8])),
                "top_p": float(rng.choice([1.0, 0.9])),
                "seed": int(rng.integers(0, 1000)) if i % 2 else None,
            }
        params = SamplingParams(max_tokens=int(rng.integers(1, 17)), **sampling, **stops)
        reqs.append((int(rng.integers(0, 20)), f"m{i}", prompt, params))
    return reqs


def test_async_and_sync_agree_on_sampling_stops_eos_and_lengths():
    executor = make_executor()
    reqs = _sampling_workload(executor, seed=21)
    runs = {}
    for async_scheduling in (False, True):
        config = SchedulerConfig(max_num_seqs=12, max_model_len=36, async_scheduling=async_scheduling)
        sched, done = _serve(executor, reqs, config, _waste_hook)
        assert sched.async_scheduling is async_scheduling
        runs[async_scheduling] = {rid: (o.output_token_ids, o.finish_reason) for rid, o in done.items()}
        assert sched.memory_stats().free_blocks == executor.facts.num_blocks
    assert runs[True] == runs[False]
    reasons = [reason for _, reason in runs[True].values()]
    assert reasons.count("stop") >= 5 and reasons.count("length") >= 5, reasons
    for _, rid, prompt, params in reqs:
        if params.seed is not None or params.greedy:  # unseeded requests draw their seeds in arrival order
            sched = make_step_loop(executor, SchedulerConfig(max_model_len=36, async_scheduling=False))
            sched.add_request(rid, prompt, params)
            assert run_to_completion(sched)[rid].output_token_ids == runs[True][rid][0], rid


def test_a_prompt_past_a_pool_bound_length_is_told_the_pool_bounds_it():
    executor = make_executor(num_blocks=4)  # 4 blocks hold less than the model's max_model_len
    sched = make_step_loop(executor)
    cap = 4 * executor.facts.block_size
    assert cap < executor.facts.max_model_len
    with pytest.raises(UserError, match=rf"maximum sequence length is {cap} \(the KV pool's 4 blocks of"):
        sched.add_request("long", [1] * cap)


def test_an_unhashable_request_id_is_a_user_error_and_queues_nothing():
    sched = make_step_loop(_TokenPoolExecutor(8, 4))
    with pytest.raises(UserError, match=r"request \{'a': 1\}: a request id must be hashable .* got a dict"):
        sched.add_request({"a": 1}, [1, 2])
    assert not sched.has_unfinished()


def test_an_aborted_id_queued_again_gets_proposals_of_its_own_tokens():
    """A speculative StepLoop's proposer keeps state per request id. A request aborted, its output taken
    with flush() and its id queued again for another prompt got the old request's state (prompt lookup
    proposed from the old tokens, which the abort's output never reached a step to drop). Now the abort
    drops it: every proposal is the lookup of the proposing request's own tokens."""
    from trtforge.llm.spec.proposers import NgramProposer

    proposals = []

    class Recording(NgramProposer):
        def propose(self, seqs, ks):
            out = super().propose(seqs, ks)
            proposals.extend((list(s.tokens), k, p.tokens) for s, k, p in zip(seqs, ks, out))
            return out

    loop = make_step_loop(make_executor(), None, None, Recording(3))
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    loop.add_request("a", [1, 2, 3] * 4, params)
    for _ in range(4):
        loop.step()
    assert loop.abort("a")
    assert [o.finish_reason for o in loop.flush()] == ["abort"]
    again = [9, 8, 7, 6, 5, 4, 3]
    loop.add_request("a", again, params)
    assert len(run_to_completion(loop)["a"].output_token_ids) == 16
    assert any(tokens[: len(again)] == again for tokens, _, _ in proposals)
    for tokens, k, got in proposals:
        assert got == NgramProposer(3).lookup(tokens, k), tokens
