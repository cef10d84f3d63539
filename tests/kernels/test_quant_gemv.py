"""The quantized weight formats (trtforge.kernels.qweight) and the kernels reading them.

The GEMVs are weight-only: FP8 (W8A16: E4M3 codes widened in registers, per-row scales at the end) and
INT4 (group 128, interleaved words), both against float32 ``x @ dequantize(W)^T``; the per-token FP8
activation quantization kernel (W8A8's input for ``torch._scaled_mm``) against its torch reference.
In Triton's CPU interpreter without CUDA, for real on a GPU (``-m gpu``).
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from trtforge.kernels.qweight import (
    FP8_MAX,
    Int4Weight,
    cat_weights,
    fake_quantize_int4,
    fp8_linear_reference,
    quantize_fp8,
    quantize_int4,
    quantize_rows_fp8,
)

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


def _rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def test_fp8_weight_round_trip_is_per_channel():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 64, generator=g) * torch.logspace(-3, 1, 24)[:, None]
    q = quantize_fp8(w)
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.shape == (24,)
    assert torch.equal(q.data.float().abs().amax(1), torch.full((24,), FP8_MAX))  # each row's max maps to 448
    rel = (q.dequantize() - w).abs() / w.abs().amax(1, keepdim=True)
    assert rel.max() <= 2**-4  # E4M3: 3 mantissa bits, half an ulp of the row's largest binade at most


def test_e4m3_rounding_is_exact_nearest_even_at_every_boundary_and_size():
    """kv_quant.to_e4m3 (every E4M3 reference rounds with it): ties to even, a float32 ulp either side of
    each tie (subnormal ties too), saturation, NaN; equal to torch's cast of one element at a time, and
    the same on a tensor large enough for torch's vectorized paths."""
    from trtforge.kernels.kv_quant import to_e4m3

    v = torch.cat([_e4m3_boundaries(), torch.tensor([1e6, -1e6, 0.0, -1e-9, 3e-4])])
    one_by_one = torch.stack([t.clamp(-448, 448).reshape(1).to(torch.float8_e4m3fn)[0] for t in v])
    assert torch.equal(to_e4m3(v).float(), one_by_one.float())
    assert torch.equal(to_e4m3(torch.cat([v] * 300)).float(), one_by_one.float().repeat(300))
    assert to_e4m3(torch.tensor([float("nan")])).float().isnan().all()


def test_fp8_references_divide_as_ieee_and_weights_quantize_in_slices(monkeypatch):
    """The per-token ratio 448 / amax is one IEEE float32 division (the kernels' div_rn), not torch's
    reciprocal-multiply (which moves 154 of these 131,072 codes); a weight quantized in slices of rows
    equals one quantized at once."""
    import numpy as np

    import trtforge.kernels.qweight as qw

    g = torch.Generator().manual_seed(4)
    x = torch.randn(512, 256, generator=g).bfloat16().float()  # BF16 values: x * 448 / amax is often a tie
    xq, _ = quantize_rows_fp8(x)
    amax = x.abs().amax(dim=1, keepdim=True).numpy()
    inv = torch.from_numpy(np.float32(448.0) / amax)  # numpy: IEEE float32 division
    assert torch.equal(xq.float(), qw.to_e4m3(x * inv).float())
    w = torch.randn(300, 200, generator=g)
    whole = quantize_fp8(w)
    monkeypatch.setattr(qw, "_QUANT_ELEMENTS", 1000)  # slices of 5 rows
    sliced = quantize_fp8(w)
    assert torch.equal(sliced.data.float(), whole.data.float()) and torch.equal(sliced.scale, whole.scale)


def test_int4_round_trip_codes_and_zero():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 256, generator=g)
    w[0, :128] = 0.0  # an all-zero group stays zero
    q = quantize_int4(w)
    assert q.packed.shape == (6, 128) and q.scale.shape == (6, 2) and q.scale.dtype == torch.float16
    codes = q.codes()
    words = q.packed.view(torch.int32)  # group 1's word 3, nibble 2: k = 128 + 2 * 16 + 3
    assert codes.max() <= 15 and torch.equal(((words[:, 16 + 3] >> 8) & 15).to(torch.uint8), codes[:, 163])
    deq = q.dequantize()
    assert torch.equal(deq[0, :128], torch.zeros(128))
    step = q.scale.float().repeat_interleave(128, dim=1)
    assert ((deq - w).abs() <= step * 0.5 + 1e-3).all()
    clip = torch.full((6, 2), 0.8)
    assert torch.equal(fake_quantize_int4(w, 128, clip), quantize_int4(w, 128, clip).dequantize())
    with pytest.raises(ValueError, match="dividing K=200"):
        quantize_int4(torch.randn(2, 200))


