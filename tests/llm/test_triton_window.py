"""Sliding-window layers on trtforge's Triton kernels: decode rows and prompt chunks use the kernels' window.

Without CUDA the kernels run in Triton's CPU interpreter (tests/llm/conftest.py); with CUDA for real.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.llm.paged_metadata import mixed_batch
from trtforge.llm.executors.paged_attention import paged_attention_reference

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(ctx_lens, q_lens, seed):
    meta, k_pool, v_pool, q, d = mixed_batch(DEVICE, ctx_lens, q_lens, seed)
    return q, k_pool, v_pool, meta, d**-0.5


@pytest.mark.parametrize(
    ("ctx_lens", "q_lens"),
    [([37, 90, 1, 130], [1, 1, 1, 1]), ([37, 20, 90], [1, 20, 1]), ([70, 130, 40], [33, 1, 40])],
)
@pytest.mark.parametrize("window", [1, 24, 4096])
def test_windowed_layer_matches_the_reference(ctx_lens, q_lens, window):
    """Decode rows go through the decode kernel and prompt chunks through the chunked-prefill kernel,
    both with the window (the adapter has no torch fallback left)."""
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    q, k_pool, v_pool, meta, scale = _case(ctx_lens, q_lens, window + len(q_lens))
    want = paged_attention_reference(q.double(), k_pool.double(), v_pool.double(), meta, scale, window)
    got = TritonPagedAttention()(q, k_pool, v_pool, meta, scale, window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)
    if window == 24:  # the window matters here: the unwindowed answer differs
        full = paged_attention_reference(q.double(), k_pool.double(), v_pool.double(), meta, scale)
        assert (full - want).abs().max().item() > 1e-2
