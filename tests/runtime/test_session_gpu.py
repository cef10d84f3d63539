"""Session machinery on a real GPU with the stand-in: streams, events, arenas, staging, graphs, threads.

The stand-in enqueues real CUDA work on the lane's stream through the bound addresses and refuses what
TensorRT forbids (shared profiles or device memory between contexts, default stream, unbound tensors).
"""

from __future__ import annotations

import concurrent.futures
import random

import numpy as np
import pytest
import torch

from trtforge.errors import UserError
from trtforge.runtime.standin import load_standin, standin_manifest

pytestmark = pytest.mark.gpu

D = 64


def _check(x: torch.Tensor, out: dict) -> None:
    y = x * 2 + 1
    assert torch.equal(out["y"], y), "y corrupted"
    torch.testing.assert_close(out["s"], y.sum(-1), rtol=1e-5, atol=1e-4)


def test_8_threads_x_1000_submits_random_shapes_all_correct():
    eng = load_standin(standin_manifest(batch=(1, 8, 32), streams=4), num_aux_streams=1)
    s = eng.session(streams=4)

    def client(seed: int) -> int:
        rng = random.Random(seed)
        pending = []
        checked = 0
        for i in range(1000):
            b = rng.randint(1, 32)
            x = torch.randn(b, D, device="cuda") + (seed * 1000 + i)  # distinct values per request
            pending.append((x, s.submit({"x": x})))
            if len(pending) >= 8:
                x0, f0 = pending.pop(0)
                _check(x0, f0.result())
                checked += 1
        for x0, f0 in pending:
            _check(x0, f0.result())
            checked += 1
        return checked

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(client, range(8))) == 8000
    stats = s.memory_stats()
    assert sum(lane["calls"] for lane in stats["lanes"]) == 8000
    assert all(lane["calls"] > 0 for lane in stats["lanes"]), "a lane never ran"
    profiles = {c.profile for c in eng.handle.contexts}
    assert profiles == {0, 1, 2, 3}
    s.close()


def test_arenas_stop_growing_after_warmup_over_10000_calls():
    memory = lambda b: b * D * 4 + 4096 * b  # noqa: E731 - per-shape requirement, larger than the scratch
    eng = load_standin(standin_manifest(batch=(1, 8, 32), streams=4), memory_fn=memory)
    s = eng.session(streams=4)
    grow_after: dict[int, int] = {}

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(2500):
            x = torch.randn(rng.randint(1, 32), D, device="cuda")
            s.run({"x": x})

    def total_grows() -> int:
        return s.memory_stats()["arena_grow_count"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(client, range(4)))
    torch.cuda.synchronize()
    grow_after[10000] = total_grows()
    # Another 10,000 calls: no lane grows any more.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(client, range(4, 8)))
    torch.cuda.synchronize()
    stats = s.memory_stats()
    assert stats["arena_grow_count"] == grow_after[10000]
    for lane in stats["lanes"]:
        assert lane["arena_bytes"] == memory(32), lane  # exactly the largest shape's need, 256-aligned
    x = torch.randn(5, D, device="cuda")
    _check(x, s.run({"x": x}))


def test_bad_inputs_raise_and_enqueue_nothing():
    eng = load_standin(standin_manifest(streams=2))
    s = eng.session(streams=2)
    bad = [
        ({"x": torch.randn(33, D, device="cuda")}, "dimension 0: 33 not in"),
        ({"x": torch.randn(4, D, device="cuda", dtype=torch.float16)}, "dtype float16"),
        ({"x": torch.randn(4, D, 2, device="cuda")}, "rank 3"),
        ({"y": torch.randn(4, D, device="cuda")}, "missing input"),
    ]
    for inputs, match in bad:
        with pytest.raises(UserError, match=match):
            s.run(inputs)
        with pytest.raises(UserError, match=match):
            s.submit(inputs)
    assert all(c.enqueues == 0 for c in eng.handle.contexts)
    assert all(lane.stream.query() for lane in s._lanes)


