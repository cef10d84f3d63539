"""The one set of metrics, recomputed independently in numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtforge.numerics.compare import (
    Tolerance,
    compare_arrays,
    elementwise_failures,
    masked_rows,
    row_cosines,
    snr_db,
)


def test_metrics_match_their_definitions():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((6, 5))
    t = r + 0.1 * rng.standard_normal((6, 5))
    m = compare_arrays(r, t)
    d = np.abs(t - r)
    assert m.max_abs == pytest.approx(d.max()) and m.mean_abs == pytest.approx(d.mean())
    assert m.max_rel == pytest.approx((d / np.abs(r)).max())
    assert m.peak_rel == pytest.approx(d.max() / np.abs(r).max())
    assert m.rel_l2 == pytest.approx(np.linalg.norm(t - r) / np.linalg.norm(r))
    assert m.cosine == pytest.approx((r * t).sum() / np.linalg.norm(r) / np.linalg.norm(t))
    rows = (r * t).sum(1) / np.linalg.norm(r, axis=1) / np.linalg.norm(t, axis=1)
    assert m.min_row_cosine == pytest.approx(rows.min())
    assert m.snr_db == pytest.approx(10 * np.log10((r**2).mean() / ((t - r) ** 2).mean()))
    assert m.finite and m.elements == 30


def test_elementwise_rule_nan_and_inf():
    ref = np.array([1.0, 100.0, np.nan, -np.inf, 0.0])
    got = np.array([1.05, 100.5, np.nan, -np.inf, np.nan])
    bad = elementwise_failures(ref, got, Tolerance(atol=0.01, rtol=0.01))
    # 0.05 > 0.01 + 0.01; 0.5 <= 0.01 + 1.0; NaN==NaN and -inf==-inf agree; a new NaN fails
    assert bad.tolist() == [True, False, False, False, True]
    assert not compare_arrays(ref, got).finite


def test_row_cosines_zero_rows_and_masking():
    r = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    t = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    assert row_cosines(r, t).tolist() == [1.0, 0.0, pytest.approx(1.0)]
    h = np.ones((2, 3, 4))
    g = h.copy()
    g[1, 2] = -5.0  # only at a padded position
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    assert row_cosines(*masked_rows(h, g, mask)).min() == pytest.approx(1.0)
    assert snr_db(h, h) == math.inf


def test_row_cosines_of_arrays_without_rows_are_empty():
    """Before: numpy's 'cannot reshape array of size 0 into shape (0,newaxis)'."""
    assert row_cosines(np.zeros((0, 4)), np.zeros((0, 4))).shape == (0,)
    assert row_cosines(np.zeros((3, 0)), np.zeros((3, 0))).tolist() == [1.0, 1.0, 1.0]
