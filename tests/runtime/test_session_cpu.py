"""Session machinery on the CPU with the stand-in (HostDevice): binding, profiles, arenas, outputs, errors.

The same code runs on CUDA in test_session_gpu.py; here streams are no-ops and work is synchronous.
"""

from __future__ import annotations

import concurrent.futures
import gc
import threading
import time

import numpy as np
import pytest
import torch

from trtforge.errors import UserError
from trtforge.runtime.standin import load_standin, standin_manifest


def _session(streams=2, *, manifest=None, **engine_kw):
    manifest = manifest or standin_manifest(streams=streams)
    eng = load_standin(manifest, device="cpu", **engine_kw)
    return eng, eng.session(streams=streams)


def _expect(x):
    y = x * 2 + 1
    return y, y.sum(-1)


def test_run_computes_through_bound_addresses_and_arena():
    _eng, s = _session(2)
    x = torch.randn(7, 64)
    out = s.run({"x": x})
    y, ssum = _expect(x)
    torch.testing.assert_close(out["y"], y)
    torch.testing.assert_close(out["s"], ssum)
    stats = s.memory_stats()
    assert stats["arena_bytes"] >= 7 * 64 * 4
    assert stats["lanes"][0]["arena_last_request"] == 7 * 64 * 4


def test_each_lane_uses_its_own_profile_copy():
    eng, s = _session(3)
    futs = [s.submit({"x": torch.randn(4, 64)}) for _ in range(12)]
    for f in futs:
        f.result()
    profiles = sorted(c.profile for c in eng.handle.contexts if c.profile is not None)
    assert profiles == sorted(set(profiles)), "two contexts share a profile"
    assert set(profiles) <= {0, 1, 2}


def test_numpy_in_numpy_out_through_pinned_staging():
    _, s = _session(1)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    out = s.run({"x": x})
    assert isinstance(out["y"], np.ndarray) and isinstance(out["s"], np.ndarray)
    np.testing.assert_allclose(out["y"], x * 2 + 1, rtol=1e-6)
    assert s.memory_stats()["pinned_bytes"] == 3 * 64 * 4


def test_memory_stats_while_another_lane_thread_adds_a_pinned_buffer():
    """Before: memory_stats() summed a lane's pinned buffers over the live dict, so a submit staging its
    first NumPy input on another thread meanwhile failed it with "dictionary changed size during
    iteration". Here reading a buffer's size adds one, as that thread would between two reads."""
    _, s = _session(1)
    s.run({"x": np.zeros((3, 64), np.float32)})
    lane = s._lanes[0]

    class Growing(torch.Tensor):
        def numel(self) -> int:
            lane.pinned[f"other{len(lane.pinned)}"] = torch.zeros(1, dtype=torch.uint8)
            return super().numel()

    lane.pinned["x"] = lane.pinned["x"].as_subclass(Growing)
    assert s.memory_stats()["pinned_bytes"] == 3 * 64 * 4


def test_non_contiguous_input_is_made_contiguous_and_counted():
    _, s = _session(1)
    x = torch.randn(64, 5).t()
    assert not x.is_contiguous()
    out = s.run({"x": x})
    torch.testing.assert_close(out["y"], x * 2 + 1)
    assert s.memory_stats()["contiguous_copies"] == 1


def test_outputs_into_caller_tensors():
    _, s = _session(1)
    x = torch.randn(4, 64)
    y, ssum = torch.empty(4, 64), torch.empty(4)
    out = s.run({"x": x}, outputs={"y": y, "s": ssum})
    assert out["y"] is y and out["s"] is ssum
    torch.testing.assert_close(y, x * 2 + 1)


