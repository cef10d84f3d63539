"""Decode-step cost vs context length: the KV-cache step graph against recomputing the whole prefix.

Measures, with ONNX Runtime on the CPU in one run: (a) one decode step of trtforge's step graph with
100 and with 1,000 tokens already in the cache; (b) the plain HF forward exported to ONNX (no cache,
what a cache-less runtime does per new token) on prefixes of 101 and 1,001 tokens. Prints medians and
both 1,000/100 ratios; the step graph should stay <= 1.5x while recompute grows with the prefix.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_decode_step.py [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch


def _model(args: argparse.Namespace) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_seq,
    )
    return tf.LlamaForCausalLM(cfg).eval()


def _session(path: Path, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _median_ms(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--max-seq", type=int, default=1024)
    ap.add_argument("--short", type=int, default=100)
    ap.add_argument("--long", type=int, default=1000)
    ap.add_argument("--plain-exporter", default="auto", choices=["auto", "dynamo", "legacy"])
    args = ap.parse_args()

    from trtforge.compiler.export import export_module
    from trtforge.llm.compile.export import export_step

    model = _model(args)
    work = Path(tempfile.mkdtemp(prefix="bench-decode-"))
    step = export_step(model, max_seq=args.max_seq, max_batch=1, exporter="legacy", workdir=work)
    onnx.save(step.model, str(work / "step.onnx"))
    (work / "plain").mkdir()
    plain = export_module(
        _LogitsOnly(model),
        {"input_ids": torch.zeros(1, 8, dtype=torch.int64)},
        work / "plain",
        dynamic="batch,seq",
        exporter=args.plain_exporter,
    )
    step_sess, plain_sess = _session(work / "step.onnx", args.threads), _session(plain.path, args.threads)
    g = step.generation
    cache_shape = (1, g["num_kv_heads"], g["max_seq"], g["head_dim"])
    rng = np.random.default_rng(0)
    caches = {n: rng.standard_normal(cache_shape).astype(np.float32) for n in g["cache"]["inputs"]}

    def decode(length: int):
        feeds = {
            "input_ids": np.array([[7]], np.int64),
            "position_ids": np.array([[length]], np.int64),
            "past_lens": np.array([length], np.int64),
            "new_lens": np.ones(1, np.int64),
            **caches,
        }
        return lambda: step_sess.run(["logits"], feeds)

    def recompute(length: int):
        ids = rng.integers(0, args.vocab, (1, length + 1)).astype(np.int64)
        return lambda: plain_sess.run(None, {"input_ids": ids})

    rows = {}
    for name, make in (("step graph decode", decode), ("recompute prefix", recompute)):
        short, long = _median_ms(make(args.short), args.runs), _median_ms(make(args.long), args.runs)
        rows[name] = (short, long, long / short)
    print(
        f"model: llama-style hidden {args.hidden}, {args.layers} layers, {args.heads} heads / "
        f"{args.kv_heads} KV heads, vocab {args.vocab}; step graph S_max {args.max_seq}; "
        f"ORT {ort.__version__} CPU, {args.threads} thread(s), default graph optimizations, "
        f"median of {args.runs}"
    )
    print(f"| what | cache {args.short} (ms) | cache {args.long} (ms) | ratio |")
    print("| --- | --- | --- | --- |")
    for name, (s, lo, r) in rows.items():
        print(f"| {name} | {s:.3f} | {lo:.3f} | {r:.2f}x |")


if __name__ == "__main__":
    main()
