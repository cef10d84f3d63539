"""The mid-sized 16-bit GEMM (trtforge.kernels.gemm_mid): ``x @ w^T`` (+ bias or + residual) for
decode-sized batches.

Against the float32 product rounded once: M from 1 to 260, N and K on and off the tiles, BF16 and FP16,
each epilogue, split-K 1/2/3, in Triton's CPU interpreter without CUDA and for real on a GPU (``-m
gpu``); the refusals; the default config's rule; an sm_90 compile on the CPU (the products are BF16
wgmma, no spills); on a GPU, cuBLAS's ``F.linear`` / ``addmm`` as the peers, a CUDA graph, and the
fused layer's dispatch when turned on.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests.kernels._sm90 import compile_facts, needs_ptxas, run_in_child

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
_ULP = {torch.bfloat16: 2**-7, torch.float16: 2**-10}  # one ulp at 1.0


def _cfg(**kw):
    from trtforge.kernels.gemm_mid import MidConfig

    return MidConfig(**kw)


def _operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    """x [m, k] with rows of different magnitudes, w [n, k], a bias [n] and a residual [m, n]."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * torch.logspace(-1, 1, m)[:, None]).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    residual = torch.randn(m, n, generator=g).to(dtype)
    return x, w, bias, residual


def _assert_matches(got: torch.Tensor, x, w, bias, residual) -> None:
    """`got` is the float32 product (+ epilogue) rounded once to x's dtype, up to FP32 summation order:
    per element ``|got - want| <= one ulp of |want| + 2^-14 sum_k |products|`` (a whole ulp: the
    interpreter truncates float32 to BF16)."""
    assert got.dtype == x.dtype and tuple(got.shape) == (x.shape[0], w.shape[0])
    xf, wf = x.float().cpu(), w.float().cpu()
    want = xf @ wf.t()
    mag = xf.abs() @ wf.abs().t()
    if bias is not None:
        want, mag = want + bias.float().cpu(), mag + bias.float().cpu().abs()
    if residual is not None:
        want, mag = want + residual.float().cpu(), mag + residual.float().cpu().abs()
    tol = _ULP[x.dtype] * want.abs() + 2**-14 * mag + 1e-6
    err = (got.float().cpu() - want).abs()
    worst = int((err - tol).argmax())
    assert (err <= tol).all(), (
        f"{int((err > tol).sum())} of {err.numel()} outputs off; worst at {divmod(worst, err.shape[1])}: "
        f"got {got.flatten()[worst].item()} want {want.flatten()[worst].item()} tol {tol.flatten()[worst]}"
    )


# (m, n, k, config fields, epilogue, dtype): M, N and K on and off the tiles; split-K 1/2/3
CASES = [
    (1, 32, 64, {"block_m": 64, "block_n": 32, "block_k": 32}, "residual", torch.bfloat16),
    (5, 48, 200, {"block_m": 64, "block_n": 32, "block_k": 32}, "bias", torch.bfloat16),
    (70, 96, 256, {"block_m": 64, "block_n": 64, "block_k": 64, "split_k": 2}, "residual", torch.float16),
    (130, 64, 192, {"block_m": 128, "block_n": 64, "block_k": 32, "split_k": 3}, None, torch.bfloat16),
    (200, 160, 96, {"block_m": 128, "block_n": 128, "block_k": 32, "split_k": 2}, "bias", torch.float16),
    (260, 40, 128, {"block_m": 128, "block_n": 32, "block_k": 64}, "residual", torch.bfloat16),
]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n", "k", "fields", "epilogue", "dtype"), CASES, ids=str)
def test_matches_the_float32_product(device, m, n, k, fields, epilogue, dtype):
    from trtforge.kernels.gemm_mid import mid_gemm

    skip_unless_runs_here(device)
    x, w, bias, residual = _operands(m, n, k, dtype, seed=m * 1000 + n + k)
    b = bias if epilogue == "bias" else None
    r = residual if epilogue == "residual" else None
    got = mid_gemm(
        x.to(device),
        w.to(device),
        None if b is None else b.to(device),
        None if r is None else r.to(device),
        config=_cfg(**fields),
    )
    _assert_matches(got, x, w, b, r)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_default_config_strided_rows_and_split_slices(device):
    """The default config; x and the residual as row views of wider tensors (stride along M not K);
    split_k 1, 2, 3 and more slices asked than K has chunks agree within an ulp."""
    from trtforge.kernels.gemm_mid import mid_gemm

    skip_unless_runs_here(device)
    x, w, _, residual = _operands(9, 72, 512, torch.bfloat16, seed=2)
    wide_x = torch.zeros(9, 600, dtype=torch.bfloat16)
    wide_x[:, 20:532] = x
    wide_r = torch.zeros(9, 80, dtype=torch.bfloat16)
    wide_r[:, 3:75] = residual
    xs, rs = wide_x.to(device)[:, 20:532], wide_r.to(device)[:, 3:75]
    got = mid_gemm(xs, w.to(device), residual=rs)
    _assert_matches(got, x, w, None, residual)
    outs = [mid_gemm(xs, w.to(device), config=_cfg(block_m=64, block_k=64, split_k=s)) for s in (1, 2, 3, 4)]
    for o in outs[1:]:
        torch.testing.assert_close(o.float(), outs[0].float(), rtol=2**-7, atol=1e-3)