def test_rows_and_cat_commute_with_quantization():
    """Per-row quantization: quantizing [q; k; v] equals concatenating the quantized q, k, v."""
    g = torch.Generator().manual_seed(2)
    parts = [torch.randn(n, 128, generator=g) for n in (32, 16, 16)]
    for quantize in (quantize_fp8, quantize_int4):
        whole = quantize(torch.cat(parts))
        joined = cat_weights([quantize(p) for p in parts])
        assert torch.equal(whole.dequantize(), joined.dequantize())
        assert torch.equal(whole.rows(32, 48).dequantize(), quantize(parts[1]).dequantize())


def test_fp8_activation_quantization_is_per_token():
    x = torch.tensor([[1.0, -2.0, 0.5], [1000.0, 3.0, 0.0], [0.0, 0.0, 0.0]])
    xq, sx = quantize_rows_fp8(x)
    assert torch.equal(xq.float().abs().amax(1)[:2], torch.full((2,), FP8_MAX))
    assert torch.equal(xq.float()[2], torch.zeros(3))
    assert torch.allclose((xq.float() * sx)[0], x[0], rtol=2**-4)


def _fp8_operands(device, m, n, k, seed):
    """x, w, norm weight: BF16 on the GPU, FP16 in the interpreter (whose BF16 casts truncate)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 2).to(dtype)
    w = torch.randn(n, k, generator=g) / k**0.5
    nw = (torch.rand(k, generator=g) + 0.5).to(dtype)
    return x.to(device), w, nw.to(device)


def _to(q, device):
    if isinstance(q, Int4Weight):
        return Int4Weight(q.packed.to(device), q.scale.to(device), q.offset.to(device))
    return type(q)(q.data.to(device), q.scale.to(device))


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("defer", [False, True], ids=["prologue", "deferred"])
def test_quantized_norm_gemv(device, fmt, m, defer, monkeypatch):
    from trtforge.kernels import gemv as mod
    from trtforge.kernels.gemv import norm_gemv

    skip_unless_runs_here(device)
    monkeypatch.setattr(mod, "DEFER_NORM", defer)  # (gemv.DEFER_NORM: FP8's one-row form; INT4 keeps its own)
    x, w, nw = _fp8_operands(device, m, 40, 256, seed=m)
    q = quantize_fp8(w) if fmt == "fp8" else quantize_int4(w)
    xn = _rms_ref(x, nw, 1e-6)
    want = xn.float().cpu() @ q.dequantize().t()  # weight-only: the 16-bit x times the weights
    got = norm_gemv(x, nw, 1e-6, _to(q, device))
    torch.testing.assert_close(got.float().cpu(), want.to(x.dtype).float(), atol=2e-2, rtol=2e-2)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
@pytest.mark.parametrize("defer", [False, True], ids=["prologue", "deferred"])
def test_quantized_gate_up_and_residual(device, fmt, defer, monkeypatch):
    from trtforge.kernels import gemv as mod
    from trtforge.kernels.gemv import gemv_residual, norm_gate_up_silu

    skip_unless_runs_here(device)
    monkeypatch.setattr(mod, "DEFER_NORM", defer)
    inter, k = 24, 384  # three INT4 groups: K no power of two
    x, w, nw = _fp8_operands(device, 1, 2 * inter, k, seed=7)
    q = quantize_fp8(w) if fmt == "fp8" else quantize_int4(w)
    xn = _rms_ref(x, nw, 1e-6).cpu()
    lin = xn.float() @ q.dequantize().t()
    g, u = lin.to(x.dtype).float().split(inter, dim=1)
    want = (torch.nn.functional.silu(g.to(x.dtype).float()).to(x.dtype).float() * u).to(x.dtype)
    got = norm_gate_up_silu(x, nw, 1e-6, _to(q, device))
    torch.testing.assert_close(got.float().cpu(), want.float(), atol=2e-2, rtol=2e-2)

    a = got
    wd = torch.randn(k, inter, generator=torch.Generator().manual_seed(8)) / inter**0.5
    qd = quantize_fp8(wd) if fmt == "fp8" else quantize_int4(torch.nn.functional.pad(wd, (0, 104)))
    if fmt == "int4":  # K must hold whole groups: the activations padded with zeros to 128
        a = torch.nn.functional.pad(a, (0, 104))
    res = x.clone()
    lin = a.cpu().float() @ qd.dequantize().t()
    want = (lin + res.cpu().float()).to(x.dtype)
    got = gemv_residual(a.contiguous(), _to(qd, device), res)
    torch.testing.assert_close(got.float().cpu(), want.float(), atol=3e-2, rtol=2e-2)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_fp8_gemv_is_weight_only(device):
    """W8A16: x is not rounded to E4M3. With one-hot weight rows the GEMV returns x's own 16-bit values
    (times the rows' scales), which an E4M3 rounding of x would change."""
    from trtforge.kernels.gemv import gemv
    from trtforge.kernels.qweight import Fp8Weight

    skip_unless_runs_here(device)
    k = 256
    x = (torch.linspace(-3, 3, k) + 0.01).half()[None, :]  # mostly not E4M3 values
    eye = torch.eye(k).to(torch.float8_e4m3fn)
    scale = torch.full((k,), 2.0)
    got = gemv(x.to(device), Fp8Weight(eye.to(device), scale.to(device))).cpu()
    assert torch.equal(got, (x.float() * 2).half())
    xq, sx = quantize_rows_fp8(x)
    assert not torch.equal((xq.float() * sx).half(), x)  # (so the check above can tell them apart)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_quant_linear_is_weight_only_at_one_token_and_w8a8_above(device):
    """quant_linear's FP8 boundary (weight_only_max_tokens): one token against x @ dequantized W, more
    against the W8A8 reference (per-token E4M3 activations); the CPU path computes the same split."""
    from trtforge.llm.quant.linear import FP8_WEIGHT_ONLY_MAX_TOKENS, quant_linear

    if device == "cuda":
        skip_unless_runs_here(device)
        if torch.cuda.get_device_capability() < (8, 9):
            pytest.skip("W8A8 needs FP8 tensor cores (compute capability 8.9+)")
    assert FP8_WEIGHT_ONLY_MAX_TOKENS == 1
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator().manual_seed(12)
    w = torch.randn(48, 256, generator=g) / 16
    q = quantize_fp8(w)
    x = torch.randn(5, 256, generator=g).to(dtype)
    one = quant_linear(x[:1].to(device), _to(q, device)).float().cpu()
    want_one = x[:1].float() @ q.dequantize().t()
    many = quant_linear(x.to(device), _to(q, device)).float().cpu()
    want_many = fp8_linear_reference(x, q)
    tol = 1e-2 if device == "cuda" else 1e-5
    torch.testing.assert_close(one, want_one, atol=tol, rtol=tol)
    torch.testing.assert_close(many, want_many, atol=tol, rtol=tol)
    # the split is seen: each output fails the other reference at the same tolerance. (On CUDA the two
    # references are at most 0.056 apart here, so the former "differ by more than 10 x tol" could not
    # hold at tol 1e-2; half the 48 outputs differ by more than tol, up to 3.9x.)
    assert not torch.allclose(one, want_many[:1], atol=tol, rtol=tol)
    assert not torch.allclose(many[:1], want_one, atol=tol, rtol=tol)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 4, 5])
