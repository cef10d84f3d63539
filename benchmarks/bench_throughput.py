"""Benchmark: serving throughput of a Llama-3-8B shape on fixed-length workloads, with a roofline (issue #29).

    PYTHONPATH=. python3 benchmarks/bench_throughput.py --plan-only                 # what each workload needs
    PYTHONPATH=. python3 benchmarks/bench_throughput.py --peer-shares               # TRT-LLM on this roofline
    PYTHONPATH=. python3 benchmarks/bench_throughput.py --workloads 128/128 mixed --out tp.json
    PYTHONPATH=. python3 benchmarks/bench_throughput.py --tiny --out tiny.json      # CPU check of the script

The model is the Llama-3-8B shape (32 layers, hidden 4096, GQA 32/8, vocab 128256) with random BF16
weights, built on the GPU (``benchmarks.bench_http.build_model``). The KV pool is sized as the server
sizes it (:func:`trtforge.llm.sizing.torch_pool`: ``--gpu-memory-utilization`` of what is free after
the weights, a measured step and the measured CUDA graphs, captured at load as the server captures
them: ``sizing.capture_graphs``), the scheduler takes the serving defaults
(:func:`trtforge.llm.sizing.default_scheduler_config`) with ``--max-num-seqs``, and the torch
executor's decode CUDA graphs cover the whole running batch (``max_decode_batch = max_num_seqs``).

Workloads (``--workloads``): ISL/OSL 128/128, 128/2048, 2048/128, 2048/2048, 1000/1000 (random prompt
ids, ``ignore_eos``, every request at t = 0: TensorRT-LLM's fixed-length throughput setting), and
``mixed``: issue #29's burst (192 requests, prompts uniform in 64-2048, 256 new tokens). Requests per
fixed workload: ``--requests`` (default 1000), ``--peer-requests`` (the counts TensorRT-LLM's published
runs used: :data:`PEER_REQUESTS`), or ``--waves`` x the running batch the pool holds;
``--budget-s`` stops a workload after that many seconds (the requests left are cancelled and the run
is marked truncated: its rates are then over the time it ran).

Reported per workload: output and total (prompt + output) tok/s over the run and over the steady
window (from the first completion to the last admission), TTFT and inter-token latency percentiles,
the running batch over time (summary and a JSON series), preemptions, and the roofline beside it:

    T_roof = sum_requests (2 N_lin I + 2 L Hq D I^2 + 2 V H) / P
           + sum_decode_steps max(sum_rows (2 (N_lin + V H) + 4 L Hq D c) / P,
                                  (W + sum_rows c * kv) / BW)

with I the prompt length, c a decode row's context (prompt + tokens so far), N_lin the layers'
parameters (everything but the embedding and the LM head), W the bytes of the weights one decode step
reads (layers + LM head), kv the K/V bytes of one token, P = 989 TFLOP/s (H100/H200 dense BF16; with
``--quantization fp8`` the layers' GEMM FLOPs count at 2P and their weights at 1 byte, with
``--kv-cache-dtype fp8`` kv at 1 byte an element) and
BW = 4.8 TB/s (H200 HBM3e). Decode steps run B rows at once, B = min(requests, max_num_seqs, tokens
the pool holds / (ISL + OSL)): the best batch the configuration allows. Prefill and decode do not
overlap in it (the issue's convention). The fraction printed is measured output tok/s over the
roofline's.

Where the wall time goes: CUDA events before each step's launch, after it, and after its sampling
give each step's device span (GPU busy, including any wait inside the step for the host's launches)
and the device's idle gap before the next step (host-bound time). Steps are split into decode-only,
prefill-only and mixed (rows of one token vs more), with counts, tokens, device time and host launch
time. The engine thread's host time is split into schedule (plan + batch), launch (executor),
sample (sampler launch), wait (for the step in flight's tokens), update (applying them), dispatch
(to the requests' handles) and the rest.

Warm-up (untimed, reported apart): a full running batch of short prompts and prompts of assorted lengths
after the capture, then before each workload (and scheduler variant) a slice of it (``warm_slice``: its
lengths, fresh ids, 8 new tokens, at most 64k prompt tokens), so that the Triton specializations its
steps need compile before its timed window opens; ``jit_compiles_in_window`` counts the entries Triton's
on-disk cache gained during the timed run (0 expected: any other figure is printed beside the result).

Beside each result: TensorRT-LLM's published perf table (Llama-3-8B, TP1, output tok/s; not measured
here) and the issue's acceptance targets. ``--tiny`` (or ``--device cpu``) runs a 2-layer model on the
CPU with lengths scaled by 1/16 and few requests: it checks the script, its figures mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: with_old's .old first

from benchmarks._gcwatch import GcWatch, describe
from benchmarks._settings import add_set_option, apply_set_option
from benchmarks.bench_http import SHAPES, build_model
from trtforge.llm import sizing
from trtforge.llm.engine import LLMEngine
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig

PEAK_FLOPS = 989e12  # dense BF16, H100 SXM and H200
HBM_BYTES_PER_S = 4.8e12  # H200
H100_HBM_BYTES_PER_S = 3.35e12  # H100 SXM (HBM3): the machine of TensorRT-LLM v0.10's published rows

FIXED = {
    "128/128": (128, 128),
    "128/2048": (128, 2048),
    "2048/128": (2048, 128),
    "2048/2048": (2048, 2048),
    "1000/1000": (1000, 1000),
}
MIXED = {"requests": 192, "prompt": (64, 2048), "output": 256}
WORKLOADS = (*FIXED, "mixed")
# TensorRT-LLM's published perf table (Llama-3-8B, TP1, output tok/s), as quoted in issue #29
PUBLISHED = {
    "128/128": {"trtllm_v0.10_h100_fp16": 12086, "trtllm_v1.0_h200_fp8": 27911},
    "128/2048": {"trtllm_v0.10_h100_fp16": 6208, "trtllm_v1.0_h200_fp8": 26221},
    "2048/128": {"trtllm_v0.10_h100_fp16": 1605, "trtllm_v1.0_h200_fp8": 3538},
    "2048/2048": {"trtllm_v0.10_h100_fp16": 2776, "trtllm_v1.0_h200_fp8": 12194},
    "1000/1000": {"trtllm_v0.10_h100_fp16": None, "trtllm_v1.0_h200_fp8": 17744},
}
# requests per workload in TensorRT-LLM's published throughput runs (its perf overview's $num_requests:
# more for short requests, "to guarantee that the system hit a steady state"); --peer-requests takes these
PEER_REQUESTS = {"128/128": 30000, "128/2048": 3000, "2048/128": 3000, "2048/2048": 1500, "1000/1000": 3000}
# issue #29's BF16 acceptance: output tok/s (1.4x / 1.25x the v0.10 H100 row), and the burst's wall time
TARGETS = {"128/128": 17000, "128/2048": 8700, "2048/2048": 3900, "2048/128": 2000}
MIXED_TARGET_S = 9.0
ROOFLINE_TARGET = 0.6
# each workload's untimed warm-up slice (warm_slice): prompt tokens at most (x --tiny's scale), new tokens
WARM_PROMPT_TOKENS = 64 * 1024
WARM_NEW_TOKENS = 8


# ---- the roofline ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What the roofline needs of a Llama-style model."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ffn: int
    elem_bytes: int  # the model's dtype: embedding, LM head, activations
    linear_bytes: float = 0.0  # bytes of a layer weight (0: elem_bytes; FP8 W8A8: 1)
    kv_elem_bytes: float = 0.0  # bytes of a cached K/V element (0: elem_bytes; FP8 KV cache: 1)
    linear_speedup: float = 1.0  # the layers' GEMM peak over BF16's (FP8 tensor cores: 2)

    @classmethod
    def of(cls, cfg: Any, elem_bytes: int) -> Shape:
        heads = cfg.num_attention_heads
        return cls(
            cfg.num_hidden_layers,
            cfg.hidden_size,
            heads,
            cfg.num_key_value_heads,
            getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            cfg.vocab_size,
            cfg.intermediate_size,
            elem_bytes,
        )

    @property
    def linear_params(self) -> int:
        """Parameters of the layers and the final norm (no embedding, no LM head)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * self.ffn + 2 * h
        return self.layers * per_layer + h

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes one decode step reads of the weights: the layers and the LM head (embedding rows only)."""
        return int(
            self.linear_params * (self.linear_bytes or self.elem_bytes) + self.head_params * self.elem_bytes
        )

    @property
    def kv_bytes_per_token(self) -> int:
        return int(2 * self.layers * self.kv_heads * self.head_dim * (self.kv_elem_bytes or self.elem_bytes))

    def compute_s(self, linear_flops: float, other_flops: float) -> float:
        """Seconds of these FLOPs at peak: the layers' GEMMs at ``linear_speedup`` x the BF16 peak, the
        rest (attention, LM head) at the BF16 peak."""
        return linear_flops / (PEAK_FLOPS * self.linear_speedup) + other_flops / PEAK_FLOPS


def prefill_flops(shape: Shape, prompt_len: np.ndarray) -> float:
    """FLOPs of prefilling prompts of these lengths: the layers' GEMMs, causal attention, one LM-head row."""
    i = np.asarray(prompt_len, dtype=np.float64)
    attn = 2.0 * shape.layers * shape.heads * shape.head_dim * i**2
    return float((2.0 * shape.linear_params * i + attn + 2.0 * shape.head_params).sum())