def test_default_config_rule():
    """About one program per SM: wide tiles where the output has many (gate/up at 256 rows), 64 columns
    where it has few, K split while fewer than half the SMs have a tile; 64-row tiles up to 64 rows."""
    from trtforge.kernels.gemm_mid import default_mid_config

    gate_up = default_mid_config(256, 28672, 4096)
    assert (gate_up.block_m, gate_up.block_n, gate_up.num_warps, gate_up.split_k) == (128, 256, 8, 1)
    o = default_mid_config(256, 4096, 4096)  # 2 x 64 tiles of 64 columns: 128, a wave
    assert (o.block_n, o.split_k) == (64, 1)
    small = default_mid_config(64, 4096, 4096)  # 64 tiles of 64 x 64: K in two slices
    assert (small.block_m, small.block_n, small.split_k) == (64, 64, 2)
    assert default_mid_config(16, 1024, 256).split_k == 1  # 4 chunks of K: no slices of them
    assert default_mid_config(512, 6144, 4096).block_n == 128


def test_fp8_config_rule_follows_the_h200_sweep():
    """W8A8: the best configs of session 17's sweep at 8B shapes. 64-row tiles of 64 columns, K in two
    slices, where the output is small (o at 128 rows); 128 columns with K split for the long down
    projection; one slice once the tiles fill 1.5x the SMs (o at 256 rows); 128 columns for wide outputs."""
    from trtforge.kernels.gemm_mid import default_mid_config

    def key(c):
        return (c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages, c.split_k)

    assert key(default_mid_config(128, 4096, 4096, fp8=True)) == (64, 64, 128, 4, 4, 2)
    assert key(default_mid_config(256, 4096, 4096, fp8=True)) == (64, 64, 128, 4, 4, 1)
    assert key(default_mid_config(128, 4096, 14336, fp8=True)) == (64, 128, 128, 4, 4, 2)
    assert key(default_mid_config(256, 4096, 14336, fp8=True)) == (64, 128, 128, 4, 4, 2)
    assert key(default_mid_config(128, 28672, 4096, fp8=True)) == (64, 128, 128, 4, 4, 1)
    assert default_mid_config(16, 1024, 1024, fp8=True).split_k == 1  # 8 chunks of K: too few to split


def test_fp8_mid_dispatch_only_where_the_output_leaves_sms_idle():
    """``fp8_mid_wins``: 64 x 64 output tiles under 2x the SMs (the sweep's o and down at 128 and 256
    rows won); gate/up, and everything at 512 rows, stay on cuBLASLt. The SM count scales the bound."""
    from trtforge.kernels.gemm_mid import fp8_mid_wins

    assert fp8_mid_wins(128, 4096) and fp8_mid_wins(256, 4096)
    assert not fp8_mid_wins(256, 6144) and not fp8_mid_wins(128, 28672) and not fp8_mid_wins(512, 4096)
    assert not fp8_mid_wins(256, 4096, num_sms=64) and fp8_mid_wins(512, 4096, num_sms=264)


