"""Benchmark: tensor parallelism on 2 GPUs (issue #31): Llama-3-8B at TP=1 vs TP=2, a 70B shape at TP=2.

NOT RUN YET: written in a session without a multi-GPU machine (2xH200 kinds were withheld). The lead
runs it when a 2xH200 machine (``nvidia-h200-x2``) is lent; only ``--dry-run`` (the roofline math)
and ``--tiny`` (the whole script on the CPU, gloo) have run so far.

    PYTHONPATH=. python3 benchmarks/bench_tensor_parallel.py --out tp.json            # 2xH200, ~10 min
    PYTHONPATH=. python3 benchmarks/bench_tensor_parallel.py --quick --out tp.json    # ~4 min
    PYTHONPATH=. python3 benchmarks/bench_tensor_parallel.py --dry-run                # roofline only
    PYTHONPATH=. python3 benchmarks/bench_tensor_parallel.py --tiny                   # CPU check

Cases (``--cases``): ``8b-tp1`` and ``8b-tp2`` (Llama-3-8B shape), ``70b-tp2`` (Llama-3-70B shape, ~141
GB in BF16: it fits no single H200). Weights are random BF16, built shape-only (meta) and materialised
on each rank after sharding, so no process ever holds the whole 70B model. Each case serves through
``trtforge.llm.from_pretrained(..., tensor_parallel_size=N)`` (pool sized by ``gpu_memory_utilization``)
and reports:

- single stream: one request (``--single-prompt`` tokens in, ``--single-output`` out), ms/token over
  its decode steps (first token excluded), after a warm-up request;
- serving: the 1000/1000 workload, ``--requests`` requests of ``--isl`` prompt tokens and ``--osl``
  output tokens (EOS ignored) submitted at once; output tokens/s over the wall time;
- the bandwidth bounds (``--bandwidth-tbs`` per GPU, H200: 4.8): a decode step reads every rank's
  weights share (LM head included, the embedding is a lookup) and its KV share, in parallel; the
  all-reduces (2 per layer) are not in the bound.

Acceptance (issue #31): 8B TP=2 single-stream ms/token <= 0.6x TP=1, serving >= 1.7x TP=1; the 70B shape
served at TP=2 with its figures against its bound. The JSON (``--out``) holds every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_http import SHAPES as _SERVING_SHAPES

# the serving benchmarks' 8B and tiny shapes (bench_http: the one 8B builder's), and a 70B one
SHAPES: dict[str, dict[str, Any]] = {
    **_SERVING_SHAPES,
    "70b": {
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    },
}
CASES = {"8b-tp1": ("8b", 1), "8b-tp2": ("8b", 2), "70b-tp2": ("70b", 2), "tiny-tp1": ("tiny", 1)}
CASES["tiny-tp2"] = ("tiny", 2)


def _config(shape: str) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        **{**SHAPES[shape], "max_position_embeddings": 4096, "rope_theta": 500000.0},
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )


def _meta_model(shape: str) -> Any:
    """The shape with no storage (each rank materialises its shard: executors.tensor_parallel)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(_config(shape)).eval()


def factory_8b() -> tuple[Any, None]:
    return _meta_model("8b"), None


def factory_70b() -> tuple[Any, None]:
    return _meta_model("70b"), None


def factory_tiny() -> tuple[Any, None]:
    return _meta_model("tiny"), None


# ---- roofline ------------------------------------------------------------------------------------
def weight_bytes(shape: str, itemsize: int = 2) -> dict[str, int]:
    """Bytes of the projections of all layers and of the LM head (what a decode step reads)."""
    s = SHAPES[shape]
    h, i, heads, kv = (
        s["hidden_size"],
        s["intermediate_size"],
        s["num_attention_heads"],
        s["num_key_value_heads"],
    )
    d = h // heads
    layer = 2 * h * heads * d + 2 * h * kv * d + 3 * h * i
    return {
        "layers": s["num_hidden_layers"] * layer * itemsize,
        "lm_head": s["vocab_size"] * h * itemsize,
        "embedding": s["vocab_size"] * h * itemsize,
    }


def kv_bytes_per_token(shape: str, itemsize: int = 2) -> int:
    s = SHAPES[shape]
    d = s["hidden_size"] // s["num_attention_heads"]
    return 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * d * itemsize


