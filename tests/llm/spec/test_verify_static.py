"""Verification steps (every sequence brings 1..8 tokens) on the torch executor's static decode path:
each sequence padded to the step's longest run (padding rows ahead of its tokens), the split-KV decode
kernel with that query length, one CUDA graph per (batch, width, q_len) bucket on CUDA. The logits
equal the eager path's, for every row `logits_indices` asks, in its order."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests.llm.serving_models import tiny_llama
from trtforge.errors import UserError
from trtforge.llm.executors.base import StepBatch, TokenFeed
from trtforge.llm.executors.torch_exec import TorchExecutor

BS = 4
# (cached tokens, new tokens) per sequence: a decode row of a 1-token prompt (context 2: most of its
# padding rows see no key), verification runs of 5 and 3, a decode row, a run crossing blocks
SEQS = [(1, 1), (10, 5), (20, 3), (7, 1), (13, 4)]


def _tables(seqs, blocks_from: int = 0) -> list[list[int]]:
    """Each sequence's blocks (room for one token more), interleaved over the pool (block i of sequence
    b: b + i * len(seqs))."""
    n = len(seqs)
    return [[blocks_from + b + i * n for i in range(-(-(c + q + 1) // BS))] for b, (c, q) in enumerate(seqs)]


def _slots(table, first: int, count: int) -> list[int]:
    return [table[p // BS] * BS + p % BS for p in range(first, first + count)]


def _prefill(seqs, tables, rng) -> tuple[StepBatch, list[list[int]]]:
    """The cached part of every sequence, in one step (a prompt chunk each)."""
    toks = [rng.integers(3, 300, size=c).tolist() for c, _ in seqs]
    slots = [_slots(t, 0, c) for t, (c, _) in zip(tables, seqs)]
    ids = list(range(len(seqs)))
    return StepBatch.build(ids, toks, [0] * len(seqs), tables, slots, [True] * len(seqs)), toks


def _verify(seqs, tables, rng, all_rows: bool = True) -> StepBatch:
    """The new tokens of every sequence, every one wanting logits (verification); without `all_rows`
    the last sequence's last token only (a short prompt chunk beside the verifying rows)."""
    toks = [rng.integers(3, 300, size=q).tolist() for _, q in seqs]
    slots = [_slots(t, c, q) for t, (c, q) in zip(tables, seqs)]
    ids = list(range(len(seqs)))
    base = StepBatch.build(ids, toks, [c for c, _ in seqs], tables, slots, [True] * len(seqs))
    extra = [q - 1 for _, q in seqs[:-1]] + [q - 1 if all_rows else 0 for _, q in seqs[-1:]]
    return StepBatch.from_flat(
        ids,
        base.input_ids.tolist(),
        [q for _, q in seqs],
        [c for c, _ in seqs],
        base.slot_mapping.tolist(),
        [True] * len(seqs),
        base.block_tables,
        extra_logits=extra,
    )


def _pair(model, **kwargs) -> tuple[TorchExecutor, TorchExecutor]:
    """(static, eager) executors of two copies of `model`."""
    static = TorchExecutor(copy.deepcopy(model), static_decode=True, max_decode_batch=64, **kwargs)
    eager = TorchExecutor(copy.deepcopy(model), static_decode=False, **kwargs)
    return static, eager


