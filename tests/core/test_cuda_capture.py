"""The garbage collector stays paused through every CUDA graph capture (trtforge.core.cuda_capture)."""

from __future__ import annotations

import gc
import threading

import pytest

from trtforge.core.cuda_capture import gc_paused


def test_gc_paused_nests_and_resumes_only_after_the_last_block():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer capture is still running
    assert gc.isenabled()


def test_gc_paused_leaves_a_disabled_collector_disabled_and_resumes_after_an_error():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="capture failed"), gc_paused():
        raise RuntimeError("capture failed")
    assert gc.isenabled()


def test_concurrent_blocks_resume_the_collector_when_both_have_ended():
    inside, release = threading.Event(), threading.Event()

    def capture() -> None:
        with gc_paused():
            inside.set()
            release.wait(10)

    other = threading.Thread(target=capture)
    other.start()
    assert inside.wait(10)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other thread's block is still open
    release.set()
    other.join(10)
    assert gc.isenabled()


class _Cycle:
    """Reachable only from itself: freed by the cyclic collector, never by reference counting."""

    def __init__(self, obj: object) -> None:
        self.obj, self.me = obj, self


@pytest.mark.gpu
def test_an_old_graph_becoming_garbage_cannot_invalidate_a_capture():
    """An earlier graph left in a reference cycle: a collection inside the next capture would destroy
    it there (not permitted while capturing: the capture fails); under gc_paused none runs."""
    import torch

    old = torch.cuda.CUDAGraph()
    with torch.cuda.graph(old):
        torch.zeros(1, device="cuda")
    threshold = gc.get_threshold()
    gc.set_threshold(1)  # a collection on nearly every allocation of a container
    try:
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with gc_paused(), torch.cuda.stream(side):
            _Cycle(old)
            del old  # garbage now, for the next collection
            graph.capture_begin()
            try:
                out = torch.ones(4, device="cuda") * 2
                junk = [[i] for i in range(10_000)]  # containers: collections, were the collector on
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        graph.replay()
        torch.cuda.synchronize()
        assert junk and out.tolist() == [2.0] * 4
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
