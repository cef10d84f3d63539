"""The split-KV decode kernel and reshape-and-cache at small sizes, on any machine.

Without CUDA they run in Triton's CPU interpreter (tests/kernels/conftest.py). The H200 acceptance
matrix (every head dim, GQA 1/4/8, q_len 1/4, contexts up to 32768, block sizes 16/64) is in
test_decode_attention_gpu.py.
"""

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
from trtforge.kernels import decode_attention as decode_kernel  # noqa: E402
from trtforge.kernels.configs import decode_counter_slots  # noqa: E402
from trtforge.kernels.decode_attention import (  # noqa: E402
    DecodeConfig,
    decode_attention,
    decode_attention_raw,
    num_splits_for,
    workspace_elements,
)
from trtforge.kernels.paged_cache import write_kv_cache  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


def _caches(b, hq, hkv, s_q, s_max, d, dtype, gen):
    q = torch.randn(b, hq, s_q, d, generator=gen).to(dtype).to(DEVICE)
    k = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(DEVICE)
    return q, k, v


@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "lens", "page", "splits", "dtype"),
    [
        (4, 1, 1, 64, [1, 15, 16, 17], 0, 0, torch.float16),
        (4, 1, 4, 64, [4, 15, 16, 17], 16, 0, torch.float16),
        (8, 1, 1, 128, [17, 40], 16, 3, torch.bfloat16),
        (2, 2, 4, 80, [16, 33], 0, 2, torch.float16),
        (8, 2, 4, 96, [50, 5], 32, 4, torch.float16),
        (2, 1, 1, 256, [20, 1], 64, 0, torch.float16),
        (8, 1, 8, 32, [8, 70], 16, 5, torch.float16),
    ],
)
def test_matches_fp32_sdpa(hq, hkv, s_q, d, lens, page, splits, dtype):
    _check_against_sdpa(hq, hkv, s_q, d, lens, page, splits, dtype, sum(lens) + d)


def _check_against_sdpa(hq, hkv, s_q, d, lens, page, splits, dtype, seed):
    """16-key tiles (several a sequence) over caches poisoned past each length, against FP32 SDPA."""
    gen = torch.Generator().manual_seed(seed)
    b, s_max = len(lens), max(lens) + 3
    q, k, v = _caches(b, hq, hkv, s_q, s_max, d, dtype, gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    poison_past_lengths(k, seq_lens)
    poison_past_lengths(v, seq_lens)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, seq_lens.cpu(), page, gen)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, k, v, seq_lens, table, out=out, config=DecodeConfig(block_n=16, num_splits=splits))
    assert not torch.isnan(out).any()
    err = (out.float() - reference_decode(q, k, v, seq_lens, table)).abs().max().item()
    assert err < TOL[dtype]


@pytest.mark.parametrize(("hq", "hkv", "s_q", "d", "splits"), [(8, 2, 1, 64, 5), (4, 1, 4, 96, 3)])
def test_fused_reduction_matches_the_reduce_kernel_and_leaves_counters_zero(hq, hkv, s_q, d, splits):
    """The last-arriving program's reduction = the separate reduce kernel; launches on one stream
    share counters, so each must put them back to zero for the next (three launches in a row)."""
    gen = torch.Generator().manual_seed(hq + d + splits)
    lens = torch.tensor([90, 3, 64], dtype=torch.int32, device=DEVICE)
    q, k, v = _caches(3, hq, hkv, s_q, 96, d, torch.float16, gen)
    poison_past_lengths(k, lens)
    poison_past_lengths(v, lens)
    ref = reference_decode(q, k, v, lens)
    two = decode_attention(q, k, v, lens, config=DecodeConfig(block_n=16, num_splits=splits, fused=False))
    assert (two.float() - ref).abs().max().item() < 3e-3
    for _ in range(3):
        out = decode_attention(q, k, v, lens, config=DecodeConfig(block_n=16, num_splits=splits))
        assert (out.float() - two.float()).abs().max().item() < 1e-3
        assert all(int(c.abs().sum()) == 0 for c in decode_kernel._COUNTERS.values())


