"""Kernels that quantize the W8A8 GEMMs' inputs as they produce them (trtforge.kernels.fused_layer):
RMSNorm + quantize, residual add + RMSNorm + quantize, SiLU*up + quantize.

Each must give exactly the codes and scales of its unfused pair (the 16-bit kernel, then
``quantize_rows_fp8_padded``), and the residual add exactly torch's. In Triton's CPU interpreter
without CUDA, for real on a GPU (``-m gpu``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

DTYPES = [
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.float32, id="fp32"),
]


def _rows(t: int, n: int, dtype: torch.dtype, seed: int, device: str) -> torch.Tensor:
    """Activations with rows of very different sizes (one near zero, one with an outlier channel)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, n, generator=g) * torch.logspace(-2, 1, t)[:, None]
    x[0, 3] = 40.0
    return x.to(dtype).to(device)


def _assert_same_rows(rows, want_q: torch.Tensor, want_s: torch.Tensor, m: int) -> None:
    """The same codes and scales. A float32 row's scale may be an ulp off: its norm is not rounded to 16
    bits, so a last-bit difference of rsqrt(mean(x^2)) between the two kernels' summation orders on the
    GPU (each compiles its own layout) reaches the peak (H200, session 32: codes equal, scales not)."""
    assert rows.m == m and rows.q.shape == want_q.shape and rows.s.shape == want_s.shape
    diff = rows.q.float() != want_q.float()
    assert not diff.any(), f"{int(diff.sum())} codes differ from the unfused kernels'"
    if rows.dtype == torch.float32:
        torch.testing.assert_close(rows.s, want_s, rtol=3e-7, atol=0)
    else:
        assert torch.equal(rows.s, want_s)
    assert not rows.q[m:].float().any() and bool((rows.s[m:] == 1).all()), "padding rows: zeros, scale 1"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "n"), [(5, 320), (17, 4096)])
def test_rms_norm_fp8_equals_the_norm_then_the_quantizer(device, dtype, t, n):
    """Without a delta: the codes and scales of rms_norm then quantize_rows_fp8_padded; x untouched."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.fused_layer import rms_norm, rms_norm_fp8

    skip_unless_runs_here(device)
    x = _rows(t, n, dtype, 1, device)
    w = (torch.rand(n, generator=torch.Generator().manual_seed(2)) + 0.5).to(dtype).to(device)
    before = x.clone()
    h, rows = rms_norm_fp8(x, w, 1e-5)
    assert h is x and torch.equal(x, before)
    assert rows.dtype == dtype and rows.shape == (t, n)
    _assert_same_rows(rows, *quantize_rows_fp8_padded(rms_norm(x, w, 1e-5)), t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["new", "in_place", "given"])
def test_residual_add_rms_norm_fp8_equals_torch_add_then_norm_then_quantizer(device, dtype, where):
    """With a delta: h = x + delta exactly as torch adds two 16-bit tensors, written where asked (a new
    tensor, x itself, or a given buffer), and the codes of rms_norm(h) quantized."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.fused_layer import rms_norm, rms_norm_fp8

    skip_unless_runs_here(device)
    t, n = 19, 512
    x = _rows(t, n, dtype, 3, device)
    delta = _rows(t, n, dtype, 4, device) * 3
    w = (torch.rand(n, generator=torch.Generator().manual_seed(5)) + 0.5).to(dtype).to(device)
    want_h = x + delta
    want = quantize_rows_fp8_padded(rms_norm(want_h, w, 1e-6))
    out = {"new": None, "in_place": x, "given": torch.full_like(x, float("nan"))}[where]
    h, rows = rms_norm_fp8(x, w, 1e-6, delta=delta, out=out)
    if out is not None:
        assert h is out
    assert torch.equal(h, want_h)
    _assert_same_rows(rows, *want, t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "inter"), [(3, 200), (18, 1376)])
def test_silu_mul_fp8_equals_silu_mul_then_the_quantizer(device, dtype, t, inter):
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.fused_layer import silu_mul, silu_mul_fp8

    skip_unless_runs_here(device)
    gate_up = _rows(t, 2 * inter, dtype, 6, device)
    rows = silu_mul_fp8(gate_up)
    assert rows.dtype == dtype and rows.shape == (t, inter)
    _assert_same_rows(rows, *quantize_rows_fp8_padded(silu_mul(gate_up)), t)


