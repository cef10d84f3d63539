"""Profile of the serving loop: where a decode step's time goes (host phases, GPU kernels, graph replay).

    PYTHONPATH=. python3 benchmarks/profile_serving.py --kernels torch triton --out profile.json

For each executor kernel set, on the 1.1B Llama-style model of bench_serving.py: (1) one request
alone, stepping the :class:`StepLoop` directly, with host timers around its phases (schedule,
batch build, executor launch, waiting for the GPU, sampling, the rest); (2) the same through
:class:`LLMEngine` (its thread and queues); (3) the GPU time of one decode-graph replay (CUDA
events) and, from torch.profiler, the kernels one decode step launches; (4) the phases of
decode-only steps with 256 running sequences.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np
import torch

import trtforge.llm.loop as loop_module
from benchmarks.bench_decode_layer import replay_ms
from benchmarks.bench_serving import build_model
from trtforge.llm.engine import LLMEngine, make_step_loop
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.loop import StepLoop
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.plan import StepPlan
from trtforge.llm.sched.scheduler import SchedulerConfig


class PhaseTimer:
    """Wraps a step loop's phases with host timers (planning, the batch build, the executor launch);
    `sample` (the synchronous loop's) first waits for the GPU (counted apart)."""

    def __init__(self, sched: StepLoop) -> None:
        self.totals: dict[str, list[float]] = defaultdict(list)
        self._cur: dict[str, float] = defaultdict(float)
        sched.scheduler._plan = self._wrap(sched.scheduler._plan, "_schedule")
        self._orig_make_batch = StepPlan.make_batch
        StepPlan.make_batch = self._wrap(StepPlan.make_batch, "_build_batch")
        sched.executor.step = self._wrap(sched.executor.step, "executor_launch")
        self._orig_sample = loop_module.sample

        def sample(*args, **kwargs):
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            out = self._orig_sample(*args, **kwargs)
            self._cur["gpu_wait"] += t1 - t0
            self._cur["sample"] += time.perf_counter() - t1
            return out

        loop_module.sample = sample

    def _wrap(self, fn, name):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self._cur[name] += time.perf_counter() - t0
            return out

        return timed

    def step(self, sched: StepLoop, record: bool) -> list:
        self._cur.clear()
        t0 = time.perf_counter()
        outs = sched.step()
        total = time.perf_counter() - t0
        if record:
            rest = total - sum(self._cur.values())
            for k, v in self._cur.items():
                self.totals[k].append(v)
            self.totals["rest"].append(rest)
            self.totals["total"].append(total)
        return outs

    def restore(self, sched: StepLoop) -> None:
        loop_module.sample = self._orig_sample
        StepPlan.make_batch = self._orig_make_batch
        del sched.scheduler._plan  # the instance attributes shadowing the classes' methods
        del sched.executor.step

    def summary(self) -> dict:
        return {k: float(np.median(v)) * 1e3 for k, v in self.totals.items()}


def graph_replay_ms(ex: TorchExecutor, nb: int, wb: int, reps: int = 50) -> float | None:
    """Device time of the (nb, wb) decode graph alone, ms a replay; None if it was not captured."""
    graph = ex._graphs.get((nb, wb, 1, ex._gemv_rows()))  # a decode step's graph (query length 1)
    return None if graph is None else replay_ms(graph, reps)


def kernels_per_step(sched: StepLoop, steps: int = 5) -> dict:
    try:
        return _kernels_per_step(sched, steps)
    except Exception as e:  # the profiler is a diagnostic: record why it failed and go on
        return {"error": repr(e)}


def _kernels_per_step(sched: StepLoop, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            sched.step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    count = sum(e.count for e in events)
    total_us = sum(e.self_device_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:10]
    return {
        "kernels_per_step": count / steps,
        "kernel_time_ms_per_step": total_us / steps / 1e3,
        "top": [(e.key[:90], e.count // steps, round(e.self_device_time_total / steps, 1)) for e in top],
    }


def profile_kernels(
    model, kernels: str, prompt: list[int], decode_steps: int, torch_profiler: bool, out: dict
) -> dict:
    res = out
    res["kernels"] = kernels
    # room for 256 sequences of up to 1024 + 60 tokens: section (4) must hold all of them at once
    ex = TorchExecutor(model, num_blocks=18000, block_size=16, kernels=kernels, max_decode_batch=256)
    res["fused"] = ex.fused_refusal is None
    t = time.perf_counter()
    ex.capture_decode_graphs(max_batch=1)
    res["capture_b1_s"] = time.perf_counter() - t
    # (1) one request, scheduler stepped directly
    sched = make_step_loop(ex, SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=4096))
    timer = PhaseTimer(sched)
    sched.add_request("warm", prompt[:64], SamplingParams(max_tokens=8, ignore_eos=True))
    while sched.has_unfinished():
        timer.step(sched, record=False)
    sched.add_request("one", prompt, SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True))
    timer.step(sched, record=False)  # the prefill
    t0 = time.perf_counter()
    while sched.has_unfinished():
        timer.step(sched, record=True)
    res["single_ms_per_token_scheduler"] = (time.perf_counter() - t0) / decode_steps * 1e3
    res["single_phases_ms"] = timer.summary()
    wb = ex._width_buckets[0]
    for w in ex._width_buckets:
        if w * 16 >= len(prompt) + decode_steps:
            wb = w
            break
    res["graph_replay_ms_b1"] = graph_replay_ms(ex, 1, wb)
    timer.restore(sched)
    sched.add_request("prof", prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    sched.step()
    if torch_profiler:
        res["profile_b1"] = kernels_per_step(sched, 5)
    run_to_end(sched)
    # (2) the same through LLMEngine.stream
    with LLMEngine(ex) as engine:
        engine.generate([prompt[:64]], SamplingParams(max_tokens=8, ignore_eos=True))
        stamps = []
        for _ in engine.stream(prompt, SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True)):
            stamps.append(time.perf_counter())
    res["single_ms_per_token_engine"] = float(np.median(np.diff(stamps[1:]))) * 1e3
    # (4) 256 running sequences, decode-only steps
    config = SchedulerConfig(
        max_num_seqs=256, max_num_batched_tokens=8192, max_prefill_tokens_with_decodes=8192
    )
    sched = make_step_loop(ex, config)
    rng = np.random.default_rng(0)
    for i in range(256):
        p = rng.integers(3, 32000, size=int(rng.integers(128, 1024))).tolist()
        sched.add_request(i, p, SamplingParams(max_tokens=60, ignore_eos=True))
    timer = PhaseTimer(sched)
    running = sched.scheduler._running
    while sched.scheduler.num_waiting or any(len(s.tokens) - s.num_computed > 1 for s in running):
        timer.step(sched, record=False)  # prefills (and capture of the buckets used)
    for _ in range(3):
        timer.step(sched, record=False)
    timer.totals.clear()
    n0 = sched.stats.generated_tokens
    t0 = time.perf_counter()
    for _ in range(20):
        timer.step(sched, record=True)
    dt = time.perf_counter() - t0
    res["b256_tok_per_s_decode"] = (sched.stats.generated_tokens - n0) / dt
    res["b256_phases_ms"] = timer.summary()
    longest = max(len(s.tokens) for s in running)
    wb = next(w for w in ex._width_buckets if w * 16 >= longest)
    res["b256_running"] = sched.scheduler.num_running
    res["graph_replay_ms_b256"] = graph_replay_ms(ex, 256, wb)
    timer.restore(sched)
    if torch_profiler:
        res["profile_b256"] = kernels_per_step(sched, 3)
    run_to_end(sched)
    del ex
    torch.cuda.empty_cache()
    return res


def run_to_end(sched: StepLoop) -> None:
    while sched.has_unfinished():
        sched.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="+", default=["torch", "triton"])
    ap.add_argument("--decode-steps", type=int, default=128)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--torch-profiler", action="store_true", help="also count kernels (crashed once on the H200)"
    )
    args = ap.parse_args()
    model = build_model(False, "cuda", torch.float16)
    prompt = np.random.default_rng(1).integers(3, 32000, size=285).tolist()
    results = []
    for kernels in args.kernels:
        res: dict = {}
        results.append(res)
        try:
            profile_kernels(model, kernels, prompt, args.decode_steps, args.torch_profiler, res)
        finally:  # what was measured survives a failure in a later section
            print(json.dumps(res, indent=1), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
