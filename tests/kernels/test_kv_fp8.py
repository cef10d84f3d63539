"""FP8 (E4M3) KV cache in the kernels: the cache writes quantize, decode and chunked prefill read FP8.

Without CUDA they run in Triton's CPU interpreter (tests/kernels/conftest.py, whose FP8 conversions
are torch's round-to-nearest-even casts); on a GPU (``-m gpu``) the same checks run for real.
Tolerances:
- writes: bit-exact against :func:`~trtforge.kernels.kv_quant.quantize_fp8` (same float32 product,
  same rounding);
- attention over FP8 pools against the FP32 SDPA reference over the *same dequantized values*: the
  tolerances of the 16-bit kernels' own tests (TOL: p is rounded to the query's type before P.V;
  widening FP8 to FP16/BF16 is exact);
- against attention over the unquantized 16-bit K/V: the quantization error. E4M3 keeps 3 mantissa
  bits (a relative rounding error of at most 2^-4 an element); for N(0, 1) K/V at D 32-64 over 5-70
  keys the outputs (magnitude ~1) moved by up to 0.115 (measured, interpreter), the most over the
  shortest contexts (least averaging); QUANT_TOL = 0.2.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernel (pip install triton)")

from tests._devices import DEVICES, skip_unless_runs_here  # noqa: E402
from tests.kernels.decode_reference import paged_from_contiguous, reference_decode  # noqa: E402
from trtforge.kernels.chunked_prefill import chunked_prefill_attention, chunked_prefill_varlen  # noqa: E402
from trtforge.kernels.decode_attention import DecodeConfig, decode_attention, prepare_paged_decode  # noqa: E402
from trtforge.kernels.fused_layer import rope_and_cache  # noqa: E402
from trtforge.kernels.kv_quant import FP8_KV_DTYPE, dequantize, quantize_fp8  # noqa: E402
from trtforge.kernels.paged_cache import write_kv_cache, write_kv_slots  # noqa: E402

TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}
QUANT_TOL = 0.2


def _device(device: str) -> str:
    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip(f"FP8 needs compute capability >= 8.9; {torch.cuda.get_device_name()} is below")
    return device


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).cpu()


def _fp8_pools(kq, vq, lens, page, seed):
    """FP8 K/V [B, Hkv, S, D] in pools of randomly placed blocks (spare blocks hold NaN: never read)."""
    kp, vp, table = paged_from_contiguous(
        kq.float(), vq.float(), lens, page, torch.Generator().manual_seed(seed)
    )
    return kp.to(FP8_KV_DTYPE), vp.to(FP8_KV_DTYPE), table


@pytest.mark.gpu
def test_gpu_cache_writes_store_no_nan_codes():
    """The GPU's FP8 cache writes saturate with min/max that return the non-NaN operand, so a NaN
    activation is stored as a bound, never as a NaN code (a kernel that reads a last page's stale slots
    and weights them by P = 0 would otherwise turn 0 * NaN into NaN outputs)."""
    skip_unless_runs_here("cuda")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 KV needs compute capability >= 8.9")
    b, hkv, s_new, d, page, blocks = 1, 2, 3, 32, 4, 2
    k = torch.full((b, hkv, s_new, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    v = k.clone()
    kp = torch.zeros(blocks, page, hkv, d, dtype=FP8_KV_DTYPE, device="cuda")
    vp = torch.zeros_like(kp)
    slots = torch.arange(s_new, dtype=torch.int32, device="cuda").view(b, s_new)
    write_kv_slots(k, v, kp, vp, slots, k_scale=0.25, v_scale=0.01)
    qkv = torch.full((s_new, (2 + 2 * hkv) * d), float("nan"), dtype=torch.bfloat16, device="cuda")
    cos = torch.ones(s_new, d, device="cuda")
    kr, vr = torch.zeros_like(kp), torch.zeros_like(vp)
    rope_and_cache(qkv, cos, torch.zeros_like(cos), slots[0], kr, vr, 2, hkv, 0.25, 0.01)
    for pool in (kp, vp, kr, vr):
        written = pool.view(-1, hkv, d)[:s_new].float()
        assert torch.isfinite(written).all() and (written.abs() == 448).all()


@pytest.mark.parametrize("device", DEVICES)
def test_slot_write_quantizes_exactly_as_the_reference(device):
    device = _device(device)
    g = torch.Generator().manual_seed(0)
    b, hkv, s_new, d, page, blocks = 2, 2, 5, 32, 4, 8
    k = (torch.randn(b, hkv, s_new, d, generator=g) * 40).to(torch.bfloat16)  # some saturate at 448
    v = torch.randn(b, hkv, s_new, d, generator=g).to(torch.bfloat16)
    k[0, 0, 0, :4] = torch.tensor([1e4, -1e4, 1e-6, 0.0])
    slots = torch.randperm(blocks * page, generator=g)[: b * s_new].view(b, s_new).to(torch.int32)
    slots[1, -1] = -1  # skipped
    kp = torch.zeros(blocks, page, hkv, d, dtype=FP8_KV_DTYPE)
    vp = torch.zeros_like(kp)
    dev = [t.to(device) for t in (k, v, kp, vp, slots)]
    write_kv_slots(*dev, k_scale=0.25, v_scale=0.01)
    want_k, want_v = torch.zeros_like(kp), torch.zeros_like(vp)
    flat_k, flat_v = want_k.view(torch.uint8).view(-1, hkv, d), want_v.view(torch.uint8).view(-1, hkv, d)
    for bi in range(b):
        for i in range(s_new):
            s = int(slots[bi, i])
            if s >= 0:
                flat_k[s] = quantize_fp8(k[bi, :, i], 0.25).view(torch.uint8)
                flat_v[s] = quantize_fp8(v[bi, :, i], 0.01).view(torch.uint8)
    assert torch.equal(_bits(dev[2]), _bits(want_k))
    assert torch.equal(_bits(dev[3]), _bits(want_v))
    assert float(dequantize(dev[2].cpu(), 0.25).abs().max()) == 448 * 0.25  # saturated, never NaN


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [0, 8])
def test_cache_write_then_decode_over_fp8(device, page):
    device = _device(device)
    g = torch.Generator().manual_seed(1)
    b, hq, hkv, d, s_max = 2, 4, 2, 32, 40
    lens = torch.tensor([40, 17], dtype=torch.int32)
    k = torch.randn(b, hkv, s_max, d, generator=g).half()
    v = torch.randn(b, hkv, s_max, d, generator=g).half()
    q = torch.randn(b, hq, 1, d, generator=g).half()
    ks, vs = 0.01, 0.02
    if page:
        table = torch.arange(b * (s_max // page), dtype=torch.int32).view(b, -1)
        kc = torch.zeros(b * s_max // page, page, hkv, d, dtype=FP8_KV_DTYPE)
    else:
        table = None
        kc = torch.zeros(b, hkv, s_max, d, dtype=FP8_KV_DTYPE)
    vc = torch.zeros_like(kc)
    on = [t.to(device) if t is not None else None for t in (q, k, v, kc, vc, lens, table)]
    q_, k_, v_, kc_, vc_, lens_, table_ = on
    write_kv_cache(k_, v_, kc_, vc_, torch.zeros_like(lens_), table_, k_scale=ks, v_scale=vs)
    got = decode_attention(
        q_, kc_, vc_, lens_, table_, config=DecodeConfig(num_splits=2), k_scale=ks, v_scale=vs
    )
    kq, vq = dequantize(quantize_fp8(k, ks), ks), dequantize(quantize_fp8(v, vs), vs)
    want = reference_decode(q, kq, vq, lens)
    assert (got.float().cpu() - want).abs().max() < TOL[torch.float16]
    exact = reference_decode(q, k, v, lens)
    assert (got.float().cpu() - exact).abs().max() < QUANT_TOL


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv", "s_q", "splits"), [(8, 2, 1, 3), (4, 4, 2, 1), (8, 1, 4, 2)])
def test_paged_decode_over_fp8_matches_the_dequantized_reference(device, dtype, hq, hkv, s_q, splits):
    device = _device(device)
    g = torch.Generator().manual_seed(2)
    b, d, s_max, page = 3, 64, 70, 16
    lens = torch.tensor([70, 33, 5], dtype=torch.int32)
    q = torch.randn(b, hq, s_q, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, s_max, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, s_max, d, generator=g).to(dtype)
    ks, vs = 4.0 / 448, 3.5 / 448
    kq, vq = quantize_fp8(k, ks), quantize_fp8(v, vs)
    kp, vp, table = _fp8_pools(kq, vq, lens, page, 7)
    args = [t.to(device) for t in (q, kp, vp, lens, table)]
    got = decode_attention(*args, config=DecodeConfig(num_splits=splits), k_scale=ks, v_scale=vs)
    want = reference_decode(q, dequantize(kq, ks), dequantize(vq, vs), lens)
    assert (got.float().cpu() - want).abs().max() < TOL[dtype]
    assert (got.float().cpu() - reference_decode(q, k, v, lens)).abs().max() < QUANT_TOL


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("block_n", "num_warps", "splits", "s_q"), [(64, 4, 2, 1), (128, 2, 1, 1), (128, 4, 3, 3)]
)
def test_fp8_v_read_as_16_bit_pairs_matches_v_read_as_bytes(
    device, monkeypatch, block_n, num_warps, splits, s_q
):
    """FP8_V_PAIRS reads V as int16 pairs of adjacent channels and runs P.V as an even-channel and an
    odd-channel product, interleaved back after the tile loop: a swapped half or a wrong interleave
    permutes the output's channels, which random V shows. Against the byte reads (the same FP16
    products) and the FP32 reference over the dequantized pools, over whole and ragged tiles (lengths
    200, 77, 5 in 16-token pages), several splits and causal verification rows."""
    from trtforge.kernels import decode_attention as da

    device = _device(device)
    g = torch.Generator().manual_seed(11)
    b, hq, hkv, d, s_max, page = 3, 8, 2, 128, 200, 16
    lens = torch.tensor([200, 77, 5], dtype=torch.int32)
    q = torch.randn(b, hq, s_q, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, s_max, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, s_max, d, generator=g).bfloat16() * torch.linspace(0.5, 2.0, d).bfloat16()
    ks, vs = 4.0 / 448, 7.0 / 448
    kq, vq = quantize_fp8(k, ks), quantize_fp8(v, vs)
    kp, vp, table = _fp8_pools(kq, vq, lens, page, 3)
    args = [t.to(device) for t in (q, kp, vp, lens, table)]
    cfg = DecodeConfig(block_n=block_n, num_warps=num_warps, num_stages=2, num_splits=splits)
    assert da.v_pairs_options(FP8_KV_DTYPE, d, da.pool_heads_major(args[2]))["V_PAIRS"]
    pairs = decode_attention(*args, config=cfg, k_scale=ks, v_scale=vs).float().cpu()
    monkeypatch.setattr(da, "FP8_V_PAIRS", False)
    nbytes = decode_attention(*args, config=cfg, k_scale=ks, v_scale=vs).float().cpu()
    want = reference_decode(q, dequantize(kq, ks), dequantize(vq, vs), lens)
    assert (nbytes - want).abs().max() < TOL[torch.bfloat16]
    assert (pairs - want).abs().max() < TOL[torch.bfloat16]
    assert (pairs - nbytes).abs().max() < 4e-3


def test_fp8_v_pairs_apply_only_where_v_reads_as_pairs(monkeypatch):
    """V is read as 16-bit pairs only over FP8 pools with FP16 products, a power-of-two head dim of 32 or
    more whose channels are contiguous and other strides even; the inline-PTX split only outside the
    interpreter."""
    from trtforge.kernels import decode_attention as da

    pool = da.pool_heads_major(torch.zeros(8, 16, 2, 128, dtype=FP8_KV_DTYPE))
    assert da.v_pairs_options(FP8_KV_DTYPE, 128, pool) == {"V_PAIRS": True, "PAIRS_ASM": False}
    assert not da.v_pairs_options(torch.bfloat16, 128, pool.view(torch.bfloat16)[..., :64])["V_PAIRS"]
    odd = da.pool_heads_major(torch.zeros(8, 16, 2, 96, dtype=FP8_KV_DTYPE))
    assert not da.v_pairs_options(FP8_KV_DTYPE, 96, odd)["V_PAIRS"]  # 96 channels: no power of two
    for d in (16, 32):  # 16: halves of 8 channels, below the MMA's N
        narrow = da.pool_heads_major(torch.zeros(8, 16, 2, d, dtype=FP8_KV_DTYPE))
        assert da.v_pairs_options(FP8_KV_DTYPE, d, narrow)["V_PAIRS"] == (d == 32)
    strided = torch.zeros(8, 2, 16, 256, dtype=FP8_KV_DTYPE)[..., ::2]
    assert not da.v_pairs_options(FP8_KV_DTYPE, 128, strided)["V_PAIRS"]  # channels 2 bytes apart
    shifted = torch.zeros(8 * 2 * 16 * 128 + 1, dtype=FP8_KV_DTYPE)[1:].view(8, 2, 16, 128)
    assert not da.v_pairs_options(FP8_KV_DTYPE, 128, shifted)["V_PAIRS"]  # an odd base address
    monkeypatch.setattr(da, "FP8_KV_F16", False)
    assert not da.v_pairs_options(FP8_KV_DTYPE, 128, pool)["V_PAIRS"]  # BF16 products
    monkeypatch.setattr(da, "FP8_KV_F16", True)
    monkeypatch.setattr(da, "FP8_V_PAIRS", False)
    assert not da.v_pairs_options(FP8_KV_DTYPE, 128, pool)["V_PAIRS"]
    opts = da._split_options(
        da.FP8_KV_DECODE_CONFIG, 4, 1, 128, 0, True, False, True, 0, False, torch.bfloat16, FP8_KV_DTYPE,
        {"V_PAIRS": True, "PAIRS_ASM": True},
    )  # fmt: skip
    assert not opts["V_PAIRS"] and not opts["PAIRS_ASM"]  # TMA tiles arrive whole, as bytes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [True, False])
def test_paged_decode_reads_pools_stored_in_other_layouts(device, fp8):
    """The kernels index pools by strides, so the same logical [blocks, slot, head, D] pool stored
    heads-major (K) or with a block's keys contiguous per channel (V, as benchmarks/probe_pool_layout.py
    times it) attends as the serving layout does."""
    device = _device(device)
    g = torch.Generator().manual_seed(5)
    b, hq, hkv, d, page = 3, 8, 2, 64, 16
    lens = torch.tensor([70, 33, 5], dtype=torch.int32)
    q = torch.randn(b, hq, 1, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, 70, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, 70, d, generator=g).bfloat16()
    ks, vs = 4.0 / 448, 3.5 / 448
    if fp8:
        kp, vp, table = _fp8_pools(quantize_fp8(k, ks), quantize_fp8(v, vs), lens, page, 3)
        scales = {"k_scale": ks, "v_scale": vs}
    else:
        kp, vp, table = paged_from_contiguous(k, v, lens, page, torch.Generator().manual_seed(3))
        scales = {}
    k_heads = kp.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    v_keys = vp.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    assert k_heads.shape == kp.shape and v_keys.shape == vp.shape and v_keys.stride(1) == 1
    q_, lens_, table_ = (t.to(device) for t in (q, lens, table))
    cfg = DecodeConfig(num_splits=2)
    want = decode_attention(q_, kp.to(device), vp.to(device), lens_, table_, config=cfg, **scales)
    got = decode_attention(q_, k_heads.to(device), v_keys.to(device), lens_, table_, config=cfg, **scales)
    assert (got.float() - want.float()).abs().max() < 1e-3
    ref = reference_decode(q, k, v, lens)
    assert (want.float().cpu() - ref).abs().max() < (QUANT_TOL if fp8 else TOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_decode_launch_takes_the_scales_per_call(device):
    """A serving step's prepared launch: the same geometry, each layer with its own pools and scales."""
    device = _device(device)
    g = torch.Generator().manual_seed(3)
    b, hq, hkv, d, page, s_max = 2, 4, 2, 32, 8, 32
    lens = torch.tensor([32, 9], dtype=torch.int32)
    q = torch.randn(b, hq, d, generator=g).half()
    outs, wants = [], []
    launch = None
    qd, out = q.to(device), torch.empty(b, hq, d, dtype=torch.float16, device=device)
    for ks, vs in ((0.01, 0.02), (0.05, 0.005)):  # two layers: the same block placement, own scales
        k = torch.randn(b, hkv, s_max, d, generator=g).half()
        v = torch.randn(b, hkv, s_max, d, generator=g).half()
        kq, vq = quantize_fp8(k, ks), quantize_fp8(v, vs)
        kp, vp, table = _fp8_pools(kq, vq, lens, page, 8)
        kp, vp = kp.to(device), vp.to(device)
        if launch is None:
            launch = prepare_paged_decode(
                qd, kp, vp, lens.to(device), table.to(device), out, config=DecodeConfig(num_splits=2)
            )
        launch(qd, kp, vp, out, d**-0.5 * ks, vs)
        outs.append(out.float().cpu())
        wants.append(reference_decode(q[:, :, None], dequantize(kq, ks), dequantize(vq, vs), lens)[:, :, 0])
    for got, want in zip(outs, wants):
        assert (got - want).abs().max() < TOL[torch.float16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True])
