"""The bulk host path of a step: batches equal to the per-sequence construction, block-table matrix
rows that follow every table change, and batched sampling equal to sampling row by row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtforge.llm.engine import make_step_loop
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.sampling import SamplingParams, sample
from trtforge.llm.sched.blocks import BlockManager
from trtforge.llm.sched.scheduler import Scheduler, SchedulerConfig

VOCAB = 97


class RandomLogitsExecutor:
    """A StepExecutor without a model: seeded random logits (numpy or torch), one row per wanted token."""

    def __init__(self, num_blocks: int, block_size: int, as_torch: bool, seed: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.vocab_size, self.max_model_len, self.eos_token_id = VOCAB, 256, 3
        self.as_torch = as_torch
        self.rng = np.random.default_rng(seed)

    def step(self, batch: StepBatch):
        logits = self.rng.normal(size=(len(batch.logits_indices), VOCAB)).astype(np.float32) * 3
        return torch.from_numpy(logits) if self.as_torch else logits


def _expected_batch(sched: Scheduler, batch: StepBatch) -> StepBatch:
    """The batch rebuilt the old way: per-sequence lists from the scheduler's state, then StepBatch.build."""
    bm, bs = sched.block_manager, sched.block_manager.block_size
    tokens, starts, tables, slots, wants = [], [], [], [], []
    for sid in batch.seq_ids:
        seq = sched._requests[sid]
        start, end = seq.num_computed, bm.num_tokens(sid)
        table = bm.block_table(sid)
        tokens.append(seq.tokens[start:end])
        starts.append(start)
        tables.append(table)
        slots.append([table[p // bs] * bs + p % bs for p in range(start, end)])
        wants.append(end == len(seq.tokens))
    copies = [tuple(c) for c in batch.block_copies.tolist()]
    return StepBatch.build(batch.seq_ids, tokens, starts, tables, slots, wants, copies)


def _random_params(rng: np.random.Generator) -> SamplingParams:
    kind = int(rng.integers(0, 4))
    max_tokens = int(rng.integers(1, 20))
    if kind == 0:
        return SamplingParams(max_tokens=max_tokens)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(rng.choice([0.5, 1.0, 1.7])),
        top_k=int(rng.choice([0, 5, 40])),
        top_p=float(rng.choice([1.0, 0.9, 0.5])),
        seed=int(rng.integers(0, 2**31)) if kind == 3 else None,
        stop_token_ids=[int(rng.integers(0, VOCAB))] if kind == 2 else [],
        stop_sequences=[[int(rng.integers(0, VOCAB)), int(rng.integers(0, VOCAB))]] if kind == 2 else [],
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bulk_batches_equal_the_per_sequence_construction_on_random_traces(seed):
    rng = np.random.default_rng(seed)
    executor = RandomLogitsExecutor(num_blocks=40, block_size=4, as_torch=seed % 2 == 1, seed=seed)
    config = SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=48, max_prefill_chunk=16)
    seen = {"batches": 0, "mixed": 0, "decode": 0}

    def hook(sched, batch):
        expected = _expected_batch(sched, batch)
        for name in ("input_ids", "positions", "query_start_loc", "context_lens", "block_tables"):
            got, want = getattr(batch, name), getattr(expected, name)
            assert got.dtype == want.dtype and np.array_equal(got, want), name
        for name in ("slot_mapping", "logits_indices", "block_copies"):
            got, want = getattr(batch, name), getattr(expected, name)
            assert got.dtype == want.dtype and np.array_equal(got, want), name
        assert batch.seq_ids == expected.seq_ids
        arrivals = [sched._requests[s].arrival for s in batch.seq_ids]
        assert arrivals == sorted(arrivals), "a batch lists its sequences in arrival order"
        sched.block_manager.check_invariants()
        seen["batches"] += 1
        seen["decode" if batch.is_decode_only else "mixed"] += 1

    sched = make_step_loop(executor, config, hook)
    shared = rng.integers(0, VOCAB, size=9).tolist()
    added = 0
    for _ in range(160):
        for _new in range(int(rng.poisson(0.6))):
            tail = rng.integers(0, VOCAB, size=int(rng.integers(1, 30))).tolist()
            prompt = (shared + tail) if rng.random() < 0.5 else tail
            sched.add_request(f"r{added}", prompt, _random_params(rng))
            added += 1
        if sched.scheduler.num_running and rng.random() < 0.05:
            ids = sched.scheduler.running_request_ids()
            sched.abort(ids[int(rng.integers(0, len(ids)))])
        sched.step()
    while sched.has_unfinished():
        sched.step()
    assert seen["decode"] > 10 and seen["mixed"] > 10, seen
    assert sched.stats.preemptions > 0, "the pool was sized to force preemptions"
    assert sched.memory_stats().free_blocks == executor.num_blocks


def test_block_table_matrix_follows_allocate_fork_copy_on_write_growth_and_free():
    bm = BlockManager(200, 2)

    def check(ids):
        width = max(len(bm.block_table(s)) for s in ids)
        got = bm.block_table_array(ids, width)
        want = np.zeros((len(ids), width), dtype=np.int32)
        for i, s in enumerate(ids):
            want[i, : len(bm.block_table(s))] = bm.block_table(s)
        assert got.dtype == np.int32 and np.array_equal(got, want)
        bm.check_invariants()

    bm.allocate("a", [1, 2, 3])
    bm.append_slots("a", [1, 2, 3])
    bm.mark_computed("a", 3)
    bm.fork("a", "b")
    _, copies = bm.append_slots("b", [9])  # writes into the shared, partly filled last block: a copy
    assert len(copies) == 1
    check(["a", "b"])
    ids = [f"s{i}" for i in range(20)]  # more tables than the matrix's first rows
    for i, s in enumerate(ids):
        bm.allocate(s, [i])
        bm.append_slots(s, list(range(i + 1)))
    bm.append_slots("s19", list(range(40)))  # a table wider than the matrix's first columns
    check(["b", *ids, "a"])
    for s in ids[::3]:
        bm.free(s)
    bm.free("a")
    left = ["b", *[s for s in ids if bm.has_sequence(s)]]
    check(left)
    bm.allocate("c", [5, 6])  # reuses a freed row, which must have been zeroed
    bm.append_slots("c", [5, 6])
    check(["c", *left])


def _mixed_params(n: int, seed: int) -> list[SamplingParams]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(SamplingParams())
        elif kind == 1:
            out.append(SamplingParams(temperature=0.8, top_p=0.9, seed=int(rng.integers(0, 2**31))))
        elif kind == 2:
            out.append(SamplingParams(temperature=1.3, top_k=7, seed=int(rng.integers(0, 2**31))))
        elif kind == 3:
            out.append(SamplingParams(temperature=1.0, top_k=1, seed=int(rng.integers(0, 2**31))))
        else:
            out.append(SamplingParams(temperature=0.6, top_k=30, top_p=0.7, seed=int(rng.integers(0, 2**31))))
    return out


@pytest.mark.parametrize("backend", ["numpy", "torch", "torch-device-branch"])
def test_batched_sampling_gives_each_seeded_request_the_tokens_it_gets_alone(backend):
    n, steps = 23, 6
    params = _mixed_params(n, seed=7)
    x = np.random.default_rng(3).normal(size=(steps, n, 200)).astype(np.float32) * 2

    def as_logits(a):
        if backend == "numpy":
            return a
        t = torch.from_numpy(a.copy())
        # a tensor numpy cannot view takes the branch device tensors take (argmax, kernels, one copy back)
        return t.requires_grad_(True) if backend == "torch-device-branch" else t

    batched_gens = [p.make_generator(i) for i, p in enumerate(params)]
    batched = [sample(as_logits(x[s]), params, batched_gens).tolist() for s in range(steps)]
    alone = []
    for i, p in enumerate(params):
        gen = p.make_generator(i)
        alone.append([int(sample(as_logits(x[s, i : i + 1]), [p], [gen])[0]) for s in range(steps)])
    assert [list(col) for col in zip(*batched)] == alone
    greedy = [i for i, p in enumerate(params) if p.greedy]
    assert all(batched[s][i] == int(x[s, i].argmax()) for s in range(steps) for i in greedy)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    assert len({tuple(alone[i]) for i in sampled}) > 1


def test_torch_device_branch_and_host_view_agree_and_half_precision_works():
    params = _mixed_params(11, seed=1)
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(11, 64)).astype(np.float32))
    host = sample(x, params, [p.make_generator(i) for i, p in enumerate(params)])
    gens = [p.make_generator(i) for i, p in enumerate(params)]
    branch = sample(x.clone().requires_grad_(True), params, gens)
    assert host.dtype == branch.dtype == np.int64 and np.array_equal(host, branch)
    greedy = [SamplingParams()] * 11
    for dtype in (torch.float16, torch.bfloat16):
        got = sample(x.to(dtype), greedy, [np.random.default_rng(0)] * 11)
        assert np.array_equal(got, x.to(dtype).argmax(-1).numpy())


