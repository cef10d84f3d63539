"""Benchmark: full garbage collections inside a serving run, with the engine's heap freeze on and off (CPU).

    PYTHONPATH=. python3 benchmarks/bench_gc_pauses.py                       # 3 rounds, each mode alternated
    PYTHONPATH=. python3 benchmarks/bench_gc_pauses.py --requests 2000 --max-tokens 256 --out gc_pauses.json

Why: the 8B runs on the H200 show steps that take 0.3-0.5 s longer than their neighbours in the middle of
decode-only stretches (session 35), once or twice a run. A full (oldest-generation) collection walks every
tracked object of the process while holding the GIL, so the engine thread launches nothing until it ends.
``LLMEngine(freeze_gc=True)`` (the default; :mod:`trtforge.llm.gc_heap`) freezes the heap alive at the
engine's start, so that collections skip it.

Each run is a fresh process that imports torch and transformers (a serving process's heap starts there),
adds ``--heap`` more long-lived objects (a loaded model's process holds more: Triton's launchers, captured
graphs' Python objects, a server's modules), and serves ``--requests`` prompts of ``--prompt-len`` ids for
``--max-tokens`` tokens each through an :class:`LLMEngine` over a model-free executor
(:class:`benchmarks.bench_submit_contention.LaunchingExecutor`): the engine's own allocation pattern, no
device. It reports the full collections inside the run, their pauses, and the run's wall time. Pause
lengths are this CPU's; what the freeze changes is how many objects each collection walks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trtforge._fileio import atomic_write_text


def child(args: argparse.Namespace) -> dict:
    """One run in this process: build the heap, serve, report the collections inside the run."""
    import gc

    import numpy as np
    import torch  # noqa: F401  (the heap a serving process starts from)
    import transformers  # noqa: F401

    from benchmarks._gcwatch import GcWatch
    from benchmarks.bench_submit_contention import LaunchingExecutor
    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.sched.scheduler import SchedulerConfig

    heap = [[object(), [], {}] for _ in range(args.heap // 3)]  # long-lived tracked objects
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 128256, args.prompt_len).tolist() for _ in range(args.requests)]
    executor = LaunchingExecutor(args.launches, args.prompt_len + args.max_tokens + 16)
    config = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=8192)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    objects = len(gc.get_objects())
    with LLMEngine(executor, config, freeze_gc=args.mode == "on") as engine, GcWatch() as watch:
        t = time.perf_counter()
        outs = engine.generate(prompts, params)
        wall = time.perf_counter() - t
    assert all(len(o.token_ids) == args.max_tokens for o in outs)
    s = watch.summary(until_s=wall)
    del heap
    return {
        "mode": args.mode,
        "tracked_objects_at_start": objects,
        "frozen_objects": s["frozen_objects"],
        "wall_s": wall,
        "full_collections": len(s["full"]),
        "full_seconds": sum(e["seconds"] for e in s["full"]),
        "max_pause_s": s["max_pause_s"],
        "collections": s["collections"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="each mode runs once a round, alternated")
    ap.add_argument("--heap", type=int, default=0, help="long-lived objects added to the heap")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--launches", type=int, default=20, help="stand-in kernel launches a step")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=("on", "off"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        args.mode = args.child
        print(json.dumps(child(args)))
        return
    runs: list[dict] = []
    workload = [
        f"--{name.replace('_', '-')}={getattr(args, name)}"
        for name in ("heap", "requests", "prompt_len", "max_tokens", "max_num_seqs", "launches")
    ]
    for r in range(args.rounds):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            cmd = [sys.executable, __file__, *workload, "--child", mode]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs.append(res)
            print(
                f"round {r + 1} freeze {mode:3s}: {res['full_collections']} full collection(s), "
                f"{res['full_seconds'] * 1e3:6.0f} ms (longest pause {res['max_pause_s'] * 1e3:5.0f} ms) in "
                f"{res['wall_s']:.2f} s; {res['tracked_objects_at_start']:,} objects, "
                f"{res['frozen_objects']:,} frozen",
                flush=True,
            )
    summary = {}
    for mode in ("off", "on"):
        mine = [r for r in runs if r["mode"] == mode]
        summary[mode] = {
            "full_collections_median": statistics.median(r["full_collections"] for r in mine),
            "full_seconds_median": statistics.median(r["full_seconds"] for r in mine),
            "max_pause_s_median": statistics.median(r["max_pause_s"] for r in mine),
            "wall_s_median": statistics.median(r["wall_s"] for r in mine),
        }
        m = summary[mode]
        print(
            f"freeze {mode:3s} medians: {m['full_collections_median']:g} full collection(s), "
            f"{m['full_seconds_median'] * 1e3:.0f} ms, longest pause {m['max_pause_s_median'] * 1e3:.0f} ms, "
            f"wall {m['wall_s_median']:.2f} s"
        )
    if args.out is not None:
        result = {"argv": sys.argv[1:], "python": sys.version.split()[0], "runs": runs, "summary": summary}
        atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
