"""The per-head attention options of the decode and chunked-prefill kernels, one parametrized case each:

- ``softcap``: logit soft-capping (Gemma 2's ``attn_logit_softcapping``): each score s = q . k * scale
  becomes cap * tanh(s / cap) before the causal / window masks. The queries are scaled up so that the
  scores reach past the cap.
- ``alibi``: ALiBi position biases (BLOOM, MPT, falcon-rw): the score of the query at position p and the
  key at position j gets ``slope_h * (j - p)`` (one slope a query head), after the cap and before the
  masks.
- ``sinks``: attention sinks (gpt-oss): head h's learned sink logit joins each of its query rows' softmax
  denominators as one more column that takes probability mass and gives no value (transformers' eager
  gpt-oss attention: the logits with the sink appended, softmaxed, the sink's column dropped). The cap and
  the biases act on the scores, never on the sink.

:data:`OPTIONS` holds what differs between them (how to draw the option's value, the keyword each kernel
API and the reference take it by, its validation, its constexpr and model shape in the compile checks);
each shape of test is written once over it. Each numeric case runs in Triton's CPU interpreter without
CUDA (tests/kernels/conftest.py) and on the GPU for real (``-m gpu``: tests/_devices.py), against an FP32
reference (tests/kernels/decode_reference.py, torch's tanh for the cap). Every case first checks that the
option bites: it changes the reference's answer by far more than the tolerance. The split-KV decode cases
run 1 to 6 splits, with splits that see no key, the fused reduction and the reduce kernel: a sink must count
once a row, whichever split holds it. Bad values are refused naming the option; layers with any of the
options never take the Hopper chunk kernel (which applies none of them). The sm_90 compile checks (Triton's
bundled ptxas, no GPU, in a child process) show each option compiled in when on, spilling nothing, and
compiled out when off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

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
    check_sinks,
    check_softcap,
    decode_attention,
    prepare_paged_decode,
)
from trtforge.llm.models.base import bloom_alibi_slopes, mpt_alibi_slopes  # noqa: E402

TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


class Decode(NamedTuple):
    """A split-KV decode case; `spec` is what :attr:`Option.draw` turns into the option's value."""

    hq: int
    hkv: int
    s_q: int
    d: int
    lens: list[int]
    page: int
    splits: int
    fused: bool
    dtype: torch.dtype
    window: int | None
    spec: Any


class Chunk(NamedTuple):
    """A chunked-prefill case; `spec` as in :class:`Decode`."""

    hq: int
    hkv: int
    s_q: int
    d: int
    lens: list[int]
    page: int
    dtype: torch.dtype
    window: int | None
    spec: Any
    block_m: int


@dataclass(frozen=True)
class Option:
    """One per-head attention option: everything its tests do differently."""

    what: str  # in the "does not bite" message: "<what> change nothing here"
    kernel_kw: str  # the keyword of decode_attention, prepare_paged_decode and the chunk launches
    reference_kw: str  # softcapped_reference's keyword
    draw: Callable[[Any, int, torch.Generator, Any], Any]  # (spec, hq, gen, device) -> the value
    q_gain: float  # the queries' scale (the cap bites only on scores past it)
    bites: float  # the least change the option must make to the reference
    decode_seed: Callable[[Decode], int]
    decode: list  # the decode grid (pytest.param of Decode)
    chunk: list  # the chunked-prefill grid (pytest.param of Chunk)
    prepared: tuple[int, Any]  # (num_splits, spec) of the prepared-launch case
    fp8: tuple[int, Any]  # (num_splits, spec) of the FP8-pool case
    varlen: Any  # the spec of the varlen case
    check: Callable[[Any, int, Any], Any]  # (value, hq, q) -> the launch's checked value
    label: str  # how its refusals name it
    refusal: str  # the full message (a regex) a bad value gets, for 4 query heads
    bad: list  # pytest.param of bad values
    hopper_value: Callable[[int], Any]  # a valid value for hq heads
    constexpr: str  # the kernels' constexpr that compiles it in
    pointer: str | None  # the kernels' tensor argument of it (None: a scalar)
    model: tuple[str, int, int, int]  # the compile checks' served shape: (name, group, kv heads, head dim)
    more_when_on: tuple[tuple[str, ...], ...]  # PTX op prefixes that count more with the option on
    never: str | None = None  # a PTX op the code with it on must not hold


