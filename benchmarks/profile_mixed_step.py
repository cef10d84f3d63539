"""Where a mixed step's GPU time goes at the Llama-3-8B shape: kernels by category against the roofline.

    PYTHONPATH=. python3 benchmarks/profile_mixed_step.py --out profile_mixed.json
    PYTHONPATH=. python3 benchmarks/profile_mixed_step.py --tiny      # checks the script on the CPU

Issue #29's mixed steps (prompt chunks beside decode rows) run at about half their roofline. For each
step layout (decode rows of a given context next to fresh prompt chunks; by default those the 8B runs
of bench_throughput.py average), this measures on the served path (piecewise CUDA graphs, trtforge's
kernels, fused layers) the step's GPU time between CUDA events (median of ``--repeats``), with
``TritonPagedAttention.concurrent`` off (today's default) and on (decode and chunk attention on two
streams), alternately. Then it runs the same step eagerly (``mixed_graphs=False``: the same kernels,
launched one by one) under torch.profiler and sums the kernels' device time by category: GEMM (cuBLAS /
CUTLASS), prompt attention (the chunked-prefill kernel), decode attention (the split-KV kernel), the
fused layer kernels (norms, rotary + cache write, SiLU), copies and the rest; the top kernels by time
are listed too. Beside it: the step's roofline (its linear layers' FLOPs at 989 TFLOP/s, attention
FLOPs, and the bytes of weights and K/V at 4.8 TB/s, whichever binds), so each category's share of
the gap shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import defaultdict

import torch

from benchmarks._settings import applied, parse_setting
from benchmarks.bench_http import SHAPES, build_model
from benchmarks.bench_mixed_step import make_batch, timed
from benchmarks.bench_throughput import gpu_trace_summary
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.quant import linear as quant_linear

PEAK_FLOPS, HBM = 989e12, 4.8e12
# (decode rows, their context, prompt chunks): bench_throughput's 8B mixed steps held about 1,100-1,200
# tokens with 100-190 decode rows (session 15); a step of the prefill-bound 2048/128 workload (about
# 4,080 tokens, the decode rows at ~2,100 keys: session 13); a prompt-only step of the largest budget; and
# 2048/128's mixed steps (session 16: ~1,086 tokens, ~60 decode rows at ~2,100 keys beside a 1,024 chunk)
LAYOUTS = [(100, 1000, (1024,)), (190, 1000, (1024,)), (180, 2100, (2048, 1856)), (0, 0, (2048, 2048)),
           (62, 2100, (1024,))]  # fmt: skip
# decode-only steps (the static decode path when served): single stream (issue #28's ms/token), bench_quant_
# speed's serving workload (64 rows), a full running batch, and 128/128's decode steps (241 rows at ~190
# keys: compute-bound, 9.8 ms against a 4.4 ms roofline in session 16)
DECODE_LAYOUTS = [(1, 1000, ()), (64, 600, ()), (256, 1000, ()), (241, 190, ())]
CATEGORIES = (
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "xmma", "gemv", "skinny")),
    ("fp8 quantize", ("quant_rows",)),
    ("prompt attention", ("chunked_prefill", "attn_fwd_ws")),  # the varlen and the Hopper chunk kernel
    ("decode attention", ("decode_split", "decode_reduce")),
    ("norm / rotary / cache / silu", ("rms", "rope", "silu", "norm", "cache", "fused")),
    ("copies", ("copy", "memcpy", "memset", "fill", "index", "gather", "scatter", "cat")),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def roofline_ms(
    cfg, decodes: int, ctx: int, chunks: tuple, quantization: str | None = None, kv_bytes_per_elem: int = 2
) -> dict:
    """The step's floor: linear FLOPs of every token plus attention FLOPs, against the weights' and K/V
    bytes read (K/V at `kv_bytes_per_elem`; the layers' weights at 1 byte (FP8) or 0.5 (INT4) where
    quantized, the embedding and LM head at 2), each at the H200's peak (FP8's linear FLOPs at 2x BF16's)."""
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = h // hq
    n_lin = layers * (h * (hq + 2 * hkv) * d + hq * d * h + 3 * h * inter)
    tokens = decodes + sum(chunks)
    rows = decodes + len(chunks)  # rows whose logits are computed
    flops = 2 * n_lin * tokens + 2 * cfg.vocab_size * h * rows
    attn = 4 * layers * hq * d * (decodes * ctx + sum(c * (c + 1) / 2 for c in chunks))
    kv_bytes = 2 * layers * hkv * d * kv_bytes_per_elem * (decodes * ctx + sum(chunks))
    per_weight = {None: 2.0, "fp8": 1.0, "int4-rtn": 0.5}[quantization]
    weight_bytes = per_weight * n_lin + 2 * cfg.vocab_size * h
    linear_peak = 2 * PEAK_FLOPS if quantization == "fp8" else PEAK_FLOPS
    compute = (flops / linear_peak + attn / PEAK_FLOPS) * 1e3
    memory = (weight_bytes + kv_bytes) / HBM * 1e3
    return {"compute_ms": compute, "memory_ms": memory, "roofline_ms": max(compute, memory)}


