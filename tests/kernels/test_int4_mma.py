"""The one-row INT4 GEMV on the tensor cores (trtforge.kernels.int4_mma).

On the CPU: the packed words hold each code where the ``mma.m16n8k16`` fragment tables (PTX ISA) put
its row and k for the x fragments the kernel loads (:func:`~trtforge.kernels.int4_mma.emulate`, written
from the tables, not from the packing); the kernel compiles for sm_90a with ``mma.sync`` and no
spills. On a GPU (``-m gpu``): the three forms (norm, gated SiLU, residual) against float32
``x @ dequantize(W)^T`` and the FMA kernel, in BF16 and FP16, and the dispatch from :mod:`gemv`.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import skip_unless_runs_here
from tests.kernels._sm90 import assemble, compile_sm90, needs_ptxas, run_in_child
from trtforge.kernels.qweight import quantize_int4

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


@needs_triton
@pytest.mark.parametrize(("n", "k"), [(16, 128), (48, 384), (32, 1024)])
def test_packed_words_sit_where_the_mma_fragment_tables_put_them(n, k):
    from trtforge.kernels.int4_mma import emulate, pack_int4_mma

    g = torch.Generator().manual_seed(n + k)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    x = torch.randn(k, generator=g, dtype=torch.float64)
    words = pack_int4_mma(codes)
    assert words.shape == (n // 16, k // 128, 32, 8) and words.dtype == torch.int32
    assert torch.allclose(emulate(words, x), codes.double() @ x, rtol=0, atol=1e-9)
    swapped = codes.clone()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]  # two k of one row exchanged: the sums must notice
    if not torch.equal(swapped, codes):
        assert not torch.allclose(emulate(pack_int4_mma(swapped), x), codes.double() @ x, atol=1e-6)


@needs_triton
def test_packing_refuses_partial_tiles_and_groups():
    from trtforge.kernels.int4_mma import pack_int4_mma

    with pytest.raises(ValueError, match="tiles of 16"):
        pack_int4_mma(torch.zeros(40, 128, dtype=torch.uint8))
    with pytest.raises(ValueError, match="groups of 128"):
        pack_int4_mma(torch.zeros(32, 192, dtype=torch.uint8))


def _compile_case(
    norm: bool,
    gated: bool,
    res: bool,
    bf16: bool,
    pdl: bool,
    k: int = 0,
    first_early: bool = False,
    one_pass: bool = False,
    maxnreg: int | None = None,
) -> dict:
    from triton.experimental.gluon._runtime import GluonASTSource

    from trtforge.kernels import int4_mma as m

    fn = m._int4_mma_kernel
    dt = "bf16" if bf16 else "fp16"
    ptrs = {"X": f"*{dt}", "Wm": "*i32", "Scales": "*fp16", "Offsets": "*fp16", "Out": f"*{dt}",
            "Res": f"*{dt}", "NormW": f"*{dt}"}  # fmt: skip
    k = k or (4096 if norm else 14336)
    warps, u = m.launch_rule(k, gated, norm)
    consts = {"NORM": norm, "GATED": gated, "HAS_RES": res, "NW": warps, "R": 2 if gated else 1,
              "BF16": bf16, "KW": k // 2 if norm else 0, "U": u, "PDL": pdl,
              "FIRST_EARLY": first_early, "ONE_PASS": one_pass}  # fmt: skip
    names = fn.arg_names
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "fp32" if a == "eps" else "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in ptrs}
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    kernel = compile_sm90(src, options)
    ptx = kernel.asm["ptx"]
    facts = {"mma": ptx.count("mma.sync.aligned.m16n8k16"), "shared": kernel.metadata.shared,
             "griddep": ptx.count("griddepcontrol."),
             "prefetch": ptx.count("prefetch.global.L2")}  # fmt: skip
    return facts | assemble(ptx)


@needs_triton
@pytest.mark.parametrize(
    ("norm", "gated", "res"), [(True, False, False), (True, True, False), (False, False, True)]
)
@pytest.mark.parametrize(("bf16", "pdl"), [(True, False), (False, False), (True, True)])
def test_compiles_for_sm90_with_mma_and_no_spills(norm, gated, res, bf16, pdl):
    needs_ptxas()
    facts = run_in_child(f"{__name__}:_compile_case", norm, gated, res, bf16, pdl)
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    # a group: 8 k-tiles of each tile (2 when gated) and of the ones tile (x's sums)
    assert facts["mma"] >= 8 * ((2 if gated else 1) + 1), facts
    assert not any(facts["spills"]), facts["ptxas"]
    assert facts["shared"] <= (8192 if norm else 1024)  # the staged row (K = 4096) or the warps' sums
    # PDL: the wait and the early trigger, after a prefetch of the first group(s) of words
    assert facts["griddep"] == (2 if pdl else 0) and (facts["prefetch"] > 0) == pdl


@needs_triton
@pytest.mark.parametrize(
    ("norm", "gated", "res"), [(True, False, False), (True, True, False), (False, False, True)]
)
@pytest.mark.parametrize("one_pass", [False, True])
def test_first_loads_before_the_wait_compile_for_sm90(norm, gated, res, one_pass):
    """FIRST_LOADS_EARLY: the first groups' words go to registers before the PDL wait, so no L2
    prefetch of them is issued; ONE_PASS_NORM: the prologue's row read once; no spills in any form
    (at ptxas's own register count)."""
    needs_ptxas()
    facts = run_in_child(f"{__name__}:_compile_case", norm, gated, res, True, True, 0, True, one_pass)
    assert facts["ptxas_rc"] == 0 and not any(facts["spills"]), facts["ptxas"]
    assert facts["griddep"] == 2 and facts["prefetch"] == 0, facts


@needs_triton
def test_the_gated_form_at_its_register_cap_barely_spills():
    """The gated form (gate_up) runs at GATED_MAXNREG with PDL, as launched. Its loop's constants set up
    before the wait and the prologue once raised the spill from 16 bytes to 204, and the 8B INT4 single
    stream went from 2.05 to 2.88 ms/token; the cap is only worth it while ptxas spills next to nothing."""
    from trtforge.kernels import int4_mma as m

    needs_ptxas()
    assert m.GATED_MAXNREG
    facts = run_in_child(
        f"{__name__}:_compile_case", True, True, False, True, True, 0, False, False, m.GATED_MAXNREG
    )
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    assert max(facts["spills"]) <= 32, facts["ptxas"]


def test_each_form_launches_with_its_own_register_cap(monkeypatch):
    """NORM_MAXNREG caps the norm form (QKV) alone, GATED_MAXNREG the gated form; MAXNREG overrides both."""
    from trtforge.kernels import int4_mma as m

    monkeypatch.setattr(m, "NORM_MAXNREG", 88)
    assert (m.register_cap(False, True), m.register_cap(True, True), m.register_cap(False, False)) == (
        88,
        m.GATED_MAXNREG,
        None,
    )
    monkeypatch.setattr(m, "MAXNREG", 128)
    assert {m.register_cap(g, n) for g, n in ((False, True), (True, True), (False, False))} == {128}


@needs_triton
def test_the_norm_form_at_a_cap_of_88_compiles_without_spills():
    """int4_mma.NORM_MAXNREG, the norm form's cap (88: session 56 measured the 8B INT4 single stream 2%
    faster with it): the norm form as launched (PDL, first loads early) fits it without spilling."""
    from trtforge.kernels import int4_mma as m

    needs_ptxas()
    assert m.NORM_MAXNREG == 88
    facts = run_in_child(f"{__name__}:_compile_case", True, False, False, True, True, 0, True, False, 88)
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    assert not any(facts["spills"]), facts["ptxas"]


@needs_triton
@pytest.mark.parametrize("k", [3072, 5120])
def test_the_normalized_row_of_any_whole_k_compiles(k):
    """Hidden sizes that are no power of two (3072: Llama-3.2-3B, 5120: 13B-class): the staged row is
    padded to one, as every Triton shape must be."""
    needs_ptxas()
    facts = run_in_child(f"{__name__}:_compile_case", True, False, False, True, False, k)
    assert facts["ptxas_rc"] == 0 and not any(facts["spills"]), facts["ptxas"]


def _operands(n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, k, generator=g) * 2).to(dtype)
    nw = (torch.rand(k, generator=g) + 0.5).to(dtype)
    q = quantize_int4(torch.randn(n, k, generator=g) / k**0.5)
    return x, nw, q


