"""L2 prefetch plans (trtforge.kernels.l2_prefetch): what they cover, the GEMVs' reads they follow, the
RoPE launch that issues them (sm_90 code here; on a GPU, outputs unchanged by it)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


def _covered(plan: torch.Tensor, t: torch.Tensor) -> int:
    """Bytes of `t`'s storage the plan's descriptors cover (they never overlap)."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    return sum(int(s) for a, s in plan.tolist() if lo <= a < hi)


def test_any_prefix_of_a_plan_covers_each_tensor_of_a_group_alike():
    """Groups in order; within one, descriptors interleaved by relative position, so the first n cover
    the same leading share of every tensor (the first programs of a GEMV whole, whatever its budget);
    sizes in whole 16-byte units, starts where each piece begins."""
    from trtforge.kernels.l2_prefetch import plan

    o = torch.zeros(4096, dtype=torch.uint8)
    gate, up = torch.zeros(8192, dtype=torch.uint8), torch.zeros(8192, dtype=torch.uint8)
    scale = torch.zeros(1000, dtype=torch.float32)  # 4,000 bytes: 3 pieces of 1,024 and one of 928
    p = plan([[o], [gate, up, scale]], chunk=1024)
    assert p.dtype == torch.int64 and p.shape == (4 + 8 + 8 + 4, 2)
    assert [a for a, _ in p[:4].tolist()] == [o.data_ptr() + 1024 * i for i in range(4)]
    assert all(s % 16 == 0 for _, s in p.tolist())
    head = p[: 4 + 7]  # o, then the gate/up group's pieces at positions 0 (gate, up, scale), 1/8 and 1/4
    assert _covered(head, o) == 4096
    assert _covered(head, gate) == _covered(head, up) == 3 * 1024 and _covered(head, scale) == 1024
    assert _covered(p, gate) == _covered(p, up) == 8192


def test_a_plan_leaves_out_what_the_instruction_cannot_take():
    """A trailing partial 16-byte unit is left out (never read past the tensor), an empty tensor or one
    whose start is off 16 bytes gives nothing; a strided tensor, or a chunk off 16 bytes, is refused."""
    from trtforge.kernels.l2_prefetch import plan

    odd = torch.zeros(1000 + 7, dtype=torch.uint8)
    assert plan([[odd]], chunk=512)[:, 1].tolist() == [512, 480]
    base = torch.zeros(64, dtype=torch.uint8)
    assert plan([[base[1:33]], [base[:0]]]).shape == (0, 2)
    with pytest.raises(ValueError, match="not contiguous"):
        plan([[torch.zeros(8, 8).t()]])
    with pytest.raises(ValueError, match="multiple of 16"):
        plan([[base]], chunk=100)


def test_weight_reads_follow_the_one_row_dispatch():
    """What the GEMVs read: the 16-bit weight; FP8 codes and row scales; INT4 words, scales and offsets
    (here, off a GPU, the FMA kernel's packed bytes); gated forms split into their gate and up halves."""
    from trtforge.kernels.gemv import weight_reads
    from trtforge.kernels.qweight import quantize_fp8, quantize_int4

    w = torch.randn(64, 256, dtype=torch.bfloat16)
    assert [t.data_ptr() for t in weight_reads(w)] == [w.data_ptr()]
    gate, up = weight_reads(w, gated=True, norm=True)
    assert torch.equal(gate, w[:32]) and torch.equal(up, w[32:])
    f = quantize_fp8(w.float())
    assert [t.data_ptr() for t in weight_reads(f)] == [f.data.data_ptr(), f.scale.data_ptr()]
    i4 = quantize_int4(w.float())
    reads = weight_reads(i4, gated=True)
    assert [tuple(t.shape) for t in reads] == [(32, 128), (32, 128), (32, 2), (32, 2), (32, 2), (32, 2)]
    assert reads[1].data_ptr() == i4.packed[32:].data_ptr()
    assert reads[5].data_ptr() == i4.offset[32:].data_ptr()