@needs_triton
@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"x": torch.zeros(0, 64, dtype=torch.bfloat16)}, "x must be a BF16 or FP16"),
        (
            {"x": torch.zeros(2, 0, dtype=torch.bfloat16), "w": torch.zeros(8, 0, dtype=torch.bfloat16)},
            "K >= 1",
        ),
        ({"x": torch.zeros(2, 64)}, "x must be a BF16 or FP16"),
        ({"x": torch.zeros(64, 2, dtype=torch.bfloat16).t()}, "x must be a BF16 or FP16"),
        ({"w": torch.zeros(8, 64, dtype=torch.float16)}, r"w must be torch.bfloat16 \[N, 64\]"),
        ({"w": torch.zeros(8, 48, dtype=torch.bfloat16)}, r"w must be torch.bfloat16 \[N, 64\]"),
        ({"bias": torch.zeros(7)}, r"bias must be a contiguous float \[8\]"),
        ({"residual": torch.zeros(2, 7)}, r"residual must be a float \[2, 8\]"),
        ({"bias": torch.zeros(8), "residual": torch.zeros(2, 8)}, "a bias or a residual, not both"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_refuses_what_it_cannot_take(change, name):
    from trtforge.kernels.gemm_mid import mid_gemm

    args = {"x": torch.zeros(2, 64, dtype=torch.bfloat16), "w": torch.zeros(8, 64, dtype=torch.bfloat16)}
    args |= {"bias": None, "residual": None} | change
    with pytest.raises(ValueError, match=name):
        mid_gemm(**args)


FP8_CASES = [
    (3, 48, 200, {"block_m": 64, "block_n": 32, "block_k": 64}, "bias", torch.bfloat16),
    (70, 96, 256, {"block_m": 64, "block_n": 64, "block_k": 128, "split_k": 2}, "residual", torch.bfloat16),
    (130, 64, 384, {"block_m": 128, "block_n": 64, "block_k": 128, "split_k": 3}, None, torch.float16),
    (65, 40, 128, {"block_m": 64, "block_n": 32, "block_k": 64}, "residual", torch.float32),
]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "n", "k", "fields", "epilogue", "out_dtype"), FP8_CASES, ids=str)
def test_fp8_matches_the_w8a8_product_on_the_same_codes(device, m, n, k, fields, epilogue, out_dtype):
    """W8A8 (E4M3 activations quantized per row by fp8_rows, per-channel E4M3 weights): the FP32 product
    of the codes times both scales, + the bias or residual, rounded once to out_dtype; within FP32
    summation (2^-16 of the products' magnitude) in the interpreter, the tensor cores' reduced-precision
    chains of 128 products (2^-10) on a GPU."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.gemm_mid import mid_gemm_fp8
    from trtforge.kernels.qweight import quantize_fp8

    skip_unless_runs_here(device)
    x, w, bias, residual = _operands(m, n, k, torch.bfloat16, seed=m + 7 * n + k)
    q = quantize_fp8(w.float())
    xq, sx = quantize_rows_fp8_padded(x.to(device))
    xq, sx = xq[:m], sx[:m]
    b = bias if epilogue == "bias" else None
    r = residual if epilogue == "residual" else None
    got = mid_gemm_fp8(
        xq,
        sx,
        q.data.to(device),
        q.scale.to(device),
        None if b is None else b.to(device),
        None if r is None else r.to(device),
        out_dtype=out_dtype,
        config=_cfg(**fields),
    )
    assert got.dtype == out_dtype and tuple(got.shape) == (m, n)
    a = xq.cpu().float() * sx.cpu().reshape(m, 1)
    wf = q.data.float() * q.scale[:, None]
    want, mag = a @ wf.t(), a.abs() @ wf.abs().t()
    for extra in (b, r):
        if extra is not None:
            want, mag = want + extra.float(), mag + extra.float().abs()
    acc_rel = 2**-10 if got.is_cuda else 2**-16
    ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-22}[out_dtype]
    tol = ulp * want.abs() + acc_rel * mag + 1e-6
    err = (got.float().cpu() - want).abs()
    assert (err <= tol).all(), (
        f"{int((err > tol).sum())} of {err.numel()} off, worst {float((err - tol).max())}"
    )


@needs_triton
@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"xq": torch.zeros(2, 64, dtype=torch.bfloat16)}, "xq must be float8_e4m3fn"),
        ({"w_data": torch.zeros(8, 64, dtype=torch.bfloat16)}, "w_data must be float8_e4m3fn"),
        ({"sx": torch.ones(3)}, r"sx must be contiguous float32 \[2\]"),
        ({"w_scale": torch.ones(8, dtype=torch.float16)}, "w_scale must be contiguous float32"),
        ({"out_dtype": torch.int8}, "out_dtype must be BF16, FP16 or FP32"),
        ({"residual": torch.zeros(3, 8)}, r"residual must be a float \[2, 8\]"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_fp8_refuses_what_it_cannot_take(change, name):
    from trtforge.kernels.gemm_mid import mid_gemm_fp8

    e4m3 = torch.float8_e4m3fn
    args = {"xq": torch.zeros(2, 64).to(e4m3), "sx": torch.ones(2), "w_data": torch.zeros(8, 64).to(e4m3)}
    args |= {"w_scale": torch.ones(8), "bias": None, "residual": None, "out_dtype": torch.bfloat16} | change
    out_dtype = args.pop("out_dtype")
    with pytest.raises(ValueError, match=name):
        mid_gemm_fp8(**args, out_dtype=out_dtype)


@needs_triton
def test_config_values_are_checked():
    with pytest.raises(ValueError, match="block_m must be one of"):
        _cfg(block_m=32)
    with pytest.raises(ValueError, match="split_k must be one of"):
        _cfg(split_k=5)


@pytest.mark.parametrize("method", ["fp8", "int4"])
def test_quant_linear_adds_the_residual_as_the_fused_layer_did(method):
    """``quant_linear(x, w, residual=r)`` is ``r + quant_linear(x, w)`` bit for bit where nothing folds it
    (the CPU, FP8 at 1 and 9 rows): the fused layers moved the add into it without changing a value."""
    from trtforge.kernels.qweight import quantize_fp8, quantize_int4
    from trtforge.llm.quant.linear import quant_linear

    g = torch.Generator().manual_seed(5)
    w = torch.randn(96, 128, generator=g) * 0.05
    q = quantize_fp8(w) if method == "fp8" else quantize_int4(w)
    for m in (1, 9):
        x = torch.randn(2, m, 128, generator=g).to(torch.bfloat16)
        r = torch.randn(2, m, 96, generator=g).to(torch.bfloat16)
        assert torch.equal(quant_linear(x, q, residual=r), r + quant_linear(x, q))


def test_off_by_default_and_never_on_the_cpu(monkeypatch):
    """The fused layer's 16-bit dispatch: off (both limits 0: cuBLAS won every 8B shape on the H200);
    turned on, still not for CPU tensors, quantized weights or another dtype than x's."""
    import trtforge.llm.executors.fused_layers as fl

    assert fl.MID_GEMM_MIN_TOKENS == fl.MID_GEMM_MAX_TOKENS == 0
    x = torch.zeros(128, 64, dtype=torch.bfloat16)
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    assert not fl._use_mid_gemm(x, w)
    monkeypatch.setattr(fl, "MID_GEMM_MIN_TOKENS", 2)
    monkeypatch.setattr(fl, "MID_GEMM_MAX_TOKENS", 512)
    assert not fl._use_mid_gemm(x, w)  # CPU
    assert not fl._use_mid_gemm(x, object())  # a quantized weight
    assert not fl._use_mid_gemm(x, w.float())


