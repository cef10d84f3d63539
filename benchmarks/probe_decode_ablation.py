"""Probe: what each op of a single-stream decode step costs at the margin, on the 8B shape (CUDA).

    PYTHONPATH=. python3 benchmarks/probe_decode_ablation.py --variants bf16 fp8+head-fp8 int4+head-fp8 \
        --out ablation.json

Issue #28's single-stream ratios (FP8 <= 0.6x, INT4 <= 0.4x BF16's ms/token) need device time off a
one-token decode graph, and the kernels' times alone do not say where: with programmatic dependent
launches the kernels overlap, so a profile's durations do not add up to the graph's time. This probe
measures each op's *marginal* cost instead. For each variant (bench_quant_speed's random-weight Llama-3-8B
model) it builds the executor as the single-stream benchmark does, then for each ablation replaces one
op of every layer by a no-op that returns a buffer of the right shape (the values are garbage; nothing
here checks them), captures the decode graphs again, decodes a few tokens after a 512-token prompt so
the graphs' inputs hold a served step's context, and times the graph of that context's width bucket
replayed back to back (:func:`bench_decode_layer.replay_ms`). The op's marginal cost is the baseline's
replay minus the ablated one's; the baseline runs first and last, so the drift between is printed too.

Ablations: ``qkv`` (norm + QKV GEMV), ``rope`` (RoPE + the K/V write), ``attn`` (split-KV decode
attention, with its reduction), ``o`` (o_proj GEMV + residual), ``gate_up`` (norm + gate/up GEMV +
SiLU), ``down`` (down GEMV + residual), ``head`` (final norm + LM-head GEMV), and ``rope+attn``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

ABLATIONS = ("qkv", "rope", "attn", "o", "gate_up", "down", "head", "rope+attn")


@contextlib.contextmanager
def ablated(ex, what: str):
    """Executor `ex` with the ops of `what` (names joined by +) replaced by no-ops, restored after."""
    import trtforge.llm.executors.fused_layers as fl

    parts = set(what.split("+")) if what != "none" else set()
    fused = ex._fused
    if fused is None:
        raise SystemExit("the model did not take the fused layers: nothing to ablate")
    qkv_ids = {id(w) for w, _ in fused.qkv_w}
    o_ids, down_ids = {id(w) for w in fused.o_w}, {id(w) for w in fused.down_w}
    head_id = id(fused.head_w)
    saved = {n: getattr(fl, n) for n in ("norm_gemv", "rope_and_cache", "gemv_residual", "norm_gate_up_silu")}
    saved_attn = ex.attention
    real = dict(saved)
    qkv_cols = (fused.num_heads + 2 * fused.num_kv_heads) * fused.head_dim

    def norm_gemv(h, weight, eps, w, b=None):
        if ("qkv" in parts and id(w) in qkv_ids) or ("head" in parts and id(w) == head_id):
            cols = qkv_cols if id(w) in qkv_ids else int(ex.model.config.vocab_size)
            return torch.empty((h.shape[0], cols), dtype=h.dtype, device=h.device)
        return real["norm_gemv"](h, weight, eps, w, b)

    def rope_and_cache(qkv, cos, sin, slots, kp, vp, nh, nkv, ks=1.0, vs=1.0, out=None):
        if "rope" in parts:
            return (
                out
                if out is not None
                else torch.empty((qkv.shape[0], nh, fused.head_dim), dtype=qkv.dtype, device=qkv.device)
            )
        return real["rope_and_cache"](qkv, cos, sin, slots, kp, vp, nh, nkv, ks, vs, out=out)

    def gemv_residual(x, w, residual):
        if ("o" in parts and id(w) in o_ids) or ("down" in parts and id(w) in down_ids):
            return residual
        return real["gemv_residual"](x, w, residual)

    def norm_gate_up_silu(h, weight, eps, w):
        if "gate_up" in parts:
            inter = int(ex.model.config.intermediate_size)
            return torch.empty((h.shape[0], inter), dtype=h.dtype, device=h.device)
        return real["norm_gate_up_silu"](h, weight, eps, w)

    def attention(q, kp, vp, meta, scale, window, out=None, **kv):
        if "attn" in parts:
            return out if out is not None else torch.empty_like(q)
        if out is not None:
            return saved_attn(q, kp, vp, meta, scale, window, out=out, **kv)
        return saved_attn(q, kp, vp, meta, scale, window, **kv)

    fl.norm_gemv, fl.rope_and_cache = norm_gemv, rope_and_cache
    fl.gemv_residual, fl.norm_gate_up_silu = gemv_residual, norm_gate_up_silu
    ex.attention = attention
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(fl, n, f)
        ex.attention = saved_attn


def measure(model, prompt: list[int], what: str, reps: int) -> dict:
    """One executor with `what` ablated: its decode graphs captured, a few tokens decoded after `prompt`,
    then each graph's replay time (us) and the width bucket the served context uses."""
    from bench_decode_layer import replay_ms

    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.sched.scheduler import SchedulerConfig

    ex = TorchExecutor(model, num_blocks=256, block_size=16, static_decode=True, max_decode_batch=1)
    with ablated(ex, what):
        ex.capture_decode_graphs()
        with LLMEngine(ex, SchedulerConfig()) as engine:
            engine.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))
            context = len(prompt) + 8
            width = -(-context // 16)
            keys = sorted(ex._graphs)
            key = min((k for k in keys if k[1] >= width), key=lambda k: k[1])
            graph = ex._graphs[key]
            times = [replay_ms(graph, reps) * 1e3 for _ in range(5)]
    del ex
    gc.collect()
    torch.cuda.empty_cache()
    return {"bucket": "x".join(map(str, key)), "us_runs": times, "us": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["bf16", "fp8+head-fp8"])
    ap.add_argument("--ablations", nargs="+", default=list(ABLATIONS))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=50, help="replays a timing (5 timings a graph, median)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from bench_quant_speed import dispatch, single_workload, variant

    prompt, _ = single_workload(True)
    result: dict = {"device": torch.cuda.get_device_name(), "layers": args.layers, "variants": {}}
    for name in args.variants:
        with dispatch(name):
            model = variant(name, args.layers)
            rows: dict = {}
            order = ["none", *args.ablations, "none"]
            for i, what in enumerate(order):
                key = what if i < len(order) - 1 else "none (again)"
                rows[key] = measure(model, prompt, what, args.reps)
                print(f"{name:14s} {key:14s} {rows[key]['us']:9.1f} us  ({rows[key]['bucket']})", flush=True)
        base = statistics.mean([rows["none"]["us"], rows["none (again)"]["us"]])
        margins = {w: base - rows[w]["us"] for w in args.ablations}
        result["variants"][name] = {"rows": rows, "baseline_us": base, "marginal_us_a_step": margins}
        print(f"{name}: baseline {base:.1f} us a token; marginal us a token (a layer):", flush=True)
        for w, m in margins.items():
            per = m / args.layers if w != "head" else m
            print(f"    {w:10s} {m:8.1f}  ({per:6.2f})", flush=True)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