def _slopes(kind: str, hq: int, device) -> torch.Tensor:
    """BLOOM's or MPT's slopes for `hq` heads (non-powers of two included), on `device`."""
    return (bloom_alibi_slopes(hq) if kind == "bloom" else mpt_alibi_slopes(hq)).to(device)


def _sinks(hq: int, gen, device) -> torch.Tensor:
    """Sink logits of the size trained ones reach (a few units either side of 0), one a query head."""
    return (torch.randn(hq, generator=gen) * 2.0 + 0.5).to(device)


# the per-head tensors' bad values (4 query heads)
_BAD_VECTORS = [
    pytest.param(torch.ones(3), id="heads"),
    pytest.param(torch.ones(4, dtype=torch.float16), id="dtype"),
    pytest.param(torch.ones(4, 1), id="shape"),
    pytest.param(torch.ones(8)[::2], id="strided"),
    pytest.param([1.0] * 4, id="list"),
]

OPTIONS: dict[str, Option] = {
    "softcap": Option(
        what="the cap",
        kernel_kw="softcap",
        reference_kw="softcap",
        draw=lambda cap, hq, gen, device: cap,
        q_gain=3.0,
        bites=0.1,
        decode_seed=lambda c: sum(c.lens) + c.d + int(c.spec * 10),
        decode=[
            pytest.param(Decode(4, 1, 1, 64, [1, 15, 40], 0, 0, True, torch.float16, None, 2.0), id="mqa"),
            pytest.param(  # GQA 4, verification rows, splits
                Decode(8, 2, 4, 64, [17, 50], 16, 3, True, torch.bfloat16, None, 5.0), id="gqa4-rows-splits"
            ),
            pytest.param(  # with a sliding window
                Decode(4, 1, 4, 32, [30, 70], 16, 2, True, torch.float16, 9, 3.0), id="window"
            ),
            pytest.param(  # MHA, a head dim that pads
                Decode(2, 2, 1, 80, [33, 5], 0, 1, True, torch.float16, None, 2.5), id="mha-d80"
            ),
            pytest.param(  # Gemma's head dim
                Decode(2, 1, 1, 256, [20, 1], 64, 0, True, torch.float16, None, 2.0), id="d256"
            ),
        ],
        chunk=[
            pytest.param(  # no prefix, prefix 16, prefix 35
                Chunk(4, 1, 5, 64, [5, 21, 40], 16, torch.float16, None, 2.0, 16), id="prefixes"
            ),
            pytest.param(  # GQA 4 with a sliding window
                Chunk(8, 2, 20, 32, [33, 20], 0, torch.bfloat16, 6, 4.0, 32), id="gqa-window"
            ),
            pytest.param(  # a chunk longer than a row tile
                Chunk(2, 2, 37, 32, [37, 50], 16, torch.float16, None, 3.0, 16), id="long-chunk"
            ),
        ],
        prepared=(2, 2.0),
        fp8=(0, 3.0),
        varlen=2.0,
        check=lambda cap, hq, q: check_softcap(cap),
        label="soft-cap",
        refusal="soft-cap must be a finite number > 0",
        bad=[
            pytest.param(0.0, id="zero"),
            pytest.param(-2.0, id="negative"),
            pytest.param(float("nan"), id="nan"),
            pytest.param(float("inf"), id="inf"),
        ],
        hopper_value=lambda hq: 50.0,
        constexpr="SOFTCAP",
        pointer=None,
        model=("Gemma-2-27B", 2, 16, 128),
        # its tanh is an exp2 and a division a score, no libdevice call
        more_when_on=(("ex2",), ("div", "rcp")),
        never="tanh",
    ),
    "alibi": Option(
        what="the biases",
        kernel_kw="alibi_slopes",
        reference_kw="slopes",
        draw=lambda kind, hq, gen, device: _slopes(kind, hq, device),
        q_gain=1.0,
        bites=0.1,
        decode_seed=lambda c: sum(c.lens) + c.d + c.hq,
        decode=[
            pytest.param(  # MHA (BLOOM)
                Decode(4, 4, 1, 64, [1, 15, 40], 0, 0, True, torch.float16, None, "bloom"), id="mha"
            ),
            pytest.param(  # 6 heads, GQA 3, verification rows
                Decode(6, 2, 4, 64, [17, 50], 16, 3, True, torch.bfloat16, None, "bloom"),
                id="gqa3-rows-splits",
            ),
            pytest.param(  # with a sliding window
                Decode(4, 1, 4, 32, [30, 70], 16, 2, True, torch.float16, 9, "mpt"), id="window"
            ),
            pytest.param(  # 5 heads, a head dim that pads
                Decode(5, 5, 1, 80, [33, 5], 0, 1, True, torch.float16, None, "mpt"), id="mha5-d80"
            ),
            pytest.param(  # long keys over four splits
                Decode(2, 1, 1, 128, [90, 1], 64, 4, True, torch.float16, None, "bloom"), id="long-4-splits"
            ),
        ],
        chunk=[
            pytest.param(  # no prefix, prefix 16, prefix 35
                Chunk(4, 1, 5, 64, [5, 21, 40], 16, torch.float16, None, "bloom", 16), id="prefixes"
            ),
            pytest.param(  # 6 heads, GQA 3, a sliding window
                Chunk(6, 2, 20, 32, [33, 20], 0, torch.bfloat16, 6, "mpt", 32), id="gqa-window"
            ),
            pytest.param(  # a chunk longer than a row tile
                Chunk(3, 3, 37, 32, [37, 50], 16, torch.float16, None, "bloom", 16), id="long-chunk"
            ),
        ],
        prepared=(2, "mpt"),
        fp8=(0, "bloom"),
        varlen="bloom",
        check=check_alibi_slopes,
        label="ALiBi slopes",
        refusal=r"ALiBi slopes must be a contiguous float32 \[4\] tensor",
        bad=_BAD_VECTORS,
        hopper_value=lambda hq: torch.ones(hq),
        constexpr="ALIBI",
        pointer="Slopes",
        model=("bloom-7b1", 1, 32, 128),
        # each score tile takes a fused multiply-add more per element, from the keys' int positions
        more_when_on=(("fma", "mul.f32", "add.f32"), ("cvt.rn.f32.s32",)),
    ),
    "sinks": Option(
        what="the sinks",
        kernel_kw="sinks",
        reference_kw="sinks",
        draw=lambda _, hq, gen, device: _sinks(hq, gen, device),
        q_gain=1.0,
        bites=0.05,
        decode_seed=lambda c: sum(c.lens) + c.d + c.hq + c.splits,
        decode=[
            pytest.param(  # one split: the direct store
                Decode(4, 4, 1, 64, [1, 15, 40], 0, 1, True, torch.float16, None, None), id="one-split"
            ),
            pytest.param(  # GQA 4, verification rows, 3 splits
                Decode(8, 2, 4, 64, [17, 50], 16, 3, True, torch.bfloat16, None, None), id="gqa4-rows-splits"
            ),
            pytest.param(  # a window, the reduce kernel
                Decode(4, 1, 1, 64, [70, 30], 16, 2, False, torch.float16, 9, None), id="window-reduce"
            ),
            pytest.param(  # 6 splits, most of them empty at 1
                Decode(2, 1, 1, 64, [90, 1, 33], 16, 6, True, torch.float16, None, None), id="empty-splits"
            ),
            pytest.param(  # window + empty splits, reduce kernel
                Decode(2, 1, 2, 64, [90, 2, 40], 0, 5, False, torch.float16, 20, None),
                id="window-empty-splits-reduce",
            ),
        ],
        chunk=[
            pytest.param(  # no prefix, prefix 16, prefix 35
                Chunk(4, 1, 5, 64, [5, 21, 40], 16, torch.float16, None, None, 16), id="prefixes"
            ),
            pytest.param(  # GQA 4, a sliding window
                Chunk(8, 2, 20, 64, [33, 20], 0, torch.bfloat16, 6, None, 32), id="gqa-window"
            ),
            pytest.param(  # a chunk longer than a row tile
                Chunk(2, 2, 37, 64, [37, 50], 16, torch.float16, None, None, 16), id="long-chunk"
            ),
        ],
        prepared=(3, None),
        fp8=(2, None),
        varlen=None,
        check=check_sinks,
        label="attention sinks",
        refusal=r"attention sinks must be a contiguous float32 \[4\] tensor",
        bad=_BAD_VECTORS,
        hopper_value=lambda hq: torch.ones(hq),
        constexpr="SINKS",
        pointer="Sinks",
        model=("gpt-oss-20b", 8, 8, 64),
        # each program loads its rows' sinks: a global load more
        more_when_on=(("ld.global",),),
    ),
}


