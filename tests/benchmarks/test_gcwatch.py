"""benchmarks/_gcwatch.py: the pauses it records, and --gc-diagnose's account of a full collection."""

from __future__ import annotations

import gc
import weakref

import pytest

from benchmarks._gcwatch import GcWatch, describe


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycles(n: int) -> weakref.ref:
    """`n` two-node cycles, unreachable; a weak reference to one node, to see when it is freed. Automatic
    collections are off meanwhile, so that the explicit one after finds them all."""
    first = None
    gc.disable()
    for _ in range(n):
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        first = first or a
    return weakref.ref(first)


@pytest.fixture(autouse=True)
def _automatic_collections_back_on():
    yield
    gc.enable()


def test_full_collection_is_recorded_with_what_it_freed() -> None:
    gc.collect()
    with GcWatch(diagnose=True) as watch:
        alive = _cycles(500)
        gc.collect(2)
        assert alive() is None, "diagnosed garbage must still be freed"
    assert gc.get_debug() & gc.DEBUG_SAVEALL == 0 and not gc.garbage
    summary = watch.summary()
    assert summary["collections"]["2"] == 1 and len(summary["full"]) == 1
    (diag,) = summary["diagnosis"]
    assert diag["garbage"] >= 1000
    names = dict(diag["garbage_types"])
    assert names[f"{__name__}._Node"] == 1000
    assert diag["unfrozen_objects"] >= 1000  # the cycles were in the heap it walked
    assert "freed ~" in describe(summary) and "_Node 1,000" in describe(summary)


def test_plain_watch_frees_as_usual_and_says_nothing_more() -> None:
    gc.collect()
    with GcWatch() as watch:
        alive = _cycles(10)
        gc.collect(2)
        assert alive() is None
    summary = watch.summary()
    assert "diagnosis" not in summary and "diagnosed" not in describe(summary)
    assert summary["collections"]["2"] == 1


def test_young_collections_are_not_diagnosed() -> None:
    gc.collect()
    with GcWatch(diagnose=True) as watch:
        _cycles(10)
        gc.collect(0)
    assert watch.summary()["diagnosis"] == [] and gc.get_debug() & gc.DEBUG_SAVEALL == 0