@pytest.mark.parametrize(
    ("outputs", "match"),
    [
        ({"y": torch.empty(5, 64)}, r"output tensor 'y' is float32\(5, 64\).*needs float32\(4, 64\)"),
        ({"y": torch.empty(4, 64, dtype=torch.float16)}, "output tensor 'y' is float16"),
        ({"y": torch.empty(64, 4).t()}, "'y' is not contiguous"),
        ({"q": torch.empty(4)}, r"unknown output name\(s\) \['q'\]"),
        # a list's tensors were printed whole as unknown names; a NumPy array's dtype read "2"; names of
        # two types were a TypeError from sorting them
        ([torch.empty(4, 64)], r"outputs must be a dict of output name -> torch\.Tensor \(or None\), got"),
        (
            {"y": np.empty((4, 64), np.float32)},
            r"output 'y' is a ndarray; .*pass a torch\.Tensor of float32\(4, 64\) on cpu",
        ),
        ({"q": torch.empty(4), 7: torch.empty(4)}, r"unknown output name\(s\) \[7, 'q'\]"),
    ],
)
def test_bad_caller_outputs_are_refused_before_enqueue(outputs, match):
    eng, s = _session(1)
    with pytest.raises(UserError, match=match):
        s.run({"x": torch.randn(4, 64)}, outputs=outputs)
    assert sum(c.enqueues for c in eng.handle.contexts) == 0
    s.run({"x": torch.randn(4, 64)})  # the lane is usable afterwards
    assert sum(c.enqueues for c in eng.handle.contexts) == 1


def _aliases() -> list:
    """(input x, caller outputs, the pair named): an output that is the input, a view of it, or another
    output's memory."""
    x = torch.randn(4, 64)
    buf = torch.empty(4 * 64 + 4)
    return [
        (x, {"y": x}, "output 'y' shares memory with input 'x'"),
        (x, {"s": x[1, :4]}, "output 's' shares memory with input 'x'"),
        (x, {"s": x.view(-1)[-4:]}, "output 's' shares memory with input 'x'"),
        (x, {"y": buf[:256].view(4, 64), "s": buf[252:256]}, "output 's' shares memory with output 'y'"),
    ]


@pytest.mark.parametrize(("x", "outputs", "match"), _aliases(), ids=["same", "view", "flat", "outputs"])
def test_outputs_sharing_memory_with_an_input_or_each_other_are_refused(x, outputs, match):
    """Before: an output tensor that was an input (or a view overlapping it, or another output) was bound
    as given, so the engine wrote over what it still read: wrong results with no error (TensorRT runs no
    engine in place). Now refused before anything is enqueued, naming both tensors; disjoint views of one
    buffer stay welcome."""
    eng, s = _session(1)
    with pytest.raises(UserError, match=match):
        s.run({"x": x}, outputs=outputs)
    with pytest.raises(UserError, match=match):
        s.submit({"x": x}, outputs=outputs)
    assert sum(c.enqueues for c in eng.handle.contexts) == 0
    buf = torch.empty(4 * 64 + 4)
    out = s.run({"x": x}, outputs={"y": buf[:256].view(4, 64), "s": buf[256:]})
    torch.testing.assert_close(out["s"], (x * 2 + 1).sum(-1))


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ({"x": torch.randn(40, 64)}, "dimension 0: 40 not in"),
        ({"x": torch.randn(4, 64).double()}, "dtype float64"),
        ({"x": torch.randn(4, 64, 1)}, "rank 3"),
        ({"w": torch.randn(4, 64)}, "missing input"),
        # a TypeError from sorting names of two types; "has dtype float32, the engine expects float32"
        ({1: torch.randn(4, 64), "y": torch.randn(4, 64)}, r"unknown input name\(s\) \[1, 'y'\]"),
        ({"x": np.ones((4, 64), ">f4")}, r"float32 in non-native byte order \('>f4'\)"),
    ],
)
def test_bad_inputs_enqueue_nothing(inputs, match):
    eng, s = _session(2)
    with pytest.raises(UserError, match=match):
        s.run(inputs)
    with pytest.raises(UserError, match=match):
        s.submit(inputs)
    assert sum(c.enqueues for c in eng.handle.contexts) == 0
    assert all(c.profile is None for c in eng.handle.contexts), "a lane was touched"