def roofline(shape: str, tp: int, batch: int, context: float, bandwidth_tbs: float) -> dict[str, float]:
    """A decode step's bandwidth bound on one of `tp` ranks: its share of the weights and of `batch`
    sequences' K/V at mean length `context`, read once at `bandwidth_tbs`."""
    w = weight_bytes(shape)
    per_rank = (w["layers"] + w["lm_head"]) / tp
    kv = batch * context * kv_bytes_per_token(shape) / tp
    step_s = (per_rank + kv) / (bandwidth_tbs * 1e12)
    return {
        "weights_gb_per_rank": per_rank / 1e9,
        "model_gb": (w["layers"] + w["lm_head"] + w["embedding"]) / 1e9,
        "kv_gb_per_rank_per_step": kv / 1e9,
        "step_ms": step_s * 1e3,
        "tokens_per_s": batch / step_s,
        "all_reduces_per_step": 2 * SHAPES[shape]["num_hidden_layers"],
    }


# ---- measurements --------------------------------------------------------------------------------
def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(2, vocab, size=(n, length)).tolist()


def single_stream(llm: Any, prompt_len: int, output: int, vocab: int) -> dict[str, float]:
    """ms/token of one request's decode steps (its first token, the prefill's, excluded)."""
    from trtforge.llm import SamplingParams

    params = SamplingParams(max_tokens=output, ignore_eos=True)
    warm = SamplingParams(max_tokens=16, ignore_eos=True)
    list(llm.engine.submit(_prompts(1, prompt_len, vocab, 1)[0], warm))  # graph captures, tuning
    handle = llm.engine.submit(_prompts(1, prompt_len, vocab, 2)[0], params)
    times = []
    for _ in handle:
        times.append(time.perf_counter())
    steps = len(times) - 1
    return {"ms_per_token": (times[-1] - times[0]) / steps * 1e3, "tokens": len(times)}


def serving(llm: Any, requests: int, isl: int, osl: int, vocab: int) -> dict[str, float]:
    """Every request at t=0 (a saturated server): output tokens/s over the wall time."""
    from trtforge.llm import SamplingParams

    params = SamplingParams(max_tokens=osl, ignore_eos=True)
    prompts = _prompts(requests, isl, vocab, 3)
    t0 = time.perf_counter()
    done = llm.engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    errors = [c.error for c in done if c.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]!r}")
    out = sum(len(c.token_ids) for c in done)
    return {"wall_s": wall, "output_tokens": out, "output_tok_per_s": out / wall}


def run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from trtforge.llm import SchedulerConfig, from_pretrained
    from trtforge.llm.executors.tensor_parallel import materialize_random

    shape, tp = CASES[name]
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    config = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        max_prefill_chunk=args.prefill_chunk,
    )
    sizes = {"num_blocks": args.num_blocks, "gpu_memory_utilization": args.gpu_memory_utilization}
    t0 = time.perf_counter()
    if tp == 1:  # one process: the shape built here, random weights on the device
        model = _meta_model(shape)
        materialize_random(model, torch.device(device), dtype)
        llm = from_pretrained(model, device=device, dtype=dtype, config=config, **sizes)
    else:  # each rank builds its own shard from the factory
        source = f"benchmarks.bench_tensor_parallel:factory_{shape}"
        llm = from_pretrained(
            source, device=device, dtype=dtype, config=config, tensor_parallel_size=tp, **sizes
        )
    start_s = time.perf_counter() - t0
    vocab = SHAPES[shape]["vocab_size"]
    try:
        facts = llm.executor.facts
        one = single_stream(llm, args.single_prompt, args.single_output, vocab)
        many = serving(llm, args.requests, args.isl, args.osl, vocab)
    finally:
        llm.close()
    ctx = args.single_prompt + args.single_output / 2
    bound_one = roofline(shape, tp, 1, ctx, args.bandwidth_tbs)
    batch = min(args.max_num_seqs, args.requests)
    bound_many = roofline(shape, tp, batch, args.isl + args.osl / 2, args.bandwidth_tbs)
    return {
        "case": name,
        "shape": shape,
        "tensor_parallel_size": tp,
        "start_s": start_s,
        "num_blocks": facts.num_blocks,
        "kv_pool_gb": facts.kv_pool_bytes / 1e9,
        "single_stream": one | {"bound_ms_per_token": bound_one["step_ms"]},
        "serving": many | {"bound_tok_per_s": bound_many["tokens_per_s"], "bound_batch": batch},
    }


