"""Sweep: split counts (and launch configs) of the paged split-KV decode launch at served batch sizes.

    PYTHONPATH=. python3 benchmarks/sweep_paged_decode_splits.py --out paged_splits.json
    PYTHONPATH=. python3 benchmarks/sweep_paged_decode_splits.py --configs 64,4,3 128,4,2 128,8,3 \
        --cases 241:190 62:2100 425:190 --splits 1 2

The served path launches decode attention through :func:`trtforge.kernels.decode_attention.
prepare_paged_decode` with the default configuration and :func:`~trtforge.kernels.decode_attention.
num_splits_for`'s split count, which gives one split from B·Hkv = 4 per SM up. For B decode rows
(Hq 32, Hkv 8, D 128, BF16, blocks of 16 scattered over the pool) at context L, each split count is
timed as the served mixed step launches it (eager, fused reduction, programmatic dependent launch
where the GPU has it: median of CUDA-event timings,
triton.testing.do_bench) and checked against split count 1; the bytes of K/V read give the TB/s
(H200 HBM3e: 4.8). The heuristic's choice is marked. ``--configs BLOCK_N,WARPS,STAGES ...`` times
each configuration (the first is the reference the others are checked against; default: today's BF16
default) at every split count; ``--cases B:L ...`` picks the shapes (default: the served ones below).
``--ragged LO`` draws each sequence's length uniformly from [LO, L] instead (seeded), as in the mixed
burst's decode tail (prompts of 64-2,048 plus their outputs): the heuristic sees only B·Hkv and the
longest, so one split a sequence leaves the longest sequences' programs as the launch's tail.
"""

from __future__ import annotations

import argparse
import json
import os

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
# session 15's cases, then session 23's served steps: 128/128's decode rows (241 at ~190 keys; 425 with 512
# sequences) and 2048/128's mixed steps (~60 rows at ~2,100 keys)
CASES = [(100, 1000), (190, 1000), (256, 600), (256, 2000), (192, 3000), (64, 4000), (241, 190), (425, 190),
         (62, 2100)]  # fmt: skip


def _pair(text: str, sep: str, n: int) -> tuple[int, ...]:
    parts = text.split(sep)
    if len(parts) != n or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected {n} positive integers joined by {sep!r}, got {text!r}")
    return tuple(int(p) for p in parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    ap.add_argument(
        "--configs",
        type=lambda t: _pair(t, ",", 3),
        nargs="+",
        default=None,
        help="BLOCK_N,WARPS,STAGES candidates (default: default_decode_config's for BF16, D 128)",
    )
    ap.add_argument("--cases", type=lambda t: _pair(t, ":", 2), nargs="+", default=None, help="B:L shapes")
    ap.add_argument(
        "--ragged", type=int, default=None, help="lengths drawn uniformly from [RAGGED, L] per sequence"
    )
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
    base = default_decode_config(D)
    configs = args.configs or [(base.block_n, base.num_warps, base.num_stages)]
    for b, ctx in args.cases or CASES:
        width = -(-ctx // BLOCK)
        pool_blocks = b * width + 1
        k = torch.randn(pool_blocks, BLOCK, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        tables = torch.randperm(pool_blocks - 1, device=dev, generator=g)[: b * width].view(b, width).int()
        if args.ragged is None:
            lens = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        else:
            lo = min(args.ragged, ctx)
            lens = torch.randint(lo, ctx + 1, (b,), device=dev, generator=g, dtype=torch.int32)
        q = torch.randn(b, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
        chosen = num_splits_for(b * HKV, width * BLOCK, sms, configs[0][0])  # the reference's rule
        kv_bytes = 2 * int(lens.sum()) * HKV * D * 2
        row = {"batch": b, "context": ctx, "heuristic_splits": chosen, "kv_gb": kv_bytes / 1e9, "ms": {}}
        row["ragged_from"] = args.ragged
        ref = None
        for bn, warps, stages in configs:
            rule = num_splits_for(b * HKV, width * BLOCK, sms, bn)
            for n in sorted(set(args.splits) | {rule}):
                out = torch.empty_like(q)
                launch = prepare_paged_decode(
                    q,
                    k,
                    v,
                    lens,
                    tables,
                    out,
                    config=DecodeConfig(bn, warps, stages, n),
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
                key = n if len(configs) == 1 else f"{bn}x{warps}x{stages}/{n}"
                row["ms"][key] = ms
                mark = " *" if (bn, warps, stages) == configs[0] and n == chosen else "  "
                print(
                    f"B {b:4d} L {ctx:5d} config {bn}x{warps}x{stages} splits {n:2d}{mark} "
                    f"{ms * 1e3:8.1f} us {kv_bytes / ms / 1e9:6.2f} TB/s",
                    flush=True,
                )
        chosen = chosen if len(configs) == 1 else f"{configs[0][0]}x{configs[0][1]}x{configs[0][2]}/{chosen}"
        best = min(row["ms"], key=row["ms"].get)
        row["best_splits"] = best
        row["heuristic_over_best"] = row["ms"][chosen] / row["ms"][best]
        rows.append(row)
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "sms": sms, "rows": rows}
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
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