def test_numpy_and_cpu_tensors_are_staged_through_pinned_memory():
    s = load_standin(standin_manifest(streams=2)).session(streams=2)
    for b in (3, 17, 3):
        x = np.random.default_rng(b).standard_normal((b, D)).astype(np.float32)
        out = s.run({"x": x})
        assert isinstance(out["y"], np.ndarray)
        np.testing.assert_array_equal(out["y"], x * 2 + 1)
        xt = torch.from_numpy(x)
        out = s.submit({"x": xt}).result()  # CPU tensor in, CUDA tensors out
        assert out["y"].is_cuda
        _check(xt.cuda(), out)
    assert s.memory_stats()["pinned_bytes"] > 0


def test_run_orders_outputs_after_the_callers_stream():
    s = load_standin(standin_manifest(), spin_cycles=2_000_000).session(streams=1)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.randn(8, D, device="cuda")
        out = s.run({"x": x})
        z = out["y"] - 1  # on `side`, after the lane's spinning kernel without any host sync
        y_host = z.cpu()
    torch.testing.assert_close(y_host, (x * 2).cpu())


def test_non_contiguous_input_and_caller_outputs():
    s = load_standin(standin_manifest()).session(streams=1)
    x = torch.randn(D, 6, device="cuda").t()
    y, ssum = torch.empty(6, D, device="cuda"), torch.empty(6, device="cuda")
    out = s.run({"x": x}, outputs={"y": y, "s": ssum})
    assert out["y"] is y
    _check(x.contiguous(), out)
    assert s.memory_stats()["contiguous_copies"] == 1


def test_cuda_graphs_record_replay_and_drop_on_shape_change():
    s = load_standin(standin_manifest(streams=2), num_aux_streams=1).session(streams=2, cuda_graphs=True)
    for b in (8, 8, 8, 8, 8, 8, 5, 5, 5, 8):
        x = torch.randn(b, D, device="cuda")
        _check(x, s.run({"x": x}))
    stats = s.memory_stats()
    assert stats["graph_failures"] == []
    assert any(lane["graph_captured"] for lane in stats["lanes"])
    s2 = load_standin(standin_manifest()).session(streams=1, cuda_graphs=True)
    for b in (4, 4, 4):
        x = torch.randn(b, D, device="cuda")
        _check(x, s2.run({"x": x}))
    assert s2._lanes[0].graph is not None and s2._lanes[0].graph_state.key == ((4, D),)
    x = torch.randn(6, D, device="cuda")
    _check(x, s2.run({"x": x}))
    assert s2._lanes[0].graph is None, "graph kept after a shape change"


def test_graph_replay_under_concurrency():
    s = load_standin(standin_manifest(streams=4)).session(streams=4, cuda_graphs=True)

    def client(seed: int) -> bool:
        ok = True
        for i in range(200):
            x = torch.full((4, D), float(seed * 1000 + i), device="cuda")
            out = s.submit({"x": x}).result()
            ok &= torch.equal(out["y"], x * 2 + 1)
        return ok

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(client, range(4)))
    stats = s.memory_stats()
    assert stats["graph_failures"] == [], stats["graph_failures"]
    assert sum(lane["graph_captured"] for lane in stats["lanes"]) >= 1, stats["lanes"]


def test_data_dependent_output_and_torch_allocator():
    eng = load_standin(standin_manifest(dds=True, streams=2), num_aux_streams=1)
    s = eng.session(streams=2, torch_allocator=True, cuda_graphs=True)
    for b in (9, 31, 9):
        x = torch.randn(b, D, device="cuda")
        out = s.run({"x": x})
        _check(x, out)
        torch.testing.assert_close(out["pos"], torch.nonzero(x[:, 0] > 0).flatten())
    stats = s.memory_stats()
    assert not any(lane["graph_captured"] for lane in stats["lanes"]), (
        "graphs must skip data-dependent engines"
    )
    assert all(lane["torch_allocator_live_bytes"] == 0 for lane in stats["lanes"])


def test_trim_releases_and_rebinds():
    s = load_standin(standin_manifest(streams=2)).session(streams=2)
    x = torch.randn(32, D, device="cuda")
    _check(x, s.run({"x": x}))
    s.trim()
    assert s.memory_stats()["arena_bytes"] == 0
    x = torch.randn(2, D, device="cuda")
    _check(x, s.run({"x": x}))
    assert s.memory_stats()["arena_bytes"] == 2 * D * 4 + (256 - (2 * D * 4) % 256) % 256
