"""Sweep the decode GEMVs' launch configs for BF16, FP8 (W8A16) and INT4 weights at Llama-3-8B shapes.

    python -m benchmarks.sweep_quant_gemv --quick --out benchmarks/results/sweep_quant_gemv.json

Shapes: the fused layer's four projections, qkv [6144, 4096] with the RMSNorm prologue, o [4096,
4096] + residual, gate_up [2 x 14336, 4096] with norm and SiLU*mul, down [4096, 14336] + residual;
and lm_head [128256, 4096] with the final norm (BF16 unless quantized: ``--shapes`` picks). M = 1 for
every format, and M = 2, 4, 8 for INT4 (the GEMV serves INT4 up to 16 tokens; --quick: M = 4).

Each (shape, format, M, config) is first checked against its float reference (float32
``x @ dequantize(W)^T``, the same norm rounding, SiLU and residual), then timed as a CUDA graph of 20
launches rotating over enough weight copies to defeat the L2 (median of the replays): us per launch
and TB/s of weight bytes (codes + scales + offsets; H200 HBM3e peak 4.8 TB/s). Prints a table, the
best config per (shape, format, M) next to ``default_config``'s, then the per-token FP8 activation
quantization kernel (:mod:`trtforge.kernels.fp8_rows`) and ``torch._scaled_mm`` at M = 1..4096
(graph-timed: no host overhead). ``--quick``: a smaller grid (~3 min on an H200 with Triton's
compiles); ``--loops plain,reduce`` (the default) times each one-row 16-bit / FP8 config with partials
kept to the end and summed each chunk (``GemvConfig.reduce``); ``--budget-s`` is
split evenly over the (shape, format, M) entries, each trying the configs nearest its default first and
starting no new one past its share.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import time
from pathlib import Path

import torch

from benchmarks.bench_decode_layer import graph_us

SHAPES = {  # name: (output rows (gate/up: pairs), K, norm, gated, residual)
    "qkv": (6144, 4096, True, False, False),
    "o": (4096, 4096, False, False, True),
    "gate_up": (14336, 4096, True, True, False),
    "down": (4096, 14336, False, False, True),
    "lm_head": (128256, 4096, True, False, False),
}
DEFAULT_SHAPES = ("qkv", "o", "gate_up", "down")
LAUNCHES = 20  # per graph
LOOPS = {"plain": False, "reduce": True}  # one-row GEMV loops: GemvConfig.reduce
L2_DEFEAT_BYTES = 256e6  # weight copies rotated per graph: at least this many bytes in all


def grid(fmt: str, m: int, gated: bool, quick: bool) -> list:
    """Candidate configs (block_n counts gate/up pairs when gated)."""
    from trtforge.kernels.gemv import GemvConfig

    if fmt == "bf16":
        rows, bks, warps = ((2, 4), (512, 1024), (4,)) if quick else ((2, 4, 8), (256, 512, 1024), (4, 8))
        stages = (1,)
    elif fmt == "fp8":
        rows, bks = ((4, 8), (1024, 2048)) if quick else ((2, 4, 8), (512, 1024, 2048, 4096))
        warps, stages = ((4, 8), (1,)) if quick else ((4, 8), (1, 2))
    else:
        rows = (4, 8) if quick else (2, 4, 8, 16)
        bks = (2048, 4096) if quick else (1024, 2048, 4096)
        warps, stages = ((4,), (1,)) if quick else ((2, 4, 8), (1,))
        if m > 1:
            rows, bks = ((4,), (4096,)) if quick else ((2, 4, 8), bks)
    out = []
    for r, bk, w, st in itertools.product(rows, bks, warps, stages):
        bn = r // (2 if gated else 1)
        if bn >= 1:
            out.append(GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=st, dot=False))
    return list(dict.fromkeys(out))


def nearest_first(cands: list, dflt) -> list:
    """`cands` ordered by how many launch parameters differ from `dflt` (stable): under a time budget
    the default's neighbours are timed before the far corners of the grid."""
    fields = [f.name for f in dataclasses.fields(dflt)]
    return sorted(cands, key=lambda c: sum(getattr(c, f) != getattr(dflt, f) for f in fields))


def weights(fmt: str, n_rows: int, k: int, g: torch.Generator):
    """A random BF16 weight [n_rows, K] (std 0.02) in `fmt`, and its float32 dequantized values."""
    from trtforge.kernels.qweight import quantize_fp8, quantize_int4

    w = torch.randn(n_rows, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02
    if fmt == "bf16":
        return w, w.float()
    q = quantize_fp8(w) if fmt == "fp8" else quantize_int4(w)
    return q, q.dequantize()


def nbytes(w) -> int:
    return w.numel() * w.element_size() if isinstance(w, torch.Tensor) else int(w.nbytes)


def clone(w):
    from trtforge.kernels.qweight import Fp8Weight, Int4Weight

    if isinstance(w, torch.Tensor):
        return w.clone()
    if isinstance(w, Fp8Weight):
        return Fp8Weight(w.data.clone(), w.scale.clone())
    return Int4Weight(w.packed.clone(), w.scale.clone(), w.offset.clone())


def reference(shape: str, x, nw, res, wf) -> torch.Tensor:
    """float32 reference of the fused op (norm rounded to BF16 as the eager path, SiLU*mul, residual)."""
    n, _, norm, gated, has_res = SHAPES[shape]
    xf = x.float()
    if norm:
        xn = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype).float()
        xf = (xn * nw.float()).to(x.dtype).float()
    y = xf @ wf.t()
    if gated:
        gt, up = y.to(x.dtype).float().split(n, dim=1)
        y = torch.nn.functional.silu(gt).to(x.dtype).float() * up
    if has_res:
        y = y + res.float()
    return y


