"""Probe: why capturing every CUDA graph on one stream slowed 1.1B serving steps (H200, session 36).

    PYTHONPATH=. python3 benchmarks/probe_capture_stream.py --out build/capture_stream.json
    PYTHONPATH=. python3 benchmarks/probe_capture_stream.py --tiny      # checks the script on the CPU

Why: with ``torch_exec.ONE_CAPTURE_STREAM`` (session 34: every graph of an executor warms up and is
captured on one side stream, so that the piecewise buckets reuse each other's temporaries) the 1.1B
all-at-once run of bench_serving.py read 0.75-0.91x the tok/s of a fresh stream per capture, its
prompt-carrying steps 11.2-14.7 ms launch to launch against 8.1-13.1 (session 36). Both modes replay the
same kernels on the same stream; what differs is where the graphs' memory lies (one stream: the buckets
share blocks) and which cuBLAS workspace their GEMMs captured (one per stream). This tells which one
matters: GEMMs alone slower points at the workspace, every kernel at memory placement, idle gaps at the host.
A third mode, ``PIECEWISE_ONE_STREAM``, shares one stream among the piecewise buckets alone (the decode
graphs as served): if it runs at fresh streams' speed it keeps most of one stream's memory saving.

Each mode runs in its own process (the streams and the allocator's state are per process), alternated for
``--rounds`` rounds. A process builds bench_serving.py's 1.1B model (FP16) and executor (a 16 GB pool, 256
sequences, piecewise graphs up to 4,096 tokens), captures every decode and piecewise graph as
bench_serving.py does, and then for each step layout times ``--repeats`` served steps (host launch time
and GPU time between CUDA events; medians), then profiles ``--profile-steps`` more: each kernel's device
time per step, summed by name, and the median step's span, busy time and idle gaps. The parent prints each
layout's GPU time by mode, the kernels whose time differs most between one stream and fresh streams, and
the memory each mode's capture added to the allocator's reservation. ``--interleave`` (session 50) also
times the layouts taking turns step by step, as a served run's buckets do (where the shared stream's cost
showed: host launch time), and profiles the host's CUDA runtime and driver calls a step in that order,
printing those whose time differs most between the modes (``cudaGraphLaunch`` growing would name the
replay itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import torch

from benchmarks.bench_mixed_step import make_batch
from benchmarks.bench_serving import build_model
from benchmarks.profile_mixed_step import kernel_ms, profile_served_gaps

# (ONE_CAPTURE_STREAM, PIECEWISE_ONE_STREAM) per mode: fresh streams (served), one stream for every graph
# (session 34), one stream for the piecewise buckets alone
MODES = {"fresh": (False, False), "one": (True, False), "piecewise": (False, True)}
# (decode rows, their context, prompt chunks): 1.1B all-at-once steps held ~1,234 tokens with prompt
# chunks, or only decode rows (256 sequences, prompts 128-1,024, outputs 64-512)
LAYOUTS = [(100, 600, (1024,)), (0, 0, (1280,)), (30, 400, (1024, 200)), (200, 600, ()), (256, 300, ())]
BLOCK = 16


def step_times(ex, batch, repeats: int, cuda: bool) -> dict:
    """Medians over `repeats` served steps: host launch ms, launch-to-done ms and GPU ms (CUDA events)."""
    host, total, gpu = [], [], []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        ex.step(batch)
        t1 = time.perf_counter()
        if cuda:
            end.record()
            torch.cuda.synchronize()
            gpu.append(start.elapsed_time(end))
        total.append((time.perf_counter() - t0) * 1e3)
        host.append((t1 - t0) * 1e3)
    row = {"host_ms": statistics.median(host), "total_ms": statistics.median(total)}
    if gpu:
        row["gpu_ms"] = statistics.median(gpu)
    return row


def interleaved_times(ex, layouts: list, vocab: int, repeats: int, cuda: bool) -> list[dict]:
    """Each layout's median step times when the layouts take turns step by step (as a served run's
    buckets do), not run back to back: `repeats` turns each, after three warm-up turns."""
    batches = [make_batch(d, c, ch, BLOCK, vocab) for d, c, ch in layouts]
    for _ in range(3):
        for batch in batches:
            ex.step(batch)
    per = [[] for _ in batches]
    for _ in range(repeats):
        for i, batch in enumerate(batches):
            per[i].append(step_times(ex, batch, 1, cuda))
    api = runtime_calls_ms(ex, batches, max(1, repeats // 2), cuda)
    rows = []
    for (d, c, ch), times, calls in zip(layouts, per, api):
        row = {"decode_rows": d, "context": c, "chunks": list(ch), "runtime_ms": calls}
        for key in times[0]:
            row[key] = statistics.median(t[key] for t in times)
        rows.append(row)
    return rows


def runtime_calls_ms(ex, batches: list, turns: int, cuda: bool) -> list[dict[str, float]]:
    """Each batch's host time a step in CUDA runtime / driver calls (``cudaGraphLaunch``,
    ``cudaLaunchKernel``, copies, syncs...), by name, over `turns` profiled turns of the batches taking
    turns: which call grows where the host launch time does."""
    from torch.profiler import ProfilerActivity, profile

    out: list[dict[str, float]] = [defaultdict(float) for _ in batches]
    for _ in range(turns):
        for i, batch in enumerate(batches):
            if cuda:
                torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                ex.step(batch)
            for ev in prof.events():
                if ev.name.startswith(("cuda", "cu")) and ev.cpu_time_total > 0:
                    out[i][ev.name] += ev.cpu_time_total / 1e3 / turns  # us -> ms, per step
    return [dict(x) for x in out]


def child(mode: str, args: argparse.Namespace) -> dict:
    """One process's measurements under `mode`."""
    from trtforge.llm.executors import torch_exec

    # before the executor exists: its graphs capture under them
    torch_exec.ONE_CAPTURE_STREAM, torch_exec.PIECEWISE_ONE_STREAM = MODES[mode]
    cuda = not args.tiny
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    model = build_model(args.tiny, device, dtype)
    cfg = model.config
    per_token = (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    )
    per_token *= torch.finfo(dtype).bits // 8
    layouts = LAYOUTS
    if args.tiny:
        layouts = [(min(d, 4), min(c, 40), tuple(min(x, 32) for x in ch)) for d, c, ch in layouts]
    needed = max(d * -(-c // BLOCK) + sum(-(-n // BLOCK) for n in ch) for d, c, ch in layouts)
    num_blocks = max(needed + 8, int(args.kv_gb * 1e9 / (per_token * BLOCK)))
    ex = torch_exec.TorchExecutor(
        model, num_blocks=num_blocks, block_size=BLOCK, max_decode_batch=256, mixed_graphs=True,
        max_graph_tokens=4096,
    )  # fmt: skip
    before = torch.cuda.memory_reserved() if cuda else 0
    t = time.perf_counter()
    captured = ex.capture_decode_graphs() + ex.capture_mixed_graphs()
    out: dict = {"mode": mode, "graphs": captured, "capture_s": time.perf_counter() - t, "layouts": []}
    if cuda:
        out["capture_reserved_gb"] = (torch.cuda.memory_reserved() - before) / 1e9
    if args.interleave:
        out["interleaved"] = interleaved_times(ex, layouts, cfg.vocab_size, args.repeats, cuda)
    for decodes, ctx, chunks in layouts:
        batch = make_batch(decodes, ctx, chunks, BLOCK, cfg.vocab_size)
        for _ in range(3):
            ex.step(batch)
        row: dict = {
            "decode_rows": decodes,
            "context": ctx,
            "chunks": list(chunks),
            "path": ex.path_of(batch),
        }
        row |= step_times(ex, batch, args.repeats, cuda)
        if cuda and args.profile_steps:
            row["kernels_ms"] = kernel_ms(ex, batch, args.profile_steps)[0]
            row["gaps"] = profile_served_gaps(ex, batch, args.profile_steps)
        out["layouts"].append(row)
    return out


def compare(runs: list[dict], top: int) -> list[dict]:
    """Per layout: each mode's median GPU (or total) ms and host ms over its runs, each mode's ratio to
    fresh streams, and where profiled each mode's kernel sum and idle time and the kernels whose mean time a
    step differs most between one stream and fresh streams."""
    modes = [m for m in MODES if any(r["mode"] == m for r in runs)]
    rows = []
    for i, first in enumerate(runs[0]["layouts"]):
        key = "gpu_ms" if "gpu_ms" in first else "total_ms"
        mine = {m: [r["layouts"][i] for r in runs if r["mode"] == m] for m in modes}
        ms = {m: statistics.median(x[key] for x in mine[m]) for m in modes}
        row = {k: first[k] for k in ("decode_rows", "context", "chunks", "path")}
        row |= {
            "measure": key,
            "ms": ms,
            "host_ms": {m: statistics.median(x["host_ms"] for x in mine[m]) for m in modes},
        }
        if "fresh" in ms:
            row["over_fresh"] = {m: v / ms["fresh"] for m, v in ms.items()}
        if "kernels_ms" in first:
            mean = {}
            for m in modes:
                names = set().union(*(x["kernels_ms"] for x in mine[m]))
                mean[m] = {n: sum(x["kernels_ms"].get(n, 0.0) for x in mine[m]) / len(mine[m]) for n in names}
            row["kernel_sum_ms"] = {m: sum(mean[m].values()) for m in modes}
            row["idle_ms"] = {
                m: statistics.median(x["gaps"].get("idle_ms", 0.0) for x in mine[m]) for m in modes
            }
            if "one" in mean and "fresh" in mean:
                one, fresh = mean["one"], mean["fresh"]
                diffs = sorted(set(one) | set(fresh), key=lambda n: -abs(one.get(n, 0) - fresh.get(n, 0)))
                row["kernels_differing"] = [
                    {"kernel": n, "one_ms": one.get(n, 0.0), "fresh_ms": fresh.get(n, 0.0)}
                    for n in diffs[:top]
                ]
        rows.append(row)
    return rows


def report(rows: list[dict]) -> None:
    """Each layout's times by mode, then where profiled the kernel sums, idle time and differing kernels."""
    for row in rows:
        ratios = row.get("over_fresh", {})
        modes = ", ".join(
            f"{m} {v:.3f} ms"
            + (f" ({ratios[m]:.3f}x)" if m in ratios else "")
            + f" host {row['host_ms'][m]:.2f}"
            for m, v in row["ms"].items()
        )
        print(
            f"{row['decode_rows']} decode rows @ {row['context']} + {row['chunks']} ({row['path']}): {modes}"
        )
        if "kernel_sum_ms" in row:
            sums, idle = row["kernel_sum_ms"], row["idle_ms"]
            print("  kernel sum / idle ms: " + ", ".join(f"{m} {sums[m]:.3f} / {idle[m]:.3f}" for m in sums))
        for k in row.get("kernels_differing", []):
            print(f"    one {k['one_ms']:.4f} / fresh {k['fresh_ms']:.4f} ms  {k['kernel'][:100]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="processes per mode, alternated")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--profile-steps", type=int, default=5, help="profiled steps a layout (0: none)")
    ap.add_argument("--kv-gb", type=float, default=16.0, help="KV pool size (bench_serving.py's default)")
    ap.add_argument("--top", type=int, default=8, help="kernels listed per layout")
    ap.add_argument("--tiny", action="store_true", help="small model on the CPU (checks the script)")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="also time the layouts taking turns step by step (a served run's bucket switching)",
    )
    ap.add_argument(
        "--out", default=None, help="JSON results (written whole: a temporary file, then renamed)"
    )
    ap.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(MODES), help="capture modes")
    ap.add_argument("--child", choices=tuple(MODES), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with open(args.child_out, "w") as f:
            json.dump(child(args.child, args), f)
        return 0
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("probe_capture_stream.py: needs a CUDA GPU (--tiny checks the script on the CPU)")
    runs = []
    passed = [
        *(["--interleave"] if args.interleave else []),
        "--repeats",
        str(args.repeats),
        "--profile-steps",
        str(args.profile_steps),
        "--kv-gb",
        str(args.kv_gb),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in args.modes[r % len(args.modes) :] + args.modes[: r % len(args.modes)]:  # rotated
                path = os.path.join(tmp, f"{mode}{r}.json")
                cmd = [sys.executable, __file__, "--child", mode, "--child-out", path, *passed]
                subprocess.run(cmd + (["--tiny"] if args.tiny else []), check=True)
                with open(path) as f:
                    runs.append(json.load(f))
                times = [f"{x['path']} {x.get('gpu_ms', x['total_ms']):.3f} ms" for x in runs[-1]["layouts"]]
                print(f"round {r} {mode}: " + ", ".join(times), flush=True)
    rows = compare(runs, args.top)
    report(rows)
    if args.interleave:
        for i, first in enumerate(runs[0]["interleaved"]):
            key = "gpu_ms" if "gpu_ms" in first else "total_ms"
            by_mode = {
                m: statistics.median(r["interleaved"][i][key] for r in runs if r["mode"] == m)
                for m in args.modes
            }
            host = {
                m: statistics.median(r["interleaved"][i]["host_ms"] for r in runs if r["mode"] == m)
                for m in args.modes
            }
            print(
                f"interleaved {first['decode_rows']} decode rows @ {first['context']} + {first['chunks']}: "
                + ", ".join(f"{m} {v:.3f} ms host {host[m]:.2f}" for m, v in by_mode.items())
            )
            calls = {
                m: [r["interleaved"][i].get("runtime_ms", {}) for r in runs if r["mode"] == m]
                for m in args.modes
            }
            names = sorted({n for per in calls.values() for c in per for n in c})
            mean = {
                m: {n: statistics.mean(c.get(n, 0.0) for c in per) for n in names} for m, per in calls.items()
            }
            if len(mean) > 1 and names:
                first_mode, *others = list(mean)
                spread = {n: max(abs(mean[o][n] - mean[first_mode][n]) for o in others) for n in names}
                for n in sorted(names, key=lambda n: -spread[n])[: args.top]:
                    print("    " + ", ".join(f"{m} {mean[m][n]:.3f}" for m in mean) + f" ms  {n}")
    if all("capture_reserved_gb" in r for r in runs):
        reserved = {
            m: statistics.median(r["capture_reserved_gb"] for r in runs if r["mode"] == m) for m in args.modes
        }
        print(
            "allocator memory the capture added (GB): "
            + ", ".join(f"{m} {v:.2f}" for m, v in reserved.items())
        )
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "runs": runs, "compare": rows}  # fmt: skip
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