def _rms(x: torch.Tensor, nw: torch.Tensor) -> torch.Tensor:
    """RMSNorm (eps 1e-5) rounded as the eager path: x * rstd to x's dtype, times the weight, rounded."""
    xf = x.float()
    return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * nw).to(x.dtype)


def _on(q, device, *, gated: bool = False, norm: bool = False):
    """`q` on `device`, prepared for the one-row kernels in that form (the tensor-core packing)."""
    from trtforge.kernels.gemv import prepare
    from trtforge.kernels.qweight import Int4Weight

    w = Int4Weight(q.packed.to(device), q.scale.to(device), q.offset.to(device))
    prepare(w, gated=gated, norm=norm)
    return w


def _ulp_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within one 16-bit ulp of the reference (a sum rounded to BF16 / FP16 may land on either side)."""
    rtol = 2**-7 if want.dtype == torch.bfloat16 else 2**-10
    torch.testing.assert_close(got.float(), want.float(), atol=1e-3, rtol=rtol)


@pytest.fixture
def mma_launches(monkeypatch):
    """Counts the tensor-core kernel's launches (so a test can tell it ran, not the FMA kernel)."""
    from trtforge.kernels import int4_mma

    calls = []
    launch = int4_mma.launch
    monkeypatch.setattr(int4_mma, "launch", lambda *a, **kw: calls.append(1) or launch(*a, **kw))
    return calls


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("early", "first", "one_pass"),
    [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 1), (1, 1, 1)],
)
def test_three_forms_match_the_float_reference_and_the_fma_kernel_on_the_gpu(
    dtype, early, first, one_pass, monkeypatch, mma_launches
):
    from trtforge.kernels import int4_mma
    from trtforge.kernels.gemv import default_config, gemv_residual, norm_gate_up_silu, norm_gemv

    skip_unless_runs_here("cuda")
    monkeypatch.setattr(int4_mma, "EARLY_WEIGHTS", bool(early))
    monkeypatch.setattr(int4_mma, "FIRST_LOADS_EARLY", bool(first))
    monkeypatch.setattr(int4_mma, "ONE_PASS_NORM", bool(one_pass))
    n, inter, k, kd = 96, 64, 2048, 8192  # K: 16 groups (norm: 8 warps; gated: 4) and 64 (residual: 8 x 2)
    x, nw, q = _operands(n, k, dtype, seed=1)
    xc, nwc, qc = x.cuda(), nw.cuda(), _on(q, "cuda", norm=True)
    assert int4_mma.supported(xc, qc, n, gated=False, norm=True)
    xn = _rms(x, nw)
    want = (xn.float() @ q.dequantize().t()).to(dtype)
    got = norm_gemv(xc, nwc, 1e-5, qc).cpu()
    fma = norm_gemv(xc, nwc, 1e-5, qc, config=default_config(1, n, k, False, 132, "int4")).cpu()
    assert len(mma_launches) == 1  # (the explicit config took the FMA kernel)
    _ulp_close(got, want)
    _ulp_close(got, fma)

    x3, nw3, q3 = _operands(n, 3072, dtype, seed=6)  # K no power of two: the staged row is padded
    q3c = _on(q3, "cuda", norm=True)
    assert int4_mma.supported(x3.cuda(), q3c, n, gated=False, norm=True)
    _ulp_close(
        norm_gemv(x3.cuda(), nw3.cuda(), 1e-5, q3c).cpu(),
        (_rms(x3, nw3).float() @ q3.dequantize().t()).to(dtype),
    )

    _, _, qg = _operands(2 * inter, k, dtype, seed=2)
    qgc = _on(qg, "cuda", gated=True, norm=True)
    assert int4_mma.supported(xc, qgc, inter, gated=True, norm=True)
    lin = (xn.float() @ qg.dequantize().t()).to(dtype).float()
    gate, up = lin.split(inter, dim=1)
    want = (torch.nn.functional.silu(gate).to(dtype).float() * up).to(dtype)
    _ulp_close(norm_gate_up_silu(xc, nwc, 1e-5, qgc).cpu(), want)

    xd, _, qd = _operands(n, kd, dtype, seed=3)
    qdc = _on(qd, "cuda")
    assert int4_mma.supported(xd.cuda(), qdc, n, gated=False, norm=False)
    res = torch.randn(1, n, generator=torch.Generator().manual_seed(4)).to(dtype)
    want = (xd.float() @ qd.dequantize().t() + res.float()).to(dtype)
    _ulp_close(gemv_residual(xd.cuda(), qdc, res.cuda()).cpu(), want)
    assert len(mma_launches) == 4


