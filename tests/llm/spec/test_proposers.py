"""Prompt lookup against a plain search, and its per-request arrays."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from trtforge.llm.spec.proposers import NgramProposer


def _plain_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """For n from max_n down to min_n: the latest earlier window equal to the last n tokens (followed
    by at least one token) gives the proposal."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@pytest.mark.parametrize(("min_n", "max_n"), [(1, 4), (2, 3), (3, 3)])
def test_lookup_equals_the_plain_search(min_n, max_n):
    rng = np.random.default_rng(0)
    prop = NgramProposer(4, min_n, max_n)
    for _ in range(400):
        vocab = int(rng.integers(2, 6))
        tokens = rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist()
        k = int(rng.integers(1, 6))
        assert prop.lookup(tokens, k) == _plain_lookup(tokens, k, min_n, max_n), (tokens, k)


def test_proposals_follow_a_growing_sequence_and_forget_drops_it():
    prop = NgramProposer(3)
    seq = SimpleNamespace(request_id="a", tokens=[5, 6, 7, 8, 5, 6])
    assert prop.propose([seq], [3])[0].tokens == [7, 8, 5]
    seq.tokens += [7, 9] * 40  # grows past the array it had
    assert prop.propose([seq], [3])[0].tokens == _plain_lookup(seq.tokens, 3, 1, 4)
    prop.forget(["a"])
    assert not prop._arrays
