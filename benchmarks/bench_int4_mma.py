"""One-row INT4 GEMVs at Llama-3-8B shapes: the tensor-core kernel (trtforge.kernels.int4_mma) against
the FMA kernel's default config (trtforge.kernels.gemv), side by side in one process.

    PYTHONPATH=. python3 benchmarks/bench_int4_mma.py --out benchmarks/results/int4_mma.json

Each shape (qkv + norm, o + residual, gate_up + norm + SiLU, down + residual) is checked against its
float32 reference (``x @ dequantize(W)^T`` with the eager rounding) and timed as a CUDA graph of 20
launches over rotated weight copies (the L2 holds none of them): us per launch and TB/s of INT4 bytes
(codes + float16 scales and offsets; H200 HBM3e peak 4.8 TB/s). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from benchmarks.sweep_quant_gemv import (
    L2_DEFEAT_BYTES,
    LAUNCHES,
    SHAPES,
    clone,
    nbytes,
    op,
    reference,
    timed,
    weights,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--warps", type=int, nargs="*", default=[], help="int4_mma.MMA_WARPS values to force")
    ap.add_argument(
        "--groups", type=int, nargs="*", default=[1], help="with --warps: GROUPS_PER_ITERATION, 1 or 2"
    )
    ap.add_argument(
        "--early",
        nargs="+",
        choices=("off", "on"),
        default=["on"],
        help="int4_mma.EARLY_WEIGHTS (PDL launch, first words prefetched before the wait; on by default); "
        "'on off' times both, the first named is the 'mma' row",
    )
    ap.add_argument(
        "--maxnreg", type=int, nargs="*", default=[], help="int4_mma.MAXNREG values to time besides ptxas's"
    )
    ap.add_argument(
        "--prologue",
        action="store_true",
        help="also time int4_mma.FIRST_LOADS_EARLY off (on by default) and ONE_PASS_NORM on, each alone "
        "and both (rows mma-nofirst, mma-onepass, mma-nofirst-onepass)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_int4_mma needs a CUDA GPU")
    from trtforge.kernels import int4_mma
    from trtforge.kernels.gemv import _num_sms, default_config

    early_default = int4_mma.EARLY_WEIGHTS
    first_default, one_pass_default = int4_mma.FIRST_LOADS_EARLY, int4_mma.ONE_PASS_NORM
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = _num_sms(torch.device("cuda"))
    rows = []
    t0 = time.perf_counter()
    for shape in args.shapes.split(","):
        n, k, _norm, gated, _res = SHAPES[shape]
        w, wf = weights("int4", 2 * n if gated else n, k, g)
        size = nbytes(w)
        copies = [w] + [clone(w) for _ in range(min(LAUNCHES, math.ceil(L2_DEFEAT_BYTES / size)) - 1)]
        for c in copies:
            int4_mma.mma_words(c)  # packed before the graph capture
        x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
        nw = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
        res = torch.randn(1, n, device="cuda", generator=g, dtype=torch.bfloat16)
        want = reference(shape, x, nw, res, wf)
        runs = [("fma", default_config(1, n, k, gated, sms, "int4"), None, None)]
        runs += [("mma" if e == args.early[0] else f"mma-early-{e}", None, (None, None), e)
                 for e in args.early]  # fmt: skip
        runs += [(f"mma-w{wp}-u{u}", None, (wp, u), args.early[0]) for wp in args.warps for u in args.groups]
        runs += [(f"mma-r{r}", None, (None, None), args.early[0]) for r in args.maxnreg if r]
        if args.prologue:
            runs += [
                (n, None, (None, None), args.early[0])
                for n in ("mma-nofirst", "mma-onepass", "mma-nofirst-onepass")
            ]
        for name, cfg, setting, early in runs:
            int4_mma.EARLY_WEIGHTS = early == "on"
            int4_mma.MAXNREG = int(name[len("mma-r") :]) if name.startswith("mma-r") else None
            int4_mma.FIRST_LOADS_EARLY = "-nofirst" not in name and ("-first" in name or first_default)
            int4_mma.ONE_PASS_NORM = "onepass" in name or one_pass_default
            if setting is not None:
                int4_mma.MMA_WARPS, int4_mma.GROUPS_PER_ITERATION = setting
                if not int4_mma.supported(x, w, n, gated, _norm):
                    print(f"{shape:8s} {name}: not taken here (the FMA kernel runs it)")
                    continue
            got = op(shape, x, nw, res, w, cfg).float()
            err = ((got - want).norm() / want.norm()).item()
            us = timed(shape, x, nw, res, copies, cfg)
            row = {"shape": shape, "kernel": name, "us": us, "tb_per_s": size / us / 1e6, "rel_err": err,
                   "weight_mb": size / 1e6}  # fmt: skip
            rows.append(row | {"warps_groups": setting, "early_weights": early})
            print(f"{shape:8s} {name}: {us:8.2f} us {row['tb_per_s']:5.2f} TB/s err {err:.1e}", flush=True)
        int4_mma.MMA_WARPS, int4_mma.GROUPS_PER_ITERATION = None, None
        int4_mma.EARLY_WEIGHTS = early_default
        int4_mma.MAXNREG = None
        int4_mma.FIRST_LOADS_EARLY, int4_mma.ONE_PASS_NORM = first_default, one_pass_default
        del copies, w, wf
        torch.cuda.empty_cache()
    per_layer = {kern: sum(r["us"] for r in rows if r["kernel"] == kern) for kern in ("fma", "mma")}
    print(f"per layer (the shapes above): fma {per_layer['fma']:.2f} us, mma {per_layer['mma']:.2f} us")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
           "per_layer_us": per_layer, "seconds": time.perf_counter() - t0}  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
