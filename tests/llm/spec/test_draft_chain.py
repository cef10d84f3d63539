"""The draft model's further steps chained on the device (TorchExecutor.decode_chain, on the static
decode path; run eagerly here on the CPU) propose what its step-by-step proposals do: the same tokens,
the same distributions for sampled rows, the same draft pool, through rounds of partial acceptance,
uneven k, padding rows and a pool too small to reserve every slot ahead."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

from tests.llm.serving_models import VOCAB, tiny_llama
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.spec.proposers import DraftModelProposer

BS = 4
GREEDY = SamplingParams(max_tokens=8)
SAMPLED = SamplingParams(max_tokens=8, temperature=0.8)


def _proposer(chain: bool, num_blocks: int = 64, device: str = "cpu") -> DraftModelProposer:
    """The tiny float64 Llama as a draft on the static decode path (on CUDA: torch attention, graphs)."""
    ex = TorchExecutor(
        copy.deepcopy(tiny_llama()),
        num_blocks=num_blocks,
        block_size=BS,
        device=device,
        static_decode=True,
        max_decode_batch=64,  # (a catch-up folds where its padded rows, 8 x q_len, fit the largest bucket)
    )
    return DraftModelProposer(ex, 4, chain=chain)


def _seqs(lengths: list[int], sampled: set[int]) -> list[SimpleNamespace]:
    rng = np.random.default_rng(7)
    return [
        SimpleNamespace(
            request_id=f"r{i}",
            tokens=rng.integers(3, VOCAB, size=n).tolist(),
            params=SAMPLED if i in sampled else GREEDY,
            generator=np.random.default_rng(100 + i),
        )
        for i, n in enumerate(lengths)
    ]


def _advance(seqs, proposals, rng) -> int:
    """Each sequence takes a random number of its proposals (a partial acceptance) and one token more;
    returns how many took all theirs (their next catch-up runs 2 tokens)."""
    full = 0
    for seq, p in zip(seqs, proposals):
        take = int(rng.integers(0, len(p.tokens) + 1))
        seq.tokens += [*p.tokens[:take], int(rng.integers(3, VOCAB))]
        full += bool(p.tokens) and take == len(p.tokens)
    return full


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "cuda-graphs"]
)
@pytest.mark.parametrize("sampled", [set(), {1, 3}], ids=["greedy", "mixed"])
def test_chained_proposals_equal_step_by_step_ones(sampled, device):
    """On CUDA each chained step replays the captured (8, width, 1) decode graph. The step-by-step
    proposer also runs its catch-up steps as before (logits of each run's last token only: a run of 2
    after a fully accepted proposal goes the prompt-chunk path), checking the chained proposer's
    short catch-up runs on the static path (logits of every row, the last ones picked)."""
    chained, stepwise = _proposer(True, device=device), _proposer(False, device=device)
    stepwise.short_run = 1
    lengths = [9, 1, 14, 6, 3]  # 5 rows: the batch bucket of 8 pads 3
    a, b = _seqs(lengths, sampled), _seqs(lengths, sampled)
    rng_a, rng_b = np.random.default_rng(0), np.random.default_rng(0)
    full = 0
    for ks in ([4, 4, 4, 4, 4], [4, 2, 3, 1, 4], [1, 1, 1, 1, 1], [3, 4, 0, 2, 4], [4, 4, 4, 4, 4]):
        got, want = chained.propose(a, ks), stepwise.propose(b, ks)
        assert [p.tokens for p in got] == [p.tokens for p in want]
        assert [len(p.tokens) for p in got] == list(ks)
        for g, w, seq in zip(got, want, a):
            if seq.params.greedy or not g.tokens:
                assert g.probs is None and w.probs is None
            else:
                assert g.probs.shape == (len(g.tokens), VOCAB)
                np.testing.assert_allclose(g.probs, w.probs, rtol=1e-12, atol=1e-15)
        for s in a:
            assert chained.blocks.num_tokens(s.request_id) == stepwise.blocks.num_tokens(s.request_id)
        assert chained.blocks.num_free_blocks == stepwise.blocks.num_free_blocks
        chained.blocks.check_invariants()
        full += _advance(a, got, rng_a)
        _advance(b, want, rng_b)
    assert chained.chain_steps == 3 + 3 + 0 + 3 + 3  # the longest proposal's further steps, per round
    assert stepwise.chain_steps == 0
    # rounds 2-5 fold the catch-up into the chain (round 1's runs of 9 and 14 tokens exceed q_len 8)
    assert chained.folded_catch_ups == 4 and stepwise.folded_catch_ups == 0
    assert full >= 3  # short catch-up runs happened
    if device == "cuda":  # greedy: each chain one captured graph; with sampled rows a replay per step
        assert any(nb == 8 and q_len == 1 for nb, _, q_len in chained.executor.decode_graph_buckets)
        assert (chained.executor.num_chain_graphs > 0) == (not sampled)
        if not sampled:  # a chain with a catch-up first (round 3: k 1, a catch-up alone: 0 steps)
            buckets = chained.executor.chain_graph_buckets
            assert any(q_len > 1 for *_, q_len in buckets) and any(steps == 0 for _, _, steps, _ in buckets)
    chained.forget([s.request_id for s in a])
    assert chained.blocks.num_free_blocks == chained.blocks.num_blocks


def test_a_row_without_room_ahead_proposes_one_token_and_the_pool_stays_exact():
    """A pool of 8 blocks of 4: the first two sequences take 2 + 5 blocks with their 3 slots ahead; the
    last fits its run of 3 but not 3 slots more. Its chained rows write nowhere (the scratch slot) and
    its proposal is its catch-up token; the others chain on."""
    prop = _proposer(True, num_blocks=8)
    seqs = _seqs([4, 17, 3], set())
    out = prop.propose(seqs, [4, 4, 4])
    assert [len(p.tokens) for p in out] == [4, 4, 1]
    assert prop.blocks.num_tokens("r2") == 3 and prop.blocks.num_free_blocks == 0
    prop.blocks.check_invariants()
    wide = _proposer(False, num_blocks=64)  # enough room: its first tokens are the same
    assert [
        p.tokens[: len(q.tokens)] for p, q in zip(wide.propose(_seqs([4, 17, 3], set()), [4, 4, 4]), out)
    ] == [q.tokens for q in out]
    prop.forget(["r0", "r1", "r2"])
    assert prop.blocks.num_free_blocks == prop.blocks.num_blocks


def test_without_the_static_path_the_proposer_steps_one_by_one():
    ex = TorchExecutor(copy.deepcopy(tiny_llama()), num_blocks=32, block_size=BS, static_decode=False)
    prop = DraftModelProposer(ex, 3)
    assert not ex.can_chain(1)
    out = prop.propose(_seqs([5, 8], set()), [3, 3])
    assert [len(p.tokens) for p in out] == [3, 3] and prop.chain_steps == 0


def test_chain_graphs_to_capture_up_front_are_checked():
    from trtforge.errors import UserError

    ex = _proposer(True).executor
    with pytest.raises(UserError, match="steps must lie in 1..16"):
        ex.capture_chain_graphs(0)
    with pytest.raises(UserError, match="first_q_lens must lie in 1..8"):
        ex.capture_chain_graphs(3, first_q_lens=(2, 9))
    assert ex.capture_chain_graphs(3) == 0  # no CUDA graphs on the CPU
    assert ex.capture_chain_graphs(0, first_q_lens=(1, 2)) == 0


def test_a_catch_up_folded_into_the_chain_equals_the_step_then_the_chain():
    """decode_chain with a first step (runs of 1, 3 and 2 tokens, q_len 3, padded to the batch bucket
    of 4) gives the same tokens as that step run on its own (last rows' argmax) and then the chain, and
    writes the same K/V; a first step the static path does not take is refused."""
    import torch

    from trtforge.llm.executors.base import StepBatch

    def run(folded: bool):
        prop = _proposer(True)
        ex = prop.executor
        seqs = _seqs([5, 7, 10], set())
        prop.fold = False
        prop.propose(seqs, [1, 1, 1])  # the prompts in the pool; then runs of 1, 3 and 2 tokens
        for seq, extra in zip(seqs, ([], [11, 12], [13])):
            seq.tokens += [*extra, 14]
        rids = [s.request_id for s in seqs]
        runs, starts, slots = [], [], []
        for rid, seq in zip(rids, seqs):
            start = prop.blocks.num_tokens(rid)
            run_ = seq.tokens[start:]
            got, _ = prop.blocks.append_slots(rid, [*run_, 0, 0])  # two further steps' slots ahead
            runs.append(run_), starts.append(start), slots.append(got)
        first = prop._batch(rids, runs, starts, [s[: len(r)] for s, r in zip(slots, runs)], [])
        assert ex.chain_q_len(first) == 3
        nxt = np.array([p + len(r) for p, r in zip(starts, runs)])
        positions = nxt[None, :] + np.arange(2)[:, None]
        step_slots = np.array([s[len(r) :] for s, r in zip(slots, runs)]).T
        table = prop.blocks.block_table_array(rids, max(len(prop.blocks.block_table_view(r)) for r in rids))
        if folded:
            toks = ex.decode_chain(None, positions, step_slots, positions + 1, table, first=first)
        else:
            every = ex.step(StepBatch(**{**first.__dict__, "logits_indices": np.arange(first.num_tokens)}))
            head = every.index_select(0, torch.as_tensor(first.query_start_loc[1:] - 1)).argmax(-1)
            toks = [head, *ex.decode_chain(head, positions, step_slots, positions + 1, table)]
        pools = [p.clone() for p in (*ex.k_pools, *ex.v_pools)]
        return ex, first, torch.stack(toks).tolist(), pools

    ex, first, want, want_pools = run(False)
    _, _, got, got_pools = run(True)
    assert got == want and len(got) == 3
    for g, w in zip(got_pools, want_pools):
        assert torch.equal(g, w)
    with pytest.raises(ValueError, match="first step"):
        ex.decode_chain(
            None,
            np.zeros((1, 2), dtype=np.int64),
            np.zeros((1, 2)),
            np.ones((1, 2)),
            np.zeros((2, 4), dtype=np.int32),
            first=first,
        )  # 2 rows, the first step's 3
