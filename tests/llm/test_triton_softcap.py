"""Soft-capped layers (Gemma 2's attention logit soft-capping) on trtforge's Triton kernels: decode rows,
verification rows and prompt chunks all take the layer's cap, and each (geometry, window, cap) gets its
own prepared launches.

Each case runs in Triton's CPU interpreter without CUDA (tests/llm/conftest.py) and on the GPU for real
(``-m gpu``: tests/_devices.py).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests.llm.paged_metadata import mixed_metadata
from trtforge.llm.executors.paged_attention import paged_attention_reference, paged_decode_reference

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


def _case(device, ctx_lens, q_lens, seed):
    """A ragged step over randomly placed blocks; queries scaled up so that the scores pass the caps."""
    g = torch.Generator().manual_seed(seed)
    bs, hq, hkv, d, nblocks = 16, 8, 2, 32, 64
    meta, _ = mixed_metadata(device, g, bs, nblocks, ctx_lens, q_lens)
    k_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half().to(device)
    v_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half().to(device)
    q = (torch.randn(sum(q_lens), hq, d, generator=g) * 3).half().to(device)
    return q, k_pool, v_pool, meta, d**-0.5


def _reference(q, k_pool, v_pool, meta, scale, window=None, softcap=None):
    return paged_attention_reference(
        q.double(), k_pool.double(), v_pool.double(), meta, scale, window, softcap=softcap
    )


@pytest.mark.parametrize(
    ("ctx_lens", "q_lens"),
    [
        ([37, 90, 1, 130], [1, 1, 1, 1]),  # decode rows
        ([37, 20, 90], [1, 20, 4]),  # a decode row, a prompt, 4 verification rows
        ([70, 130, 40], [33, 1, 40]),  # prompt chunks over cached prefixes
    ],
)
@pytest.mark.parametrize(("cap", "window"), [(2.0, None), (5.0, 24)])
@pytest.mark.parametrize("device", DEVICES)
def test_soft_capped_layer_matches_the_reference(device, ctx_lens, q_lens, cap, window):
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    skip_unless_runs_here(device)
    q, k_pool, v_pool, meta, scale = _case(device, ctx_lens, q_lens, int(cap) + len(q_lens))
    want = _reference(q, k_pool, v_pool, meta, scale, window, cap)
    assert (want - _reference(q, k_pool, v_pool, meta, scale, window)).abs().max().item() > 0.1
    got = TritonPagedAttention()(q, k_pool, v_pool, meta, scale, window, softcap=cap)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_layers_with_and_without_a_cap_get_their_own_prepared_launches(device):
    """Two layers of one geometry, one soft-capped: the step's prepared launches are keyed by the cap too,
    so neither reuses the other's (the capped layer would run uncapped, or the reverse)."""
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    skip_unless_runs_here(device)
    q, k_pool, v_pool, meta, scale = _case(device, [40, 70, 25], [1, 30, 3], 3)
    attention = TritonPagedAttention()
    for cap in (None, 2.0, None, 2.0):
        got = attention(q, k_pool, v_pool, meta, scale, softcap=cap)
        torch.testing.assert_close(
            got.double(), _reference(q, k_pool, v_pool, meta, scale, None, cap), atol=3e-3, rtol=3e-3
        )
    assert len(attention.plan_of(meta, q.device).launches) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_static_decode_path_takes_the_cap(device):
    """The CUDA-graph decode body calls the decode function with the layer's cap: one query a row, and
    verification rows (q_len 3), against the decode reference."""
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(8)
    bs, hq, hkv, d, nblocks, cap = 16, 8, 2, 32, 32, 2.0
    k_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half().to(device)
    v_pool = torch.randn(nblocks, bs, hkv, d, generator=g).half().to(device)
    tables = torch.randperm(nblocks, generator=g)[:12].view(3, 4).to(torch.int32).to(device)
    lens = torch.tensor([50, 7, 64], dtype=torch.int32, device=device)
    for q_len in (1, 3):
        q = (torch.randn(3 * q_len, hq, d, generator=g) * 3).half().to(device)
        got = TritonDecodeAttention()(q, k_pool, v_pool, tables, lens, d**-0.5, q_len=q_len, softcap=cap)
        want = paged_decode_reference(
            q.double(), k_pool.double(), v_pool.double(), tables, lens, d**-0.5, q_len=q_len, softcap=cap
        )
        free = paged_decode_reference(
            q.double(), k_pool.double(), v_pool.double(), tables, lens, d**-0.5, q_len=q_len
        )
        assert (want - free).abs().max().item() > 0.1
        torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)


@pytest.mark.gpu
def test_soft_capped_long_chunks_stay_off_the_hopper_kernel(monkeypatch):
    """On sm_90, long prompt chunks of an uncapped layer run the Hopper flash-attention kernel, which has
    no cap: those of a soft-capped layer in the same step stay on the varlen kernel (with the cap), and
    both layers match the reference."""
    from trtforge.kernels import chunked_prefill
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper chunk path is planned on sm_90 GPUs only")
    hopper_launches = []
    real = chunked_prefill.prepare_chunked_prefill_hopper

    def counting(*args, **kwargs):
        hopper_launches.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(chunked_prefill, "prepare_chunked_prefill_hopper", counting)
    g = torch.Generator().manual_seed(6)
    bs, hq, hkv, d = 16, 16, 8, 128
    ctx_lens, q_lens = [700, 40, 400], [1, 1, 300]
    nblocks = sum(-(-c // bs) for c in ctx_lens) + 4
    meta, _ = mixed_metadata("cuda", g, bs, nblocks, ctx_lens, q_lens)
    k_pool = torch.randn(nblocks, bs, hkv, d, generator=g).bfloat16().cuda()
    v_pool = torch.randn(nblocks, bs, hkv, d, generator=g).bfloat16().cuda()
    q = (torch.randn(sum(q_lens), hq, d, generator=g) * 3).bfloat16().cuda()
    attention = TritonPagedAttention()
    assert attention.plan_of(meta, q.device).long_chunks is not None
    for cap, launches in ((None, 1), (2.0, 1)):
        got = attention(q, k_pool, v_pool, meta, d**-0.5, softcap=cap)
        torch.cuda.synchronize()
        assert len(hopper_launches) == launches, cap
        want = _reference(q, k_pool, v_pool, meta, d**-0.5, None, cap)
        torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
