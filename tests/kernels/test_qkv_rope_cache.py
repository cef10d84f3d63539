"""One token's norm + QKV GEMV with RoPE and the K/V write as its epilogue (norm_qkv_rope_cache), over
q/k weight rows in pair order (pair_rows), against the two kernels it replaces (norm_gemv, then
rope_and_cache) over the natural rows, on 16-bit and FP8 weights, 16-bit and FP8 pools of any strides;
and rope_and_cache reading a pair-ordered qkv (the prefill of permuted weights). In Triton's CPU
interpreter without CUDA, for real on a GPU (``-m gpu``)."""

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


def _in_pair_order(weight, bias, hq, hkv, d):
    """The weight (FP8: codes and per-row scales) and bias with their rows in pair_rows order."""
    from trtforge.kernels.fused_layer import pair_rows
    from trtforge.kernels.qweight import Fp8Weight

    perm = pair_rows(hq, hkv, d, weight.data.device if isinstance(weight, Fp8Weight) else weight.device)
    rows = Fp8Weight(weight.data[perm], weight.scale[perm]) if isinstance(weight, Fp8Weight) else weight[perm]
    return rows, None if bias is None else bias[perm]


def _assert_slot_written(got_pool, want_pool, nblocks, bs, s, tol):
    """Slot s of `got_pool` equals `want_pool`'s, and every other slot is untouched (as in `want_pool`)."""
    g_rows = torch.stack([got_pool[i // bs, i % bs] for i in range(nblocks * bs)]).float()
    w_rows = torch.stack([want_pool[i // bs, i % bs] for i in range(nblocks * bs)]).float()
    torch.testing.assert_close(g_rows[s], w_rows[s], atol=tol, rtol=tol)
    assert g_rows[s].isfinite().all() and (g_rows[s] != 0).any(), "the slot was not written"
    rest = torch.cat([g_rows[:s], g_rows[s + 1 :]])
    want_rest = torch.cat([w_rows[:s], w_rows[s + 1 :]])
    assert torch.equal(rest.isnan(), want_rest.isnan()) and torch.equal(
        rest.nan_to_num(), want_rest.nan_to_num()
    ), "wrote outside the slot"


def test_pair_rows_puts_each_rotation_pair_in_adjacent_rows():
    """Per q and k head h: channel j at row h * D + 2 j, channel D / 2 + j at h * D + 2 j + 1; v as is."""
    from trtforge.kernels.fused_layer import pair_rows

    hq, hkv, d = 2, 1, 8
    perm = pair_rows(hq, hkv, d)
    assert sorted(perm.tolist()) == list(range((hq + 2 * hkv) * d))
    assert perm[:8].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert perm[16:24].tolist() == [16, 20, 17, 21, 18, 22, 19, 23]  # the k head
    assert perm[24:].tolist() == list(range(24, 32))  # v unchanged


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
@pytest.mark.parametrize(
    ("defer", "num_sms"), [(True, 1), (False, 1), (True, 132)], ids=["defer", "prologue", "defer-sms132"]
)
def test_fused_qkv_rope_cache_equals_the_two_kernels(device, wkind, dtype, pool, bias, heads_major, defer,
                                                     num_sms, monkeypatch):  # fmt: skip
    """q, the written keys and values, and every untouched slot agree with norm_gemv + rope_and_cache
    over the natural rows (to the FP32 sums' order: one 16-bit ulp), with the norm deferred or not,
    biases, GQA heads, K not a multiple of the chunk, FP8 weights (per-row scales permuted with their
    rows), FP8 pools with their scales, pools laid out heads-major; at the launch shapes of 1 SM (4 or 8
    rows a program, FP8's reducing loop) and of an H100's 132 (2 rows a program: one pair)."""
    from trtforge.kernels import gemv
    from trtforge.kernels.fused_layer import norm_qkv_rope_cache, rope_and_cache
    from trtforge.kernels.qweight import quantize_fp8

    skip_unless_runs_here(device)
    monkeypatch.setattr(gemv, "DEFER_NORM", defer)
    if device == "cpu":
        monkeypatch.setattr(gemv, "_num_sms", lambda _device: num_sms)
    hq, hkv, d, k, bs, nblocks = 6, 2, 32, 200, 4, 5
    x, nw, w, b, cos, sin = _case(device, dtype, hq, hkv, d, k, seed=7, bias=bias)
    weight = quantize_fp8(w.float()) if wkind == "fp8" else w
    paired_w, paired_b = _in_pair_order(weight, b, hq, hkv, d)
    pdt = torch.float8_e4m3fn if pool == "fp8" else dtype
    scales = (0.05, 0.03) if pool == "fp8" else (1.0, 1.0)
    slots = torch.tensor([13], dtype=torch.int32, device=device)
    want_k, want_v = _pools(device, pdt, nblocks, bs, hkv, d, heads_major)
    got_k, got_v = _pools(device, pdt, nblocks, bs, hkv, d, heads_major)
    qkv = gemv.norm_gemv(x, nw, 1e-5, weight, b)
    want_q = rope_and_cache(qkv, cos, sin, slots, want_k, want_v, hq, hkv, *scales)
    got_q = norm_qkv_rope_cache(
        x, nw, 1e-5, paired_w, paired_b, cos, sin, slots, got_k, got_v, hq, hkv, *scales
    )
    assert got_q.shape == (1, hq, d) and got_q.dtype == dtype
    torch.testing.assert_close(got_q.float(), want_q.float(), atol=1e-2, rtol=1e-2)
    tol = 0.07 if pool == "fp8" else 1e-2  # an FP8 code apart at most
    for got, want in ((got_k, want_k), (got_v, want_v)):
        _assert_slot_written(got, want, nblocks, bs, 13, tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool", ["16", "fp8"])
def test_rope_and_cache_reads_pair_ordered_q_and_k(device, pool):
    """rope_and_cache(pairs=True) over a pair-ordered qkv of three tokens (the prefill of permuted
    weights) returns q and writes the pools exactly as over the natural qkv; a partial rotary is refused."""
    from trtforge.kernels.fused_layer import pair_rows, rope_and_cache

    skip_unless_runs_here(device)
    hq, hkv, d, bs, nblocks, t = 4, 2, 16, 4, 3, 3
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).bfloat16().to(device)
    angles = torch.rand(t, d // 2, generator=g) * 6
    cos = torch.cat([angles.cos()] * 2, -1).bfloat16().to(device)
    sin = torch.cat([angles.sin()] * 2, -1).bfloat16().to(device)
    slots = torch.tensor([1, 6, 10], dtype=torch.int32, device=device)
    pdt = torch.float8_e4m3fn if pool == "fp8" else torch.bfloat16
    scales = (0.05, 0.03) if pool == "fp8" else (1.0, 1.0)
    want_k, want_v = _pools(device, pdt, nblocks, bs, hkv, d, False)
    got_k, got_v = _pools(device, pdt, nblocks, bs, hkv, d, False)
    want_q = rope_and_cache(qkv, cos, sin, slots, want_k, want_v, hq, hkv, *scales)
    paired = qkv[:, pair_rows(hq, hkv, d, qkv.device)].contiguous()
    got_q = rope_and_cache(paired, cos, sin, slots, got_k, got_v, hq, hkv, *scales, pairs=True)
    assert torch.equal(got_q, want_q)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert torch.equal(got.float().nan_to_num(), want.float().nan_to_num())
        assert torch.equal(got.float().isnan(), want.float().isnan())
    with pytest.raises(ValueError, match="pair order need a rotary over whole heads"):
        rope_and_cache(paired, cos[:, :8], sin[:, :8], slots, got_k, got_v, hq, hkv, pairs=True)


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
