"""Attention sinks (gpt-oss) in the decode and chunked-prefill kernels: head h's learned sink logit joins
each of its query rows' softmax denominators as one more column that takes probability mass and gives no
value (transformers' eager gpt-oss attention: the logits with the sink appended, softmaxed, the sink's
column dropped).

Each numeric case runs in Triton's CPU interpreter without CUDA (tests/kernels/conftest.py) and on the GPU
for real (``-m gpu``: tests/_devices.py), against an FP32 reference. Every case first checks that the sinks
change the reference's answer by far more than the tolerance. The split-KV decode cases run 1 to 6 splits,
with splits that see no key, the fused reduction and the reduce kernel: the sink must count once a row,
whichever split holds it.
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
    check_sinks,
    decode_attention,
    prepare_paged_decode,
)

TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}
BITES = 0.05  # the least change the sinks must make to the reference


def _sinks(hq: int, gen, device) -> torch.Tensor:
    """Sink logits of the size trained ones reach (a few units either side of 0), one a query head."""
    return (torch.randn(hq, generator=gen) * 2.0 + 0.5).to(device)


def _reference(q, k, v, lens, sinks, window=None, scale=None, cap=None, slopes=None):
    """The FP32 reference with the sinks, after checking that they bite (the plain one differs)."""
    want = softcapped_reference(q, k, v, lens.cpu(), cap, window, scale, slopes, sinks)
    free = softcapped_reference(q, k, v, lens.cpu(), cap, window, scale, slopes)
    assert (want - free).abs().max().item() > BITES, "the sinks do not change the answer here"
    return want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "splits", "fused", "dtype", "window"),
    [
        (4, 4, 1, 64, [1, 15, 40], 0, 1, True, torch.float16, None),  # one split: the direct store
        (8, 2, 4, 64, [17, 50], 16, 3, True, torch.bfloat16, None),  # GQA 4, verification rows, 3 splits
        (4, 1, 1, 64, [70, 30], 16, 2, False, torch.float16, 9),  # a window, the reduce kernel
        (2, 1, 1, 64, [90, 1, 33], 16, 6, True, torch.float16, None),  # 6 splits, most of them empty at 1
        (2, 1, 2, 64, [90, 2, 40], 0, 5, False, torch.float16, 20),  # window + empty splits, reduce kernel
    ],
)
def test_decode_kernel_counts_each_sink_once(
    device, hq, hkv, s_q, d, lens, page, splits, fused, dtype, window
):
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(sum(lens) + d + hq + splits)
    b, s_max = len(lens), max(lens) + 3
    q, k, v = attention_inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    sinks = _sinks(hq, gen, device)
    want = _reference(q, k, v, seq_lens, sinks, window)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    cfg = DecodeConfig(block_n=16, num_splits=splits, fused=fused)
    decode_attention(q, k, v, seq_lens, table, out=out, config=cfg, window=window, sinks=sinks)
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("device", DEVICES)
def test_decode_kernel_sinks_beside_the_cap_and_the_biases(device):
    """The sink is a column of its own: the soft-cap and ALiBi biases act on the scores, never on it."""
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(3)
    lens = torch.tensor([20, 41], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 2, 4, 2, 2, 44, 32, torch.float16)
    q = q * 3
    sinks = _sinks(4, gen, device)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device)
    want = _reference(q, k, v, lens, sinks, cap=2.0, slopes=slopes)
    cfg = DecodeConfig(block_n=16, num_splits=2)
    out = decode_attention(q, k, v, lens, config=cfg, softcap=2.0, alibi_slopes=slopes, sinks=sinks)
    assert (out.float().cpu() - want).abs().max().item() < TOL[torch.float16]


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_paged_decode_takes_the_layer_sinks(device):
    """The executor's prepared launch (one per layer geometry, the sinks in it) gives decode_attention's
    output bit for bit, and the reference's; a launch prepared without the sinks does not."""
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d = 8, 2, 64
    lens = torch.tensor([23, 9, 40], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 3, hq, hkv, 1, 44, d, torch.float16)
    sinks = _sinks(hq, gen, device)
    want = _reference(q, k, v, lens, sinks)
    k_pool, v_pool, table = paged_from_contiguous(k, v, lens.cpu(), 16, gen)
    cfg = DecodeConfig(block_n=16, num_splits=3)
    q3 = q[:, :, 0].contiguous()
    sunk, plain = torch.empty_like(q3), torch.empty_like(q3)
    scale = d**-0.5
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, sunk, config=cfg, sinks=sinks)(
        q3, k_pool, v_pool, sunk, scale, 1.0
    )
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, plain, config=cfg)(
        q3, k_pool, v_pool, plain, scale, 1.0
    )
    direct = decode_attention(q, k_pool, v_pool, lens, table, config=cfg, sinks=sinks)[:, :, 0]
    torch.testing.assert_close(sunk, direct, atol=0, rtol=0)
    assert (sunk.float().cpu() - want[:, :, 0]).abs().max().item() < TOL[torch.float16]
    assert (plain.float().cpu() - want[:, :, 0]).abs().max().item() > BITES