def test_a_plan_out_of_arrival_order_is_reordered_with_its_tokens_and_slots():
    from types import SimpleNamespace

    from trtforge.llm.sched.plan import StepPlan

    def seq(arrival, tokens, computed):
        return SimpleNamespace(arrival=arrival, tokens=tokens, num_computed=computed, pending_row=-1)

    a, b, c, d = seq(5, [1, 2, 3, 4], 1), seq(2, [7, 8], 1), seq(9, [4, 4, 4], 0), seq(1, [6, 5], 1)
    plan = StepPlan()
    plan.seqs.append(d)  # the scheduler's decode fast path: the sequence and its slot only
    plan.slots.append(40)
    plan.add(a, [2, 3], [10, 11])
    assert plan.in_order
    plan.add(b, [8], [20])
    plan.add(c, [4, 4], [30, 31])
    assert not plan.in_order
    plan.finish()
    assert plan.in_order and plan.seqs == [d, b, a, c]
    assert (plan.counts, plan.starts, plan.wants) == ([1, 1, 2, 2], [1, 1, 1, 0], [True, True, False, False])
    assert (plan.ids, plan.slots) == ([5, 8, 2, 3, 4, 4], [40, 20, 10, 11, 30, 31])


@pytest.mark.parametrize("kind", ["numpy", "torch", "device-branch"])
def test_sample_async_gives_samples_tokens_and_draws(kind):
    from trtforge.llm.sampling import sample_async

    params = _mixed_params(11, seed=2)
    x = np.random.default_rng(3).normal(size=(11, 64)).astype(np.float32)
    logits = {
        "numpy": x,
        "torch": torch.from_numpy(x),
        "device-branch": torch.from_numpy(x).requires_grad_(True),  # no host view: the device code
    }[kind]
    gens_sync = [p.make_generator(i) for i, p in enumerate(params)]
    gens_async = [p.make_generator(i) for i, p in enumerate(params)]
    for _ in range(3):
        want = sample(logits, params, gens_sync)
        got = sample_async(logits, params, gens_async)
        assert len(got) == 11 and np.array_equal(np.asarray(got.tokens), want)
        assert got.result().dtype == np.int64 and np.array_equal(got.result(), want)
    assert [g.random() for g in gens_sync] == [g.random() for g in gens_async], "draws went out of step"
