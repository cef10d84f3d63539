"""Benchmark: FP8 (E4M3) vs BF16 KV cache on the GPU, Llama-3-8B shape (random weights), same run.

    PYTHONPATH=. python3 benchmarks/bench_kv_fp8.py --out build/kv_fp8.json [--quick] [--skip-serving]

Three parts, each self-checking (a failed check exits non-zero after the JSON is written):
1. decode attention: trtforge's split-KV kernel over a paged pool (16-token blocks at random places)
   of BF16 and of FP8 (``float8_e4m3fn``, per-tensor scales amax / 448), Hq 32 / Hkv 8 / D 128, q_len 1,
   every sequence at full length L, at a few (B, L) points; for each: the autotuned launch
   (``decode_attention`` with no config; its first call tunes, untimed) and the serving path's fixed
   launch (``TritonDecodeAttention``: the default config and split heuristic, what CUDA graphs replay),
   timed as CUDA-graph replays (median). TB/s = the pool bytes the attention must read
   (2·B·Hkv·L·D·bytes per element) / time. Checks: FP8 output vs the FP32 reference over the same
   dequantized K/V (max |err| < 2.5e-2, the BF16 kernel's own tolerance) and vs the BF16 output
   (quantization error, reported). A third variant times the FP8 pools with the kernel's products in
   BF16 (``decode_attention.FP8_KV_F16 = False``, the kernel before session 18) beside the FP16 ones.
``--serving-sweep`` instead times the serving path's fixed launch over FP8 pools for a few configs at
the served shapes (what ``decode_attention.FP8_KV_DECODE_CONFIG`` and ``FP8_KV_MANY_PAIRS_DECODE_CONFIG``
are chosen from; ``--configs`` names the candidates); ``--page-sizes 16 32 64`` over pools of those block
sizes too (``--default-config-only``: that launch alone; ``--ab base decode_attention.FP8_V_PAIRS=False``:
each launch under each module setting, side by side).
2. capacity: ``sizing.torch_pool`` (what ``from_pretrained`` runs) on the loaded 8B model for each
   cache dtype, then a fixed budget of pool bytes allocated for each: tokens held. Check: FP8 holds
   2x the BF16 tokens in the same bytes (>= 1.99x).
3. serving (unless ``--skip-serving``): the same workload through LLMEngine + TorchExecutor with a
   KV pool of ``--pool-gib`` GiB for each cache dtype (so FP8 holds twice the tokens): ``--requests``
   requests at t=0, prompts of ``--prompt-len`` random ids, ``--output-len`` new tokens each
   (ignore_eos), 256 sequences at most. Output tok/s, preemptions and peak tokens held (after a
   warm-up run of 16 requests on each executor, which captures its graphs).
``--quick``: 3 attention points, 64 requests of 128 new tokens (about 3 minutes on an H200, most of it
Triton compiles, graph captures and the 8B model's random init; run it under a 600 s limit).
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import math
import time
from pathlib import Path

import torch

from benchmarks._settings import applied, parse_setting
from benchmarks.bench_decode_attention import _graph_us, _pool
from benchmarks.bench_http import build_model
from benchmarks.bench_serving import run_engine, workload
from trtforge.kernels import decode_attention as da
from trtforge.kernels.decode_attention import decode_attention
from trtforge.kernels.kv_quant import FP8_MAX, dequantize, quantize_fp8

HQ, HKV, D, LAYERS = 32, 8, 128, 32
POINTS = [(1, 32768), (16, 4096), (64, 8192), (128, 2048), (256, 1024)]
QUICK_POINTS = [(1, 32768), (64, 8192), (256, 1024)]
FP8_VS_REF_TOL = 2.5e-2  # tests/kernels TOL for BF16 (p rounded to BF16 before P.V)


def _reference(q, k, v, table, length):
    """FP32 SDPA over the pools gathered back (full-length sequences, GQA)."""
    from benchmarks.bench_decode_attention import _gather

    kk, vv = _gather(k, table).float(), _gather(v, table).float()
    return torch.nn.functional.scaled_dot_product_attention(q.float(), kk, vv, enable_gqa=True)


def _point(b: int, length: int, serving, failures: list[str]) -> dict:
    """One (B, L) point: BF16 and FP8 pools of the same K/V, timed and checked."""
    gen = torch.Generator().manual_seed(b * length)
    q = torch.randn(b, HQ, 1, D, generator=gen).bfloat16().cuda()
    k = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
    ks, vs = float(k.abs().amax()) / FP8_MAX, float(v.abs().amax()) / FP8_MAX
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    k16, v16, table = _pool(k, v, 16, gen)
    del k, v
    k8, v8 = quantize_fp8(k16, ks), quantize_fp8(v16, vs)
    q3, out = q[:, :, 0], torch.empty(b, HQ, D, dtype=torch.bfloat16, device="cuda")
    row: dict = {"B": b, "L": length}
    outs = {}
    fp8 = {"k_scale": ks, "v_scale": vs}
    for name, kp, vp, scales, elem in (
        ("bf16", k16, v16, {}, 2),
        ("fp8", k8, v8, fp8, 1),
        ("fp8_bf16_products", k8, v8, fp8, 1),  # FP8_KV_F16 off: the kernel before session 18
    ):
        # (its autotuned launch reuses the FP16 products' choice: the tuning key does not hold FP8_KV_F16;
        # the serving launch, the column BENCHMARKS.md quotes, is the same config for both)
        da.FP8_KV_F16 = name != "fp8_bf16_products"
        outs[name] = decode_attention(q, kp, vp, lens, table, **scales)  # autotunes on this first call

        def tuned(kp=kp, vp=vp, s=scales):
            return decode_attention(q, kp, vp, lens, table, **s)

        def fixed(kp=kp, vp=vp, s=scales):
            return serving(q3, kp, vp, table, lens, D**-0.5, out=out, **s)

        t_tuned, t_serve = _graph_us(tuned), _graph_us(fixed)
        nbytes = 2 * b * HKV * length * D * elem
        row[name] = {
            "us_autotuned": round(t_tuned, 1),
            "tbs_autotuned": round(nbytes / t_tuned / 1e6, 3),
            "us_serving": round(t_serve, 1),
            "tbs_serving": round(nbytes / t_serve / 1e6, 3),
        }
    if b * length <= 64 * 8192:  # the FP32 reference of the dequantized pools (memory-bounded)
        ref = _reference(q, dequantize(k8, ks), dequantize(v8, vs), table, length)
        err = float((outs["fp8"].float() - ref).abs().max())
        row["fp8_vs_dequantized_ref_max_err"] = err
        if err >= FP8_VS_REF_TOL:
            failures.append(f"B={b} L={length}: FP8 kernel vs FP32 reference {err:.3g} >= {FP8_VS_REF_TOL}")
    row["fp8_vs_bf16_max_err"] = float((outs["fp8"].float() - outs["bf16"].float()).abs().max())
    row["speedup_autotuned"] = round(row["bf16"]["us_autotuned"] / row["fp8"]["us_autotuned"], 3)
    row["speedup_serving"] = round(row["bf16"]["us_serving"] / row["fp8"]["us_serving"], 3)
    row["fp16_products_speedup_serving"] = round(
        row["fp8_bf16_products"]["us_serving"] / row["fp8"]["us_serving"], 3
    )
    da.FP8_KV_F16 = True
    return row


def attention_part(points) -> tuple[list[dict], list[str]]:
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    rows: list[dict] = []
    failures: list[str] = []
    serving = TritonDecodeAttention()
    for b, length in points:
        rows.append(_point(b, length, serving, failures))
        print(json.dumps(rows[-1]), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    return rows, failures


# the serving path's decode steps: 128/128's (241 rows at ~190-300 keys), 1000/1000's (241 at ~1,500),
# full batches at 1,024 and 2,048 keys, bench_quant_speed's 64 x 8,192-ish, and one long sequence
SWEEP_POINTS = [(241, 256), (256, 1024), (241, 1536), (256, 2048), (64, 8192), (1, 32768)]
SWEEP_CONFIGS = [  # (block_n, num_warps, num_stages): FP8 tiles are half the bytes of BF16's
    (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (128, 4, 4),
    (256, 8, 2), (256, 4, 2), (128, 2, 2), (128, 2, 3),
]  # fmt: skip


def serving_sweep(
    points=SWEEP_POINTS, configs=SWEEP_CONFIGS, pages=(16,), default_only=False, settings=("base",)
) -> dict:
    """The serving path's fixed launch (``TritonDecodeAttention`` with a given DecodeConfig, split count
    by the heuristic) over FP8 pools of each block size of `pages` (the same K/V), per (B, L), config,
    block size and module setting of `settings` (``benchmarks._settings.parse_setting``'s form, side by
    side), graph-timed; checked against the first one's output (the default config over ``pages[0]``
    under ``settings[0]``). The best (config, block size, setting) by the geometric mean of its time
    over that first one's."""
    from trtforge.kernels.decode_attention import DecodeConfig, _fits, default_decode_config
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    default = default_decode_config(D, torch.float8_e4m3fn)
    cands = [DecodeConfig(bn, w, st) for bn, w, st in configs if _fits(bn, st, D, elem_bytes=1)]
    cands = [default] if default_only else [default] + [c for c in cands if c != default]
    rows: list[dict] = []
    for b, length in points:
        gen = torch.Generator().manual_seed(b + length)
        k = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
        ks, vs = float(k.abs().amax()) / FP8_MAX, float(v.abs().amax()) / FP8_MAX
        q = torch.randn(b, HQ, D, generator=gen).bfloat16().cuda()
        lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        want = None
        for page in pages:
            k16, v16, table = _pool(k, v, page, gen)
            k8, v8 = quantize_fp8(k16, ks), quantize_fp8(v16, vs)
            del k16, v16
            for cfg, setting in itertools.product(cands, settings):
                attn = TritonDecodeAttention(config=cfg)
                fn = functools.partial(attn, q, k8, v8, table, lens, D**-0.5, out=out, k_scale=ks, v_scale=vs)
                with applied(parse_setting(setting)):
                    got = fn().float().clone()
                    us = _graph_us(fn)
                want = got if want is None else want
                row = {"B": b, "L": length, "page": page, "setting": setting,
                       "config": [cfg.block_n, cfg.num_warps, cfg.num_stages], "us": us,
                       "tb_per_s": 2 * b * HKV * length * D / us / 1e6,
                       "max_diff_vs_default": float((got - want).abs().max())}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            del k8, v8
        del k, v
        gc.collect()
        torch.cuda.empty_cache()
    first = (tuple(rows[0]["config"]), rows[0]["page"], rows[0]["setting"])
    base = {(r["B"], r["L"]): r["us"] for r in rows if (tuple(r["config"]), r["page"], r["setting"]) == first}
    score: dict[tuple, list[float]] = {}
    for r in rows:
        score.setdefault((*r["config"], r["page"], r["setting"]), []).append(r["us"] / base[(r["B"], r["L"])])
    gmean = {c: math.exp(sum(map(math.log, v)) / len(v)) for c, v in score.items() if len(v) == len(base)}
    best = min(gmean, key=gmean.get)
    print(
        "(block_n, warps, stages, page, setting) by geometric-mean time over the default's:",
        {str(c): round(g, 3) for c, g in gmean.items()},
    )
    return {"rows": rows, "gmean_over_default": {str(c): g for c, g in gmean.items()}, "best": list(best)}


