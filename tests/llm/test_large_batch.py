"""Decode batches beyond 256 (issue #29): the torch executor's static-shape buckets reach the scheduler's
``max_num_seqs``, and a full batch in the largest bucket gives every request its solo output."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.llm.serving_models import VOCAB, make_executor, solo_output, tiny_llama
from trtforge.llm.engine import make_step_loop
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.torch_exec import _BATCH_BUCKETS, TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig


def _decode_batch(rows: int) -> StepBatch:
    """A decode-only batch of `rows` sequences, one token each, every one in its own block."""
    return StepBatch.build(
        list(range(rows)),
        [[5]] * rows,
        [0] * rows,
        [[i % 8] for i in range(rows)],
        [[0]] * rows,
        [True] * rows,
    )


@pytest.mark.parametrize(
    ("max_batch", "top"),
    [(256, (192, 256)), (300, (256, 300)), (512, (256, 384, 512)), (1024, (512, 768, 1024))],
)
def test_decode_buckets_end_at_max_decode_batch(max_batch, top):
    ex = TorchExecutor(
        tiny_llama(), num_blocks=8, block_size=4, static_decode=True, max_decode_batch=max_batch
    )
    buckets = ex._batch_buckets
    assert buckets[-len(top) :] == top
    assert list(buckets) == sorted(set(buckets)) and buckets[0] == 1
    assert ex.path_of(_decode_batch(max_batch)) == "decode"
    assert ex.path_of(_decode_batch(max_batch + 1)) != "decode"  # above the largest bucket: not static


def test_from_pretrained_sizes_the_decode_buckets_to_max_num_seqs():
    from trtforge.llm.service import from_pretrained

    config = SchedulerConfig(max_num_seqs=512, max_num_batched_tokens=1024)
    with from_pretrained(tiny_llama(), num_blocks=32, block_size=4, config=config) as llm:
        assert llm.executor._batch_buckets[-2:] == (384, 512)


def _serve_full_bucket(executor: TorchExecutor, config: SchedulerConfig, reqs: list, n: int) -> dict:
    """Run `reqs` (id, prompt, max tokens) to completion through a step loop; assert some step decoded all
    `n` sequences on the static path (the n bucket); return each request's output tokens."""
    full = []

    def hook(sched, batch):
        if batch.num_seqs == n and executor.path_of(batch) == "decode":
            full.append(batch.num_seqs)

    loop = make_step_loop(executor, config, hook)
    for rid, prompt, tokens in reqs:
        loop.add_request(rid, prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
    done = {}
    while loop.has_unfinished():
        done.update({o.request_id: o.output_token_ids for o in loop.step() if o.finished})
    assert full, f"no step ran all {n} sequences in the {n} bucket"
    return done


def _not_solo(reqs: list, done: dict) -> list:
    """The requests whose output differs from their solo greedy run (eager executor, alone)."""
    solo_ex = make_executor()
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True) for _, _, tokens in reqs]
    return [rid for (rid, prompt, _), p in zip(reqs, params) if done[rid] != solo_output(prompt, p, solo_ex)]


@pytest.mark.parametrize(
    ("n", "async_scheduling"),
    [(512, False), (512, True), (1024, True)],
    ids=["512-sync", "512-async", "1024"],
)
def test_a_full_batch_in_the_largest_bucket_matches_its_solo_runs(n, async_scheduling):
    """n requests decode together on static shapes in the n bucket (1024: the largest of the default
    buckets); each output equals its solo run (eager executor, alone)."""
    rng = np.random.default_rng(29)
    reqs = [
        (f"r{i}", rng.integers(0, VOCAB, size=int(rng.integers(1, 9))).tolist(), int(rng.integers(2, 5)))
        for i in range(n)
    ]
    executor = TorchExecutor(
        tiny_llama(), num_blocks=n * 4, block_size=4, static_decode=True, max_decode_batch=n
    )
    config = SchedulerConfig(
        max_num_seqs=n, max_num_batched_tokens=8192, max_prefill_chunk=16, async_scheduling=async_scheduling
    )
    done = _serve_full_bucket(executor, config, reqs, n)
    wrong = _not_solo(reqs, done)
    assert not wrong, f"{len(wrong)} of {n} outputs differ from their solo runs, e.g. request {wrong[0]}"


