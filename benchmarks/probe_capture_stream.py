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

Each mode runs in its own process (the streams and the allocator's state are per process), alternated for
``--rounds`` rounds. A process builds bench_serving.py's 1.1B model (FP16) and executor (a 16 GB pool, 256
sequences, piecewise graphs up to 4,096 tokens), captures every decode and piecewise graph as
bench_serving.py does, and then for each step layout times ``--repeats`` served steps (host launch time
and GPU time between CUDA events; medians), then profiles ``--profile-steps`` more: each kernel's device
time per step, summed by name, and the median step's span, busy time and idle gaps. The parent prints each
layout's GPU time by mode and, for the prompt-carrying layouts, the kernels whose time differs most.
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

import torch

from benchmarks.bench_mixed_step import make_batch
from benchmarks.bench_serving import build_model
from benchmarks.profile_mixed_step import kernel_ms, profile_served_gaps

MODES = {"one": True, "fresh": False}  # ONE_CAPTURE_STREAM per mode
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


def child(mode: str, args: argparse.Namespace) -> dict:
    """One process's measurements under `mode`."""
    from trtforge.llm.executors import torch_exec

    torch_exec.ONE_CAPTURE_STREAM = MODES[mode]  # before the executor exists: its graphs capture under it
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
    t = time.perf_counter()
    captured = ex.capture_decode_graphs() + ex.capture_mixed_graphs()
    out: dict = {"mode": mode, "graphs": captured, "capture_s": time.perf_counter() - t, "layouts": []}
    if cuda:
        out["memory_reserved_gb"] = torch.cuda.memory_reserved() / 1e9
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
    """Per layout: each mode's median GPU (or total) ms over its runs, the ratio one/fresh, and where
    profiled the kernels whose mean time a step differs most between the modes."""
    rows = []
    for i, first in enumerate(runs[0]["layouts"]):
        key = "gpu_ms" if "gpu_ms" in first else "total_ms"
        ms = {m: statistics.median(r["layouts"][i][key] for r in runs if r["mode"] == m) for m in MODES}
        host = {
            m: statistics.median(r["layouts"][i]["host_ms"] for r in runs if r["mode"] == m) for m in MODES
        }
        row = {k: first[k] for k in ("decode_rows", "context", "chunks", "path")}
        row |= {"measure": key, "ms": ms, "host_ms": host, "one_over_fresh": ms["one"] / ms["fresh"]}
        if "kernels_ms" in first:
            mean: dict[str, dict[str, float]] = {}
            for m in MODES:
                mine = [r["layouts"][i]["kernels_ms"] for r in runs if r["mode"] == m]
                names = set().union(*mine)
                mean[m] = {n: sum(k.get(n, 0.0) for k in mine) / len(mine) for n in names}
            names = set(mean["one"]) | set(mean["fresh"])
            diffs = sorted(names, key=lambda n: -abs(mean["one"].get(n, 0) - mean["fresh"].get(n, 0)))
            row["kernel_sum_ms"] = {m: sum(mean[m].values()) for m in MODES}
            row["kernels_differing"] = [
                {"kernel": n, "one_ms": mean["one"].get(n, 0.0), "fresh_ms": mean["fresh"].get(n, 0.0)}
                for n in diffs[:top]
            ]
            row["idle_ms"] = {
                m: statistics.median(
                    r["layouts"][i]["gaps"].get("idle_ms", 0.0) for r in runs if r["mode"] == m
                )
                for m in MODES
            }
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="processes per mode, alternated")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--profile-steps", type=int, default=5, help="profiled steps a layout (0: none)")
    ap.add_argument("--kv-gb", type=float, default=16.0, help="KV pool size (bench_serving.py's default)")
    ap.add_argument("--top", type=int, default=8, help="kernels listed per layout")
    ap.add_argument("--tiny", action="store_true", help="small model on the CPU (checks the script)")
    ap.add_argument(
        "--out", default=None, help="JSON results (written whole: a temporary file, then renamed)"
    )
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
        "--repeats",
        str(args.repeats),
        "--profile-steps",
        str(args.profile_steps),
        "--kv-gb",
        str(args.kv_gb),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                path = os.path.join(tmp, f"{mode}{r}.json")
                cmd = [sys.executable, __file__, "--child", mode, "--child-out", path, *passed]
                subprocess.run(cmd + (["--tiny"] if args.tiny else []), check=True)
                with open(path) as f:
                    runs.append(json.load(f))
                times = [f"{x['path']} {x.get('gpu_ms', x['total_ms']):.3f} ms" for x in runs[-1]["layouts"]]
                print(f"round {r} {mode}: " + ", ".join(times), flush=True)
    rows = compare(runs, args.top)
    for row in rows:
        ms, host = row["ms"], row["host_ms"]
        print(
            f"{row['decode_rows']} decode rows @ {row['context']} + {row['chunks']} ({row['path']}): "
            f"one stream {ms['one']:.3f} ms, fresh {ms['fresh']:.3f} ({row['one_over_fresh']:.3f}x; "
            f"host {host['one']:.2f} / {host['fresh']:.2f} ms)",
            flush=True,
        )
        if "kernels_differing" in row:
            sums, idle = row["kernel_sum_ms"], row["idle_ms"]
            print(
                f"  kernel sums {sums['one']:.3f} / {sums['fresh']:.3f} ms, "
                f"idle {idle['one']:.3f} / {idle['fresh']:.3f} ms"
            )
            for k in row["kernels_differing"]:
                print(f"    {k['one_ms']:.4f} / {k['fresh_ms']:.4f} ms  {k['kernel'][:100]}")
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "runs": runs, "compare": rows}  # fmt: skip
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
