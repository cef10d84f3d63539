"""Verification rows (2..8 new tokens of a sequence) through the split-KV decode kernel: the same
attention as the reference, beside decode rows and prompt chunks of the same step. On CUDA (``-m gpu``)
the kernels run for real; elsewhere in Triton's CPU interpreter (tests/llm/conftest.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests.llm.paged_metadata import mixed_batch
from trtforge.llm.executors.paged_attention import paged_attention_reference

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

LAYOUTS = {
    # one verifying sequence alone (single-stream speculation): its rows are one slice
    "single": ([200], [5]),
    # verifying sequences of two query lengths, between decodes and a prompt chunk: gathered rows
    "mixed": ([37, 130, 20, 90, 64, 40], [1, 5, 1, 5, 3, 12]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("window", [None, 24])
def test_verification_rows_run_the_decode_kernel_and_match_the_reference(device, layout, window):
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    skip_unless_runs_here(device)
    q_lens = LAYOUTS[layout][1]
    meta, k_pool, v_pool, q, d = mixed_batch(device, *LAYOUTS[layout], 3)
    out = torch.full_like(q, float("nan"))
    attention = TritonPagedAttention()
    got = attention(q, k_pool, v_pool, meta, d**-0.5, window, out=out)
    want = paged_attention_reference(q.double(), k_pool.double(), v_pool.double(), meta, d**-0.5, window)
    torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)
    plan = attention.plan_of(meta, q.device)
    lengths = sorted(s for s, *_ in plan.short)
    assert lengths == sorted({n for n in q_lens if 1 < n <= 8})
    assert (plan.chunks is not None) == any(n > 8 for n in q_lens)
    rows_of_5 = {s: where for s, where, *_ in plan.short}[5]
    assert isinstance(rows_of_5, slice) == (layout == "single")  # "mixed": two non-adjacent sequences