def test_step_returns_its_own_logits_and_step_async_lends_the_decode_buffer():
    """step() logits survive later steps; step_async's decode logits are the executor's buffer (no copy of
    [rows, vocab] a step), equal to step()'s."""
    ex = TorchExecutor(tiny_llama(), num_blocks=8, block_size=4, static_decode=True, max_decode_batch=4)

    def one(tokens, start, slot):
        return StepBatch.build(
            ["a"], [tokens], [start], [[0, 1]], [[slot + i for i in range(len(tokens))]], [True]
        )

    ex.step(one([5, 6, 7], 0, 0))
    first = ex.step(one([8], 3, 3))
    kept = first.clone()
    lent = ex.step_async(one([9], 4, 4), None)
    assert torch.equal(first, kept), "a later step overwrote step()'s logits"
    assert lent.data_ptr() == ex._static["logits"].data_ptr()
    twin = TorchExecutor(tiny_llama(), num_blocks=8, block_size=4, static_decode=False)
    for batch in (one([5, 6, 7], 0, 0), one([8], 3, 3)):
        twin.step(batch)
    assert torch.equal(twin.step(one([9], 4, 4)), lent)


@pytest.mark.gpu
def test_512_sequences_replay_the_512_graph_and_match_eager_on_cuda():
    """On the device: a decode step of 512 rows replays the captured 512-row CUDA graph (asynchronous
    scheduling, ids fed on the device) and every request gets the eager executor's tokens."""
    n = 512
    rng = np.random.default_rng(30)
    reqs = [
        (i, rng.integers(0, VOCAB, size=int(rng.integers(1, 40))).tolist(), int(rng.integers(2, 12)))
        for i in range(n)
    ]
    model = copy.deepcopy(tiny_llama()).to("cuda")  # (the cached CPU model stays where it is)
    outs, graph_rows = [], []
    try:
        for static in (False, True):
            ex = TorchExecutor(
                model, num_blocks=n * 4, block_size=16, static_decode=static, max_decode_batch=n
            )
            config = SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=8192, max_prefill_chunk=64)
            loop = make_step_loop(ex, config)
            for rid, prompt, tokens in reqs:
                loop.add_request(rid, prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
            done = {}
            while loop.has_unfinished():
                done.update({o.request_id: o.output_token_ids for o in loop.step() if o.finished})
            outs.append(done)
            graph_rows = [key[0] for key in ex._graphs]  # (batch, width, ...) buckets
    finally:
        tiny_llama().to("cpu")
    assert n in graph_rows, (
        f"no 512-row graph was captured (captured batch buckets: {sorted(set(graph_rows))})"
    )
    assert outs[0] == outs[1] and len(outs[0]) == n


@pytest.mark.gpu
def test_1024_sequences_in_the_largest_graph_bucket_match_their_solo_runs_on_cuda():
    """Issue #29's acceptance for the largest decode-graph bucket: 1024 requests (max_num_seqs = the largest
    of the default buckets) decode together by replaying the captured 1024-row CUDA graph (asynchronous
    scheduling), and every output equals the request's solo greedy run (eager, alone; float64 on the CPU,
    so that 1024 solo runs take seconds)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    n = _BATCH_BUCKETS[-1]
    rng = np.random.default_rng(31)
    reqs = [
        (i, rng.integers(0, VOCAB, size=int(rng.integers(1, 17))).tolist(), int(rng.integers(2, 6)))
        for i in range(n)
    ]
    model = copy.deepcopy(tiny_llama()).to("cuda")  # float64: batching never flips a greedy tie
    ex = TorchExecutor(model, num_blocks=n * 3, block_size=16, static_decode=True, max_decode_batch=n)
    assert ex.use_cuda_graphs and ex._batch_buckets[-1] == n
    config = SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=16 * n, max_prefill_chunk=16)
    done = _serve_full_bucket(ex, config, reqs, n)
    assert any(key[0] == n for key in ex._graphs), f"no {n}-row graph: {ex.decode_graph_buckets}"
    # the solo runs: the same float64 weights, eager on the CPU (far below any greedy margin)
    wrong = _not_solo(reqs, done)
    assert not wrong, f"{len(wrong)} of {n} outputs differ from their solo runs, e.g. request {wrong[0]}"
