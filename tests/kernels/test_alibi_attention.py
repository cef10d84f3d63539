"""ALiBi position biases (BLOOM, MPT, falcon-rw) in the decode and chunked-prefill kernels: the score of
the query at position p and the key at position j gets ``slope_h * (j - p)`` (one slope a query head)
before the causal / window masks.

Each numeric case runs in Triton's CPU interpreter without CUDA (tests/kernels/conftest.py) and on the
GPU for real (``-m gpu``: tests/_devices.py), against an FP32 reference. Every case first checks that the
biases change the reference's answer by far more than the tolerance. The sm_90 compile checks (Triton's
bundled ptxas, no GPU) show the biases compiled in when on and out when off.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernel (pip install triton)")

from tests._devices import DEVICES, skip_unless_runs_here  # noqa: E402
from tests.kernels.decode_reference import (  # noqa: E402
    attention_inputs,
    paged_from_contiguous,
    poison_past_lengths,
    softcapped_reference,
)
from trtforge.kernels.chunked_prefill import (  # noqa: E402
    chunked_prefill_attention,
    chunked_prefill_varlen,
    hopper_chunks_eligible,
)
from trtforge.kernels.decode_attention import (  # noqa: E402
    DecodeConfig,
    check_alibi_slopes,
    decode_attention,
    prepare_paged_decode,
)
from trtforge.llm.models.base import bloom_alibi_slopes, mpt_alibi_slopes  # noqa: E402

TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}
BITES = 0.1  # the least change the biases must make to the reference


def _slopes(kind: str, hq: int, device) -> torch.Tensor:
    """BLOOM's or MPT's slopes for `hq` heads (non-powers of two included), on `device`."""
    return (bloom_alibi_slopes(hq) if kind == "bloom" else mpt_alibi_slopes(hq)).to(device)


def _reference(q, k, v, lens, slopes, window=None, scale=None, cap=None):
    """The FP32 reference with the biases, after checking that they bite (the plain one differs)."""
    want = softcapped_reference(q, k, v, lens.cpu(), cap, window, scale, slopes)
    free = softcapped_reference(q, k, v, lens.cpu(), cap, window, scale)
    assert (want - free).abs().max().item() > BITES, "the biases do not change the answer here"
    return want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "splits", "dtype", "window", "kind"),
    [
        (4, 4, 1, 64, [1, 15, 40], 0, 0, torch.float16, None, "bloom"),  # MHA (BLOOM)
        (6, 2, 4, 64, [17, 50], 16, 3, torch.bfloat16, None, "bloom"),  # 6 heads, GQA 3, verification rows
        (4, 1, 4, 32, [30, 70], 16, 2, torch.float16, 9, "mpt"),  # with a sliding window
        (5, 5, 1, 80, [33, 5], 0, 1, torch.float16, None, "mpt"),  # 5 heads, a head dim that pads
        (2, 1, 1, 128, [90, 1], 64, 4, torch.float16, None, "bloom"),  # long keys over four splits
    ],
)
def test_decode_kernel_adds_the_alibi_biases(
    device, hq, hkv, s_q, d, lens, page, splits, dtype, window, kind
):
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(sum(lens) + d + hq)
    b, s_max = len(lens), max(lens) + 3
    q, k, v = attention_inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    slopes = _slopes(kind, hq, device)
    want = _reference(q, k, v, seq_lens, slopes, window)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    cfg = DecodeConfig(block_n=16, num_splits=splits)
    decode_attention(q, k, v, seq_lens, table, out=out, config=cfg, window=window, alibi_slopes=slopes)
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("device", DEVICES)
def test_decode_kernel_adds_the_biases_after_the_cap(device):
    """With a soft-cap too, the biases go on the capped scores (the order the step graph and the torch
    references share)."""
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(3)
    lens = torch.tensor([20, 41], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 2, 4, 2, 2, 44, 32, torch.float16)
    q = q * 3
    slopes = _slopes("bloom", 4, device)
    want = _reference(q, k, v, lens, slopes, cap=2.0)
    out = decode_attention(q, k, v, lens, config=DecodeConfig(block_n=16), softcap=2.0, alibi_slopes=slopes)
    assert (out.float().cpu() - want).abs().max().item() < TOL[torch.float16]


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_paged_decode_takes_the_layer_slopes(device):
    """The executor's prepared launch (one per layer geometry, the slopes in it) gives decode_attention's
    output bit for bit, and the reference's; a launch prepared without the slopes does not."""
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d = 8, 2, 64
    lens = torch.tensor([23, 9, 40], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 3, hq, hkv, 1, 44, d, torch.float16)
    slopes = _slopes("mpt", hq, device)
    want = _reference(q, k, v, lens, slopes)
    k_pool, v_pool, table = paged_from_contiguous(k, v, lens.cpu(), 16, gen)
    cfg = DecodeConfig(block_n=16, num_splits=2)
    q3 = q[:, :, 0].contiguous()
    biased, plain = torch.empty_like(q3), torch.empty_like(q3)
    scale = d**-0.5
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, biased, config=cfg, alibi_slopes=slopes)(
        q3, k_pool, v_pool, biased, scale, 1.0
    )
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, plain, config=cfg)(
        q3, k_pool, v_pool, plain, scale, 1.0
    )
    direct = decode_attention(q, k_pool, v_pool, lens, table, config=cfg, alibi_slopes=slopes)[:, :, 0]
    torch.testing.assert_close(biased, direct, atol=0, rtol=0)
    assert (biased.float().cpu() - want[:, :, 0]).abs().max().item() < TOL[torch.float16]
    assert (plain.float().cpu() - want[:, :, 0]).abs().max().item() > BITES