def test_int4_gemv_odd_rows_several_chunks(device, m):
    """INT4 at 1, 4 and 5 rows of x (past one, rows run in a loop; at 5 the block of x rows part full), 37
    output rows (no multiple of the row block), K of 5 groups over chunks of 2 (a masked last chunk),
    norm prologue and residual epilogue; FP16 x."""
    from trtforge.kernels.gemv import GemvConfig, gemv_residual, norm_gemv

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(11 + m)
    n, k = 37, 640
    x = (torch.randn(m, k, generator=g) * 2).half()
    nw = (torch.rand(k, generator=g) + 0.5).half()
    q = quantize_int4(torch.randn(n, k, generator=g) / k**0.5)
    cfg = GemvConfig(block_n=8, block_k=256, num_warps=4, num_stages=1)
    want = _rms_ref(x, nw, 1e-5).float() @ q.dequantize().t()
    got = norm_gemv(x.to(device), nw.to(device), 1e-5, _to(q, device), config=cfg).cpu()
    torch.testing.assert_close(got.float(), want.half().float(), atol=2e-3, rtol=2e-3)
    res = torch.randn(m, n, generator=g).half()
    want = (x.float() @ q.dequantize().t() + res.float()).half()
    got = gemv_residual(x.to(device), _to(q, device), res.to(device), config=cfg).cpu()
    torch.testing.assert_close(got.float(), want.float(), atol=2e-3, rtol=2e-3)