def _rope_inputs(device: str, t: int = 3):
    g = torch.Generator().manual_seed(2)
    hq, hkv, d, bs, nblocks = 4, 2, 16, 4, 5
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).half().to(device)
    angles = torch.rand(t, d // 2, generator=g) * 6
    cos = torch.cat([angles.cos()] * 2, -1).half().to(device)
    sin = torch.cat([angles.sin()] * 2, -1).half().to(device)
    slots = torch.tensor([1, 7, 12, 3, 19, 8][:t], dtype=torch.int32, device=device)
    pools = [torch.zeros(nblocks, bs, hkv, d, dtype=torch.float16, device=device) for _ in range(4)]
    return qkv, cos, sin, slots, pools, hq, hkv


@pytest.mark.parametrize("device", DEVICES)
def test_rope_and_cache_with_a_prefetch_writes_what_it_writes_without(device):
    """Prefetching programs touch no output: q and both pools come out bit-identical. Off a GPU a plan
    with descriptors to issue is refused by name (nothing there has the instruction); an empty request
    runs as none; a plan of the wrong type or a count past its end is refused."""
    from trtforge.kernels.fused_layer import rope_and_cache
    from trtforge.kernels.l2_prefetch import plan

    skip_unless_runs_here(device)
    qkv, cos, sin, slots, pools, hq, hkv = _rope_inputs(device)
    weights = torch.randn(3000, 512, device=device)  # 6 MB: 375 descriptors, 3 programs
    p = plan([[weights]])
    want = rope_and_cache(qkv, cos, sin, slots, pools[0], pools[1], hq, hkv)
    n = int(p.shape[0]) if device == "cuda" else 0
    got = rope_and_cache(qkv, cos, sin, slots, pools[2], pools[3], hq, hkv, l2_prefetch=(p, n))
    assert torch.equal(got, want) and torch.equal(pools[2], pools[0]) and torch.equal(pools[3], pools[1])
    if device == "cpu":
        with pytest.raises(ValueError, match="compute capability 9.0"):
            rope_and_cache(qkv, cos, sin, slots, pools[2], pools[3], hq, hkv, l2_prefetch=(p, 1))
    with pytest.raises(ValueError, match="contiguous int64"):
        rope_and_cache(qkv, cos, sin, slots, pools[2], pools[3], hq, hkv, l2_prefetch=(p.int(), 1))
    with pytest.raises(ValueError, match="asks for"):
        rope_and_cache(qkv, cos, sin, slots, pools[2], pools[3], hq, hkv, l2_prefetch=(p, len(p) + 1))


def _rope_facts(pf: bool) -> dict:
    """The RoPE + cache-write launch of one Llama-3-8B token (BF16 pools), compiled for sm_90 with PDL,
    with or without the prefetching programs."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import fused_layer as fl

    consts = {"PAGE": 16, "HALF": 64, "BLOCK_HALF": 64, "BLOCK_H": 32, "D": 128, "BLOCK_PASS": 1, "PDL": True,
              "PF": pf, "PF_THREADS": 128}  # fmt: skip
    pointers = dict.fromkeys(("QKV", "Cos", "Sin", "QOut", "KPool", "VPool"), "*bf16") | {"Slots": "*i32"}
    if pf:
        pointers["Chunks"] = "*i64"
    else:
        consts["Chunks"] = None
    ints = {"stride_t": 6144, "stride_cos": 128, "stride_qo_t": 4096, "stride_kb": 16384, "stride_kn": 1024,
            "stride_kh": 128, "stride_kd": 1, "stride_vb": 16384, "stride_vn": 1024, "stride_vh": 128,
            "stride_vd": 1, "num_heads": 32, "num_kv_heads": 8, "n_chunks": 1536}  # fmt: skip
    return compile_facts(
        fl._rope_cache_kernel, pointers, ints, consts, 4, 3,
        scalars={"k_inv_scale": "fp32", "v_inv_scale": "fp32"},
    )  # fmt: skip


def test_the_prefetching_rope_launch_compiles_for_sm90():
    """With PF the launch holds one bulk L2 prefetch a thread (predicated on a nonzero size) and still
    waits for the previous kernel once; without it, no prefetch at all; both assemble without spills."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    on, off = (run_in_child(f"{__name__}:_rope_facts", pf) for pf in (True, False))
    for facts in (on, off):
        assert facts["ptxas_rc"] == 0 and not any(facts["spills"]), facts["ptxas"]
        assert facts["counts"].get("griddepcontrol.wait", 0) == 1
    assert on["inline"].get("cp.async.bulk.prefetch.L2.global", 0) >= 1
    assert off["inline"].get("cp.async.bulk.prefetch.L2.global", 0) == 0
