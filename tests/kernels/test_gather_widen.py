"""FP8 pool blocks gathered and widened for the Hopper chunk kernel in one launch
(trtforge.kernels.chunked_prefill.gather_widened): exactly torch's byte gather, widening copy and V-scale
multiply, the path it replaces. In Triton's CPU interpreter without CUDA, for real on a GPU (``-m gpu``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


def _pools(blocks: int, shape: tuple[int, int, int], seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """K and V pools of every E4M3 code but NaN (random bytes), on `device`."""
    from trtforge.kernels.kv_quant import FP8_KV_DTYPE

    g = torch.Generator().manual_seed(seed)
    pools = []
    for _ in range(2):
        codes = torch.randint(0, 256, (blocks, *shape), generator=g, dtype=torch.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x42  # E4M3's NaN codes: their widening is NaN either way
        pools.append(codes.view(FP8_KV_DTYPE).to(device))
    return tuple(pools)


def _reference(pool: torch.Tensor, pages: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """The path the kernel replaces: the byte gather, the widening copy, then the multiply by `scale`."""
    out = pool.view(torch.uint8).index_select(0, pages).view(pool.dtype).to(dtype)
    return out.mul_(scale) if scale != 1.0 else out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    ("shape", "v_scale"),
    [((16, 8, 128), 0.0213), ((16, 3, 80), 1.0), ((64, 2, 64), 3.5), ((1, 1, 8), 0.5)],
    ids=["16x8x128", "16x3x80-ragged", "64x2x64-parts", "tiny"],
)
def test_gather_widened_equals_torch_gather_copy_multiply(device, dtype, shape, v_scale):
    """Scattered, repeated and out-of-order pages into a larger scratch; the scratch past them untouched."""
    from trtforge.kernels.chunked_prefill import gather_widened

    skip_unless_runs_here(device)
    k_pool, v_pool = _pools(23, shape, 7, device)
    pages = torch.tensor([5, 0, 22, 9, 9, 13, 1], dtype=torch.int32, device=device)
    k_out = torch.full((9, *shape), -7.0, dtype=dtype, device=device)
    v_out = torch.full_like(k_out, -7.0)
    gather_widened(k_pool, v_pool, pages, k_out, v_out, v_scale)
    n = len(pages)
    for got, pool, scale in ((k_out, k_pool, 1.0), (v_out, v_pool, v_scale)):
        want = _reference(pool, pages.long(), dtype, scale)
        assert torch.equal(got[:n].view(torch.int16), want.view(torch.int16)), "not torch's values"
        assert bool((got[n:] == -7).all()), "blocks past the gathered ones were written"


@pytest.mark.parametrize("device", DEVICES)
def test_gather_widened_refuses_what_it_cannot_hold(device):
    from trtforge.kernels.chunked_prefill import gather_widened

    skip_unless_runs_here(device)
    k_pool, v_pool = _pools(4, (16, 2, 64), 1, device)
    pages = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    out = torch.zeros(3, 16, 2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="do not fit"):
        gather_widened(k_pool, v_pool, pages, out[:2], out[:2].clone())
    with pytest.raises(ValueError, match="FP8"):
        gather_widened(out, out, pages, out.clone(), out.clone())
    with pytest.raises(ValueError, match="16-bit"):
        gather_widened(k_pool, v_pool, pages, out.float(), out.float())
    with pytest.raises(ValueError, match="v_out must be a contiguous"):
        gather_widened(k_pool, v_pool, pages, out, out.transpose(1, 2))
    gather_widened(k_pool, v_pool, pages[:0], out, out.clone())  # nothing to gather: nothing launched
