"""A decode step's rows as two halves whose attention and layer products overlap (opt-in,
:data:`MIN_ROWS`, in the step's CUDA graph).

A decode step's attention reads every row's K/V (memory-bound); its projections multiply hundreds of rows
by the weights (compute-bound). In one stream they take turns: at 8B FP8 with 422 rows of ~3,000 keys a
step took 29.8 ms against a 20.1 ms roofline (BENCHMARKS.md, session 35). Here the step's rows are split in
two halves A and B, and each half's attention runs on a side stream while the main stream computes the
other half's projections:

    main:  in A0 | in B0 | out A0, in A1 | out B0, in B1 | out A1, in A2 | ...
    side:          att A0 | att B0        | att A1        | att B1        | ...

(`in`: norm, QKV, RoPE and the K/V write, :meth:`ModelLayers.layer_in`; `out`: o projection, residual and
MLP, :meth:`ModelLayers.layer_out`). Each side launch first waits for the main stream's work so far (its
half's q and K/V), and each half's `out` waits for its own attention alone (an event). The halves' q and
attention outputs live in buffers made before the layers; a buffer is written again only after the main
stream consumed it (the side launch that rewrites one waits for the main stream past that use). The
hidden states are updated in place, so the head reads both halves without a copy. Captured in the
executor's decode CUDA graphs like the plain step; on a CPU the same order runs in one stream (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# Decode steps (one query a row) of at least this many rows, in the bucket the graph is captured for, run
# as two overlapping halves; 0: never (the default until the H200 measures it: profile_mixed_step.py --ab
# base trtforge.llm.executors.decode_overlap.MIN_ROWS=128 --decode-rows ...).
MIN_ROWS = 0
# (Mixed steps, a step's decode rows beside its prompt rows, were tried the same way and removed: on the
# H200 a layer's decode attention beside 1,063 prompt rows' FP8 products hid 0% of either, since those
# GEMMs fill every SM; BENCHMARKS.md, session 36.)


class Unsplittable(Exception):
    """The step's per-token layer inputs have a form the split does not know (the plain step runs)."""


def rows_of(x: Any, lo: int, hi: int, tokens: int) -> Any:
    """Rows ``[lo, hi)`` of every tensor in `x` (None, a tensor of `tokens` rows, or tuples of them)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == tokens:
        return x[lo:hi]
    if isinstance(x, (tuple, list)):
        return type(x)(rows_of(e, lo, hi, tokens) for e in x)
    raise Unsplittable(f"a per-token layer input of type {type(x).__name__}")


class _Lanes:
    """The main and side streams and their events on CUDA; on a CPU, one stream (every call a no-op)."""

    def __init__(self, device: torch.device, side: Any) -> None:
        self.cuda = device.type == "cuda"
        self.main = torch.cuda.current_stream(device) if self.cuda else None
        self.side = side if self.cuda else None

    def fork(self, launch: Callable[[], None]) -> Any:
        """Run `launch` on the side stream after the main stream's work so far; return its done event."""
        if not self.cuda:
            launch()
            return None
        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            launch()
            done = torch.cuda.Event()
            done.record(self.side)
        return done

    def join(self, done: Any) -> None:
        """The main stream waits for `done` (one side launch, not the ones after it)."""
        if done is not None:
            self.main.wait_event(done)

    def end(self) -> None:
        """The main stream waits for the side stream (a capture must join every stream it forked)."""
        if self.cuda:
            self.main.wait_stream(self.side)


def forward(
    layers: Any,
    k_pools: Sequence[torch.Tensor],
    v_pools: Sequence[torch.Tensor],
    attend: Callable[..., None],
    ids: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    side_stream: Any,
) -> torch.Tensor:
    """The hidden states after every layer of a step over tokens `ids`, its rows in two overlapping
    halves. ``attend(i, rows, q, out)`` writes layer i's attention of half `rows` (a slice; `q` is that
    half's) into `out`. Raises
    :class:`Unsplittable` before any layer runs where the inputs do not split."""
    t = int(ids.shape[0])
    m = t // 2
    if not 0 < m < t:
        raise Unsplittable(f"a split at row {m} of {t}")
    h, extra = layers.embed(ids, positions)
    halves = (slice(0, m), slice(m, t))
    extras = [rows_of(extra, s.start, s.stop, t) for s in halves]
    lanes = _Lanes(ids.device, side_stream)
    hs = [h[s] for s in halves]
    qs = [layers.layer_in(0, hs[0], extras[0], slots[halves[0]])]
    outs = [torch.empty_like(qs[0])]

    def attention(i: int, j: int) -> Any:
        q, o = qs[j], outs[j]
        return lanes.fork(lambda: attend(i, halves[j], q, o))

    done_a = attention(0, 0)
    n = len(k_pools)
    for i in range(n):
        if i == 0:
            qs.append(layers.layer_in(0, hs[1], extras[1], slots[halves[1]]))
            outs.append(torch.empty_like(qs[1]))
        else:
            layers.layer_in(i, hs[1], extras[1], slots[halves[1]], out=qs[1])
        done_b = attention(i, 1)
        lanes.join(done_a)
        layers.layer_out(i, hs[0], outs[0], out=hs[0])
        if i + 1 < n:
            layers.layer_in(i + 1, hs[0], extras[0], slots[halves[0]], out=qs[0])
            done_a = attention(i + 1, 0)
        lanes.join(done_b)
        layers.layer_out(i, hs[1], outs[1], out=hs[1])
    lanes.end()
    return h