def verdict(results: dict[str, dict]) -> dict[str, Any]:
    """The issue's two 8B ratios, where both cases ran."""
    a, b = results.get("8b-tp1"), results.get("8b-tp2")
    if not (a and b):
        return {}
    ms = b["single_stream"]["ms_per_token"] / a["single_stream"]["ms_per_token"]
    tput = b["serving"]["output_tok_per_s"] / a["serving"]["output_tok_per_s"]
    return {
        "single_stream_ratio_tp2_over_tp1": ms,
        "single_stream_target": "<= 0.6",
        "single_stream_ok": ms <= 0.6,
        "throughput_ratio_tp2_over_tp1": tput,
        "throughput_target": ">= 1.7",
        "throughput_ok": tput >= 1.7,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=None)
    ap.add_argument("--quick", action="store_true", help="fewer requests and tokens (~4 min)")
    ap.add_argument("--dry-run", action="store_true", help="print the roofline of each case, run nothing")
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (gloo): checks the script")
    ap.add_argument("--requests", type=int, default=None, help="serving requests (default 256; quick 64)")
    ap.add_argument("--isl", type=int, default=1000, help="serving prompt tokens")
    ap.add_argument("--osl", type=int, default=None, help="serving output tokens (default 1000; quick 256)")
    ap.add_argument("--single-prompt", type=int, default=128)
    ap.add_argument("--single-output", type=int, default=None, help="default 256; quick 64")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-batched-tokens", type=int, default=4096)
    ap.add_argument("--prefill-chunk", type=int, default=1024)
    ap.add_argument("--num-blocks", type=int, default=None, help="default: sized to the GPU memory")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth per GPU (H200: 4.8)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.tiny:
        args.cases = args.cases or ["tiny-tp1", "tiny-tp2"]
        args.requests, args.isl, args.osl = args.requests or 8, 32, args.osl or 16
        args.single_prompt, args.single_output = 16, args.single_output or 16
        args.num_blocks = args.num_blocks or 64
    args.cases = args.cases or ["8b-tp1", "8b-tp2", "70b-tp2"]
    args.requests = args.requests or (64 if args.quick else 256)
    args.osl = args.osl or (256 if args.quick else 1000)
    args.single_output = args.single_output or (64 if args.quick else 256)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    results: dict[str, Any] = {"args": vars(args), "cases": {}, "roofline": {}}
    for name in args.cases:
        shape, tp = CASES[name]
        batch = min(args.max_num_seqs, args.requests)
        results["roofline"][name] = {
            "single_stream": roofline(
                shape, tp, 1, args.single_prompt + args.single_output / 2, args.bandwidth_tbs
            ),
            "serving": roofline(shape, tp, batch, args.isl + args.osl / 2, args.bandwidth_tbs),
        }
        r = results["roofline"][name]
        print(
            f"{name}: model {r['serving']['model_gb']:.1f} GB, {r['serving']['weights_gb_per_rank']:.1f} GB "
            f"weights/rank/step; bound {r['single_stream']['step_ms']:.2f} ms/token single stream, "
            f"{r['serving']['tokens_per_s']:.0f} tok/s at batch {batch}",
            flush=True,
        )
    if not args.dry_run:
        for name in args.cases:
            if not args.tiny:
                import torch

                need = CASES[name][1]
                if torch.cuda.device_count() < need:
                    print(f"{name}: skipped, needs {need} GPUs, has {torch.cuda.device_count()}", flush=True)
                    continue
            r = run_case(name, args)
            results["cases"][name] = r
            s, m = r["single_stream"], r["serving"]
            print(
                f"{name}: start {r['start_s']:.0f} s; single stream {s['ms_per_token']:.2f} ms/token "
                f"(bound {s['bound_ms_per_token']:.2f}); serving {m['output_tok_per_s']:.0f} tok/s "
                f"(bound {m['bound_tok_per_s']:.0f}) over {m['wall_s']:.1f} s",
                flush=True,
            )
            if args.out:  # after every case: a later one that fails keeps the earlier figures
                Path(args.out).write_text(json.dumps(results, indent=2))
        results["verdict"] = verdict(results["cases"])
        if results["verdict"]:
            print(json.dumps(results["verdict"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
