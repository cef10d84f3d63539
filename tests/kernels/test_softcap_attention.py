"""Attention logit soft-capping (Gemma 2's ``attn_logit_softcapping``) in the decode and chunked-prefill
kernels: each score s = q . k * scale becomes cap * tanh(s / cap) before the causal / window masks.

Each numeric case runs in Triton's CPU interpreter without CUDA (tests/kernels/conftest.py) and on the
GPU for real (``-m gpu``: tests/_devices.py), against an FP32 reference that applies torch's tanh. The
queries are scaled up so that the scores reach past the cap: every case first checks that the cap
changes the reference's answer by far more than the tolerance.
The sm_90 compile checks (Triton's bundled ptxas, no GPU) show the cap is compiled out when off.
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
    check_softcap,
    decode_attention,
    prepare_paged_decode,
)

TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}
BITES = 0.1  # the least change the cap must make to the reference (scores well past it)


def _inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype, q_gain=3.0):
    """:func:`attention_inputs` with q scaled by `q_gain`, so that the scores pass the cap."""
    return attention_inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype, q_gain)


def _reference(q, k, v, lens, cap, window=None, scale=None):
    """The capped FP32 reference, after checking that the cap bites (the uncapped one differs)."""
    want = softcapped_reference(q, k, v, lens.cpu(), cap, window, scale)
    free = softcapped_reference(q, k, v, lens.cpu(), None, window, scale)
    assert (want - free).abs().max().item() > BITES, "the cap does not change the answer here"
    return want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "splits", "dtype", "window", "cap"),
    [
        (4, 1, 1, 64, [1, 15, 40], 0, 0, torch.float16, None, 2.0),
        (8, 2, 4, 64, [17, 50], 16, 3, torch.bfloat16, None, 5.0),  # GQA 4, verification rows, splits
        (4, 1, 4, 32, [30, 70], 16, 2, torch.float16, 9, 3.0),  # with a sliding window
        (2, 2, 1, 80, [33, 5], 0, 1, torch.float16, None, 2.5),  # MHA, a head dim that pads
        (2, 1, 1, 256, [20, 1], 64, 0, torch.float16, None, 2.0),  # Gemma's head dim
    ],
)
def test_decode_kernel_soft_caps_the_scores(device, hq, hkv, s_q, d, lens, page, splits, dtype, window, cap):
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(sum(lens) + d + int(cap * 10))
    b, s_max = len(lens), max(lens) + 3
    q, k, v = _inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    want = _reference(q, k, v, seq_lens, cap, window)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    cfg = DecodeConfig(block_n=16, num_splits=splits)
    decode_attention(q, k, v, seq_lens, table, out=out, config=cfg, window=window, softcap=cap)
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_paged_decode_takes_the_layer_cap(device):
    """The executor's prepared launch (one per layer geometry, the cap in it) gives decode_attention's
    output bit for bit, and over the capped reference; a launch prepared without the cap does not."""
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d, cap = 8, 2, 64, 2.0
    lens = torch.tensor([23, 9, 40], dtype=torch.int32, device=device)
    q, k, v = _inputs(device, gen, 3, hq, hkv, 1, 44, d, torch.float16)
    want = _reference(q, k, v, lens, cap)
    k_pool, v_pool, table = paged_from_contiguous(k, v, lens.cpu(), 16, gen)
    cfg = DecodeConfig(block_n=16, num_splits=2)
    q3 = q[:, :, 0].contiguous()
    capped, plain = torch.empty_like(q3), torch.empty_like(q3)
    scale = d**-0.5
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, capped, config=cfg, softcap=cap)(
        q3, k_pool, v_pool, capped, scale, 1.0
    )
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, plain, config=cfg)(
        q3, k_pool, v_pool, plain, scale, 1.0
    )
    direct = decode_attention(q, k_pool, v_pool, lens, table, config=cfg, softcap=cap)[:, :, 0]
    torch.testing.assert_close(capped, direct, atol=0, rtol=0)
    assert (capped.float().cpu() - want[:, :, 0]).abs().max().item() < TOL[torch.float16]
    assert (plain.float().cpu() - want[:, :, 0]).abs().max().item() > BITES


@pytest.mark.parametrize("device", DEVICES)
def test_decode_over_fp8_pools_caps_the_scaled_scores(device):
    """FP8 pools: the query carries the softmax scale times the K scale in FP16 (KV_F16), so the cap
    applies to the scores of the dequantized keys, as over 16-bit pools."""
    from trtforge.kernels.kv_quant import FP8_KV_DTYPE

    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 pools need compute capability >= 8.9")
    gen = torch.Generator().manual_seed(9)
    hq, hkv, d, cap, k_scale, v_scale = 4, 1, 64, 3.0, 0.5, 0.25
    lens = torch.tensor([12, 37], dtype=torch.int32, device=device)
    q, k, v = _inputs(device, gen, 2, hq, hkv, 1, 40, d, torch.bfloat16)
    kq, vq = (k.float() / k_scale).to(FP8_KV_DTYPE), (v.float() / v_scale).to(FP8_KV_DTYPE)
    want = _reference(q, kq.float() * k_scale, vq.float() * v_scale, lens, cap)
    out = decode_attention(
        q, kq, vq, lens, config=DecodeConfig(block_n=16), k_scale=k_scale, v_scale=v_scale, softcap=cap
    )
    assert (out.float().cpu() - want).abs().max().item() < TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "dtype", "window", "cap", "block_m"),
    [
        (4, 1, 5, 64, [5, 21, 40], 16, torch.float16, None, 2.0, 16),  # no prefix, prefix 16, prefix 35
        (8, 2, 20, 32, [33, 20], 0, torch.bfloat16, 6, 4.0, 32),  # GQA 4 with a sliding window
        (2, 2, 37, 32, [37, 50], 16, torch.float16, None, 3.0, 16),  # a chunk longer than a row tile
    ],
)
def test_chunked_prefill_soft_caps_the_scores(
    device, hq, hkv, s_q, d, lens, page, dtype, window, cap, block_m
):
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(s_q * d + hq)
    b, s_max = len(lens), max(lens) + 5
    q, k, v = _inputs(device, gen, b, hq, hkv, s_q, s_max, d, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    want = _reference(q, k, v, seq_lens, cap, window)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(
        q, k, v, seq_lens, table, out=out, block_m=block_m, block_n=16, window=window, softcap=cap
    )
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_chunks_take_the_cap(device):
    """The served varlen launch (flat rows, ragged chunks, shuffled tables) with a cap gives each chunk's
    own capped launch exactly, and the capped reference."""
    skip_unless_runs_here(device)
    gen = torch.Generator().manual_seed(13)
    hq, hkv, d, page, cap, scale = 8, 2, 32, 16, 2.0, 0.5
    k, v = (torch.randn(3, hkv, 80, d, generator=gen).half().to(device) for _ in range(2))
    starts, q_lens, lens = [0, 17, 58], [17, 41, 2], [17, 70, 35]
    k_pool, v_pool, table = paged_from_contiguous(k, v, torch.tensor(lens), page, gen)
    q = torch.randn(64, hq, d, generator=gen).half().to(device)
    as_i32 = {n: torch.tensor(x, dtype=torch.int32, device=device) for n, x in (("s", starts), ("q", q_lens))}
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_varlen(
        q, k_pool, v_pool, seq_lens, table, as_i32["s"], as_i32["q"], max(q_lens), scale=scale, out=out,
        softcap=cap,
    )  # fmt: skip
    for i, (s, n) in enumerate(zip(starts, q_lens)):
        chunk = q[s : s + n].permute(1, 0, 2)[None]
        own = chunked_prefill_attention(
            chunk, k_pool, v_pool, seq_lens[i : i + 1], table[i : i + 1], scale=scale, softcap=cap
        )[0].permute(1, 0, 2)
        torch.testing.assert_close(out[s : s + n], own, atol=0, rtol=0)
        want = _reference(chunk, k[i : i + 1], v[i : i + 1], seq_lens[i : i + 1], cap, scale=scale)
        assert (out[s : s + n].float().cpu() - want[0].permute(1, 0, 2)).abs().max().item() < 3e-3


@pytest.mark.parametrize("cap", [0.0, -2.0, float("nan"), float("inf")])
def test_a_cap_must_be_a_positive_finite_number(cap):
    with pytest.raises(ValueError, match="soft-cap must be a finite number > 0"):
        check_softcap(cap)
    q = torch.zeros(1, 2, 1, 32, dtype=torch.float16)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match="soft-cap"):
        decode_attention(q, q, q, lens, softcap=cap)
    with pytest.raises(ValueError, match="soft-cap"):
        chunked_prefill_attention(q, q, q, lens, softcap=cap)


def test_soft_capped_layers_never_take_the_hopper_chunk_kernel():
    """The Hopper flash-attention kernel applies no cap: a soft-capped layer's long chunks stay on the
    varlen kernel (the check comes before any device question, so it holds on any machine)."""
    q = torch.zeros(4, 2, 64, dtype=torch.float16)
    assert not hopper_chunks_eligible(q, q, None, softcap=50.0)


def _decode_facts(softcap: bool) -> dict:
    """The served decode launch over 16-bit pools (Gemma-2-27B's shape: 32 query heads on 16 kv heads of
    128 channels; 16-token pages), compiled for sm_90, with or without the cap."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import decode_attention as da

    cfg = da.default_decode_config(128, torch.bfloat16, 4096, 64)
    opts = da._split_options(
        cfg, 2, 1, 128, 16, False, True, False, 0, False, torch.bfloat16, torch.bfloat16, None,
        50.0 if softcap else 0.0,
    )  # fmt: skip
    consts = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages", "launch_pdl")}
    consts |= {"STAMP": False, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1}
    pointers = dict.fromkeys(("Q", "Out", "K", "V", "KDesc", "VDesc"), "*bf16")
    pointers |= {"MidO": "*fp32", "MidL": "*fp32"} | dict.fromkeys(("SeqLens", "Table", "Counters"), "*i32")
    ints = {"stride_qb": 4096, "stride_qh": 128, "stride_qm": 4096, "stride_kb": 32768, "stride_kh": 128,
            "stride_kn": 2048, "stride_vb": 32768, "stride_vh": 128, "stride_vn": 2048, "stride_ob": 4096,
            "stride_oh": 128, "stride_om": 4096, "stride_tb": 256, "num_kv_heads": 16, "num_splits": 2,
            "window": 0}  # fmt: skip
    return compile_facts(
        da._decode_split_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


def _chunk_facts(softcap: bool) -> dict:
    """The served varlen chunked-prefill launch of a 1,024-token chunk at Gemma-2-27B's shape, compiled
    for sm_90, with or without the cap."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import chunked_prefill as cp
    from trtforge.kernels.configs import chunk_prefill_config

    cfg = chunk_prefill_config(1024)
    consts = {"GROUP": 2, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "PAGE_SIZE": 16, "HAS_QLENS": True, "DOT_F32": False, "WINDOW": False, "HAS_QSTARTS": True,
              "KV_F16": False, "SOFTCAP": softcap, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1,
              "stride_od": 1}  # fmt: skip
    pointers = dict.fromkeys(("Q", "Out", "K", "V"), "*bf16")
    pointers |= dict.fromkeys(("SeqLens", "QLens", "QStarts", "Table"), "*i32")
    ints = {"stride_qb": 0, "stride_qh": 128, "stride_qm": 4096, "stride_kb": 32768, "stride_kh": 128,
            "stride_kn": 2048, "stride_vb": 32768, "stride_vh": 128, "stride_vn": 2048, "stride_ob": 0,
            "stride_oh": 128, "stride_om": 4096, "stride_tb": 256, "num_kv_heads": 16, "seq_q": 1024,
            "window": 0}  # fmt: skip
    return compile_facts(
        cp._chunked_prefill_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


@pytest.mark.parametrize("kernel", ["_decode_facts", "_chunk_facts"])
def test_the_cap_compiles_for_sm90_and_is_compiled_out_when_off(kernel):
    """Both kernels assemble for sm_90 with the cap (its tanh is an exp2 and a division a score, no
    libdevice call), spilling nothing more than without it; without it their code holds none of that."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    on = run_in_child(f"{__name__}:{kernel}", True)
    off = run_in_child(f"{__name__}:{kernel}", False)
    assert on["ptxas_rc"] == 0 and off["ptxas_rc"] == 0, (on["ptxas"], off["ptxas"])
    print(kernel, "spills on / off:", on["spills"], off["spills"])
    assert max(on["spills"], default=0) == max(off["spills"], default=0) == 0, (on["ptxas"], off["ptxas"])
    assert not any("tanh" in op for op in on["counts"]), on["counts"]

    def count(facts: dict, *prefixes: str) -> int:
        return sum(n for op, n in facts["counts"].items() if op.startswith(prefixes))

    assert count(on, "ex2") > count(off, "ex2"), (on["counts"], off["counts"])
    assert count(on, "div", "rcp") > count(off, "div", "rcp"), (on["counts"], off["counts"])
