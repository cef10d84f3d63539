"""The heap freeze an engine holds while it serves (trtforge.llm.gc_heap): what it freezes, when it ends."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from tests.llm.serving_models import make_executor
from trtforge.llm import gc_heap
from trtforge.llm.engine import LLMEngine
from trtforge.llm.sampling import SamplingParams


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref:
    """A two-object reference cycle, already garbage: only the cyclic collector frees it."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def unfrozen():
    """Start from no freeze held (an engine a failed test left open would hold one)."""
    if gc_heap.holders():
        pytest.skip(f"{gc_heap.holders()} heap freeze(s) held by an engine another test left open")
    yield
    assert gc_heap.holders() == 0


def test_freeze_moves_the_live_heap_out_of_collections_and_the_last_thaw_brings_it_back(unfrozen):
    kept = _Node()
    gc_heap.freeze()
    try:
        assert gc.get_freeze_count() > 0
        assert gc.is_tracked(kept) and kept not in gc.get_objects(generation=2)
        gc_heap.freeze()  # a second holder
        gc_heap.thaw()
        assert gc.get_freeze_count() > 0, "the first holder's freeze was let go by the second's thaw"
    finally:
        gc_heap.thaw()
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects(generation=2))


def test_freeze_collects_the_garbage_first_rather_than_freezing_it(unfrozen):
    gc.disable()  # no automatic collection between making the garbage and the freeze
    try:
        ref = _cycle()
        assert ref() is not None
        gc_heap.freeze()
    finally:
        gc.enable()
    try:
        assert ref() is None, "a garbage cycle alive at the freeze was frozen (it would outlive the engine)"
    finally:
        gc_heap.thaw()


def test_a_thaw_without_a_freeze_is_refused(unfrozen):
    with pytest.raises(RuntimeError, match="without a matching freeze"):
        gc_heap.thaw()


def test_a_full_collection_while_frozen_skips_the_frozen_heap(unfrozen):
    heap = [[_Node() for _ in range(50)] for _ in range(2000)]  # 100 k tracked objects to walk
    gc.collect()
    t = time.perf_counter()
    gc.collect()
    walked = time.perf_counter() - t
    gc_heap.freeze()
    try:
        t = time.perf_counter()
        gc.collect()
        frozen = time.perf_counter() - t
    finally:
        gc_heap.thaw()
    del heap
    # the same process and heap a moment apart: a frozen heap is not walked at all (timings here differ
    # by 10x or more; 2x leaves room for a loaded machine)
    assert frozen < walked / 2, (frozen, walked)


def test_an_engine_holds_the_freeze_while_open_and_releases_it_on_close(unfrozen):
    executor = make_executor(num_blocks=64)
    engine = LLMEngine(executor)
    try:
        assert gc_heap.holders() == 1 and gc.get_freeze_count() > 0
        out = engine.generate([[3, 1, 4]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
        assert out.error is None and len(out.token_ids) == 3
        with LLMEngine(executor) as second:  # two engines: the first's freeze outlives the second
            assert gc_heap.holders() == 2
            assert second.generate([[5, 9]], SamplingParams(max_tokens=2, ignore_eos=True))[0].error is None
        assert gc_heap.holders() == 1 and gc.get_freeze_count() > 0
    finally:
        engine.close()
    engine.close()  # a second close lets go of nothing more
    assert gc_heap.holders() == 0 and gc.get_freeze_count() == 0


def test_a_served_model_dropped_unclosed_closes_its_engine(unfrozen):
    """A ServingLLM (what trtforge.llm.load returns) let go without close(): its engine's loop thread ends
    and its heap freeze is let go once it is garbage; an explicit close() after use closes once."""
    from trtforge.llm.service import ServingLLM

    llm = ServingLLM(make_executor(num_blocks=64))
    loop = llm.engine._thread
    assert llm.generate([[3, 1, 4]], max_new_tokens=2, stop_at_eos=False)[0].__len__() == 2
    assert gc_heap.holders() == 1 and loop.is_alive()
    del llm
    gc.collect()
    assert gc_heap.holders() == 0 and not loop.is_alive()
    with ServingLLM(make_executor(num_blocks=64)) as kept:
        assert gc_heap.holders() == 1
    kept.close()  # closed already: nothing more to let go
    assert gc_heap.holders() == 0 and not kept.engine._thread.is_alive()


def test_an_engine_made_with_freeze_gc_off_leaves_the_heap_alone(unfrozen):
    with LLMEngine(make_executor(num_blocks=64), freeze_gc=False) as engine:
        assert gc_heap.holders() == 0 and gc.get_freeze_count() == 0
        assert engine.generate([[7, 7, 7]], SamplingParams(max_tokens=2, ignore_eos=True))[0].error is None


def _full_collections_while(allocations: int) -> int:
    """Full collections CPython runs by itself while `allocations` long-lived containers are made."""
    full: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    kept: list[list[int]] = []
    gc.callbacks.append(count)
    try:
        for i in range(allocations):
            kept.append([i])  # survives: a request's token list, say
    finally:
        gc.callbacks.remove(count)
    del kept
    return len(full)


def test_a_held_freeze_spaces_full_collections_out_and_the_thaw_puts_the_thresholds_back(unfrozen):
    before = gc.get_threshold()
    gc_heap.freeze()
    try:
        assert gc.get_threshold() == (before[0], before[1], gc_heap.MIDDLE_COLLECTIONS_PER_FULL)
        gc_heap.freeze()  # a second holder changes nothing more
        gc_heap.thaw()
        assert gc.get_threshold()[2] == gc_heap.MIDDLE_COLLECTIONS_PER_FULL
        spaced = _full_collections_while(600_000)
        gc.set_threshold(*before)
        default = _full_collections_while(600_000)
        gc.set_threshold(before[0], before[1], gc_heap.MIDDLE_COLLECTIONS_PER_FULL)
    finally:
        gc_heap.thaw()
    assert gc.get_threshold() == before
    # each full collection walks every young container element by element (a request's token lists):
    # the serving heap's pauses of 40-150 ms on the H200, one every few seconds at CPython's 10
    assert default >= 3 and spaced <= default // 3, (spaced, default)


def test_thresholds_set_by_someone_else_meanwhile_are_kept(unfrozen):
    before = gc.get_threshold()
    try:
        gc_heap.freeze()
        gc.set_threshold(2000, 20, 30)  # the application's own choice, made while an engine serves
        gc_heap.thaw()
        assert gc.get_threshold() == (2000, 20, 30)
        gc.set_threshold(before[0], before[1], 500)  # already spaced further than ours: left alone
        gc_heap.freeze()
        assert gc.get_threshold()[2] == 500
        gc_heap.thaw()
        assert gc.get_threshold()[2] == 500
    finally:
        gc.set_threshold(*before)