def _each(field: str) -> list:
    """`field`'s cases of every option as ``(option, case)`` params, ids ``option-case``."""
    return [
        pytest.param(name, case.values[0], id=f"{name}-{case.id}")
        for name, option in OPTIONS.items()
        for case in getattr(option, field)
    ]


def _kernel_kwargs(values: dict[str, Any]) -> dict[str, Any]:
    """Option name -> value, as the kernel APIs' keywords."""
    return {OPTIONS[name].kernel_kw: v for name, v in values.items()}


def _reference(name, value, q, k, v, lens, window=None, scale=None, others=None):
    """The FP32 reference with option `name` at `value` (beside `others`: option name -> value), after
    checking that the option bites (the reference without it, `others` kept, differs)."""
    option = OPTIONS[name]
    free_kw = {"softcap": None} | {OPTIONS[n].reference_kw: x for n, x in (others or {}).items()}
    want = softcapped_reference(q, k, v, lens.cpu(), window=window, scale=scale, **free_kw | {
        option.reference_kw: value
    })  # fmt: skip
    free = softcapped_reference(q, k, v, lens.cpu(), window=window, scale=scale, **free_kw)
    assert (want - free).abs().max().item() > option.bites, f"{name}: {option.what} change nothing here"
    return want


def _case(device: str, option: str, case: Decode | Chunk, seed: int, spare: int) -> tuple:
    """A grid case's q, k, v (keys past each length NaN; paged through a shuffled table when the case
    has pages), lengths, table (None: contiguous), the option's value and the FP32 reference, drawn from
    one generator seeded `seed`, with `spare` key slots past the longest sequence."""
    opt = OPTIONS[option]
    gen = torch.Generator().manual_seed(seed)
    b, s_max = len(case.lens), max(case.lens) + spare
    q, k, v = attention_inputs(
        device, gen, b, case.hq, case.hkv, case.s_q, s_max, case.d, case.dtype, opt.q_gain
    )
    seq_lens = torch.tensor(case.lens, dtype=torch.int32, device=device)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    value = opt.draw(case.spec, case.hq, gen, device)
    want = _reference(option, value, q, k, v, seq_lens, case.window)
    table = None
    if case.page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), case.page, gen)
    return q, k, v, seq_lens, table, value, want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("option", "case"), _each("decode"))
