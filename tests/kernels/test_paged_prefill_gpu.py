"""Chunked prefill on a CUDA GPU against FP32 SDPA: long prefixes, every head dim, GQA 1/4/8,
contiguous and paged (16/64-token blocks at random places), FP16 and BF16."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.kernels.decode_reference import paged_from_contiguous, reference_decode  # noqa: E402
from trtforge.kernels.chunked_prefill import chunked_prefill_attention  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
CASES = [
    (d, g, (torch.float16, torch.bfloat16)[i % 2], (0, 16, 64)[i % 3])
    for i, (d, g) in enumerate(itertools.product((64, 128, 80, 96, 256), (1, 4, 8)))
]


@pytest.mark.parametrize(("d", "group", "dtype", "page"), CASES, ids=str)
def test_chunk_over_long_prefixes(d, group, dtype, page):
    gen = torch.Generator().manual_seed(d + group)
    hq, s_q = 8, 300
    lens = torch.tensor([300, 317, 1000, 4096], dtype=torch.int32, device="cuda")
    b, s_max = len(lens), 4096
    q = torch.randn(b, hq, s_q, d, generator=gen).to(dtype).cuda()
    k = torch.randn(b, hq // group, s_max, d, generator=gen).to(dtype).cuda()
    v = torch.randn(b, hq // group, s_max, d, generator=gen).to(dtype).cuda()
    table = None
    if page:
        k, v, table = paged_from_contiguous(k, v, lens, page, gen)
    out = torch.full_like(q, float("nan"))
    chunked_prefill_attention(q, k, v, lens, table, out=out, block_n=32 if d > 128 else 64)
    ref = reference_decode(q, k, v, lens, table)
    atol, rtol = TOL[dtype]
    assert not torch.isnan(out).any()
    assert ((out.float() - ref).abs() - (atol + rtol * ref.abs())).max().item() <= 0


def test_varlen_steps_share_one_compiled_kernel():
    """Serving steps differ in their longest chunk and in where their metadata slices start (offsets
    into one int32 buffer): none of that may need a new specialization, i.e. a compile mid-run."""
    from trtforge.kernels.chunked_prefill import _chunked_prefill_kernel, chunked_prefill_varlen

    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, page, nblocks = 8, 2, 64, 16, 64
    k_pool = torch.randn(nblocks, page, hkv, d, generator=gen).half().cuda()
    v_pool = torch.randn(nblocks, page, hkv, d, generator=gen).half().cuda()
    table = torch.randperm(nblocks, generator=gen)[:48].view(3, 16).to(torch.int32).cuda()
    q = torch.randn(256, hq, d, generator=gen).half().cuda()
    out = torch.empty_like(q)
    cache = _chunked_prefill_kernel.device_caches[torch.cuda.current_device()][0]
    sizes = []
    for offset, q_lens in itertools.product(
        (0, 1, 2, 3), ([16, 32, 48], [1, 1, 1], [17, 40, 3], [64, 64, 64])
    ):
        buf = torch.zeros(offset + 9, dtype=torch.int32, device="cuda")  # the metadata at `offset`
        starts = [0, q_lens[0], q_lens[0] + q_lens[1]]
        meta = buf[offset:].view(3, 3)
        meta.copy_(torch.tensor([starts, q_lens, [n + 20 for n in q_lens]], dtype=torch.int32))
        s, ql, lens = meta.unbind(0)
        chunked_prefill_varlen(q, k_pool, v_pool, lens, table, s, ql, max(q_lens), scale=0.125, out=out)
        sizes.append(len(cache))
    torch.cuda.synchronize()
    assert len(set(sizes)) == 1, f"compiled variants grew across steps: {sizes}"
