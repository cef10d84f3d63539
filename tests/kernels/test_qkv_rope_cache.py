"""One token's norm + QKV GEMV with RoPE and the K/V write as its epilogue (norm_qkv_rope_cache)
against the two kernels it replaces (norm_gemv, then rope_and_cache), on 16-bit and FP8 weights, 16-bit
and FP8 pools of any strides. In Triton's CPU interpreter without CUDA, for real on a GPU (``-m gpu``)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


def _case(device, dtype, hq, hkv, d, k, seed, bias):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, k, generator=g) * 2).to(dtype).to(device)
    nw = (torch.rand(k, generator=g) + 0.5).to(dtype).to(device)
    rows = (hq + 2 * hkv) * d
    w = (torch.randn(rows, k, generator=g) / k**0.5).to(dtype).to(device)
    b = (torch.randn(rows, generator=g) * 0.1).to(dtype).to(device) if bias else None
    angles = torch.rand(1, d // 2, generator=g) * 6
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype).to(device)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype).to(device)
    return x, nw, w, b, cos, sin


def _pools(device, dtype, nblocks, bs, hkv, d, heads_major):
    shape = (nblocks, hkv, bs, d) if heads_major else (nblocks, bs, hkv, d)
    fill = float("nan") if dtype != torch.float8_e4m3fn else 0.0
    pools = [torch.full(shape, fill, dtype=torch.float32, device=device).to(dtype) for _ in range(2)]
    return [p.transpose(1, 2) if heads_major else p for p in pools]  # [nb, bs, Hkv, D] views


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("wkind", "dtype", "pool", "bias", "heads_major"),
    [
        ("16", torch.float16, "16", False, False),
        ("16", torch.bfloat16, "16", True, True),
        ("fp8", torch.bfloat16, "16", False, False),
        ("fp8", torch.bfloat16, "fp8", True, True),
        ("16", torch.float16, "fp8", False, False),
    ],
)
@pytest.mark.parametrize("defer", [True, False])
def test_fused_qkv_rope_cache_equals_the_two_kernels(device, wkind, dtype, pool, bias, heads_major, defer,
                                                     monkeypatch):  # fmt: skip
    """q, the written keys and values, and every untouched slot agree with norm_gemv + rope_and_cache
    (to the FP32 sums' order: one 16-bit ulp), with the norm deferred or not, biases, GQA heads, K not a
    multiple of the chunk, FP8 pools with their scales, and pools laid out heads-major."""
    from trtforge.kernels import gemv
    from trtforge.kernels.fused_layer import norm_qkv_rope_cache, rope_and_cache
    from trtforge.kernels.qweight import quantize_fp8

    skip_unless_runs_here(device)
    monkeypatch.setattr(gemv, "DEFER_NORM", defer)
    hq, hkv, d, k, bs, nblocks = 6, 2, 32, 200, 4, 5
    x, nw, w, b, cos, sin = _case(device, dtype, hq, hkv, d, k, seed=7, bias=bias)
    weight = quantize_fp8(w.float()) if wkind == "fp8" else w
    pdt = torch.float8_e4m3fn if pool == "fp8" else dtype
    scales = (0.05, 0.03) if pool == "fp8" else (1.0, 1.0)
    slots = torch.tensor([13], dtype=torch.int32, device=device)
    want_k, want_v = _pools(device, pdt, nblocks, bs, hkv, d, heads_major)
    got_k, got_v = _pools(device, pdt, nblocks, bs, hkv, d, heads_major)
    qkv = gemv.norm_gemv(x, nw, 1e-5, weight, b)
    want_q = rope_and_cache(qkv, cos, sin, slots, want_k, want_v, hq, hkv, *scales)
    got_q = norm_qkv_rope_cache(x, nw, 1e-5, weight, b, cos, sin, slots, got_k, got_v, hq, hkv, *scales)
    assert got_q.shape == (1, hq, d) and got_q.dtype == dtype
    torch.testing.assert_close(got_q.float(), want_q.float(), atol=1e-2, rtol=1e-2)
    s = 13
    for got, want in ((got_k, want_k), (got_v, want_v)):
        g_rows = torch.stack([got[i // bs, i % bs] for i in range(nblocks * bs)]).float()
        w_rows = torch.stack([want[i // bs, i % bs] for i in range(nblocks * bs)]).float()
        tol = 0.07 if pool == "fp8" else 1e-2  # an FP8 code apart at most
        torch.testing.assert_close(g_rows[s], w_rows[s], atol=tol, rtol=tol)
        assert g_rows[s].isfinite().all() and (g_rows[s] != 0).any(), "the slot was not written"
        rest = torch.cat([g_rows[:s], g_rows[s + 1 :]])
        want_rest = torch.cat([w_rows[:s], w_rows[s + 1 :]])
        assert torch.equal(rest.isnan(), want_rest.isnan()) and torch.equal(
            rest.nan_to_num(), want_rest.nan_to_num()
        ), "wrote outside the slot"


@pytest.mark.parametrize("device", DEVICES)
def test_fused_qkv_rope_cache_takes_only_what_it_computes(device):
    """A partial rotary, two tokens, INT4 weights or a row count other than (Hq + 2 Hkv) * D are not
    fusable (the executor falls back to the two kernels) and a direct call names what it got; a q
    buffer of the wrong layout is refused by name."""
    from trtforge.kernels.fused_layer import norm_qkv_rope_cache, qkv_rope_fusable
    from trtforge.kernels.qweight import quantize_int4

    skip_unless_runs_here(device)
    hq, hkv, d, k = 4, 2, 16, 64
    x, nw, w, _b, cos, sin = _case(device, torch.float16, hq, hkv, d, k, seed=1, bias=False)
    k_pool, v_pool = _pools(device, torch.float16, 2, 4, hkv, d, False)
    slots = torch.tensor([3], dtype=torch.int32, device=device)
    assert qkv_rope_fusable(x, w, None, cos, k_pool, hq, hkv)
    assert not qkv_rope_fusable(x, w, None, cos[:, : d // 2], k_pool, hq, hkv)  # partial rotary
    assert not qkv_rope_fusable(torch.cat([x, x]), w, None, cos, k_pool, hq, hkv)
    assert not qkv_rope_fusable(x, w[:-d], None, cos, k_pool, hq, hkv)
    assert not qkv_rope_fusable(x, quantize_int4(w.float().cpu(), 64), None, cos, k_pool, hq, hkv)
    with pytest.raises(ValueError, match=r"norm_qkv_rope_cache takes one token.*rotary width 8"):
        norm_qkv_rope_cache(x, nw, 1e-5, w, None, cos[:, :8], sin[:, :8], slots, k_pool, v_pool, hq, hkv)
    bad = torch.empty(1, d, hq, dtype=torch.float16, device=device).transpose(1, 2)
    with pytest.raises(ValueError, match="norm_qkv_rope_cache: out must be"):
        norm_qkv_rope_cache(x, nw, 1e-5, w, None, cos, sin, slots, k_pool, v_pool, hq, hkv, out=bad)