def test_arena_grows_only_for_larger_shapes_and_trims():
    _eng, s = _session(1, memory_fn=lambda b: b * 1000)
    for b in (4, 2, 4, 3):
        s.run({"x": torch.randn(b, 64)})
    lane = s.memory_stats()["lanes"][0]
    assert lane["arena_grow_count"] == 1 and lane["arena_peak_request"] == 4000
    s.run({"x": torch.randn(9, 64)})
    assert s.memory_stats()["lanes"][0]["arena_grow_count"] == 2
    s.trim()
    lane = s.memory_stats()["lanes"][0]
    assert lane["arena_bytes"] == 0 and lane["arena_trim_count"] == 1
    out = s.run({"x": (x := torch.randn(2, 64))})  # rebinds fresh memory after a trim
    torch.testing.assert_close(out["y"], x * 2 + 1)
    assert s.memory_stats()["lanes"][0]["arena_bytes"] >= 2000


def test_data_dependent_output_through_the_sink():
    eng, s = _session(1, manifest=standin_manifest(dds=True))
    assert eng.dynamic_outputs
    x = torch.randn(16, 64)
    out = s.run({"x": x})
    torch.testing.assert_close(out["pos"], torch.nonzero(x[:, 0] > 0).flatten())
    x[:, 0] = -1
    assert s.run({"x": x})["pos"].shape == (0,)


def test_aux_streams_and_torch_allocator_reach_the_context():
    eng = load_standin(standin_manifest(), device="cpu", num_aux_streams=2)
    s = eng.session(streams=1, torch_allocator=True)
    x = torch.randn(3, 64)
    torch.testing.assert_close(s.run({"x": x})["s"], (x * 2 + 1).sum(-1))
    ctx = eng.handle.contexts[0]
    assert len(ctx.aux) == 2 and ctx.allocator is not None
    assert s.memory_stats()["lanes"][0]["torch_allocator_live_bytes"] == 0
    assert eng.session(streams=1, aux_streams=0)._lanes[0].aux_streams == []


def test_static_engine_runs_many_lanes_on_profile_0():
    _eng, s = _session(4, manifest=standin_manifest(static_batch=4))
    futs = [s.submit({"x": torch.randn(4, 64)}) for _ in range(16)]
    concurrent.futures.wait(futs)
    assert all(f.exception() is None for f in futs)
    with pytest.raises(UserError, match=r"dimension 0 must be 4"):
        s.run({"x": torch.randn(3, 64)})


def test_submit_from_threads_is_correct():
    _, s = _session(2)

    def one(i):
        x = torch.full((1 + i % 8, 64), float(i))
        out = s.submit({"x": x}).result()
        return torch.equal(out["y"], x * 2 + 1)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(one, range(64)))


def test_closed_session_refuses_work():
    _, s = _session(1)
    with s:
        s.run({"x": torch.randn(1, 64)})
    with pytest.raises(RuntimeError, match="closed"):
        s.run({"x": torch.randn(1, 64)})


def test_tensorrt_engine_refuses_cpu_device(monkeypatch):
    eng = load_standin(standin_manifest(), device="cpu")
    eng.host_capable = False
    with pytest.raises(UserError, match="runs on a CUDA device"):
        eng.session(streams=1, device="cpu")


def test_submit_errors_from_the_gpu_side_reach_the_future():
    from trtforge.runtime._completion import Completer

    class Boom:
        def synchronize(self):
            raise RuntimeError("CUDA error: an illegal memory access")

    c = Completer("test")
    fut = c.put(Boom(), dict, None)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        fut.result(timeout=5)
    assert not fut.cancel(), "an enqueued request cannot be cancelled"
    c.close()