# ---------------------------------------------------------------- sm_90 compile on the CPU


def _compile_facts(config_fields: dict, m: int, n: int, k: int, fp8: bool = False) -> dict:
    """Compile the kernel for sm_90 as the launcher specializes it, the residual epilogue on."""
    import triton

    from trtforge.kernels import gemm_mid as gm

    cfg = gm.MidConfig(**config_fields)
    bk = cfg.block_k
    k_split = triton.cdiv(triton.cdiv(k, bk), cfg.split_k) * bk
    elem = "*fp8e4nv" if fp8 else "*bf16"
    pointers = {"X": elem, "W": elem, "SX": "*fp32", "WS": "*fp32", "Bias": "*bf16", "Res": "*bf16"}
    pointers |= {"Out": "*bf16", "Part": "*fp32"}
    ints = {"M": m, "N": n, "K": k, "stride_xm": k, "stride_wn": k, "stride_rm": n, "stride_om": n}
    ints["k_split"] = k_split
    consts = {
        "EPILOGUE": 2,
        "SPLIT": triton.cdiv(k, k_split),
        "EVEN_K": k % bk == 0,
        "DOT_F32": False,
        "SCALED": fp8,
        "IMPRECISE": min(gm.PRECISE_ACC_K, bk) if fp8 else None,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": bk,
    }
    return compile_facts(gm._mid_gemm_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages)


def _child_compile(config_fields: dict, m: int, n: int, k: int, fp8: bool = False) -> dict:
    return run_in_child(f"{__name__}:_compile_facts", config_fields, m, n, k, fp8)


