"""Activation-aware weight quantization (AWQ, Lin et al. 2023): per-input-channel scales searched on
calibration activations so that INT4 round-to-nearest keeps the channels that matter.

For projections sharing one input ``X`` (q/k/v; gate/up; o; down) the weights are scaled per input
channel by ``s = mean|X|^alpha`` (normalized to a geometric mean of 1), quantized, and the inverse
scale goes into the operation before them (the RMSNorm weight; for down_proj the rows of up_proj; for
o_proj the rows of v_proj where their shapes match, else o_proj keeps ``s = 1``), so the float
model computes the same. ``alpha`` runs over a grid in [0, 1] (0: plain round-to-nearest); the one
kept minimizes the mean squared error of the projections' outputs on ``X`` against the unquantized
weights. Then, as AWQ does, each group's clipping range (max and min shrunk by a ratio in
[0.5, 1]) is searched per output channel, minimizing the error of that group's partial dot products
over the calibration tokens (not for q and k, whose errors the softmax amplifies).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trtforge.kernels.qweight import INT4_GROUP, fake_quantize_int4

ALPHA_GRID = tuple(i / 20 for i in range(21))


def search_scales(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    quantize: Callable[[torch.Tensor], torch.Tensor] = fake_quantize_int4,
    grid: tuple[float, ...] = ALPHA_GRID,
) -> tuple[torch.Tensor, float, float]:
    """The per-input-channel scale ``s`` ``[K]`` for `weights` (each ``[N_i, K]``) reading `x` ``[T, K]``;
    also the alpha chosen and its error relative to alpha 0 (round-to-nearest).

    The output error ``|X (Q - W)^T|^2`` is computed as ``sum((D G) * D)`` with ``D = Q - W`` and the
    Gram matrix ``G = X^T X``: one ``[K, K]`` product per alpha instead of one over every token."""
    w = torch.cat([t.detach().float() for t in weights])
    xf = x.float()
    gram = xf.t() @ xf
    x_mean = xf.abs().mean(0).clamp_min(1e-8)
    best: tuple[float, float, torch.Tensor] | None = None
    base = None
    for alpha in grid:
        s = x_mean.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        d = quantize(w * s[None, :]) / s[None, :] - w
        err = float(((d @ gram) * d).sum())
        if base is None:
            base = err
        if best is None or err < best[0]:
            best = (err, alpha, s)
    assert best is not None and base is not None
    return best[2], best[1], best[0] / max(base, 1e-30)


CLIP_GRID = tuple(1.0 - i / 20 for i in range(11))  # 1.0 .. 0.5


def search_clip(
    x: torch.Tensor, w: torch.Tensor, group_size: int = INT4_GROUP, grid: tuple[float, ...] = CLIP_GRID
) -> torch.Tensor:
    """Per (output channel, group) clip ratios ``[N, K / G]`` for `w` ``[N, K]`` reading `x` ``[T, K]``:
    each minimizes its group's partial-dot-product error ``d^T G_g d`` (``G_g``: the group's Gram)."""
    n, k = w.shape
    groups = k // group_size
    xg = x.float().view(-1, groups, group_size)
    gram = torch.einsum("tgk,tgl->gkl", xg, xg)
    wf = w.detach().float()
    best_err = torch.full((n, groups), float("inf"), device=w.device)
    best = torch.ones((n, groups), device=w.device)
    for ratio in grid:
        clip = torch.full((n, groups), ratio, device=w.device)
        d = (fake_quantize_int4(wf, group_size, clip) - wf).view(n, groups, group_size)
        err = torch.einsum("ngk,gkl,ngl->ng", d, gram, d)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, clip, best)
    return best
