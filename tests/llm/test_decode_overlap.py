"""Decode steps as two overlapping halves (trtforge.llm.executors.decode_overlap): the same logits as the
plain step, on the CPU (one stream, the same order) and in CUDA graphs on the GPU."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.llm.serving_models import run_to_completion, tiny_llama
from trtforge.llm.engine import make_step_loop
from trtforge.llm.executors import decode_overlap
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig


def _lockstep(model, monkeypatch, **executor_kwargs) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Serve a fixed batch of requests on a plain executor (a synchronous loop), recording each step's
    batch and logits; then run the same batches, in order, on an executor that splits decode steps of 2 rows
    or more, so that its pools see what the first one's did.
    Returns both executors' logits and how many steps took the overlapped path."""
    monkeypatch.setattr(decode_overlap, "MIN_ROWS", 0)
    plain = TorchExecutor(model, **executor_kwargs)
    batches, want = [], []
    step = plain.step

    def recording(batch):
        batches.append(copy.deepcopy(batch))
        out = step(batch)
        want.append(out.detach().to("cpu", torch.float64).clone())
        return out

    plain.step = recording
    config = SchedulerConfig(
        max_num_seqs=16, max_num_batched_tokens=64, max_prefill_chunk=16, async_scheduling=False
    )
    loop = make_step_loop(plain, config)
    rng = np.random.default_rng(3)
    for i in range(13):
        prompt = rng.integers(3, 300, size=int(rng.integers(2, 40))).tolist()
        loop.add_request(i, prompt, SamplingParams(max_tokens=int(rng.integers(4, 14)), ignore_eos=True))
    run_to_completion(loop)
    del plain, loop

    monkeypatch.setattr(decode_overlap, "MIN_ROWS", 2)
    calls = []
    real = decode_overlap.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(decode_overlap, "forward", counted)
    split = TorchExecutor(model, **executor_kwargs)
    got = [split.step(b).detach().to("cpu", torch.float64).clone() for b in batches]
    return want, got, len(calls)


def test_overlapped_decode_steps_give_the_plain_steps_logits_on_the_cpu(monkeypatch):
    kwargs = {"num_blocks": 128, "block_size": 4, "max_decode_batch": 16, "static_decode": True}
    want, got, split = _lockstep(tiny_llama(), monkeypatch, **kwargs)
    assert split > 0, "no decode step took the overlapped path"
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_rows_of_slices_per_token_inputs_and_refuses_other_forms():
    cos, sin = torch.arange(12.0).view(6, 2), torch.arange(6.0).view(6, 1, 1)
    got = decode_overlap.rows_of((cos, sin), 2, 5, 6)
    assert isinstance(got, tuple) and torch.equal(got[0], cos[2:5]) and torch.equal(got[1], sin[2:5])
    assert decode_overlap.rows_of(None, 0, 3, 6) is None
    with pytest.raises(decode_overlap.Unsplittable, match="int"):
        decode_overlap.rows_of(7, 0, 3, 6)
    with pytest.raises(decode_overlap.Unsplittable, match="Tensor"):
        decode_overlap.rows_of(torch.zeros(5, 2), 0, 3, 6)  # not one row a token


@pytest.mark.gpu
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_overlapped_steps_give_the_plain_steps_logits_on_cuda(monkeypatch, kv_cache_dtype):
    """Fused layers and the Triton attention on two streams: decode steps in CUDA graphs (13 rows, bucket
    16: halves of 8), the plain steps' logits within float16 rounding (a half's GEMMs may tile
    differently from the whole batch's)."""
    model = copy.deepcopy(tiny_llama()).to(device="cuda", dtype=torch.float16)
    kwargs = {"num_blocks": 256, "block_size": 16, "max_decode_batch": 16, "kv_cache_dtype": kv_cache_dtype}
    want, got, split = _lockstep(model, monkeypatch, **kwargs)
    assert split > 0, "no decode step took the overlapped path"
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
