"""Sweep: the contiguous decode kernel over launch configurations x split counts vs cuDNN, same run.

    PYTHONPATH=. python3 benchmarks/sweep_decode_configs.py --out build/sweep_decode [--rep 25]

For each shape of benchmarks/bench_decode_attention.py (FP16, Hq=32, Hkv=8, D=128, q_len 1, every
sequence at full length L): cuDNN SDPA (``enable_gqa=True``) is timed before and after the candidates
(the two medians bound the run's drift), then every candidate (block_n, warps, stages, TMA) at each
of the shape's split counts. Splits > 1 are timed both ways: one fused kernel on a zeroed workspace
(``decode_attention_raw(..., counters_zeroed=True)``) and with the reduction as a second kernel (what
``decode_attention`` captures in a CUDA graph without a caller's workspace). Every time is the median
of CUDA-graph replays (triton.testing.do_bench_cudagraph); every output is checked against cuDNN's.
Writes sweep.md and sweep.json under --out (the data behind decode_kernel's split rule and candidates).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from trtforge.kernels import decode_attention as decode_kernel
from trtforge.kernels.decode_attention import DecodeConfig, decode_attention_raw, workspace_elements

# (block_n, num_warps, num_stages, tma)
CANDIDATES = [
    (64, 4, 3, False), (128, 4, 2, False), (128, 4, 3, False), (64, 4, 4, False), (128, 8, 3, False),
    (64, 4, 3, True), (64, 4, 4, True), (64, 4, 6, True), (128, 4, 2, True), (128, 4, 3, True),
    (128, 8, 3, True), (64, 8, 4, True),
]  # fmt: skip
# B x L -> split counts timed (around the best of the earlier split sweep)
SPLITS = {
    (1, 32768): [8, 16, 24, 32],
    (4, 16384): [4, 6, 8],
    (16, 4096): [1, 2],
    (64, 8192): [1, 2],
    (128, 2048): [1],
    (256, 1024): [1],
}
PEAK_TBS = 4.8
AGREE_TOL = 4e-3


def _graph_us(fn, rep: int) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def _shape(b: int, length: int, splits: list[int], rep: int) -> list[dict]:
    """Rows {config, splits, fused us, two-kernel us, max error} for one shape, cuDNN rows first."""
    hq, hkv, d = 32, 8, 128
    q = torch.randn(b, hq, 1, d, dtype=torch.float16, device="cuda")
    k = torch.randn(b, hkv, length, d, dtype=torch.float16, device="cuda")
    v = torch.randn(b, hkv, length, d, dtype=torch.float16, device="cuda")
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    ws = torch.zeros(workspace_elements(b, hq, 1, d, max(splits)) + 1, dtype=torch.int32, device="cuda")

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, enable_gqa=True)

    ref = cudnn().float()
    rows = [{"impl": "cudnn (before)", "us": _graph_us(cudnn, rep)}]
    for bn, warps, stages, tma in CANDIDATES:
        if not decode_kernel._fits(bn, stages, d):
            continue
        for n in splits:
            cfg = DecodeConfig(bn, warps, stages, n, tma=tma)

            def run(cfg: DecodeConfig = cfg, n: int = n, fused: bool = True) -> torch.Tensor:
                decode_attention_raw(
                    q, k, v, lens, None, out, scale=d**-0.5, config=cfg, splits=n, workspace=ws,
                    stream=0, counters_zeroed=fused,
                )  # fmt: skip
                return out

            row = {"impl": f"{bn}, {warps}, {stages}, {'tma' if tma else 'ptr'}", "splits": n}
            try:
                row["err"] = (run().float() - ref).abs().max().item()
                row["us"] = _graph_us(run, rep)
                if n > 1:
                    row["us_2k"] = _graph_us(lambda run=run: run(fused=False), rep)
            except Exception as exc:  # out of resources etc.: record and keep going
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
            rows.append(row)
            print(b, length, row, flush=True)
    rows.append({"impl": "cudnn (after)", "us": _graph_us(cudnn, rep)})
    return rows


def _markdown(results: dict) -> str:
    lines = [
        "| B x L | config (block_n, warps, stages, loads) | splits | us fused | us 2-kernel | x cuDNN "
        "(fused) | x cuDNN (2-kernel) | BW fused | max err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, rows in results.items():
        b, length = (int(x) for x in shape.split("x"))
        kv = 2 * b * 8 * length * 128 * 2
        cud = [r["us"] for r in rows if r["impl"].startswith("cudnn")]
        base = min(cud)
        lines.append(f"| {shape} | cuDNN before / after | | {cud[0]:.1f} / {cud[1]:.1f} | | | | "
                     f"{100 * kv / (base * 1e-6) / 1e12 / PEAK_TBS:.0f}% | |")  # fmt: skip
        for r in rows:
            if r["impl"].startswith("cudnn"):
                continue
            if "error" in r:
                lines.append(f"| {shape} | {r['impl']} | {r['splits']} | {r['error']} | | | | | |")
                continue
            two = r.get("us_2k")
            bw = 100 * kv / (r["us"] * 1e-6) / 1e12 / PEAK_TBS
            flag = " DISAGREE" if r["err"] > AGREE_TOL else ""
            lines.append(
                f"| {shape} | {r['impl']} | {r['splits']} | {r['us']:.1f} | {f'{two:.1f}' if two else ''} "
                f"| {base / r['us']:.3f} | {f'{base / two:.3f}' if two else ''} | {bw:.0f}% "
                f"| {r['err']:.1e}{flag} |"
            )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/sweep_decode"))
    ap.add_argument("--rep", type=int, default=25, help="ms of replays per median")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for (b, length), splits in SPLITS.items():
        torch.cuda.empty_cache()
        results[f"{b}x{length}"] = _shape(b, length, splits, args.rep)
        (args.out / "sweep.json").write_text(json.dumps(results, indent=1))
        (args.out / "sweep.md").write_text(_markdown(results))
    meta = f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}, Triton {triton.__version__}"
    text = f"FP16, Hq=32, Hkv=8, D=128, q_len 1; {meta}; cuDNN {torch.backends.cudnn.version()}.\n\n"
    text += _markdown(results)
    (args.out / "sweep.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