def test_importing_the_runtime_package_is_light():
    import subprocess
    import sys

    code = "import sys, trtforge.runtime; print('torch' in sys.modules, 'tensorrt_rtx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_memory_needed_per_shape_without_running():
    eng, s = _session(1, memory_fn=lambda b: b * 1000 + 1)
    assert s.memory_needed({"x": torch.empty(7, 64)}) == 7001
    assert s.memory_needed({"x": np.empty((32, 64), np.float32)}) == 32001
    assert eng.device_memory_for_profile(0) == 32001
    assert sum(c.enqueues for c in eng.handle.contexts) == 0
    with pytest.raises(UserError, match="dimension 0: 33 not in"):
        s.memory_needed({"x": torch.empty(33, 64)})


def test_graph_warmup_must_be_positive():
    eng = load_standin(standin_manifest(), device="cpu")
    with pytest.raises(UserError, match="graph_warmup=0"):
        eng.session(streams=1, cuda_graphs=True, graph_warmup=0)


SESSION_API = {
    # each was a TypeError (or AttributeError) from Python or deep inside, naming no alternative
    "session(stream=2)": (
        lambda eng, s: eng.session(stream=2),
        r"Engine\.session\(\) has no option 'stream' \(did you mean 'streams'\?\)",
    ),
    "session(streams='2')": (lambda eng, s: eng.session(streams="2"), r"streams must be an integer >= 1"),
    "run(None)": (lambda eng, s: s.run(None), r"inputs must be a dict of input name -> tensor, got NoneType"),
    "run([x])": (
        lambda eng, s: s.run([torch.zeros(2, 64)]),
        r"inputs must be a dict .*got list.*inputs are 'x'",
    ),
    "submit(output=)": (
        lambda eng, s: s.submit({"x": torch.zeros(2, 64)}, output={}),
        r"Session\.submit\(\) has no option 'output' \(did you mean 'outputs'\?\)",
    ),
    "memory_needed(5)": (lambda eng, s: s.memory_needed(5), r"inputs must be a dict .*got int"),
    "trim('1')": (lambda eng, s: s.trim("1"), r"trim\(keep='1'\): keep is a number of bytes"),
    # each was read as true (bool("no")), taken as none or truncated, or int()'s / a comparison's error
    "session(cuda_graphs='no')": (
        lambda eng, s: eng.session(cuda_graphs="no"),
        r"session\(cuda_graphs='no'\): cuda_graphs must be True or False",
    ),
    "session(torch_allocator='no')": (
        lambda eng, s: eng.session(torch_allocator="no"),
        r"session\(torch_allocator='no'\): torch_allocator must be True or False",
    ),
    "session(aux_streams=-1)": (
        lambda eng, s: eng.session(aux_streams=-1),
        r"session\(aux_streams=-1\): auxiliary streams per lane, an integer >= 0",
    ),
    "session(aux_streams='two')": (
        lambda eng, s: eng.session(aux_streams="two"),
        r"session\(aux_streams='two'\): auxiliary streams per lane, an integer >= 0",
    ),
    "session(graph_warmup='1')": (
        lambda eng, s: eng.session(graph_warmup="1"),
        r"session\(graph_warmup='1'\): an integer >= 1",
    ),
    # each was torch's RuntimeError/TypeError naming no argument, or (cuda:7) a CUDA error at the first stream
    "session(device='gpu')": (
        lambda eng, s: eng.session(device="gpu"),
        r"device 'gpu': Expected one of cpu, cuda.*; expected 'cuda', 'cuda:N' or a GPU index N",
    ),
    "session(device='mps')": (
        lambda eng, s: eng.session(device="mps"),
        r"device 'mps': an engine runs on a CUDA device",
    ),
    "session(device=-1)": (lambda eng, s: eng.session(device=-1), r"device -1: a GPU index is >= 0"),
    "session(device=[1])": (
        lambda eng, s: eng.session(device=[1]),
        r"device must be a string, torch\.device or GPU index, got list \[1\]",
    ),
}