@pytest.mark.parametrize("device", DEVICES)
def test_decode_over_fp8_pools_adds_the_biases(device):
    """FP8 pools: the query carries the softmax scale in FP16 (KV_F16); the biases, in natural units,
    go on the dequantized scores as over 16-bit pools."""
    from trtforge.kernels.kv_quant import FP8_KV_DTYPE

    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 pools need compute capability >= 8.9")
    gen = torch.Generator().manual_seed(9)
    hq, hkv, d, k_scale, v_scale = 4, 1, 64, 0.5, 0.25
    lens = torch.tensor([12, 37], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 2, hq, hkv, 1, 40, d, torch.bfloat16)
    kq, vq = (k.float() / k_scale).to(FP8_KV_DTYPE), (v.float() / v_scale).to(FP8_KV_DTYPE)
    slopes = _slopes("bloom", hq, device)
    want = _reference(q, kq.float() * k_scale, vq.float() * v_scale, lens, slopes)
    cfg = DecodeConfig(block_n=16)
    out = decode_attention(q, kq, vq, lens, config=cfg, k_scale=k_scale, v_scale=v_scale, alibi_slopes=slopes)
    assert (out.float().cpu() - want).abs().max().item() < TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "dtype", "window", "kind", "block_m"),
    [
        (4, 1, 5, 64, [5, 21, 40], 16, torch.float16, None, "bloom", 16),  # no prefix, prefix 16, prefix 35
        (6, 2, 20, 32, [33, 20], 0, torch.bfloat16, 6, "mpt", 32),  # 6 heads, GQA 3, a sliding window
        (3, 3, 37, 32, [37, 50], 16, torch.float16, None, "bloom", 16),  # a chunk longer than a row tile
    ],
)
def test_chunked_prefill_adds_the_alibi_biases(
    device, hq, hkv, s_q, d, lens, page, dtype, window, kind, block_m
):
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(s_q * d + hq)
    b, s_max = len(lens), max(lens) + 5
    q, k, v = attention_inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    slopes = _slopes(kind, hq, device)
    want = _reference(q, k, v, seq_lens, slopes, window)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(
        q, k, v, seq_lens, table, out=out, block_m=block_m, block_n=16, window=window, alibi_slopes=slopes
    )
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_chunks_take_the_slopes(device):
    """The served varlen launch (flat rows, ragged chunks, shuffled tables) with slopes gives each chunk's
    own launch exactly, and the reference."""
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(13)
    hq, hkv, d, page, scale = 8, 2, 32, 16, 0.5
    k, v = (torch.randn(3, hkv, 80, d, generator=gen).half().to(device) for _ in range(2))
    starts, q_lens, lens = [0, 17, 58], [17, 41, 2], [17, 70, 35]
    k_pool, v_pool, table = paged_from_contiguous(k, v, torch.tensor(lens), page, gen)
    q = torch.randn(64, hq, d, generator=gen).half().to(device)
    as_i32 = {n: torch.tensor(x, dtype=torch.int32, device=device) for n, x in (("s", starts), ("q", q_lens))}
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    slopes = _slopes("bloom", hq, device)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_varlen(
        q, k_pool, v_pool, seq_lens, table, as_i32["s"], as_i32["q"], max(q_lens), scale=scale, out=out,
        alibi_slopes=slopes,
    )  # fmt: skip
    for i, (s, n) in enumerate(zip(starts, q_lens)):
        chunk = q[s : s + n].permute(1, 0, 2)[None]
        own = chunked_prefill_attention(
            chunk, k_pool, v_pool, seq_lens[i : i + 1], table[i : i + 1], scale=scale, alibi_slopes=slopes
        )[0].permute(1, 0, 2)
        torch.testing.assert_close(out[s : s + n], own, atol=0, rtol=0)
        want = _reference(chunk, k[i : i + 1], v[i : i + 1], seq_lens[i : i + 1], slopes, scale=scale)
        assert (out[s : s + n].float().cpu() - want[0].permute(1, 0, 2)).abs().max().item() < 3e-3


