"""Quantized serving speed on a GPU: Llama-3-8B shape, random weights built on the device.

    python benchmarks/bench_quant_speed.py --out benchmarks/results/quant_speed.json [--quick]

Parts (``--parts``, comma-separated; each records an error instead of ending the run):
- ``kernels``: the 8B projections (QKV 6144x4096, o 4096x4096, gate/up 28672x4096, down 4096x14336,
  lm_head 128256x4096):
  FP8 ``torch._scaled_mm`` (activation quantization excluded, then included) and BF16 ``torch.mm`` in
  TFLOP/s at M = 16..8192 (dense FP8 peak of an H200: ~1,979 TFLOP/s; BF16 ~989); and the M=1 GEMVs
  (BF16, FP8 weight-only W8A16, INT4 group 128) in TB/s of weight bytes read (H200 HBM3e: 4.8 TB/s;
  timed by do_bench, launch overhead included: benchmarks/sweep_quant_gemv.py times them in CUDA
  graphs). Each kernel's result is checked against the float32 reference of its format first.
- ``single``: one request alone (512 prompt tokens, 256 output), CUDA graphs as the executor uses
  them: ms/token for BF16, FP8, FP8 + FP8 LM head, INT4 and INT4 + FP8 LM head (``+head-fp8``:
  ``lm_head_quantization="fp8"``, the 1.05 GB BF16 head read as 0.53 GB of E4M3). The INT4 weights are
  round-to-nearest: AWQ's weights have the same format, bytes and kernels (its search only changes the
  values), and random weights give AWQ no activations worth calibrating on.
- ``fp8-skinny`` / ``fp8-skinny-all``: FP8 with W8A8 at 2..64 tokens (and, ``-all``, at one token too)
  on trtforge's skinny wgmma GEMM (:mod:`trtforge.kernels.fp8_skinny`) instead of cuBLASLt / the
  weight-only GEMV: ``trtforge.llm.quant.linear``'s dispatch limits set for that variant only.
- ``serving``: the same workload for BF16, FP8, FP8 + FP8 LM head and the skinny variants: 256
  requests of 512 prompt / 256 output tokens, all submitted at once, one 28 GB BF16 K/V pool (13,351
  blocks of 16: every sequence fits; the same for all), scheduler 256 sequences, 4096 tokens a step,
  prompt chunks of 1024; output tokens/s.

``--variants`` picks among them (default: all); ``--quick`` (128 output tokens, 64 requests, 3 GEMM
sizes) took about a minute a part on the H200 in session 13 with three variants.

Targets (issue #28): single stream FP8 <= 0.6x and INT4 <= 0.4x BF16's ms/token; serving FP8 >= 1.6x BF16.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks._settings import applied, parse_setting

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPE = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 2048,  # (8192 in Llama 3: fewer decode-graph width buckets to capture here)
    "rope_theta": 500000.0,
}
# --tiny: the script's own check on a CPU (the single and serving parts, on the float32 reference path)
TINY = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "head_dim": 32,
}
DEVICE = "cuda"
PROJECTIONS = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}
# variant -> (projection quantization, LM head quantization); "int4" is int4-rtn (see `single` above)
VARIANTS = {
    "bf16": (None, None),
    "fp8": ("fp8", None),
    "fp8+head-fp8": ("fp8", "fp8"),
    "int4": ("int4-rtn", None),
    "int4+head-fp8": ("int4-rtn", "fp8"),
    "fp8-skinny": ("fp8", None),
    "fp8-skinny-all": ("fp8", None),
}
SERVING_VARIANTS = ("bf16", "fp8", "fp8+head-fp8", "fp8-skinny", "fp8-skinny-all")
# FP8 dispatch settings of trtforge.llm.quant.linear a variant runs under (set before its executor is
# built: the fused layers read the limits then): W8A8 at 2..64 tokens on the skinny wgmma GEMM instead of
# cuBLASLt; "-all": one token too (no weight-only GEMV)
DISPATCH = {
    "fp8-skinny": {"FP8_SKINNY_MAX_TOKENS": 64},
    "fp8-skinny-all": {"FP8_SKINNY_MAX_TOKENS": 64, "FP8_WEIGHT_ONLY_MAX_TOKENS": 0},
}


@contextlib.contextmanager
def dispatch(name: str):
    """trtforge's FP8 dispatch limits as variant `name` wants them, restored after."""
    import trtforge.llm.quant.linear as linear

    saved = {k: getattr(linear, k) for k in DISPATCH.get(name, {})}
    for k, v in DISPATCH.get(name, {}).items():
        setattr(linear, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(linear, k, v)


def build(layers: int) -> torch.nn.Module:
    """A random BF16 Llama-3-8B-shaped model, initialized on the GPU (std 0.02)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**(SHAPE | {"num_hidden_layers": layers}))
    torch.set_default_dtype(torch.bfloat16 if DEVICE == "cuda" else torch.float32)
    try:
        with torch.device(DEVICE):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    return model.eval()


def variant(name: str, layers: int) -> torch.nn.Module:
    from trtforge.llm.quant import quantize_model

    model = build(layers)
    method, lm_head = VARIANTS[name]
    quantize_model(model, method, lm_head_quantization=lm_head)
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return model


def _bench_ms(fn, rep: int = 100) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep))


def _projection(n: int, k: int, ms: tuple[int, ...], g: torch.Generator) -> tuple[dict, dict]:
    """One projection's GEMM rows (correctness, then TFLOP/s by M) and M=1 GEMVs (TB/s)."""
    from trtforge.kernels.gemv import gemv
    from trtforge.kernels.qweight import fp8_linear_reference, quantize_fp8, quantize_int4, quantize_rows_fp8
    from trtforge.llm.quant.linear import quant_linear

    w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02
    q8, q4 = quantize_fp8(w), quantize_int4(w)
    # correctness first: each kernel against its format's float32 reference
    x = torch.randn(32, k, device="cuda", generator=g, dtype=torch.bfloat16)
    ref8 = fp8_linear_reference(x, q8)
    x1 = x[:1].contiguous()
    ref1 = x1.float() @ q8.dequantize().t()  # the FP8 GEMV is weight-only (W8A16)
    ref4 = x1.float() @ q4.dequantize().t()
    row: dict = {
        "fp8_scaled_mm_rel_err": ((quant_linear(x, q8).float() - ref8).norm() / ref8.norm()).item(),
        "fp8_gemv_rel_err": ((gemv(x1, q8).float() - ref1).norm() / ref1.norm()).item(),
        "int4_gemv_rel_err": ((gemv(x1, q4).float() - ref4).norm() / ref4.norm()).item(),
    }
    for m in ms:
        xm = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        xq, sx = quantize_rows_fp8(xm)
        flops = 2 * m * n * k
        t_mm = _bench_ms(lambda xm=xm: torch.mm(xm, w.t()))
        t_8 = _bench_ms(
            lambda xq=xq, sx=sx: torch._scaled_mm(
                xq, q8.data.t(), scale_a=sx, scale_b=q8.scale[None, :], out_dtype=torch.bfloat16
            )
        )
        t_8all = _bench_ms(lambda xm=xm: quant_linear(xm, q8))
        row[f"M{m}"] = {
            "bf16_tflops": flops / t_mm / 1e9,
            "fp8_scaled_mm_tflops": flops / t_8 / 1e9,
            "fp8_with_act_quant_tflops": flops / t_8all / 1e9,
        }
    gv = {}
    for label, weight, nbytes in (
        ("bf16", w, w.numel() * 2),
        ("fp8", q8, q8.nbytes),
        ("int4", q4, q4.nbytes),
    ):
        t = _bench_ms(lambda weight=weight: gemv(x1, weight), rep=200)
        gv[label] = {"us": t * 1e3, "tb_per_s": nbytes / t / 1e9, "weight_mb": nbytes / 1e6}
    return row, gv


def kernels_part(quick: bool) -> dict:
    out: dict = {"gemm": {}, "gemv": {}}
    g = torch.Generator(device="cuda").manual_seed(0)
    ms = (16, 256, 4096) if quick else (16, 64, 256, 1024, 4096, 8192)
    for name, (n, k) in PROJECTIONS.items():
        row, gv = _projection(n, k, ms, g)
        out["gemm"][name], out["gemv"][name] = row, gv
        errors = {key: v for key, v in row.items() if "err" in key}
        print(name, json.dumps({"errors": errors, "gemv": gv}), flush=True)
    return out


def kernel_profile(model, prompt: list[int], tokens: int = 32, pdl: bool = True) -> dict:
    """Where a single-stream token's GPU time goes: `tokens` streamed tokens through the CUDA-graph
    executor under torch.profiler, kernels summed by name (us a token, top 12) beside the total. With
    `pdl` False the graphs are captured without programmatic dependent launches (``TRTFORGE_PDL=0``), so
    no kernel's span includes waiting for the one before: its own duration, at some cost in speed."""
    import os

    from bench_serving import LLMEngine, SamplingParams, TorchExecutor
    from bench_throughput import gpu_trace_summary
    from torch.profiler import ProfilerActivity, profile

    from trtforge.kernels.gemv import pdl_supported

    before = os.environ.get("TRTFORGE_PDL")
    if not pdl:
        os.environ["TRTFORGE_PDL"] = "0"
    pdl_supported.cache_clear()
    try:
        ex = TorchExecutor(model, num_blocks=256, block_size=16, static_decode=True, max_decode_batch=1)
        ex.capture_decode_graphs()
        with LLMEngine(ex) as engine:
            engine.generate([prompt[::-1]], SamplingParams(max_tokens=8, ignore_eos=True))
            stream = engine.stream(prompt, SamplingParams(max_tokens=tokens + 1, ignore_eos=True))
            next(stream)  # the prefill's token: not profiled
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in stream:
                    pass
            wall_us = (time.perf_counter() - t0) * 1e6 / tokens
    finally:
        if before is None:
            os.environ.pop("TRTFORGE_PDL", None)
        else:
            os.environ["TRTFORGE_PDL"] = before
        pdl_supported.cache_clear()
    sums: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            sums[ev.name] = sums.get(ev.name, 0.0) + ev.device_time / tokens  # us a token
    top = sorted(sums.items(), key=lambda kv: -kv[1])[:12]
    trace = gpu_trace_summary(prof)
    return {
        "pdl": pdl,
        "wall_us_per_token_profiled": wall_us,
        "kernel_us_per_token": sum(sums.values()),
        "busy_us_per_token_profiled": trace["busy_ms"] * 1e3 / tokens if trace else None,
        "graph_replay_us": _graph_replay_us(ex),
        "trace": trace,
        "top": [[n[:90], round(us, 2)] for n, us in top],
    }


def _graph_replay_us(ex, reps: int = 100) -> dict[str, float]:
    """The device time of each captured decode graph alone: `reps` back-to-back replays between CUDA
    events, us a replay (its kernels and the launch gaps inside it; no host work, no eager kernels).
    Beside the served ms/token it tells a device-bound step from one that waits for the host."""
    from bench_decode_layer import replay_ms

    graphs = sorted(ex._graphs.items())  # (batch bucket, width bucket, q_len, gemv rows)
    return {"x".join(map(str, key)): replay_ms(graph, reps) * 1e3 for key, graph in graphs}


INT4_MMA_KNOBS = ("early", "late", "gr72", "nogr", "first", "nofirst", "onepass", "twopass")


def _int4_mma_setting(text: str) -> str:
    """--int4-mma's value: on, off, or knobs joined by + (INT4_MMA_KNOBS)."""
    if not (text in ("on", "off") or all(kn in INT4_MMA_KNOBS for kn in text.split("+"))):
        raise argparse.ArgumentTypeError(
            f"--int4-mma takes on, off, or {' / '.join(INT4_MMA_KNOBS)} joined by '+' (e.g. early+gr72), "
            f"not {text!r}"
        )
    return text


def single_workload(quick: bool) -> tuple[list[int], int]:
    """The single-stream request: a 512-token random prompt (fixed seed) and 256 output tokens (128
    quick); on the CPU (--tiny) 32 and 8."""
    prompt = torch.randint(
        3, SHAPE["vocab_size"], (512,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    olen = 128 if quick else 256
    if DEVICE == "cpu":
        prompt, olen = prompt[:32], 8
    return prompt, olen


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def single_ab(quick: bool, layers: int, variants: list[str], ab: list[str], rounds: int) -> dict:
    """Single-stream ms/token of each variant under each --ab setting, alternating the settings for
    `rounds` rounds on one model (graphs captured again at each run); per setting the median of its
    rounds and its ratio to the first setting's, and each setting's median ratio to BF16's."""
    from bench_serving import single_stream

    prompt, olen = single_workload(quick)
    parsed = {text: parse_setting(text) for text in ab}
    out: dict = {"prompt_tokens": len(prompt), "output_tokens": olen, "settings": ab, "rounds": rounds}
    for method in variants:
        runs: dict[str, list[float]] = {text: [] for text in ab}
        tokens: dict[str, list[int]] = {}
        with dispatch(method):
            model = variant(method, layers)
            for r in range(rounds):
                for text in ab:
                    with applied(parsed[text]):
                        res = single_stream(model, prompt, olen, graphs=True)
                    runs[text].append(res["itl_ms_mean"])
                    tokens.setdefault(text, res["tokens"])
                    print(
                        f"single stream {method} [{text}] round {r}: {res['itl_ms_mean']:.4f} ms/token",
                        flush=True,
                    )
        med = {text: statistics.median(v) for text, v in runs.items()}
        out[method] = {
            "ms_per_token": runs,
            "median": med,
            "over_first": {t: med[t] / med[ab[0]] for t in ab},
            # greedy tokens each setting shares with the first setting's before they part (a setting that
            # computes something else parts at once; a different summation order, at a near tie, if ever)
            "same_tokens_as_first": {t: _common_prefix(tokens[t], tokens[ab[0]]) for t in ab},
            "tokens": olen,
        }
        del model
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if "bf16" in out:
        out["ratio_to_bf16"] = {
            f"{m} [{t}]": out[m]["median"][t] / out["bf16"]["median"][t]
            for m in variants if m != "bf16" for t in ab
        }  # fmt: skip
        print("ratio to bf16, same setting:", json.dumps(out["ratio_to_bf16"], indent=1), flush=True)
    return out


def single_part(
    quick: bool,
    layers: int,
    variants: list[str],
    reduce: tuple[str, ...] = ("on",),
    int4_mma: tuple[str, ...] = ("on",),
    profile_kernels: bool = False,
    fast_argmax: tuple[str, ...] = ("on",),
) -> dict:
    """Single-stream ms/token of each variant; FP8 variants once per one-row reducing-loop setting of
    `reduce` ("on": the default rule, "off": never; keys ``"<variant> (reduce off)"``), INT4 variants
    once per `int4_mma` setting (the one-row tensor-core GEMV, gemv.INT4_MMA; keys ``"<variant> (mma
    off)"``), and once per further `fast_argmax` setting (kernels.argmax.FAST_ARGMAX; keys ``"<variant>
    (fast argmax on)"``), same model."""
    from bench_serving import single_stream

    from trtforge.kernels import argmax as argmax_mod
    from trtforge.kernels import gemv as gemv_mod
    from trtforge.kernels import int4_mma as int4_mma_mod

    rule = gemv_mod.FP8_REDUCE_MIN_PROGRAMS_PER_SM
    wide = gemv_mod.FP8_REDUCE_WIDE_MIN_PROGRAMS_PER_SM

    argmax_default = argmax_mod.FAST_ARGMAX
    early_default, gated_maxnreg = int4_mma_mod.EARLY_WEIGHTS, int4_mma_mod.GATED_MAXNREG
    first_default, one_pass_default = int4_mma_mod.FIRST_LOADS_EARLY, int4_mma_mod.ONE_PASS_NORM

    prompt, olen = single_workload(quick)
    out: dict = {"prompt_tokens": len(prompt), "output_tokens": olen}
    for method in variants:
        with dispatch(method):
            model = variant(method, layers)
            settings, label = (reduce, "reduce") if method.startswith("fp8") else (("on",), "")
            if method.startswith("int4"):
                settings, label = int4_mma, "mma"
            runs = [(st, fast_argmax[0]) for st in settings] + [(settings[0], fa) for fa in fast_argmax[1:]]
            for setting, fast in runs:
                argmax_mod.FAST_ARGMAX = fast == "on"
                off = label == "reduce" and setting == "off"
                gemv_mod.FP8_REDUCE_MIN_PROGRAMS_PER_SM = float("inf") if off else rule
                rows4 = label == "reduce" and setting == "rows4"
                gemv_mod.FP8_REDUCE_WIDE_MIN_PROGRAMS_PER_SM = float("inf") if rows4 else wide
                gemv_mod.INT4_MMA = label != "mma" or setting != "off"
                knobs = setting.split("+") if label == "mma" else []
                int4_mma_mod.EARLY_WEIGHTS = "late" not in knobs and ("early" in knobs or early_default)
                cap = None if "nogr" in knobs else gated_maxnreg
                int4_mma_mod.GATED_MAXNREG = 72 if "gr72" in knobs else cap
                first = "first" in knobs or ("nofirst" not in knobs and first_default)
                int4_mma_mod.FIRST_LOADS_EARLY = first
                one = "onepass" in knobs or ("twopass" not in knobs and one_pass_default)
                int4_mma_mod.ONE_PASS_NORM = one
                r = single_stream(model, prompt, olen, graphs=True)
                r.pop("tokens")
                name = method if setting == settings[0] else f"{method} ({label} {setting})"
                if fast != fast_argmax[0]:
                    name = f"{method} (fast argmax {fast})"
                out[name] = r
                print(
                    f"single stream {name}: {r['itl_ms_mean']:.3f} ms/token (p50 {r['itl_ms_p50']:.3f})",
                    flush=True,
                )
                if profile_kernels and DEVICE == "cuda" and setting == settings[0] and fast == fast_argmax[0]:
                    for pdl in (True, False):
                        key = f"{method} profile" + ("" if pdl else " (no PDL)")
                        try:
                            prof = kernel_profile(model, prompt, pdl=pdl)
                        except Exception as e:  # recorded; the timings go on
                            out[key] = {"error": repr(e)}
                            print(f"{key} failed: {e!r}", flush=True)
                            continue
                        out[key] = prof
                        print(
                            f"{key}: {prof['kernel_us_per_token']:.1f} us of kernels a token "
                            f"({prof['wall_us_per_token_profiled']:.1f} us a token of wall while profiled; "
                            f"device busy {prof['busy_us_per_token_profiled']:.1f} us a token; decode graphs "
                            f"alone, us a replay: {json.dumps(prof['graph_replay_us'])})"
                        )
                        for kname, us in prof["top"]:
                            print(f"    {us:8.2f} us  {kname}", flush=True)
            gemv_mod.FP8_REDUCE_MIN_PROGRAMS_PER_SM = rule
            gemv_mod.FP8_REDUCE_WIDE_MIN_PROGRAMS_PER_SM = wide
            gemv_mod.INT4_MMA = True
            int4_mma_mod.EARLY_WEIGHTS = early_default
            int4_mma_mod.GATED_MAXNREG = gated_maxnreg
            int4_mma_mod.FIRST_LOADS_EARLY = first_default
            int4_mma_mod.ONE_PASS_NORM = one_pass_default
            argmax_mod.FAST_ARGMAX = argmax_default
        del model
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if "bf16" in out:
        base = out["bf16"]["itl_ms_mean"]
        out["ratio_to_bf16"] = {
            m: r["itl_ms_mean"] / base
            for m, r in out.items()
            if isinstance(r, dict) and "itl_ms_mean" in r and m != "bf16"
        }
    return out


def serving_part(quick: bool, layers: int, variants: list[str]) -> dict:
    from bench_serving import run_engine, workload

    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sched.scheduler import SchedulerConfig

    n, plen, olen = (64, 512, 128) if quick else (256, 512, 256)
    if DEVICE == "cpu":
        n, plen, olen = 8, 32, 8
    block = 16
    head_dim = SHAPE.get("head_dim", SHAPE["hidden_size"] // SHAPE["num_attention_heads"])
    per_token = 2 * layers * SHAPE["num_key_value_heads"] * head_dim * 2  # BF16 K/V bytes a token
    num_blocks = int(28e9 / (per_token * block)) if DEVICE == "cuda" else 64
    config = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=4096, max_prefill_chunk=1024)
    out: dict = {
        "workload": f"{n} requests, {plen} prompt / {olen} output tokens each, all submitted at once",
        "num_blocks": num_blocks,
        "block_size": block,
    }
    for method in [v for v in variants if v in SERVING_VARIANTS]:
        with dispatch(method):
            model = variant(method, layers)
            ex = TorchExecutor(
                model, num_blocks=num_blocks, block_size=block, max_decode_batch=256, max_model_len=1024
            )
            t = time.perf_counter()
            ex.capture_decode_graphs()
            ex.capture_mixed_graphs()
            capture = time.perf_counter() - t
            run_engine(ex, workload(32, (plen, plen), (16, 16), 0.0, SHAPE["vocab_size"], seed=1), config)
            reqs = workload(n, (plen, plen), (olen, olen), 0.0, SHAPE["vocab_size"], seed=0)
            r = run_engine(ex, reqs, config)
        r["graph_capture_s"] = capture
        r["quantization"] = ex.facts.quantization
        r["lm_head_quantization"] = ex.facts.lm_head_quantization
        out[method] = r
        print(f"serving {method}: {r['output_tok_per_s']:.0f} output tok/s", flush=True)
        del ex, model
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if "bf16" in out:
        base = out["bf16"]["output_tok_per_s"]
        out["over_bf16"] = {
            m: out[m]["output_tok_per_s"] / base for m in SERVING_VARIANTS if m in out and m != "bf16"
        }
        out["fp8_over_bf16"] = out["over_bf16"].get("fp8")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="kernels,single,serving")
    ap.add_argument("--quick", action="store_true", help="fewer M values, 128 output tokens, 64 requests")
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (32: the 8B model)")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (serving: {', '.join(SERVING_VARIANTS)})",
    )
    ap.add_argument(
        "--fp8-gemv-reduce",
        nargs="+",
        choices=("on", "off", "rows4"),
        default=["on"],
        help="single stream: one-row FP8 GEMVs with many programs sum each chunk as it comes (on: the "
        "default, gemv.FP8_REDUCE_MIN_PROGRAMS_PER_SM) or keep their partials to the end (off); rows4: on, "
        "but 8 weight rows a program only past that many programs at 8 rows (the rule before gemv."
        "FP8_REDUCE_WIDE_MIN_PROGRAMS_PER_SM); "
        "'on off' times both on the same model, the first named is the variant's figure",
    )
    ap.add_argument(
        "--int4-mma",
        nargs="+",
        type=_int4_mma_setting,
        default=["on"],
        help="single stream: one-row INT4 GEMVs on the tensor cores (on: the module defaults, gemv.INT4_MMA; "
        "early / late: int4_mma.EARLY_WEIGHTS on / off, a PDL launch prefetching its first words; gr72 / "
        "nogr: int4_mma.GATED_MAXNREG 72 / none; first / nofirst: int4_mma.FIRST_LOADS_EARLY on / off; "
        "onepass / twopass: int4_mma.ONE_PASS_NORM on / off; "
        "joined with +, e.g. early+gr72) or the FMA kernel (off); 'on off' "
        "times both on the same model, the first named is the figure",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="single stream: also profile each variant's kernels (torch.profiler over 32 graph-replayed "
        "tokens at the first setting, with PDL as served and again without it, where no kernel's span "
        "includes waiting for the previous one): us a token by kernel name",
    )
    ap.add_argument(
        "--fast-argmax",
        nargs="+",
        choices=("on", "off"),
        default=["on"],
        help="single stream: greedy argmax split over many programs (kernels.argmax.FAST_ARGMAX, on: the "
        "default) or torch.argmax (off); 'on off' times each variant both ways, the first named is the "
        "figure",
    )
    ap.add_argument(
        "--ab",
        nargs="+",
        default=None,
        metavar="SETTING",
        help="single stream instead of the knobs above: each variant under each SETTING (base, or "
        "module.NAME=value of trtforge.kernels joined by '+', e.g. decode_attention.PDL_EARLY_DEPENDENTS=True"
        "+gemv.EARLY_BYTES=128), alternating for --ab-rounds rounds on one model; medians and ratios",
    )
    ap.add_argument("--ab-rounds", type=int, default=3, help="rounds of --ab (default 3)")
    ap.add_argument("--tiny", action="store_true", help="check the script on a CPU (tiny model)")
    args = ap.parse_args()
    global DEVICE, SHAPE
    for text in args.ab or []:  # a bad --ab ends the run before the model is built
        try:
            parse_setting(text)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--ab {text!r}: {e}")

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if args.tiny:
        DEVICE, SHAPE = "cpu", TINY
        args.layers = TINY["num_hidden_layers"]
        args.parts = ",".join(p for p in args.parts.split(",") if p.strip() != "kernels")
    elif not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (--tiny checks the script on the CPU)")
    results: dict = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "capability": list(torch.cuda.get_device_capability()) if DEVICE == "cuda" else None,
        "torch": torch.__version__,
        "shape": SHAPE | {"num_hidden_layers": args.layers},
        "quick": args.quick,
        "fp8_gemv_reduce": args.fp8_gemv_reduce,
        "int4_mma": args.int4_mma,
        "fast_argmax": args.fast_argmax,
    }
    parts = {
        "kernels": lambda: kernels_part(args.quick),
        "single": lambda: (
            single_ab(args.quick, args.layers, variants, args.ab, args.ab_rounds)
            if args.ab
            else single_part(
                args.quick,
                args.layers,
                variants,
                tuple(args.fp8_gemv_reduce),
                tuple(args.int4_mma),
                args.profile,
                tuple(args.fast_argmax),
            )
        ),
        "serving": lambda: serving_part(args.quick, args.layers, variants),
    }
    for name in [p.strip() for p in args.parts.split(",") if p.strip()]:
        t = time.perf_counter()
        try:
            results[name] = parts[name]()
        except Exception as e:  # recorded; the other parts still run
            results[name] = {"error": repr(e), "traceback": traceback.format_exc()[-2000:]}
            print(f"{name} failed: {e!r}", flush=True)
        results[name + "_s"] = round(time.perf_counter() - t, 1)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
    summary = {
        "single_ratio_to_bf16": results.get("single", {}).get("ratio_to_bf16"),
        "serving_over_bf16": results.get("serving", {}).get("over_bf16"),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
