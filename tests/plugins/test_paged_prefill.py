"""Chunked prefill with GQA over contiguous and paged caches: a chunk appended to a prefix already
in the pool attends to prefix + itself (LOWER_RIGHT). Runs in Triton's interpreter without CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernel (pip install triton)")

from tests.plugins.decode_reference import paged_from_contiguous, reference_decode  # noqa: E402
from trtforge.plugins.attention.chunked_prefill import chunked_prefill_attention  # noqa: E402
from trtforge.plugins.attention.paged_cache import write_kv_cache  # noqa: E402

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
