"""Benchmark: trtforge's Triton flash-attention forward vs every torch SDPA backend, same run.

    PYTHONPATH=. python3 benchmarks/bench_attention_kernel.py --out build/bench_attention

Cases: FP16 and BF16, B=8, H=16, D=64 and 128, S=512..8192, causal and not (defaults). Each
implementation is timed with triton.testing.do_bench (CUDA events, L2 flushed before every
repetition, median). TFLOP/s counts 4·B·H·S²·D (halved when causal). Our kernel is autotuned on its
first call (excluded from the timing); each result is also checked against torch's output.
Writes results.json and results.md under --out and prints the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from trtforge.plugins.attention import kernel

TORCH_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
H200_DENSE_PEAK_TFLOPS = 989.0  # FP16/BF16 dense tensor-core peak from the datasheet (a lead, not measured)
AGREE_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _time_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _tflops(b: int, h: int, s: int, d: int, causal: bool, ms: float) -> float:
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def _config_name(c: triton.Config) -> str:
    return f"BM{c.kwargs['BLOCK_M']}/BN{c.kwargs['BLOCK_N']}/w{c.num_warps}/s{c.num_stages}"


def bench_case(b: int, h: int, s: int, d: int, dtype: torch.dtype, causal: bool, with_pointer: bool) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    out = torch.empty_like(q)
    kernel.flash_attention(q, k, v, causal=causal, out=out, variant="tma")  # autotune + compile
    torch.cuda.synchronize()
    best = kernel._tuned_kernel_tma.best_config
    row = {
        "dtype": str(dtype).split(".")[-1],
        "B": b, "H": h, "S": s, "D": d, "causal": causal,
        "ours_config": _config_name(best),
    }  # fmt: skip
    row["ours_ms"] = _time_ms(lambda: kernel.flash_attention(q, k, v, causal=causal, out=out, variant="tma"))
    row["ours_tflops"] = _tflops(b, h, s, d, causal, row["ours_ms"])
    row["ours_pointer_tflops"] = None
    if with_pointer:  # the same kernel with pointer loads instead of tensor descriptors
        out_p = torch.empty_like(q)
        kernel.flash_attention(q, k, v, causal=causal, out=out_p, variant="pointer")
        ms = _time_ms(lambda: kernel.flash_attention(q, k, v, causal=causal, out=out_p, variant="pointer"))
        row["ours_pointer_tflops"] = _tflops(b, h, s, d, causal, ms)
        row["pointer_vs_tma_max_diff"] = (out_p.float() - out.float()).abs().max().item()
    diffs = {}
    for name, backend in TORCH_BACKENDS.items():
        try:
            with sdpa_kernel([backend]):
                ref = sdpa(q, k, v, is_causal=causal)
                torch.cuda.synchronize()
                ms = _time_ms(lambda: sdpa(q, k, v, is_causal=causal))
        except RuntimeError as e:  # backend not available for this case/build
            row[f"{name}_ms"], row[f"{name}_tflops"] = None, None
            row[f"{name}_error"] = str(e).splitlines()[0][:200]
            continue
        row[f"{name}_ms"], row[f"{name}_tflops"] = ms, _tflops(b, h, s, d, causal, ms)
        diffs[name] = (out.float() - ref.float()).abs().max().item()
    timed = {n: row[f"{n}_tflops"] for n in TORCH_BACKENDS if row.get(f"{n}_tflops")}
    row["best_torch"] = max(timed, key=timed.get) if timed else None
    row["ratio_vs_best"] = row["ours_tflops"] / timed[row["best_torch"]] if timed else None
    row["max_abs_diff_vs_torch"] = max(diffs.values()) if diffs else None
    row["agrees"] = bool(diffs) and row["max_abs_diff_vs_torch"] <= AGREE_TOL[dtype]
    return row


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def to_markdown(rows: list[dict], env: dict) -> str:
    head = (
        "| dtype | D | causal | S | ours TFLOP/s | ours (pointer loads) | flash | efficient | cudnn "
        "| best torch | ours/best | % of 989 | our config | max abs diff |\n|" + "---|" * 14
    )
    lines = [
        f"Machine: {env['gpu']}; torch {env['torch']}, Triton {env['triton']}; {env['date']}.",
        "B=8, H=16; medians of triton.testing.do_bench (CUDA events, L2 flushed per repetition).",
        "",
        head,
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['D']} | {int(r['causal'])} | {r['S']} | {_fmt(r['ours_tflops'])} "
            f"| {_fmt(r['ours_pointer_tflops'])} "
            f"| {_fmt(r['flash_tflops'])} | {_fmt(r['efficient_tflops'])} | {_fmt(r['cudnn_tflops'])} "
            f"| {r['best_torch']} | {_fmt(r['ratio_vs_best'], '.2f')} "
            f"| {100 * r['ours_tflops'] / H200_DENSE_PEAK_TFLOPS:.0f}% | {r['ours_config']} "
            f"| {_fmt(r['max_abs_diff_vs_torch'], '.1e')}{'' if r['agrees'] else ' MISMATCH'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench_attention"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--causal", nargs="+", type=int, default=[0, 1])
    ap.add_argument(
        "--pointer-dtypes",
        nargs="*",
        default=["float16"],
        help="also time the pointer-load variant for these",
    )
    args = ap.parse_args()
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    rows = []
    for dtype_name in args.dtypes:
        for d in args.head_dims:
            for causal in args.causal:
                for s in args.seqs:
                    dtype = getattr(torch, dtype_name)
                    with_pointer = dtype_name in args.pointer_dtypes
                    row = bench_case(args.batch, args.heads, s, d, dtype, bool(causal), with_pointer)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    md = to_markdown(rows, env)
    (args.out / "results.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