@pytest.mark.parametrize("device", DEVICES)
def test_silu_mul_fp8_two_passes_past_the_register_row(device, monkeypatch):
    """Rows wider than SINGLE_PASS_K find their peak in a first pass and quantize in a second: the same
    codes (a strided gate_up view too: rows of a wider buffer)."""
    from trtforge.kernels import fused_layer
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

    skip_unless_runs_here(device)
    monkeypatch.setattr(fused_layer, "SINGLE_PASS_K", 64)
    wide = _rows(4, 2 * 300 + 40, torch.bfloat16, 7, device)
    gate_up = wide[:, : 2 * 300]
    rows = fused_layer.silu_mul_fp8(gate_up)
    _assert_same_rows(rows, *quantize_rows_fp8_padded(fused_layer.silu_mul(gate_up)), 4)


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_quantizers_refuse_what_they_cannot_read(device):
    from trtforge.kernels.fused_layer import rms_norm_fp8, silu_mul_fp8

    skip_unless_runs_here(device)
    x = torch.zeros(4, 64, dtype=torch.bfloat16, device=device)
    w = torch.ones(64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="rms_norm_fp8: x must be a float"):
        rms_norm_fp8(x.to(torch.int16), w, 1e-5)
    with pytest.raises(ValueError, match="rms_norm_fp8: x must be a float"):
        rms_norm_fp8(x.t(), w, 1e-5)
    with pytest.raises(ValueError, match=r"rms_norm_fp8: weight must be \[64\]"):
        rms_norm_fp8(x, w[:32], 1e-5)
    with pytest.raises(ValueError, match="delta and out must be"):
        rms_norm_fp8(x, w, 1e-5, delta=x.half())
    with pytest.raises(ValueError, match="rms_norm_fp8: delta must have 64 columns"):
        rms_norm_fp8(x, w, 1e-5, delta=x[:, :32])
    with pytest.raises(ValueError, match="silu_mul_fp8: gate_up .* even width"):
        silu_mul_fp8(x[:, :63])


def _sm90_facts(kernel: str, has_delta: bool) -> dict:
    """The kernel compiled for sm_90 at the Llama-3-8B widths (norms of 4,096 on 8 warps, SiLU*up of
    14,336 on 16), as the wrappers launch them (run in a child: the interpreter compiles nothing)."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import fused_layer as fl

    if kernel == "norm":
        ptrs = {"X": "*bf16", "Delta": "*bf16", "W": "*bf16", "H": "*bf16", "Q": "*fp8e4nv", "S": "*fp32"}
        ints = {"n_cols": 4096, "stride_x": 4096, "stride_d": 4096, "stride_h": 4096, "stride_q": 4096}
        consts = {"HAS_DELTA": has_delta, "BLOCK": 4096, "HW_CAST": True}
        return compile_facts(fl._norm_quant_kernel, ptrs, ints, consts, 8, 1, {"eps": "fp32"}) | {
            "threads": 256
        }
    ptrs = {"GU": "*bf16", "Q": "*fp8e4nv", "S": "*fp32"}
    ints = {"inter": 14336, "stride_gu": 28672, "stride_q": 14336}
    consts = {"BLOCK": 16384, "ONE_PASS": True, "HW_CAST": True}
    return compile_facts(fl._silu_mul_quant_kernel, ptrs, ints, consts, 16, 1) | {"threads": 512}


@pytest.mark.parametrize(
    ("kernel", "has_delta", "row_bytes"),
    [("norm", False, 4096), ("norm", True, 4096 * 3), ("silu", False, 16384)],
    ids=["norm", "add-norm", "silu-mul"],
)
def test_fused_quantizers_write_only_codes_on_sm90(kernel, has_delta, row_bytes):
    """What the GPU runs: 16-byte stores that add up to one E4M3 code an element (plus the 16-bit
    residual row with a delta) and one scale, so no 16-bit copy of the row is written; the paired
    hardware conversion (cvt.rn.satfinite.e4m3x2); nothing spilled (H200 session 32: 55, 64 and 128
    registers)."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    facts = run_in_child(f"{__name__}:_sm90_facts", kernel, has_delta)
    counts = facts["counts"]
    assert facts["ptxas_rc"] == 0 and facts["spills"] == [0], facts["ptxas"]
    assert counts.get("cvt.rn.satfinite.e4m3x2.f32", 0) > 0
    assert 16 * counts.get("st.global.v4.b32", 0) * facts["threads"] == row_bytes
    assert counts.get("st.global.b32", 0) == 1  # the row's scale
    assert not [
        op for op in counts if op.startswith("st.global") and op not in ("st.global.v4.b32", "st.global.b32")
    ]
