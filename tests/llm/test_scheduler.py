"""Continuous batching over the paged pool, checked against solo runs and transformers' generate()."""

from __future__ import annotations

import numpy as np
import pytest

from tests.llm.serving_models import VOCAB, hf_greedy, make_executor, run_to_completion, solo_output
from trtforge.errors import UserError
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.scheduler import Scheduler, SchedulerConfig, StepFailedError


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
    sched = Scheduler(executor, config, step_hook=hook)
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


def serve_staggered(executor, workload, *, preempt: bool) -> dict:
    """Serve the staggered workload on `executor` (a roomy pool, or a pool of 28 blocks with `preempt`) and
    assert the acceptance: every output equals its solo run, waste <= one block per running sequence at
    every step, all blocks free at the end; with `preempt`, preemption happened. Returns the outputs."""
    reqs, solo = workload
    seqs = 32 if preempt else 24
    config = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=160, max_prefill_chunk=32)
    sched, done = _serve(executor, reqs, config, _waste_hook)
    assert sorted(done) == sorted(solo)
    for rid, out in done.items():
        assert out.error is None
        assert out.output_token_ids == solo[rid], rid
    if preempt:
        assert sched.stats.preemptions > 0
    else:
        assert sched.stats.max_running >= 12, "requests were expected to overlap"
        assert sched.stats.preemptions == 0
    assert sched.memory_stats().free_blocks == executor.num_blocks
    return done


def test_64_staggered_requests_match_their_solo_runs_and_hf_generate(workload):
    done = serve_staggered(make_executor(), workload, preempt=False)
    for _, rid, prompt, params in workload[0][:4]:
        assert list(done[rid].output_token_ids) == hf_greedy(prompt, params.max_tokens), rid


def test_a_pool_too_small_for_everyone_preempts_and_still_matches(workload):
    serve_staggered(make_executor(num_blocks=28, block_size=8), workload, preempt=True)


def test_a_shared_prefix_is_held_once():
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

    sched = Scheduler(executor, SchedulerConfig(max_num_seqs=16, max_prefill_chunk=256), step_hook=hook)
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
        ("hello", "token id"),
        ([1.5, 2], "integer token ids"),
        ([[1, 2]], "integer token ids"),
        (None, "integer token ids"),
        (np.zeros((2, 2), dtype=np.int64), "integer token ids"),
    ],
)
def test_bad_prompts_are_user_errors_and_queue_nothing(prompt, message):
    sched = Scheduler(make_executor())
    with pytest.raises(UserError, match=message):
        sched.add_request("bad", prompt)
    assert not sched.has_unfinished()
    sched.add_request("bad", [3, 4], SamplingParams(max_tokens=2))  # the id was not taken
    assert run_to_completion(sched)["bad"].error is None


def test_bad_sampling_params_and_config_are_user_errors():
    sched = Scheduler(make_executor())
    with pytest.raises(UserError, match="SamplingParams.top_p"):
        sched.add_request("a", [1, 2], SamplingParams(top_p=2.0))
    with pytest.raises(UserError, match="must be a SamplingParams"):
        sched.add_request("a", [1, 2], {"max_tokens": 3})
    with pytest.raises(UserError, match="SchedulerConfig.max_prefill_chunk"):
        Scheduler(make_executor(), SchedulerConfig(max_prefill_chunk=0))
    assert not sched.has_unfinished()


def test_cancel_midway_frees_blocks_and_the_others_finish():
    executor = make_executor(num_blocks=64)
    rng = np.random.default_rng(3)
    prompts = {f"c{i}": rng.integers(0, VOCAB, size=30).tolist() for i in range(3)}
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    sched = Scheduler(executor, SchedulerConfig(max_prefill_chunk=16))
    for rid, p in prompts.items():
        sched.add_request(rid, p, params)
    for _ in range(5):
        sched.step()
    used_before = sched.memory_stats().used_blocks
    held = len(sched.block_manager.block_table("c1"))
    assert sched.abort("c1") and not sched.abort("c1")
    assert not sched.block_manager.has_sequence("c1")
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


def test_an_executor_failure_fails_only_that_steps_requests():
    inner = make_executor(num_blocks=64)
    executor = _FailingExecutor(inner, fail_on={3})
    rng = np.random.default_rng(4)
    prompts = {f"f{i}": rng.integers(0, VOCAB, size=int(rng.integers(3, 20))).tolist() for i in range(6)}
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    sched = Scheduler(executor, SchedulerConfig(max_num_seqs=2))
    for rid, p in prompts.items():
        sched.add_request(rid, p, params)
    done = run_to_completion(sched)
    failed = {rid for rid, out in done.items() if out.error is not None}
    assert failed == {"f0", "f1"}, "the third step runs the first two requests"
    for rid in failed:
        err = done[rid].error
        assert isinstance(err, StepFailedError) and "injected device fault" in str(err)
        assert isinstance(err.__cause__, RuntimeError) and done[rid].finish_reason == "error"
    for rid in set(prompts) - failed:
        assert done[rid].output_token_ids == solo_output(prompts[rid], params, inner), rid
    assert sched.stats.failed_steps == 1
    assert sched.memory_stats().free_blocks == 64
    sched.block_manager.check_invariants()


def test_stop_tokens_stop_sequences_and_length():
    executor = make_executor()
    prompt = [5, 6, 7, 8]
    free_run = list(solo_output(prompt, SamplingParams(max_tokens=10, ignore_eos=True), executor))
    stop_tok = SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=[free_run[3]])
    out = solo_output(prompt, stop_tok, executor)
    assert list(out) == free_run[: free_run.index(free_run[3]) + 1]
    stop_seq = SamplingParams(max_tokens=10, ignore_eos=True, stop_sequences=[free_run[4:6]])
    assert list(solo_output(prompt, stop_seq, executor)) == free_run[:6]
    sched = Scheduler(executor, SchedulerConfig(max_model_len=8))
    sched.add_request("x", prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    out = run_to_completion(sched)["x"]
    assert out.finish_reason == "length" and len(out.output_token_ids) == 4


def test_seeded_sampling_does_not_depend_on_batch_mates():
    executor = make_executor()
    p = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=11, ignore_eos=True)
    alone = solo_output([9, 8, 7], p, executor)
    sched = Scheduler(executor)
    sched.add_request("s", [9, 8, 7], p)
    for i in range(5):
        sched.add_request(i, [i + 1] * (i + 2), SamplingParams(max_tokens=8, temperature=0.7, seed=i))
    assert run_to_completion(sched)["s"].output_token_ids == alone


class _TokenPoolExecutor:
    """A model-free executor whose pool stores token ids: each next token is a hash of what the block
    table reads back, so any wrong slot, block table, copy or position changes the output."""

    vocab_size, max_model_len, eos_token_id = 50, 100, None

    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size
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


@pytest.mark.parametrize("seed", [0, 1])
def test_paging_stress_with_shared_prefixes_tiny_pool_preemption_and_aborts(seed):
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
        sched = Scheduler(_TokenPoolExecutor(32, 4), SchedulerConfig(enable_prefix_caching=False))
        sched.add_request(rid, prompt, params)
        solo[rid] = run_to_completion(sched)[rid].output_token_ids
    executor = _TokenPoolExecutor(num_blocks=30, block_size=4)
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
    assert sched.stats.preemptions > 0 and sched.stats.prefix_hit_tokens > 0
    for rid, out in done.items():
        if out.finish_reason == "abort":
            assert rid in aborted and solo[rid][: len(out.output_token_ids)] == out.output_token_ids
        else:
            assert out.output_token_ids == solo[rid], rid
    assert sched.memory_stats().free_blocks == 30
