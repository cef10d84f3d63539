"""The decode kernel on a CUDA GPU against FP32 SDPA over the K/V gathered through the block table.

The acceptance matrix: every head dim (64/128 fast, 80/96/256 correct) x GQA ratio 1/4/8 x q_len
1/4 (plus 8); each case holds one sequence of every context length 1, 15, 16, 17, 1000 and 32768
in one batch and runs on the contiguous cache and on paged pools of block sizes 16 and 64 with
random block placement; both dtypes alternate across cases. Cache rows past each length are NaN.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.kernels.decode_reference import (  # noqa: E402
    paged_from_contiguous,
    poison_past_lengths,
    reference_decode,
)
from trtforge.kernels import decode_attention as decode_kernel  # noqa: E402
from trtforge.kernels.decode_attention import (  # noqa: E402
    AUTOTUNE_CANDIDATES,
    TMA_AUTOTUNE_CANDIDATES,
    DecodeConfig,
    decode_attention,
    decode_attention_raw,
    default_decode_config,
    workspace_elements,
)
from trtforge.kernels.paged_cache import write_kv_cache  # noqa: E402

pytestmark = pytest.mark.gpu

LENGTHS = [1, 15, 16, 17, 1000, 32768]
NUM_HEADS = 8
# Max |out - ref| <= ATOL + RTOL·|ref| (FP16: 10-bit mantissa; BF16: 7-bit).
TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
CASES = [
    (d, g, s_q, (torch.float16, torch.bfloat16)[i % 2])
    for i, (d, g, s_q) in enumerate(itertools.product((64, 128, 80, 96, 256), (1, 4, 8), (1, 4)))
] + [(128, 4, 8, torch.float16), (64, 8, 8, torch.bfloat16)]


def _check(out, ref, dtype):
    atol, rtol = TOL[dtype]
    assert not torch.isnan(out).any()
    excess = ((out.float() - ref).abs() - (atol + rtol * ref.abs())).max().item()
    assert excess <= 0, f"error exceeds tolerance by {excess}"


@pytest.mark.parametrize(("d", "group", "s_q", "dtype"), CASES, ids=str)
def test_acceptance_matrix(d, group, s_q, dtype):
    gen = torch.Generator().manual_seed(d * 100 + group * 10 + s_q)
    hkv = NUM_HEADS // group
    b, s_max = len(LENGTHS), max(LENGTHS)
    q = torch.randn(b, NUM_HEADS, s_q, d, generator=gen).to(dtype).cuda()
    k = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).cuda()
    v = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).cuda()
    lens = torch.tensor(LENGTHS, dtype=torch.int32, device="cuda")
    poison_past_lengths(k, lens)
    poison_past_lengths(v, lens)
    ref = reference_decode(q, k, v, lens)
    out = torch.full_like(q, float("nan"))
    cfg = default_decode_config(d)
    decode_attention(q, k, v, lens, out=out, config=cfg)
    _check(out, ref, dtype)
    for page in (16, 64):
        k_pool, v_pool, table = paged_from_contiguous(k, v, lens, page, gen)
        out = torch.full_like(q, float("nan"))
        decode_attention(q, k_pool, v_pool, lens, table, out=out, config=cfg)
        _check(out, reference_decode(q, k_pool, v_pool, lens, table), dtype)
        _check(out, ref, dtype)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("splits", [1, 2, 7, 64, 256])
def test_any_split_count_gives_the_same_result(splits, fused):
    gen = torch.Generator().manual_seed(splits)
    q = torch.randn(3, 32, 1, 128, generator=gen).half().cuda()
    k = torch.randn(3, 8, 5000, 128, generator=gen).half().cuda()
    v = torch.randn(3, 8, 5000, 128, generator=gen).half().cuda()
    lens = torch.tensor([5000, 1, 2345], dtype=torch.int32, device="cuda")
    ref = reference_decode(q, k, v, lens)
    for _ in range(3):  # launches on one stream share the fused reduction's counters
        out = decode_attention(q, k, v, lens, config=DecodeConfig(num_splits=splits, fused=fused))
        _check(out, ref, torch.float16)
    assert all(int(c.abs().sum()) == 0 for c in decode_kernel._COUNTERS.values())


@pytest.mark.parametrize("page", [0, 16])
def test_cuda_graph_replays_between_eager_launches(page):
    """A captured decode (32 splits, GQA 4, q_len 4: two kernels) replayed with new queries and
    lengths each time, with eager launches (fused, the stream's counters) on the same stream in
    between, matches FP32 SDPA every time."""
    gen = torch.Generator().manual_seed(41 + page)
    b, hq, hkv, s_q, d = 4, 16, 4, 4, 128
    k = torch.randn(b, hkv, 4096, d, generator=gen).half().cuda()
    v = torch.randn(b, hkv, 4096, d, generator=gen).half().cuda()
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, torch.full((b,), 4096), page, gen)
    q = torch.empty(b, hq, s_q, d, dtype=torch.float16, device="cuda")
    lens = torch.empty(b, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    cfg = DecodeConfig(num_splits=32)
    stream = torch.cuda.Stream()
    q.normal_()
    lens.fill_(4096)
    with torch.cuda.stream(stream):
        decode_attention(q, k, v, lens, table, out=out, config=cfg)  # compile outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            decode_attention(q, k, v, lens, table, out=out, config=cfg, max_seq_len=4096)
        for _ in range(3):
            q.copy_(torch.randn(b, hq, s_q, d, generator=gen).half())
            lens.copy_(torch.randint(s_q, 4097, (b,), generator=gen).to(torch.int32))
            graph.replay()
            eager = decode_attention(q, k, v, lens, table, config=cfg)
            stream.synchronize()
            ref = reference_decode(q, k, v, lens, table)
            _check(out, ref, torch.float16)
            _check(eager, ref, torch.float16)


@pytest.mark.parametrize("zeroed", [False, True])
def test_raw_launch_on_a_workspace_and_a_foreign_stream(zeroed):
    """decode_attention_raw on a workspace full of garbage (TensorRT's: two kernels) or zeroed once
    (fused; left zero for the next launch), on a foreign stream."""
    gen = torch.Generator().manual_seed(43)
    b, hq, hkv, d, splits = 6, 32, 8, 128, 24
    lens = torch.tensor([1, 17, 3000, 4096, 64, 2049], dtype=torch.int32, device="cuda")
    q = torch.randn(b, hq, 1, d, generator=gen).half().cuda()
    k = torch.randn(b, hkv, 4096, d, generator=gen).half().cuda()
    v = torch.randn(b, hkv, 4096, d, generator=gen).half().cuda()
    ws = torch.randint(-(2**30), 2**30, (workspace_elements(b, hq, 1, d, splits),), dtype=torch.int32)
    ws = ws.cuda()
    if zeroed:
        ws.zero_()
    ref = reference_decode(q, k, v, lens)
    stream = torch.cuda.Stream()
    for _ in range(2):
        out = torch.full_like(q, float("nan"))
        stream.wait_stream(torch.cuda.current_stream())  # the workspace's zeroing and out's fill first
        decode_attention_raw(
            q, k, v, lens, None, out, scale=d**-0.5, config=DecodeConfig(), splits=splits, workspace=ws,
            stream=stream.cuda_stream, counters_zeroed=zeroed,
        )  # fmt: skip
        stream.synchronize()
        _check(out, ref, torch.float16)
    if zeroed:
        assert int(ws[: b * hkv].abs().sum()) == 0


@pytest.mark.parametrize("page", [0, 16])
def test_every_autotune_candidate_and_the_autotuned_launch(page):
    """Whichever candidate the autotuner picks must be right: each one (the TMA ones on the contiguous
    cache), on GQA 4, q_len 4, D=128, rows past each length NaN."""
    gen = torch.Generator().manual_seed(21 + page)
    lens = torch.tensor([1, 17, 3000, 777], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 16, 4, 128, generator=gen).half().cuda()
    k = torch.randn(4, 4, 3000, 128, generator=gen).half().cuda()
    v = torch.randn(4, 4, 3000, 128, generator=gen).half().cuda()
    poison_past_lengths(k, lens)
    poison_past_lengths(v, lens)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, lens, page, gen)
    ref = reference_decode(q, k, v, lens, table)
    candidates = [(c, False) for c in AUTOTUNE_CANDIDATES]
    candidates += [] if page else [(c, True) for c in TMA_AUTOTUNE_CANDIDATES]
    for (bn, warps, stages, mult), tma in candidates:
        cfg = DecodeConfig(bn, warps, stages, 0 if mult == 1.0 else max(1, int(8 * mult)), tma=tma)
        _check(decode_attention(q, k, v, lens, table, config=cfg), ref, torch.float16)
    _check(decode_attention(q, k, v, lens, table), ref, torch.float16)


def test_reshape_and_cache_then_decode_on_gpu():
    gen = torch.Generator().manual_seed(11)
    b, hkv, d = 4, 2, 128
    q = torch.randn(b, 8, 4, d, generator=gen).half().cuda()
    k = torch.randn(b, hkv, 2048, d, generator=gen).half().cuda()
    v = torch.randn(b, hkv, 2048, d, generator=gen).half().cuda()
    k_pool, v_pool, table = paged_from_contiguous(k, v, torch.full((b,), 2048), 16, gen)
    start = torch.tensor([0, 17, 1000, 2044], dtype=torch.int32, device="cuda")
    k_new = torch.randn(b, hkv, 4, d, generator=gen).half().cuda()
    v_new = torch.randn(b, hkv, 4, d, generator=gen).half().cuda()
    write_kv_cache(k_new, v_new, k_pool, v_pool, start, table)
    write_kv_cache(k_new, v_new, k, v, start)
    lens = start + 4
    for i, s in enumerate(start.tolist()):
        assert torch.equal(k[i, :, s : s + 4], k_new[i]) and torch.equal(v[i, :, s : s + 4], v_new[i])
    out_paged = decode_attention(q, k_pool, v_pool, lens, table)
    out = decode_attention(q, k, v, lens)
    _check(out, reference_decode(q, k, v, lens), torch.float16)
    _check(out_paged, reference_decode(q, k, v, lens), torch.float16)


def test_steps_with_other_split_counts_and_metadata_offsets_share_one_compiled_kernel():
    """Serving steps differ in split count and in where their lengths and block tables sit: none of
    that may need a new specialization of the split kernel (a compile mid-run)."""
    gen = torch.Generator().manual_seed(9)
    b, hq, hkv, d, page = 3, 8, 2, 64, 16
    k = torch.randn(b, hkv, 700, d, generator=gen).half().cuda()
    v = torch.randn(b, hkv, 700, d, generator=gen).half().cuda()
    q = torch.randn(b, hq, 1, d, generator=gen).half().cuda()
    lens_host = torch.tensor([700, 333, 512], dtype=torch.int32)
    k16, v16, table = paged_from_contiguous(k, v, lens_host.cuda(), page, gen)
    cache = decode_kernel._decode_split_kernel.device_caches[torch.cuda.current_device()][0]
    sizes = []
    for offset, splits in itertools.product((0, 1, 3), (2, 3, 16, 32)):
        buf = torch.zeros(offset + b, dtype=torch.int32, device="cuda")
        lens = buf[offset:]
        lens.copy_(lens_host)
        tbuf = torch.zeros(offset + table.numel(), dtype=torch.int32, device="cuda")
        tab = tbuf[offset:].view(table.shape)
        tab.copy_(table)
        cfg = DecodeConfig(block_n=64, num_splits=splits)
        out = decode_attention(q, k16, v16, lens, tab, config=cfg)
        sizes.append(len(cache))
    torch.cuda.synchronize()
    assert (out.float() - reference_decode(q, k16, v16, lens, tab)).abs().max().item() < 3e-3
    assert len(set(sizes)) == 1, f"compiled variants grew across steps: {sizes}"


@pytest.mark.parametrize("fp8", [False, True])
def test_early_kv_prefetch_changes_no_output(fp8):
    """With ``DecodeConfig.early_kv`` a programmatic dependent launch over a paged pool prefetches its first
    tile before it waits: a hint only, so the outputs equal the launch without it bit for bit (BF16 and
    FP8 pools, several split counts, behind a kernel that writes the queries), and match FP32 SDPA."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability >= 9.0")
    gen = torch.Generator().manual_seed(7 + fp8)
    b, hq, hkv, d = 3, 32, 8, 128
    lens = torch.tensor([700, 1, 2345], dtype=torch.int32)
    k = torch.randn(b, hkv, 2345, d, generator=gen).bfloat16().cuda()
    v = torch.randn(b, hkv, 2345, d, generator=gen).bfloat16().cuda()
    k_pool, v_pool, table = paged_from_contiguous(k, v, lens, 16, gen)
    if fp8:
        k_pool, v_pool = k_pool.to(torch.float8_e4m3fn), v_pool.to(torch.float8_e4m3fn)
    lens = lens.cuda()
    src = torch.randn(b, hq, 1, d, generator=gen).bfloat16().cuda()
    ref = reference_decode(src, k_pool.bfloat16(), v_pool.bfloat16(), lens, table)
    for splits in (0, 1, 12):
        outs = []
        for early in (False, True):
            q = src * 1.0  # written by the kernel just before: the launch's PDL predecessor
            cfg = DecodeConfig(num_splits=splits, early_kv=early)
            outs.append(decode_attention(q, k_pool, v_pool, lens, table, config=cfg, pdl=True))
        assert torch.equal(outs[0], outs[1]), f"splits {splits}"
        _check(outs[1], ref, torch.bfloat16)