def test_session_on_a_gpu_this_machine_does_not_have(monkeypatch):
    """device='cuda:7' on a one-GPU machine was a CUDA error at the first stream ("invalid device
    ordinal"), naming no argument."""
    eng, _ = _session(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(
        UserError, match=r"device 'cuda:7': this machine has 1 usable CUDA device\(s\); pass a GPU"
    ):
        eng.session(device="cuda:7")
    with pytest.raises(UserError, match=r"device 'cuda:1': this machine has 1 usable CUDA device\(s\)"):
        eng.session(device=1)


@pytest.mark.parametrize("case", list(SESSION_API))
def test_session_api_misuse_is_a_user_error_naming_the_argument(case):
    eng, s = _session(1)
    fn, message = SESSION_API[case]
    with pytest.raises(UserError, match=message):
        fn(eng, s)
    torch.testing.assert_close(s.run({"x": torch.ones(2, 64)})["y"], torch.full((2, 64), 3.0))


def test_session_takes_a_numpy_integer_stream_count():
    """streams=np.int64(2) (a count read from an array or a config) was refused as "session(streams=2):
    streams must be an integer >= 1"."""
    eng = load_standin(standin_manifest(streams=2), device="cpu")
    s = eng.session(streams=np.int64(2), aux_streams=np.int32(0), graph_warmup=np.int64(1))
    assert s.streams == 2 and type(s.streams) is int
    torch.testing.assert_close(s.run({"x": torch.ones(2, 64)})["y"], torch.full((2, 64), 3.0))


def test_a_session_dropped_unclosed_finishes_its_work_and_frees_its_lanes():
    """A session that is garbage with futures pending resolves them, then frees its arenas and stops its
    waiter threads; its arenas (raw caching-allocator blocks on a GPU) and threads lived on before, so a
    session opened per request leaked both."""
    eng = load_standin(standin_manifest(streams=2), device="cpu")
    s = eng.session(streams=2)
    xs = [torch.randn(3, 64) for _ in range(6)]
    futures = [s.submit({"x": x}) for x in xs]
    lanes, threads = s._lanes, [c._thread for c in s._completers]
    assert all(t is not None for t in threads)
    del s
    gc.collect()
    for future, x in zip(futures, xs):
        torch.testing.assert_close(future.result(timeout=5)["y"], x * 2 + 1)
    for t in threads:
        t.join(timeout=5)
    assert [t.is_alive() for t in threads] == [False, False]
    assert [lane.arena.capacity for lane in lanes] == [0, 0]


def test_close_waits_for_a_call_in_flight_on_another_thread():
    """close() freed each lane's memory at once, under an enqueue another thread had in progress (on a GPU:
    device memory handed back to the allocator while the engine used it). It now waits for that call."""
    eng = load_standin(standin_manifest(), device="cpu", work="none")
    s = eng.session(streams=1)
    s.run({"x": torch.randn(2, 64)})
    ctx = eng.handle.contexts[0]
    entered, release, plain = threading.Event(), threading.Event(), ctx.execute_async

    def slow(stream):
        entered.set()
        release.wait(5)
        return plain(stream)

    ctx.execute_async = slow
    results = []
    runner = threading.Thread(target=lambda: results.append(s.run({"x": torch.randn(2, 64)})))
    runner.start()
    assert entered.wait(5)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.3)
    try:
        assert closer.is_alive(), "close() returned while a call was enqueuing"
        assert s._lanes[0].arena.capacity > 0
    finally:
        release.set()
        runner.join(5)
        closer.join(5)
    assert not closer.is_alive() and len(results) == 1
    assert s._lanes[0].arena.capacity == 0
    with pytest.raises(RuntimeError, match="session is closed"):
        s.run({"x": torch.randn(2, 64)})


