"""Chunked prefill with GQA over contiguous and paged caches: a chunk appended to a prefix already
in the pool attends to prefix + itself (LOWER_RIGHT). Runs in Triton's interpreter without CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernel (pip install triton)")

from tests.kernels.decode_reference import (  # noqa: E402
    chunked_reference,
    paged_from_contiguous,
    poison_past_lengths,
    reference_decode,
    windowed_reference,
)
from trtforge.kernels.chunked_prefill import chunked_prefill_attention  # noqa: E402
from trtforge.kernels.paged_cache import write_kv_cache  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


def _rand(gen, *shape, dtype=torch.float16):
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "dtype"),
    [
        (4, 1, 5, 64, [5, 21, 40], 16, torch.float16),  # no prefix, prefix 16, prefix 35
        (2, 2, 37, 32, [37, 50], 0, torch.float16),  # MHA, chunk longer than a tile of rows
        (8, 2, 20, 80, [33, 20], 32, torch.bfloat16),
        (4, 4, 1, 128, [9], 0, torch.float16),  # a one-token chunk is a decode step
    ],
)
def test_chunk_over_prefix_matches_fp32_sdpa(hq, hkv, s_q, d, lens, page, dtype):
    gen = torch.Generator().manual_seed(s_q * d + hq)
    b, s_max = len(lens), max(lens) + 5
    q = _rand(gen, b, hq, s_q, d, dtype=dtype)
    k, v = _rand(gen, b, hkv, s_max, d, dtype=dtype), _rand(gen, b, hkv, s_max, d, dtype=dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(q, k, v, seq_lens, table, out=out, block_m=16, block_n=16)
    assert not torch.isnan(out).any()
    err = (out.float() - reference_decode(q, k, v, seq_lens, table)).abs().max().item()
    assert err < TOL[dtype]


def test_chunked_prefill_through_the_pool_equals_one_causal_pass():
    """Prompt of 45 tokens written and attended in chunks of 16 (GQA 4, 16-token blocks at random
    places) gives the output of causal attention over the whole prompt at once."""
    gen = torch.Generator().manual_seed(7)
    b, hq, hkv, d, total, chunk, page = 2, 8, 2, 64, 45, 16, 16
    q = _rand(gen, b, hq, total, d)
    k, v = _rand(gen, b, hkv, total, d), _rand(gen, b, hkv, total, d)
    empty = torch.zeros(b, hkv, 48, d, dtype=torch.float16, device=DEVICE)
    k_pool, v_pool, table = paged_from_contiguous(empty, empty, torch.full((b,), 48), page, gen)
    out = torch.empty_like(q)
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        lens = torch.full((b,), start + n, dtype=torch.int32, device=DEVICE)
        sl = slice(start, start + n)
        write_kv_cache(k[:, :, sl], v[:, :, sl], k_pool, v_pool, lens, table, offset=-n)
        chunked_prefill_attention(q[:, :, sl], k_pool, v_pool, lens, table, out=out[:, :, sl], block_m=32)
    full = torch.full((b,), total, dtype=torch.int32, device=DEVICE)
    assert (out.float() - reference_decode(q, k, v, full)).abs().max().item() < 3e-3


def test_ragged_chunks_write_and_attend_only_their_rows():
    gen = torch.Generator().manual_seed(8)
    b, hq, hkv, d, s_q = 3, 4, 2, 32, 6
    q_lens = torch.tensor([6, 2, 4], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([6, 19, 4], dtype=torch.int32, device=DEVICE)  # prefixes 0, 17, 0
    k, v = _rand(gen, b, hkv, 24, d), _rand(gen, b, hkv, 24, d)
    k_pool, v_pool, table = paged_from_contiguous(k, v, torch.full((b,), 24), 16, gen)
    k_new, v_new, q = _rand(gen, b, hkv, s_q, d), _rand(gen, b, hkv, s_q, d), _rand(gen, b, hq, s_q, d)
    k_before = k_pool.clone()
    write_kv_cache(k_new, v_new, k_pool, v_pool, lens - q_lens, table, counts=q_lens)
    same = (k_pool == k_before) | (k_pool.isnan() & k_before.isnan())
    assert (~same).any(dim=-1).sum().item() == hkv * int(q_lens.sum())  # padding rows not written
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(q, k_pool, v_pool, lens, table, q_lens=q_lens, out=out, block_m=16, block_n=16)
    for i in range(b):
        n = int(q_lens[i])
        assert torch.isnan(out[i, :, n:]).all()  # rows past q_lens untouched
        ref = reference_decode(q[i : i + 1, :, :n], k_pool, v_pool, lens[i : i + 1], table[i : i + 1])
        assert (out[i : i + 1, :, :n].float() - ref).abs().max().item() < 3e-3


@pytest.mark.parametrize(
    ("window", "page", "block_m", "block_n", "s_q", "lens"),
    [
        (1, 0, 16, 16, 9, [9, 40]),  # each query sees only itself
        (5, 16, 32, 16, 20, [20, 61]),  # a block's 8 positions span more than the window
        (24, 0, 16, 16, 37, [37, 90]),  # the window starts inside a tile: masked head tiles
        (40, 16, 64, 32, 12, [12, 100]),  # prefix longer than the window, whole tiles skipped
        (70, 0, 16, 16, 30, [30, 50]),  # a window longer than some sequences hides nothing there
    ],
)
def test_sliding_window_chunk_matches_a_masked_reference(window, page, block_m, block_n, s_q, lens):
    seed = window + s_q + page
    _masked_case(windowed_reference, {"window": window}, seed, page, block_m, block_n, s_q, lens)


def _masked_case(reference, bound: dict, seed: int, page, block_m, block_n, s_q, lens) -> None:
    """The prompt-chunk kernel with its keys bounded by `bound` (``window=`` or ``chunk=``, its size) against
    `reference` (masked float32 attention over the same bound); the bound must change the answer where it
    is shorter than a sequence."""
    (size,) = bound.values()
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, d = len(lens), 8, 2, 64
    q = _rand(gen, b, hq, s_q, d)
    k, v = _rand(gen, b, hkv, max(lens) + 4, d), _rand(gen, b, hkv, max(lens) + 4, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    ref = reference(q, k, v, seq_lens.cpu(), size)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(q, k, v, seq_lens, table, out=out, block_m=block_m, block_n=block_n, **bound)
    assert not torch.isnan(out).any()
    assert (out.float().cpu() - ref).abs().max().item() < 3e-3
    if size < max(lens):  # the bound changes the answer
        full = chunked_prefill_attention(q, k, v, seq_lens, table, block_m=block_m, block_n=block_n)
        assert (full.float().cpu() - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize(
    ("chunk", "page", "block_m", "block_n", "s_q", "lens"),
    [
        (1, 0, 16, 16, 9, [9, 40]),  # each query sees only itself
        (5, 16, 32, 16, 20, [20, 61]),  # a block's 8 positions span two chunks and more
        (24, 0, 16, 16, 37, [37, 90]),  # chunks start inside tiles: masked head tiles, whole ones between
        (16, 16, 64, 32, 12, [12, 100]),  # a prefix of several chunks, whole tiles before them skipped
        (70, 0, 16, 16, 30, [30, 50]),  # a chunk longer than some sequences hides nothing there
    ],
)
def test_attention_chunks_match_a_masked_reference(chunk, page, block_m, block_n, s_q, lens):
    """Llama 4's chunked layers: each query sees only the keys of its own chunk of positions."""
    seed = chunk + s_q + page
    _masked_case(chunked_reference, {"chunk": chunk}, seed, page, block_m, block_n, s_q, lens)


