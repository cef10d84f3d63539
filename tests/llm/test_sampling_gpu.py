"""The batched sampler's penalties, bitmask, min_p and logprobs on CUDA logits equal the CPU's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtforge.llm.penalties import RowHistory
from trtforge.llm.sampling import SamplingParams, sample_async, sample_with_logprobs


@pytest.mark.gpu
def test_cuda_sampling_with_every_option_matches_the_cpu():
    rng = np.random.default_rng(0)
    vocab = 32000
    x = torch.from_numpy(rng.normal(size=(6, vocab)).astype(np.float32) * 3)
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.8, seed=1, min_p=0.05, logprobs=5),
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, logprobs=0),
        SamplingParams(temperature=1.1, top_k=50, top_p=0.9, seed=2, presence_penalty=1.0),
        SamplingParams(temperature=1.0, seed=3, logprobs=2),
        SamplingParams(temperature=0.5, seed=4, min_p=0.2),
    ]
    hist = [
        RowHistory(rng.integers(0, vocab, 50).tolist(), rng.integers(0, vocab, 30).tolist()) for _ in params
    ]
    mask = np.full((6, vocab // 32), -1, dtype=np.int32)
    mask[4, : vocab // 64] = 0  # row 4 may not use the first half of the vocabulary
    cpu_x = x
    for _ in range(5):
        want, want_lp = sample_with_logprobs(cpu_x, params, [p.make_generator(0) for p in params], hist, mask)
        got = sample_async(x.cuda(), params, [p.make_generator(0) for p in params], hist, mask)
        assert got.result().tolist() == want.tolist()
        assert want[4] >= vocab // 2
        for a, b in zip(got.logprobs, want_lp):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.token_id == b.token_id and a.rank == b.rank
                assert [t for t, _ in a.top] == [t for t, _ in b.top]
                assert a.logprob == pytest.approx(b.logprob, abs=1e-5)


@pytest.mark.gpu
def test_an_executors_argmax_picks_the_greedy_rows_on_cuda(monkeypatch):
    """The loops hand the executor's argmax to the sampler: the torch executor's split kernel
    (kernels.argmax, FAST_ARGMAX on) picks what the CPU picks for greedy rows at a 128,256 vocabulary,
    and the sampled rows still draw as on the CPU."""
    from trtforge.kernels import argmax as am
    from trtforge.llm.executors.torch_exec import TorchExecutor

    monkeypatch.setattr(am, "FAST_ARGMAX", True)
    calls = []
    monkeypatch.setattr(am, "_argmax_final", _counting(am._argmax_final, calls))
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(3, 128256)).astype(np.float32))
    x[1, 77777] = x[1, 1234] = 50.0  # a tie: the first index
    params = [SamplingParams(), SamplingParams(), SamplingParams(temperature=0.7, seed=5)]
    want, _ = sample_with_logprobs(x, params, [p.make_generator(0) for p in params])
    argmax = TorchExecutor.argmax.__get__(object())  # (the method reads nothing of its executor)
    got = sample_async(x.cuda(), params, [p.make_generator(0) for p in params], argmax=argmax)
    assert got.result().tolist() == want.tolist() and want[1] == 1234
    assert calls, "the split argmax did not run"


class _counting:
    """A Triton kernel stand-in that records each launch and forwards it."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        self.calls.append(grid)
        return self.kernel[grid]