def test_decode_kernel_applies_the_option(device, option, case):
    """The split-KV decode kernel (contiguous caches and shuffled pages, 1 to 6 splits, fused or through the
    reduce kernel) against the FP32 reference; past-length keys are NaN, never read."""
    skip_unless_runs_here(device)
    opt = OPTIONS[option]
    q, k, v, seq_lens, table, value, want = _case(device, option, case, opt.decode_seed(case), spare=3)
    out = torch.full_like(q, float("nan"))
    cfg = DecodeConfig(block_n=16, num_splits=case.splits, fused=case.fused)
    decode_attention(
        q, k, v, seq_lens, table, out=out, config=cfg, window=case.window, **{opt.kernel_kw: value}
    )
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[case.dtype], err


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("option", "spec", "splits", "others"),
    [
        # the biases go on the capped scores (the order the step graph and the torch references share)
        pytest.param("alibi", "bloom", 0, {"softcap": 2.0}, id="alibi-after-the-cap"),
        # the sink is a column of its own: the cap and the biases act on the scores, never on it
        pytest.param(
            "sinks",
            None,
            2,
            {"softcap": 2.0, "alibi": [0.5, 0.25, 0.125, 0.0625]},
            id="sinks-beside-cap-alibi",
        ),
    ],
)
def test_decode_kernel_applies_the_option_beside_the_others(device, option, spec, splits, others):
    """An option on top of those that come before it in the kernels (cap, then biases, then sinks)."""
    skip_unless_runs_here(device)
    opt = OPTIONS[option]
    gen = torch.Generator().manual_seed(3)
    lens = torch.tensor([20, 41], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 2, 4, 2, 2, 44, 32, torch.float16)
    q = q * 3
    value = opt.draw(spec, 4, gen, device)
    others = {n: torch.tensor(x, device=device) if isinstance(x, list) else x for n, x in others.items()}
    want = _reference(option, value, q, k, v, lens, others=others)
    cfg = DecodeConfig(block_n=16, num_splits=splits)
    out = decode_attention(q, k, v, lens, config=cfg, **_kernel_kwargs(others), **{opt.kernel_kw: value})
    assert (out.float().cpu() - want).abs().max().item() < TOL[torch.float16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("option", OPTIONS)
def test_prepared_paged_decode_takes_the_layer_option(device, option):
    """The executor's prepared launch (one per layer geometry, the option in it) gives decode_attention's
    output bit for bit, and the reference's; a launch prepared without the option does not."""
    skip_unless_runs_here(device)
    opt = OPTIONS[option]
    splits, spec = opt.prepared
    gen = torch.Generator().manual_seed(5)
    hq, hkv, d = 8, 2, 64
    lens = torch.tensor([23, 9, 40], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 3, hq, hkv, 1, 44, d, torch.float16, opt.q_gain)
    value = opt.draw(spec, hq, gen, device)
    want = _reference(option, value, q, k, v, lens)
    k_pool, v_pool, table = paged_from_contiguous(k, v, lens.cpu(), 16, gen)
    cfg = DecodeConfig(block_n=16, num_splits=splits)
    q3 = q[:, :, 0].contiguous()
    with_it, plain = torch.empty_like(q3), torch.empty_like(q3)
    scale = d**-0.5
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, with_it, config=cfg, **{opt.kernel_kw: value})(
        q3, k_pool, v_pool, with_it, scale, 1.0
    )
    prepare_paged_decode(q3, k_pool, v_pool, lens, table, plain, config=cfg)(
        q3, k_pool, v_pool, plain, scale, 1.0
    )
    direct = decode_attention(q, k_pool, v_pool, lens, table, config=cfg, **{opt.kernel_kw: value})[:, :, 0]
    torch.testing.assert_close(with_it, direct, atol=0, rtol=0)
    assert (with_it.float().cpu() - want[:, :, 0]).abs().max().item() < TOL[torch.float16]
    assert (plain.float().cpu() - want[:, :, 0]).abs().max().item() > opt.bites


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("option", OPTIONS)
def test_decode_over_fp8_pools_applies_the_option(device, option):
    """FP8 pools: the query carries the softmax scale (times the K scale) in FP16 (KV_F16), so the cap
    applies to the scores of the dequantized keys, and the biases and sinks, in natural units, go on (join
    the softmax of) the dequantized scores, as over 16-bit pools."""
    from trtforge.kernels.kv_quant import FP8_KV_DTYPE

    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 pools need compute capability >= 8.9")
    opt = OPTIONS[option]
    splits, spec = opt.fp8
    gen = torch.Generator().manual_seed(9)
    hq, hkv, d, k_scale, v_scale = 4, 1, 64, 0.5, 0.25
    lens = torch.tensor([12, 37], dtype=torch.int32, device=device)
    q, k, v = attention_inputs(device, gen, 2, hq, hkv, 1, 40, d, torch.bfloat16, opt.q_gain)
    kq, vq = (k.float() / k_scale).to(FP8_KV_DTYPE), (v.float() / v_scale).to(FP8_KV_DTYPE)
    value = opt.draw(spec, hq, gen, device)
    want = _reference(option, value, q, kq.float() * k_scale, vq.float() * v_scale, lens)
    cfg = DecodeConfig(block_n=16, num_splits=splits)
    out = decode_attention(
        q, kq, vq, lens, config=cfg, k_scale=k_scale, v_scale=v_scale, **{opt.kernel_kw: value}
    )
    assert (out.float().cpu() - want).abs().max().item() < TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("option", "case"), _each("chunk"))
