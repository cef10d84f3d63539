"""Sweep the skinny FP8 GEMM's launch configs (trtforge.kernels.fp8_skinny) at Llama-3-8B shapes, beside
today's FP8 paths, BF16, and (at one row) the FP8 GEMV.

    python -m benchmarks.sweep_fp8_skinny --quick --out benchmarks/results/sweep_fp8_skinny.json

Shapes (a Llama-3-8B layer's projections, unfused: no norm or SiLU): qkv [6144, 4096], o [4096, 4096],
gate_up [28672, 4096], down [4096, 14336]; M = 1, 4, 16, 64 rows (``--quick``: 1 and 64; ``--shapes``
and ``--ms`` pick others). Per (shape, M), BF16 activations quantized per token by the fp8_rows
kernel, as serving does. Each candidate config (:func:`grid`; ``default_skinny_config``'s first) is
checked against ``torch._scaled_mm`` on the same codes and against their float32 product (relative
error of the norm; above 1e-2 it is marked WRONG and not ranked), then timed as a CUDA graph of 20
launches rotating over enough weight copies to defeat the H200's 50 MB L2 (>= 256 MB in all), median
of the replays: us per launch and TB/s of weight bytes (codes + scales; HBM3e peak 4.8 TB/s).

The peers, timed the same way in the same run:

- ``scaled_mm``: ``torch._scaled_mm`` (cuBLASLt, ``use_fast_accum=False``) on the same codes, padded to
  16 rows as today's path pads them;
- ``quant+scaled_mm``: today's W8A8 path above one token (``trtforge.llm.quant.linear._scaled_mm``: the
  fp8_rows kernel, then ``_scaled_mm``);
- ``bf16``: ``torch.nn.functional.linear`` over BF16 weights (twice the bytes; copies rotated too);
- ``gemv`` (M = 1 only): today's FP8 path at one token, the weight-only GEMV (``gemv.gemv``);

and the best config again behind the activation quantization (``quant+skinny``: what wiring it in
costs, to set against ``quant+scaled_mm``) and with ``fast_accum``. Prints every row, then per (shape,
M) the best config and each peer's time over it (> 1: the skinny kernel is faster; issue #28 asks for
FP8 >= 1.6x BF16 throughput). ``--budget-s`` splits a time budget evenly over the (shape, M) pairs and
stops starting new configs in a pair past its share (the peers and the best config's extras still
run). A device command runs at most 10 minutes: the full grid (without ``--quick``) is meant to run a
shape at a time (``--shapes qkv``), each with its own ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import time
from pathlib import Path

import torch

from benchmarks.bench_decode_layer import graph_us

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # N, K
MS = (1, 4, 16, 64)
QUICK_MS = (1, 64)
LAUNCHES = 20  # per graph
L2_DEFEAT_BYTES = 256e6  # weight copies rotated per graph: at least this many bytes in all
HBM_TB_S = 4.8  # H200 HBM3e peak
SHARED_LIMIT = 232448  # bytes of shared memory one Hopper block may use (227 KB)
WRONG = 1e-2  # relative error (of the norm) against the float32 product above which a config is wrong


def shared_bytes(cfg, m: int) -> int:
    """Shared memory of a config's pipeline: a stage holds an x tile and a weight tile, one byte each."""
    from trtforge.kernels.fp8_skinny import block_rows

    return cfg.num_stages * (block_rows(m, cfg) + cfg.block_n) * cfg.block_k