def capacity_part(lm, budget_gib: float) -> tuple[dict, list[str]]:
    from trtforge.llm import sizing
    from trtforge.llm.executors.torch_exec import TorchExecutor

    config = sizing.default_scheduler_config(None)
    out: dict = {"budget_gib": budget_gib}
    for kv in ("auto", "fp8"):
        sized = sizing.torch_pool(
            lm, block_size=16, device=None, dtype=None, max_model_len=None, config=config,
            gpu_memory_utilization=0.9, kv_cache_dtype=kv,
        )  # fmt: skip
        blocks = int(budget_gib * 2**30) // sized.block_bytes
        ex = TorchExecutor(lm, num_blocks=blocks, kv_cache_dtype=kv, kv_scales=None if kv == "auto" else 1.0)
        out[kv] = {
            "sizing_default_blocks": sized.num_blocks,
            "sizing_default_tokens": sized.num_blocks * 16,
            "sizing_how": sized.how,
            "block_bytes": sized.block_bytes,
            "budget_tokens": ex.facts.num_blocks * ex.facts.block_size,
            "kv_pool_bytes_allocated": ex.facts.kv_pool_bytes,
            "kv_bytes_per_token": ex.facts.kv_bytes_per_token,
            "kv_dtype": ex.facts.kv_dtype,
        }
        del ex
        gc.collect()
        torch.cuda.empty_cache()
    ratio = out["fp8"]["budget_tokens"] / out["auto"]["budget_tokens"]
    out["tokens_ratio_fp8_over_bf16"] = ratio
    print(json.dumps(out), flush=True)
    return out, (
        [] if ratio >= 1.99 else [f"FP8 holds {ratio:.3f}x the BF16 tokens in the same bytes (< 1.99)"]
    )