def test_chunked_prefill_over_fp8_matches_the_dequantized_reference(device, varlen):
    device = _device(device)
    g = torch.Generator().manual_seed(4)
    b, hq, hkv, d, page, s_q = 2, 4, 2, 32, 16, 20
    lens = torch.tensor([50, 20], dtype=torch.int32)  # a cached prefix of 30, then none
    s_max = 64
    q = torch.randn(b, hq, s_q, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, s_max, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, s_max, d, generator=g).bfloat16()
    ks, vs = 0.01, 0.01
    kq, vq = quantize_fp8(k, ks), quantize_fp8(v, vs)
    kp, vp, table = _fp8_pools(kq, vq, lens, page, 9)
    kp, vp = kp.to(device), vp.to(device)
    qd, lens_d, table_d = q.to(device), lens.to(device), table.to(device)
    if varlen:
        flat = qd.permute(0, 2, 1, 3).reshape(b * s_q, hq, d).contiguous()
        starts = torch.tensor([0, s_q], dtype=torch.int32, device=device)
        qlens = torch.tensor([s_q, s_q], dtype=torch.int32, device=device)
        out = torch.empty_like(flat)
        chunked_prefill_varlen(
            flat, kp, vp, lens_d, table_d, starts, qlens, s_q, scale=d**-0.5, out=out, k_scale=ks, v_scale=vs
        )
        got = out.view(b, s_q, hq, d).permute(0, 2, 1, 3)
    else:
        got = chunked_prefill_attention(qd, kp, vp, lens_d, table_d, k_scale=ks, v_scale=vs)
    want = reference_decode(q, dequantize(kq, ks), dequantize(vq, vs), lens)
    assert (got.float().cpu() - want).abs().max() < TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