def test_fp8_default_config_compiles_to_e4m3_wgmma_without_spills():
    """W8A8 at 256 rows of the o projection: the products are ``wgmma ... .f32.e4m3.e4m3`` (the codes go
    from shared memory to the tensor cores unconverted), ptxas assembles it without spills."""
    needs_ptxas()
    from trtforge.kernels.gemm_mid import default_mid_config

    cfg = default_mid_config(256, 4096, 4096, fp8=True)
    facts = _child_compile(cfg.__dict__, 256, 4096, 4096, True)
    wgmma = {op: c for op, c in facts["counts"].items() if op.startswith("wgmma.mma_async")}
    assert wgmma and all(op.endswith(".f32.e4m3.e4m3") for op in wgmma), wgmma
    assert not any(op.startswith("mma.sync") or "f16x2.e4m3" in op for op in facts["counts"]), facts["counts"]
    assert facts["ptxas_rc"] == 0 and facts["spills"] == [0], facts["ptxas"]


@pytest.mark.parametrize(("m", "n", "k"), [(256, 4096, 4096), (256, 28672, 4096)], ids=["o", "gate_up"])
def test_default_config_compiles_to_bf16_wgmma_without_spills(m, n, k):
    """The default config at 256 rows of the o projection (128 x 64 tiles, 4 warps) and of gate/up
    (128 x 256, 8 warps): the products are ``wgmma ... .f32.bf16.bf16`` (no mma.sync fallback), the
    pipeline's tiles fit in shared memory and ptxas assembles it without spills."""
    needs_ptxas()
    from trtforge.kernels.gemm_mid import default_mid_config

    cfg = default_mid_config(m, n, k)
    facts = _child_compile(cfg.__dict__, m, n, k)
    wgmma = {op: c for op, c in facts["counts"].items() if op.startswith("wgmma.mma_async")}
    assert wgmma and all(op.endswith(".f32.bf16.bf16") for op in wgmma), wgmma
    assert not any(op.startswith("mma.sync") for op in facts["counts"]), facts["counts"]
    assert facts["shared"] >= (cfg.num_stages - 1) * (cfg.block_m + cfg.block_n) * cfg.block_k * 2
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    assert facts["spills"] == [0], facts["ptxas"]


# ---------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 256, 300])
def test_gpu_agrees_with_cublas_at_llama_shapes(m):
    """BF16 at Llama-3-8B's o and gate/up shapes against ``F.linear`` and ``addmm`` (cuBLAS), the
    default config and a split one; and inside a CUDA graph, bit-equal to the eager launch."""
    from trtforge.kernels.gemm_mid import mid_gemm

    g = torch.Generator(device="cuda").manual_seed(m)
    for n, k in ((4096, 4096), (28672, 4096)):
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02
        res = torch.randn(m, n, device="cuda", generator=g, dtype=torch.bfloat16)
        for cfg in (None, _cfg(block_m=64, block_n=64, split_k=2)):
            got = mid_gemm(x, w, residual=res, config=cfg).float()
            ref = torch.addmm(res, x, w.t()).float()
            assert ((got - ref).norm() / ref.norm()).item() < 5e-3, (n, k, cfg)
        plain = mid_gemm(x, w).float()
        ref = torch.nn.functional.linear(x, w).float()
        assert ((plain - ref).norm() / ref.norm()).item() < 5e-3
    eager = mid_gemm(x, w, residual=res, config=_cfg(block_m=64, split_k=2))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mid_gemm(x, w, residual=res, config=_cfg(block_m=64, split_k=2))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [65, 256])