def serving_part(lm, args) -> dict:
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sched.scheduler import SchedulerConfig

    reqs = workload(args.requests, (args.prompt_len,) * 2, (args.output_len,) * 2, 0.0, 32000, seed=0)
    warm = workload(16, (args.prompt_len,) * 2, (32, 32), 0.0, 32000, seed=1)
    config = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=4096, max_prefill_chunk=1024)
    out: dict = {
        "workload": f"{args.requests} requests at t=0, prompts of {args.prompt_len} random ids, "
        f"{args.output_len} new tokens each (ignore_eos); KV pool {args.pool_gib} GiB; max_num_seqs 256",
    }
    for kv in ("auto", "fp8"):
        per_block = 2 * LAYERS * 16 * HKV * D * (2 if kv == "auto" else 1)
        blocks = int(args.pool_gib * 2**30) // per_block
        t0 = time.perf_counter()
        ex = TorchExecutor(lm, num_blocks=blocks, kv_cache_dtype=kv)
        built = time.perf_counter() - t0
        run_engine(ex, warm, config)  # graphs captured, kernels compiled
        res = run_engine(ex, reqs, config)
        res["build_s"] = round(built, 1)
        res["kv_tokens_capacity"] = blocks * 16
        res["scales"] = ex.kv_scales.how if ex.kv_scales is not None else None
        out[kv] = res
        print(
            kv, json.dumps({k: res[k] for k in ("output_tok_per_s", "preemptions", "max_running", "wall_s")})
        )
        del ex
        gc.collect()
        torch.cuda.empty_cache()
    out["throughput_ratio_fp8_over_bf16"] = out["fp8"]["output_tok_per_s"] / out["auto"]["output_tok_per_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-serving", action="store_true")
    ap.add_argument("--attention-only", action="store_true", help="the decode-attention part alone")
    ap.add_argument(
        "--serving-sweep",
        action="store_true",
        help="only sweep the serving path's fixed launch configs over FP8 pools (SWEEP_POINTS x "
        "SWEEP_CONFIGS)",
    )
    ap.add_argument(
        "--page-sizes", type=int, nargs="+", default=[16], help="--serving-sweep: the pools' block sizes"
    )
    ap.add_argument(
        "--default-config-only", action="store_true", help="--serving-sweep: the default launch alone"
    )
    ap.add_argument(
        "--configs",
        nargs="+",
        default=None,
        metavar="BLOCK_N,WARPS,STAGES",
        help="--serving-sweep: these candidates beside the default (default: SWEEP_CONFIGS)",
    )
    ap.add_argument(
        "--ab",
        nargs="+",
        default=["base"],
        metavar="SETTING",
        help="--serving-sweep: each launch under each of these module settings of trtforge.kernels, side "
        "by side (base, or module.NAME=value joined by '+', e.g. decode_attention.FP8_V_PAIRS=False)",
    )
    ap.add_argument("--budget-gib", type=float, default=64.0, help="pool bytes of the capacity check")
    ap.add_argument("--pool-gib", type=float, default=4.0, help="the serving runs' KV pool")
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    args = ap.parse_args()
    for text in args.ab:  # a bad --ab ends the run before any GPU work
        try:
            parse_setting(text)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--ab {text!r}: {e}")
    if args.quick:
        args.requests, args.output_len = min(args.requests, 64), min(args.output_len, 128)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        raise SystemExit("needs a CUDA GPU with FP8 support (compute capability >= 8.9)")
    start = time.perf_counter()
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args)}
    failures: list[str] = []
    if args.serving_sweep:
        configs = SWEEP_CONFIGS
        if args.configs:
            configs = [tuple(int(v) for v in c.split(",")) for c in args.configs]
        results["serving_sweep"] = serving_sweep(
            configs=configs, pages=tuple(args.page_sizes), default_only=args.default_config_only,
            settings=args.ab,
        )  # fmt: skip
        failures += [
            f"B={r['B']} L={r['L']} config {r['config']}: differs from the default's output by "
            f"{r['max_diff_vs_default']:.3g}"
            for r in results["serving_sweep"]["rows"]
            if r["max_diff_vs_default"] > 2e-2
        ]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(json.dumps({"best": results["serving_sweep"]["best"], "failures": failures}))
        raise SystemExit(1 if failures else 0)
    results["attention"], fails = attention_part(QUICK_POINTS if args.quick else POINTS)
    failures += fails
    if args.attention_only:
        _save_and_report(results, failures, start, args.out)
        return
    lm = build_model("8b", "cuda")  # the one 8B builder (random BF16, seed 0)
    results["capacity"], fails = capacity_part(lm, args.budget_gib)
    failures += fails
    if not args.skip_serving:
        results["serving"] = serving_part(lm, args)
    _save_and_report(results, failures, start, args.out)


