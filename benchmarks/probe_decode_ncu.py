"""Probe: the serving decode launch over BF16 and FP8 pools, for Nsight Compute's hardware counters.

    ncu --clock-control none --profile-from-start off --kernel-name regex:_decode_split --set full \
        -f -o build/decode_ncu python3 benchmarks/probe_decode_ncu.py
    ncu --import build/decode_ncu.ncu-rep --csv --page raw > build/decode_ncu_raw.csv
    python3 benchmarks/probe_decode_ncu.py --summarize build/decode_ncu_raw.csv
    ncu --import build/decode_ncu.ncu-rep --csv --page source --print-source sass > build/decode_sass.csv
    python3 benchmarks/probe_decode_ncu.py --sass build/decode_sass.csv

Over FP8 pools the split-KV decode kernel reads K/V at ~3.35-3.5 TB/s against ~4.0 over BF16 pools
(bench_kv_fp8.py, probe_pool_layout.py), though it moves half the bytes per key: what holds it? This
launches ``TritonDecodeAttention`` once per dtype at each ``--points`` B x keys (Llama-3-8B heads: Hq 32
/ Hkv 8 / D 128, 16-token pages at random places) after warm-up launches, inside
cudaProfilerStart/Stop, so ncu profiles only those; each launch's CUDA-event time and TB/s are printed
to stderr too (as ncu replays a kernel, run the probe without ncu for timings). ``--summarize CSV``
prints the telling metrics of an ``ncu --import REP --csv --page raw`` export, a column per kernel.
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
from pathlib import Path

import torch

from benchmarks.bench_decode_attention import _pool

HQ, HKV, D, PAGE = 32, 8, 128, 16


# raw-page metrics worth reading side by side (substrings of their names)
TELLING = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum.per_second",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block",
    "launch__occupancy_limit",
    "launch__grid_size",
    "launch__block_size",
    "smsp__average_warps_issue_stalled_",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct",
    "sm__inst_executed_pipe_",
    "smsp__inst_executed.sum",
)


def summarize(path: Path) -> None:
    """Print TELLING metrics of an ncu raw CSV export, a column per profiled kernel."""
    rows = list(csv.reader(path.open()))
    head, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    name = head.index("Kernel Name")
    print("metric", *[f"{r[name][:24]}#{i}" for i, r in enumerate(body)], sep=" | ")
    for j, metric in enumerate(head):
        wanted = any(t in metric for t in TELLING) and any(r[j] not in ("", "0", "n/a") for r in body)
        if wanted and (metric.endswith("_per_issue_active.ratio") or "stalled_" not in metric):
            print(metric, *[r[j] for r in body], sep=" | ")


def summarize_sass(path: Path, top: int = 30) -> None:
    """Print where a kernel's warps stall, from an ``ncu --import REP --csv --page source --print-source
    sass`` export: the sampled stall columns summed by opcode, then the `top` instructions by samples."""
    rows = list(csv.reader(path.open()))
    at = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if at is None:
        raise SystemExit(f"{path}: no 'Source' column (not a --page source export?)")
    head, body = rows[at], [r for r in rows[at + 1 :] if len(r) == len(rows[at])]
    src = head.index("Source")
    samples = [j for j, h in enumerate(head) if "Sampling" in h]
    if not samples:
        raise SystemExit(f"{path}: no stall-sampling columns; columns: {head}")

    def num(v: str) -> float:
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return 0.0

    by_op: dict[str, list[float]] = {}
    for r in body:
        op = (r[src].split() or ["?"])[0]
        op = r[src].split()[1] if op.startswith("@") and len(r[src].split()) > 1 else op
        acc = by_op.setdefault(op.split(".")[0], [0.0] * len(samples))
        for i, j in enumerate(samples):
            acc[i] += num(r[j])
    print("opcode", *[head[j] for j in samples], sep=" | ")
    for op, acc in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        print(op, *[f"{a:.0f}" for a in acc], sep=" | ")
    print()
    print("instruction", *[head[j] for j in samples], sep=" | ")
    for r in sorted(body, key=lambda r: -num(r[samples[0]]))[:top]:
        print(r[src][:70], *[r[j] for j in samples], sep=" | ")


def main() -> int:
    from trtforge.kernels.kv_quant import FP8_MAX, quantize_fp8
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="+", default=["256x2048", "751x1152"], help="BxKEYS")
    ap.add_argument("--summarize", type=Path, default=None, help="an ncu raw CSV export to summarize")
    ap.add_argument("--sass", type=Path, default=None, help="an ncu source-page CSV to summarize")
    args = ap.parse_args()
    if args.summarize is not None:
        summarize(args.summarize)
        return 0
    if args.sass is not None:
        summarize_sass(args.sass)
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("probe_decode_ncu.py: needs a CUDA GPU with FP8 (sm_89+)")
    serving = TritonDecodeAttention()
    for point in args.points:
        b, length = (int(x) for x in point.split("x"))
        gen = torch.Generator().manual_seed(b + length)
        k = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
        q = torch.randn(b, HQ, D, generator=gen).bfloat16().cuda()
        lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        k16, v16, table = _pool(k, v, PAGE, gen)
        del k, v
        ks, vs = float(k16.abs().amax()) / FP8_MAX, float(v16.abs().amax()) / FP8_MAX
        pools = {"bf16": (k16, v16, 1.0, 1.0), "fp8": (quantize_fp8(k16, ks), quantize_fp8(v16, vs), ks, vs)}
        for name, (kp, vp, kscale, vscale) in pools.items():
            kw = {"out": torch.empty_like(q), "k_scale": kscale, "v_scale": vscale}
            run = functools.partial(serving, q, kp, vp, table, lens, D**-0.5, **kw)

            for _ in range(5):
                run()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.cudart().cudaProfilerStart()
            start.record()
            run()
            end.record()
            torch.cuda.cudart().cudaProfilerStop()
            torch.cuda.synchronize()
            us = 1e3 * start.elapsed_time(end)
            gb = 2 * b * HKV * length * D * kp.element_size() / 1e9
            print(f"{point} {name}: {us:.1f} us, {gb / us * 1e3:.2f} TB/s", file=sys.stderr, flush=True)
        del pools, k16, v16
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