def test_chunked_prefill_applies_the_option(device, option, case):
    skip_unless_runs_here(device)
    opt = OPTIONS[option]
    q, k, v, seq_lens, table, value, want = _case(device, option, case, case.s_q * case.d + case.hq, spare=5)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(
        q, k, v, seq_lens, table, out=out, block_m=case.block_m, block_n=16, window=case.window,
        **{opt.kernel_kw: value},
    )  # fmt: skip
    assert not torch.isnan(out).any()
    err = (out.float().cpu() - want).abs().max().item()
    assert err < TOL[case.dtype], err


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("option", OPTIONS)
def test_varlen_chunks_take_the_option(device, option):
    """The served varlen launch (flat rows, ragged chunks, shuffled tables) with the option gives each
    chunk's own launch exactly, and the reference."""
    skip_unless_runs_here(device)
    opt = OPTIONS[option]
    gen = torch.Generator().manual_seed(13)
    hq, hkv, d, page, scale = 8, 2, 32, 16, 0.5
    k, v = (torch.randn(3, hkv, 80, d, generator=gen).half().to(device) for _ in range(2))
    starts, q_lens, lens = [0, 17, 58], [17, 41, 2], [17, 70, 35]
    k_pool, v_pool, table = paged_from_contiguous(k, v, torch.tensor(lens), page, gen)
    q = torch.randn(64, hq, d, generator=gen).half().to(device)
    as_i32 = {n: torch.tensor(x, dtype=torch.int32, device=device) for n, x in (("s", starts), ("q", q_lens))}
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    value = opt.draw(opt.varlen, hq, gen, device)
    kw = {opt.kernel_kw: value}
    out = torch.full_like(q, float("nan"))
    chunked_prefill_varlen(
        q, k_pool, v_pool, seq_lens, table, as_i32["s"], as_i32["q"], max(q_lens), scale=scale, out=out, **kw
    )
    for i, (s, n) in enumerate(zip(starts, q_lens)):
        chunk = q[s : s + n].permute(1, 0, 2)[None]
        own = chunked_prefill_attention(
            chunk, k_pool, v_pool, seq_lens[i : i + 1], table[i : i + 1], scale=scale, **kw
        )[0].permute(1, 0, 2)
        torch.testing.assert_close(out[s : s + n], own, atol=0, rtol=0)
        want = _reference(option, value, chunk, k[i : i + 1], v[i : i + 1], seq_lens[i : i + 1], scale=scale)
        assert (out[s : s + n].float().cpu() - want[0].permute(1, 0, 2)).abs().max().item() < 3e-3


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        pytest.param(name, p.values[0], id=f"{name}-{p.id}")
        for name, option in OPTIONS.items()
        for p in option.bad
    ],
)
def test_bad_values_are_refused_by_name(option, bad):
    """A cap must be a finite number > 0; slopes and sinks one contiguous float32 a query head. The check
    and both kernel APIs refuse anything else, naming the option."""
    opt = OPTIONS[option]
    q = torch.zeros(1, 4, 1, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match=opt.refusal):
        opt.check(bad, 4, q)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match=opt.label):
        decode_attention(q, q, q, lens, **{opt.kernel_kw: bad})
    with pytest.raises(ValueError, match=opt.label):
        chunked_prefill_attention(q, q, q, lens, **{opt.kernel_kw: bad})


