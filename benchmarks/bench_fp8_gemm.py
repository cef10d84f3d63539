"""W8A8 GEMM modes at the token counts that serving steps run, Llama-3-8B projections (issue #28/#29 FP8).

    PYTHONPATH=. python3 benchmarks/bench_fp8_gemm.py --out fp8_gemm.json [--tokens 751 1086 4096]

For each projection (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336) and token count M:
``torch._scaled_mm`` (cuBLASLt) with per-token activation and per-channel weight scales, BF16 out, as the
serving path calls it, with ``use_fast_accum`` off (the path's setting) and on (the FP8 tensor cores'
products summed without cuBLASLt's periodic promotion to FP32), and BF16 ``torch.mm`` beside them:
CUDA-graph replay medians, TFLOP/s (an H200's dense peaks: ~1,979 FP8, ~989 BF16), and each mode's
error against the float32 product of the same E4M3 operands (max |err| over the max |reference|: the
accumulation's own error). Beside it each mode's error against the product of the unquantized operands
(the 16-bit activations times the float32 weights; RMS of the error over the RMS of that product): what
a user sees of FP8 altogether, rounding and accumulation; BF16 ``torch.mm`` is measured the same way.
``--outliers`` scales 1% of the activations' channels by 30 (LLM activations have such channels). The
layer's time at each M sums the four projections, the figure a serving step pays 32 times.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: with_old's .old first

PROJECTIONS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def graph_us(fn, reps: int = 20) -> float:
    """Median µs of `fn` replayed from a CUDA graph (20 launches a replay, 5 replays)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def scaled_mm(xq, wq, sx, sw, fast: bool) -> torch.Tensor:
    """The serving path's W8A8 call (:func:`trtforge.llm.quant.linear._scaled_mm`), accumulation as asked."""
    return torch._scaled_mm(
        xq, wq.t(), scale_a=sx, scale_b=sw[None, :], out_dtype=torch.bfloat16, use_fast_accum=fast
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 751, 1086, 1151, 2048, 4096])
    ap.add_argument("--outliers", action="store_true", help="1%% of the activation channels times 30")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU with FP8 tensor cores (Ada or Hopper)")
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded
    from trtforge.kernels.qweight import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (n, k) in PROJECTIONS.items():
        w = torch.randn(n, k, device="cuda", generator=g) / k**0.5
        wq = quantize_fp8(w)
        wq_data, wq_scale = wq.data.cuda(), wq.scale.cuda().float()
        wb = w.bfloat16()
        for m in args.tokens:
            x = torch.randn(m, k, device="cuda", generator=g)
            if args.outliers:
                x[:, torch.randperm(k, device="cuda", generator=g)[: k // 100]] *= 30
            x = x.bfloat16()
            xq, sx = quantize_rows_fp8_padded(x)
            ref = (xq.float() * sx) @ (wq_data.float() * wq_scale[:, None]).t()
            true = x.float() @ w.t()
            rms_true = true.pow(2).mean().sqrt()
            row = {"projection": name, "n": n, "k": k, "m": m}
            flops = 2 * m * n * k
            for fast in (False, True):
                run = functools.partial(scaled_mm, xq, wq_data, sx, wq_scale, fast)
                out = run().float()
                key = "fast_accum" if fast else "exact_accum"
                row[f"{key}_rel_err"] = float((out - ref).abs().max() / ref.abs().max())
                row[f"{key}_vs_true_rms"] = float((out[:m] - true).pow(2).mean().sqrt() / rms_true)
                row[f"{key}_us"] = graph_us(run)
                row[f"{key}_tflops"] = flops / row[f"{key}_us"] / 1e6
            err16 = torch.mm(x, wb.t()).float() - true
            row["bf16_vs_true_rms"] = float(err16.pow(2).mean().sqrt() / rms_true)
            row["bf16_us"] = graph_us(functools.partial(torch.mm, x, wb.t()))
            row["bf16_tflops"] = flops / row["bf16_us"] / 1e6
            rows.append(row)
            print(
                f"{name:8s} M={m:5d}: exact {row['exact_accum_us']:8.1f} us "
                f"({row['exact_accum_tflops']:6.0f} TF/s, "
                f"err {row['exact_accum_rel_err']:.1e})  fast {row['fast_accum_us']:8.1f} us "
                f"({row['fast_accum_tflops']:6.0f} TF/s, err {row['fast_accum_rel_err']:.1e})  "
                f"bf16 {row['bf16_us']:8.1f} us ({row['bf16_tflops']:4.0f}); RMS error against the "
                f"unquantized product: exact {row['exact_accum_vs_true_rms']:.3e}, fast "
                f"{row['fast_accum_vs_true_rms']:.3e}, bf16 {row['bf16_vs_true_rms']:.1e}",
                flush=True,
            )
    layer = {}
    for m in args.tokens:
        sel = [r for r in rows if r["m"] == m]
        layer[m] = {key: sum(r[f"{key}_us"] for r in sel) for key in ("exact_accum", "fast_accum", "bf16")}
        print(
            f"layer M={m}: exact {layer[m]['exact_accum']:.0f} us, fast {layer[m]['fast_accum']:.0f} us "
            f"({layer[m]['exact_accum'] / layer[m]['fast_accum']:.2f}x), bf16 {layer[m]['bf16']:.0f} us"
        )
    if args.out:
        result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                  "outliers": args.outliers}  # fmt: skip
        Path(args.out).write_text(json.dumps(result | {"layer_us": layer}, indent=1))


if __name__ == "__main__":
    main()
