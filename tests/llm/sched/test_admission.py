"""Admission that reserves every sequence's whole length (``SchedulerConfig.reserve_max_tokens``): a pool
too small for everyone at once then never preempts, and every output still equals its solo run."""

from __future__ import annotations

import numpy as np
import pytest

from tests.llm.serving_models import VOCAB, make_executor, solo_output
from trtforge.errors import UserError
from trtforge.llm.engine import make_step_loop
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig


def _staggered(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [
        (
            int(rng.integers(0, 30)),
            f"r{i}",
            rng.integers(0, VOCAB, size=int(rng.integers(1, 60))).tolist(),
            SamplingParams(max_tokens=int(rng.integers(1, 20)), ignore_eos=True),
        )
        for i in range(n)
    ]


def _serve(executor, reqs, config):
    loop = make_step_loop(executor, config)
    done, step, pending = {}, 0, sorted(reqs, key=lambda r: r[0])
    peak_growth = []
    while pending or loop.has_unfinished():
        while pending and pending[0][0] <= step:
            _, rid, prompt, params = pending.pop(0)
            loop.add_request(rid, prompt, params)
        done.update({o.request_id: o.output_token_ids for o in loop.step() if o.finished})
        sched = loop.scheduler
        # what the running sequences hold plus what they will still take never exceeds the pool
        held = executor.facts.num_blocks - sched.block_manager.num_free_blocks
        peak_growth.append(held + sched._growth_blocks())
        step += 1
    return loop, done, max(peak_growth)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_reserving_max_tokens_never_preempts_and_matches_solo_runs(async_scheduling):
    reqs = _staggered(48, seed=5)
    solo_ex = make_executor()
    solo = {rid: solo_output(prompt, params, solo_ex) for _, rid, prompt, params in reqs}
    outcome = {}
    for reserve in (False, True):
        executor = make_executor(num_blocks=28, block_size=8)
        config = SchedulerConfig(
            max_num_seqs=32,
            max_num_batched_tokens=160,
            max_prefill_chunk=32,
            async_scheduling=async_scheduling,
            reserve_max_tokens=reserve,
        )
        loop, done, peak = _serve(executor, reqs, config)
        assert done == solo
        assert loop.scheduler.memory_stats().free_blocks == 28
        outcome[reserve] = (loop.stats.preemptions, loop.stats.max_running, peak)
    assert outcome[False][0] > 0, "the pool was meant to be too small for everyone at once"
    preemptions, max_running, peak = outcome[True]
    assert preemptions == 0 and max_running >= 2
    assert peak <= 28 + 1, peak  # (+1: a sequence's token in flight may already hold its next block)


def test_reserve_max_tokens_must_be_a_bool():
    with pytest.raises(UserError, match="reserve_max_tokens"):
        SchedulerConfig(reserve_max_tokens="yes").validate()
