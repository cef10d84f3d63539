"""Sweep: split counts of the paged split-KV decode launch at served batch sizes (Llama-3-8B heads).

    PYTHONPATH=. python3 benchmarks/sweep_paged_decode_splits.py --out paged_splits.json

The served path launches decode attention through :func:`trtforge.kernels.decode_attention.
prepare_paged_decode` with the default configuration and :func:`~trtforge.kernels.decode_attention.
num_splits_for`'s split count, which gives one split from B·Hkv = 4 per SM up. For B decode rows
(Hq 32, Hkv 8, D 128, BF16, blocks of 16 scattered over the pool) at context L, each split count is
timed as the served mixed step launches it (eager, fused reduction, programmatic dependent launch
where the GPU has it: median of CUDA-event timings,
triton.testing.do_bench) and checked against split count 1; the bytes of K/V read give the TB/s
(H200 HBM3e: 4.8). The heuristic's choice is marked.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

from trtforge.kernels.decode_attention import (
    DecodeConfig,
    default_decode_config,
    num_splits_for,
    prepare_paged_decode,
)
from trtforge.kernels.gemv import pdl_supported

HQ, HKV, D, BLOCK = 32, 8, 128, 16
CASES = [(100, 1000), (190, 1000), (256, 600), (256, 2000), (192, 3000), (64, 4000)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "needs a CUDA GPU (the kernel's correctness is tested in the interpreter: tests/kernels)"
        )
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for b, ctx in CASES:
        width = -(-ctx // BLOCK)
        pool_blocks = b * width + 1
        k = torch.randn(pool_blocks, BLOCK, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        tables = torch.randperm(pool_blocks - 1, device=dev, generator=g)[: b * width].view(b, width).int()
        lens = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        q = torch.randn(b, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
        base = default_decode_config(D)
        chosen = num_splits_for(b * HKV, width * BLOCK, sms, base.block_n)
        kv_bytes = 2 * b * ctx * HKV * D * 2
        row = {"batch": b, "context": ctx, "heuristic_splits": chosen, "kv_gb": kv_bytes / 1e9, "ms": {}}
        ref = None
        for n in sorted(set(args.splits) | {chosen}):
            out = torch.empty_like(q)
            launch = prepare_paged_decode(
                q,
                k,
                v,
                lens,
                tables,
                out,
                config=DecodeConfig(base.block_n, base.num_warps, base.num_stages, n),
                pdl=pdl_supported(dev),  # as the served step launches it
            )

            def fn(launch=launch, q=q, k=k, v=v, out=out) -> None:
                launch(q, k, v, out, D**-0.5)

            fn()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.clone()
            else:
                torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
            ms = float(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"))
            row["ms"][n] = ms
            print(
                f"B {b:4d} L {ctx:5d} splits {n:2d}{' *' if n == chosen else '  '} {ms * 1e3:8.1f} us "
                f"{kv_bytes / ms / 1e9:6.2f} TB/s",
                flush=True,
            )
        best = min(row["ms"], key=row["ms"].get)
        row["best_splits"] = best
        row["heuristic_over_best"] = row["ms"][chosen] / row["ms"][best]
        rows.append(row)
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "sms": sms, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(
        json.dumps(
            [
                {
                    k: r[k]
                    for k in ("batch", "context", "heuristic_splits", "best_splits", "heuristic_over_best")
                }
                for r in rows
            ]
        )
    )


if __name__ == "__main__":
    main()
