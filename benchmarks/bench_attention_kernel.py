"""Benchmark: trtforge's flash-attention forward vs every torch SDPA backend, same run.

    PYTHONPATH=. python3 benchmarks/bench_attention_kernel.py --out build/bench_attention

Cases: FP16 and BF16, B=8, H=16, D=64 and 128, S=512..8192, causal and not (defaults). Each
implementation is timed eagerly with triton.testing.do_bench (CUDA events, L2 flushed before every
repetition, median; Python launch overhead included) and as CUDA-graph replays (kernel time only).
TFLOP/s counts 4·B·H·S²·D (halved when causal). "Ours" is the public launch API: on an H200 it
autotunes over the warp-specialized Hopper kernel's configs and the portable kernel's variants and
tiles on its first call (excluded from the timing); each result is also checked against torch's
output. Torch backends other than --graph-peers get no graph column (time). All implementations of
a case are timed in --rounds interleaved rounds and each reports the median of its rounds, so a
clock or power drift within the case (e.g. after the autotuning burst) does not favour one of them.
Writes results.json and results.md under --out and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import platform
import statistics
from pathlib import Path

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from trtforge.kernels import flash_attention as kernel

TORCH_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
H200_DENSE_PEAK_TFLOPS = 989.0  # FP16/BF16 dense tensor-core peak from the datasheet (a lead, not measured)
AGREE_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _time_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _graph_ms(fn) -> float:
    """Median time of `fn` replayed from a CUDA graph: no Python/launch overhead (L2 not flushed)."""
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def _tflops(b: int, h: int, s: int, d: int, causal: bool, ms: float) -> float:
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def _config_name(c: triton.Config) -> str:
    return f"BM{c.kwargs['BLOCK_M']}/BN{c.kwargs['BLOCK_N']}/w{c.num_warps}/s{c.num_stages}"


def _hopper_name(c: kernel.HopperConfig) -> str:
    mode = ("pingpong" if c.pingpong else "no-pingpong") + ("/persistent" if c.persistent else "")
    mode += ("/pairs" if c.pairs else "") + ("/split-q" if c.split_q else "")
    mode += "/o-in-k" if c.o_in_k else ""
    return f"hopper BM{c.block_m}/BN{c.block_n}/s{c.stages}/q{c.q_bufs}/{mode}"


def _autotuned_ours(s: int, d: int, q, k, v, causal: bool) -> tuple:
    """Our kernel, variant and tiles autotuned on this first call (not timed): its output, a
    zero-argument launch of the chosen kernel, and the choice's name."""
    out = torch.empty_like(q)
    kernel.flash_attention(q, k, v, causal=causal, out=out)
    torch.cuda.synchronize()
    variant = kernel._VARIANT_CHOICE[kernel._choice_key(q, d, causal, None, s, s)]
    if isinstance(variant, kernel.HopperConfig):
        name = _hopper_name(variant)
    else:
        tuner = kernel._tuned_kernel_tma if variant == "tma" else kernel._tuned_kernel
        name = f"{variant} {_config_name(tuner.best_config)}"
    return out.clone(), (lambda: kernel.flash_attention(q, k, v, causal=causal, out=out)), name


