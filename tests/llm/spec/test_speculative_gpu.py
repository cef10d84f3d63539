"""Speculative decoding on CUDA (the H200): verification steps through the decode graphs (each sequence
padded to k+1 rows), the draft model's own executor with its decode graphs, against plain decoding on
the same device."""

from __future__ import annotations

import pytest

from tests.llm.spec.test_speculative_engine import DRAFT, TARGET, needs_models


def _run(spec, dtype, prompts, params):
    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.loader import load_causal_lm
    from trtforge.llm.sched.scheduler import SchedulerConfig
    from trtforge.llm.service import make_proposer
    from trtforge.llm.spec.config import SpeculativeConfig

    ex = TorchExecutor(load_causal_lm(str(TARGET)), num_blocks=24, device="cuda", dtype=dtype)
    proposer = None if spec is None else make_proposer(SpeculativeConfig.of(spec), ex)
    config = SchedulerConfig(max_num_seqs=4, async_scheduling=False)
    with LLMEngine(ex, config, proposer=proposer) as engine:
        completions = engine.generate(prompts, params)
        out = [c.token_ids for c in completions]
        stats, mem = engine.stats, engine.memory_stats()
    assert mem.free_blocks == mem.total_blocks
    assert [repr(c.error) for c in completions if c.error is not None] == []  # (a failed step's requests)
    return out, stats, ex


def _workload():
    from transformers import AutoTokenizer

    from trtforge.llm.sampling import SamplingParams

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    text = (TARGET.parent / "eval_stdlib.txt").read_text(encoding="utf-8")[:60_000]
    ids = tok(text)["input_ids"]
    return [ids[2000 * i : 2000 * i + 60 + 20 * i] for i in range(6)], SamplingParams(
        max_tokens=40, ignore_eos=True
    )


@pytest.mark.gpu
@needs_models
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_cuda_speculative_greedy_equals_plain_greedy(method):
    """FP32 (torch attention, graphs on): token for token; BF16 (Triton kernels, fused layers): a
    verification step's projections (cuBLAS over k+1 rows) and a decode step's (GEMV over one) round
    differently, so at most a near-tie may flip: most sequences must still match and proposals must be
    accepted."""
    import torch

    prompts, params = _workload()
    spec = {"method": method, "num_tokens": 4}
    if method == "draft":
        spec["model"] = str(DRAFT)
    plain, _, _ = _run(None, torch.float32, prompts, params)
    got, stats, ex = _run(spec, torch.float32, prompts, params)
    assert got == plain
    assert stats.spec_accepted_tokens > 0 and stats.preemptions > 0
    # the verification steps (query lengths up to 5) replayed decode graphs; prompts ran piecewise
    assert any(q_len > 1 for *_, q_len in ex.decode_graph_buckets), ex.decode_graph_buckets
    plain16, _, _ = _run(None, torch.bfloat16, prompts, params)
    got16, stats16, ex16 = _run(spec, torch.bfloat16, prompts, params)
    assert ex16.kernels == "triton"
    assert any(q_len > 1 for *_, q_len in ex16.decode_graph_buckets), ex16.decode_graph_buckets
    assert sum(a == b for a, b in zip(got16, plain16)) >= len(prompts) - 2
    assert stats16.spec_acceptance_rate > 0.2


@pytest.mark.gpu
@needs_models
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_cuda_chained_draft_proposals_match_step_by_step_ones(dtype_name):
    """The trained 3M draft on CUDA, its catch-up and further steps chained (one graph each proposal) or
    one by one, over rounds that follow the held-out text. The chain's steps read one table width, the
    stepwise ones their own, so a reduction may round a near-tie differently: FP32 (torch attention) at
    least 97% of the tokens equal (a wrong input or slot gives far fewer), BF16 (Triton kernels, fused
    layers) at least 90%."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.loader import load_causal_lm
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.spec.proposers import DraftModelProposer

    dtype = getattr(torch, dtype_name)
    prompts, _ = _workload()

    def draft() -> TorchExecutor:
        return TorchExecutor(load_causal_lm(str(DRAFT)), num_blocks=64, device="cuda", dtype=dtype)

    props = [DraftModelProposer(draft(), 4, chain=chain) for chain in (True, False)]
    texts = [p + p[:60] for p in prompts[:4]]  # each sequence continues with its own prompt's start
    runs = []
    for prop in props:
        greedy, rng = SamplingParams(), np.random.default_rng(0)  # (greedy rows draw nothing)
        seqs = [
            SimpleNamespace(request_id=i, tokens=t[:50], params=greedy, generator=rng)
            for i, t in enumerate(texts)
        ]
        got = []
        for _ in range(8):
            out = prop.propose(seqs, [4] * len(seqs))
            for seq, text, p in zip(seqs, texts, out):
                got.extend(p.tokens)
                n = len(seq.tokens)
                take = next((j for j, t in enumerate(p.tokens) if t != text[n + j]), len(p.tokens))
                seq.tokens = text[: n + take + 1]  # the accepted proposals and the text's next token
        runs.append(got)
        assert prop.blocks.num_free_blocks < prop.blocks.num_blocks
    assert props[0].chain_steps == 8 * 3 and props[1].chain_steps == 0
    # rounds 2-8: catch-up runs of 1..5 tokens, each the first step of its chain (round 1's: 50 tokens)
    assert props[0].folded_catch_ups == 7 and props[1].folded_catch_ups == 0
    assert any(q_len > 0 for *_, q_len in props[0].executor.chain_graph_buckets)
    assert len(runs[0]) == len(runs[1]) == 8 * 4 * len(texts)
    same = sum(a == b for a, b in zip(*runs)) / len(runs[0])
    assert same >= (0.97 if dtype == torch.float32 else 0.9), same
