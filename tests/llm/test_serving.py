"""LLMEngine: background stepping, many submitting threads, streaming (sync and asyncio), cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from tests.llm.serving_models import VOCAB, make_executor, solo_output
from trtforge.errors import UserError
from trtforge.llm.engine import EngineClosedError, LLMEngine
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig, StepFailedError


def _prompts(n, seed, lo=1, hi=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def checked_engine(request):
    """An engine whose every step asserts the waste bound and the block manager's invariants (scheduling
    synchronously, then asynchronously)."""

    def hook(sched, batch):
        stats = sched.memory_stats()
        assert stats.waste_slots <= sched.num_running * (stats.block_size - 1)
        sched.block_manager.check_invariants()

    executor = make_executor(num_blocks=96)
    config = SchedulerConfig(max_num_seqs=16, max_prefill_chunk=32, async_scheduling=request.param)
    engine = LLMEngine(executor, config, step_hook=hook)
    yield engine, executor
    engine.close()


def test_threads_submitting_concurrently_all_get_their_solo_outputs(checked_engine):
    engine, executor = checked_engine
    prompts = _prompts(24, seed=2)
    params = [SamplingParams(max_tokens=int(m)) for m in np.random.default_rng(3).integers(1, 12, 24)]
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def worker(k):
        try:
            barrier.wait()
            handles = [(i, engine.submit(prompts[i], params[i])) for i in range(k, 24, 6)]
            for i, h in handles:
                results[i] = h.result(timeout=120).token_ids
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert engine.stats.max_running > 1
    solo_exec = make_executor()
    for i in range(24):
        assert results[i] == solo_output(prompts[i], params[i], solo_exec), i
    assert engine.wait_idle(timeout=10)
    assert engine.memory_stats().free_blocks == executor.facts.num_blocks


def test_generate_stream_and_astream_agree(checked_engine):
    engine, _ = checked_engine
    prompts = _prompts(5, seed=5)
    p = SamplingParams(max_tokens=9, ignore_eos=True)
    completions = engine.generate(prompts, p)
    assert [c.finish_reason for c in completions] == ["length"] * 5
    assert list(engine.stream(prompts[0], p)) == list(completions[0].token_ids)

    async def collect():
        return await asyncio.gather(*[_drain(engine.astream(q, p)) for q in prompts])

    assert asyncio.run(collect()) == [list(c.token_ids) for c in completions]


async def _drain(agen):
    return [t async for t in agen]


def test_bad_requests_raise_in_the_caller_and_leave_nothing_behind(checked_engine):
    engine, executor = checked_engine
    with pytest.raises(UserError, match="prompt is empty"):
        engine.submit([])
    with pytest.raises(UserError, match="maximum sequence length"):
        engine.submit([1] * 1000)
    with pytest.raises(UserError, match="SamplingParams.temperature"):
        engine.generate([[1, 2]], SamplingParams(temperature=-2))
    with pytest.raises(UserError, match="prompt is empty"):
        engine.generate([[1, 2, 3], []])  # nothing of this call runs
    assert engine.wait_idle(timeout=10)
    assert engine.memory_stats().free_blocks == executor.facts.num_blocks


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_submit_many_queues_all_at_once_and_each_gets_its_solo_output(async_scheduling):
    """submit_many: one params for all or one each, per-request event callbacks; the first step after it
    sees every request (none arrives after the engine started stepping), and each output equals the
    request run alone."""
    seen: list[int] = []
    executor = make_executor(num_blocks=96)
    config = SchedulerConfig(max_num_seqs=16, max_prefill_chunk=32, async_scheduling=async_scheduling)
    prompts = _prompts(12, seed=8)
    rng = np.random.default_rng(9)
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True) for m in rng.integers(1, 9, 12)]
    events: list[list[int]] = [[] for _ in prompts]
    callbacks = [lambda e, rec=rec: rec.extend(e) if isinstance(e, tuple) else None for rec in events]
    hook = lambda sched, batch: seen.append(sched.num_running + sched.num_waiting)  # noqa: E731
    with LLMEngine(executor, config, step_hook=hook) as engine:
        check = engine._scheduler.make_sequence  # slowed: one by one, the engine would start in between
        engine._scheduler.make_sequence = lambda *a: time.sleep(0.003) or check(*a)
        handles = engine.submit_many(prompts, params, on_events=callbacks)
        results = [h.result(timeout=120).token_ids for h in handles]
        assert seen[0] == 12
        same = engine.submit_many(prompts[:3], SamplingParams(max_tokens=4, ignore_eos=True))
        assert [len(h.result(timeout=60).token_ids) for h in same] == [4, 4, 4]
        assert engine.wait_idle(timeout=10)
        assert engine.memory_stats().free_blocks == executor.facts.num_blocks
    solo_exec = make_executor()
    for i in range(12):
        assert results[i] == solo_output(prompts[i], params[i], solo_exec), i
        assert events[i] == list(results[i]), i


def test_submit_many_is_all_or_none_and_names_the_bad_prompt(checked_engine):
    engine, executor = checked_engine
    good = _prompts(3, seed=4)
    with pytest.raises(UserError, match=r"prompts\[2\]: .*the prompt is empty"):
        engine.submit_many([*good[:2], [], good[2]])
    with pytest.raises(UserError, match=r"prompts\[1\]: .*outside the vocabulary"):
        engine.submit_many([good[0], [VOCAB + 5]])
    with pytest.raises(UserError, match="got 3 prompts but 2 params"):
        engine.submit_many(good, [SamplingParams(), SamplingParams()])
    with pytest.raises(UserError, match="got 3 prompts but 1 on_events"):
        engine.submit_many(good, on_events=[None])
    with pytest.raises(UserError, match=r"prompts\[0\]: .*must be a SamplingParams"):
        engine.submit_many(good, [{"max_tokens": 3}, None, None])
    with pytest.raises(UserError, match="on_events takes one value for each prompt, got builtin_function"):
        engine.submit_many(good, on_events=print)
    with pytest.raises(UserError, match="a sequence of prompts"):
        engine.submit_many(5)
    with pytest.raises(UserError, match=r"prompts\[0\]: .*flat sequence of integer token ids"):
        engine.submit_many([1, 2, 3])  # one prompt, not wrapped in a list
    assert engine.submit_many([]) == [] and engine.submit_many(iter([])) == []
    with pytest.raises(UserError, match=r"^second: request 'req-\d+': the prompt is empty"):
        engine.submit_many([good[0], []], labels=["first", "second"])
    with pytest.raises(UserError, match=r"^request 'req-\d+': the prompt is empty"):
        engine.submit_many([good[0], []], labels=["first", None])
    with pytest.raises(UserError, match="got 2 prompts but 1 labels"):
        engine.submit_many([good[0], []], labels=["first"])
    assert engine.wait_idle(timeout=10)
    assert engine._handles == {} and engine._inbox == []
    assert engine.memory_stats().free_blocks == executor.facts.num_blocks


def test_cancelling_a_stream_midway_frees_its_blocks(checked_engine):
    engine, executor = checked_engine
    stream = engine.stream(_prompts(1, seed=9, lo=30)[0], SamplingParams(max_tokens=200, ignore_eos=True))
    got = [next(stream) for _ in range(3)]
    assert len(got) == 3
    stream.close()
    assert engine.wait_idle(timeout=30)
    assert engine.stats.generated_tokens < 100, "the request ran on after its stream was closed"
    assert engine.memory_stats().free_blocks == executor.facts.num_blocks


class _FailOnce:
    def __init__(self, inner):
        self.inner, self.armed = inner, threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, batch):
        if self.armed.is_set():
            self.armed.clear()
            raise RuntimeError("injected kernel fault")
        return self.inner.step(batch)


class _FailOnceAsync(_FailOnce):
    def step_async(self, batch, feed):
        if self.armed.is_set():
            self.armed.clear()
            raise RuntimeError("injected kernel fault")
        return self.inner.step_async(batch, feed)


@pytest.mark.parametrize("wrapper", [_FailOnce, _FailOnceAsync], ids=["sync", "async"])
def test_an_executor_failure_fails_its_requests_and_the_engine_keeps_serving(wrapper):
    inner = make_executor(num_blocks=64)
    executor = wrapper(inner)
    with LLMEngine(executor) as engine:
        executor.armed.set()
        doomed = engine.submit([4, 5, 6], SamplingParams(max_tokens=4))
        with pytest.raises(StepFailedError, match="injected kernel fault"):
            doomed.result(timeout=60)
        prompts = _prompts(3, seed=11)
        outs = engine.generate(prompts, SamplingParams(max_tokens=6))
        for prompt, out in zip(prompts, outs):
            assert out.error is None and out.token_ids == solo_output(
                prompt, SamplingParams(max_tokens=6), inner
            )
        assert engine.memory_stats().free_blocks == 64
    with pytest.raises(EngineClosedError):
        engine.submit([1])


def test_closing_mid_stream_flushes_the_step_in_flight_and_ends_the_request():
    executor = make_executor(num_blocks=64)
    prompt, params = [3, 1, 4, 1, 5], SamplingParams(max_tokens=300, ignore_eos=True)
    engine = LLMEngine(executor)
    assert engine._steps.async_scheduling
    handle = engine.submit(prompt, params)
    stream = iter(handle)
    got = [next(stream) for _ in range(4)]
    engine.close()
    with pytest.raises(EngineClosedError, match="the engine was closed"):
        got.extend(stream)
    assert not engine._steps.in_flight, "a step was left in flight"
    assert got == list(solo_output(prompt, params, executor)[: len(got)])


def test_a_late_cancel_does_not_abort_a_new_request_reusing_the_id():
    """A cancel that arrives as its request finishes on its own must not end a later request given the same
    id. "w" holds the loop inside a step until "x" and "z" are queued, so both join the next step; "x" is
    cancelled during that step, its last, and the same step's output for "z" submits a new "x" before the
    loop takes the cancel: the new "x" and the stale cancel reach the loop together."""
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    handles: dict[str, object] = {}
    entered, go = threading.Event(), threading.Event()

    def hook(sched, batch):
        if not entered.is_set():
            entered.set()
            assert go.wait(timeout=60)
        if "x" in batch.seq_ids and "again" not in handles:
            handles["x"].cancel()  # while "x" samples its last token: not done yet

    def on_z(event):
        if "again" not in handles and isinstance(event, tuple):  # "x" has finished and left the engine
            handles["again"] = engine.submit([7, 8, 9], params, request_id="x")

    config = SchedulerConfig(async_scheduling=False)
    with LLMEngine(make_executor(num_blocks=64), config, step_hook=hook) as engine:
        engine.submit([9, 9], SamplingParams(max_tokens=4, ignore_eos=True), request_id="w")
        assert entered.wait(timeout=60)
        handles["x"] = engine.submit([4, 5, 6], params, request_id="x")
        engine.submit([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), request_id="z", on_event=on_z)
        go.set()
        assert handles["x"].result(timeout=60).finish_reason == "length"
        again = handles["again"].result(timeout=60)
    assert again.finish_reason == "length" and len(again.token_ids) == 1, again


def test_a_request_without_an_id_never_takes_one_a_caller_gave():
    """The engine names requests "req-0", "req-1", ...: a request submitted without an id while a caller's
    own "req-0" runs gets another name, not the refusal "already in use" for an id it never chose."""
    go = threading.Event()
    hook = lambda sched, batch: go.wait(timeout=60)  # noqa: E731  (holds "req-0" unfinished)
    with LLMEngine(make_executor(num_blocks=64), step_hook=hook) as engine:
        mine = engine.submit([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True), request_id="req-0")
        auto = engine.submit([4, 5, 6], SamplingParams(max_tokens=2, ignore_eos=True))
        go.set()
        assert auto.request_id != "req-0"
        assert mine.result(timeout=60).token_ids and auto.result(timeout=60).token_ids


def test_an_unhashable_request_id_is_a_user_error_naming_it():
    with LLMEngine(make_executor(num_blocks=16)) as engine:
        with pytest.raises(UserError, match=r"request \['a'\]: a request id must be hashable .* got a list"):
            engine.submit([1, 2], request_id=["a"])
        assert engine._handles == {} and engine._inbox == []
        assert engine.generate([[1, 2]], SamplingParams(max_tokens=1))[0].finish_reason == "length"
