"""Sweep the mid-sized 16-bit GEMM's launch configs (trtforge.kernels.gemm_mid) at Llama-3-8B shapes and
decode-sized batches, beside cuBLAS (``F.linear`` and ``addmm`` with the residual).

    python -m benchmarks.sweep_mid_gemm --quick --out benchmarks/results/sweep_mid_gemm.json

Shapes (a Llama-3-8B layer's projections as the fused layer runs them): qkv [6144, 4096] (``F.linear``),
o [4096, 4096] + residual (``addmm``), gate_up [28672, 4096] (``F.linear``), down [4096, 14336] +
residual (``addmm``); M = 64, 128, 256, 384, 512 rows of BF16 (``--quick``: 128, 256, 512). Each
candidate (:func:`grid`, ``default_mid_config``'s first) is checked against cuBLAS's result (relative
error of the norm; above 1e-2 it is marked WRONG and not ranked) and timed as a CUDA graph of 10
launches rotating over enough weight copies to defeat the H200's 50 MB L2 (>= 256 MB in all), median of
the replays: us per launch and TFLOP/s (BF16 dense peak ~989; ``--fp8``: W8A8 on E4M3 codes,
``mid_gemm_fp8`` against ``torch._scaled_mm`` plus the residual add, dense FP8 peak ~1,979). cuBLAS is
timed the same way in the same run. Prints every row, then per (shape, M) the best config and cuBLAS's
time over it (> 1: the Triton kernel is faster), and what the whole layer's four GEMMs would take with
the best of both.

``--budget-s`` splits a time budget evenly over the (shape, M) pairs; a device command runs at most 10
minutes. The result decides ``fused_layers.MID_GEMM_MIN_TOKENS`` / ``MID_GEMM_MAX_TOKENS`` and, with
``--fp8``, ``quant.linear.FP8_MID_MAX_TOKENS`` with ``gemm_mid.fp8_mid_wins``, and ``default_mid_config``
(session 17: the 16-bit dispatch off, the FP8 one on up to 256 rows for narrow outputs).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import time

import torch

from benchmarks.bench_decode_layer import graph_us
from benchmarks.sweep_fp8_skinny import rel_err

SHAPES = {  # N, K, the epilogue the fused layer gives it
    "qkv": (6144, 4096, None),
    "o": (4096, 4096, "residual"),
    "gate_up": (28672, 4096, None),
    "down": (4096, 14336, "residual"),
}
MS = (64, 128, 256, 384, 512)
QUICK_MS = (128, 256, 512)
LAUNCHES = 10  # per graph
L2_DEFEAT_BYTES = 256e6
PEAK_TFLOPS = 989.0
SHARED_LIMIT = 232448  # bytes of shared memory one Hopper block may use
WRONG = 1e-2


def grid(quick: bool, fp8: bool = False) -> list:
    """Candidate configs whose pipeline fits a block's shared memory, in a fixed shuffled order (a budget
    cut leaves a sample of the whole grid)."""
    from trtforge.kernels.gemm_mid import MidConfig

    bms, bns = (64, 128), (64, 128, 256)
    bks = ((128,) if quick else (64, 128)) if fp8 else ((64,) if quick else (32, 64, 128))
    stages, splits = ((3, 4), (1, 2)) if quick else ((3, 4, 5), (1, 2, 3, 4))
    out = []
    for bm, bn, bk, st, sk in itertools.product(bms, bns, bks, stages, splits):
        # quick: 8 warps for tiles of 128 x 128 and more, else 4
        for warps in ((8 if bm * bn >= 128 * 128 else 4),) if quick else (4, 8):
            cfg = MidConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=st, split_k=sk)
            if st * (bm + bn) * bk * (1 if fp8 else 2) <= SHARED_LIMIT:
                out.append(cfg)
    random.Random(0).shuffle(out)
    return out


def describe(cfg) -> str:
    return (
        f"bm={cfg.block_m:3d} bn={cfg.block_n:3d} bk={cfg.block_k:3d} w={cfg.num_warps} "
        f"st={cfg.num_stages} sk={cfg.split_k}"
    )


def timed(fn) -> float:
    """us per launch of LAUNCHES calls of fn(i) (i: the launch's index, to rotate weights) in one graph."""
    return graph_us(lambda: [fn(i) for i in range(LAUNCHES)], LAUNCHES, reps=7, inner=3)


def sweep_pair(shape: str, m: int, copies: list, quick: bool, deadline: float, fp8: bool = False) -> dict:
    """Every candidate and cuBLAS at one (shape, M); the pair's rows and its summary. `fp8`: W8A8 on
    E4M3 weights (`copies` are Fp8Weights) and per-row E4M3 activations quantized once; the peer is
    ``torch._scaled_mm`` on the same codes (+ the residual, as the served path adds it)."""
    from trtforge.kernels import num_sms
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.gemm_mid import default_mid_config, mid_gemm, mid_gemm_fp8

    n, k, epilogue = SHAPES[shape]
    dev = copies[0].data.device if fp8 else copies[0].device
    g = torch.Generator(device=dev).manual_seed(1000 * m + n)
    x = torch.randn(m, k, device=dev, generator=g, dtype=torch.bfloat16)
    res = torch.randn(m, n, device=dev, generator=g, dtype=torch.bfloat16) if epilogue else None
    flops = 2.0 * m * n * k
    xq_p, sx_p = quantize_rows_fp8_padded(x)

    def cublas(i: int) -> torch.Tensor:
        w = copies[i % len(copies)]
        if fp8:
            out = torch._scaled_mm(
                xq_p, w.data.t(), scale_a=sx_p, scale_b=w.scale[None, :], out_dtype=torch.bfloat16
            )[:m]
            return out if res is None else res + out
        return torch.addmm(res, x, w.t()) if res is not None else torch.nn.functional.linear(x, w)

    def triton_(cfg):
        if fp8:
            return lambda i: mid_gemm_fp8(
                xq_p[:m], sx_p[:m], copies[i % len(copies)].data, copies[i % len(copies)].scale,
                residual=res, config=cfg,
            )  # fmt: skip
        return lambda i: mid_gemm(x, copies[i % len(copies)], residual=res, config=cfg)

    ref = cublas(0)
    peer = timed(cublas)
    print(f"{shape:8s} M={m:3d} cuBLAS {peer:8.2f} us {flops / peer / 1e6:6.0f} TFLOP/s", flush=True)
    dflt = default_mid_config(m, n, k, num_sms(dev), fp8=fp8)
    cands = [dflt] + [c for c in grid(quick, fp8) if c != dflt]
    rows = []
    for cfg in cands:
        if time.perf_counter() > deadline and rows:
            print(f"  (budget spent: {shape} M={m} stops after {len(rows)} of {len(cands)} configs)")
            break
        row = {"shape": shape, "m": m, "config": dataclasses.asdict(cfg), "default": cfg == dflt}
        try:
            row["rel_err_cublas"] = rel_err(triton_(cfg)(0), ref)
            if row["rel_err_cublas"] <= WRONG:
                us = timed(triton_(cfg))
                row |= {"us": us, "tflops": flops / us / 1e6}
        except Exception as e:  # a config the compiler or the launch refuses (shared memory, registers)
            row["error"] = repr(e)[:300]
        rows.append(row)
        if "us" in row:
            result = f"{row['us']:8.2f} us {row['tflops']:6.0f} TFLOP/s err {row['rel_err_cublas']:.1e}"
        elif "error" in row:
            result = f"error {row['error'][:80]}"
        else:
            result = f"WRONG: err {row['rel_err_cublas']:.1e} against cuBLAS"
        mark = "(default)" if row["default"] else "         "
        print(f"{shape:8s} M={m:3d} {describe(cfg)} {mark} {result}", flush=True)
    summary = {"shape": shape, "m": m, "cublas_us": peer, "cublas_tflops": flops / peer / 1e6}
    ok = [r for r in rows if "us" in r]
    if ok:
        top = min(ok, key=lambda r: r["us"])
        summary |= {
            "best": top,
            "default_us": next((r["us"] for r in ok if r["default"]), None),
            "cublas_over_best": peer / top["us"],
        }
    return {"rows": rows, "summary": summary}


def report(summaries: list[dict]) -> None:
    from trtforge.kernels.gemm_mid import MidConfig

    print("\nbest per (shape, M): Triton us and TFLOP/s [config] (default); cuBLAS us and its time over it")
    layer: dict[int, list[float]] = {}
    for s in summaries:
        if "best" not in s:
            print(f"  {s['shape']:8s} M={s['m']:3d}: no config ran")
            continue
        t = s["best"]
        dflt = f"{s['default_us']:.2f}" if s["default_us"] else "-"
        print(
            f"  {s['shape']:8s} M={s['m']:3d}: {t['us']:7.2f} us {t['tflops']:5.0f} TFLOP/s "
            f"[{describe(MidConfig(**t['config']))}] (default {dflt}); cuBLAS {s['cublas_us']:.2f} "
            f"({s['cublas_over_best']:.2f}x)"
        )
        both = layer.setdefault(s["m"], [0.0, 0.0])
        both[0] += s["cublas_us"]
        both[1] += min(s["cublas_us"], t["us"])
    for m, (cublas, best) in sorted(layer.items()):
        print(
            f"  a layer's GEMMs at M={m}: cuBLAS {cublas:.1f} us, "
            f"best of both {best:.1f} ({cublas / best:.2f}x)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller grid and M = 128, 256, 512")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
    ap.add_argument(
        "--ms", default=None, help="comma-separated row counts (default 64..512; quick 128,256,512)"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="time budget (quick: 240 s, else 480 s)")
    ap.add_argument("--fp8", action="store_true", help="W8A8 (mid_gemm_fp8) against torch._scaled_mm")
    ap.add_argument("--out", default=None, help="JSON of every row and the summaries")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "needs a CUDA GPU (the kernel's results are tested in the interpreter: tests/kernels)"
        )
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    ms = [int(v) for v in args.ms.split(",")] if args.ms else list(QUICK_MS if args.quick else MS)
    budget = args.budget_s or (240.0 if args.quick else 480.0)
    start = time.perf_counter()
    pairs = [(s, m) for s in shapes for m in ms]
    results, summaries = [], []
    for index, shape in enumerate(shapes):
        n, k, _ = SHAPES[shape]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        count = min(LAUNCHES, math.ceil(L2_DEFEAT_BYTES / (w.numel() * (1 if args.fp8 else 2))))
        if args.fp8:
            from trtforge.kernels.qweight import Fp8Weight, quantize_fp8

            q = quantize_fp8(w)
            copies = [q] + [Fp8Weight(q.data.clone(), q.scale.clone()) for _ in range(count - 1)]
        else:
            copies = [w] + [w.clone() for _ in range(count - 1)]
        for m in ms:
            done = index * len(ms) + ms.index(m)
            share = (budget - (time.perf_counter() - start)) / max(1, len(pairs) - done)
            out = sweep_pair(shape, m, copies, args.quick, time.perf_counter() + share, args.fp8)
            results.extend(out["rows"])
            summaries.append(out["summary"])
        del copies, w
        torch.cuda.empty_cache()
    report(summaries)
    if args.out:
        doc = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "quick": args.quick,
            "fp8": args.fp8,
            "seconds": time.perf_counter() - start,
            "rows": results,
            "summaries": summaries,
        }
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