@pytest.mark.parametrize("zeroed", [False, True])
def test_raw_launch_on_a_scratch_workspace(zeroed):
    """decode_attention_raw on a workspace full of garbage (a TensorRT workspace) does not trust its
    counters; one zeroed once and passed as `counters_zeroed` stays zero across launches."""
    gen = torch.Generator().manual_seed(5)
    b, hq, hkv, s_q, d, splits = 2, 8, 2, 2, 64, 4
    lens = torch.tensor([70, 33], dtype=torch.int32, device=DEVICE)
    q, k, v = _caches(b, hq, hkv, s_q, 80, d, torch.float16, gen)
    k, v, table = paged_from_contiguous(k, v, lens.cpu(), 16, gen)
    n = workspace_elements(b, hq, s_q, d, splits)
    assert n >= decode_counter_slots(b, hq) + b * hq * s_q * splits * (d + 1)
    if zeroed:
        ws = torch.zeros(n, dtype=torch.int32, device=DEVICE)
    else:
        ws = torch.randint(-(2**30), 2**30, (n,), generator=gen, dtype=torch.int32).to(DEVICE)
    ref = reference_decode(q, k, v, lens, table)
    for _ in range(2):
        out = torch.full_like(q, float("nan"))
        decode_attention_raw(
            q, k, v, lens, table, out, scale=d**-0.5, config=DecodeConfig(block_n=16), splits=splits,
            workspace=ws, stream=0, counters_zeroed=zeroed,
        )  # fmt: skip
        assert (out.float() - ref).abs().max().item() < 3e-3
        if zeroed:
            assert int(ws[: b * hkv].abs().sum()) == 0


@pytest.mark.parametrize(
    ("s_q", "splits", "fused"), [(1, 1, True), (1, 3, True), (4, 2, False), (8, 5, True)]
)
def test_tensor_descriptor_loads_match_pointer_loads(s_q, splits, fused):
    """`tma`: a contiguous cache's whole tiles come through tensor descriptors of its [B·Hkv·S_max, D]
    view (rows of the next head follow each head's: only whole tiles below seq_len may use them);
    the ragged last tile and poisoned slots past each length stay masked."""
    gen = torch.Generator().manual_seed(11 + s_q + splits)
    lens = torch.tensor([70, 16, 33, 1], dtype=torch.int32, device=DEVICE)
    q, k, v = _caches(4, 8, 2, s_q, 80, 64, torch.float16, gen)
    poison_past_lengths(k, lens)
    poison_past_lengths(v, lens)
    assert decode_kernel._tma_descriptors(k, v, 16) is not None
    cfg = DecodeConfig(block_n=16, num_splits=splits, fused=fused, tma=True)
    out = decode_attention(q, k, v, lens, config=cfg)
    assert (out.float() - reference_decode(q, k, v, lens)).abs().max().item() < 3e-3