def grid(m: int, quick: bool) -> list:
    """Candidate configs at M rows, both orientations (swapped: the weight tile is the wgmma's A, 16 rows
    a warp), those whose pipeline fits a block's shared memory; in a fixed shuffled order, so that a
    budget cut leaves a sample of the whole grid rather than its first corner."""
    from trtforge.kernels.fp8_skinny import SkinnyConfig

    if quick:
        axes = [(False, (32, 64, 128), (128, 256), (4,), (3, 4), (1, 2)),
                (True, (64, 128), (128, 256), (4,), (3, 4), (1, 2))]  # fmt: skip
    else:
        axes = [(False, (16, 32, 64, 128), (128, 256), (4,), (3, 4, 5), (1, 2, 4)),
                (False, (128,), (128, 256), (8,), (3, 4, 5), (1, 2, 4)),
                (False, (32, 64), (64,), (4,), (4, 5), (1, 2)),
                (True, (64, 128), (128, 256), (4,), (3, 4, 5), (1, 2, 4)),
                (True, (128,), (128, 256), (8,), (3, 4, 5), (1, 2, 4))]  # fmt: skip
    out = []
    for swap, *dims in axes:
        for bn, bk, warps, stages, split in itertools.product(*dims):
            cfg = SkinnyConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, split_k=split,
                               swap_ab=swap)  # fmt: skip
            if shared_bytes(cfg, m) <= SHARED_LIMIT:
                out.append(cfg)
    random.Random(0).shuffle(out)
    return out


def describe(cfg) -> str:
    orient = "swap" if cfg.swap_ab else "x64 "
    fast = " fast" if cfg.fast_accum else ""
    return (
        f"{orient} bn={cfg.block_n:3d} bk={cfg.block_k:3d} w={cfg.num_warps} st={cfg.num_stages} "
        f"sk={cfg.split_k}{fast}"
    )


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def timed(fn) -> float:
    """us per launch of LAUNCHES calls of fn(i) (i: the launch's index, to rotate weights) in one graph."""
    return graph_us(lambda: [fn(i) for i in range(LAUNCHES)], LAUNCHES, reps=7, inner=3)


def weight_bytes(w) -> int:
    """Bytes an FP8 projection reads from its weight: the codes and the float32 row scales."""
    return w.data.numel() + w.scale.numel() * 4


def fp8_copies(w) -> list:
    """`w` and clones of it: at least L2_DEFEAT_BYTES in all (at most one per launch of a graph)."""
    from trtforge.kernels.qweight import Fp8Weight

    count = min(LAUNCHES, math.ceil(L2_DEFEAT_BYTES / weight_bytes(w)))
    return [w] + [Fp8Weight(w.data.clone(), w.scale.clone()) for _ in range(count - 1)]