def kernel_ms(ex: TorchExecutor, batch, steps: int) -> tuple[dict[str, float], float]:
    """Each kernel's device time per step (ms) over `steps` profiled steps, by name, and the kernels
    launched per step (graph replays included)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            ex.step(batch)
        torch.cuda.synchronize()
    by_kernel: dict[str, float] = defaultdict(float)
    launches = 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            by_kernel[ev.name] += ev.device_time / 1e3 / steps  # us -> ms, per step
            launches += 1
    return dict(by_kernel), launches / steps


def profile_eager(ex: TorchExecutor, batch, steps: int) -> tuple[dict, list, float, float]:
    """Kernel device time per step by category, the top kernels, the total and the kernels launched per
    step (eager launches)."""
    for _ in range(2):
        ex.step(batch)
    by_kernel, per_step = kernel_ms(ex, batch, steps)
    by_cat: dict[str, float] = defaultdict(float)
    for name, ms in by_kernel.items():
        by_cat[category(name)] += ms
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:15]
    return (
        dict(by_cat),
        [{"kernel": n[:120], "ms": ms, "category": category(n)} for n, ms in top],
        sum(by_kernel.values()),
        per_step,
    )


def profile_served_gaps(ex: TorchExecutor, batch, steps: int) -> dict:
    """Where the served step's GPU waits: each of `steps` steps profiled alone
    (:func:`benchmarks.bench_throughput.gpu_trace_summary`: busy against span, the idle rest by gap size and
    the largest gaps); the step of median span. Tells launch gaps or syncs inside a step from slow kernels."""
    from torch.profiler import ProfilerActivity, profile

    summaries = []
    for _ in range(steps):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            ex.step(batch)
            torch.cuda.synchronize()
        if summary := gpu_trace_summary(prof):
            summaries.append(summary)
    return sorted(summaries, key=lambda x: x["span_ms"])[len(summaries) // 2] if summaries else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32, help="decoder layers of the 8B shape (fewer: faster)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument(
        "--quantization",
        choices=("fp8", "int4-rtn"),
        default=None,
        help="quantize the projections (issue #28)",
    )
    ap.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8"),
        default="auto",
        help="the paged pools: the model's dtype (auto) or FP8 E4M3 (per-layer scales, calibrated)",
    )
    ap.add_argument("--decode", action="store_true", help="also decode-only steps (1, 64, 241 and 256 rows)")
    ap.add_argument("--only-decode", action="store_true", help="the decode-only steps alone")
    ap.add_argument(
        "--fp8-mid-max",
        type=int,
        default=None,
        help="W8A8 up to this many tokens on the mid-sized GEMM where it wins (FP8_MID_MAX_TOKENS)",
    )
    ap.add_argument(
        "--fp8-mid-fold-residual",
        choices=("on", "off"),
        default=None,
        help="fold o's and down's residual add into that GEMM's epilogue (FP8_MID_FOLD_RESIDUAL)",
    )
    ap.add_argument(
        "--decode-rows",
        nargs="+",
        default=None,
        metavar="ROWS@KEYS",
        help="steps of these decode rows at this context each, e.g. 751@1152 (128/2048's FP8 steps), with "
        "prompt chunks after '+' (376@1500+1063: a mixed step of 1000/1000), instead of the built-in layouts",
    )
    ap.add_argument(
        "--ab",
        nargs="+",
        default=None,
        metavar="SETTING",
        help="instead of the profile: each step's served GPU time under each module setting (base, or "
        "module.NAME=value joined by '+', as bench_quant_speed.py --ab; e.g. "
        "trtforge.llm.executors.fused_layers.FUSED_FP8_QUANT=False), one served executor a setting, "
        "the settings timed alternately",
    )
    ap.add_argument("--tiny", action="store_true", help="small model on the CPU (checks the script only)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.ab:
        for text in args.ab:
            try:
                parse_setting(text)
            except argparse.ArgumentTypeError as exc:
                ap.error(f"--ab {text!r}: {exc}")
    if args.fp8_mid_max is not None:
        quant_linear.FP8_MID_MAX_TOKENS = args.fp8_mid_max
    if args.fp8_mid_fold_residual is not None:
        quant_linear.FP8_MID_FOLD_RESIDUAL = args.fp8_mid_fold_residual == "on"
    shape = dict(SHAPES["tiny" if args.tiny else "8b"])
    if not args.tiny:
        shape["num_hidden_layers"] = args.layers
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (--tiny checks the script on the CPU)")
    SHAPES["profiled"] = shape
    device = "cpu" if args.tiny else "cuda"
    model = build_model("profiled", device)
    if args.quantization is not None:
        from trtforge.llm.quant import quantize_model

        quantize_model(model, args.quantization)
    cfg = model.config
    layouts = ([] if args.only_decode else LAYOUTS) + (
        DECODE_LAYOUTS if args.decode or args.only_decode else []
    )
    if args.decode_rows:
        try:
            layouts = [parse_layout(text) for text in args.decode_rows]
        except ValueError:
            ap.error(f"--decode-rows takes ROWS@KEYS[+CHUNK...], e.g. 376@1500+1063: {args.decode_rows}")
    if args.tiny:
        layouts = [(min(d, 4), min(c, 40), tuple(min(x, 32) for x in ch)) for d, c, ch in layouts]
    block = 16
    needed = max(d * -(-c // block) + sum(-(-n // block) for n in ch) for d, c, ch in layouts)
    kwargs = {
        "num_blocks": needed + 8,
        "block_size": block,
        "max_graph_tokens": 4096,
        "max_decode_batch": max(256, max(d for d, _, _ in layouts)),
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    if args.ab and not args.tiny:
        # --ab keeps one executor (and its pools) per setting alive at once
        hkv, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
        elem = 1 if args.kv_cache_dtype == "fp8" else 2
        pools = len(args.ab) * kwargs["num_blocks"] * block * cfg.num_hidden_layers * 2 * hkv * d * elem
        free = torch.cuda.mem_get_info()[0]
        if pools > 0.8 * free:
            raise SystemExit(
                f"--ab: {len(args.ab)} executors' KV pools for these layouts need {pools / 2**30:.1f} GiB of "
                f"the {free / 2**30:.1f} GiB free; pass fewer --layers (the A/B's ratios are per layer) or "
                "smaller --decode-rows"
            )
    if args.ab:
        rows = ab_rows(model, kwargs, layouts, args, block)
        save_json({"device": device_name(device), "torch": torch.__version__, "layers": cfg.num_hidden_layers,
                   "quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype, "ab": args.ab,
                   "repeats": args.repeats, "rows": rows}, args.out)  # fmt: skip
        return
    served = TorchExecutor(model, static_decode=True, **kwargs)
    eager = TorchExecutor(model, static_decode=False, **kwargs)  # every kernel launched on its own
    rows = []
    for decodes, ctx, chunks in layouts:
        batch = make_batch(decodes, ctx, chunks, block, cfg.vocab_size)
        row: dict = {
            "decode_rows": decodes,
            "context": ctx,
            "chunks": list(chunks),
            "tokens": batch.num_tokens,
        }
        kv_elem = 1 if args.kv_cache_dtype == "fp8" else 2
        row |= roofline_ms(cfg, decodes, ctx, chunks, args.quantization, kv_elem)
        if args.tiny:
            served.step(batch)
            eager.step(batch)
            rows.append(row)
            continue
        for concurrent in (False, True):
            served.attention.concurrent = concurrent
            for _ in range(3):
                timed(served, batch)  # compiles, captures the bucket's graphs
        samples: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):  # alternately, so that drift hits both alike
            for concurrent in (False, True):
                served.attention.concurrent = concurrent
                samples[concurrent].append(timed(served, batch)[2])
        served.attention.concurrent = False
        row["served_gpu_ms"] = statistics.median(samples[False])
        row["served_concurrent_attention_gpu_ms"] = statistics.median(samples[True])
        (
            row["eager_kernels_ms_by_category"],
            row["top_kernels"],
            row["eager_kernel_sum_ms"],
            row["kernels_per_step"],
        ) = profile_eager(eager, batch, args.profile_steps)
        row["served_profile"] = profile_served_gaps(served, batch, max(3, args.profile_steps))
        row["roofline_over_served"] = row["roofline_ms"] / row["served_gpu_ms"]
        rows.append(row)
        cats = ", ".join(
            f"{k} {v:.2f}"
            for k, v in sorted(row["eager_kernels_ms_by_category"].items(), key=lambda kv: -kv[1])
        )
        print(
            f"{decodes} decode rows @ {ctx} + chunks {list(chunks)}: served {row['served_gpu_ms']:.2f} ms "
            f"(concurrent attention {row['served_concurrent_attention_gpu_ms']:.2f}), "
            f"roofline {row['roofline_ms']:.2f} ms ({row['roofline_over_served']:.0%}); eager kernels "
            f"{row['eager_kernel_sum_ms']:.2f} ms in {row['kernels_per_step']:.0f} kernels: {cats}",
            flush=True,
        )
        sp = row["served_profile"]
        if sp:
            print(
                f"  served under the profiler: span {sp['span_ms']:.2f} ms, busy {sp['busy_ms']:.2f}, idle "
                f"{sp['idle_ms']:.2f} in {sp['gaps']} gaps ("
                + ", ".join(f"{k} {v:.2f} ms" for k, v in sp["idle_ms_by_gap"].items())
                + "); largest: "
                + "; ".join(f"{g['us']} us {g['after']} -> {g['before']}" for g in sp["largest_gaps_us"][:4]),
                flush=True,
            )
    result = {
        "device": device_name(device),
        "torch": torch.__version__,
        "layers": cfg.num_hidden_layers,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "fp8_mid_max_tokens": quant_linear.FP8_MID_MAX_TOKENS,
        "fp8_mid_fold_residual": quant_linear.FP8_MID_FOLD_RESIDUAL,
        "rows": rows,
    }
    save_json(result, args.out)


def parse_layout(text: str) -> tuple[int, int, tuple[int, ...]]:
    """``ROWS@KEYS[+CHUNK...]``: decode rows at that context, then prompt chunks of those lengths."""
    head, *chunks = text.split("+")
    rows, at, keys = head.partition("@")
    if not at:
        raise ValueError(text)
    return int(rows), int(keys), tuple(int(c) for c in chunks)


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def save_json(result: dict, out: str | None) -> None:
    """`result` as JSON into `out` (written whole: a temporary file, then renamed), or printed."""
    text = json.dumps(result, indent=1)
    if out:
        with open(out + ".tmp", "w") as f:
            f.write(text)
        os.replace(out + ".tmp", out)
    else:
        print(text)


def ab_rows(model, kwargs: dict, layouts: list, args, block: int) -> list[dict]:
    """--ab: one served executor per module setting (its graphs are captured under it, and its steps run
    under it), then for each layout the settings' steps alternately, `args.repeats` each; the medians of
    their GPU time between CUDA events and each one's ratio to the first setting's."""
    settings = {text: parse_setting(text) for text in args.ab}
    executors = {}
    for text, setting in settings.items():
        with applied(setting):
            executors[text] = TorchExecutor(model, static_decode=True, **kwargs)
    rows = []
    for decodes, ctx, chunks in layouts:
        batch = make_batch(decodes, ctx, chunks, block, model.config.vocab_size)
        samples: dict[str, list[float]] = {text: [] for text in settings}
        for text, ex in executors.items():
            with applied(settings[text]):
                for _ in range(3):
                    ex.step(batch)  # compiles, captures the bucket's graphs under the setting
        if args.tiny:
            rows.append({"decode_rows": decodes, "context": ctx, "chunks": list(chunks)})
            continue
        for _ in range(args.repeats):
            for text, ex in executors.items():
                with applied(settings[text]):
                    samples[text].append(timed(ex, batch)[2])
        ms = {text: statistics.median(v) for text, v in samples.items()}
        first = ms[args.ab[0]]
        rows.append({"decode_rows": decodes, "context": ctx, "chunks": list(chunks),
                     "tokens": batch.num_tokens, "served_gpu_ms": ms,
                     "ratio_to_first": {t: v / first for t, v in ms.items()}})  # fmt: skip
        print(
            f"{decodes} decode rows @ {ctx} + chunks {list(chunks)} ({batch.num_tokens} tokens): "
            + ", ".join(f"{t} {v:.3f} ms ({v / first:.3f}x)" for t, v in ms.items()),
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