def test_int4_packing_mutations_are_caught():
    """The GEMV tests would see a wrong nibble order or a lost offset: both move x @ W^T far beyond the
    tolerances above (the same reference the kernels are held to)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 256, generator=g)
    x = torch.randn(2, 256, generator=g)
    q = quantize_int4(w)
    want = x @ q.dequantize().t()
    b = q.packed.view(16, 2, 16, 4)
    swapped = Int4Weight(((b & 15) << 4 | (b >> 4)).view(16, 128), q.scale, q.offset)  # nibbles swapped
    no_offset = Int4Weight(q.packed, q.scale, torch.zeros_like(q.offset))
    for bad in (swapped, no_offset):
        rel = (x @ bad.dequantize().t() - want).norm() / want.norm()
        assert rel > 0.1, rel


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_int4_gemv_catches_a_swapped_nibble_order(device):
    """Mutation check through the kernel itself: weights packed with the nibbles of every byte swapped
    give a result far from the reference of the true codes."""
    from trtforge.kernels.gemv import gemv

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(4)
    q = quantize_int4(torch.randn(8, 256, generator=g))
    x = torch.randn(1, 256, generator=g).half()
    b = q.packed
    bad = Int4Weight(((b & 15) << 4 | (b >> 4)).contiguous(), q.scale, q.offset)
    want = x.float() @ q.dequantize().t()
    good = gemv(x.to(device), _to(q, device)).float().cpu()
    wrong = gemv(x.to(device), _to(bad, device)).float().cpu()
    assert (good - want).norm() / want.norm() < 2e-3
    assert (wrong - want).norm() / want.norm() > 0.1


@needs_triton
@pytest.mark.slow  # ~40 s: the interpreter runs every INT4 GEMV program one by one
@pytest.mark.parametrize("method", ["fp8", "int4-rtn"])
def test_fused_layers_over_quantized_weights_in_the_interpreter(method):
    """The fused layer path (concatenated quantized QKV and gate/up, the GEMVs at decode, quant_linear
    above) in float32 through Triton's interpreter, against the model's own forward on the same codes.
    INT4 matches to float32 rounding; FP8's per-token rounding flips where the activations differ by
    an ulp, so it is only close. INT4 runs one layer: its second would launch the same five GEMV forms
    (norm+QKV, o+residual, norm+gate/up+SiLU, down+residual at 3 rows and at 1, then the head) at the same
    shapes, over ~40 s of interpreted programs; FP8 (cheap) keeps two, so the per-layer weights and the
    layer-to-layer residual of the quantized path stay covered. INT4's MLP is 128 wide (one group, as
    hidden): gate/up's programs scale with it, and K over several groups and chunks is
    test_int4_gemv_odd_rows_several_chunks' and test_quantized_gate_up_and_residual's."""
    import copy

    from tests.llm.test_quant import _llama, _one_sequence_step, _prompts
    from trtforge.llm.executors.fused_layers import FusedLayers
    from trtforge.llm.executors.model_layers import ModelLayers
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.quant import quantize_model

    skip_unless_runs_here("cpu")
    int4 = {"num_hidden_layers": 1, "intermediate_size": 128} if method == "int4-rtn" else {}
    model = _llama(num_key_value_heads=2, **int4)
    ref = copy.deepcopy(model)
    quantize_model(model, method)
    quantize_model(ref, method)
    ex = TorchExecutor(model, num_blocks=4, block_size=16, kernels="torch")
    ex._fused = FusedLayers(ex._adapter)  # the CUDA executor's layers, run by the interpreter here
    ex._layers = ModelLayers(ex._adapter, ex._fused, ex.k_pools, ex.v_pools)
    ids = _prompts(1, 4)[0]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = torch.cat([ex.step(_one_sequence_step(ids[:3], 0)), ex.step(_one_sequence_step(ids[3:], 3))])
    rel = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert rel.max() < (0.06 if method == "fp8" else 1e-5), rel


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 5, 16])
def test_fp8_row_quantization_kernel_equals_torch(device, m):
    """One-kernel per-token quantization: the same E4M3 codes and scales as the torch reference, rows
    padded to 16 with zeros and scale 1."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 300, generator=g) * torch.logspace(-3, 2, m)[:, None]
    x[0, :7] = 0.0
    q, s = quantize_rows_fp8_padded(x.to(device))
    want_q, want_s = quantize_rows_fp8(x)
    assert q.shape == (16, 300) and s.shape == (16, 1)
    assert torch.equal(q[:m].float().cpu(), want_q.float())
    # amax / 448 on the GPU may differ from torch's CPU division in the last bit (same codes above)
    torch.testing.assert_close(s[:m].cpu(), want_s, rtol=1e-6, atol=0)
    assert not q[m:].float().any() and torch.equal(s[m:].cpu(), torch.ones(16 - m, 1))


