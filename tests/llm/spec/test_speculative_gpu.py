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
        out = [c.token_ids for c in engine.generate(prompts, params)]
        stats, mem = engine.stats, engine.memory_stats()
    assert mem.free_blocks == mem.total_blocks
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