def sweep_pair(shape: str, m: int, w, copies: list, bf16_copies: list, quick: bool, deadline: float) -> dict:
    """Every candidate and the peers at one (shape, M); the pair's rows and its summary."""
    from trtforge.kernels import num_sms
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.fp8_skinny import default_skinny_config, fp8_skinny_gemm
    from trtforge.kernels.gemv import gemv
    from trtforge.llm.quant.linear import _scaled_mm

    n, k = SHAPES[shape]
    size = weight_bytes(w)
    dev = w.data.device
    g = torch.Generator(device=dev).manual_seed(1000 * m + n)
    x = torch.randn(m, k, device=dev, generator=g, dtype=torch.bfloat16)
    xq_p, sx_p = quantize_rows_fp8_padded(x)  # rows padded to 16, as today's path gives cuBLASLt
    xq, sx = xq_p[:m], sx_p[:m]

    def mm(q) -> torch.Tensor:
        return torch._scaled_mm(xq_p, q.data.t(), scale_a=sx_p, scale_b=q.scale[None, :],
                                out_dtype=torch.bfloat16, use_fast_accum=False)  # fmt: skip

    def skinny(cfg):
        """Launch i of a graph: the skinny kernel over weight copy i."""
        return lambda i: fp8_skinny_gemm(xq, sx, copies[i % len(copies)].data, copies[i % len(copies)].scale,
                                         config=cfg)  # fmt: skip

    ref_mm = mm(w)[:m].float()
    ref32 = (xq.float() @ w.data.float().t()) * sx * w.scale[None, :]
    peers = {
        "scaled_mm": timed(lambda i: mm(copies[i % len(copies)])),
        "quant+scaled_mm": timed(lambda i: _scaled_mm(x, copies[i % len(copies)], None)),
        "bf16": timed(lambda i: torch.nn.functional.linear(x, bf16_copies[i % len(bf16_copies)])),
    }
    if m == 1:
        peers["gemv"] = timed(lambda i: gemv(x, copies[i % len(copies)]))
    for name, us in peers.items():
        print(f"{shape:8s} M={m:2d} peer {name:16s} {us:8.2f} us {size / us / 1e6:5.2f} TB/s of FP8 bytes",
              flush=True)  # fmt: skip

    dflt = default_skinny_config(m, n, k, num_sms(x.device))
    cands = [dflt] + [c for c in grid(m, quick) if c != dflt]
    rows = []
    for cfg in cands:
        if time.perf_counter() > deadline and rows:
            print(f"  (budget spent: {shape} M={m} stops after {len(rows)} of {len(cands)} configs)")
            break
        row = {"shape": shape, "m": m, "config": dataclasses.asdict(cfg), "default": cfg == dflt}
        try:
            got = fp8_skinny_gemm(xq, sx, w.data, w.scale, config=cfg)
            row |= {"rel_err_scaled_mm": rel_err(got, ref_mm), "rel_err_fp32": rel_err(got, ref32)}
            if max(row["rel_err_scaled_mm"], row["rel_err_fp32"]) <= WRONG:
                us = timed(skinny(cfg))
                row |= {"us": us, "tb_per_s": size / us / 1e6}
        except Exception as e:  # a config the compiler or the launch refuses (shared memory, registers)
            row["error"] = repr(e)[:300]
        rows.append(row)
        if "us" in row:
            pct = 100 * row["tb_per_s"] / HBM_TB_S
            result = (
                f"{row['us']:8.2f} us {row['tb_per_s']:5.2f} TB/s ({pct:3.0f}%) err {row['rel_err_fp32']:.1e}"
            )
        elif "error" in row:
            result = f"error {row['error'][:80]}"
        else:
            result = (f"WRONG: err {row['rel_err_fp32']:.1e} against the float32 product, "
                      f"{row['rel_err_scaled_mm']:.1e} against _scaled_mm")  # fmt: skip
        mark = "(default)" if row["default"] else "         "
        print(f"{shape:8s} M={m:2d} {describe(cfg)} {mark} {result}", flush=True)

    summary = {"shape": shape, "m": m, "weight_mb": size / 1e6, "peers_us": peers,
               "scaled_mm_rel_err_fp32": rel_err(ref_mm, ref32)}  # fmt: skip
    ok = [r for r in rows if "us" in r]
    if not ok:
        return {"rows": rows, "summary": summary}
    top = min(ok, key=lambda r: r["us"])
    best = type(dflt)(**top["config"])
    fast = dataclasses.replace(best, fast_accum=True)

    def with_quant(i: int) -> torch.Tensor:
        q = copies[i % len(copies)]
        xq_i, sx_i = quantize_rows_fp8_padded(x)
        return fp8_skinny_gemm(xq_i[:m], sx_i[:m], q.data, q.scale, config=best)

    summary |= {
        "best": top,
        "default_us": next((r["us"] for r in ok if r["default"]), None),
        "quant+skinny_us": timed(with_quant),
        "fast_accum_us": timed(skinny(fast)),
        "fast_accum_rel_err_fp32": rel_err(fp8_skinny_gemm(xq, sx, w.data, w.scale, config=fast), ref32),
        "speedup": {name: us / top["us"] for name, us in peers.items()},
    }
    summary["speedup_with_quant"] = {
        name: peers[name] / summary["quant+skinny_us"] for name in ("quant+scaled_mm", "bf16")
    }
    return {"rows": rows, "summary": summary}


