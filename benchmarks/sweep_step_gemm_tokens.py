"""Sweep: cuBLAS's time for a Llama-3-8B layer's four BF16 GEMMs at a mixed step's token counts.

    python -m benchmarks.sweep_step_gemm_tokens --out benchmarks/results/step_gemm_tokens.json

A mixed serving step runs every projection at M = its tokens (prompt chunk + decode rows, padded to the
piecewise graphs' bucket). cuBLAS tiles M in blocks (128 rows on Hopper for these shapes), and o and down (N
= 4,096) have few column tiles, so M just past a multiple of the tile may start a second wave of tiles for
little work. This times the cuBLAS calls the fused layer makes (``x @ w.T`` for qkv and gate_up, ``addmm``
with the residual for o and down), each token count of ``--tokens`` (default 256..2,048: decode and mixed
steps), and prints us per layer, us per token and TFLOP/s (dense BF16 peak ~989): which step sizes are cheap
per token. CUDA-graph replays of 10 launches rotating over weight copies (>= 256 MB, past the 50 MB L2),
median.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from benchmarks.bench_decode_layer import graph_us
from benchmarks.sweep_mid_gemm import L2_DEFEAT_BYTES, LAUNCHES, SHAPES  # (N, K, epilogue) a projection

TOKENS = (256, 384, 448, 512, 960, 1024, 1056, 1088, 1152, 1216, 1280, 1408, 1536, 1792, 2048)


def time_shape(m: int, n: int, k: int, residual: bool) -> float:
    """us of one [m, k] x [k, n] BF16 GEMM (with the residual add where the layer has one)."""
    copies = max(1, math.ceil(L2_DEFEAT_BYTES / (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def run() -> None:
        for i in range(LAUNCHES):
            w = weights[i % copies]
            if residual:
                torch.addmm(res, x, w.t(), out=out)
            else:
                torch.mm(x, w.t(), out=out)

    return graph_us(run, LAUNCHES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="step token counts (M)")
    ap.add_argument("--out", default=None, help="JSON of every row")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: it times cuBLAS")
    rows = []
    for m in args.tokens:
        per = {name: time_shape(m, n, k, epi == "residual") for name, (n, k, epi) in SHAPES.items()}
        total = sum(per.values())
        flops = sum(2 * m * n * k for n, k, _ in SHAPES.values())
        row = {"tokens": m, "us": per, "layer_us": total, "us_per_token": total / m,
               "tflops": flops / total / 1e6}  # fmt: skip
        rows.append(row)
        print(
            f"M {m:5d}: layer {total:8.1f} us, {total / m:6.3f} us/token, {row['tflops']:6.1f} TFLOP/s ("
            + ", ".join(f"{name} {us:.1f}" for name, us in per.items())
            + ")",
            flush=True,
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        result = {"device": torch.cuda.get_device_name(), "rows": rows}
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
