"""The quantized weight formats (trtforge.kernels.qweight) and the GEMV kernels reading them.

FP8 (W8A8, per-token activation scales computed in the kernel's prologue) and INT4 (group 128,
dequantized in the kernel) against the float32 references of the formats: in Triton's CPU
interpreter without CUDA, for real on a GPU (``-m gpu``), where ``torch._scaled_mm`` is checked too.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

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
DEVICES = [
    pytest.param("cpu", id="interpreter"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def _skip(device: str) -> None:
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the interpreter run is for machines without CUDA (the kernels then run for real)")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


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


def test_int4_round_trip_codes_and_zero():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 256, generator=g)
    w[0, :128] = 0.0  # an all-zero group stays zero
    q = quantize_int4(w)
    assert q.packed.shape == (6, 128) and q.scale.shape == (6, 2) and q.scale.dtype == torch.float16
    codes = q.codes()
    assert codes.max() <= 15 and torch.equal(codes[:, 0::2], q.packed & 15)
    deq = q.dequantize()
    assert torch.equal(deq[0, :128], torch.zeros(128))
    step = q.scale.float().repeat_interleave(128, dim=1)
    assert ((deq - w).abs() <= step * 0.5 + 1e-3).all()
    clip = torch.full((6, 2), 0.8)
    assert torch.equal(fake_quantize_int4(w, 128, clip), quantize_int4(w, 128, clip).dequantize())
    with pytest.raises(ValueError, match="do not divide"):
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
def test_quantized_norm_gemv(device, fmt, m):
    from trtforge.kernels.gemv import norm_gemv

    _skip(device)
    x, w, nw = _fp8_operands(device, m, 40, 256, seed=m)
    q = quantize_fp8(w) if fmt == "fp8" else quantize_int4(w)
    xn = _rms_ref(x, nw, 1e-6)
    if fmt == "fp8":
        want = fp8_linear_reference(xn.float().cpu().to(x.dtype), q)
    else:
        want = xn.float().cpu() @ q.dequantize().t()
    got = norm_gemv(x, nw, 1e-6, _to(q, device))
    torch.testing.assert_close(got.float().cpu(), want.to(x.dtype).float(), atol=2e-2, rtol=2e-2)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_quantized_gate_up_and_residual(device, fmt):
    from trtforge.kernels.gemv import gemv_residual, norm_gate_up_silu

    _skip(device)
    inter, k = 24, 384  # three INT4 groups: K no power of two
    x, w, nw = _fp8_operands(device, 1, 2 * inter, k, seed=7)
    q = quantize_fp8(w) if fmt == "fp8" else quantize_int4(w)
    xn = _rms_ref(x, nw, 1e-6).cpu()
    lin = fp8_linear_reference(xn, q) if fmt == "fp8" else xn.float() @ q.dequantize().t()
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
    lin = fp8_linear_reference(a.cpu(), qd) if fmt == "fp8" else a.cpu().float() @ qd.dequantize().t()
    want = (lin + res.cpu().float()).to(x.dtype)
    got = gemv_residual(a.contiguous(), _to(qd, device), res)
    torch.testing.assert_close(got.float().cpu(), want.float(), atol=3e-2, rtol=2e-2)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_fp8_gemv_rounds_activations_as_torch_does(device):
    """The kernel's bit-arithmetic E4M3 rounding equals torch's cast over every binade and subnormals:
    a diagonal of unit weights returns the quantized activations themselves."""
    from trtforge.kernels.gemv import gemv_residual
    from trtforge.kernels.qweight import Fp8Weight

    _skip(device)
    k = 512
    vals = torch.cat([torch.logspace(-12, 8.7, k // 2, base=2), -torch.rand(k // 2) * 300]).float()
    x = vals[None, :].to(device)
    eye = Fp8Weight(torch.eye(k).to(torch.float8_e4m3fn).to(device), torch.ones(k, device=device))
    got = gemv_residual(x, eye, torch.zeros_like(x))
    xq, sx = quantize_rows_fp8(vals[None, :])
    torch.testing.assert_close(got.cpu(), xq.float() * sx, atol=0, rtol=1e-6)


@needs_triton
@pytest.mark.slow  # ~40-60 s: the interpreter runs every GEMV program of two layers one by one
@pytest.mark.parametrize("method", ["fp8", "int4-rtn"])
def test_fused_layers_over_quantized_weights_in_the_interpreter(method):
    """The fused layer path (concatenated quantized QKV and gate/up, the GEMVs at decode, quant_linear
    above) in float32 through Triton's interpreter, against the model's own forward on the same codes.
    INT4 matches to float32 rounding; FP8's per-token rounding flips where the activations differ by
    an ulp, so it is only close."""
    import copy

    from tests.llm.test_quant import _llama, _one_sequence_step, _prompts
    from trtforge.llm.executors.fused_layers import FusedLayers
    from trtforge.llm.executors.model_layers import ModelLayers
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.quant import quantize_model

    _skip("cpu")
    model = _llama(num_key_value_heads=2)
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

    _skip(device)
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
