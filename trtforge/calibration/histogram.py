"""Streaming per-tensor statistics with bounded memory: exact |x| max and an |x| histogram whose range
grows by doubling (adjacent bins merge exactly), so no activation is ever kept after its batch.

Values that are not finite, or whose magnitude is at least ``MASK_MAGNITUDE`` (attention-mask
constants: -inf in legacy exports, float32 min in dynamo exports), are counted and dropped: they
never widen a range.
"""

from __future__ import annotations

import numpy as np

NUM_BINS = 4096
MASK_MAGNITUDE = 1e30


class TensorHistogram:
    """|x| statistics of one tensor: max, histogram over [0, range], dropped count, channel max (opt.)."""

    def __init__(self, num_bins: int = NUM_BINS, *, per_channel: bool = False, histogram: bool = True):
        self.num_bins = num_bins
        self.histogram = histogram  # False: max only (method "max" needs no histogram)
        self.hist = np.zeros(num_bins, dtype=np.int64)
        self.range = 0.0
        self.amax = 0.0
        self.count = 0
        self.dropped = 0
        self.per_channel = per_channel
        self.channel_amax: np.ndarray | None = None

    @property
    def bin_width(self) -> float:
        return self.range / self.num_bins

    def update(self, x: np.ndarray) -> None:
        """Add the values of `x` (any shape; the last axis is the channel axis for channel max)."""
        a = np.abs(np.asarray(x, dtype=np.float32))
        good = np.isfinite(a) & (a < MASK_MAGNITUDE)
        n_bad = int(a.size - np.count_nonzero(good))
        if n_bad:
            self.dropped += n_bad
            a = np.where(good, a, np.float32(0.0))
        if self.per_channel and a.ndim >= 1 and a.size:
            cmax = a.reshape(-1, a.shape[-1]).max(axis=0)
            self.channel_amax = cmax if self.channel_amax is None else np.maximum(self.channel_amax, cmax)
        vals = a[good] if n_bad else a.ravel()
        if vals.size == 0:
            return
        m = float(vals.max())
        self.amax = max(self.amax, m)
        self.count += int(vals.size)
        if not self.histogram:
            return
        if m == 0.0 and self.range == 0.0:
            self.hist[0] += vals.size
            return
        if self.range == 0.0:
            self.range = m
        while m > self.range:
            self._double()
        # in float64: a first batch of subnormal magnitudes (MobileViT) makes num_bins / range ~1e48,
        # which overflows float32 to inf, and inf cast to int64 is a negative bin index
        scaled = np.multiply(vals, self.num_bins / self.range, dtype=np.float64)
        idx = np.minimum(scaled.astype(np.int64), self.num_bins - 1)
        self.hist += np.bincount(idx, minlength=self.num_bins)

    def _double(self) -> None:
        merged = self.hist.reshape(-1, 2).sum(axis=1)
        self.hist = np.concatenate([merged, np.zeros(self.num_bins - merged.size, dtype=np.int64)])
        self.range *= 2.0

    def trimmed(self) -> tuple[np.ndarray, float]:
        """(histogram up to its last non-empty bin, bin width)."""
        nz = np.flatnonzero(self.hist)
        end = int(nz[-1]) + 1 if nz.size else 1
        return self.hist[:end].astype(np.float64), self.bin_width


def select_real_tokens(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Rows of `x` at real-token positions of `mask` [batch, seq]; `x` unchanged when no axis is the sequence.

    The batch must be axis 0; the sequence axis is the first later axis whose size is seq
    (query positions of [batch, heads, seq, seq] scores; [batch, seq, hidden] activations).
    """
    b, s = mask.shape
    if x.ndim < 2 or x.shape[0] != b:
        return x
    for axis in range(1, x.ndim):
        if x.shape[axis] == s:
            return np.moveaxis(x, axis, 1)[mask.astype(bool)]
    return x
