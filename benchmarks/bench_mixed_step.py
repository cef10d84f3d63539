"""Steps with prompt tokens (prefill chunks next to decodes): host vs GPU time, eager vs piecewise graphs.

    PYTHONPATH=. python3 benchmarks/bench_mixed_step.py --out mixed_step.json

On the 1.1B Llama-style model of bench_serving.py (random FP16 weights, trtforge's kernels, fused
layers), for a few step layouts (decode rows of a given context next to prompt chunks): per step,
the median over repeats of (a) the host time until ``step_async`` returns (the launches), (b) the
wall time of step + synchronize, (c) the GPU time between CUDA events around the step, for the
eager path (``mixed_graphs=False``) and the piecewise CUDA graphs, measured alternately in one
process. A step whose host time is near its wall time is launch-bound: it costs more on a slower
host CPU. ``--unbound`` also measures both paths with ``TRTFORGE_BIND_LAUNCHES=0`` (attention
launches prepared once a step but each launched through Triton's JITFunction), alternately with the
bound ones in the same process. ``--tiny`` runs a small model on the CPU (checks the script only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

from benchmarks.bench_serving import build_model
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.torch_exec import TorchExecutor

# (decode rows, their context length, prompt chunk lengths (each a fresh prompt))
LAYOUTS = [
    (256, 600, (1024,)),
    (256, 600, (512, 512)),
    (128, 600, (256, 256, 256, 256)),
    (64, 300, (512,)),
    (16, 300, (128,)),
    (0, 0, (1024, 1024)),
]


def make_batch(decodes: int, ctx: int, chunks: tuple, block_size: int, vocab: int) -> StepBatch:
    """Decode rows first (the scheduler's order), then the prompt chunks; blocks laid out in turn."""
    seq_ids, tokens, starts, tables, slots, next_block = [], [], [], [], [], 0
    rng = np.random.default_rng(0)
    for length, new in [(ctx, 1)] * decodes + [(c, c) for c in chunks]:
        nblocks = -(-length // block_size)
        table = list(range(next_block, next_block + nblocks))
        next_block += nblocks
        first = length - new
        seq_ids.append(len(seq_ids))
        tokens.append(rng.integers(0, vocab, size=new).tolist())
        starts.append(first)
        tables.append(table)
        slots.append([table[p // block_size] * block_size + p % block_size for p in range(first, length)])
    return StepBatch.build(seq_ids, tokens, starts, tables, slots, [True] * len(seq_ids))


def timed(ex: TorchExecutor, batch: StepBatch) -> tuple[float, float, float]:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    ex.step_async(batch, None)
    end.record()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3, start.elapsed_time(end)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="small model on the CPU (checks the script)")
    ap.add_argument("--unbound", action="store_true", help="also time TRTFORGE_BIND_LAUNCHES=0")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = "cpu" if args.tiny else "cuda"
    model = build_model(args.tiny, device, torch.float32 if args.tiny else torch.float16)
    block_size = 16
    needed = max(d * -(-c // block_size) + sum(-(-n // block_size) for n in ch) for d, c, ch in LAYOUTS)
    kwargs = {"num_blocks": needed + 8, "block_size": block_size, "static_decode": True}
    executors = {
        "eager": TorchExecutor(model, mixed_graphs=False, **kwargs),
        "piecewise": TorchExecutor(model, **kwargs),
    }
    rows = []
    for decodes, ctx, chunks in LAYOUTS:
        if args.tiny:
            decodes, ctx, chunks = min(decodes, 4), min(ctx, 40), tuple(min(c, 32) for c in chunks)
        batch = make_batch(decodes, ctx, chunks, block_size, model.config.vocab_size)
        row = {"decode_rows": decodes, "context": ctx, "chunks": list(chunks), "tokens": batch.num_tokens}
        if args.tiny:
            for name, ex in executors.items():
                t0 = time.perf_counter()
                ex.step(batch)
                row[name] = {"wall_ms": (time.perf_counter() - t0) * 1e3}
            rows.append(row)
            continue
        variants = [(name, ex, "1") for name, ex in executors.items()]
        if args.unbound:
            variants += [(f"{name}-unbound", ex, "0") for name, ex in executors.items()]
        for _, ex, bind in variants:
            os.environ["TRTFORGE_BIND_LAUNCHES"] = bind
            for _ in range(3):
                timed(ex, batch)  # warm-up: compilation, graph capture of the bucket
        samples: dict[str, list] = {name: [] for name, _, _ in variants}
        for _ in range(args.repeats):
            for name, ex, bind in variants:  # alternate, so drift hits all alike
                os.environ["TRTFORGE_BIND_LAUNCHES"] = bind
                samples[name].append(timed(ex, batch))
        for name, got in samples.items():
            host, wall, gpu = (statistics.median(x) for x in zip(*got))
            row[name] = {"host_ms": host, "wall_ms": wall, "gpu_events_ms": gpu}
        row["eager_over_piecewise_wall"] = row["eager"]["wall_ms"] / row["piecewise"]["wall_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "piecewise_graphs": executors["piecewise"].num_piecewise_graphs,
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
