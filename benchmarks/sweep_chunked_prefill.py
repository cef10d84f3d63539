"""Sweep: the chunked-prefill kernel's tiles at the prompt chunks a served step holds (Llama-3-8B heads).

    PYTHONPATH=. python3 benchmarks/sweep_chunked_prefill.py --out chunked_prefill_sweep.json

Session 15's profile of the 8B prefill step (benchmarks/profile_mixed_step.py) had the chunked-prefill
kernel at about 210 TFLOP/s on 2,048-token chunks, with session 10's tiles (64 x 64, 4 warps, 2 stages).
For each layout (fresh prompt chunks, and a chunk after a cached prefix; Hq 32, Hkv 8, D 128, BF16,
blocks of 16 scattered over the pool) every candidate of ``configs.CHUNK_PREFILL_CANDIDATES`` is timed
as the served step launches it (:func:`prepare_chunked_prefill_varlen`, the median of CUDA-event timings
by triton.testing.do_bench) and checked against the default tiles' output. Reported: µs per layer
launch, attention TFLOP/s (causal: 4 Hq D per visible query-key pair), the best per layout and the
``CHUNK_PREFILL_CONFIGS`` table those bests suggest (by each layout's longest chunk). Candidates that do
not fit the GPU's shared memory are skipped and named.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.testing

from trtforge.kernels.chunked_prefill import prepare_chunked_prefill_varlen
from trtforge.kernels.configs import CHUNK_PREFILL_CANDIDATES, chunk_prefill_config

HQ, HKV, D, BLOCK = 32, 8, 128, 16
# (cached prefix, chunk length) per sequence of the step
LAYOUTS = [
    [(0, 64)],
    [(0, 256)],
    [(0, 512), (0, 512)],
    [(0, 1024)],
    [(1000, 1024)],
    [(0, 2048), (0, 2048)],
    [(2048, 2048)],
]


def _flops(layout) -> float:
    pairs = sum(p * c + c * (c + 1) / 2 for p, c in layout)
    return 4.0 * HQ * D * pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "needs a CUDA GPU (the candidates' results are tested in the interpreter: tests/kernels)"
        )
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for layout in LAYOUTS:
        widths = [-(-(p + c) // BLOCK) for p, c in layout]
        pool_blocks = sum(widths) + 1
        k = torch.randn(pool_blocks, BLOCK, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        perm = torch.randperm(pool_blocks - 1, device=dev, generator=g)
        table = torch.zeros(len(layout), max(widths), dtype=torch.int32, device=dev)
        at = 0
        for i, w in enumerate(widths):
            table[i, :w] = perm[at : at + w].int()
            at += w
        q_lens = [c for _, c in layout]
        starts = [sum(q_lens[:i]) for i in range(len(layout))]
        i32 = {
            n: torch.tensor(x, dtype=torch.int32, device=dev)
            for n, x in (("s", starts), ("q", q_lens), ("l", [p + c for p, c in layout]))
        }
        q = torch.randn(sum(q_lens), HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
        flops = _flops(layout)
        row = {"layout": layout, "tflop": flops / 1e12, "us": {}, "skipped": {}}
        ref = None
        for c in CHUNK_PREFILL_CANDIDATES:
            name = f"{c.block_m}x{c.block_n}/w{c.num_warps}/s{c.num_stages}"
            out = torch.empty_like(q)
            launch = prepare_chunked_prefill_varlen(
                q, k, v, i32["l"], table, i32["s"], i32["q"], max(q_lens), out=out,
                block_m=c.block_m, block_n=c.block_n, num_warps=c.num_warps, num_stages=c.num_stages,
            )  # fmt: skip

            def fn(launch=launch, q=q, k=k, v=v, out=out) -> None:
                launch(q, k, v, out, D**-0.5)

            try:
                fn()
                torch.cuda.synchronize()
            except triton.runtime.errors.OutOfResources as e:
                row["skipped"][name] = repr(e)[:200]
                continue
            if ref is None:
                ref = out.clone()
            else:
                torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
            us = float(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")) * 1e3
            row["us"][name] = us
            print(f"{layout} {name:16s} {us:9.1f} us {flops / us / 1e6:7.1f} TFLOP/s", flush=True)
        best = min(row["us"], key=row["us"].get)
        default = chunk_prefill_config(max(q_lens))
        now = f"{default.block_m}x{default.block_n}/w{default.num_warps}/s{default.num_stages}"
        row |= {"best": best, "served_now": now, "served_over_best": row["us"][now] / row["us"][best]}
        print(f"{layout}: best {best}, served {now} is {row['served_over_best']:.2f}x it", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