def test_a_closed_session_is_the_callers_error_and_says_how_to_get_a_new_one():
    """Before: a plain RuntimeError("session is closed"), exit 1 with a trace as a trtforge bug from a
    command, and no word on what to do. Now a SessionClosedError: a UserError (exit 2) that is still a
    RuntimeError (``except RuntimeError`` keeps working) and names engine.session(...)."""
    from trtforge.runtime import SessionClosedError

    eng, s = _session(1)
    with s:
        s.run({"x": torch.ones(2, 64)})
    calls = {
        "run": lambda: s.run({"x": torch.ones(2, 64)}),
        "submit": lambda: s.submit({"x": torch.ones(2, 64)}),
        "memory_needed": lambda: s.memory_needed({"x": torch.ones(2, 64)}),
        "trim": lambda: s.trim(),
    }
    for name, call in calls.items():
        with pytest.raises(SessionClosedError) as raised:
            call()
        assert isinstance(raised.value, UserError) and isinstance(raised.value, RuntimeError), name
        text = str(raised.value)
        assert text.startswith(f"{eng.label}: the session is closed") and "engine.session(" in text, text


def test_close_from_a_future_callback():
    """close() inside a done-callback (it runs on the lane's waiter thread) raised "cannot join current
    thread", which concurrent.futures swallows: the lanes were never freed."""
    _, s = _session(1)
    finished = threading.Event()

    def close_then_note(_future):
        try:
            s.close()
        finally:
            finished.set()

    future = s.submit({"x": torch.ones(2, 64)})
    future.add_done_callback(close_then_note)
    assert finished.wait(5)
    torch.testing.assert_close(future.result()["y"], torch.full((2, 64), 3.0))
    assert s._lanes[0].arena.capacity == 0
    with pytest.raises(RuntimeError, match="session is closed"):
        s.submit({"x": torch.ones(2, 64)})


def test_trim_from_several_threads_at_once():
    """Two trim() calls each took some lanes and waited for the other's forever (a thread switch between
    taking one lane and the next, made certain here by a pause after each lane is taken)."""
    _, s = _session(2)
    s.run({"x": torch.randn(2, 64)})
    plain = s._acquire

    def slow_acquire():
        lane = plain()
        time.sleep(0.05)
        return lane

    s._acquire = slow_acquire

    def trims():
        for _ in range(3):
            s.trim()

    threads = [threading.Thread(target=trims, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "trim() deadlocked"
    torch.testing.assert_close(s.run({"x": torch.ones(2, 64)})["y"], torch.full((2, 64), 3.0))


def test_device_memory_for_profile_takes_a_base_profile_index():
    """An index past the base profiles was passed to the engine unchecked (here: copy 1's profile, read as
    if it were a base profile; TensorRT is not asked about an index it may not have)."""
    eng = load_standin(standin_manifest(streams=2), device="cpu")
    assert eng.device_memory_for_profile(0) == 32 * 64 * 4
    for bad in (1, -1, "0", True):
        with pytest.raises(UserError, match=r"base_index is a base profile, an integer 0\.\.0"):
            eng.device_memory_for_profile(bad)


def test_an_interrupted_trim_gives_back_the_lanes_it_took():
    """A Ctrl-C while trim() waited for a busy lane lost the lanes it had taken already: later calls
    waited for them forever."""
    import signal

    eng = load_standin(standin_manifest(streams=2), device="cpu", work="none")
    s = eng.session(streams=2)
    s.run({"x": torch.randn(2, 64)})
    entered, release = threading.Event(), threading.Event()
    for ctx in eng.handle.contexts:
        plain = ctx.execute_async

        def slow(stream, plain=plain):
            entered.set()
            release.wait(5)
            return plain(stream)

        ctx.execute_async = slow
    runner = threading.Thread(target=lambda: s.run({"x": torch.randn(2, 64)}))
    runner.start()
    assert entered.wait(5)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            s.trim()  # takes the free lane, then waits for the busy one
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        release.set()
        runner.join(5)
    given_back = s._free.qsize()
    if given_back != 2:
        s._finalizer.detach()  # (closing would wait for the lost lane forever)
    assert given_back == 2, "a lane taken by the interrupted trim() was never given back"
    s.close()