@pytest.mark.gpu
def test_only_prepared_weights_take_the_tensor_cores_on_the_gpu(mma_launches):
    """The dispatch never packs in the hot path (a CUDA graph may be capturing): an unprepared INT4
    weight runs on the FMA kernel, and gives the same result."""
    from trtforge.kernels.gemv import gemv_residual
    from trtforge.kernels.qweight import Int4Weight

    skip_unless_runs_here("cuda")
    x, _, q = _operands(32, 8192, torch.bfloat16, seed=7)
    zero = torch.zeros(1, 32, dtype=torch.bfloat16, device="cuda")
    raw = Int4Weight(q.packed.cuda(), q.scale.cuda(), q.offset.cuda())
    a = gemv_residual(x.cuda(), raw, zero).cpu()
    assert not mma_launches and "_mma_words" not in raw.__dict__
    b = gemv_residual(x.cuda(), _on(q, "cuda"), zero).cpu()
    assert len(mma_launches) == 1
    _ulp_close(b, a)


@pytest.mark.gpu
@pytest.mark.parametrize(("early", "first"), [(False, False), (True, False), (True, True)])
def test_a_swapped_code_is_caught_on_the_gpu(early, first, monkeypatch, mma_launches):
    """One code changed in one row changes that row's output only: the kernel reads every code."""
    from trtforge.kernels import int4_mma
    from trtforge.kernels.gemv import gemv_residual
    from trtforge.kernels.qweight import Int4Weight, pack_int4

    skip_unless_runs_here("cuda")
    monkeypatch.setattr(int4_mma, "EARLY_WEIGHTS", early)
    monkeypatch.setattr(int4_mma, "FIRST_LOADS_EARLY", first)
    x, _, q = _operands(32, 8192, torch.bfloat16, seed=5)
    codes = q.codes()
    codes[17, 7000] = (codes[17, 7000] + 8) % 16
    q2 = Int4Weight(pack_int4(codes), q.scale, q.offset)
    zero = torch.zeros(1, 32, dtype=torch.bfloat16, device="cuda")
    a = gemv_residual(x.cuda(), _on(q, "cuda"), zero).float().cpu()
    b = gemv_residual(x.cuda(), _on(q2, "cuda"), zero).float().cpu()
    assert len(mma_launches) == 2
    changed = (a - b).abs()[0] > 0
    assert changed[17] and changed.sum() == 1


def test_prepare_leaves_cpu_weights_and_ineligible_forms_unpacked():
    from trtforge.kernels.gemv import prepare

    q = quantize_int4(torch.randn(40, 256))  # 40 rows: no whole tiles of 16 either
    prepare(q, norm=True)
    assert "_mma_words" not in q.__dict__
