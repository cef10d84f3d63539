"""The FP8-native decode kernel (E4M3 queries and softmax numerators, both products on FP8 tensor cores):
against the FP32 reference over the same dequantized K/V, in Triton's CPU interpreter (its FP8 casts are
torch's, tests/kernels/conftest.py) and on a GPU; and its sm_90 code.

Tolerance: beyond the FP8 K/V (whose values the reference shares), the kernel rounds each query row and
each softmax numerator to E4M3 (a relative error of at most 2^-4 an element), and stores BF16. Over
N(0, 1) K/V at D 64 and 1..700 keys the outputs (up to 2.7 in magnitude) moved by at most 0.057
(measured, interpreter); TOL 0.1. Mutations (a wrong kv head, a halved P scale) fail it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernel (pip install triton)")

from tests._devices import DEVICES, skip_unless_runs_here  # noqa: E402
from tests.kernels._sm90 import needs_ptxas, run_in_child  # noqa: E402
from tests.kernels.decode_reference import paged_from_contiguous, reference_decode  # noqa: E402
from trtforge.kernels.fp8_native_decode import fp8_native_paged_decode  # noqa: E402
from trtforge.kernels.kv_quant import FP8_KV_DTYPE, dequantize, quantize_fp8  # noqa: E402

TOL = 0.1


def _case(device, b, hq, hkv, d, lens, page, seed):
    gen = torch.Generator().manual_seed(seed)
    s_max = max(lens)
    k = torch.randn(b, hkv, s_max, d, generator=gen)
    v = torch.randn(b, hkv, s_max, d, generator=gen)
    q = torch.randn(b, hq, d, generator=gen).bfloat16()
    ks, vs = float(k.abs().amax()) / 448, float(v.abs().amax()) / 448
    kd, vd = dequantize(quantize_fp8(k, ks), ks), dequantize(quantize_fp8(v, vs), vs)  # the FP8 values
    lens_t = torch.tensor(lens, dtype=torch.int32)
    kp, vp, table = paged_from_contiguous(kd / ks, vd / vs, lens_t, page, gen)  # codes, exact in float32
    kp, vp = kp.to(FP8_KV_DTYPE).to(device), vp.to(FP8_KV_DTYPE).to(device)
    ref = reference_decode(q.float()[:, :, None], kd, vd, lens_t, scale=d**-0.5)[:, :, 0]
    return q.to(device), kp, vp, lens_t.to(device), table.to(device), ks, vs, ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("hq", "hkv", "lens", "page", "splits"), [
    (8, 2, [1, 17, 300, 700], 16, None),
    (8, 2, [1, 17, 300, 700], 16, 3),
    (4, 4, [129, 256], 64, 1),
    (16, 2, [500, 40], 16, 2),
])  # fmt: skip
@pytest.mark.parametrize("v_keys_major", [False, True], ids=["v-served", "v-keys-major"])
def test_matches_the_reference_over_the_same_fp8_values(device, hq, hkv, lens, page, splits, v_keys_major):
    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability >= 8.9")
    d = 64
    q, kp, vp, lens_t, table, ks, vs, ref = _case(
        device, len(lens), hq, hkv, d, lens, page, seed=len(lens) + hq
    )
    if v_keys_major:  # the same logical pool stored [N, Hkv, D, page]
        vp = vp.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        assert vp.stride(1) == 1
    out = torch.full_like(q, float("nan"))
    got = fp8_native_paged_decode(
        q, kp, vp, lens_t, table, d**-0.5, k_scale=ks, v_scale=vs, out=out, num_splits=splits
    )
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    err = (got.float().cpu() - ref).abs().max().item()
    assert err <= TOL, err


def test_bad_inputs_are_refused():
    q = torch.zeros(2, 8, 64, dtype=torch.bfloat16)
    pool = torch.zeros(4, 16, 2, 64, dtype=FP8_KV_DTYPE)
    lens, table = torch.ones(2, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="pools must be"):
        fp8_native_paged_decode(q, pool.bfloat16(), pool, lens, table, 0.1)
    with pytest.raises(ValueError, match="power of two"):
        fp8_native_paged_decode(q[..., :48], pool[..., :48], pool[..., :48], lens, table, 0.1)
    with pytest.raises(ValueError, match="whole number"):
        fp8_native_paged_decode(q[:, :7], pool, pool, lens, table, 0.1)
    with pytest.raises(ValueError, match="seq_lens"):
        fp8_native_paged_decode(q, pool, pool, lens[:1], table, 0.1)


def _sm90_facts(num_warps: int = 4, block_n: int = 128, v_keys_major: bool = False) -> dict:
    """Compile the kernel for sm_90 as its launcher specializes it at the 8B shape (child process: no
    interpreter): Hq 32 / Hkv 8 / D 128, 16-token pages; V stored as served, or keys-major."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import fp8_native_decode as m

    pointers = {"Q": "*bf16", "K": "*fp8e4nv", "V": "*fp8e4nv", "SeqLens": "*i32", "Table": "*i32"}
    pointers |= {"Out": "*bf16", "MidO": "*fp32", "MidL": "*fp32"}
    ints = {"stride_qb": 4096, "stride_qh": 128, "stride_kn": 16384, "stride_kp": 1024, "stride_kh": 128}
    ints |= {"stride_vn": 16384, "stride_vp": 1024, "stride_vh": 128, "stride_vd": 1}
    if v_keys_major:  # [N, Hkv, D, page] behind the logical [N, page, Hkv, D]
        ints |= {"stride_vp": 1, "stride_vh": 2048, "stride_vd": 16}
    ints |= {"stride_ob": 4096, "stride_oh": 128}
    consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "BLOCK_N": block_n, "PAGE": 16}
    consts |= {"BLOCK_M": m.BLOCK_M, "Q_MAX": m.Q_CODE_MAX, "P_SCALE": m.P_CODE_SCALE}
    consts |= {"V_KEYS_MAJOR": v_keys_major, "PDL": True}  # (the H200 launches it early)
    scalars = {"qk_scale": "fp32", "v_scale": "fp32"}
    facts = compile_facts(m._fp8_native_decode_kernel, pointers, ints, consts, num_warps, 2, scalars)
    ops = facts["counts"]
    products = [op for op in ops if "mma" in op and not any(w in op for w in ("fence", "commit", "wait"))]
    return facts | {
        "wgmma_e4m3": sum(ops[op] for op in products if op.startswith("wgmma") and "e4m3.e4m3" in op),
        "other_mma": sum(ops[op] for op in products if "e4m3.e4m3" not in op),
        "widening": sum(n for op, n in ops.items() if op.startswith("cvt") and "f16x2.e4m3x2" in op),
        "byte_loads": ops.get("ld.global.b8", 0) + ops.get("ld.global.nc.b8", 0),
        "byte_stores": ops.get("st.shared.b8", 0),
    }


