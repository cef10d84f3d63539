"""Activation-aware weight quantization (AWQ, Lin et al. 2023): per-input-channel scales searched on
calibration activations so that INT4 round-to-nearest keeps the channels that matter.

For projections sharing one input ``X`` (q/k/v; gate/up; o; down) the weights are scaled per input
channel by ``s = mean|X|^alpha`` (normalized to a geometric mean of 1), quantized, and the inverse
scale goes into the operation before them (the RMSNorm weight; for down_proj the rows of up_proj; for
o_proj the rows of v_proj where their shapes match, else o_proj keeps ``s = 1``), so the float
model computes the same. ``alpha`` runs over a grid in [0, 1] (0: plain round-to-nearest); the one
kept minimizes the mean squared error of the projections' outputs on ``X`` against the unquantized
weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trtforge.kernels.qweight import Int4Weight, quantize_int4

ALPHA_GRID = tuple(i / 20 for i in range(21))


def search_scales(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    quantize: Callable[[torch.Tensor], Int4Weight] = quantize_int4,
    grid: tuple[float, ...] = ALPHA_GRID,
) -> tuple[torch.Tensor, float, float]:
    """The per-input-channel scale ``s`` ``[K]`` for `weights` (each ``[N_i, K]``) reading `x` ``[T, K]``;
    also the alpha chosen and its error relative to alpha 0 (round-to-nearest)."""
    w = torch.cat([t.detach().float() for t in weights])
    xf = x.float()
    want = xf @ w.t()
    x_mean = xf.abs().mean(0).clamp_min(1e-8)
    best: tuple[float, float, torch.Tensor] | None = None
    base = None
    for alpha in grid:
        s = x_mean.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        q = quantize(w * s[None, :]).dequantize() / s[None, :]
        err = (xf @ q.t() - want).pow(2).mean().item()
        if base is None:
            base = err
        if best is None or err < best[0]:
            best = (err, alpha, s)
    assert best is not None and base is not None
    return best[2], best[1], best[0] / max(base, 1e-30)
