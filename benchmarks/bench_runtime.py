"""Runtime machinery on a GPU with the CUDA stand-in engine: multi-stream throughput, run() host overhead,
arena growth. No TensorRT engine can run on our machines (architecture.md), so the engine is the stand-in
from trtforge.runtime.standin: y = x * 2 + 1 and a row sum on a small batch, through the bound addresses
and the lane's device memory, plus (throughput only) one single-thread kernel of a fixed duration
(`torch.cuda._sleep`) standing for an engine whose kernels occupy few SMs at small batch.

Usage (H200 via the device tool):  PYTHONPATH=. python3 benchmarks/bench_runtime.py --out $OUT
Writes runtime_bench.json and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import random
import statistics
import threading
import time
from pathlib import Path

import torch

from trtforge.runtime.standin import load_standin, standin_manifest

D = 64


def cycles_per_us() -> float:
    """Calibrate torch.cuda._sleep: GPU clock cycles per microsecond, measured with CUDA events."""
    torch.cuda._sleep(1_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / (start.elapsed_time(end) * 1000.0)


def throughput_submit(streams: int, spin: int, n: int, batch: int) -> float:
    """Requests/s with submit() from one thread, up to 4 requests in flight per lane."""
    eng = load_standin(standin_manifest(batch=(1, 8, 32), streams=4), spin_cycles=spin)
    s = eng.session(streams=streams)
    xs = [torch.randn(batch, D, device="cuda") for _ in range(16)]
    window = 4 * streams

    def drive(count: int) -> None:
        pending: collections.deque = collections.deque()
        for i in range(count):
            pending.append(s.submit({"x": xs[i % len(xs)]}))
            if len(pending) >= window:
                pending.popleft().result()
        for f in pending:
            f.result()

    drive(200)
    t0 = time.perf_counter()
    drive(n)
    dt = time.perf_counter() - t0
    s.close()
    return n / dt


def throughput_run_threads(streams: int, spin: int, n: int, batch: int) -> float:
    """Requests/s with run() from `streams` threads, each on its own CUDA stream (run() is asynchronous)."""
    eng = load_standin(standin_manifest(batch=(1, 8, 32), streams=4), spin_cycles=spin)
    s = eng.session(streams=streams)
    per_thread = n // streams

    def client(count: int) -> None:
        stream = torch.cuda.Stream()
        x = torch.randn(batch, D, device="cuda")
        with torch.cuda.stream(stream):
            for i in range(count):
                s.run({"x": x})
                if i % 8 == 7:
                    stream.synchronize()  # bound the queue like a server answering requests
            stream.synchronize()

    def drive(count: int) -> None:
        threads = [threading.Thread(target=client, args=(count,)) for _ in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    drive(50)
    t0 = time.perf_counter()
    drive(per_thread)
    dt = time.perf_counter() - t0
    s.close()
    return per_thread * streams / dt


def host_overhead(n: int) -> dict:
    """Per-call wall time of run() (and peers) with a stand-in that enqueues no GPU work."""
    eng = load_standin(standin_manifest(), work="none")
    s = eng.session(streams=1)
    x = torch.randn(4, D, device="cuda")
    xn = x.cpu().numpy()
    results = {}
    for name, call in (
        ("run(torch cuda)", lambda: s.run({"x": x})),
        ("submit().result()", lambda: s.submit({"x": x}).result()),
        ("run(numpy)", lambda: s.run({"x": xn})),
        ("peer: torch.empty x2 + event record/wait x2", None),
    ):
        if call is None:
            ev, other = torch.cuda.Event(), torch.cuda.Stream()

            def call(ev: torch.cuda.Event = ev, other: torch.cuda.Stream = other) -> None:
                torch.empty(4, D, device="cuda")
                torch.empty(4, device="cuda")
                ev.record()
                other.wait_event(ev)
                ev.record(other)
                torch.cuda.current_stream().wait_event(ev)

        count = n if name.startswith("run(torch") else n // 4
        for _ in range(500):
            call()
        samples = []
        for _ in range(count):
            t0 = time.perf_counter_ns()
            call()
            samples.append((time.perf_counter_ns() - t0) / 1000.0)
        torch.cuda.synchronize()
        samples.sort()
        results[name] = {
            "calls": count,
            "median_us": statistics.median(samples),
            "p10_us": samples[len(samples) // 10],
            "p90_us": samples[len(samples) * 9 // 10],
            "mean_us": statistics.fmean(samples),
        }
    s.close()
    return results


def arena_growth(rounds: int, per_round: int, streams: int = 4) -> dict:
    """Arena grow count after each round of `per_round` run() calls with random in-profile shapes."""
    memory = lambda b: b * D * 4 + 4096 * b  # noqa: E731 - per-shape device-memory requirement
    eng = load_standin(standin_manifest(batch=(1, 8, 32), streams=streams), memory_fn=memory)
    s = eng.session(streams=streams)
    timeline = []

    def client(seed: int, count: int) -> None:
        rng = random.Random(seed)
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(count):
                s.run({"x": torch.randn(rng.randint(1, 32), D, device="cuda")})
            torch.cuda.current_stream().synchronize()

    for r in range(rounds):
        threads = [
            threading.Thread(target=client, args=(r * 100 + i, per_round // streams)) for i in range(streams)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        st = s.memory_stats()
        timeline.append(
            {
                "calls": (r + 1) * per_round,
                "grow_count": st["arena_grow_count"],
                "arena_bytes": st["arena_bytes"],
            }
        )
    stats = s.memory_stats()
    s.close()
    return {
        "timeline": timeline,
        "per_lane_bytes": [lane["arena_bytes"] for lane in stats["lanes"]],
        "need_at_profile_max": memory(32),
    }


def profile_submit(streams: int, spin: int, n: int) -> str:
    """cProfile of n submits (host-side cost breakdown), top functions by own time."""
    import cProfile
    import io
    import pstats

    eng = load_standin(standin_manifest(batch=(1, 8, 32), streams=4), spin_cycles=spin)
    s = eng.session(streams=streams)
    x = torch.randn(4, D, device="cuda")
    for _ in range(200):
        s.submit({"x": x}).result()
    ctx, lane = eng.handle.contexts[0], s._lanes[0]
    t0 = time.perf_counter_ns()
    for _ in range(1000):
        ctx.execute_async(lane.stream.cuda_stream)
    enqueue_us = (time.perf_counter_ns() - t0) / 1000 / 1000
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    pending: collections.deque = collections.deque()
    for _ in range(n):
        pending.append(s.submit({"x": x}))
        if len(pending) >= 4 * streams:
            pending.popleft().result()
    for f in pending:
        f.result()
    prof.disable()
    s.close()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    return f"stand-in execute_async alone: {enqueue_us:.1f} us/call\n" + buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--overhead-calls", type=int, default=20000)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of submit() and exit")
    args = ap.parse_args()
    torch.cuda.init()
    cpus = cycles_per_us()
    if args.profile:
        print(profile_submit(4, int(25 * cpus), 2000))
        return
    report: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cycles_per_us": cpus,
        "throughput": [],
    }
    for gpu_us in (1000, 200, 25):
        spin = int(gpu_us * cpus)
        for mode, fn in (("submit", throughput_submit), ("run-threads", throughput_run_threads)):
            row = {"mode": mode, "batch": 4, "spin_us": gpu_us}
            for streams in (1, 4):
                row[f"streams{streams}_rps"] = fn(streams, spin, args.requests, 4)
            row["speedup"] = row["streams4_rps"] / row["streams1_rps"]
            report["throughput"].append(row)
            print(json.dumps(row), flush=True)
    report["host_overhead"] = host_overhead(args.overhead_calls)
    print(json.dumps(report["host_overhead"], indent=1), flush=True)
    report["arena"] = arena_growth(rounds=10, per_round=1000)
    print(json.dumps(report["arena"], indent=1), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runtime_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n| mode | GPU µs/request | 1 stream req/s | 4 streams req/s | speedup |\n|---|---|---|---|---|")
    for r in report["throughput"]:
        print(
            f"| {r['mode']} | {r['spin_us']} | {r['streams1_rps']:.0f} | {r['streams4_rps']:.0f} | "
            f"{r['speedup']:.2f}x |"
        )


if __name__ == "__main__":
    main()