def op(shape: str, x, nw, res, w, cfg):
    from trtforge.kernels.gemv import gemv_residual, norm_gate_up_silu, norm_gemv

    _, _, norm, gated, _ = SHAPES[shape]
    if gated:
        return norm_gate_up_silu(x, nw, 1e-5, w, config=cfg)
    if norm:
        return norm_gemv(x, nw, 1e-5, w, config=cfg)
    return gemv_residual(x, w, res, config=cfg)


def timed(shape: str, x, nw, res, copies: list, cfg) -> float:
    """us per launch of LAUNCHES launches in one CUDA graph, rotating over the weight `copies`."""
    return graph_us(
        lambda: [op(shape, x, nw, res, copies[i % len(copies)], cfg) for i in range(LAUNCHES)],
        LAUNCHES, reps=7, inner=3,
    )  # fmt: skip


def ms_for(fmt: str, quick: bool) -> tuple[int, ...]:
    """The row counts swept for a format: M = 1 for every format; INT4 (served up to 16 tokens) more."""
    return ((1, 4) if quick else (1, 2, 4, 8)) if fmt == "int4" else (1,)


def sweep_gemv(
    quick: bool,
    formats: list[str],
    t0: float,
    budget: float,
    shapes: list[str],
    loops: tuple[str, ...] = tuple(LOOPS),
) -> tuple[list[dict], list[dict]]:
    """Every (shape, format, M) of `shapes` x `formats`, its configs nearest the default first, each under
    every one-row loop of `loops` (:data:`LOOPS`; one-row 16-bit and FP8 GEMVs only, the others run
    "plain"); the budget is split evenly over them, so a long grid on one shape does not starve the next."""
    from trtforge.kernels.gemv import _num_sms, default_config

    rows: list[dict] = []
    best: list[dict] = []
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = _num_sms(torch.device("cuda"))
    entries = sum(len(ms_for(f, quick)) for f in formats) * len(shapes)
    done = 0
    for shape in shapes:
        n, k, _norm, gated, _res = SHAPES[shape]
        for fmt in formats:
            w, wf = weights(fmt, 2 * n if gated else n, k, g)
            size = nbytes(w)
            copies = [w] + [clone(w) for _ in range(min(LAUNCHES, math.ceil(L2_DEFEAT_BYTES / size)) - 1)]
            for m in ms_for(fmt, quick):
                done += 1
                deadline = t0 + budget * done / entries
                x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
                nw = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
                res = torch.randn(m, n, device="cuda", generator=g, dtype=torch.bfloat16)
                want = reference(shape, x, nw, res, wf)
                kind = "plain" if fmt == "bf16" else fmt
                dflt = default_config(m, n, k, gated, sms, kind)
                cands = [dflt, *nearest_first([c for c in grid(fmt, m, gated, quick) if c != dflt], dflt)]
                results = []
                one_row = m == 1 and fmt != "int4"
                runs = [dataclasses.replace(c, reduce=LOOPS[lp]) for c in cands for lp in loops
                        if one_row or lp == "plain"]  # fmt: skip
                runs = list(dict.fromkeys([dflt, *runs]))
                for cfg in runs:
                    lp = "reduce" if cfg.reduce else "plain"
                    if time.perf_counter() > deadline and results:
                        print(f"  (budget spent: {shape} {fmt} M={m} stops after {len(results)} configs)")
                        break
                    row = {"shape": shape, "format": fmt, "m": m, "config": dataclasses.asdict(cfg),
                           "loop": lp, "default": cfg == dflt,
                           "weight_mb": size / 1e6}  # fmt: skip
                    try:
                        got = op(shape, x, nw, res, w, cfg).float()
                        row["rel_err"] = ((got - want).norm() / want.norm()).item()
                        us = timed(shape, x, nw, res, copies, cfg)
                        row |= {"us": us, "tb_per_s": size / us / 1e6}
                    except Exception as e:  # a config the compiler refuses (shared memory, registers)
                        row["error"] = repr(e)[:300]
                    rows.append(row)
                    results.append(row)
                    flag = "" if row.get("rel_err", 1) < 2e-2 else "  <-- WRONG"
                    c = cfg
                    print(
                        f"{shape:8s} {fmt:5s} M={m} bn={c.block_n:2d} bk={c.block_k:5d} w={c.num_warps} "
                        f"st={c.num_stages} {lp:15s} {'(default)' if row['default'] else '         '} "
                        + (
                            f"{row['us']:8.2f} us {row['tb_per_s']:5.2f} TB/s err {row['rel_err']:.1e}{flag}"
                            if "us" in row
                            else f"error {row.get('error', '')[:80]}"
                        ),
                        flush=True,
                    )
                ok = [r for r in results if "us" in r and r["rel_err"] < 2e-2]
                if ok:
                    top = min(ok, key=lambda r: r["us"])
                    d = next((r for r in ok if r["default"]), None)
                    by_loop = {lp: min((r["us"] for r in ok if r["loop"] == lp), default=None)
                               for lp in LOOPS}  # fmt: skip
                    best.append({"shape": shape, "format": fmt, "m": m, "best": top,
                                 "default_us": d["us"] if d else None,
                                 "best_us_by_loop": by_loop})  # fmt: skip
            del copies, w, wf
            torch.cuda.empty_cache()
    return rows, best