@pytest.mark.parametrize("option", OPTIONS)
def test_option_layers_never_take_the_hopper_chunk_kernel(option):
    """The Hopper flash-attention kernel applies no cap, no position bias and has no sink column: such a
    layer's long chunks stay on the varlen kernel (the check comes before any device question, so it holds
    on any machine)."""
    opt = OPTIONS[option]
    q = torch.zeros(4, 2, 64, dtype=torch.float16)
    assert not hopper_chunks_eligible(q, q, None, **{opt.kernel_kw: opt.hopper_value(2)})


@pytest.mark.parametrize("option", [o for o, opt in OPTIONS.items() if opt.pointer])
def test_a_device_tensor_query_without_the_option_passes_and_with_it_is_refused(option):
    """The TensorRT plugin launches the kernels on DeviceTensor views, which have no ``device``: without
    slopes or sinks the check never looks at the query (the H100 run of session 42 caught it reading
    q.device first); with them it says they need a torch query."""
    from trtforge.kernels.device_tensor import DeviceTensor

    opt = OPTIONS[option]
    view = DeviceTensor(ptr=0, dtype=torch.float16, shape=(1, 4, 1, 32), strides=(128, 32, 32, 1))
    assert opt.check(None, 4, view) is None
    with pytest.raises(ValueError, match=f"{opt.label} need the query as a torch tensor; got DeviceTensor"):
        opt.check(torch.ones(4), 4, view)


