"""logit_bias on CUDA: the executor's split argmax and the CUDA-graph decode path (both loops) take the
biased argmax, and speculation leaves biased rows to plain decoding, as on the CPU."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.llm.serving_models import tiny_llama
from tests.llm.test_logit_bias import PROMPTS, _reference_greedy
from trtforge.llm.sampling import SamplingParams, sample_async, sample_with_logprobs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_split_argmax_picks_the_biased_greedy_rows_on_cuda(monkeypatch, dtype):
    """At a 128,256 vocabulary the loops' argmax is kernels.argmax's split kernel: it must read the
    biased logits (a banned maximum, a forced id), leave the unbiased rows as the CPU picks them, and
    sampled rows must draw as on the CPU."""
    from trtforge.kernels import argmax as am
    from trtforge.llm.executors.torch_exec import TorchExecutor

    monkeypatch.setattr(am, "FAST_ARGMAX", True)
    calls = []
    final = am._argmax_final

    class Counting:
        def __getitem__(self, grid):
            calls.append(grid)
            return final[grid]

    monkeypatch.setattr(am, "_argmax_final", Counting())
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(size=(4, 128256)).astype(np.float32) * 3).to(dtype)
    top = x.float().argmax(-1).tolist()
    params = [
        SamplingParams(),
        SamplingParams(logit_bias={top[1]: -100}, logprobs=1),
        SamplingParams(logit_bias={99999: 100}),
        SamplingParams(temperature=0.8, seed=5, logit_bias={top[3]: -100}),
    ]
    want, _ = sample_with_logprobs(x, params, [p.make_generator(0) for p in params])
    argmax = TorchExecutor.argmax.__get__(object())  # (the method reads nothing of its executor)
    got = sample_async(x.cuda(), params, [p.make_generator(0) for p in params], argmax=argmax)
    assert got.result().tolist() == want.tolist()
    assert want[0] == top[0] and want[1] != top[1] and want[2] == 99999 and want[3] != top[3]
    assert got.logprobs[1].rank == 1 and got.logprobs[1].token_id == want[1]
    assert calls, "the split argmax did not run"


@pytest.mark.gpu
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_cuda_graph_decode_takes_the_biased_argmax(async_scheduling):
    """Greedy rows with and without a bias in the same graph-replayed decode steps (float64, so the
    CPU reference's argmax is exact): each matches the per-token reference of its own bias."""
    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sched.scheduler import SchedulerConfig

    plain = _reference_greedy(PROMPTS[0], {}, 8)
    biases = [{}, {plain[0]: -100.0, plain[1]: -100.0}, {123: 100.0}, {plain[2]: -4.0, 200: 3.0}]
    model = copy.deepcopy(tiny_llama()).to("cuda")
    ex = TorchExecutor(model, num_blocks=64, block_size=16, static_decode=True, max_decode_batch=8)
    config = SchedulerConfig(max_num_seqs=8, async_scheduling=async_scheduling)
    params = [SamplingParams(max_tokens=8, ignore_eos=True, logit_bias=b) for b in biases]
    with LLMEngine(ex, config) as engine:
        got = [list(c.token_ids) for c in engine.generate([PROMPTS[0]] * 4, params)]
    assert ex.num_cuda_graphs > 0, "no decode step replayed a CUDA graph"
    assert got == [_reference_greedy(PROMPTS[0], b, 8) for b in biases]
    assert got[0] == plain and got[2] == [123] * 8 and not {plain[0], plain[1]} & set(got[1])


@pytest.mark.gpu
def test_cuda_speculation_leaves_biased_rows_to_plain_decoding():
    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sched.scheduler import SchedulerConfig
    from trtforge.llm.service import make_proposer
    from trtforge.llm.spec.config import SpeculativeConfig

    prompt = [5, 6, 7, 8, 9] * 8
    plain = _reference_greedy(prompt, {}, 12)
    banned = {plain[0]: -100.0, plain[1]: -100.0}
    ex = TorchExecutor(copy.deepcopy(tiny_llama()).to("cuda"), num_blocks=64, block_size=16)
    proposer = make_proposer(SpeculativeConfig.of({"method": "ngram", "num_tokens": 4}), ex)
    params = [SamplingParams(max_tokens=12, ignore_eos=True, logit_bias=b) for b in ({}, banned)]
    with LLMEngine(ex, SchedulerConfig(max_num_seqs=4, async_scheduling=False), proposer=proposer) as eng:
        got = [list(c.token_ids) for c in eng.generate([prompt, prompt], params)]
        assert eng.stats.spec_draft_tokens > 0
    assert got == [plain, _reference_greedy(prompt, banned, 12)]