def _mm(xq: torch.Tensor, sx: torch.Tensor, q) -> torch.Tensor:
    return torch._scaled_mm(xq, q.data.t(), scale_a=sx, scale_b=q.scale[None, :], out_dtype=torch.bfloat16)


def act_quant(quick: bool) -> list[dict]:
    """fp8_rows + _scaled_mm per M, graph-timed (the W8A8 path of quant_linear)."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.qweight import quantize_fp8, quantize_rows_fp8
    from trtforge.llm.quant.linear import _scaled_mm

    out = []
    g = torch.Generator(device="cuda").manual_seed(1)
    for n, k in ((6144, 4096), (4096, 14336)):
        q = quantize_fp8(torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02)
        for m in (1, 16, 256, 4096) if quick else (1, 16, 64, 256, 1024, 4096):
            x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            xq, sx = quantize_rows_fp8_padded(x)
            wq, _ = quantize_rows_fp8(x)
            exact = bool(torch.equal(xq[:m].float(), wq.float()))
            t_q = graph_us(lambda x=x: [quantize_rows_fp8_padded(x) for _ in range(LAUNCHES)], LAUNCHES)
            t_mm = graph_us(lambda xq=xq, sx=sx, q=q: [_mm(xq, sx, q) for _ in range(LAUNCHES)], LAUNCHES)
            t_all = graph_us(lambda x=x, q=q: [_scaled_mm(x, q, None) for _ in range(LAUNCHES)], LAUNCHES)
            flops = 2 * m * n * k
            row = {"n": n, "k": k, "m": m, "codes_equal_torch": exact, "quant_us": t_q,
                   "quant_gb_per_s": m * k * 3 / t_q / 1e3, "scaled_mm_us": t_mm, "with_quant_us": t_all,
                   "scaled_mm_tflops": flops / t_mm / 1e6,
                   "with_quant_tflops": flops / t_all / 1e6}  # fmt: skip
            out.append(row)
            print(
                f"act-quant [{m:5d}, {k}] -> N {n}: quant {t_q:7.2f} us ({row['quant_gb_per_s']:6.0f} GB/s) "
                f"scaled_mm {t_mm:8.2f} us, both {t_all:8.2f} us ({row['with_quant_tflops']:6.1f} TFLOP/s) "
                f"codes==torch {exact}",
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller config grid (~3 min)")
    ap.add_argument("--formats", default="bf16,fp8,int4")
    ap.add_argument("--budget-s", type=float, default=None, help="GEMV sweep time budget (quick: 150 s)")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--no-act-quant", action="store_true", help="skip the FP8 activation-quantization part")
    ap.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help=f"comma-separated one-row GEMV loops to time each config under, of {', '.join(LOOPS)}",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        raise SystemExit(f"--shapes: unknown {unknown}; expected a comma-separated subset of {list(SHAPES)}")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    budget = args.budget_s if args.budget_s is not None else (150.0 if args.quick else 900.0)
    t0 = time.perf_counter()
    loops = tuple(args.loops.split(","))
    if unknown := [lp for lp in loops if lp not in LOOPS]:
        raise SystemExit(f"--loops: unknown {unknown}; expected a comma-separated subset of {list(LOOPS)}")
    rows, best = sweep_gemv(args.quick, args.formats.split(","), t0, budget, shapes, loops)
    print("\nbest per (shape, format, M):")
    for b in best:
        t = b["best"]
        d = f"{b['default_us']:.2f}" if b["default_us"] else "-"
        print(
            f"  {b['shape']:8s} {b['format']:5s} M={b['m']}: {t['us']:8.2f} us {t['tb_per_s']:5.2f} TB/s "
            f"{t['config']} {t['loop']} (default {d} us; best by loop {b['best_us_by_loop']})"
        )
    aq = act_quant(args.quick) if "fp8" in args.formats and not args.no_act_quant else []
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "quick": args.quick,
        "seconds": round(time.perf_counter() - t0, 1),
        "gemv": rows,
        "best": best,
        "act_quant": aq,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"seconds": result["seconds"], "configs": len(rows)}))


if __name__ == "__main__":
    main()