@pytest.mark.parametrize(
    "slopes",
    [torch.ones(3), torch.ones(4, dtype=torch.float16), torch.ones(4, 1), torch.ones(8)[::2], [1.0] * 4],
    ids=["heads", "dtype", "shape", "strided", "list"],
)
def test_slopes_must_be_one_float32_a_query_head(slopes):
    q = torch.zeros(1, 4, 1, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"ALiBi slopes must be a contiguous float32 \[4\] tensor"):
        check_alibi_slopes(slopes, 4, q)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match="ALiBi slopes"):
        decode_attention(q, q, q, lens, alibi_slopes=slopes)
    with pytest.raises(ValueError, match="ALiBi slopes"):
        chunked_prefill_attention(q, q, q, lens, alibi_slopes=slopes)


def test_alibi_layers_never_take_the_hopper_chunk_kernel():
    """The Hopper flash-attention kernel applies no position bias: an ALiBi layer's long chunks stay on
    the varlen kernel (the check comes before any device question, so it holds on any machine)."""
    q = torch.zeros(4, 2, 64, dtype=torch.float16)
    assert not hopper_chunks_eligible(q, q, None, alibi_slopes=torch.ones(2))


def _decode_facts(alibi: bool) -> dict:
    """The served paged decode launch over 16-bit pools (bloom-7b1's shape: 32 heads of 128 channels, MHA;
    16-token pages), compiled for sm_90, with or without the slopes."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import decode_attention as da

    cfg = da.default_decode_config(128, torch.bfloat16, 4096, 64)
    opts = da._split_options(
        cfg, 1, 1, 128, 16, False, True, False, 0, False, torch.bfloat16, torch.bfloat16, None, 0.0, alibi
    )  # fmt: skip
    consts = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages", "launch_pdl")}
    consts |= {"STAMP": False, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1}
    pointers = dict.fromkeys(("Q", "Out", "K", "V", "KDesc", "VDesc"), "*bf16")
    pointers |= {"MidO": "*fp32", "MidL": "*fp32"} | dict.fromkeys(("SeqLens", "Table", "Counters"), "*i32")
    if alibi:
        pointers["Slopes"] = "*fp32"
    else:
        consts["Slopes"] = None  # the launcher's None: a constexpr, no argument
    ints = {"stride_qb": 4096, "stride_qh": 128, "stride_qm": 4096, "stride_kb": 65536, "stride_kh": 128,
            "stride_kn": 4096, "stride_vb": 65536, "stride_vh": 128, "stride_vn": 4096, "stride_ob": 4096,
            "stride_oh": 128, "stride_om": 4096, "stride_tb": 256, "num_kv_heads": 32, "num_splits": 2,
            "window": 0}  # fmt: skip
    return compile_facts(
        da._decode_split_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


def _chunk_facts(alibi: bool) -> dict:
    """The served varlen chunked-prefill launch of a 1,024-token chunk at bloom-7b1's shape, compiled for
    sm_90, with or without the slopes."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import chunked_prefill as cp
    from trtforge.kernels.configs import chunk_prefill_config

    cfg = chunk_prefill_config(1024)
    consts = {"GROUP": 1, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "PAGE_SIZE": 16, "HAS_QLENS": True, "DOT_F32": False, "WINDOW": False, "HAS_QSTARTS": True,
              "KV_F16": False, "SOFTCAP": False, "ALIBI": alibi, "stride_qd": 1, "stride_kd": 1,
              "stride_vd": 1, "stride_od": 1}  # fmt: skip
    pointers = dict.fromkeys(("Q", "Out", "K", "V"), "*bf16")
    pointers |= dict.fromkeys(("SeqLens", "QLens", "QStarts", "Table"), "*i32")
    if alibi:
        pointers["Slopes"] = "*fp32"
    else:
        consts["Slopes"] = None
    ints = {"stride_qb": 0, "stride_qh": 128, "stride_qm": 4096, "stride_kb": 65536, "stride_kh": 128,
            "stride_kn": 4096, "stride_vb": 65536, "stride_vh": 128, "stride_vn": 4096, "stride_ob": 0,
            "stride_oh": 128, "stride_om": 4096, "stride_tb": 256, "num_kv_heads": 32, "seq_q": 1024,
            "window": 0}  # fmt: skip
    return compile_facts(
        cp._chunked_prefill_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


@pytest.mark.parametrize("kernel", ["_decode_facts", "_chunk_facts"])
def test_the_biases_compile_for_sm90_and_are_compiled_out_when_off(kernel):
    """Both kernels assemble for sm_90 with the slopes, spilling nothing; with them on, each score tile
    takes a fused multiply-add more per element (more FMA / mul instructions), which the off code has
    not."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    on = run_in_child(f"{__name__}:{kernel}", True)
    off = run_in_child(f"{__name__}:{kernel}", False)
    assert on["ptxas_rc"] == 0 and off["ptxas_rc"] == 0, (on["ptxas"], off["ptxas"])
    assert max(on["spills"], default=0) == max(off["spills"], default=0) == 0, (on["ptxas"], off["ptxas"])

    def count(facts: dict, *prefixes: str) -> int:
        return sum(n for op, n in facts["counts"].items() if op.startswith(prefixes))

    assert count(on, "fma", "mul.f32", "add.f32") > count(off, "fma", "mul.f32", "add.f32")
    assert count(on, "cvt.rn.f32.s32") > count(off, "cvt.rn.f32.s32"), (on["counts"], off["counts"])


def test_a_device_tensor_query_without_slopes_passes_and_with_slopes_is_refused():
    """The TensorRT plugin launches the kernels on DeviceTensor views, which have no ``device``: without
    slopes the check never looks at the query (the H100 run of session 42 caught it reading q.device
    first); with slopes it says they need a torch query."""
    from trtforge.kernels.device_tensor import DeviceTensor

    view = DeviceTensor(ptr=0, dtype=torch.float16, shape=(1, 4, 1, 32), strides=(128, 32, 32, 1))
    assert check_alibi_slopes(None, 4, view) is None
    with pytest.raises(ValueError, match="ALiBi slopes need the query as a torch tensor; got DeviceTensor"):
        check_alibi_slopes(torch.ones(4), 4, view)