@pytest.mark.parametrize(("window", "chunk"), [(7, None), (None, 16)])
def test_sliding_window_chunks_match_the_executor_reference(window, chunk):
    """A mixed step (two prompt chunks over cached prefixes, one decode row) on the executor's flat
    [T, Hq, D] layout: each chunk through the kernel with `window` (or attention `chunk`) as
    TritonPagedAttention launches it equals paged_attention_reference(..., sliding_window, chunk=)."""
    from tests.llm.paged_metadata import mixed_metadata
    from trtforge.llm.executors.paged_attention import paged_attention_reference

    gen = torch.Generator().manual_seed(12)
    hq, hkv, d, bs = 8, 2, 64, 16
    ctx_lens, q_lens = [45, 30, 20], [13, 1, 20]
    meta, _ = mixed_metadata(DEVICE, gen, bs, 12, ctx_lens, q_lens)
    k_pool, v_pool = _rand(gen, 12, bs, hkv, d), _rand(gen, 12, bs, hkv, d)
    q = _rand(gen, sum(q_lens), hq, d)
    ref = paged_attention_reference(q, k_pool, v_pool, meta, d**-0.5, window, chunk=chunk)
    out = torch.full_like(q, float("nan"))
    qsl = meta.query_start_loc_host
    for i, n in enumerate(q_lens):
        if n == 1:
            continue
        lo, hi, width = int(qsl[i]), int(qsl[i + 1]), -(-ctx_lens[i] // bs)
        chunked_prefill_attention(
            q[lo:hi].permute(1, 0, 2)[None], k_pool, v_pool, meta.context_lens[i : i + 1],
            meta.block_tables[i : i + 1, :width], scale=d**-0.5, out=out[lo:hi].permute(1, 0, 2)[None],
            window=window, chunk=chunk,
        )  # fmt: skip
        assert (out[lo:hi].float() - ref[lo:hi].float()).abs().max().item() < 3e-3


def test_sliding_window_must_hold_a_key():
    gen = torch.Generator().manual_seed(4)
    q, k = _rand(gen, 1, 2, 3, 32), _rand(gen, 1, 1, 8, 32)
    with pytest.raises(ValueError, match="sliding window"):
        chunked_prefill_attention(q, k, k, torch.tensor([5], dtype=torch.int32, device=DEVICE), window=0)


@pytest.mark.parametrize(("window", "chunk"), [(None, None), (9, None), (None, 16)])
def test_varlen_launch_equals_one_launch_per_chunk(window, chunk):
    """All of a step's chunks in one launch (flat q/out, row offsets, ragged lengths, shuffled block
    tables) give each chunk's own launch; rows outside the chunks are left untouched."""
    from trtforge.kernels.chunked_prefill import chunked_prefill_varlen

    gen = torch.Generator().manual_seed(11)
    hq, hkv, d, page, nblocks = 8, 2, 32, 16, 20
    k_pool, v_pool = _rand(gen, nblocks, page, hkv, d), _rand(gen, nblocks, page, hkv, d)
    starts, q_lens, lens = [3, 20, 61], [17, 41, 2], [17, 70, 35]  # rows 0-2 and 37-60: not chunks
    table = torch.randperm(nblocks, generator=gen)[:15].view(3, 5).to(torch.int32).to(DEVICE)
    q = _rand(gen, 64, hq, d)
    out = torch.full_like(q, float("nan"))
    as_i32 = {
        n: torch.tensor(x, dtype=torch.int32, device=DEVICE)
        for n, x in (("s", starts), ("q", q_lens), ("l", lens))
    }
    chunked_prefill_varlen(
        q, k_pool, v_pool, as_i32["l"], table, as_i32["s"], as_i32["q"], max(q_lens), scale=0.2, out=out,
        window=window, chunk=chunk,
    )  # fmt: skip
    untouched = torch.ones(64, dtype=torch.bool, device=DEVICE)
    for i, (s, n) in enumerate(zip(starts, q_lens)):
        want = chunked_prefill_attention(
            q[s : s + n].permute(1, 0, 2)[None], k_pool, v_pool, as_i32["l"][i : i + 1], table[i : i + 1],
            scale=0.2, window=window, chunk=chunk,
        )[0].permute(1, 0, 2)  # fmt: skip
        torch.testing.assert_close(out[s : s + n], want, atol=0, rtol=0)
        untouched[s : s + n] = False
    assert out[untouched].isnan().all()


def test_chunk_prefill_config_takes_the_last_entry_that_applies():
    from trtforge.kernels.configs import CHUNK_PREFILL_CONFIGS, KernelConfig, chunk_prefill_config

    small, mid, big = KernelConfig(64, 64, 4, 2), KernelConfig(128, 64, 8, 2), KernelConfig(128, 128, 8, 3)
    table = ((1, small), (256, mid), (1024, big))
    got = [chunk_prefill_config(n, table) for n in (0, 1, 255, 256, 1023, 1024, 8192)]
    assert got == [small, small, small, mid, mid, big, big]
    lengths = [shortest for shortest, _ in CHUNK_PREFILL_CONFIGS]
    assert lengths == sorted(lengths) and lengths[0] == 1


def test_the_served_launch_takes_its_tiles_from_the_config_table(monkeypatch):
    """prepare_chunked_prefill_varlen reads CHUNK_PREFILL_CONFIGS when it is called, by the step's
    longest chunk: a two-entry table gives short and long steps their own tiles."""
    import trtforge.kernels.configs as configs
    from trtforge.kernels.chunked_prefill import prepare_chunked_prefill_varlen

    short, long = configs.KernelConfig(32, 16, 4, 2), configs.KernelConfig(128, 32, 8, 3)
    monkeypatch.setattr(configs, "CHUNK_PREFILL_CONFIGS", ((1, short), (512, long)))
    gen = torch.Generator().manual_seed(3)
    k_pool = v_pool = _rand(gen, 4, 16, 2, 32)
    i32 = torch.ones(1, dtype=torch.int32, device=DEVICE)
    q = _rand(gen, 8, 4, 32)
    for max_q_len, want in ((9, short), (511, short), (512, long), (2048, long)):
        launch = prepare_chunked_prefill_varlen(
            q, k_pool, v_pool, i32, i32.view(1, 1), i32 * 0, i32, max_q_len, out=q
        )
        got = (launch.kwargs["BLOCK_M"], launch.kwargs["BLOCK_N"], launch.kwargs["num_warps"])
        assert (*got, launch.kwargs["num_stages"]) == (
            want.block_m,
            want.block_n,
            want.num_warps,
            want.num_stages,
        )


def test_every_chunk_prefill_candidate_gives_the_default_tiles_result():
    """The sweep's candidates (benchmarks/sweep_chunked_prefill.py) are only times to compare: each
    computes what the default tiles compute, over chunks with and without a cached prefix."""
    from trtforge.kernels.chunked_prefill import chunked_prefill_varlen
    from trtforge.kernels.configs import CHUNK_PREFILL_CANDIDATES

    gen = torch.Generator().manual_seed(12)
    hq, hkv, d, page, nblocks = 8, 2, 32, 16, 12
    k_pool, v_pool = _rand(gen, nblocks, page, hkv, d), _rand(gen, nblocks, page, hkv, d)
    starts, q_lens, lens = [0, 70], [70, 9], [70, 41]
    table = torch.randperm(nblocks, generator=gen)[:10].view(2, 5).to(torch.int32).to(DEVICE)
    q = _rand(gen, 79, hq, d)
    i32 = {
        n: torch.tensor(x, dtype=torch.int32, device=DEVICE)
        for n, x in (("s", starts), ("q", q_lens), ("l", lens))
    }
    results = []
    for c in CHUNK_PREFILL_CANDIDATES:
        out = torch.empty_like(q)
        chunked_prefill_varlen(
            q, k_pool, v_pool, i32["l"], table, i32["s"], i32["q"], max(q_lens), scale=0.2, out=out,
            block_m=c.block_m, block_n=c.block_n, num_warps=c.num_warps, num_stages=c.num_stages,
        )  # fmt: skip
        results.append(out)
    for c, got in zip(CHUNK_PREFILL_CANDIDATES[1:], results[1:]):
        torch.testing.assert_close(got, results[0], atol=2e-3, rtol=2e-3, msg=lambda m, c=c: f"{c}: {m}")
