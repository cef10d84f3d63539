"""Sweep the fused MoE layer's launch configs (trtforge.kernels.moe.MoeConfig) at real models' expert shapes.

    python -m benchmarks.sweep_moe_tiles --out benchmarks/results/sweep_moe_tiles.json [--budget-s 400]

For each expert shape of ``bench_moe.SHAPES`` (H, I, E, k; BF16, the routing given) and each token count
(``--tokens``, default 1, 8, 64, 256, 1024, 4096), every candidate config (:data:`CANDIDATES`: the block
rows, then the gate_up and down tiles ``[block_n, block_k, warps, stages]``; ``--candidates`` a JSON list
of the same) runs the layer through ``fused_moe(config=...)``: checked against the default config's output
(relative max difference; above 1e-2 the row is marked WRONG and not ranked), then timed as a CUDA graph
rotating over enough weight copies that the weights come from HBM (``bench_moe``'s timing), median of the
replays, µs a layer. The default table's choice (:func:`trtforge.kernels.moe.moe_config`) is timed the same
way in the same run.

Printed: per (shape, tokens) the rows an expert gets on average (tokens x k / E: what the table is keyed
by), the default's µs, the best candidate and its speed-up. The table in ``trtforge.kernels.moe.MOE_CONFIGS``
is then set from where candidates win across shapes at each rows-per-expert range, not from one shape.
``--budget-s`` stops starting new shapes after that many seconds (a device command runs at most 10 min).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    import tests.kernels.conftest  # noqa: F401  (Triton's interpreter, set up as the kernel tests do)

import torch

from benchmarks.bench_moe import CPU_SHAPES, L2_BYTES, SHAPES, _eager_us, _graph_us, _routing

# [block_m, up tile, down tile]; a tile is [block_n, block_k, warps, stages]. The three of the default
# table first, then wider/narrower variants around them.
CANDIDATES: list[list] = [
    [16, [32, 128, 4, 4], [64, 128, 4, 4]],
    [32, [64, 128, 4, 3], [128, 64, 4, 3]],
    [64, [128, 64, 8, 3], [256, 64, 8, 3]],
    [16, [64, 128, 4, 3], [128, 128, 4, 3]],
    [16, [64, 64, 4, 4], [64, 64, 4, 4]],
    [32, [64, 64, 4, 4], [64, 64, 4, 4]],
    [32, [128, 64, 4, 3], [128, 64, 4, 3]],
    [64, [64, 64, 4, 4], [128, 64, 4, 3]],
    [64, [128, 64, 4, 4], [128, 64, 4, 4]],
    [64, [64, 128, 4, 3], [128, 64, 4, 3]],
    [128, [128, 64, 8, 3], [128, 64, 8, 3]],
    [128, [256, 64, 8, 3], [128, 64, 8, 4]],
]


def _config(spec: list):
    from trtforge.kernels.moe import MoeConfig, MoeTile

    bm, up, down = spec
    return MoeConfig(int(bm), MoeTile(*up), MoeTile(*down))


def sweep_shape(name: str, shape, tokens, candidates: list[list], reps: int, dev: torch.device) -> list[dict]:
    """One row per (token count, candidate or the default): µs a layer and its check against the default
    (on the CPU: Triton's interpreter, float32, eager times that only check that the script runs)."""
    from trtforge.kernels.moe import fused_moe, moe_config

    h, i, e, k = shape
    gpt_oss = name.startswith("gpt-oss")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    expert_bytes = 3 * h * i * 2
    copies = max(1, min(16, -(-L2_BYTES // (k * expert_bytes)))) if dev.type == "cuda" else 1
    g = torch.Generator(dev).manual_seed(0)
    up_shape, down_shape = ((e, h, 2 * i), (e, i, h)) if gpt_oss else ((e, 2 * i, h), (e, h, i))
    gate_up = [torch.randn(up_shape, generator=g, device=dev, dtype=dtype) / h**0.5 for _ in range(copies)]
    down = [torch.randn(down_shape, generator=g, device=dev, dtype=dtype) / i**0.5 for _ in range(copies)]
    opts: dict = {}
    if gpt_oss:
        opts = {"transposed": True, "interleaved": True, "activation": "gpt_oss_swiglu", "alpha": 1.702}
        opts["limit"] = 7.0
    rows = []
    for n in tokens:
        routings = [_routing(n, e, k, dev, dtype, seed=n * 100 + c) for c in range(copies)]
        x = torch.randn(n, h, generator=g, device=dev, dtype=dtype)
        default = moe_config(n, k, e)
        w0, ex0 = routings[0]
        want = fused_moe(x, gate_up[0], down[0], w0, ex0, config=default, **opts).float()
        specs = [("default", default)] + [(json.dumps(c), _config(c)) for c in candidates]
        for label, cfg in specs:

            def run(cfg=cfg, x=x, routings=routings):
                for c, (w, ex) in enumerate(routings):
                    fused_moe(x, gate_up[c], down[c], w, ex, config=cfg, **opts)

            row = {"shape": name, "tokens": n, "rows_per_expert": n * k / e, "config": label}
            try:
                got = fused_moe(x, gate_up[0], down[0], w0, ex0, config=cfg, **opts).float()
                err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
                row["rel_diff_vs_default"] = err
                timed = _graph_us(run, reps) if dev.type == "cuda" else _eager_us(run, dev, reps)
                row["us"] = timed / copies
                row["wrong"] = err > 1e-2
            except Exception as exc:  # a config this GPU cannot launch (shared memory): recorded, not ranked
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per (shape, tokens): the default's µs, the best valid candidate and the default's time over it."""
    out = []
    keys = sorted({(r["shape"], r["tokens"]) for r in rows}, key=lambda t: (t[0], t[1]))
    for shape, n in keys:
        group = [r for r in rows if r["shape"] == shape and r["tokens"] == n and "us" in r]
        base = next((r for r in group if r["config"] == "default"), None)
        valid = [r for r in group if r["config"] != "default" and not r["wrong"]]
        if base is None or not valid:
            continue
        best = min(valid, key=lambda r: r["us"])
        out.append(
            {
                "shape": shape,
                "tokens": n,
                "rows_per_expert": base["rows_per_expert"],
                "default_us": base["us"],
                "best": best["config"],
                "best_us": best["us"],
                "speedup": base["us"] / best["us"],
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", type=str, default=None, help="comma-separated names of bench_moe.SHAPES")
    ap.add_argument("--tokens", type=str, default="1,8,64,256,1024,4096")
    ap.add_argument("--candidates", type=str, default=None, help="JSON list of [block_m, up, down]")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=float("inf"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "sweep_moe_tiles: no CUDA device (--device cpu checks the script in the interpreter)"
        )
    known = CPU_SHAPES if dev.type == "cpu" else SHAPES
    names = args.shapes.split(",") if args.shapes else list(known)
    unknown = sorted(set(names) - set(known))
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; known: {sorted(known)}")
    tokens = [int(t) for t in args.tokens.split(",")]
    candidates = json.loads(args.candidates) if args.candidates else CANDIDATES
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (Triton interpreter)"
    out: dict = {"device": device, "torch": torch.__version__, "candidates": candidates}
    out["rows"], t0 = [], time.perf_counter()
    for name in names:
        if time.perf_counter() - t0 > args.budget_s:
            out.setdefault("skipped", []).append(name)
            continue
        out["rows"] += sweep_shape(name, known[name], tokens, candidates, args.reps, dev)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        out["summary"] = summarize(out["rows"])
        args.out.write_text(json.dumps(out, indent=1))
    out["seconds"] = time.perf_counter() - t0
    args.out.write_text(json.dumps(out, indent=1))
    for s in out.get("summary", []):
        print(
            f"{s['shape']:>20} {s['tokens']:>5} tok ({s['rows_per_expert']:7.1f} rows/expert): default "
            f"{s['default_us']:8.1f} us, best {s['best_us']:8.1f} ({s['speedup']:.2f}x) {s['best']}"
        )
    print(f"wrote {args.out} ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