def test_both_products_are_fp8_wgmma_without_widening_on_sm90():
    """The kernel's premise on sm_90, at the default launch: Q·Kᵀ and P·V are wgmma on E4M3 operands, no
    K or V code is widened to FP16 (the serving decode kernel's cvt.rn.f16x2.e4m3x2), K tiles arrive
    by 16-byte cp.async and nothing is loaded from global memory a byte at a time; nothing spills."""
    needs_ptxas()
    facts = run_in_child(f"{__name__}:_sm90_facts", 4, 128)
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    assert facts["wgmma_e4m3"] >= 8, facts  # 128 keys x 128 channels, k = 32 a wgmma
    assert facts["widening"] == 0 and facts["other_mma"] == 0, facts
    assert facts["cp_async_16"] >= 8 and facts["byte_loads"] == 0, facts
    assert not facts["spills"] or max(facts["spills"]) == 0, facts["ptxas"]


@pytest.mark.parametrize("device", DEVICES)
def test_serving_decode_takes_it_when_switched_on(device, monkeypatch):
    """triton_attention.FP8_NATIVE_DECODE (off by default) sends decode launches over FP8 pools to this
    kernel: the same bits as calling it, within TOL of the reference; off, the split-KV kernel runs."""
    from trtforge.llm.executors import triton_attention

    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability >= 8.9")
    d, lens = 64, [33, 300]
    q, kp, vp, lens_t, table, ks, vs, ref = _case(device, 2, 8, 2, d, lens, 16, seed=9)
    direct = fp8_native_paged_decode(q, kp, vp, lens_t, table, d**-0.5, k_scale=ks, v_scale=vs)
    attention = triton_attention.TritonDecodeAttention()
    off = attention(q, kp, vp, table, lens_t, d**-0.5, k_scale=ks, v_scale=vs)
    monkeypatch.setattr(triton_attention, "FP8_NATIVE_DECODE", True)
    on = attention(q, kp, vp, table, lens_t, d**-0.5, k_scale=ks, v_scale=vs)
    assert torch.equal(on, direct) and not torch.equal(on, off)
    assert (on.float().cpu() - ref).abs().max().item() <= TOL


def test_a_keys_major_v_pool_reaches_the_fp8_wgmma_without_a_byte_transpose_on_sm90():
    """V stored keys-major ([N, Hkv, D, page]: each channel's keys of a page contiguous) is K-major for
    P·V's FP8 wgmma: its tiles arrive by 16-byte cp.async like K's, and the byte-wide transposing stores
    of the served layout (128 a tile) are gone; nothing spills."""
    needs_ptxas()
    served = run_in_child(f"{__name__}:_sm90_facts", 4, 128, False)
    keys_major = run_in_child(f"{__name__}:_sm90_facts", 4, 128, True)
    assert keys_major["ptxas_rc"] == 0, keys_major["ptxas"]
    assert served["byte_stores"] >= 128 and keys_major["byte_stores"] == 0, (served, keys_major)
    assert keys_major["cp_async_16"] > served["cp_async_16"] and keys_major["byte_loads"] == 0, keys_major
    assert keys_major["wgmma_e4m3"] >= 8 and keys_major["widening"] == 0, keys_major
    assert not keys_major["spills"] or max(keys_major["spills"]) == 0, keys_major["ptxas"]
