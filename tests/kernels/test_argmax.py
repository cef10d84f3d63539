"""The split row argmax (trtforge.kernels.argmax) against torch.argmax: ties across and within chunks,
NaN, -inf rows, widths that are no multiple of a chunk, 16-bit and 32-bit rows."""

from __future__ import annotations

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from trtforge.kernels import argmax as am


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(am, "FAST_ARGMAX", True)


def _rows(v: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, v, generator=g).to(dtype)
    x[1, 5000] = x[1, 70000] = x[1].max() + 1  # a tie across chunks: the first wins
    x[2, 4097] = x[2, 4098] = x[2].max() + 1  # a tie within a chunk
    x[3] = float("-inf")  # all -inf: index 0
    x[4, 9000] = float("nan")  # NaN counts as the maximum
    x[4, 90000] = float("nan")
    x[4, 100] = float("inf")
    x[5, v - 1] = x[5].max() + 1  # the last element, in the partial last chunk
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_split_argmax_matches_torch(device, dtype, fast):
    skip_unless_runs_here(device)
    for v in (128256, 100003):
        x = _rows(v, dtype, seed=v).to(device)
        assert am.eligible(x)
        got = am.argmax_rows(x)
        assert got.dtype == torch.int64
        assert torch.equal(got.cpu(), x.cpu().float().argmax(-1)), (v, got.cpu(), x.cpu().float().argmax(-1))


def test_ineligible_rows_take_torch(fast):
    """Narrow rows, many rows or a strided row go to torch.argmax, and the knob off sends everything."""
    x = torch.randn(3, 1000)
    assert not am.eligible(x) and torch.equal(am.argmax_rows(x), x.argmax(-1))
    assert not am.eligible(torch.randn(am.MAX_ROWS + 1, am.MIN_WIDTH))
    assert not am.eligible(torch.randn(am.MIN_WIDTH, 2).t())
    am.FAST_ARGMAX = False
    assert not am.eligible(torch.randn(1, am.MIN_WIDTH))