@pytest.mark.parametrize("all_rows", [True, False], ids=["verify", "with-a-prompt-chunk"])
def test_verification_step_on_the_static_path_gives_the_eager_logits(all_rows):
    rng = np.random.default_rng(0)
    tables = _tables(SEQS)
    static, eager = _pair(tiny_llama(), num_blocks=64, block_size=BS)
    prefill, _ = _prefill(SEQS, tables, rng)
    verify = _verify(SEQS, tables, rng, all_rows)
    assert static.path_of(prefill) != "decode"
    assert static.path_of(verify) == "decode" and static.static_q_len(verify) == 5
    assert eager.path_of(verify) == "eager"
    for ex in (static, eager):
        ex.step(prefill)
    got, want = static.step(verify), eager.step(verify)
    assert got.shape == (len(verify.logits_indices), static.facts.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # the rows the scheduler wrote are the same in both pools; padding wrote only the scratch block. Up to
    # float64 rounding: the padded batch's projections may take another BLAS kernel than the unpadded one
    # (on an AVX2-only CPU 97 of 8,192 values differed by <= 2e-15); a stray write would be O(1)
    for a, b in zip(static.k_pools, eager.k_pools):
        torch.testing.assert_close(a[:-1], b[:-1], rtol=0, atol=1e-12)


def test_a_fed_verification_step_takes_its_ids_from_the_previous_tokens():
    """TokenFeed rows (token indices of the batch) land on their padded rows."""
    rng = np.random.default_rng(1)
    tables = _tables(SEQS)
    static, eager = _pair(tiny_llama(), num_blocks=64, block_size=BS)
    prefill, _ = _prefill(SEQS, tables, rng)
    verify = _verify(SEQS, tables, rng)
    for ex in (static, eager):
        ex.step(prefill)
    qsl = verify.query_start_loc
    rows = qsl[1:].astype(np.int64) - 1  # each sequence's last token comes from the "previous step"
    prev = torch.tensor([11, 22, 33, 44, 55, 66], dtype=torch.int64)
    feed = TokenFeed(rows=rows, sources=np.array([5, 0, 3, 1, 2]), tokens=prev)
    ids = verify.input_ids.copy()
    ids[rows] = prev.numpy()[feed.sources]
    fed = StepBatch(**{**verify.__dict__, "input_ids": ids})
    torch.testing.assert_close(static.step_async(verify, feed), eager.step(fed), rtol=1e-6, atol=1e-6)


def test_a_verification_step_too_long_or_too_wide_leaves_the_static_path():
    static, _ = _pair(tiny_llama(), num_blocks=64, block_size=BS)
    rng = np.random.default_rng(2)
    nine = [(3, 9)]
    assert static.path_of(_verify(nine, _tables(nine), rng)) == "piecewise"
    prompts = [(0, 5)]  # a short prompt chunk (logits of its last token only)
    assert static.path_of(_verify(prompts, _tables(prompts), rng, all_rows=False)) == "piecewise"
    many = [(2, 3)] * 33  # bucket 64 x 3 rows > the 64 rows of the largest batch bucket
    assert static.static_q_len(_verify(many, _tables(many), rng)) is None
    given = TorchExecutor(
        copy.deepcopy(tiny_llama()), num_blocks=64, block_size=BS, static_decode=True,
        decode_attention=static.decode_attention,
    )  # fmt: skip
    assert given.static_q_len(_verify(SEQS, _tables(SEQS), rng)) is None  # it takes one query a row


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_triton_verification_step_on_the_static_path_matches_the_torch_reference(device):
    """Triton's decode kernel with q_len, the fused layers (GEMVs at one row), and on CUDA the CUDA
    graph of the (batch, width, q_len) bucket, against the eager torch reference in float32."""
    skip_unless_runs_here(device)
    rng = np.random.default_rng(3)
    tables = _tables(SEQS)
    base = copy.deepcopy(tiny_llama()).float()
    kw = {"num_blocks": 64, "block_size": BS, "device": device}
    static = TorchExecutor(copy.deepcopy(base).half(), kernels="triton", static_decode=True, **kw)
    ref = TorchExecutor(copy.deepcopy(base), kernels="torch", static_decode=False, mixed_graphs=False, **kw)
    assert static.fused_refusal is None
    prefill, _ = _prefill(SEQS, tables, rng)
    steps = [_verify(SEQS, tables, rng), _verify([(c + q, 1) for c, q in SEQS], tables, rng)]
    for ex in (static, ref):
        ex.step(prefill)
    for batch in steps:  # a verification step, then a decode step after it (the graphs of both)
        assert static.path_of(batch) == "decode"
        got, want = static.step(batch), ref.step(batch)
        scale = want.abs().max()
        assert float((got - want).abs().max() / scale) < 2e-2
        assert bool((got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9)
    if device == "cuda":
        assert {s for *_, s in static.decode_graph_buckets} == {5, 1}  # a graph per q_len: verify, decode


def test_verification_graphs_to_capture_up_front_are_checked():
    ex = TorchExecutor(copy.deepcopy(tiny_llama()), num_blocks=64, block_size=BS, static_decode=True)
    with pytest.raises(UserError, match=r"q_lens must lie in 1\.\.8"):
        ex.capture_decode_graphs(q_lens=(1, 9))
    assert ex.capture_decode_graphs(q_lens=(1, 5)) == 0  # on the CPU nothing is captured


@pytest.mark.gpu
def test_verification_graphs_captured_up_front_are_replayed_on_cuda():
    """Float64 (the torch reference attention with q_len inside the graphs): one sequence's
    verification step replays the graph captured up front and gives the eager logits."""
    rng = np.random.default_rng(5)
    seqs = [(30, 5)]
    tables = _tables(seqs)
    kw = {"num_blocks": 64, "block_size": BS, "device": "cuda"}
    static = TorchExecutor(copy.deepcopy(tiny_llama()), static_decode=True, max_decode_batch=8, **kw)
    eager = TorchExecutor(copy.deepcopy(tiny_llama()), static_decode=False, **kw)
    n = static.capture_decode_graphs(max_batch=1, q_lens=(1, 5))
    assert n == len(static.decode_graph_buckets) and {s for *_, s in static.decode_graph_buckets} == {1, 5}
    prefill, _ = _prefill(seqs, tables, rng)
    verify = _verify(seqs, tables, rng)
    for ex in (static, eager):
        ex.step(prefill)
    assert static.static_q_len(verify) == 5
    torch.testing.assert_close(static.step(verify), eager.step(verify), rtol=1e-9, atol=1e-9)
    assert static.num_cuda_graphs == n  # replayed, none captured on the way