def test_tensor_descriptors_only_where_tma_can_read_the_cache():
    """Strided caches, a head dim that is no power of two: no descriptors (pointer loads instead)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = _caches(2, 4, 2, 1, 40, 64, torch.float16, gen)
    assert decode_kernel._tma_descriptors(k[:, :, :32], v[:, :, :32], 16) is None
    _, k80, v80 = _caches(2, 4, 2, 1, 40, 80, torch.float16, gen)
    assert decode_kernel._tma_descriptors(k80, v80, 16) is None
    lens = torch.tensor([32, 7], dtype=torch.int32, device=DEVICE)
    ks, vs = k[:, :, :32], v[:, :, :32]
    out = decode_attention(q, ks, vs, lens, config=DecodeConfig(block_n=16, tma=True))
    assert (out.float() - reference_decode(q, ks, vs, lens)).abs().max().item() < 3e-3


@pytest.mark.parametrize(
    ("s_q", "window", "splits", "fused", "tma"),
    [(1, 1, 0, True, False), (1, 16, 3, True, True), (1, 33, 2, False, False), (4, 20, 0, True, False),
     (4, 2, 4, False, True), (8, 47, 1, True, False), (1, 500, 2, True, False)],
)  # fmt: skip
def test_sliding_window_matches_a_masked_reference(s_q, window, splits, fused, tma):
    """Each query sees only its last `window` keys (Mistral-style, window < context): head tiles that
    start before the window are masked, the splits share out only the keys some row sees."""
    gen = torch.Generator().manual_seed(window * 10 + s_q + splits)
    lens = torch.tensor([1, 15, 70, 100, 48], dtype=torch.int32, device=DEVICE)
    q, k, v = _caches(5, 8, 2, s_q, 104, 64, torch.float16, gen)
    poison_past_lengths(k, lens)
    poison_past_lengths(v, lens)
    cfg = DecodeConfig(block_n=16, num_splits=splits, fused=fused, tma=tma)
    out = decode_attention(q, k, v, lens, config=cfg, window=window)
    assert not torch.isnan(out).any()
    ref = windowed_reference(q, k, v, lens.cpu(), window)
    assert (out.float().cpu() - ref).abs().max().item() < 3e-3
    if window < 100:  # the window changes the answer where a sequence is longer than it
        assert (ref - reference_decode(q, k, v, lens).cpu()).abs().max().item() > 1e-2


def test_sliding_window_on_a_paged_pool_matches_the_executor_reference():
    from trtforge.llm.executors.paged_attention import paged_decode_reference

    gen = torch.Generator().manual_seed(9)
    lens = torch.tensor([90, 7, 64, 33], dtype=torch.int32, device=DEVICE)
    q, k, v = _caches(4, 8, 2, 1, 96, 64, torch.float16, gen)
    kp, vp, table = paged_from_contiguous(k, v, lens.cpu(), 16, gen)
    out = decode_attention(q, kp, vp, lens, table, config=DecodeConfig(block_n=16, num_splits=3), window=24)
    safe = table.clamp(max=kp.shape[0] - 1)  # entries past each length are out of the pool: unread
    ref = paged_decode_reference(q[:, :, 0].float(), kp.float(), vp.float(), safe, lens, 64**-0.5, 24)
    assert (out[:, :, 0].float() - ref).abs().max().item() < 3e-3


def test_sliding_window_must_hold_a_key():
    gen = torch.Generator().manual_seed(3)
    q, k, v = _caches(1, 2, 1, 1, 16, 32, torch.float16, gen)
    with pytest.raises(ValueError, match="sliding window"):
        decode_attention(q, k, v, torch.tensor([4], dtype=torch.int32, device=DEVICE), window=0)


@pytest.mark.parametrize(
    ("s_q", "chunk", "splits", "fused", "page"),
    [(1, 16, 3, True, 0), (1, 8, 0, True, 16), (4, 16, 2, False, 0), (8, 24, 4, True, 16), (4, 7, 1, True, 0),
     (1, 500, 2, True, 0)],
)  # fmt: skip
def test_attention_chunks_match_a_masked_reference(s_q, chunk, splits, fused, page):
    """Llama 4's chunked layers: query i (position p) sees only the keys of its own chunk, p - p % chunk
    <= j <= p (not a window: a chunk's first query sees itself alone), over contexts of several chunks,
    with the keys split (several splits: shared out over only the keys some row sees) and q_len > 1 rows
    whose chunks differ; contiguous caches and paged pools."""
    gen = torch.Generator().manual_seed(chunk * 10 + s_q + splits)
    lens = torch.tensor([1, 15, 70, 100, 48], dtype=torch.int32, device=DEVICE)
    q, k, v = _caches(5, 8, 2, s_q, 104, 64, torch.float16, gen)
    poison_past_lengths(k, lens)
    poison_past_lengths(v, lens)
    cfg = DecodeConfig(block_n=16, num_splits=splits, fused=fused)
    if page:
        kp, vp, table = paged_from_contiguous(k, v, lens.cpu(), page, gen)
        out = decode_attention(q, kp, vp, lens, table, config=cfg, chunk=chunk)
    else:
        out = decode_attention(q, k, v, lens, config=cfg, chunk=chunk)
    assert not torch.isnan(out).any()
    ref = chunked_reference(q, k, v, lens.cpu(), chunk)
    assert (out.float().cpu() - ref).abs().max().item() < 3e-3
    if chunk < 100:  # the chunks change the answer where a sequence is longer than one
        assert (ref - reference_decode(q, k, v, lens).cpu()).abs().max().item() > 1e-2
        assert (ref - windowed_reference(q, k, v, lens.cpu(), chunk)).abs().max().item() > 1e-2


def test_attention_chunks_on_a_paged_pool_match_the_executor_reference():
    """The kernel's chunk mode and the torch executor's reference (``chunk=``) agree, q_len 1 and 3."""
    from trtforge.llm.executors.paged_attention import paged_decode_reference

    gen = torch.Generator().manual_seed(9)
    lens = torch.tensor([90, 7, 64, 33], dtype=torch.int32, device=DEVICE)
    for s_q in (1, 3):
        q, k, v = _caches(4, 8, 2, s_q, 96, 64, torch.float16, gen)
        kp, vp, table = paged_from_contiguous(k, v, lens.cpu(), 16, gen)
        cfg = DecodeConfig(block_n=16, num_splits=3)
        out = decode_attention(q, kp, vp, lens, table, config=cfg, chunk=24)
        safe = table.clamp(max=kp.shape[0] - 1)  # entries past each length are out of the pool: unread
        flat = q.transpose(1, 2).reshape(-1, 8, 64).float()  # [B * S, Hq, D]
        kr, vr = kp.float().nan_to_num(0.0), vp.float().nan_to_num(0.0)  # (masked keys weigh 0, not NaN)
        ref = paged_decode_reference(flat, kr, vr, safe, lens, 64**-0.5, q_len=s_q, chunk=24)
        assert (out.transpose(1, 2).reshape(-1, 8, 64).float() - ref).abs().max().item() < 3e-3


def test_attention_chunks_must_hold_a_key_and_exclude_a_window():
    gen = torch.Generator().manual_seed(3)
    q, k, v = _caches(1, 2, 1, 1, 16, 32, torch.float16, gen)
    lens = torch.tensor([4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="attention chunk must be >= 1"):
        decode_attention(q, k, v, lens, chunk=0)
    with pytest.raises(ValueError, match="not both"):
        decode_attention(q, k, v, lens, window=4, chunk=8)


def test_query_longer_than_context_sees_nothing_for_early_rows():
    """LOWER_RIGHT: with L = 2 and q_len 4, rows 0 and 1 see no key (zeros), rows 2 and 3 see 1 and 2."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = _caches(1, 2, 1, 4, 8, 32, torch.float16, gen)
    seq_lens = torch.tensor([2], dtype=torch.int32, device=DEVICE)
    out = decode_attention(q, k, v, seq_lens, config=DecodeConfig(block_n=16))
    assert torch.count_nonzero(out[0, :, :2]) == 0
    assert torch.allclose(out[0, :, 2].float(), v[0, 0, 0].float().expand(2, -1), atol=1e-3)
    assert (out.float() - reference_decode(q, k, v, seq_lens)).abs().max().item() < 3e-3


def test_split_heuristic_fills_the_gpu_and_never_leaves_a_split_empty():
    # the H200's best split counts in the split sweep (benchmarks/results/decode_attention.md)
    assert num_splits_for(8, 32768, 132, 64) == 32  # B·Hkv = 8: many splits
    assert num_splits_for(32, 16384, 132, 64) == 8
    assert num_splits_for(128, 4096, 132, 64) == 2
    assert num_splits_for(512, 8192, 132, 64) == 2
    assert num_splits_for(2048, 1024, 132, 64) == 1  # already 15 waves
    assert num_splits_for(8, 100, 132, 64) == 1  # under MIN_SPLIT_TOKENS
    for bh, length, bn in [(8, 32768, 64), (32, 16384, 64), (128, 4096, 64), (512, 8192, 64), (3, 1000, 32)]:
        s = num_splits_for(bh, length, 132, bn)
        tiles = -(-length // bn)
        per = -(-tiles // s)
        assert (s - 1) * per < tiles  # the last split has work


@pytest.mark.parametrize("page", [0, 16])
def test_write_kv_cache_then_decode(page):
    """A decode step: write 2 new tokens per sequence at its current length, then attend over all."""
    gen = torch.Generator().manual_seed(3 + page)
    b, hkv, hq, d, s_max = 3, 2, 4, 64, 48
    q, k, v = _caches(b, hq, hkv, 2, s_max, d, torch.float16, gen)
    before = torch.tensor([5, 16, 31], dtype=torch.int32)
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, torch.full((b,), s_max), page, gen)
    k_new = torch.randn(b, hkv, 2, d, generator=gen).half().to(DEVICE)
    v_new = torch.randn(b, hkv, 2, d, generator=gen).half().to(DEVICE)
    k_before = k.clone()
    write_kv_cache(k_new, v_new, k, v, before.to(DEVICE), table)
    lens = (before + 2).to(DEVICE)
    for i, start in enumerate(before.tolist()):
        for j in range(2):
            pos = start + j
            if page:
                blk, slot = int(table[i, pos // page]), pos % page
                got_k, got_v = k[blk, slot], v[blk, slot]
            else:
                got_k, got_v = k[i, :, pos], v[i, :, pos]
            assert torch.equal(got_k, k_new[i, :, j]) and torch.equal(got_v, v_new[i, :, j])
    same = (k == k_before) | (k.isnan() & k_before.isnan())
    changed = (~same).any(dim=-1).sum().item()
    assert changed == b * 2 * hkv  # nothing else was written
    out = decode_attention(q, k, v, lens, table, config=DecodeConfig(block_n=16))
    assert (out.float() - reference_decode(q, k, v, lens, table)).abs().max().item() < 3e-3


def test_write_kv_cache_skips_negative_start():
    gen = torch.Generator().manual_seed(4)
    _, k, v = _caches(2, 1, 1, 1, 8, 16, torch.float16, gen)
    k0, v0 = k.clone(), v.clone()
    new = torch.ones(2, 1, 1, 16, dtype=torch.float16, device=DEVICE)
    write_kv_cache(new, new, k, v, torch.tensor([-1, 3], dtype=torch.int32, device=DEVICE))
    assert torch.equal(k[0], k0[0]) and torch.equal(v[0], v0[0])
    assert torch.equal(k[1, 0, 3], new[1, 0, 0])


def test_both_cache_writes_check_the_new_rows_alike():
    """write_kv_cache and write_kv_slots refuse a wrong rank or mismatched new rows with one message, naming
    their own cache argument; nothing is launched."""
    from trtforge.kernels.paged_cache import write_kv_slots

    rows, pool = torch.zeros(1, 2, 1, 16), torch.zeros(4, 8, 2, 16)
    start, slots = torch.zeros(1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^k_new must be 4-D; got shape \(2, 1, 16\)$"):
        write_kv_cache(rows[0], rows, pool, pool, start, table)
    with pytest.raises(ValueError, match=r"^k_new must be 4-D; got shape \(2, 1, 16\)$"):
        write_kv_slots(rows[0], rows, pool, pool, slots)
    with pytest.raises(ValueError, match=r"^v_cache must be 4-D; got shape \(2, 8, 16\)$"):
        write_kv_cache(rows, rows, torch.zeros(1, 2, 8, 16), torch.zeros(2, 8, 16), start)
    with pytest.raises(ValueError, match=r"^v_pool must be 4-D; got shape \(8, 2, 16\)$"):
        write_kv_slots(rows, rows, pool, pool[0], slots)
    message = r"^v_new must match k_new's shape \(1, 2, 1, 16\); got \(1, 2, 2, 16\)$"
    with pytest.raises(ValueError, match=message):
        write_kv_cache(rows, torch.zeros(1, 2, 2, 16), pool, pool, start, table)
    with pytest.raises(ValueError, match=message):
        write_kv_slots(rows, torch.zeros(1, 2, 2, 16), pool, pool, slots)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"hkv": 3}, "must divide"),
        ({"s_q": 9}, "outside 1..8"),
        ({"lens_dtype": torch.int64}, "seq_lens must be int32"),
        ({"dtype": torch.float32}, "share one dtype"),
    ],
)
def test_bad_inputs_are_rejected(kw, message):
    hkv, s_q = kw.get("hkv", 2), kw.get("s_q", 1)
    dtype = kw.get("dtype", torch.float16)
    q = torch.zeros(2, 4, s_q, 16, dtype=dtype)
    k = torch.zeros(2, hkv, 8, 16, dtype=dtype)
    lens = torch.ones(2, dtype=kw.get("lens_dtype", torch.int32))
    with pytest.raises(ValueError, match=message):
        decode_attention(q, k, k, lens)