def report(summaries: list[dict]) -> None:
    from trtforge.kernels.fp8_skinny import SkinnyConfig

    print("\nbest per (shape, M): skinny us, TB/s; each peer's us and its time over the skinny kernel's")
    for s in summaries:
        if "best" not in s:
            print(f"  {s['shape']:8s} M={s['m']:2d}: no config ran")
            continue
        t = s["best"]
        cfg = describe(SkinnyConfig(**t["config"]))
        dflt = f"{s['default_us']:.2f}" if s["default_us"] else "-"
        peers = ", ".join(
            f"{name} {us:.2f} ({s['speedup'][name]:.2f}x)" for name, us in s["peers_us"].items()
        )
        print(
            f"  {s['shape']:8s} M={s['m']:2d}: {t['us']:7.2f} us {t['tb_per_s']:5.2f} TB/s [{cfg}] "
            f"(default {dflt}); {peers}; quant+skinny {s['quant+skinny_us']:.2f} "
            f"(vs quant+scaled_mm {s['speedup_with_quant']['quant+scaled_mm']:.2f}x, "
            f"vs bf16 {s['speedup_with_quant']['bf16']:.2f}x); fast_accum {s['fast_accum_us']:.2f} "
            f"(err {s['fast_accum_rel_err_fp32']:.1e})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller grid and M = 1, 64 (~5 min)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
    ap.add_argument("--ms", default=None, help="comma-separated row counts (default 1,4,16,64; quick 1,64)")
    ap.add_argument("--budget-s", type=float, default=None, help="time budget (quick: 300 s, else 480 s)")
    ap.add_argument("--out", default=None, help="JSON of every row and the summaries")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sweep_fp8_skinny needs a CUDA GPU (Hopper: the kernel runs on wgmma); none here")
    if torch.cuda.get_device_capability() < (9, 0):
        raise SystemExit(
            f"sweep_fp8_skinny needs Hopper (sm_90) wgmma; this is {torch.cuda.get_device_name()}"
        )
    import triton

    from trtforge.kernels.fp8_skinny import MAX_ROWS
    from trtforge.kernels.qweight import quantize_fp8

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference product stays float32
    shapes = args.shapes.split(",")
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; known: {list(SHAPES)}")
    ms = [int(v) for v in args.ms.split(",")] if args.ms else list(QUICK_MS if args.quick else MS)
    if not all(1 <= m <= MAX_ROWS for m in ms):
        raise SystemExit(f"--ms: the skinny kernel takes 1..{MAX_ROWS} rows, got {ms}")
    budget = args.budget_s if args.budget_s is not None else (300.0 if args.quick else 480.0)
    t0 = time.perf_counter()
    rows: list[dict] = []
    summaries: list[dict] = []
    pairs_left = len(shapes) * len(ms)
    g = torch.Generator(device="cuda").manual_seed(0)
    for shape in shapes:
        n, k = SHAPES[shape]
        wb = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02
        w = quantize_fp8(wb)
        copies = fp8_copies(w)
        bf16_count = min(LAUNCHES, math.ceil(L2_DEFEAT_BYTES / (wb.numel() * 2)))
        bf16_copies = [wb] + [wb.clone() for _ in range(bf16_count - 1)]
        for m in ms:
            now = time.perf_counter()
            deadline = now + max(0.0, t0 + budget - now) / pairs_left
            pairs_left -= 1
            pair = sweep_pair(shape, m, w, copies, bf16_copies, args.quick, deadline)
            rows += pair["rows"]
            summaries.append(pair["summary"])
        del wb, w, copies, bf16_copies
        torch.cuda.empty_cache()
    report(summaries)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "quick": args.quick,
        "seconds": round(time.perf_counter() - t0, 1),
        "hbm_tb_per_s": HBM_TB_S,
        "rows": rows,
        "summaries": summaries,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"seconds": result["seconds"], "configs": len(rows)}))


if __name__ == "__main__":
    main()
