"""Benchmark: `trtforge serve` over HTTP vs the in-process engine, and default sizing vs tuned.

    PYTHONPATH=. python3 benchmarks/bench_http.py --mode overhead --out http.json   # HTTP vs in-process
    PYTHONPATH=. python3 benchmarks/bench_http.py --mode sizing --out sizing.json   # defaults vs tuned
    PYTHONPATH=. python3 benchmarks/bench_http.py --mode overhead --tiny            # CPU check of the script

``overhead``: the same Poisson workload (token-id prompts, fixed output lengths, ``ignore_eos``) runs
first through a `trtforge serve` process this script starts (an aiohttp client streaming SSE, one
connection per request, usage from ``stream_options.include_usage``), then through
``ServingLLM.astream`` in this process, both with the defaults (:mod:`trtforge.llm.sizing`). Reported:
output tok/s, TTFT p50/p99 of each, and the ratios (acceptance: HTTP >= 95% of in-process throughput,
TTFT p50 overhead <= 5 ms). ``sizing``: issue #27's burst (64 requests, prompts 64-2048, 256 new tokens,
all at t=0) in-process with the defaults and with a tuned pool (``--tuned-kv-gb``, 256 sequences).

The model is a Llama-3-8B shape with random BF16 weights (``--shape``), served through the factory
``benchmarks.bench_http:make_model``; its tokenizer is a word-level one over the model's whole
vocabulary, written to a temporary directory (the server returns text, so it detokenizes).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {
    "8b": {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
    },
}


def build_model(shape: str, device: str | None = None):
    """A random-weight Llama of `shape` (a key of SHAPES), built on `device` (CUDA when there is one):
    BF16 on CUDA, float32 on the CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**SHAPES[shape]))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(dtype).eval()


def make_model():
    """The factory `trtforge serve` loads: a random-weight Llama of BENCH_HTTP_SHAPE (BF16 on CUDA)."""
    return build_model(os.environ.get("BENCH_HTTP_SHAPE", "8b")), None


