"""Benchmark: continuous batching over a paged KV cache (LLMEngine + torch executor) vs HF generate.

    PYTHONPATH=. python3 benchmarks/bench_serving.py --out serving.json  # all at once, Poisson 256/s, 64/s

A Llama-style model with random FP16 weights (TinyLlama-1.1B shape by default) serves N requests
(prompts and outputs of uniform random length) through :class:`LLMEngine`, once per arrival rate
(``--rates``: Poisson arrivals, 0 = every request at t=0, a saturated server); then
the same requests run through ``transformers`` ``generate()`` in static, left-padded batches of 64
in arrival order. Reported: output tokens/s, TTFT and inter-token latency percentiles, KV memory
held vs tokens held, and a single-stream decode latency (one request alone) with and without CUDA
graphs. HF latencies use an arrival-aligned timeline: a batch starts when its last request has
arrived and the previous batch is done, and its token times are the measured step times
(a streamer timestamps each step). ``--tiny`` runs a small model on the CPU to check the script.
The engine schedules asynchronously (one step in flight) unless ``--sync``; ``"scheduling"`` in the
JSON says which ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import itertools
import json
import os
import sys
import threading
import time

import numpy as np
import torch

from benchmarks._gcwatch import GcWatch
from benchmarks._settings import add_set_option, apply_set_option
from benchmarks.bench_throughput import triton_cache_entries
from trtforge.llm.engine import LLMEngine
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig


def build_model(tiny: bool, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        cfg = LlamaConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
        )
    else:  # TinyLlama-1.1B shape
        cfg = LlamaConfig(
            vocab_size=32000,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            max_position_embeddings=2048,
        )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def workload(n: int, prompt_range, out_range, rate: float, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate if rate > 0 else 1.0, size=n) * (rate > 0)  # same draws at any rate
    arrivals = np.cumsum(gaps) - gaps[0]
    reqs = []
    for i in range(n):
        plen = int(rng.integers(prompt_range[0], prompt_range[1] + 1))
        olen = int(rng.integers(out_range[0], out_range[1] + 1))
        reqs.append((float(arrivals[i]), rng.integers(3, vocab, size=plen).tolist(), olen))
    return reqs


def pct(values, q) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def latency_summary(ttft: list[float], itl: list[float]) -> dict:
    return {
        "ttft_ms_p50": pct(ttft, 50) * 1e3,
        "ttft_ms_p99": pct(ttft, 99) * 1e3,
        "itl_ms_p50": pct(itl, 50) * 1e3,
        "itl_ms_p99": pct(itl, 99) * 1e3,
    }


def run_engine(executor, reqs, config: SchedulerConfig) -> dict:
    mem_samples: list[tuple[int, int, int]] = []

    marks: list[tuple[float, str, int]] = []
    path_of = getattr(executor, "path_of", lambda batch: "eager")

    def hook(sched, batch):
        marks.append((time.perf_counter(), path_of(batch), batch.num_tokens))
        if sched.stats.steps % 16 == 0:
            m = sched.memory_stats()
            mem_samples.append((m.used_blocks, m.tokens_held, m.waste_slots))

    times: list[list[float]] = [[] for _ in reqs]
    submitted = [0.0] * len(reqs)
    handles = [None] * len(reqs)
    with LLMEngine(executor, config, step_hook=hook) as engine, GcWatch() as watch:

        def feeder():
            t0 = time.perf_counter()
            for i, (arrival, prompt, olen) in enumerate(reqs):
                delay = t0 + arrival - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                params = SamplingParams(max_tokens=olen, ignore_eos=True)
                submitted[i] = time.perf_counter()
                rec = times[i]
                handles[i] = engine.submit(
                    prompt,
                    params,
                    on_event=lambda e, rec=rec: (
                        rec.extend([time.perf_counter()] * len(e)) if isinstance(e, tuple) else None
                    ),
                )

        start = time.perf_counter()
        th = threading.Thread(target=feeder)
        th.start()
        th.join()
        completions = [h.result() for h in handles]
        end = time.perf_counter()
        stats = engine.stats
    out_tokens = sum(len(c.token_ids) for c in completions)
    assert out_tokens == sum(r[2] for r in reqs), "an output came back short"
    ttft = [t[0] - s for t, s in zip(times, submitted)]
    itl = [b - a for t in times for a, b in itertools.pairwise(t)]
    # host time from each step's launch to the next one's, by path (one step stays in flight: roughly
    # the device time of the step before, once the device is the bottleneck)
    paths: dict[str, dict] = {}
    spans = []
    for (t, path, tokens), nxt in zip(marks, [m[0] for m in marks[1:]] + [end]):
        row = paths.setdefault(path, {"steps": 0, "tokens": 0, "seconds": 0.0, "max_s": 0.0})
        row["steps"] += 1
        row["tokens"] += tokens
        row["seconds"] += nxt - t
        row["max_s"] = max(row["max_s"], nxt - t)
        spans.append((nxt - t, t - start, path, tokens))
    # the slowest steps (a stall, e.g. a JIT compilation, shows as one long step rather than many slow ones)
    slowest = [
        {"seconds": d, "at_s": at, "path": path, "tokens": tokens}
        for d, at, path, tokens in sorted(spans, reverse=True)[:8]
    ]
    facts = executor.facts
    bpt = facts.kv_bytes_per_token
    used = np.array([m[0] for m in mem_samples]) * facts.block_size
    held = np.array([m[1] for m in mem_samples])
    return {
        "wall_s": end - start,
        "output_tokens": out_tokens,
        "output_tok_per_s": out_tokens / (end - start),
        **latency_summary(ttft, itl),
        "steps": stats.steps,
        "step_paths": paths,
        "slowest_steps": slowest,
        "preemptions": stats.preemptions,
        "max_running": stats.max_running,
        "cuda_graphs": executor.num_cuda_graphs,
        "kv_pool_gb": facts.kv_pool_bytes / 1e9,
        "kv_held_gb_peak": float(used.max() * bpt / 1e9) if len(used) else None,
        "kv_tokens_held_peak": int(held.max()) if len(held) else None,
        "kv_slot_utilisation_mean": float((held / np.maximum(used, 1)).mean()) if len(used) else None,
        "gc": watch.summary(until_s=end - start),
    }


class _StepClock:
    """A transformers streamer that timestamps every generation step (the first put is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run_hf(model, reqs, batch_size: int, device: str) -> dict:
    total_useful, busy = 0, 0.0
    ttft, itl = [], []
    prev_end = 0.0
    for lo in range(0, len(reqs), batch_size):
        chunk = reqs[lo : lo + batch_size]
        width = max(len(p) for _, p, _ in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, (_, p, _) in enumerate(chunk):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        new = max(o for _, _, o in chunk)
        clock = _StepClock()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
            streamer=clock,
        )
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        assert out.shape[1] == width + new
        busy += dt
        start = max(chunk[-1][0], prev_end)  # the batch waits for its last arrival and the previous batch
        step_t = [t - t0 for t in clock.times[1:]]  # token k of every row at step_t[k]
        for arrival, _, olen in chunk:
            total_useful += olen
            ttft.append(start + step_t[0] - arrival)
            itl.extend(np.diff(step_t[:olen]).tolist())
        prev_end = start + dt
    span = prev_end - reqs[0][0]
    return {
        "busy_s": busy,
        "output_tokens": total_useful,
        "output_tok_per_s_busy": total_useful / busy,
        "output_tok_per_s_timeline": total_useful / span,
        **latency_summary(ttft, itl),
    }


def single_stream(model, prompt, olen, graphs: bool, kernels: str | None = None, sync: bool = False) -> dict:
    ex = TorchExecutor(
        model, num_blocks=256, block_size=16, static_decode=graphs, max_decode_batch=1, kernels=kernels
    )
    ex.capture_decode_graphs()
    with LLMEngine(ex, SchedulerConfig(async_scheduling=not sync)) as engine:
        # warm-up on a prompt of the same length but other tokens (no prefix-cache hit for the timed one)
        engine.generate([prompt[::-1]], SamplingParams(max_tokens=8, ignore_eos=True))
        stamps, tokens = [], []
        t0 = time.perf_counter()
        for token in engine.stream(prompt, SamplingParams(max_tokens=olen, ignore_eos=True)):
            stamps.append(time.perf_counter())
            tokens.append(token)
    gaps = np.diff(stamps)
    return {
        "tokens": tokens,
        "cuda_graphs": ex.num_cuda_graphs,
        "ttft_ms": (stamps[0] - t0) * 1e3,
        "itl_ms_p50": pct(gaps, 50) * 1e3,
        "itl_ms_mean": float(gaps.mean()) * 1e3,
    }


def hf_single_stream(model, prompt, olen, device) -> dict:
    clock = _StepClock()
    ids = torch.tensor([prompt], device=device)
    model.generate(input_ids=ids, do_sample=False, max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
    t0 = time.perf_counter()
    model.generate(
        input_ids=ids,
        do_sample=False,
        max_new_tokens=olen,
        min_new_tokens=olen,
        pad_token_id=0,
        streamer=clock,
    )
    gaps = np.diff(clock.times[1:])
    return {
        "ttft_ms": (clock.times[1] - t0) * 1e3,
        "itl_ms_p50": pct(gaps, 50) * 1e3,
        "itl_ms_mean": float(gaps.mean()) * 1e3,
    }


def single_stream_part(results: dict, model, reqs, device: str, args: argparse.Namespace) -> None:
    """One request alone (the first request's prompt, up to 512 tokens; 256 output tokens): CUDA-graph
    and eager decode through the engine (their tokens compared), and HF generate unless --single-only
    with --skip-hf."""
    prompt, olen = reqs[0][1][:512], 256
    single: dict = {"prompt_tokens": len(prompt), "output_tokens": olen}
    results["single_stream"] = single
    try:
        single["engine_graphs"] = single_stream(
            model, prompt, olen, device == "cuda", args.kernels, args.sync
        )
    except Exception as e:  # recorded; the eager and HF figures are still measured
        single["engine_graphs_error"] = repr(e)
    single["engine_eager"] = single_stream(model, prompt, olen, False, args.kernels, args.sync)
    if not (args.single_only and args.skip_hf):
        single["hf_generate"] = hf_single_stream(model, prompt, olen, device)
    eager_tokens = single["engine_eager"].pop("tokens")
    if "engine_graphs" in single:
        single["graph_tokens_equal_eager"] = single["engine_graphs"].pop("tokens") == eager_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt", type=int, nargs=2, default=(128, 1024))
    ap.add_argument("--output", type=int, nargs=2, default=(64, 512))
    ap.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=(0.0, 256.0, 64.0),
        help="Poisson arrivals per second, one engine run each (0: all requests at once, saturated)",
    )
    ap.add_argument("--kernels", choices=("triton", "torch"), default=None, help="executor kernels")
    ap.add_argument("--max-batched-tokens", type=int, default=4096)
    ap.add_argument("--prefill-chunk", type=int, default=1024)
    ap.add_argument(
        "--max-prefill-with-decodes", type=int, default=1024, help="prompt tokens per step while decoding"
    )
    ap.add_argument(
        "--fill-step-buckets",
        nargs="+",
        choices=("off", "on"),
        default=["on"],
        help="SchedulerConfig.fill_step_buckets values, each load run once per value (interleaved; keys of "
        "'off' runs end in _nofill)",
    )
    ap.add_argument("--kv-gb", type=float, default=16.0, help="KV pool size")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--hf-batches", type=int, default=4, help="how many HF batches to run (each --hf-batch)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument(
        "--max-graph-tokens",
        type=int,
        default=4096,
        help="steps with prompt tokens up to this many tokens run as piecewise CUDA graphs (0: eagerly)",
    )
    ap.add_argument(
        "--single-only", action="store_true", help="only the single-stream part (HF's too unless --skip-hf)"
    )
    ap.add_argument("--tiny", action="store_true", help="small model on the CPU (checks the script)")
    ap.add_argument(
        "--sync", action="store_true", help="schedule synchronously (default: one step in flight)"
    )
    add_set_option(ap)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    apply_set_option(ap, args)  # before the model and executor exist: graphs capture under the settings
    # objects gc.freeze() has set aside, by stage: old trees (no engine freeze) read ~467k in their timed
    # windows on the device (session 36), so something else in the process freezes; this says what stage
    frozen = {"start": gc.get_freeze_count()}
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.float16
    model = build_model(args.tiny, device, dtype)
    frozen["model_built"] = gc.get_freeze_count()
    cfg = model.config
    per_token = (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    )
    per_token *= torch.finfo(dtype).bits // 8
    num_blocks = int(args.kv_gb * 1e9 / (per_token * args.block_size))
    ex_kwargs = {
        "num_blocks": num_blocks,
        "block_size": args.block_size,
        "max_decode_batch": args.max_num_seqs,
        "kernels": args.kernels,
        "mixed_graphs": args.max_graph_tokens > 0,
        "max_graph_tokens": max(args.max_graph_tokens, 1),
    }
    reqs = workload(args.requests, args.prompt, args.output, args.rates[0], cfg.vocab_size, seed=0)
    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "trtforge": os.path.dirname(sys.modules["trtforge"].__file__),  # which tree ran (with_old: .old)
        "scheduling": "sync" if args.sync else "async",
        "settings": args.settings,
        "model": {
            "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size,
            "heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads,
            "vocab": cfg.vocab_size,
            "dtype": str(dtype),
        },
        "workload": {
            "requests": args.requests,
            "prompt": list(args.prompt),
            "output": list(args.output),
            "rates_per_s": list(args.rates),
            "block_size": args.block_size,
            "num_blocks": num_blocks,
            "max_num_seqs": args.max_num_seqs,
            "max_batched_tokens": args.max_batched_tokens,
            "prefill_chunk": args.prefill_chunk,
            "max_prefill_tokens_with_decodes": args.max_prefill_with_decodes,
            "max_graph_tokens": args.max_graph_tokens,
        },
        "gc_frozen_by_stage": frozen,
    }
    if args.single_only:
        single_stream_part(results, model, reqs, device, args)
        _save(results, args.out, "single_stream")
        return
    ex = TorchExecutor(model, **ex_kwargs)
    results["kernels"] = ex.kernels
    results["fused_layers"] = ex.fused_refusal is None
    t = time.perf_counter()
    try:
        results["cuda_graphs_captured"] = ex.capture_decode_graphs()
        results["piecewise_graphs_captured"] = ex.capture_mixed_graphs()
    except Exception as e:  # recorded in the results; the run goes on eagerly rather than measuring nothing
        results["graph_capture_error"] = repr(e)
        print("graph capture failed:", repr(e), flush=True)
        del ex
        ex = TorchExecutor(model, **{**ex_kwargs, "static_decode": False, "mixed_graphs": False})
    results["graph_capture_s"] = time.perf_counter() - t
    frozen["graphs_captured"] = gc.get_freeze_count()
    config = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        max_prefill_chunk=args.prefill_chunk,
        max_prefill_tokens_with_decodes=args.max_prefill_with_decodes,
        async_scheduling=not args.sync,
    )
    # Warm-up: the whole workload once, all at once and untimed, so that Triton's JIT compilations (one per
    # specialization the ragged steps meet: lengths and strides divisible by 16 or not) and the allocator's
    # growth fall outside every timed run, whichever loads are asked for. With only 8 warm-up requests a
    # saturated run measured first lost 8 s to them (results/serving.md).
    run_engine(ex, workload(args.requests, args.prompt, args.output, 0.0, cfg.vocab_size, seed=1), config)
    frozen["warmed_up"] = gc.get_freeze_count()
    save = functools.partial(_save, results, args.out)
    results["engine"] = {}
    runs: dict[str, int] = {}
    for rate in args.rates:
        # the same prompts and output lengths at every load; only the arrival times differ
        load = workload(args.requests, args.prompt, args.output, rate, cfg.vocab_size, seed=0)
        for fill in args.fill_step_buckets:
            key = f"poisson_{rate:g}_per_s" if rate > 0 else "all_at_once"
            key += "" if fill == "on" else "_nofill"
            runs[key] = runs.get(key, 0) + 1
            key += f"_run{runs[key]}" if runs[key] > 1 else ""  # a repeated variant keeps every run
            cached = triton_cache_entries()
            res = run_engine(ex, load, dataclasses.replace(config, fill_step_buckets=fill == "on"))
            after = triton_cache_entries()
            # Triton specializations compiled inside the timed run (the warm-up should have met them all)
            res["jit_compiles_in_window"] = None if None in (cached, after) else after - cached
            results["engine"][key] = res
            save("engine")
    del ex
    single_stream_part(results, model, reqs, device, args)
    save("single_stream")
    if not args.skip_hf:
        results["hf_static_batches"] = run_hf(
            model, reqs[: args.hf_batch * args.hf_batches], args.hf_batch, device
        )
        save("hf_static_batches")


def _save(results: dict, path: str | None, key: str) -> None:
    """Print the newest section and rewrite the whole file, so a cut-off run keeps what it measured."""
    print(key, json.dumps(results[key], indent=1), flush=True)
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