@pytest.mark.parametrize("device", DEVICES)
def test_decode_over_fp8_pools_takes_the_sinks(device):
    """FP8 pools: the query carries the softmax scale in FP16 (KV_F16); the sinks, in natural units, join
    the dequantized scores' softmax as over 16-bit pools."""
    from trtforge.kernels.kv_quant import FP8_KV_DTYPE

    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 pools need compute capability >= 8.9")
    gen = torch.Generator().manual_seed(9)
    hq, hkv, d, k_scale, v_scale = 4, 1, 64, 0.5, 0.25
    lens = torch.tensor([12, 37], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 2, hq, hkv, 1, 40, d, torch.bfloat16)
    kq, vq = (k.float() / k_scale).to(FP8_KV_DTYPE), (v.float() / v_scale).to(FP8_KV_DTYPE)
    sinks = _sinks(hq, gen, device)
    want = _reference(q, kq.float() * k_scale, vq.float() * v_scale, lens, sinks)
    cfg = DecodeConfig(block_n=16, num_splits=2)
    out = decode_attention(q, kq, vq, lens, config=cfg, k_scale=k_scale, v_scale=v_scale, sinks=sinks)
    assert (out.float().cpu() - want).abs().max().item() < TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "dtype", "window", "block_m"),
    [
        (4, 1, 5, 64, [5, 21, 40], 16, torch.float16, None, 16),  # no prefix, prefix 16, prefix 35
        (8, 2, 20, 64, [33, 20], 0, torch.bfloat16, 6, 32),  # GQA 4, a sliding window
        (2, 2, 37, 64, [37, 50], 16, torch.float16, None, 16),  # a chunk longer than a row tile
    ],
)
def test_chunked_prefill_takes_the_sinks(device, hq, hkv, s_q, d, lens, page, dtype, window, block_m):
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(s_q * d + hq)
    b, s_max = len(lens), max(lens) + 5
    q, k, v = attention_inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    sinks = _sinks(hq, gen, device)
    want = _reference(q, k, v, seq_lens, sinks, window)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(
        q, k, v, seq_lens, table, out=out, block_m=block_m, block_n=16, window=window, sinks=sinks
    )
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_chunks_take_the_sinks(device):
    """The served varlen launch (flat rows, ragged chunks, shuffled tables) with sinks gives each chunk's
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
    sinks = _sinks(hq, gen, device)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_varlen(
        q, k_pool, v_pool, seq_lens, table, as_i32["s"], as_i32["q"], max(q_lens), scale=scale, out=out,
        sinks=sinks,
    )  # fmt: skip
    for i, (s, n) in enumerate(zip(starts, q_lens)):
        chunk = q[s : s + n].permute(1, 0, 2)[None]
        own = chunked_prefill_attention(
            chunk, k_pool, v_pool, seq_lens[i : i + 1], table[i : i + 1], scale=scale, sinks=sinks
        )[0].permute(1, 0, 2)
        torch.testing.assert_close(out[s : s + n], own, atol=0, rtol=0)
        want = _reference(chunk, k[i : i + 1], v[i : i + 1], seq_lens[i : i + 1], sinks, scale=scale)
        assert (out[s : s + n].float().cpu() - want[0].permute(1, 0, 2)).abs().max().item() < 3e-3


@pytest.mark.parametrize(
    "sinks",
    [torch.ones(3), torch.ones(4, dtype=torch.float16), torch.ones(4, 1), torch.ones(8)[::2], [1.0] * 4],
    ids=["heads", "dtype", "shape", "strided", "list"],
)
def test_sinks_must_be_one_float32_a_query_head(sinks):
    q = torch.zeros(1, 4, 1, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"attention sinks must be a contiguous float32 \[4\] tensor"):
        check_sinks(sinks, 4, q)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match="attention sinks"):
        decode_attention(q, q, q, lens, sinks=sinks)
    with pytest.raises(ValueError, match="attention sinks"):
        chunked_prefill_attention(q, q, q, lens, sinks=sinks)


def test_sink_layers_never_take_the_hopper_chunk_kernel():
    """The Hopper flash-attention kernel has no sink column: a sink layer's long chunks stay on the varlen
    kernel (the check comes before any device question, so it holds on any machine)."""
    q = torch.zeros(4, 2, 64, dtype=torch.float16)
    assert not hopper_chunks_eligible(q, q, None, sinks=torch.ones(2))


def _decode_facts(sinks: bool) -> dict:
    """The served paged decode launch over 16-bit pools (gpt-oss-20b's shape: 64 heads of 64 channels over 8
    kv heads; 16-token pages), compiled for sm_90, with or without the sinks."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import decode_attention as da

    cfg = da.default_decode_config(64, torch.bfloat16, 4096, 64)
    opts = da._split_options(
        cfg, 8, 1, 64, 16, False, True, False, 0, False, torch.bfloat16, torch.bfloat16, None, 0.0, False,
        sinks,
    )  # fmt: skip
    consts = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages", "launch_pdl")}
    consts |= {"STAMP": False, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1, "Slopes": None}
    pointers = dict.fromkeys(("Q", "Out", "K", "V", "KDesc", "VDesc"), "*bf16")
    pointers |= {"MidO": "*fp32", "MidL": "*fp32"} | dict.fromkeys(("SeqLens", "Table", "Counters"), "*i32")
    if sinks:
        pointers["Sinks"] = "*fp32"
    else:
        consts["Sinks"] = None  # the launcher's None: a constexpr, no argument
    ints = {"stride_qb": 4096, "stride_qh": 64, "stride_qm": 4096, "stride_kb": 8192, "stride_kh": 64,
            "stride_kn": 512, "stride_vb": 8192, "stride_vh": 64, "stride_vn": 512, "stride_ob": 4096,
            "stride_oh": 64, "stride_om": 4096, "stride_tb": 256, "num_kv_heads": 8, "num_splits": 2,
            "window": 0}  # fmt: skip
    return compile_facts(
        da._decode_split_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


def _chunk_facts(sinks: bool) -> dict:
    """The served varlen chunked-prefill launch of a 1,024-token chunk at gpt-oss-20b's shape, compiled for
    sm_90, with or without the sinks."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import chunked_prefill as cp
    from trtforge.kernels.configs import chunk_prefill_config

    cfg = chunk_prefill_config(1024)
    consts = {"GROUP": 8, "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "PAGE_SIZE": 16, "HAS_QLENS": True, "DOT_F32": False, "WINDOW": False, "HAS_QSTARTS": True,
              "KV_F16": False, "SOFTCAP": False, "ALIBI": False, "SINKS": sinks, "Slopes": None,
              "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1}  # fmt: skip
    pointers = dict.fromkeys(("Q", "Out", "K", "V"), "*bf16")
    pointers |= dict.fromkeys(("SeqLens", "QLens", "QStarts", "Table"), "*i32")
    if sinks:
        pointers["Sinks"] = "*fp32"
    else:
        consts["Sinks"] = None
    ints = {"stride_qb": 0, "stride_qh": 64, "stride_qm": 4096, "stride_kb": 8192, "stride_kh": 64,
            "stride_kn": 512, "stride_vb": 8192, "stride_vh": 64, "stride_vn": 512, "stride_ob": 0,
            "stride_oh": 64, "stride_om": 4096, "stride_tb": 256, "num_kv_heads": 8, "seq_q": 1024,
            "window": 0}  # fmt: skip
    return compile_facts(
        cp._chunked_prefill_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


@pytest.mark.parametrize("kernel", ["_decode_facts", "_chunk_facts"])
def test_the_sinks_compile_for_sm90_and_are_compiled_out_when_off(kernel):
    """Both kernels assemble for sm_90 with the sinks, spilling nothing; with them on, each program loads
    its rows' sinks (a global load more), which the off code has not."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    on = run_in_child(f"{__name__}:{kernel}", True)
    off = run_in_child(f"{__name__}:{kernel}", False)
    assert on["ptxas_rc"] == 0 and off["ptxas_rc"] == 0, (on["ptxas"], off["ptxas"])
    assert max(on["spills"], default=0) == max(off["spills"], default=0) == 0, (on["ptxas"], off["ptxas"])

    def count(facts: dict, *prefixes: str) -> int:
        return sum(n for op, n in facts["counts"].items() if op.startswith(prefixes))

    assert count(on, "ld.global") > count(off, "ld.global"), (on["counts"], off["counts"])


def test_a_device_tensor_query_without_sinks_passes_and_with_sinks_is_refused():
    """The TensorRT plugin launches the kernels on DeviceTensor views, which have no ``device``: without
    sinks the check never looks at the query; with sinks it says they need a torch query."""
    from trtforge.kernels.device_tensor import DeviceTensor

    view = DeviceTensor(ptr=0, dtype=torch.float16, shape=(1, 4, 1, 32), strides=(128, 32, 32, 1))
    assert check_sinks(None, 4, view) is None
    with pytest.raises(ValueError, match="sinks need the query as a torch tensor; got DeviceTensor"):
        check_sinks(torch.ones(4), 4, view)