def _pointers_and_consts(option: str, on: bool, pointers: dict, consts: dict) -> None:
    """Every option's constexpr (on only for `option` when `on`) and its tensor: a ``*fp32`` pointer when on,
    else the launcher's None (a constexpr, no argument)."""
    for name, opt in OPTIONS.items():
        is_on = on and name == option
        consts[opt.constexpr] = is_on
        if opt.pointer:
            if is_on:
                pointers[opt.pointer] = "*fp32"
            else:
                consts[opt.pointer] = None


def _decode_facts(option: str, on: bool) -> dict:
    """The served paged decode launch over 16-bit pools (the option's model shape: :attr:`Option.model`;
    16-token pages), compiled for sm_90, with or without the option."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import decode_attention as da

    _, group, hkv, d = OPTIONS[option].model
    hq = group * hkv
    cfg = da.default_decode_config(d, torch.bfloat16, 4096, 64)
    opts = da._split_options(
        cfg, group, 1, d, 16, False, True, False, 0, False, torch.bfloat16, torch.bfloat16, None,
        50.0 if on and option == "softcap" else 0.0, on and option == "alibi", on and option == "sinks",
    )  # fmt: skip
    consts = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages", "launch_pdl")}
    consts |= {"STAMP": False, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1}
    pointers = dict.fromkeys(("Q", "Out", "K", "V", "KDesc", "VDesc"), "*bf16")
    pointers |= {"MidO": "*fp32", "MidL": "*fp32"} | dict.fromkeys(("SeqLens", "Table", "Counters"), "*i32")
    _pointers_and_consts(option, on, pointers, consts)
    ints = {"stride_qb": hq * d, "stride_qh": d, "stride_qm": hq * d, "stride_kb": 16 * hkv * d,
            "stride_kh": d, "stride_kn": hkv * d, "stride_vb": 16 * hkv * d, "stride_vh": d,
            "stride_vn": hkv * d, "stride_ob": hq * d, "stride_oh": d, "stride_om": hq * d, "stride_tb": 256,
            "num_kv_heads": hkv, "num_splits": 2, "window": 0}  # fmt: skip
    return compile_facts(
        da._decode_split_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


def _chunk_facts(option: str, on: bool) -> dict:
    """The served varlen chunked-prefill launch of a 1,024-token chunk at the option's model shape,
    compiled for sm_90, with or without the option."""
    from tests.kernels._sm90 import compile_facts
    from trtforge.kernels import chunked_prefill as cp
    from trtforge.kernels.configs import chunk_prefill_config

    _, group, hkv, d = OPTIONS[option].model
    hq = group * hkv
    cfg = chunk_prefill_config(1024)
    consts = {"GROUP": group, "HEAD_DIM": d, "BLOCK_D": d, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "PAGE_SIZE": 16, "HAS_QLENS": True, "DOT_F32": False, "WINDOW": False, "HAS_QSTARTS": True,
              "KV_F16": False, "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1}  # fmt: skip
    pointers = dict.fromkeys(("Q", "Out", "K", "V"), "*bf16")
    pointers |= dict.fromkeys(("SeqLens", "QLens", "QStarts", "Table"), "*i32")
    _pointers_and_consts(option, on, pointers, consts)
    ints = {"stride_qb": 0, "stride_qh": d, "stride_qm": hq * d, "stride_kb": 16 * hkv * d, "stride_kh": d,
            "stride_kn": hkv * d, "stride_vb": 16 * hkv * d, "stride_vh": d, "stride_vn": hkv * d,
            "stride_ob": 0, "stride_oh": d, "stride_om": hq * d, "stride_tb": 256, "num_kv_heads": hkv,
            "seq_q": 1024, "window": 0}  # fmt: skip
    return compile_facts(
        cp._chunked_prefill_kernel, pointers, ints, consts, cfg.num_warps, cfg.num_stages,
        scalars={"qk_scale": "fp32", "v_scale": "fp32", "softcap": "fp32"},
    )  # fmt: skip


@pytest.mark.parametrize("kernel", ["_decode_facts", "_chunk_facts"])
@pytest.mark.parametrize("option", OPTIONS)
def test_the_option_compiles_for_sm90_and_is_compiled_out_when_off(option, kernel):
    """Both kernels assemble for sm_90 at the option's served model shape with the option on, spilling
    nothing more than without it; with it on the code holds more of its instructions (the cap: exp2s and
    divisions, no tanh; the biases: a fused multiply-add more a score and the int -> float conversion of
    positions; the sinks: a global load more), which the off code has not."""
    from tests.kernels._sm90 import needs_ptxas, run_in_child

    needs_ptxas()
    opt = OPTIONS[option]
    on = run_in_child(f"{__name__}:{kernel}", option, True)
    off = run_in_child(f"{__name__}:{kernel}", option, False)
    assert on["ptxas_rc"] == 0 and off["ptxas_rc"] == 0, (on["ptxas"], off["ptxas"])
    print(option, kernel, "spills on / off:", on["spills"], off["spills"])
    assert max(on["spills"], default=0) == max(off["spills"], default=0) == 0, (on["ptxas"], off["ptxas"])
    if opt.never:
        assert not any(opt.never in op for op in on["counts"]), on["counts"]

    def count(facts: dict, prefixes: tuple[str, ...]) -> int:
        return sum(n for op, n in facts["counts"].items() if op.startswith(prefixes))

    for prefixes in opt.more_when_on:
        assert count(on, prefixes) > count(off, prefixes), (prefixes, on["counts"], off["counts"])
