"""The scheduler by hand, with no model: schedule() plans (and runs nothing), update() applies tokens.

The executor here has the facts a scheduler reads and no ``step`` at all, so a plan that tried to run
it would fail; tokens are chosen by the test, so every append, stop and free is checked exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.llm.executors.base import ExecutorFacts, StepBatch
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import RequestStatus, Scheduler, SchedulerConfig


class Facts:
    """An executor with facts only (no step method): 16 blocks of 4 tokens, vocabulary 50, EOS 7."""

    facts = ExecutorFacts(
        num_blocks=16,
        block_size=4,
        vocab_size=50,
        max_model_len=64,
        eos_token_ids=(7,),
        num_layers=1,
        num_kv_heads=1,
        head_dim=4,
        kv_dtype="float32",
        kv_element_bytes=4,
        kv_pool_bytes=16 * 4 * 4 * 4 * 2,
    )


def _scheduler(**config) -> Scheduler:
    return Scheduler(Facts(), SchedulerConfig(**config))


def test_schedule_plans_a_prefill_then_decodes_and_update_applies_tokens():
    sched = _scheduler(enable_prefix_caching=False)
    sched.add_request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=3))
    sched.add_request("b", [9, 8], SamplingParams(max_tokens=5))
    plan = sched.schedule()
    batch = plan.batch
    assert isinstance(batch, StepBatch) and batch.seq_ids == ("a", "b")
    assert batch.input_ids.tolist() == [1, 2, 3, 4, 5, 9, 8]
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert batch.query_start_loc.tolist() == [0, 5, 7] and batch.context_lens.tolist() == [5, 2]
    assert batch.logits_indices.tolist() == [4, 6]
    tables = [sched.block_manager.block_table(s) for s in ("a", "b")]
    assert batch.slot_mapping.tolist() == [tables[0][p // 4] * 4 + p % 4 for p in range(5)] + [
        tables[1][0] * 4 + p for p in range(2)
    ]
    assert [s.request_id for s in plan.samplers] == ["a", "b"]
    assert plan.sampling_params == [SamplingParams(max_tokens=3), SamplingParams(max_tokens=5)]
    sched.computed(plan)
    outs = sched.update(plan, [11, 12])
    assert [(o.request_id, o.new_token_ids, o.finished) for o in outs] == [
        ("a", (11,), False),
        ("b", (12,), False),
    ]
    plan = sched.schedule()  # both decode: their last tokens, at the next positions
    assert plan.batch.is_decode_only and plan.batch.input_ids.tolist() == [11, 12]
    assert plan.batch.positions.tolist() == [5, 2]
    sched.computed(plan)
    assert not any(o.finished for o in sched.update(plan, [13, 14]))
    plan = sched.schedule()
    sched.computed(plan)
    outs = {o.request_id: o for o in sched.update(plan, [15, 7])}  # a reaches 3 tokens, b samples EOS
    assert outs["a"].finished and outs["a"].finish_reason == "length"
    assert outs["a"].output_token_ids == (11, 13, 15)
    assert outs["b"].finished and outs["b"].finish_reason == "stop"
    assert outs["b"].output_token_ids == (12, 14, 7)
    assert not sched.has_unfinished() and not sched.schedule()
    assert sched.memory_stats().free_blocks == Facts.facts.num_blocks
    assert sched.stats.steps == 3 and sched.stats.generated_tokens == 6


def test_a_request_aborted_between_schedule_and_update_is_dropped_from_the_results():
    sched = _scheduler()
    sched.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4))
    sched.add_request("b", [4, 5, 6], SamplingParams(max_tokens=4))
    plan = sched.schedule()
    assert sched.abort("a")
    sched.computed(plan)
    outs = sched.update(plan, [20, 21])
    assert [o.request_id for o in outs] == ["b"]
    assert [(o.request_id, o.finish_reason) for o in sched.take_outputs()] == [("a", "abort")]
    sched.block_manager.check_invariants()


def test_fail_ends_every_request_of_the_plan_and_frees_their_blocks():
    sched = _scheduler(max_num_seqs=2)
    for rid in ("a", "b", "c"):
        sched.add_request(rid, [3, 4, 5], SamplingParams(max_tokens=4))
    plan = sched.schedule()
    outs = sched.fail(plan, RuntimeError("boom"))
    assert [(o.request_id, o.finish_reason) for o in outs] == [("a", "error"), ("b", "error")]
    assert all("boom" in str(o.error) for o in outs) and sched.stats.failed_steps == 1
    assert sched.num_waiting == 1 and sched.num_running == 0
    assert sched.memory_stats().free_blocks == Facts.facts.num_blocks


def test_a_deferred_plan_is_fed_on_the_device_and_filled_by_its_update():
    sched = _scheduler(enable_prefix_caching=False)
    sched.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    sched.add_request("b", [4, 5], SamplingParams(max_tokens=4, ignore_eos=True))
    first = sched.schedule()
    sched.computed(first)
    sched.defer(first)  # its two tokens stay on the device
    second = sched.schedule()  # planned as if they were known: one decode each
    assert second.batch.is_decode_only and second.batch.positions.tolist() == [3, 2]
    rows, sources = second.fed_rows()
    assert rows.tolist() == [0, 1] and sources.tolist() == [0, 1]
    sched.computed(second)
    outs = sched.update(first, [30, 31])  # the first plan's tokens arrive
    assert [o.new_token_ids for o in outs] == [(30,), (31,)]
    seqs = {s.request_id: s for s in second.seqs}
    assert seqs["a"].tokens == [1, 2, 3, 30] and seqs["a"].pending_row == -1
    assert sched.block_manager.num_tokens("a") == 4
    sched.defer(second)
    assert sched.schedule().fed_rows() is not None
    assert all(s.status is RequestStatus.RUNNING for s in second.seqs)


def test_stepbatch_build_and_from_flat_are_one_flattening():
    per_seq = StepBatch.build(
        ["x", "y"], [[5, 6, 7], [8]], [2, 9], [[3, 4], [1, 2, 6]], [[10, 11, 16], [25]], [False, True]
    )
    table = np.array([[3, 4, 0], [1, 2, 6]], dtype=np.int32)
    flat = StepBatch.from_flat(
        ["x", "y"], [5, 6, 7, 8], [3, 1], [2, 9], [10, 11, 16, 25], [False, True], table
    )
    for name in ("input_ids", "positions", "query_start_loc", "context_lens", "block_tables"):
        assert np.array_equal(getattr(per_seq, name), getattr(flat, name)), name
    assert per_seq.positions.tolist() == [2, 3, 4, 9] and per_seq.logits_indices.tolist() == [3]
    assert per_seq.context_lens.tolist() == [5, 10]
    with pytest.raises(ValueError, match="at least one new token"):
        StepBatch.build(["x", "y"], [[], [1, 2]], [0, 0], [[0], [1]], [[], [4, 5]], [True, True])


def _beside_a_decode(buckets: tuple[int, ...], prompt_len: int, **config) -> tuple[Scheduler, object]:
    """A scheduler over an executor that pads steps with prompt tokens to `buckets`: request "a" decodes
    (its prompt done) when request "b" of `prompt_len` tokens arrives; returns it and the next plan."""
    import dataclasses

    class Padded:
        facts = dataclasses.replace(Facts.facts, step_token_buckets=buckets)

    sched = Scheduler(Padded(), SchedulerConfig(enable_prefix_caching=False, **config))
    sched.add_request("a", [1, 2, 3, 4], SamplingParams(max_tokens=10))
    plan = sched.schedule()
    sched.computed(plan)
    sched.update(plan, [11])
    sched.add_request("b", [10 + i % 30 for i in range(prompt_len)], SamplingParams(max_tokens=2))
    return sched, sched.schedule()


@pytest.mark.parametrize("fill", [True, False])
def test_a_step_with_decodes_fills_the_executors_padding_bucket_with_prompt_tokens(fill):
    sched, plan = _beside_a_decode(
        (8, 16, 32),
        40,
        max_num_batched_tokens=32,
        max_prefill_chunk=32,
        max_prefill_tokens_with_decodes=8,
        fill_step_buckets=fill,
    )
    # a decodes; b is admitted beside it: 8 prompt tokens would make 9, which the executor pads to 16
    assert plan.batch.query_lens.tolist() == [1, 15 if fill else 8]
    sched.computed(plan)
    sched.update(plan, [12])
    # b is running with its prompt unfinished: the same rule while the running sequences are planned
    plan = sched.schedule()
    assert plan.batch.query_lens.tolist() == [1, 15 if fill else 8]
    assert plan.batch.num_tokens == (16 if fill else 9)


def test_filling_the_bucket_never_passes_the_step_budget_nor_shrinks_the_cap():
    def prompt_tokens(cap, budget):
        _, plan = _beside_a_decode(
            (8, 16, 64),
            48,
            max_num_batched_tokens=budget,
            max_prefill_chunk=64,
            max_prefill_tokens_with_decodes=cap,
        )
        return plan.batch.query_lens.tolist()[1]

    assert prompt_tokens(15, 64) == 15  # 1 + 15 is a bucket already
    assert prompt_tokens(16, 40) == 39  # the next bucket (64) is past the budget: filled to the budget
    assert prompt_tokens(16, 64) == 48  # ... or to the bucket when the budget allows


def test_fill_step_buckets_must_be_a_bool():
    from trtforge.errors import UserError

    with pytest.raises(UserError, match="fill_step_buckets must be a bool, got 'yes'"):
        SchedulerConfig(fill_step_buckets="yes").validate()
