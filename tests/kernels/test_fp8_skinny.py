"""The skinny FP8 GEMM (trtforge.kernels.fp8_skinny): W8A8 for 1..64 rows on the FP8 tensor cores.

Against :func:`~trtforge.kernels.qweight.fp8_linear_reference` on the same codes (the activations
quantized per token by :mod:`trtforge.kernels.fp8_rows`, as the serving path does): M = 1, 3, 16, 64,
N and K on and off the tiles, bias, BF16/FP16/FP32 out, split-K, both orientations. In Triton's CPU
interpreter without CUDA, for real on a GPU (``-m gpu``). The refusals, and an sm_90 compile on the CPU
(no GPU, no interpreter): the products are wgmma on E4M3 operands and the weight loads 16-byte copies.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests.kernels._sm90 import compile_facts, needs_ptxas, run_in_child
from trtforge.kernels.qweight import Fp8Weight, fp8_linear_reference, quantize_fp8

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

# half an ulp of the output dtype, relative: the one rounding of the kernel's float32 result
_HALF_ULP = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-24}


def _operands(m: int, n: int, k: int, seed: int, device: str):
    """x [m, k] with rows of very different magnitudes (so a row's scale applied to another shows),
    its per-token E4M3 codes and scales from the fp8_rows kernel (first m of the padded rows), an FP8
    weight [n, k] (per-row magnitudes differ too), a bias [n]."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-1, 1, m)[:, None]
    w = torch.randn(n, k, generator=g) / k**0.5 * torch.logspace(-1, 0.5, n)[:, None]
    bias = torch.randn(n, generator=g)
    q = quantize_fp8(w)
    xq, sx = quantize_rows_fp8_padded(x.to(device))
    return x, q, bias, xq[:m], sx[:m]


def _reference_on_codes(xq, sx, q: Fp8Weight, bias) -> torch.Tensor:
    """fp8_linear_reference's float32 W8A8 on the given activation codes and scales (the GPU's own)."""
    out = (xq.cpu().float() @ q.data.cpu().float().t()) * sx.cpu().reshape(-1, 1) * q.scale.cpu()[None, :]
    return out if bias is None else out + bias.float().cpu()


def _assert_matches(got, x, q: Fp8Weight, bias, xq, sx, out_dtype: torch.dtype) -> None:
    """`got` is the float32 W8A8 result on the codes xq, sx (in the interpreter also
    fp8_linear_reference's on x) rounded once to out_dtype, up to the summation:
    per element ``|got - want| <= half an ulp of out_dtype + acc_rel * sum_k |products|`` (+ |bias|).
    acc_rel: float32 summation order in the interpreter (2^-16); on a GPU the FP8 tensor cores sum each
    128 products at a reduced internal precision before they join the float32 accumulator (2^-10).
    Triton's interpreter truncates float32 to BF16 (a whole ulp), the GPU rounds to nearest."""
    assert got.dtype == out_dtype and tuple(got.shape) == (xq.shape[0], q.data.shape[0])
    want = _reference_on_codes(xq, sx, q, bias)
    if not got.is_cuda:  # (the interpreter's quantizer gives the reference's codes: check x's too)
        torch.testing.assert_close(want, fp8_linear_reference(x, q, bias), rtol=0, atol=0)
    codes = q.data.cpu().float()
    sw = q.scale.cpu()[None, :]
    mag = (xq.cpu().float().abs() @ codes.abs().t()) * sx.cpu().reshape(-1, 1) * sw
    if bias is not None:
        mag = mag + bias.float().abs()
    acc_rel = 2**-10 if got.is_cuda else 2**-16
    rel = _HALF_ULP[out_dtype] * (2 if out_dtype == torch.bfloat16 and not got.is_cuda else 1)
    tol = rel * (want.abs() + acc_rel * mag) + acc_rel * mag + 1e-7
    err = (got.float().cpu() - want).abs()
    worst = int((err - tol).argmax())
    assert (err <= tol).all(), (
        f"{int((err > tol).sum())} of {err.numel()} outputs off; worst at {divmod(worst, err.shape[1])}: "
        f"got {got.flatten()[worst].item()} want {want.flatten()[worst].item()} tol {tol.flatten()[worst]}"
    )


def _cfg(**kw):
    from trtforge.kernels.fp8_skinny import SkinnyConfig

    return SkinnyConfig(**kw)


# (m, n, k, config fields, bias, out dtype): N and K on and off the tiles, split-K 1/2/4, both orientations
CASES = [
    (1, 48, 200, {"block_n": 32, "block_k": 64}, True, torch.bfloat16),
    (1, 64, 256, {"block_n": 64, "block_k": 128, "split_k": 2}, False, torch.float32),
    (3, 48, 200, {"block_n": 16, "block_k": 64, "split_k": 2}, True, torch.float16),
    (3, 80, 200, {"block_n": 64, "block_k": 64, "swap_ab": True}, True, torch.bfloat16),
    (16, 64, 256, {"block_n": 32, "block_k": 128}, False, torch.bfloat16),
    (16, 72, 320, {"block_n": 64, "block_k": 64, "split_k": 4, "swap_ab": True}, True, torch.float32),
    (64, 40, 192, {"block_n": 32, "block_k": 64, "split_k": 2}, True, torch.bfloat16),
    (64, 64, 128, {"block_n": 16, "block_k": 64, "fast_accum": True}, False, torch.float16),
    (33, 128, 256, {"block_n": 64, "block_k": 128, "swap_ab": True, "split_k": 2}, False, torch.float16),
]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n", "k", "fields", "with_bias", "out_dtype"), CASES, ids=str)
def test_matches_the_w8a8_reference(device, m, n, k, fields, with_bias, out_dtype):
    from trtforge.kernels.fp8_skinny import fp8_skinny_gemm

    skip_unless_runs_here(device)
    x, q, bias, xq, sx = _operands(m, n, k, seed=m * 1000 + n + k, device=device)
    b = bias if with_bias else None
    got = fp8_skinny_gemm(
        xq,
        sx,
        q.data.to(device),
        q.scale.to(device),
        None if b is None else b.to(device),
        out_dtype=out_dtype,
        config=_cfg(**fields),
    )
    _assert_matches(got, x, q, b, xq, sx, out_dtype)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_default_config_and_scale_layouts(device):
    """The default config (no `config`), sx as the [M, 1] column the quantizer returns and as [M], a
    BF16 bias; and each output row is its own x row's product (one-hot weight rows pick columns)."""
    from trtforge.kernels.fp8_skinny import fp8_skinny_gemm

    skip_unless_runs_here(device)
    m, n, k = 5, 96, 256
    x, q, bias, xq, sx = _operands(m, n, k, seed=3, device=device)
    b16 = bias.bfloat16()
    for s in (sx, sx.reshape(m)):
        got = fp8_skinny_gemm(xq, s, q.data.to(device), q.scale.to(device), b16.to(device))
        _assert_matches(got, x, q, b16, xq, sx, torch.bfloat16)
    eye = torch.zeros(n, k)
    eye[torch.arange(n), torch.arange(n) * 2] = 1.0  # weight row j picks x column 2j
    got = fp8_skinny_gemm(
        xq, sx, eye.to(torch.float8_e4m3fn).to(device), torch.ones(n, device=device), out_dtype=torch.float32
    )
    assert torch.equal(got.cpu(), (xq.float() * sx).cpu()[:, 0 : 2 * n : 2])


@needs_triton
def test_split_k_slices_sum_to_the_unsplit_result():
    """split_k 1, 2 and 4 (and more slices asked than K holds chunks: fewer are launched) agree to
    float32 summation order."""
    from trtforge.kernels.fp8_skinny import fp8_skinny_gemm

    skip_unless_runs_here("cpu")
    x, q, _, xq, sx = _operands(4, 32, 192, seed=5, device="cpu")
    outs = []
    for s in (1, 2, 4):
        cfg = _cfg(block_n=16, block_k=64, split_k=s)
        outs.append(fp8_skinny_gemm(xq, sx, q.data, q.scale, out_dtype=torch.float32, config=cfg))
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outs[0], fp8_linear_reference(x, q), rtol=1e-6, atol=1e-6)