def _save_and_report(results: dict, failures: list[str], start: float, out: str) -> None:
    """Write the JSON (failures included), print the tables; exit 1 on a failed check."""
    results["wall_s"] = round(time.perf_counter() - start, 1)
    results["failures"] = failures
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2))
    print(
        "\n| B x L | BF16 us (TB/s) | FP8 us (TB/s) | speedup | serving-path BF16 / FP8 / FP8 with BF16 "
        "products us | FP8 err vs ref |"
    )
    print("|---|---|---|---|---|---|")
    for r in results["attention"]:
        b16, f8, old = r["bf16"], r["fp8"], r["fp8_bf16_products"]
        print(
            f"| {r['B']} x {r['L']} | {b16['us_autotuned']} ({b16['tbs_autotuned']}) | {f8['us_autotuned']} "
            f"({f8['tbs_autotuned']}) | {r['speedup_autotuned']}x | {b16['us_serving']} / {f8['us_serving']} "
            f"/ {old['us_serving']} | {r.get('fp8_vs_dequantized_ref_max_err', '-')} |"
        )
    if "capacity" not in results:
        print(f"wall {results['wall_s']} s; failures: {failures or 'none'}")
        if failures:
            raise SystemExit(1)
        return
    cap = results["capacity"]
    print(f"\ncapacity in {cap['budget_gib']} GiB: BF16 {cap['auto']['budget_tokens']} tokens, FP8 "
          f"{cap['fp8']['budget_tokens']} ({cap['tokens_ratio_fp8_over_bf16']:.3f}x)")  # fmt: skip
    if "serving" in results:
        s = results["serving"]
        print(f"serving ({s['workload']}): BF16 {s['auto']['output_tok_per_s']:.0f} tok/s "
              f"({s['auto']['preemptions']} preemptions), FP8 {s['fp8']['output_tok_per_s']:.0f} tok/s "
              f"({s['fp8']['preemptions']}): {s['throughput_ratio_fp8_over_bf16']:.3f}x")  # fmt: skip
    print(f"wall {results['wall_s']} s; failures: {failures or 'none'}")
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
