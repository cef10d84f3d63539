"""Issue #17 acceptance on CPU with the ONNX Runtime executor over an exported paged step graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.llm.sched.test_scheduler import _waste_hook, _workload, serve_staggered
from tests.llm.serving_models import run_to_completion, solo_output
from tests.llm.test_serving import _FailOnce
from tests.llm.tiny_models import hf_greedy, tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile.export import export_step
from trtforge.llm.engine import LLMEngine, make_step_loop
from trtforge.llm.executors import OrtPagedExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig, StepFailedError

BLOCK = 8


@pytest.fixture(scope="module")
def step_graph(tmp_path_factory):
    """The tiny FP32 Llama as a paged step graph (blocks of 8 tokens, sequences up to 256)."""
    d = tmp_path_factory.mktemp("paged")
    result = export_step(
        tiny_model("llama"), max_seq=256, max_batch=8, exporter="legacy", workdir=d,
        cache_layout="paged", block_size=BLOCK,
    )  # fmt: skip
    path = d / "step.onnx"
    onnx.save(result.model, str(path))
    return path


@pytest.fixture(scope="module")
def workload(step_graph):
    """64 requests (arrival step, id, prompt, params) and each one's output when run alone on ORT."""
    reqs = _workload(64, seed=1)
    solo_exec = OrtPagedExecutor(step_graph, num_blocks=64)
    return reqs, {rid: solo_output(prompt, params, solo_exec) for _, rid, prompt, params in reqs}


def test_64_staggered_requests_match_solo_runs_and_hf_generate(step_graph, workload):
    done = serve_staggered(OrtPagedExecutor(step_graph, num_blocks=256), workload, preempt=False)
    model = tiny_model("llama")
    for _, rid, prompt, _params in workload[0][:4]:
        want, _ = hf_greedy(model, prompt, len(done[rid].output_token_ids))
        assert list(done[rid].output_token_ids) == want, rid


def test_a_pool_too_small_preempts_and_still_matches(step_graph, workload):
    serve_staggered(OrtPagedExecutor(step_graph, num_blocks=28), workload, preempt=True)


def test_sixteen_requests_with_a_200_token_prefix_hold_it_once(step_graph):
    rng = np.random.default_rng(4)
    prefix = rng.integers(3, 300, size=200).tolist()
    prompts = [prefix + rng.integers(3, 300, size=int(rng.integers(1, 9))).tolist() for _ in range(16)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prefix_blocks = 200 // BLOCK
    seen: dict[str, int] = {}

    def hook(sched, batch):
        _waste_hook(sched, batch)
        ids = sched.running_request_ids()
        if len(ids) < 16:
            return
        tables = [sched.block_manager.block_table(r) for r in ids]
        assert all(t[:prefix_blocks] == tables[0][:prefix_blocks] for t in tables), "prefix not shared"
        held = {b for t in tables for b in t}
        assert sched.memory_stats().used_blocks == len(held)
        private = sum(len(t) - prefix_blocks for t in tables)
        assert len(held) == prefix_blocks + private, "prefix blocks held more than once"
        seen["steps"] = seen.get("steps", 0) + 1

    executor = OrtPagedExecutor(step_graph, num_blocks=96)
    sched = make_step_loop(executor, SchedulerConfig(max_num_seqs=16), hook)
    for i, p in enumerate(prompts):
        sched.add_request(i, p, params)
    done = run_to_completion(sched)
    assert seen.get("steps", 0) > 0, "the 16 requests never ran together"
    assert sched.stats.prefix_hit_tokens >= 15 * prefix_blocks * BLOCK
    assert sched.memory_stats().free_blocks == 96
    solo_exec = OrtPagedExecutor(step_graph, num_blocks=64)
    for i, p in enumerate(prompts):
        assert done[i].output_token_ids == solo_output(p, params, solo_exec), i


def test_bad_requests_cancel_and_executor_faults(step_graph):
    inner = OrtPagedExecutor(step_graph, num_blocks=48)
    executor = _FailOnce(inner)
    with LLMEngine(executor, SchedulerConfig(max_num_seqs=8)) as engine:
        with pytest.raises(UserError, match="prompt is empty"):
            engine.submit([])
        with pytest.raises(UserError, match="maximum sequence length"):
            engine.submit([5] * 256)
        with pytest.raises(UserError, match="SamplingParams.top_p"):
            engine.generate([[1, 2]], SamplingParams(top_p=0.0))
        stream = engine.stream(list(range(3, 40)), SamplingParams(max_tokens=150, ignore_eos=True))
        assert len([next(stream) for _ in range(3)]) == 3
        stream.close()
        assert engine.wait_idle(timeout=60)
        assert engine.stats.generated_tokens < 100, "the request ran on after its stream was closed"
        assert engine.memory_stats().free_blocks == 48
        executor.armed.set()
        doomed = engine.submit([4, 5, 6], SamplingParams(max_tokens=4))
        with pytest.raises(StepFailedError, match="injected kernel fault"):
            doomed.result(timeout=60)
        prompts = [[7, 8, 9, 10], [11] * 20, [12, 13]]
        outs = engine.generate(prompts, SamplingParams(max_tokens=6))
        solo_exec = OrtPagedExecutor(step_graph, num_blocks=16)
        for prompt, out in zip(prompts, outs):
            assert out.error is None
            assert out.token_ids == solo_output(prompt, SamplingParams(max_tokens=6), solo_exec)
        assert engine.wait_idle(timeout=60)
        assert engine.memory_stats().free_blocks == 48


def test_a_failed_step_fails_only_its_requests(step_graph):
    """Two running requests share the failing step; the one waiting behind them runs on to its solo output."""
    inner = OrtPagedExecutor(step_graph, num_blocks=32)
    executor = _FailOnce(inner)
    sched = make_step_loop(executor, SchedulerConfig(max_num_seqs=2))
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    for rid, prompt in (("a", [3, 4, 5]), ("b", [6] * 9), ("c", [7, 8])):
        sched.add_request(rid, prompt, params)
    first = sched.step()  # a and b prefill; c waits (max_num_seqs=2)
    assert [o.request_id for o in first] == ["a", "b"] and sched.scheduler.num_waiting == 1
    executor.armed.set()
    failed = {o.request_id: o for o in sched.step()}
    assert sorted(failed) == ["a", "b"]
    assert all(isinstance(o.error, StepFailedError) and o.finish_reason == "error" for o in failed.values())
    done = run_to_completion(sched)
    assert done["c"].error is None
    solo = solo_output([7, 8], params, OrtPagedExecutor(step_graph, num_blocks=8))
    assert done["c"].output_token_ids == solo
    assert sched.memory_stats().free_blocks == 32 and sched.stats.failed_steps == 1


def test_kv_pools_larger_than_ram_are_refused_by_num_blocks(step_graph):
    """Before: numpy's MemoryError escaped as an internal error (or a lazily committed pool failed later)."""
    with pytest.raises(UserError, match=r"num_blocks=1000000000 needs .* GiB of KV pools .* more than this"):
        OrtPagedExecutor(step_graph, num_blocks=10**9)