def test_gpu_fp8_agrees_with_scaled_mm_and_quant_linear_dispatches_to_it(monkeypatch, m):
    """W8A8 at Llama-3-8B's o shape against ``torch._scaled_mm`` on the same codes (default config and a
    split one); ``quant_linear`` with FP8_MID_MAX_TOKENS turned on gives the same as the kernel, adds a
    residual after it or (FP8_MID_FOLD_RESIDUAL) in its epilogue, and gives cuBLASLt's result where
    ``fp8_mid_wins`` says no."""
    import trtforge.llm.quant.linear as linear
    from trtforge.kernels import gemm_mid
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.gemm_mid import mid_gemm_fp8
    from trtforge.kernels.qweight import quantize_fp8

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("wgmma needs Hopper (sm_90)")
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 4096, device="cuda", generator=g, dtype=torch.bfloat16)
    q = quantize_fp8(torch.randn(4096, 4096, device="cuda", generator=g) * 0.02)
    xq, sx = quantize_rows_fp8_padded(x)
    ref = torch._scaled_mm(
        xq, q.data.t(), scale_a=sx, scale_b=q.scale[None, :], out_dtype=torch.float32, use_fast_accum=False
    )[:m]
    for cfg in (None, _cfg(block_m=64, block_n=64, block_k=128, split_k=2)):
        got = mid_gemm_fp8(xq[:m], sx[:m], q.data, q.scale, out_dtype=torch.float32, config=cfg)
        assert ((got - ref).norm() / ref.norm()).item() < 1e-4, cfg
    monkeypatch.setattr(linear, "FP8_MID_MAX_TOKENS", 0)
    cublas = linear.quant_linear(x, q)
    monkeypatch.setattr(linear, "FP8_MID_MAX_TOKENS", 512)
    via = linear.quant_linear(x, q)
    assert torch.equal(via, mid_gemm_fp8(xq[:m], sx[:m], q.data, q.scale, out_dtype=torch.bfloat16))
    res = torch.randn(m, 4096, device="cuda", generator=g, dtype=torch.bfloat16)
    assert torch.equal(linear.quant_linear(x, q, residual=res), res + via)  # not folded: an add after
    monkeypatch.setattr(linear, "FP8_MID_FOLD_RESIDUAL", True)  # folded: into the FP32 sum
    folded = linear.quant_linear(x, q, residual=res)
    want = mid_gemm_fp8(xq[:m], sx[:m], q.data, q.scale, residual=res, out_dtype=torch.bfloat16)
    assert torch.equal(folded, want)
    exact = ref + res.float()
    assert ((folded.float() - exact).norm() / exact.norm()).item() < 4e-3  # one BF16 rounding
    monkeypatch.setattr(gemm_mid, "fp8_mid_wins", lambda *_: False)  # an output too wide for it
    assert torch.equal(linear.quant_linear(x, q), cublas)


@pytest.mark.gpu
def test_gpu_fused_layers_take_the_mid_gemm_when_turned_on(monkeypatch):
    """Served steps (prompt chunks, mixed steps, decode graphs) of a small Llama in FP16 with the
    dispatch on for every token count from 2, in lockstep with the same executor on cuBLAS: the logits
    agree within the Triton executor test's tolerance, no clear greedy pick flips, and the kernel ran."""
    import copy

    import numpy as np

    import trtforge.llm.executors.fused_layers as fl
    from tests.llm.serving_models import run_to_completion, tiny_llama
    from tests.llm.test_triton_executor import _Lockstep
    from trtforge.llm.engine import make_step_loop
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.sched.scheduler import SchedulerConfig

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the mid-sized GEMM is dispatched on Hopper only")
    calls = []
    real = fl.mid_gemm
    monkeypatch.setattr(fl, "mid_gemm", lambda *a, **kw: calls.append(1) or real(*a, **kw))

    class MidOn:  # the tested executor's steps (and graph captures) run with the dispatch on
        def __init__(self, ex: TorchExecutor) -> None:
            self.ex = ex

        def __getattr__(self, name):
            return getattr(self.ex, name)

        def step(self, batch):
            fl.MID_GEMM_MIN_TOKENS, fl.MID_GEMM_MAX_TOKENS = 2, 4096
            try:
                return self.ex.step(batch)
            finally:
                fl.MID_GEMM_MIN_TOKENS = fl.MID_GEMM_MAX_TOKENS = 0

    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 300, size=int(rng.integers(1, 70))).tolist() for _ in range(9)]
    params = [SamplingParams(max_tokens=int(rng.integers(2, 14)), ignore_eos=True) for _ in prompts]
    base = copy.deepcopy(tiny_llama()).half()
    kwargs = {"num_blocks": 96, "block_size": 16, "device": "cuda", "max_decode_batch": 8}
    ref = TorchExecutor(copy.deepcopy(base), kernels="triton", **kwargs)
    test = TorchExecutor(copy.deepcopy(base), kernels="triton", **kwargs)
    both = _Lockstep(ref, MidOn(test), rel_tol=2e-2)
    config = SchedulerConfig(
        max_num_batched_tokens=48, max_prefill_chunk=24, max_prefill_tokens_with_decodes=16
    )
    loop = make_step_loop(both, config)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        loop.add_request(i, p, sp)
    done = run_to_completion(loop)
    assert not [v.error for v in done.values() if v.error is not None]
    assert calls, "the mid-sized GEMM never ran"
    assert both.mixed_steps > 0 and both.decode_steps > 0
    assert both.max_rel_err < both.rel_tol
    assert both.flipped == 0