def test_rope_and_cache_writes_fp8_as_the_16_bit_write_then_quantize(device):
    device = _device(device)
    g = torch.Generator().manual_seed(5)
    t, hq, hkv, d, page, blocks = 6, 4, 2, 32, 4, 4
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 3).bfloat16().to(device)
    ang = torch.rand(t, d // 2, generator=g) * 6
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(device)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(device)
    slots = torch.randperm(blocks * page, generator=g)[:t].to(torch.int32).to(device)
    k16 = torch.zeros(blocks, page, hkv, d, dtype=torch.bfloat16, device=device)
    v16 = torch.zeros_like(k16)
    q16 = rope_and_cache(qkv, cos, sin, slots, k16, v16, hq, hkv)
    k8 = torch.zeros(blocks, page, hkv, d, dtype=FP8_KV_DTYPE, device=device)
    v8 = torch.zeros_like(k8)
    q8 = rope_and_cache(qkv, cos, sin, slots, k8, v8, hq, hkv, 0.02, 0.03)
    assert torch.equal(q8, q16)
    assert torch.equal(_bits(k8), _bits(quantize_fp8(k16, 0.02)))
    assert torch.equal(_bits(v8), _bits(quantize_fp8(v16, 0.03)))


def test_mismatched_cache_dtypes_are_refused():
    q = torch.zeros(1, 2, 1, 16, dtype=torch.float16)
    kc = torch.zeros(1, 2, 8, 16, dtype=FP8_KV_DTYPE)
    with pytest.raises(ValueError, match="caches must both be"):
        decode_attention(q, kc, kc.half(), torch.ones(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="pools must be"):
        write_kv_slots(
            q.transpose(1, 2), q.transpose(1, 2), kc.float(), kc.float(), torch.zeros(1, 1, dtype=torch.int32)
        )


@pytest.mark.gpu
def test_llama3_8b_shape_decode_and_prefill_over_fp8_on_the_gpu():
    """Hq 32 / Hkv 8 / D 128, BF16 queries, contexts up to 4096 in 16-token blocks at random places: the
    autotuned decode launch and a 256-token chunk over a prefix of up to 1024 tokens, against the FP32
    reference of the same dequantized pools (TOL) and of the unquantized BF16 K/V (QUANT_TOL)."""
    device = _device("cuda")
    g = torch.Generator().manual_seed(6)
    b, hq, hkv, d, page = 4, 32, 8, 128, 16
    lens = torch.tensor([4096, 1000, 2500, 1280], dtype=torch.int32)
    s_max = 4096
    k = torch.randn(b, hkv, s_max, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, s_max, d, generator=g).bfloat16()
    ks, vs = float(k.abs().max()) / 448, float(v.abs().max()) / 448
    kq, vq = quantize_fp8(k, ks), quantize_fp8(v, vs)
    kp, vp, table = _fp8_pools(kq, vq, lens, page, 10)
    kp, vp, table, lens_d = kp.to(device), vp.to(device), table.to(device), lens.to(device)
    kd, vd = dequantize(kq, ks).to(device), dequantize(vq, vs).to(device)
    q = torch.randn(b, hq, 1, d, generator=g).bfloat16().to(device)
    got = decode_attention(q, kp, vp, lens_d, table, k_scale=ks, v_scale=vs)
    assert (got.float() - reference_decode(q, kd, vd, lens_d)).abs().max() < TOL[torch.bfloat16]
    assert (got.float() - reference_decode(q, k.to(device), v.to(device), lens_d)).abs().max() < QUANT_TOL
    chunk_lens = torch.clamp(lens_d, max=1280)  # a 256-token chunk after a prefix of 1024 (sequence 1: 744)
    qc = torch.randn(b, hq, 256, d, generator=g).bfloat16().to(device)
    got = chunked_prefill_attention(qc, kp, vp, chunk_lens, table, k_scale=ks, v_scale=vs)
    assert (got.float() - reference_decode(qc, kd, vd, chunk_lens)).abs().max() < TOL[torch.bfloat16]


# ------------------------------------------------------- sm_90 code (compiled here, no GPU needed)


def _decode_compile_facts(kv_f16: bool, many_pairs: bool = False, v_pairs: bool = False) -> dict:
    """The paged split-KV decode kernel over FP8 pools with a BF16 query, as the serving path launches
    it at the Llama-3-8B shape (GQA 32/8, D 128, 16-token pages), compiled for sm_90; `many_pairs`: the
    launch for many (sequence, kv head) pairs over long keys; `v_pairs`: V read as 16-bit pairs (the
    served form, FP8_V_PAIRS), else as bytes."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import decode_attention as da

    cfg = da.default_decode_config(128, FP8_KV_DTYPE, 4096, 2048 if many_pairs else None)
    assert (cfg == da.FP8_KV_MANY_PAIRS_DECODE_CONFIG) == many_pairs, cfg
    old = da.FP8_KV_F16
    da.FP8_KV_F16 = kv_f16
    try:
        opts = da._split_options(
            cfg, 4, 1, 128, 16, False, False, False, 0, False, torch.bfloat16, FP8_KV_DTYPE,
            {"V_PAIRS": v_pairs, "PAIRS_ASM": v_pairs},
        )  # fmt: skip
    finally:
        da.FP8_KV_F16 = old
    consts = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages", "launch_pdl")}
    # unit strides: the launcher specializes an int argument equal to 1 as a constant (contiguous D)
    consts |= {"STAMP": False, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1}
    pointers = dict.fromkeys(("K", "V", "KDesc", "VDesc"), "*fp8e4nv")
    pointers |= {"Q": "*bf16", "Out": "*bf16", "MidO": "*fp32", "MidL": "*fp32"}
    pointers |= dict.fromkeys(("SeqLens", "Table", "Counters"), "*i32")
    ints = {"stride_qb": 4096, "stride_qh": 128, "stride_qm": 4096, "stride_qd": 1, "stride_kb": 16384,
            "stride_kh": 128, "stride_kn": 1024, "stride_kd": 1, "stride_vb": 16384, "stride_vh": 128,
            "stride_vn": 1024, "stride_vd": 1, "stride_ob": 4096, "stride_oh": 128, "stride_om": 4096,
            "stride_od": 1, "stride_tb": 256, "num_kv_heads": 8, "num_splits": 2, "window": 0}  # fmt: skip
    facts = compile_facts(
        da._decode_split_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip
    return facts


def test_fp8_pools_widen_to_fp16_in_one_conversion_a_pair_on_sm90():
    """With BF16 products the FP8 decode kernel converted each pair of codes three times (E4M3 -> FP16
    pair, then two FP16 -> BF16), at the conversion units' lower rate, and read FP8 pools no faster than
    BF16 ones. With FP16 products (FP8_KV_F16) the codes widen in one ``cvt.rn.f16x2.e4m3x2`` a pair,
    nothing converts to BF16 in the loop, both products are FP16 MMAs: a third of the conversions a key
    tile. (On the H200 the serving launch got 16% faster from this alone: BENCHMARKS.md, session 18.)"""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    new = run_in_child(f"{__name__}:_decode_compile_facts", True)
    old = run_in_child(f"{__name__}:_decode_compile_facts", False)

    widen = "cvt.rn.f16x2.e4m3x2"
    assert new["counts"].get(widen, 0) > 0, new["counts"]
    assert not any(".bf16.f16" in op for op in new["counts"]), new["counts"]
    mma = {op for op in new["counts"] if op.startswith(("mma.sync", "wgmma.mma_async"))}
    assert mma and all(".f16.f16" in op for op in mma), mma
    # the BF16 products: the same widening, then two conversions to BF16 an element pair
    assert old["counts"].get(widen, 0) == new["counts"][widen]
    assert old["counts"].get("cvt.bf16.f16", 0) == 2 * new["counts"][widen], old["counts"]
    # K/V tiles arrive by pipelined 16-byte cp.async, as the BF16 pools' do
    assert new["cp_async_16"] > 0 and new["counts"].get("cp.async.wait_group", 0) > 0, new["counts"]
    assert new["ptxas_rc"] == 0 and new["spills"] == [0], new["ptxas"]


def test_fp8_v_is_read_as_16_bit_pairs_and_nothing_spills_on_sm90():
    """Serving's FP8 decode launch for many (sequence, kv head) pairs (2 warps, 128-key tiles). With V read
    as bytes its P.V operand took 256 one-byte loads from shared memory a tile (two consecutive keys of
    one channel a register), it sat at the register file's 255 a thread and spilled 32 bytes; on the
    H200 it was bound by issuing instructions (Nsight Compute, session 28: 46% issue-active, 3.4 TB/s
    against BF16 pools' 4.3). Read as 16-bit pairs of adjacent channels, V reaches the MMA layout by
    ``ldmatrix.trans`` with no byte load, each pair of keys splits by a byte permute a half (even
    channels: selector 0x0020, odd: 0x0031) and one widening, and nothing spills (4.09 TB/s at 256 x
    2,048 keys on the H200, session 31)."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    pairs = run_in_child(f"{__name__}:_decode_compile_facts", True, True, True)
    nbytes = run_in_child(f"{__name__}:_decode_compile_facts", True, True, False)
    assert pairs["ptxas_rc"] == 0 and nbytes["ptxas_rc"] == 0, (pairs["ptxas"], nbytes["ptxas"])
    assert nbytes["counts"].get("ld.shared.b8", 0) >= 256, nbytes["counts"]
    assert not any(op.startswith("ld.shared") and op.endswith("8") for op in pairs["counts"]), pairs["counts"]
    trans = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
    assert pairs["counts"].get(trans, 0) > nbytes["counts"].get(trans, 0), (pairs["counts"], nbytes["counts"])
    inline = pairs["inline"]
    assert inline.get("prmt.b32 0x0020", 0) == inline.get("prmt.b32 0x0031", 0) > 0, inline
    assert inline.get("cvt.rn.f16x2.e4m3x2", 0) == 2 * inline["prmt.b32 0x0020"], inline
    assert max(pairs["spills"]) == 0, pairs["ptxas"]
    assert max(nbytes["spills"]) <= 32, nbytes["ptxas"]


def _chunked_compile_facts(kv_f16: bool) -> dict:
    """The served chunked-prefill launch (prepared, varlen, paged) of a 1,024-token chunk over FP8 pools
    with a BF16 query at the Llama-3-8B shape, compiled for sm_90."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import chunked_prefill as cp
    from trtforge.kernels.configs import chunk_prefill_config

    cfg = chunk_prefill_config(1024)
    consts = {"GROUP": 4, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "PAGE_SIZE": 16, "HAS_QLENS": True, "DOT_F32": False, "WINDOW": False, "HAS_QSTARTS": True,
              "KV_F16": kv_f16, "SOFTCAP": False, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1,
              "stride_od": 1}  # fmt: skip
    pointers = {"Q": "*bf16", "Out": "*bf16", "K": "*fp8e4nv", "V": "*fp8e4nv"}
    pointers |= dict.fromkeys(("SeqLens", "QLens", "QStarts", "Table"), "*i32")
    ints = {"stride_qb": 0, "stride_qh": 128, "stride_qm": 4096, "stride_kb": 16384, "stride_kh": 128,
            "stride_kn": 1024, "stride_vb": 16384, "stride_vh": 128, "stride_vn": 1024, "stride_ob": 0,
            "stride_oh": 128, "stride_om": 4096, "stride_tb": 256, "num_kv_heads": 8, "seq_q": 1024,
            "window": 0}  # fmt: skip
    return compile_facts(
        cp._chunked_prefill_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


def test_chunked_prefill_over_fp8_pools_runs_fp16_products_on_sm90():
    """The chunked-prefill kernel shares the decode kernel's tile loop: over FP8 pools its codes widen in
    one ``cvt.rn.f16x2.e4m3x2`` a pair and its products are FP16 MMAs, with no BF16 conversion of K or V
    (the BF16 products convert each pair twice more)."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    new = run_in_child(f"{__name__}:_chunked_compile_facts", True)
    old = run_in_child(f"{__name__}:_chunked_compile_facts", False)
    widen = "cvt.rn.f16x2.e4m3x2"
    assert new["counts"].get(widen, 0) > 0, new["counts"]
    assert not any(".bf16.f16" in op for op in new["counts"]), new["counts"]
    mma = {op for op in new["counts"] if op.startswith(("mma.sync", "wgmma.mma_async"))}
    assert mma and all(".f16.f16" in op for op in mma), mma
    assert old["counts"].get("cvt.bf16.f16", 0) == 2 * old["counts"][widen], old["counts"]
    assert new["ptxas_rc"] == 0, new["ptxas"]