def decode_wave_time(
    shape: Shape, prompts: np.ndarray, out_len: int, bandwidth: float = HBM_BYTES_PER_S
) -> tuple[float, float, float]:
    """Roofline seconds of the decode steps of these rows decoding together (each makes out_len - 1
    decode steps after the token the prefill samples) at `bandwidth` bytes/s; also the bytes and FLOPs
    summed over its steps."""
    rows = np.asarray(prompts, dtype=np.float64)
    j = np.arange(1, out_len, dtype=np.float64)  # decode step j: every row's context is I + j
    ctx = rows.sum() + len(rows) * j  # sum over rows of their contexts, per step
    flops = (
        len(rows) * 2.0 * (shape.linear_params + shape.head_params)
        + 4.0 * shape.layers * (shape.heads * shape.head_dim) * ctx
    )
    bytes_ = shape.decode_weight_bytes + ctx * shape.kv_bytes_per_token
    linear = len(rows) * 2.0 * shape.linear_params
    t = np.maximum(shape.compute_s(linear, flops - linear), bytes_ / bandwidth)
    return float(t.sum()), float(bytes_.sum()), float(flops.sum())


def roofline(
    shape: Shape,
    prompts: list[int],
    out_len: int,
    max_num_seqs: int,
    kv_tokens: int,
    bandwidth: float = HBM_BYTES_PER_S,
) -> dict:
    """The workload's roofline (module docstring): seconds, output tok/s, and the decode batch it assumes;
    `bandwidth` is the HBM's bytes/s (the H200's unless another machine's is given)."""
    prompts_ = np.asarray(prompts, dtype=np.float64)
    n = len(prompts_)
    per_seq = float(prompts_.mean()) + out_len
    batch = max(1, min(n, max_num_seqs, int(kv_tokens // per_seq)))
    linear = 2.0 * shape.linear_params * float(prompts_.sum())
    t_prefill = shape.compute_s(linear, prefill_flops(shape, prompts_) - linear)
    t_decode = bytes_ = flops = 0.0
    for lo in range(0, n, batch):  # waves of `batch` rows (the last one partial)
        t, b, f = decode_wave_time(shape, prompts_[lo : lo + batch], out_len, bandwidth)
        t_decode, bytes_, flops = t_decode + t, bytes_ + b, flops + f
    total = t_prefill + t_decode
    return {
        "seconds": total,
        "prefill_s": t_prefill,
        "decode_s": t_decode,
        "decode_batch": batch,
        "decode_bytes": bytes_,
        "output_tok_s": n * out_len / total,
        "formula": "sum(2 N_lin I + 2 L Hq D I^2 + 2 V H)/989e12 + sum_steps max(FLOPs/989e12, "
        "(W + sum c*kv)/4.8e12); decode batch = min(requests, max_num_seqs, pool tokens/(ISL+OSL))",
    }


PEER_SHARE_BATCHES = (256, 512, 1024, 2048)


def peer_shares(bf16: Shape, fp8: Shape) -> list[dict]:
    """Each published TensorRT-LLM row as a share of this script's roofline on the peer's own machine
    and precision (v0.10: H100 bandwidth, 16-bit weights and KV; v1.0: H200, FP8 weights and KV), at
    decode batches of PEER_SHARE_BATCHES (its batch is not published; a larger batch raises the
    roofline, so the share at 256 is the most favourable to the peer). It puts issue #29's 60% target
    beside what the reference engine reaches on the same yardstick."""
    rows = []
    for name, peers in PUBLISHED.items():
        isl, osl = FIXED[name]
        for peer, rate in peers.items():
            if rate is None:
                continue
            h100 = "h100" in peer
            shape, bw = (bf16, H100_HBM_BYTES_PER_S) if h100 else (fp8, HBM_BYTES_PER_S)
            shares = {}
            for b in PEER_SHARE_BATCHES:
                roof = roofline(shape, [isl] * PEER_REQUESTS[name], osl, b, 10**12, bw)
                shares[b] = rate / roof["output_tok_s"]
            rows.append({"workload": name, "peer": peer, "output_tok_s": rate, "roofline_share": shares})
            print(
                f"  {name:10s} {peer:24s} {rate:7,} tok/s: "
                + ", ".join(f"B={b} {v:.0%}" for b, v in shares.items()),
                flush=True,
            )
    return rows


# ---- workloads ---------------------------------------------------------------------------------------
def make_requests(
    name: str, n: int | None, vocab: int, scale: float, seed: int = 0
) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) of each request of workload `name`; lengths times `scale` (--tiny)."""
    rng = np.random.default_rng(seed)
    if name == "mixed":
        lo, hi = (max(1, int(x * scale)) for x in MIXED["prompt"])
        count = n or MIXED["requests"]
        lens = rng.integers(lo, hi + 1, size=count)
        olen = [max(2, int(MIXED["output"] * scale))] * count
    else:
        isl, osl = FIXED[name]
        count = n or 1000
        lens = np.full(count, max(1, int(isl * scale)))
        olen = [max(2, int(osl * scale))] * count
    return [(rng.integers(3, vocab, size=int(k)).tolist(), o) for k, o in zip(lens, olen)]


def requests_for(
    name: str, args: argparse.Namespace, max_num_seqs: int, kv_tokens: int, scale: float
) -> int | None:
    """Requests of workload `name` (None: its default): NAME:N, --requests, --peer-requests (TensorRT-LLM's
    count for it), or --waves x the running batch."""
    if name in args.counts:
        return args.counts[name]
    if name == "mixed":
        return args.mixed_requests
    if args.requests:
        return args.requests
    if args.peer_requests:
        return PEER_REQUESTS[name]
    if args.waves:
        isl, osl = (max(1, int(x * scale)) for x in FIXED[name])
        return args.waves * max(1, min(max_num_seqs, kv_tokens // (isl + osl)))
    return None


def pct(values: Any, qs=(50, 90, 99)) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{q}": (float(np.percentile(arr, q)) * 1e3 if arr.size else None) for q in qs}


# ---- instrumentation -----------------------------------------------------------------------------------
class StepProbe:
    """The executor the engine runs, delegating to a TorchExecutor: it times each step's launch on the host
    and brackets it with CUDA events (start, launched; the sampler's end is added by :meth:`sampled`)."""

    def __init__(self, inner: TorchExecutor, cuda: bool, shape: Shape) -> None:
        self.inner = inner
        self.cuda = cuda
        self.shape = shape
        # per step: kind, tokens, decode rows, launch s, roofline s, host time, events start/launched/sampled
        self.steps: list[list[Any]] = []

    @property
    def facts(self):
        return self.inner.facts

    def _event(self) -> Any:
        if not self.cuda:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def step(self, batch):
        return self.step_async(batch, None)

    def step_async(self, batch, feed):
        q = np.diff(batch.query_start_loc)
        ones = int((q == 1).sum())
        kind = "decode" if ones == len(q) else "prefill" if ones == 0 else "mixed"
        start = self._event()
        t = time.perf_counter()
        out = self.inner.step_async(batch, feed)
        launch = time.perf_counter() - t
        roof = step_roofline(self.shape, q, batch.context_lens, len(batch.logits_indices))
        self.steps.append([kind, batch.num_tokens, ones, launch, roof, t, start, self._event(), None])
        return out

    def sampled(self) -> None:
        if self.steps:
            self.steps[-1][-1] = self._event()


def step_roofline(shape: Shape, q: np.ndarray, ctx: np.ndarray, logits_rows: int) -> float:
    """Roofline seconds of one step: rows of `q` new tokens with contexts `ctx` (cached + new), `logits_rows`
    LM-head rows: max(FLOPs / peak, bytes / bandwidth), bytes = the weights once + every row's K/V."""
    qf, cf = q.astype(np.float64), ctx.astype(np.float64)
    attn = 4.0 * shape.layers * shape.heads * shape.head_dim * float((qf * (cf - (qf - 1) / 2)).sum())
    flops = 2.0 * shape.linear_params * float(qf.sum()) + 2.0 * shape.head_params * logits_rows + attn
    bytes_ = shape.decode_weight_bytes + float(cf.sum()) * shape.kv_bytes_per_token
    linear = 2.0 * shape.linear_params * float(qf.sum())
    return max(shape.compute_s(linear, flops - linear), bytes_ / HBM_BYTES_PER_S)


class HostTimers:
    """Wraps the engine thread's phases with host timers (restored by :meth:`restore`)."""

    def __init__(self, engine: LLMEngine, probe: StepProbe) -> None:
        import trtforge.llm.async_loop as async_loop
        from trtforge.llm.sampling import SampledTokens

        self.seconds: dict[str, float] = defaultdict(float)
        self._undo: list[Any] = []
        steps = engine._steps
        sched = steps.scheduler
        self._instance(sched, "schedule", "schedule")
        self._instance(sched, "update", "update")
        self._instance(steps, "step", "loop_step")
        self._instance(engine, "_dispatch", "dispatch")
        orig_sample = async_loop.sample_async

        def sample_async(*a, **k):
            t = time.perf_counter()
            out = orig_sample(*a, **k)
            probe.sampled()
            self.seconds["sample"] += time.perf_counter() - t
            return out

        async_loop.sample_async = sample_async
        self._undo.append(lambda: setattr(async_loop, "sample_async", orig_sample))
        orig_result = SampledTokens.result

        def result(tokens):
            t = time.perf_counter()
            out = orig_result(tokens)
            self.seconds["wait"] += time.perf_counter() - t
            return out

        SampledTokens.result = result
        self._undo.append(lambda: setattr(SampledTokens, "result", orig_result))

    def _instance(self, obj: Any, attr: str, key: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[key] += time.perf_counter() - t

        setattr(obj, attr, timed)
        self._undo.append(lambda: delattr(obj, attr))

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()


def breakdown(probe: StepProbe, host: dict[str, float], wall: float, end: float) -> dict:
    """Per step kind: count, tokens, device time (CUDA events), host launch time and the steps' own
    roofline; the device's idle gaps between steps; the engine thread's host phases. Steps launched
    after `end` (a truncated run's cancellations) are left out."""
    if probe.cuda:
        torch.cuda.synchronize()
    kinds: dict[str, dict] = {}
    spans, gaps = [], []
    prev_end = None
    for kind, tokens, ones, launch, roof, t_launch, ev0, ev1, ev2 in probe.steps:
        if t_launch > end:
            break
        row = kinds.setdefault(kind, dict.fromkeys(("steps", "tokens", "decode_rows"), 0))
        row.update({k: row.get(k, 0.0) for k in ("launch_s", "device_s", "roofline_s")})
        row["steps"] += 1
        row["tokens"] += tokens
        row["decode_rows"] += ones
        row["launch_s"] += launch
        row["roofline_s"] += roof
        if ev0 is not None:
            last = ev2 if ev2 is not None else ev1
            span = ev0.elapsed_time(last) / 1e3
            row["device_s"] += span
            spans.append(span)
            if prev_end is not None:
                gaps.append(prev_end.elapsed_time(ev0) / 1e3)
            prev_end = last
    steps = sum(r["steps"] for r in kinds.values())
    for row in kinds.values():
        n = row["steps"]
        row["step_share"] = n / max(steps, 1)
        row["mean_tokens"] = row["tokens"] / n
        row["mean_decode_rows"] = row["decode_rows"] / n
        row["launch_ms_per_step"] = row["launch_s"] / n * 1e3
        row["roofline_ms_per_step"] = row["roofline_s"] / n * 1e3
        cuda = probe.cuda and row["device_s"] > 0
        row["device_ms_per_step"] = row["device_s"] / n * 1e3 if cuda else None
        row["device_share_of_wall"] = row["device_s"] / wall if cuda else None
        # the steps' own roofline over their device time: below 1 where kernels (or waits inside a step) lose
        row["roofline_over_device"] = row["roofline_s"] / row["device_s"] if cuda else None
    out: dict[str, Any] = {"steps": steps, "by_kind": kinds}
    if probe.cuda:
        out["gpu_busy_s"] = float(sum(spans))
        out["gpu_busy_share_of_wall"] = out["gpu_busy_s"] / wall
        out["gpu_idle_between_steps_s"] = float(sum(gaps))
        out["gpu_idle_gap_ms"] = pct(gaps, (50, 99))
    phases = ("schedule", "launch", "sample", "wait", "update", "dispatch")
    host_ = {k: host.get(k, 0.0) for k in phases}
    host_["launch"] = sum(r["launch_s"] for r in kinds.values())
    loop_step = host.get("loop_step", 0.0)
    host_["step_rest"] = max(0.0, loop_step - sum(host_[k] for k in phases if k != "dispatch"))
    host_["idle_or_other"] = max(0.0, wall - loop_step - host_["dispatch"])
    host_["busy_less_wait"] = loop_step + host_["dispatch"] - host_["wait"]
    out["host_s"] = host_
    out["host_ms_per_step"] = {k: v / max(steps, 1) * 1e3 for k, v in host_.items()}
    return out


def warm_slice(
    reqs: list[tuple[list[int], int]], max_num_seqs: int, scale: float, vocab: int
) -> list[tuple[list[int], int]]:
    """A workload's warm-up: its first requests' lengths (as many as 1.25 running batches, at most
    WARM_PROMPT_TOKENS prompt tokens, at least one) with WARM_NEW_TOKENS new tokens each and fresh random
    ids (the timed run must not find them in the prefix cache). It runs the same prompt chunks, mixed
    steps and decode batches as the timed run's start, so the Triton specializations they need compile
    here, not inside the timed window (a cold cache read ~14k instead of ~33k tok/s at 1.1B)."""
    rng = np.random.default_rng(99)
    budget, out, tokens = WARM_PROMPT_TOKENS * scale, [], 0
    for prompt, olen in reqs[: max_num_seqs + max_num_seqs // 4]:
        if out and tokens + len(prompt) > budget:
            break
        out.append((rng.integers(3, vocab, size=len(prompt)).tolist(), min(olen, WARM_NEW_TOKENS)))
        tokens += len(prompt)
    return out


def triton_cache_entries() -> int | None:
    """Kernels in Triton's on-disk cache (``TRITON_CACHE_DIR``, else ``~/.triton/cache``; one entry per
    compiled specialization), None where there is no cache yet: entries added inside a timed window are
    compilations the warm-up missed."""
    path = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    try:
        return sum(1 for _ in os.scandir(path))
    except OSError:
        return None


GPU_STATE_FIELDS = (
    "clocks.sm",
    "clocks.mem",
    "temperature.gpu",
    "power.draw",
    "clocks_throttle_reasons.active",
)


def gpu_state() -> dict[str, str] | None:
    """The GPU's SM / memory clocks, temperature, power and active throttle reasons (nvidia-smi), taken
    after each workload: the same code has read 3.5% apart in two processes, and clocks tell whether the
    GPU, not the code, moved. None where nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = ["--query-gpu=" + ",".join(GPU_STATE_FIELDS), "--format=csv,noheader", "--id=0"]
    try:
        out = subprocess.run([exe, *query], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")] if out.strip() else []
    return dict(zip(GPU_STATE_FIELDS, values)) if len(values) == len(GPU_STATE_FIELDS) else None


def free_gpu_bytes(cuda: bool) -> int | None:
    """Free GPU memory once queued work is done and the allocator's cache is emptied (None on the CPU)."""
    if not cuda:
        return None
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info()[0])


# ---- one workload --------------------------------------------------------------------------------------
def gpu_trace_summary(prof: Any) -> dict:
    """The device's activity in a profiled window (of serving, or of one step): busy (the union of its
    kernels and copies) against the window's span, the idle rest split by gap size, the largest gaps
    with the operations around them, and the 20 operations that took the most device time. Idle inside
    steps is what the step events cannot see (they count it as the step's)."""
    evs = sorted(
        (ev.time_range.start, ev.time_range.end, ev.name)
        for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0
    )
    if not evs:
        return {}
    busy, end, prev, gaps = 0.0, evs[0][0], "", []
    for s, e, name in evs:
        if s > end:
            gaps.append((s - end, prev[:70], name[:70]))
        busy += max(0.0, e - max(s, end))
        if e > end:
            end, prev = e, name
    span = end - evs[0][0]
    by_name: dict[str, list[float]] = {}
    for s, e, name in evs:
        total = by_name.setdefault(name[:90], [0.0, 0])
        total[0] += e - s
        total[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:20]
    sizes = np.asarray([g for g, _, _ in gaps]) if gaps else np.zeros(0)
    buckets = {"under_5us": (0, 5), "5_50us": (5, 50), "50_500us": (50, 500), "over_500us": (500, 1e12)}
    return {
        "span_ms": span / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": (span - busy) / 1e3,
        "idle_share": 1.0 - busy / span if span > 0 else None,
        "events": len(evs),
        "gaps": len(gaps),
        "idle_ms_by_gap": {
            k: float(sizes[(sizes >= lo) & (sizes < hi)].sum() / 1e3) for k, (lo, hi) in buckets.items()
        },
        "largest_gaps_us": [
            {"us": round(g, 1), "after": a, "before": b} for g, a, b in sorted(gaps, reverse=True)[:10]
        ],
        "kernels": [{"name": n, "ms": round(ms / 1e3, 3), "count": c} for n, (ms, c) in top],
    }


def run_workload(
    probe: StepProbe,
    config: SchedulerConfig,
    reqs,
    budget_s: float | None,
    trace: tuple[float, float] | None = None,
    submit: str = "many",
    gc_freeze: bool = True,
    gc_diagnose: bool = False,
) -> dict:
    """A fresh engine over the probe's executor: submit every request at t = 0, wait (at most budget_s),
    and measure. `submit`: "many" queues them in one :meth:`LLMEngine.submit_many` call, "one" one
    :meth:`LLMEngine.submit` each while the engine already steps (as a server receives them). `gc_freeze`:
    the engine's ``freeze_gc`` (the heap alive at its start left out of garbage collections); the
    collections inside the timed window are recorded either way (``gc``); `gc_diagnose` adds what each full
    one walked and freed (:class:`benchmarks._gcwatch.GcWatch`).
    ``trace`` (start s, length s) profiles that window of the device's activity (:func:`gpu_trace_summary`);
    the profiler's stop costs the engine some host time, so a traced run's throughput reads a little low."""
    probe.steps.clear()
    series: list[tuple[float, int, int, int]] = []

    def hook(sched, batch):
        series.append((time.perf_counter(), sched.num_running, sched.num_waiting, batch.num_tokens))

    times: list[list[float]] = [[] for _ in reqs]
    submitted = [0.0] * len(reqs)
    # freeze_gc only where off: a previous revision's package (with_old) has no such argument
    options = {} if gc_freeze else {"freeze_gc": False}
    with LLMEngine(probe, config, step_hook=hook, **options) as engine, GcWatch(gc_diagnose) as watch:
        timers = HostTimers(engine, probe)
        pre0 = engine.stats.preemptions
        start = time.perf_counter()
        params = [SamplingParams(max_tokens=olen, ignore_eos=True) for _, olen in reqs]
        events = [
            lambda e, rec=rec: rec.extend([time.perf_counter()] * len(e)) if isinstance(e, tuple) else None
            for rec in times
        ]
        if submit == "many":  # every request at t = 0 in one call (its checks count in each TTFT)
            submitted = [start] * len(reqs)
            handles = engine.submit_many([p for p, _ in reqs], params, on_events=events)
        else:
            handles = []
            for i, (prompt, _) in enumerate(reqs):
                submitted[i] = time.perf_counter()
                handles.append(engine.submit(prompt, params[i], on_event=events[i]))
        deadline = None if budget_s is None else start + budget_s
        truncated = False
        prof = None
        if trace is not None and probe.cuda:
            from torch.profiler import ProfilerActivity, profile

            time.sleep(max(0.0, start + trace[0] - time.perf_counter()))
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                time.sleep(trace[1])
        for h in handles:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            try:
                h.completion(left)
            except TimeoutError:
                truncated = True
                break
        end = time.perf_counter()
        host_seconds = dict(timers.seconds)  # before the cancellations of a truncated run
        if truncated:
            for h in handles:
                h.cancel()
        engine.wait_idle()
        stats = engine.stats
        preemptions = stats.preemptions - pre0
        timers.restore()
    wall = end - start
    stamps = [np.asarray([s for s in t if s <= end]) for t in times]
    out_tokens = int(sum(len(s) for s in stamps))
    done = [len(s) == olen for s, (_, olen) in zip(stamps, reqs)]
    in_tokens = sum(len(p) for (p, _), s in zip(reqs, stamps) if len(s))
    ttft = [s[0] - sub for s, sub in zip(stamps, submitted) if len(s)]
    itl = np.concatenate([np.diff(s) for s in stamps if len(s) > 1] or [np.zeros(0)])
    # the steady window: from the first completion to the last step that still had requests waiting
    finish = [s[-1] for s, d in zip(stamps, done) if d]
    waiting_steps = [t for t, _, w, _ in series if w > 0 and t <= end]
    steady = None
    if finish and waiting_steps and waiting_steps[-1] - min(finish) >= 0.1 * wall:  # a window worth the name
        a, b = min(finish), waiting_steps[-1]
        all_t = np.concatenate(stamps)
        count = int(((all_t >= a) & (all_t <= b)).sum())
        steady = {"from_s": a - start, "to_s": b - start, "output_tok_s": count / (b - a)}
    run = np.array([r for t, r, _, _ in series if t <= end], dtype=np.float64)
    stride = max(1, len(series) // 500)
    res = {
        "requests": len(reqs),
        "submit": submit,
        "completed": int(sum(done)),
        "truncated": truncated,
        "wall_s": wall,
        "output_tokens": out_tokens,
        "prompt_tokens": int(in_tokens),
        "output_tok_s": out_tokens / wall,
        "total_tok_s": (out_tokens + in_tokens) / wall,
        "steady": steady,
        "ttft_ms": pct(ttft),
        "itl_ms": pct(itl),
        "preemptions": preemptions,
        "running": {
            "mean_per_step": float(run.mean()) if run.size else None,
            "p50": float(np.median(run)) if run.size else None,
            "max": int(run.max()) if run.size else None,
        },
        "running_series": [[round(t - start, 4), r, w, n] for t, r, w, n in series[::stride]],
        "breakdown": breakdown(probe, host_seconds, wall, end),
        "gc_freeze": gc_freeze,
        "gc": watch.summary(until_s=wall),
    }
    if prof is not None:
        res["gpu_trace"] = {"at_s": trace[0], "length_s": trace[1], **gpu_trace_summary(prof)}
    return res


# ---- printing ---------------------------------------------------------------------------------------------
def line(name: str, res: dict) -> str:
    """The workload's result, its roofline, the published peers and targets, and where the time went."""
    roof, b = res["roofline"], res["breakdown"]
    steady = res["steady"]["output_tok_s"] if res["steady"] else None
    ttft, itl, run = res["ttft_ms"], res["itl_ms"], res["running"]
    head = [
        f"{name:9s} output {res['output_tok_s']:8,.0f} tok/s"
        + (f" (steady {steady:8,.0f})" if steady else ""),
        f"total {res['total_tok_s']:8,.0f} tok/s",
        f"wall {res['wall_s']:6.1f} s"
        + (" TRUNCATED" if res["truncated"] else "")
        + (f" (warm-up before it {res['warmup_s']:.1f} s, untimed)" if "warmup_s" in res else "")
        + (
            f" [{res['jit_compiles_in_window']} Triton compilations inside the timed window]"
            if res.get("jit_compiles_in_window")
            else ""
        ),
        f"roofline {roof['output_tok_s']:8,.0f} tok/s (B={roof['decode_batch']}): "
        f"{res['roofline_fraction']:.0%}",
    ]
    lat = (
        f"    TTFT p50/p90/p99 {ttft['p50'] or 0:.0f}/{ttft['p90'] or 0:.0f}/{ttft['p99'] or 0:.0f} ms, "
        f"ITL p50/p90/p99 {itl['p50'] or 0:.2f}/{itl['p90'] or 0:.2f}/{itl['p99'] or 0:.2f} ms, running "
        f"mean {run['mean_per_step'] or 0:.0f} p50 {run['p50'] or 0:.0f} max {run['max'] or 0}, "
        f"preemptions {res['preemptions']}, {res['completed']}/{res['requests']} requests done"
    )
    peer = PUBLISHED.get(name)
    ref = []
    if peer:
        ref.append(
            "TRT-LLM published (not measured here): v0.10 H100 FP16 "
            f"{peer['trtllm_v0.10_h100_fp16'] or '-'}, "
            f"v1.0 H200 FP8 {peer['trtllm_v1.0_h200_fp8']} output tok/s"
        )
    if res.get("quantization", "none") != "none" and peer:
        ref.append(f"target FP8 >= TRT-LLM v1.0 H200 FP8's {peer['trtllm_v1.0_h200_fp8']:,} tok/s")
    elif name in TARGETS:
        ref.append(f"target BF16 >= {TARGETS[name]:,} tok/s and >= {ROOFLINE_TARGET:.0%} of the roofline")
    if name == "mixed":
        ref.append(f"target wall <= {MIXED_TARGET_S:g} s")
    out = ["  ".join(head), lat]
    if ref:
        out.append("    " + "; ".join(ref))
    if "gc" in res:
        off = "" if res.get("gc_freeze", True) else " [--gc-freeze off]"
        out.append("    " + describe(res["gc"]) + off)
    if "gpu_busy_s" in b:
        gap = b["gpu_idle_gap_ms"]
        out.append(
            f"    GPU busy {b['gpu_busy_s']:.2f} s = {b['gpu_busy_share_of_wall']:.0%} of wall; idle between "
            f"steps {b['gpu_idle_between_steps_s']:.2f} s (gap p50/p99 {gap['p50'] or 0:.2f}/"
            f"{gap['p99'] or 0:.2f} ms)"
        )
    for kind, r in b["by_kind"].items():
        dev = (
            f", device {r['device_ms_per_step']:.2f} ms/step ({r['device_share_of_wall']:.0%} of wall, "
            f"roofline/device {r['roofline_over_device']:.0%})"
            if r["device_ms_per_step"] is not None
            else ""
        )
        out.append(
            f"    {kind:7s} {r['steps']:6d} steps ({r['step_share']:.0%}), {r['mean_tokens']:.0f} tokens "
            f"({r['mean_decode_rows']:.0f} decode rows)/step, roofline "
            f"{r['roofline_ms_per_step']:.2f} ms/step"
            f"{dev}, host launch {r['launch_ms_per_step']:.2f} ms/step"
        )
    out.append("    host ms/step: " + ", ".join(f"{k} {v:.2f}" for k, v in b["host_ms_per_step"].items()))
    tr = res.get("gpu_trace")
    if tr:
        out.append(
            f"    device trace {tr['at_s']:g}-{tr['at_s'] + tr['length_s']:g} s: busy {tr['busy_ms']:.1f} of "
            f"{tr['span_ms']:.1f} ms (idle {tr['idle_share']:.1%}: "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in tr["idle_ms_by_gap"].items())
            + "); largest: "
            + "; ".join(
                f"{g['us']} us {g['after'][:40]} -> {g['before'][:40]}" for g in tr["largest_gaps_us"][:3]
            )
        )
        for k in tr.get("kernels", [])[:12]:
            out.append(f"      {k['ms']:9.3f} ms {k['count']:6d}x  {k['name'][:80]}")
    return "\n".join(out)


def plan_table(
    names, args, shape: Shape, max_num_seqs: int, kv_tokens: int, scale: float, vocab: int
) -> list[dict]:
    rows = []
    for name in names:
        reqs = make_requests(name, requests_for(name, args, max_num_seqs, kv_tokens, scale), vocab, scale)
        prompts = [len(p) for p, _ in reqs]
        olen = reqs[0][1]
        roof = roofline(shape, prompts, olen, max_num_seqs, kv_tokens)
        at_fraction = roof["seconds"] / args.assume_fraction
        target = TARGETS.get(name)
        at_target = len(reqs) * olen / target if target else None
        rows.append(
            {
                "workload": name,
                "requests": len(reqs),
                "output_tokens": len(reqs) * olen,
                "roofline_s": roof["seconds"],
                "decode_batch": roof["decode_batch"],
                f"est_s_at_{args.assume_fraction:g}_roofline": at_fraction,
                "est_s_at_target": at_target,
            }
        )
        tgt = f", {at_target:6.1f} s at the target rate" if at_target else ""
        print(
            f"  {name:10s} {len(reqs):5d} requests, {len(reqs) * olen:9,} output tokens, "
            f"roofline {roof['seconds']:6.1f} s "
            f"(B={roof['decode_batch']}): ~{at_fraction:6.1f} s at {args.assume_fraction:.0%} of it{tgt}",
            flush=True,
        )
    return rows


def save(results: dict, path: str | None) -> None:
    """Rewrite the whole file after each workload, atomically, so a cut-off run keeps what it measured."""
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, path)


# ---- main ------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--workloads",
        nargs="+",
        default=list(WORKLOADS),
        metavar="NAME[:REQUESTS]",
        help=f"of {', '.join(WORKLOADS)}; ':N' gives that one N requests (over --requests / --waves)",
    )
    ap.add_argument("--requests", type=int, default=None, help="requests per fixed workload (default 1000)")
    ap.add_argument(
        "--waves", type=int, default=None, help="requests = this x the running batch the pool holds"
    )
    ap.add_argument(
        "--peer-requests",
        action="store_true",
        help="each fixed workload at the request count TensorRT-LLM's published runs used (128/128 30,000; "
        "128/2048, 2048/128 and 1000/1000 3,000; 2048/2048 1,500): the peer's own steady-state setting",
    )
    ap.add_argument(
        "--mixed-requests", type=int, default=None, help=f"the burst's requests (default {MIXED['requests']})"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="stop each workload after this many seconds")
    ap.add_argument(
        "--submit",
        choices=("many", "one"),
        nargs="+",
        default=["many"],
        help="queue each workload's requests in one submit_many call (default), or one submit each while "
        "the engine steps (a server's arrival; the first steps then wait on the GIL: BENCHMARKS.md, s33); "
        "both: each workload runs once each way, side by side",
    )
    ap.add_argument(
        "--gc-freeze",
        choices=("on", "off"),
        nargs="+",
        default=["on"],
        help="whether each run's engine freezes the Python heap alive at its start (LLMEngine(freeze_gc=); "
        "on, the default, as served): a full garbage collection otherwise walks the whole heap, holding the "
        "GIL for 0.1 s or more; both: each workload runs once each way, side by side",
    )
    ap.add_argument(
        "--gc-diagnose",
        action="store_true",
        help="say what each full garbage collection in a timed window walked (unfrozen objects) and freed "
        "(by type); the garbage is freed after each pause is timed, so set the pauses beside a run without "
        "it to see what deallocation costs",
    )
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        nargs="+",
        default=[sizing.DEFAULT_MAX_NUM_SEQS],
        help="scheduler variants: each workload runs once per value (one executor, graphs to the largest)",
    )
    ap.add_argument(
        "--prefill-with-decodes",
        type=int,
        nargs="+",
        default=[SchedulerConfig.max_prefill_tokens_with_decodes],
        help="scheduler variants: prompt tokens a step while rows decode (max_prefill_tokens_with_decodes)",
    )
    ap.add_argument(
        "--reserve-max-tokens",
        nargs="+",
        choices=("off", "on"),
        default=["off"],
        help="scheduler variants: admission reserving prompt + max_tokens (no preemption) off / on",
    )
    ap.add_argument(
        "--fill-step-buckets",
        nargs="+",
        choices=("off", "on"),
        default=["on"],
        help="scheduler variants: a step with decodes takes prompt tokens up to the piecewise graphs' "
        "token bucket it pads to (SchedulerConfig.fill_step_buckets; on by default)",
    )
    ap.add_argument(
        "--concurrent-attention",
        nargs="+",
        choices=("off", "on"),
        default=None,
        help="executor variants: decode and prompt-chunk attention of a mixed step on two streams "
        "(TritonPagedAttention.concurrent) off / on; default on as served (off for --tiny: CPU attention)",
    )
    ap.add_argument(
        "--hopper-chunks",
        nargs="+",
        choices=("off", "on"),
        default=["on"],
        help="executor variants: prompt chunks of at least chunked_prefill.HOPPER_CHUNK_MIN_TOKENS on the "
        "warp-specialized Hopper flash-attention kernel over their gathered K/V (TritonPagedAttention."
        "hopper_chunks; on by default, used on sm_90 with 16-bit pools) or all on the varlen kernel (off)",
    )
    ap.add_argument(
        "--decode-tiles-by-keys",
        nargs="+",
        choices=("off", "on"),
        default=["on"],
        help="executor variants: 16-bit decode attention's tile by the keys a launch may see "
        "(decode_attention.DECODE_CONFIG_BY_KEYS; on by default) or 64-key tiles everywhere (off); the "
        "decode graphs are captured again whenever it changes between runs",
    )
    ap.add_argument(
        "--quantization",
        choices=("none", "fp8"),
        default="none",
        help="the layers' weights: BF16 (none) or FP8 W8A8 (trtforge.llm.quant); the roofline then counts "
        "the layers' weights at 1 byte and their FLOPs at 2x the peak",
    )
    ap.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8"),
        default="auto",
        help="the paged pools: the model's dtype (auto) or FP8 E4M3 (per-layer scales, calibrated)",
    )
    ap.add_argument(
        "--mid-gemm",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=None,
        help="16-bit projections of MIN..MAX tokens on trtforge's mid-sized GEMM (fused_layers."
        "MID_GEMM_MIN/MAX_TOKENS; default: the module's, today off); set before the graphs are captured",
    )
    ap.add_argument(
        "--fp8-mid-max",
        type=int,
        default=None,
        help="W8A8 above 64 and up to this many tokens on the mid-sized GEMM "
        "(quant.linear.FP8_MID_MAX_TOKENS)",
    )
    ap.add_argument(
        "--fp8-decode-config",
        type=int,
        nargs=3,
        metavar=("BLOCK_N", "WARPS", "STAGES"),
        default=None,
        help="the decode attention's launch over FP8 pools at every batch (decode_attention."
        "FP8_KV_DECODE_CONFIG, with the 2-warp launch for many pairs off: '128 4 2' is the rule before "
        "session 25)",
    )
    ap.add_argument(
        "--fp8-mid-fold-residual",
        choices=("on", "off"),
        default=None,
        help="fold o's and down's residual add into the mid-sized FP8 GEMM's epilogue "
        "(quant.linear.FP8_MID_FOLD_RESIDUAL; default: the module's, today off)",
    )
    add_set_option(ap)
    ap.add_argument(
        "--gpu-trace",
        type=float,
        nargs=2,
        metavar=("AT_S", "LENGTH_S"),
        default=None,
        help="profile the device for LENGTH_S seconds from AT_S into each timed workload: busy vs idle "
        "inside steps and the largest gaps (a diagnostic: the traced run's throughput reads a little low)",
    )
    ap.add_argument(
        "--decode-batch-buckets",
        type=int,
        nargs="+",
        default=None,
        help="the decode graphs' batch buckets (torch_exec._BATCH_BUCKETS; default: the module's): a "
        "decode step of B rows runs padded to the first bucket >= B",
    )
    ap.add_argument("--block-size", type=int, default=16, help="tokens a KV block (page) holds")
    ap.add_argument("--max-batched-tokens", type=int, default=sizing.DEFAULT_MAX_NUM_BATCHED_TOKENS)
    ap.add_argument("--prefill-chunk", type=int, default=sizing.DEFAULT_MAX_PREFILL_CHUNK)
    ap.add_argument("--max-model-len", type=int, default=4096, help="the longest request (2048 + 2048)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=sizing.DEFAULT_GPU_MEMORY_UTILIZATION)
    ap.add_argument(
        "--kv-gb", type=float, default=None, help="a KV pool of this size instead of the server's sizing"
    )
    ap.add_argument(
        "--assume-fraction", type=float, default=0.5, help="--plan-only: the roofline share assumed"
    )
    ap.add_argument("--assume-kv-gb", type=float, default=105.0, help="--plan-only: the pool assumed (GB)")
    ap.add_argument(
        "--peer-shares",
        action="store_true",
        help="print each published TensorRT-LLM row's share of this roofline (its machine, its precision) "
        "at decode batches 256-2048; run nothing",
    )
    ap.add_argument(
        "--plan-only", action="store_true", help="print each workload's size and time estimate; run nothing"
    )
    ap.add_argument("--quick", action="store_true", help="2 waves per fixed workload, 60 s budget each")
    ap.add_argument(
        "--tiny", action="store_true", help="2-layer model on the CPU, lengths / 16 (checks the script)"
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="cpu implies --tiny")
    ap.add_argument(
        "--out", default=None, help="write the results as JSON here (rewritten after each workload)"
    )
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # a run cut by the device's time limit keeps its lines
    args.counts = {}
    names = []
    for spec in args.workloads:
        name, _, count = spec.partition(":")
        if name not in WORKLOADS or (count and not count.isdigit()):
            ap.error(
                f"--workloads takes NAME[:REQUESTS] with NAME one of {', '.join(WORKLOADS)}; got {spec!r}"
            )
        names.append(name)
        if count:
            args.counts[name] = int(count)
    args.workloads = names
    tiny = args.tiny or args.device == "cpu"
    if args.concurrent_attention is None:
        args.concurrent_attention = ["off"] if tiny else ["on"]
    device = "cpu" if tiny else "cuda"
    scale = 1 / 16 if tiny else 1.0
    if tiny:
        args.requests = args.requests or (None if args.waves else 24)
        args.mixed_requests = args.mixed_requests or 12
        args.max_model_len = min(args.max_model_len, 512)
        args.max_num_seqs = [min(m, 8 * m // max(args.max_num_seqs)) for m in args.max_num_seqs]
        args.prefill_with_decodes = [max(1, m // 16) for m in args.prefill_with_decodes]
        args.max_batched_tokens, args.prefill_chunk = (
            min(args.max_batched_tokens, 256),
            min(args.prefill_chunk, 64),
        )
    if args.quick:
        args.waves = args.waves or (None if args.requests else 2)
        args.budget_s = args.budget_s or 60.0
    shape_name = "tiny" if tiny else "8b"
    from transformers import LlamaConfig

    shape = Shape.of(LlamaConfig(**SHAPES[shape_name]), 4 if tiny else 2)
    if args.quantization == "fp8":  # 1-byte layer weights on FP8 tensor cores (2x BF16's peak)
        shape = dataclasses.replace(shape, linear_bytes=1, linear_speedup=2.0)
    if args.kv_cache_dtype == "fp8":
        shape = dataclasses.replace(shape, kv_elem_bytes=1)
    results: dict[str, Any] = {
        "argv": sys.argv[1:],
        "shape": dataclasses.asdict(shape),
        "linear_params": shape.linear_params,
        "decode_weight_bytes": shape.decode_weight_bytes,
        "peak_flops": PEAK_FLOPS,
        "hbm_bytes_per_s": HBM_BYTES_PER_S,
        "published_peers": PUBLISHED,
        "targets": {**TARGETS, "mixed_wall_s": MIXED_TARGET_S, "roofline_fraction": ROOFLINE_TARGET},
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    import trtforge.kernels.decode_attention as decode_attention
    import trtforge.llm.executors.fused_layers as fused_layers
    import trtforge.llm.quant.linear as quant_linear

    if args.decode_batch_buckets is not None:
        import trtforge.llm.executors.torch_exec as torch_exec

        torch_exec._BATCH_BUCKETS = tuple(sorted(set(args.decode_batch_buckets)))
    if args.mid_gemm is not None:
        fused_layers.MID_GEMM_MIN_TOKENS, fused_layers.MID_GEMM_MAX_TOKENS = args.mid_gemm
    if args.fp8_mid_max is not None:
        quant_linear.FP8_MID_MAX_TOKENS = args.fp8_mid_max
    if args.fp8_mid_fold_residual is not None:
        quant_linear.FP8_MID_FOLD_RESIDUAL = args.fp8_mid_fold_residual == "on"
    if apply_set_option(ap, args):
        results["settings"] = args.settings
    if args.fp8_decode_config is not None:  # one launch everywhere: no 2-warp launch for many pairs
        decode_attention.FP8_KV_DECODE_CONFIG = decode_attention.DecodeConfig(*args.fp8_decode_config)
        decode_attention.FP8_KV_TWO_WARPS_MIN_PAIRS = float("inf")
    results["fp8_kv_decode_config"] = dataclasses.asdict(decode_attention.FP8_KV_DECODE_CONFIG)
    results["fp8_kv_two_warps_min_pairs"] = decode_attention.FP8_KV_TWO_WARPS_MIN_PAIRS
    results["mid_gemm_tokens"] = [fused_layers.MID_GEMM_MIN_TOKENS, fused_layers.MID_GEMM_MAX_TOKENS]
    results["fp8_mid_max_tokens"] = quant_linear.FP8_MID_MAX_TOKENS
    results["fp8_mid_fold_residual"] = quant_linear.FP8_MID_FOLD_RESIDUAL
    variants = [
        (m, p, r == "on", c == "on", f == "on", t == "on", h == "on")
        for m in args.max_num_seqs
        for p in args.prefill_with_decodes
        for r in args.reserve_max_tokens
        for c in args.concurrent_attention
        for f in args.fill_step_buckets
        for t in args.decode_tiles_by_keys
        for h in args.hopper_chunks
    ]
    if args.peer_shares:
        bf16 = Shape.of(LlamaConfig(**SHAPES["8b"]), 2)
        fp8 = dataclasses.replace(bf16, linear_bytes=1, linear_speedup=2.0, kv_elem_bytes=1)
        print("TensorRT-LLM's published rows as a share of this roofline on their own machine and precision:")
        results["peer_shares"] = peer_shares(bf16, fp8)
        save(results, args.out)
        return
    if args.plan_only:
        kv_tokens = int(args.assume_kv_gb * 1e9 // shape.kv_bytes_per_token)
        results["plan"] = {}
        for mns in args.max_num_seqs:
            print(f"max_num_seqs {mns}, an assumed {args.assume_kv_gb:g} GB pool ({kv_tokens:,} tokens):")
            results["plan"][mns] = plan_table(args.workloads, args, shape, mns, kv_tokens, scale, shape.vocab)
        save(results, args.out)
        return
    t = time.perf_counter()
    model = build_model(shape_name, device)
    if args.quantization != "none":
        from trtforge.llm.quant import quantize_model

        quantize_model(model, args.quantization)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    results["model_build_s"] = time.perf_counter() - t
    results["device"] = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    results["torch"] = torch.__version__
    print(f"model built in {results['model_build_s']:.1f} s on {results['device']}", flush=True)
    run_all(model, variants, args, shape, scale, device, results)


def variant_key(
    mns: int,
    pwd: int,
    reserve: bool,
    concurrent: bool = False,
    fill: bool = True,
    tiles: bool = True,
    hopper: bool = True,
) -> str:
    return (
        f"seqs{mns}_pwd{pwd}"
        + ("_reserve" if reserve else "")
        + ("_concurrent" if concurrent else "")
        + ("" if fill else "_nofill")
        + ("" if tiles else "_tiles64")
        + ("" if hopper else "_varlenchunks")
    )


def set_decode_tiles_by_keys(ex: TorchExecutor, graphs: Any, on: bool) -> None:
    """Switch decode_attention.DECODE_CONFIG_BY_KEYS; the decode graphs, which hold the launches they
    captured, are captured again (mixed steps plan their attention each step)."""
    import trtforge.kernels.decode_attention as decode_attention

    current = decode_attention.DECODE_CONFIG_BY_KEYS
    if current == on:
        return
    decode_attention.DECODE_CONFIG_BY_KEYS = on
    if ex.num_cuda_graphs:
        ex._graphs.clear()
        gc.collect()
        ex.capture_decode_graphs(max_batch=graphs.max_decode_batch, q_lens=graphs.q_lens)


def run_all(model, variants, args, shape: Shape, scale: float, device: str, results: dict) -> None:
    """One executor (pool, graphs up to the largest running batch, warm-up); then every workload under
    every scheduler variant, variants interleaved per workload so that their comparison is side by side."""
    cuda = device == "cuda"
    widest = max(m for m, *_ in variants)
    base = dataclasses.replace(
        sizing.default_scheduler_config(None, widest),
        max_num_batched_tokens=args.max_batched_tokens,
        max_prefill_chunk=args.prefill_chunk,
    )
    t = time.perf_counter()
    block = args.block_size
    # the graphs this executor captures: the sizing measures and reserves them (issue #29's OOM at 0.9)
    graphs = sizing.GraphCapture(max_decode_batch=widest, max_graph_tokens=args.max_batched_tokens)
    graph_reserve = None
    if args.kv_gb:
        num_blocks = int(args.kv_gb * 1e9 // (shape.kv_bytes_per_token * block))
        how = f"--kv-gb {args.kv_gb}"
    else:
        pool = sizing.torch_pool(
            model,
            block_size=block,
            device=None,
            dtype=None,
            max_model_len=args.max_model_len,
            config=base,
            gpu_memory_utilization=args.gpu_memory_utilization,
            graphs=graphs,
            kv_cache_dtype=args.kv_cache_dtype,
        )
        num_blocks, how, graph_reserve = pool.num_blocks, pool.how, pool.graph_bytes
    ex = TorchExecutor(
        model,
        num_blocks=num_blocks,
        block_size=block,
        max_model_len=args.max_model_len,
        kv_cache_dtype=args.kv_cache_dtype,
        **graphs.executor_kwargs(),
    )
    kv_tokens = num_blocks * block
    results["executor"] = {
        "num_blocks": num_blocks,
        "kv_tokens": kv_tokens,
        "block_size": block,
        "kv_pool_gb": ex.facts.kv_pool_bytes / 1e9,
        "pool_how": how,
        "sizing_s": time.perf_counter() - t,
        "kernels": ex.kernels,
        "fused_layers": ex.fused_refusal is None,
        "decode_batch_buckets": list(ex._batch_buckets),
        "max_graph_tokens": args.max_batched_tokens,
        "graph_reserve_gb": None if graph_reserve is None else graph_reserve / 1e9,
    }
    print(
        f"pool: {num_blocks:,} blocks = {kv_tokens:,} tokens ({ex.facts.kv_pool_bytes / 1e9:.1f} GB; {how})"
    )
    free = free_gpu_bytes(cuda)
    t = time.perf_counter()
    sizing.capture_graphs(ex, graphs)  # as the sizing measured them (the server does the same)
    results["executor"]["decode_graphs"] = ex.num_cuda_graphs
    results["executor"]["piecewise_graphs"] = ex.num_piecewise_graphs
    results["executor"]["capture_s"] = capture = time.perf_counter() - t
    after = free_gpu_bytes(cuda)
    took = None if free is None or after is None else free - after
    results["executor"]["graph_capture_gb"] = None if took is None else took / 1e9
    results["executor"]["free_after_capture_gb"] = None if after is None else after / 1e9
    print(
        f"graphs: {ex.num_cuda_graphs} decode, {ex.num_piecewise_graphs} piecewise in {capture:.1f} s"
        + ("" if took is None else f", took {took / 1e9:.2f} GB of GPU memory")
        + ("" if graph_reserve is None else f" (the sizing reserved {graph_reserve / 1e9:.2f} GB)")
        + ("" if after is None else f"; {after / 1e9:.2f} GB free after")
    )
    probe = StepProbe(ex, cuda, shape)
    configs = {
        variant_key(m, p, r, c, f, t, h): dataclasses.replace(
            base, max_num_seqs=m, max_prefill_tokens_with_decodes=p, reserve_max_tokens=r, fill_step_buckets=f
        )
        for m, p, r, c, f, t, h in variants
    }
    concurrent = {variant_key(*v): v[3] for v in variants}  # the executor's attention, per variant
    tiles = {variant_key(*v): v[5] for v in variants}
    hopper = {variant_key(*v): v[6] for v in variants}
    if any(concurrent.values()) and not hasattr(ex.attention, "concurrent"):
        raise SystemExit(
            f"--concurrent-attention on needs the Triton attention; this executor runs {ex.kernels}"
        )
    # warm-up (untimed): prompts of every size the workloads bring and a full running batch, so Triton's
    # compilations happen here
    t = time.perf_counter()
    rng = np.random.default_rng(7)
    lens = [int(x * scale) for x in (16, 128, 1000, 2048, 64, 700, 1500, 2040)] * 4
    warm = [(rng.integers(3, shape.vocab, size=max(1, k)).tolist(), 4) for k in lens]
    warm += [(rng.integers(3, shape.vocab, size=8).tolist(), 6) for _ in range(widest)]
    for flag, by_keys, long in sorted({(concurrent[k], tiles[k], hopper[k]) for k in configs}):
        if hasattr(ex.attention, "concurrent"):  # each attention variant meets its kernels here
            ex.attention.concurrent = flag
            ex.attention.hopper_chunks = long
        set_decode_tiles_by_keys(ex, graphs, by_keys)
        run_workload(probe, configs[variant_key(*variants[-1])], warm, None)
    results["executor"]["warmup_s"] = time.perf_counter() - t
    print(f"warm-up {results['executor']['warmup_s']:.1f} s", flush=True)
    results["variants"] = {
        k: {
            "scheduler": dataclasses.asdict(c),
            "concurrent_attention": concurrent[k],
            "decode_tiles_by_keys": tiles[k],
            "hopper_chunks": hopper[k],
            "workloads": {},
        }
        for k, c in configs.items()
    }
    for mns in sorted({m for m, *_ in variants}):
        print(f"plan at this pool, max_num_seqs {mns}:")
        results["variants"][variant_key(mns, *variants[0][1:])]["plan"] = plan_table(
            args.workloads, args, shape, mns, kv_tokens, scale, shape.vocab
        )
    save(results, args.out)
    for name in args.workloads:
        for key, config in configs.items():
            mns = config.max_num_seqs
            if hasattr(ex.attention, "concurrent"):
                ex.attention.concurrent = concurrent[key]
                ex.attention.hopper_chunks = hopper[key]
            set_decode_tiles_by_keys(ex, graphs, tiles[key])
            reqs = make_requests(name, requests_for(name, args, mns, kv_tokens, scale), shape.vocab, scale)
            for submit in args.submit:
                for freeze in args.gc_freeze:
                    mode = (submit, freeze == "on")
                    run_one(probe, config, key, name, reqs, mode, args, results, shape, scale, kv_tokens)
    del probe, ex
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def run_one(probe, config, key, name, reqs, mode, args, results, shape, scale, kv_tokens) -> None:
    """Workload `name` (`reqs`) under scheduler variant `key`, `mode` = (how it is submitted, whether the
    engine freezes the heap), after its untimed warm-up slice; its result is printed and saved (keyed by
    the mode too where --submit or --gc-freeze names both)."""
    submit, freeze = mode
    mns = config.max_num_seqs
    t = time.perf_counter()
    run_workload(probe, config, warm_slice(reqs, mns, scale, shape.vocab), None)
    warm = time.perf_counter() - t
    cached = triton_cache_entries()
    res = run_workload(
        probe, config, reqs, args.budget_s, args.gpu_trace, submit, freeze, gc_diagnose=args.gc_diagnose
    )
    res["warmup_s"] = warm
    after = triton_cache_entries()
    res["jit_compiles_in_window"] = None if None in (cached, after) else after - cached
    prompts = [len(p) for p, _ in reqs]
    res["roofline"] = roofline(shape, prompts, reqs[0][1], mns, kv_tokens)
    steady = res["steady"] and res["truncated"]
    rate = res["steady"]["output_tok_s"] if steady else res["output_tok_s"]
    res["roofline_fraction"] = rate / res["roofline"]["output_tok_s"]
    res["published"] = PUBLISHED.get(name)
    res["quantization"], res["kv_cache_dtype"] = args.quantization, args.kv_cache_dtype
    fp8_row = (PUBLISHED.get(name) or {}).get("trtllm_v1.0_h200_fp8")
    res["target_output_tok_s"] = fp8_row if args.quantization != "none" else TARGETS.get(name)
    if name == "mixed":
        res["target_wall_s"] = MIXED_TARGET_S
    res["gpu_state_after"] = gpu_state() if probe.cuda else None
    named = [f"submit {submit}"] if len(args.submit) > 1 else []
    named += [f"gc-freeze {'on' if freeze else 'off'}"] if len(args.gc_freeze) > 1 else []
    label = f"{name} ({', '.join(named)})" if named else name
    results["variants"][key]["workloads"][label] = res
    tag = " ".join([key, *named])
    print(f"[{tag}] " + line(name, res), flush=True)
    if res["gpu_state_after"]:
        print("    GPU after: " + ", ".join(f"{k} {v}" for k, v in res["gpu_state_after"].items()))
    save(results, args.out)


if __name__ == "__main__":
    main()