def _e4m3_boundaries() -> torch.Tensor:
    """Values at and next to E4M3 rounding boundaries: midpoints between neighbours (ties to even),
    one float32 ulp either side, the mantissa overflow into the next binade, subnormals, 448."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mid = (grid[:-1] + grid[1:]) / 2
    ulp_up = torch.nextafter(mid, torch.full_like(mid, 1e9))
    ulp_dn = torch.nextafter(mid, torch.zeros_like(mid))
    v = torch.cat([grid, mid, ulp_up, ulp_dn, torch.tensor([448.0, 447.9, 464.0])])
    return torch.cat([v, -v])


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hw_cast", [False, True])
def test_fp8_row_quantization_rounds_boundaries_as_torch(device, hw_cast):
    """Ties to even, mantissa carries into the exponent, subnormals and saturation: the kernel's codes
    equal torch's at every rounding boundary, by the bit-arithmetic rounding and by the hardware cast
    (in the interpreter the float8 cast is torch's, as tests/kernels/conftest.py arranges). A row whose
    peak is 448 has scale 1, so the values are rounded exactly as given."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

    skip_unless_runs_here(device)
    v = _e4m3_boundaries()
    x = torch.stack([v, v * 2.0**-6, v * 3.0])  # unit scale, smaller binades, a scale of 3
    x[0, 0] = 448.0
    q, s = quantize_rows_fp8_padded(x.to(device), hw_cast=hw_cast)
    want_q, want_s = quantize_rows_fp8(x)
    assert torch.equal(q[:3].float().cpu(), want_q.float())  # (the bit arithmetic may give +0 for -0)
    torch.testing.assert_close(s[:3].cpu(), want_s, rtol=1e-6, atol=0)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hw_cast", [False, True])
def test_fp8_row_codes_equal_the_reference_on_a_llama_sized_batch(device, hw_cast):
    """64 rows of 4096 BF16 activations (as the 8B model's projections get them; BF16 values times
    448 / amax land on E4M3 ties often): every code and scale of the Triton quantizer equals
    quantize_rows_fp8's, by the bit-arithmetic rounding and by the hardware conversion. The H200 run of
    session 16 found 294 codes apart: the reference's ``448 / amax`` was torch's reciprocal-multiply, an
    ulp off the kernel's IEEE quotient a quarter of the time; it now divides as IEEE."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4096, generator=g).bfloat16()
    x[3, :100] *= 1e-4  # small values: E4M3 subnormals
    q, s = quantize_rows_fp8_padded(x.to(device), hw_cast=hw_cast)
    want_q, want_s = quantize_rows_fp8(x.cpu())
    diff = q.float().cpu() != want_q.float()
    scaled = x.cpu().float() * 448 / x.cpu().float().abs().amax(1, keepdim=True)
    assert not diff.any(), (
        f"{int(diff.sum())} codes differ, e.g. at x * 448 / amax = {scaled[diff][:5].tolist()}: "
        f"got {q.float().cpu()[diff][:5].tolist()}, want {want_q.float()[diff][:5].tolist()}"
    )
    assert torch.equal(s.cpu(), want_s)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_fp8_row_quantization_two_passes_past_the_register_row(device, monkeypatch):
    """Rows longer than SINGLE_PASS_K take the two-pass path: the same codes."""
    from trtforge.kernels import fp8_rows

    skip_unless_runs_here(device)
    monkeypatch.setattr(fp8_rows, "SINGLE_PASS_K", 64)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 300, generator=g) * 5
    q, s = fp8_rows.quantize_rows_fp8_padded(x.to(device))
    want_q, want_s = quantize_rows_fp8(x)
    assert torch.equal(q[:3].float().cpu(), want_q.float())
    torch.testing.assert_close(s[:3].cpu(), want_s, rtol=1e-6, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 64])
def test_fp8_quant_linear_on_the_skinny_gemm_when_turned_on(monkeypatch, m):
    """FP8_SKINNY_MAX_TOKENS (64 by default): W8A8 up to that many tokens on trtforge's skinny wgmma
    GEMM instead of cuBLASLt, one token too with the weight-only limit at 0; against the W8A8
    reference on the same activation codes and the cuBLASLt path, with a bias, in BF16 and FP16."""
    import trtforge.llm.quant.linear as linear
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the skinny GEMM runs wgmma (Hopper, compute capability 9.0)")
    g = torch.Generator().manual_seed(13)
    w = torch.randn(96, 512, generator=g) / 16
    bias = torch.randn(96, generator=g)
    q = quantize_fp8(w)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(m, 512, generator=g).to(dtype)
        b = bias.to(dtype)
        monkeypatch.setattr(linear, "FP8_WEIGHT_ONLY_MAX_TOKENS", 0)
        monkeypatch.setattr(linear, "FP8_SKINNY_MAX_TOKENS", 0)
        cublas = linear.quant_linear(x.cuda(), _to(q, "cuda"), b.cuda()).float().cpu()
        monkeypatch.setattr(linear, "FP8_SKINNY_MAX_TOKENS", 64)
        skinny = linear.quant_linear(x.cuda(), _to(q, "cuda"), b.cuda())
        assert skinny.dtype == dtype and skinny.shape == (m, 96)
        xq, sx = quantize_rows_fp8_padded(x.cuda())  # the codes both paths multiply
        want = (xq[:m].float() @ q.data.float().t().cuda()) * sx[:m] * q.scale.cuda() + bias.cuda()
        torch.testing.assert_close(skinny.float(), want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(skinny.float().cpu(), cublas, atol=2e-2, rtol=2e-2)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp16", "fp8"])
def test_one_row_gemv_reducing_loop_matches_the_reference(device, fmt):
    """GemvConfig.reduce sums each chunk's products as they come rather than at the end: another order
    of the same sums, so the norm, gated and residual GEMVs stay within the float reference's tolerance
    of it and of the plain loop (K in three chunks and a ragged fourth)."""
    from trtforge.kernels import gemv as gemv_mod

    skip_unless_runs_here(device)
    inter, k = 24, 448
    x, w, nw = _fp8_operands(device, 1, 2 * inter, k, seed=13)
    wd = torch.randn(k, inter, generator=torch.Generator().manual_seed(14)) / inter**0.5
    if fmt == "fp8":
        q, qd = _to(quantize_fp8(w), device), _to(quantize_fp8(wd), device)
    else:
        q, qd = w.to(device=device, dtype=x.dtype), wd.to(device=device, dtype=x.dtype)
    runs = {}
    for reduce in (False, True):
        cfg = gemv_mod.GemvConfig(block_n=2, block_k=128, num_stages=1, reduce=reduce)
        cfg_d = gemv_mod.GemvConfig(block_n=4, block_k=16, num_stages=1, reduce=reduce)
        a = gemv_mod.norm_gate_up_silu(x, nw, 1e-6, q, config=cfg)
        runs[reduce] = (
            gemv_mod.norm_gemv(x, nw, 1e-6, q, config=cfg),
            a,
            gemv_mod.gemv_residual(a.contiguous(), qd, x, config=cfg_d),
        )
    dq = q.dequantize().cpu() if fmt == "fp8" else q.float().cpu()
    xn = _rms_ref(x, nw, 1e-6).float().cpu()
    want = xn @ dq.t()
    g, u = want.to(x.dtype).float().split(inter, dim=1)
    want_a = (torch.nn.functional.silu(g.to(x.dtype).float()).to(x.dtype).float() * u).to(x.dtype).float()
    for reduce, (norm_out, gated, _) in runs.items():
        torch.testing.assert_close(norm_out.float().cpu(), want.to(x.dtype).float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(gated.float().cpu(), want_a, atol=2e-2, rtol=2e-2, msg=f"reduce={reduce}")
    plain, reduced = runs[False][2].float().cpu(), runs[True][2].float().cpu()
    torch.testing.assert_close(reduced, plain, atol=3e-2, rtol=2e-2)


def test_one_row_fp8_gemvs_reduce_where_programs_are_many():
    """default_config's loop rule at the Llama-3-8B shapes on 132 SMs (the H200 loop sweeps): qkv,
    gate_up and the lm_head (>= 10 programs an SM at 4 rows) sum each 16,384-code chunk as it comes, over
    8 rows x 2,048 (qkv: 5.8 programs an SM at 8 rows, FP8_REDUCE_WIDE_MIN_PROGRAMS_PER_SM), 4 pairs x
    2,048 and 8 rows x 2,048; o and down keep the plain loop; 16-bit weights, INT4 and FP8 at more than
    one row never reduce."""
    from trtforge.kernels.gemv import default_config

    for n, k, gated, bn, bk in ((6144, 4096, False, 8, 2048), (14336, 4096, True, 4, 2048),
                                (128256, 4096, False, 8, 2048)):  # fmt: skip
        cfg = default_config(1, n, k, gated, 132, "fp8")
        assert cfg.reduce and (cfg.block_n, cfg.block_k, cfg.num_warps) == (bn, bk, 4), (n, cfg)
    for n, k in ((4096, 4096), (4096, 14336)):
        cfg = default_config(1, n, k, False, 132, "fp8")
        assert not cfg.reduce and cfg.block_k == 1024, cfg
    assert default_config(1, 4096, 100, False, 1, "fp8").block_k == 128  # K shorter than a chunk
    assert not default_config(2, 14336, 4096, True, 132, "fp8").reduce
    assert not default_config(1, 14336, 4096, True, 132, "plain").reduce
    assert not default_config(1, 14336, 4096, True, 132, "int4").reduce


def _gate_up_compile_facts(reduce: bool) -> dict:
    """The one-row gated FP8 GEMV (Llama-3-8B gate_up, the default config but for the loop) compiled for
    sm_90."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import gemv as g

    cfg = g.default_config(1, 14336, 4096, True, 132, "fp8")
    pointers = {"X": "*bf16", "W": "*fp8e4nv", "Out": "*bf16", "Res": "*bf16", "Bias": "*bf16",
                "NormW": "*bf16", "WScale": "*fp32", "WOffset": "*fp32"}  # fmt: skip
    ints = {"N": 14336, "K": 4096, "stride_xm": 4096, "stride_wn": 4096, "stride_sn": 0, "stride_om": 14336,
            "stride_rm": 14336, "up_rows": 14336}  # fmt: skip
    consts = {"M": 1, "NORM": True, "GATED": True, "HAS_RES": False, "HAS_BIAS": False, "DOT": False,
              "PDL": True, "WFMT": 1, "GROUP": 128, "ASM": True, "BLOCK_M": 1, "BLOCK_N": cfg.block_n,
              "BLOCK_K": cfg.block_k, "REDUCE": reduce}  # fmt: skip
    facts = compile_facts(g._gemv_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
                          scalars={"eps": "fp32"})  # fmt: skip
    facts["registers"] = int(re.search(r"Used (\d+) registers", facts["ptxas"]).group(1))
    return facts


def test_one_row_gemv_reducing_loop_takes_fewer_registers_on_sm90():
    """Why the reducing loop wins where programs are many: it keeps no [BLOCK_N, BLOCK_K] partials, so
    the default gate_up launch (2,048-column chunks) takes fewer registers than the plain loop would at
    the same chunk (more programs an SM, more loads in flight). Neither spills."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    regs = {}
    for reduce in (False, True):
        facts = run_in_child(f"{__name__}:_gate_up_compile_facts", reduce)
        assert facts["ptxas_rc"] == 0 and facts["spills"] == [0], facts["ptxas"]
        regs[reduce] = facts["registers"]
    assert regs[True] < regs[False], regs