def _e4m3(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape).to(torch.float8_e4m3fn)


@needs_triton
@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"xq": _e4m3(65, 64), "sx": torch.ones(65)}, "xq must be 1..64 rows"),
        ({"xq": torch.zeros(2, 64, dtype=torch.float16)}, "xq must be float8_e4m3fn"),
        ({"w_data": torch.zeros(8, 64, dtype=torch.bfloat16)}, "w_data must be float8_e4m3fn"),
        ({"w_data": _e4m3(8, 48)}, r"w_data must be float8_e4m3fn \[N, 64\]"),
        ({"xq": _e4m3(64, 2).t()}, "xq must be .* unit stride along K"),
        ({"w_data": _e4m3(64, 8).t()}, "w_data must be .* unit stride along K"),
        ({"sx": torch.ones(2, dtype=torch.float16)}, "sx must be contiguous float32"),
        ({"sx": torch.ones(3)}, r"sx must be contiguous float32 \[2\]"),
        ({"w_scale": torch.ones(8, dtype=torch.bfloat16)}, "w_scale must be contiguous float32"),
        ({"w_scale": torch.ones(9)}, r"w_scale must be contiguous float32 \[8\]"),
        ({"bias": torch.ones(7)}, r"bias must be a contiguous float \[8\]"),
        ({"out_dtype": torch.int32}, "out_dtype must be one of"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_refuses_what_it_cannot_take(change, name):
    from trtforge.kernels.fp8_skinny import fp8_skinny_gemm

    args = {"xq": _e4m3(2, 64), "sx": torch.ones(2), "w_data": _e4m3(8, 64), "w_scale": torch.ones(8)}
    args |= {"bias": None, "out_dtype": torch.bfloat16} | change
    out_dtype = args.pop("out_dtype")
    with pytest.raises(ValueError, match=name):
        fp8_skinny_gemm(**args, out_dtype=out_dtype)


@needs_triton
def test_config_values_are_checked():
    with pytest.raises(ValueError, match="block_n must be one of"):
        _cfg(block_n=8)
    with pytest.raises(ValueError, match="split_k must be one of"):
        _cfg(split_k=3)
    with pytest.raises(ValueError, match="block_n must be >= 128 at 8 warps"):
        _cfg(block_n=64, num_warps=8, swap_ab=True)


@needs_triton
def test_default_config_follows_the_h200_sweep():
    """The rule the session-16 H200 sweep fits (Llama-3-8B projections): gate/up (N 28672) swapped with
    64 columns and no split; up to 16 rows swapped, chunks of 256; 17..64 rows x as the 64-row tile, 32
    columns, chunks of 256 only for down's K; two K slices while programs are few; none for a short K."""
    from trtforge.kernels.fp8_skinny import default_skinny_config

    gate_up = default_skinny_config(64, 28672, 4096)
    assert (gate_up.swap_ab, gate_up.block_n, gate_up.block_k, gate_up.num_stages, gate_up.split_k) == (
        True, 64, 128, 3, 1,
    )  # fmt: skip
    one = default_skinny_config(1, 4096, 14336)
    assert (one.swap_ab, one.block_n, one.block_k, one.split_k) == (True, 64, 256, 2)
    qkv = default_skinny_config(64, 6144, 4096)
    assert (qkv.swap_ab, qkv.block_n, qkv.block_k, qkv.split_k) == (False, 32, 128, 2)
    assert default_skinny_config(40, 4096, 14336).block_k == 256
    assert (
        default_skinny_config(16, 96, 512).block_k == 256 and default_skinny_config(16, 96, 512).split_k == 1
    )
    assert default_skinny_config(1, 512, 100).block_k == 128  # (no chunk wider than a short K)


# ---------------------------------------------------------------- sm_90 compile on the CPU


def _compile_facts(config_fields: dict, m: int, n: int, k: int) -> dict:
    """Compile the skinny kernel for sm_90 as the launcher would specialize it (M = 1 a constant)."""
    import triton

    from trtforge.kernels import fp8_skinny as fs

    cfg = fs.SkinnyConfig(**config_fields)
    bk = cfg.block_k
    k_split = triton.cdiv(triton.cdiv(k, bk), cfg.split_k) * bk
    pointers = {"X": "*fp8e4nv", "SX": "*fp32", "W": "*fp8e4nv", "WS": "*fp32", "Bias": "*fp32"}
    pointers |= {"Out": "*bf16", "Part": "*fp32"}
    ints = {"M": m, "N": n, "K": k, "stride_xm": k, "stride_wn": k, "stride_om": n, "k_split": k_split}
    consts = {
        "HAS_BIAS": False,
        "SPLIT": triton.cdiv(k, k_split),
        "EVEN_K": k % bk == 0,
        "SWAP": cfg.swap_ab,
        "IMPRECISE": None if cfg.fast_accum else min(fs.PRECISE_ACC_K, bk),
        "BLOCK_M": fs.block_rows(m, cfg),
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": bk,
    }
    if m == 1:
        consts["M"] = 1
    return compile_facts(fs._skinny_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages)


def _child_compile(config_fields: dict, m: int, n: int, k: int) -> dict:
    return run_in_child(f"{__name__}:_compile_facts", config_fields, m, n, k)


def test_default_config_compiles_to_fp8_wgmma_with_16_byte_weight_copies():
    """M = 64 on the qkv shape (x the A tile): the products are wgmma on E4M3 operands (the codes go
    from shared memory to the tensor cores: no conversion to f16, no mma.sync fallback), the x and
    weight tiles arrive by 16-byte cp.async (vectorized, pipelined), and ptxas assembles it without
    spills."""
    from trtforge.kernels.fp8_skinny import default_skinny_config

    needs_ptxas()
    cfg = default_skinny_config(64, 6144, 4096)
    facts = _child_compile(cfg.__dict__, 64, 6144, 4096)
    counts = facts["counts"]
    wgmma = {op: c for op, c in counts.items() if op.startswith("wgmma.mma_async")}
    assert wgmma and all(op.endswith(".f32.e4m3.e4m3") for op in wgmma), wgmma
    assert sum(wgmma.values()) == cfg.block_k // 32  # one m64nBNk32 per 32 of a chunk
    assert not any(op.startswith("mma.sync") or "f16x2.e4m3" in op for op in counts), counts
    # one stage's weight tile alone is block_n * block_k / 16 copies of 16 bytes among the threads
    assert facts["cp_async_16"] >= cfg.block_n * cfg.block_k // 16 // (32 * cfg.num_warps), facts
    assert not any(op.startswith(("ld.global.b8", "ld.global.u8")) for op in counts), counts
    assert facts["shared"] == cfg.num_stages * (64 + cfg.block_n) * cfg.block_k
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    assert facts["spills"] == [0], facts["ptxas"]


def test_swapped_orientation_compiles_to_fp8_wgmma_over_16_rows_of_x():
    """swap_ab at M = 1: the weight tile is the wgmma's A (64 rows), x its 16-wide B: m64n16k32."""
    needs_ptxas()
    fields = {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 4, "swap_ab": True}
    facts = _child_compile(fields, 1, 6144, 4096)
    wgmma = {op: c for op, c in facts["counts"].items() if op.startswith("wgmma.mma_async")}
    assert wgmma == {"wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3": 4}, wgmma
    assert facts["shared"] == 4 * (16 + 64) * 128
    assert facts["ptxas_rc"] == 0 and facts["spills"] == [0], facts["ptxas"]


# ---------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
def test_gpu_agrees_with_scaled_mm(m):
    """On the FP8 tensor cores for real, a Llama-sized K: the default config and the swapped one against
    ``torch._scaled_mm`` (today's W8A8 path, BF16 out) and the float32 reference."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.fp8_skinny import fp8_skinny_gemm

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("wgmma needs Hopper (sm_90)")
    g = torch.Generator(device="cuda").manual_seed(m)
    n, k = 1024, 4096
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    q = quantize_fp8(torch.randn(n, k, device="cuda", generator=g) * 0.02)
    xq, sx = quantize_rows_fp8_padded(x)
    ref = torch._scaled_mm(
        xq, q.data.t(), scale_a=sx, scale_b=q.scale[None, :], out_dtype=torch.bfloat16, use_fast_accum=False
    )[:m].float()
    swapped = _cfg(block_n=64, block_k=128, swap_ab=True)
    for cfg in (None, swapped, _cfg(block_n=32, block_k=256, split_k=2)):
        got = fp8_skinny_gemm(xq[:m], sx[:m], q.data, q.scale, config=cfg).float()
        assert ((got - ref).norm() / ref.norm()).item() < 5e-3, cfg
        qc = Fp8Weight(q.data.cpu(), q.scale.cpu())
        _assert_matches(got.bfloat16(), x.cpu().float(), qc, None, xq[:m], sx[:m], torch.bfloat16)


@pytest.mark.gpu
def test_gpu_weight_object_and_graph_capture():
    """An Fp8Weight's fields as they are stored, and the launch (both kernels of split-K) inside a CUDA
    graph, as the serving path would run it."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.fp8_skinny import fp8_skinny_gemm

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("wgmma needs Hopper (sm_90)")
    g = torch.Generator(device="cuda").manual_seed(0)
    w = quantize_fp8(torch.randn(512, 2048, device="cuda", generator=g))
    x = torch.randn(8, 2048, device="cuda", generator=g, dtype=torch.bfloat16)
    xq, sx = quantize_rows_fp8_padded(x)
    cfg = _cfg(block_n=32, block_k=128, split_k=4)
    eager = fp8_skinny_gemm(xq[:8], sx[:8], w.data, w.scale, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_skinny_gemm(xq[:8], sx[:8], w.data, w.scale, config=cfg)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)  # split-K sums its slices in a fixed order: bitwise reproducible