def write_tokenizer(vocab: int, where: Path) -> Path:
    """A word-level tokenizer over ids 0..vocab-1 (token i is "w{i}", pieces joined by spaces)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tk = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="w0").save_pretrained(str(where))
    return where


def workload(n: int, prompt_range, out_len: int, rate: float, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate if rate > 0 else 1.0, size=n) * (rate > 0)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [
        (float(arrivals[i]), rng.integers(3, vocab, size=int(rng.integers(*prompt_range))).tolist(), out_len)
        for i in range(n)
    ]


def summary(ttft: list[float], tokens: int, wall: float) -> dict:
    return {
        "output_tok_s": tokens / wall,
        "wall_s": wall,
        "ttft_ms_p50": float(np.percentile(ttft, 50)) * 1e3,
        "ttft_ms_p99": float(np.percentile(ttft, 99)) * 1e3,
        "requests": len(ttft),
        "output_tokens": tokens,
    }


async def http_run(url: str, model: str, reqs) -> dict:
    import aiohttp

    ttft: list[float] = []
    tokens = 0

    async def one(session, arrival, prompt, olen, t0):
        nonlocal tokens
        await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
        start = time.perf_counter()
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": olen,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        first = None
        async with session.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens += chunk["usage"]["completion_tokens"]
                elif first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    first = time.perf_counter()
        ttft.append((first or time.perf_counter()) - start)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as s:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(s, a, p, o, t0) for a, p, o in reqs))
        wall = time.perf_counter() - t0
    return summary(ttft, tokens, wall)


async def engine_run(llm, reqs) -> dict:
    from trtforge.llm import SamplingParams

    ttft: list[float] = []
    tokens = 0

    async def one(arrival, prompt, olen, t0):
        nonlocal tokens
        await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
        start, first = time.perf_counter(), None
        async for _ in llm.astream(prompt, SamplingParams(max_tokens=olen, ignore_eos=True)):
            first = first or time.perf_counter()
            tokens += 1
        ttft.append(first - start)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(a, p, o, t0) for a, p, o in reqs))
    return summary(ttft, tokens, time.perf_counter() - t0)


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 400.0) -> None:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the server did not come up")


def overhead(args, reqs, warm) -> dict:
    import torch

    from trtforge.llm import from_pretrained

    tmp = Path(tempfile.mkdtemp(prefix="bench-http-"))
    tok = write_tokenizer(SHAPES[args.shape]["vocab_size"], tmp / "tok")
    port = 18000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "BENCH_HTTP_SHAPE": args.shape, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "trtforge.cli.main", "serve", "benchmarks.bench_http:make_model",
           "--tokenizer", str(tok), "--served-model-name", "bench", "--port", str(port),
           "--max-waiting", str(len(reqs))]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=Path(__file__).resolve().parents[1])
    try:
        wait_up(url, proc)
        asyncio.run(http_run(url, "bench", warm))  # Triton compilations and CUDA graphs before timing
        http = asyncio.run(http_run(url, "bench", reqs))
    finally:
        proc.terminate()
        proc.wait(120)
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    model, _ = make_model()
    with from_pretrained(model) as llm:
        asyncio.run(engine_run(llm, warm))
        local = asyncio.run(engine_run(llm, reqs))
        blocks = llm.executor.facts.num_blocks
    return {
        "http": http,
        "in_process": local,
        "throughput_ratio": http["output_tok_s"] / local["output_tok_s"],
        "ttft_p50_overhead_ms": http["ttft_ms_p50"] - local["ttft_ms_p50"],
        "kv_blocks": blocks,
        "server_exit": proc.returncode,
    }


def sizing_mode(args, reqs, warm) -> dict:
    import dataclasses

    import torch

    from trtforge.llm import from_pretrained, sizing

    out = {}
    model, _ = make_model()
    cfg = model.config
    block = sizing.kv_block_bytes(
        cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads, 16,
        next(model.parameters()).element_size(),
    )  # fmt: skip
    tuned_config = dataclasses.replace(
        sizing.default_scheduler_config(None), max_num_batched_tokens=4096, max_prefill_chunk=1024
    )
    runs = {
        "defaults": {},
        "tuned": {"num_blocks": int(args.tuned_kv_gb * 2**30) // block, "config": tuned_config},
    }
    for name in args.order.split(","):
        kw = runs[name]
        llm = from_pretrained(model, **kw)
        with llm:
            asyncio.run(engine_run(llm, warm))
            before = llm.stats.preemptions
            res = asyncio.run(engine_run(llm, reqs))
            res["preemptions"] = llm.stats.preemptions - before
            res["max_running"] = llm.stats.max_running
            res["kv_blocks"] = llm.executor.facts.num_blocks
            res["scheduler"] = dataclasses.asdict(llm.engine.config)
        out[name] = res
        del llm  # its pool, before the next run sizes its own
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    out["defaults_over_tuned"] = out["defaults"]["output_tok_s"] / out["tuned"]["output_tok_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("overhead", "sizing"), default="overhead")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="8b")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape, few requests (CPU check)")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (0: all at t=0)")
    ap.add_argument("--prompt", type=int, nargs=2, default=None)
    ap.add_argument("--output", type=int, default=None, help="new tokens per request")
    ap.add_argument("--tuned-kv-gb", type=float, default=40.0)
    ap.add_argument(
        "--order", default="defaults,tuned", help="sizing: the order of the two runs in this process"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.tiny:
        args.shape = "tiny"
    vocab = SHAPES[args.shape]["vocab_size"]
    if args.mode == "overhead":
        n, rate, prompt, olen = 256, 16.0, (64, 1024), 128
    else:  # issue #27's burst
        n, rate, prompt, olen = 64, 0.0, (64, 2048), 256
    if args.tiny:
        n, olen = 16, 16
    n = args.requests or n
    rate = rate if args.rate is None else args.rate
    prompt = tuple(args.prompt or prompt)
    olen = args.output or olen
    reqs = workload(n, prompt, olen, rate, vocab)
    warm = workload(8, prompt, 8, 0.0, vocab, seed=1)
    os.environ["BENCH_HTTP_SHAPE"] = args.shape
    results = overhead(args, reqs, warm) if args.mode == "overhead" else sizing_mode(args, reqs, warm)
    results["workload"] = {"mode": args.mode, "shape": args.shape, "requests": n, "rate": rate,
                           "prompt": prompt, "output": olen}  # fmt: skip
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