def bench_case(
    b: int, h: int, s: int, d: int, dtype: torch.dtype, causal: bool, graph_peers: list[str], rounds: int
) -> dict:
    """One case: every implementation timed in `rounds` interleaved rounds (median of the rounds'
    medians), so a clock or power drift during the case hits all of them alike."""
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    row = {"dtype": str(dtype).split(".")[-1], "B": b, "H": h, "S": s, "D": d, "causal": causal}
    out, ours, row["ours_config"] = _autotuned_ours(s, d, q, k, v, causal)
    call = lambda: sdpa(q, k, v, is_causal=causal)  # noqa: E731
    backends, diffs = {}, {}
    for name, backend in TORCH_BACKENDS.items():
        try:
            with sdpa_kernel([backend]):
                ref = call()
                torch.cuda.synchronize()
        except RuntimeError as e:  # backend not available for this case/build
            row[f"{name}_tflops"] = row[f"{name}_graph_tflops"] = None
            row[f"{name}_error"] = str(e).splitlines()[0][:200]
            continue
        backends[name] = backend
        diffs[name] = (out.float() - ref.float()).abs().max().item()
    eager = {n: [] for n in ["ours", *backends]}
    graph = {n: [] for n in ["ours", *(p for p in graph_peers if p in backends)]}
    for _ in range(rounds):
        for name in eager:
            ctx = sdpa_kernel([backends[name]]) if name in backends else contextlib.nullcontext()
            fn = call if name in backends else ours
            with ctx:
                eager[name].append(_time_ms(fn))
                if name in graph:
                    graph[name].append(_graph_ms(fn))
    for name in eager:
        row[f"{name}_tflops"] = _tflops(b, h, s, d, causal, statistics.median(eager[name]))
        ms = graph.get(name)
        row[f"{name}_graph_tflops"] = _tflops(b, h, s, d, causal, statistics.median(ms)) if ms else None
    for mode in ("", "graph_"):
        timed = {n: row[f"{n}_{mode}tflops"] for n in TORCH_BACKENDS if row.get(f"{n}_{mode}tflops")}
        best = max(timed, key=timed.get) if timed else None
        row[f"best_torch_{mode}backend"] = best
        row[f"best_torch_{mode}tflops"] = timed[best] if best else None
        row[f"ratio_{mode}vs_best"] = row[f"ours_{mode}tflops"] / timed[best] if best else None
    row["max_abs_diff_vs_torch"] = max(diffs.values()) if diffs else None
    row["agrees"] = bool(diffs) and row["max_abs_diff_vs_torch"] <= AGREE_TOL[dtype]
    return row


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def to_markdown(rows: list[dict], env: dict) -> str:
    cols = [
        "dtype", "D", "causal", "S", "ours", "flash", "efficient", "cudnn", "best torch", "ours/best",
        "ours (graph)", "best torch (graph)", "ours/best (graph)", "ours % of 989", "our variant/config",
        "max abs diff",
    ]  # fmt: skip
    lines = [
        f"Machine: {env['gpu']}; torch {env['torch']}, Triton {env['triton']}, cuDNN {env['cudnn']}; "
        f"{env['date']}.",
        f"B={rows[0]['B']}, H={rows[0]['H']}; TFLOP/s = 4·B·H·S²·D (halved when causal) / median time.",
        "Eager columns: triton.testing.do_bench (CUDA events, L2 flushed per repetition, launch overhead",
        "included). Graph columns: do_bench_cudagraph (CUDA-graph replay: kernel time only, L2 not flushed).",
        f"Each figure: median of {env['rounds']} interleaved rounds (all implementations per round).",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        best_pct = 100 * max(r["ours_tflops"], r["ours_graph_tflops"]) / H200_DENSE_PEAK_TFLOPS
        cells = [
            r["dtype"], r["D"], int(r["causal"]), r["S"], _fmt(r["ours_tflops"]), _fmt(r["flash_tflops"]),
            _fmt(r["efficient_tflops"]), _fmt(r["cudnn_tflops"]), r["best_torch_backend"],
            _fmt(r["ratio_vs_best"], ".2f"), _fmt(r["ours_graph_tflops"]),
            f"{_fmt(r['best_torch_graph_tflops'])} ({r['best_torch_graph_backend']})",
            _fmt(r["ratio_graph_vs_best"], ".2f"), f"{best_pct:.0f}%", r["ours_config"],
            _fmt(r["max_abs_diff_vs_torch"], ".1e") + ("" if r["agrees"] else " MISMATCH"),
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
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
        "--graph-peers",
        nargs="*",
        default=["cudnn"],
        help="torch backends also timed as CUDA-graph replays (cuDNN, the fastest, by default: saves time)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case (median)")
    args = ap.parse_args()
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rounds": args.rounds,
    }
    rows = []
    for dtype_name in args.dtypes:
        for d in args.head_dims:
            for causal in args.causal:
                for s in args.seqs:
                    dtype = getattr(torch, dtype_name)
                    row = bench_case(
                        args.batch, args.heads, s, d, dtype, bool(causal), args.graph_peers, args.rounds
                    )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    _write(args.out, env, rows)  # after every case: a time limit keeps what finished
    print(to_markdown(rows, env))


def _write(out: Path, env: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("results.json", json.dumps({"env": env, "rows": rows}, indent=1)),
                       ("results.md", to_markdown(rows, env))):  # fmt: skip
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


if __name__ == "__main__":
    main()
