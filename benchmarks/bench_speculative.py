"""Speculative decoding: acceptance on held-out code, verification cost at 8B, single-stream latency.

    # (a) CPU: acceptance per method and k on the trained 21M target / 3M draft (greedy, exact check)
    PYTHONPATH=. HF_HUB_OFFLINE=1 python3 benchmarks/bench_speculative.py --out spec_cpu.json
    # (b) GPU (H200): step costs at the Llama-3-8B shape, the 21M/3M pair single-stream, projection
    PYTHONPATH=. HF_HUB_OFFLINE=1 python3 benchmarks/bench_speculative.py --gpu --quick --out spec_gpu.json

(a) For the n-gram (prompt lookup) and draft-model proposers at k = 2, 4, 6: 32 prompts of 128 tokens
cut from ``eval_stdlib.txt`` (CPython's standard library, code the models never saw), 64 new tokens
each, greedy, batched; reports the acceptance rate (accepted / proposed), the mean accepted length
(tokens emitted per verified row: accepted + 1), the share of decode rows that verified proposals,
and checks every output equals plain greedy decoding's token for token.

(b) On the GPU: (1) at the Llama-3-8B shape with random BF16 weights (built on the GPU, trtforge's
kernels), the time of a (k+1)-token verification step vs a 1-token decode step for one sequence at
a few context lengths, k = 2, 4, 6 (CUDA events and wall time, median); (2) the same 1-token step of
a Llama-3.2-1B shape (a cheap draft for 8B); (2b) the 3M draft's proposal alone (one sequence following
the held-out text; ``DraftModelProposer.propose`` wall time, its further k-1 steps chained on the device
vs one by one, the catch-up step apart or folded into the chain, the catch-up alone (k=1) and the cost
of one more step: the slope over k); (3) single-stream ms/token (first
token to last) of the 21M/3M pair on the GPU, plain and with each method (the draft chained, and at
k=4 also step by step); (4) the projection of 8B single-stream latency from (1), (2), (2b) and the
acceptance measured in (3):

    draft:     t/token = (k * t_draft + t_verify(k+1)) / E[accepted + 1]    (t_draft: the 1B shape's step)
    draft-3m:  t/token = (t_propose(k) + t_verify(k+1)) / E[accepted + 1]  (the 3M's measured proposal)
    ngram:  t/token = (f * (t_verify(k+1) + t_lookup) + (1 - f) * t_decode) / (f * E[accepted + 1] + 1 - f)

with f the share of decode steps that had a proposal (prompt lookup finds no match in the others,
which then decode plainly), t_lookup the host time of one lookup, and the ratio to plain decoding
t/token / t_decode. The acceptance of the 21M/3M pair stands in for an 8B target and its 1B draft.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / ".." / "shared" / "models"
KS = (2, 4, 6)
SHAPE_1B = {  # Llama-3.2-1B
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
}


def prompts_from_eval(models: Path, n: int, length: int) -> list[list[int]]:
    """`n` prompts of `length` tokens, evenly spaced through the held-out text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models / "code-llama-21m"))
    ids = tok((models / "eval_stdlib.txt").read_text(encoding="utf-8"))["input_ids"]
    stride = (len(ids) - length) // n
    return [ids[i * stride : i * stride + length] for i in range(n)]


def spec_dict(method: str, k: int, models: Path) -> dict | None:
    if method == "plain":
        return None
    if method in ("draft", "draft-stepwise"):
        return {"method": "draft", "model": str(models / "code-llama-3m"), "num_tokens": k}
    return {"method": "ngram", "num_tokens": k}


def make_engine(
    models: Path,
    spec: dict | None,
    device: str,
    dtype,
    num_blocks: int,
    max_num_seqs: int,
    chain: bool = True,
):
    """The 21M target with `spec`'s proposer; `chain` False: the draft's further steps one by one."""
    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.loader import load_causal_lm
    from trtforge.llm.sched.scheduler import SchedulerConfig
    from trtforge.llm.service import make_proposer
    from trtforge.llm.spec.config import SpeculativeConfig

    ex = TorchExecutor(load_causal_lm(str(models / "code-llama-21m")), num_blocks, device=device, dtype=dtype)
    proposer = None if spec is None else make_proposer(SpeculativeConfig.of(spec), ex)
    # CUDA: every decode and verification graph up front, so that no capture lands in a timed request
    k = 0 if spec is None else spec["num_tokens"]
    ex.capture_decode_graphs(max_batch=max_num_seqs, q_lens=range(1, k + 2))
    if proposer is not None and hasattr(proposer, "executor"):
        # its catch-up steps: runs of 1..k+1 tokens (the accepted proposals and the bonus token)
        proposer.executor.capture_decode_graphs(max_batch=max_num_seqs, q_lens=range(1, k + 2))
        proposer.chain = chain
        if chain:  # the catch-up and the k-1 further steps: one graph per width bucket and run length
            proposer.executor.capture_chain_graphs(
                k - 1, max_batch=max_num_seqs, first_q_lens=range(1, k + 2)
            )
    config = SchedulerConfig(max_num_seqs=max_num_seqs, async_scheduling=False if spec else None)
    return LLMEngine(ex, config, proposer=proposer)


def acceptance(stats) -> dict:
    rows, plain_rows = stats.spec_verify_rows, stats.decode_tokens - stats.spec_verify_rows
    return {
        "drafted": stats.spec_draft_tokens,
        "accepted": stats.spec_accepted_tokens,
        "acceptance_rate": stats.spec_acceptance_rate,
        "mean_accepted_length": stats.spec_mean_accepted_length,
        "verify_rows": rows,
        "plain_decode_rows": plain_rows,
        "verify_share": rows / (rows + plain_rows) if rows + plain_rows else 0.0,
        "mean_proposed": stats.spec_draft_tokens / rows if rows else 0.0,
    }


def ngram_lookup_us(prompts: list[list[int]], k: int) -> float:
    """Median host time of one prompt-lookup proposal as the engine makes it: per request, each step
    appends a token to the sequence (prompt + 64 tokens long) and proposes."""
    from types import SimpleNamespace

    from trtforge.llm.spec.proposers import NgramProposer

    prop = NgramProposer(k)
    seqs = [SimpleNamespace(request_id=i, tokens=p + p[:64]) for i, p in enumerate(prompts[:8])]
    times = []
    for step in range(6):
        for s in seqs:
            s.tokens.append(s.tokens[step])
            t = time.perf_counter()
            prop.propose([s], [k])
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times[len(seqs) :])  # (the first proposal of each fills its array)


def run_cpu(args: argparse.Namespace, models: Path) -> dict:
    import torch

    from trtforge.llm.sampling import SamplingParams

    prompts = prompts_from_eval(models, args.prompts, args.prompt_len)
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    blocks = args.prompts * -(-(args.prompt_len + args.new_tokens + 8) // 16) + 8
    rows, plain = [], None
    for method, k in [("plain", 0)] + [(m, k) for m in ("ngram", "draft") for k in KS]:
        t = time.perf_counter()
        with make_engine(models, spec_dict(method, k, models), "cpu", torch.float32, blocks, 32) as eng:
            out = [c.token_ids for c in eng.generate(prompts, params)]
            stats = eng.stats
        wall = time.perf_counter() - t
        if method == "plain":
            plain = out
        row = {"method": method, "k": k, "wall_s": wall, "identical_to_plain": out == plain}
        row.update(acceptance(stats) if method != "plain" else {})
        rows.append(row)
        print(json.dumps(row), flush=True)
    lookup = {k: ngram_lookup_us(prompts, k) for k in KS}
    print(f"n-gram lookup host time (us, median, {args.prompt_len + 64}-token sequences): {lookup}")
    _print_cpu_table(rows)
    return {"rows": rows, "ngram_lookup_us": lookup}


def _print_cpu_table(rows: list[dict]) -> None:
    print("\n| method | k | acceptance rate | mean accepted length | rows verifying | identical to greedy |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["method"] == "plain":
            continue
        print(
            f"| {r['method']} | {r['k']} | {r['acceptance_rate']:.3f} | {r['mean_accepted_length']:.2f} | "
            f"{r['verify_share']:.0%} | {r['identical_to_plain']} |"
        )


# ---- GPU ----------------------------------------------------------------------------------------
def build_llama(shape: dict, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    # built in BF16 on the GPU, no FP32 copy of the weights (FP32 for the CPU smoke run)
    torch.set_default_dtype(torch.bfloat16 if device == "cuda" else torch.float32)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**shape))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def one_seq_batch(context: int, new: int, block_size: int, vocab: int):
    """One sequence whose last `new` tokens (positions context-new .. context-1) are this step's."""
    from trtforge.llm.executors.base import StepBatch

    rng = np.random.default_rng(context + new)
    table = list(range(-(-context // block_size)))
    first = context - new
    slots = [table[p // block_size] * block_size + p % block_size for p in range(first, context)]
    tokens = rng.integers(0, vocab, size=new).tolist()
    batch = StepBatch.build([0], [tokens], [first], [table], [slots], [True])
    if new > 1:  # verification: logits for every row
        batch = StepBatch.from_flat(
            [0], tokens, [new], [first], slots, [True], batch.block_tables, extra_logits=[new - 1]
        )
    return batch


def time_step(ex, batch, repeats: int) -> dict:
    """Median GPU time (CUDA events around the step) and wall time (step + synchronize; the host's
    launches included) of one step, after warm-up. On the CPU (smoke run) the wall time only."""
    import torch

    cuda = ex.device.type == "cuda"
    for _ in range(3):
        ex.step(batch)  # warm-up: compilation, graph capture of the bucket
    if cuda:
        torch.cuda.synchronize()
    gpu, wall = [], []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t = time.perf_counter()
        logits = ex.step(batch)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            gpu.append(start.elapsed_time(end))
        wall.append((time.perf_counter() - t) * 1e3)
    assert logits.shape[0] == len(batch.logits_indices) and bool(torch.isfinite(logits).all())
    wall_ms = statistics.median(wall)
    q_len = ex.static_q_len(batch)
    path = ex.path_of(batch)
    return {
        "gpu_ms": statistics.median(gpu) if gpu else wall_ms,
        "wall_ms": wall_ms,
        "path": path if q_len is None else f"{path} q_len {q_len}",
    }


def verify_variants(ex) -> list[tuple[str, object, str, object]]:
    """The A/B runs of a verification step besides the default (the static decode path, projections
    on cuBLAS past one row): (name, object, attribute, value) set for the run and put back after.
    "gemv": the fused layers' Triton GEMVs over all k+1 rows (kernels/gemv.py's tensor-core variant);
    "piecewise": the step as before the static path took verification (a graph per stretch of
    layers, attention launched eagerly between them)."""
    out: list[tuple[str, object, str, object]] = [("piecewise", ex, "max_static_q_len", 1)]
    fused = getattr(ex, "_fused", None)  # (private: as bench_decode_layer.py sets the GEMV rows)
    if fused is not None:
        out.insert(0, ("gemv", fused, "gemv_max_tokens", 16))
    return out


def step_costs(shape: dict, contexts: list[int], ks: tuple, repeats: int, name: str, device: str) -> dict:
    """Per context: a 1-token decode step and (k+1)-token verification steps of one sequence."""
    import torch

    from trtforge.llm.executors.torch_exec import TorchExecutor

    t0 = time.perf_counter()
    model = build_llama(shape, device)
    block_size = 16
    blocks = -(-max(contexts) // block_size) + 16
    # static shapes as on CUDA by default (in the CPU smoke run too: the paths are the GPU run's)
    ex = TorchExecutor(model, num_blocks=blocks, block_size=block_size, static_decode=True)
    print(f"[{name}] built in {time.perf_counter() - t0:.1f} s; fused layers: {ex.fused_refusal or 'on'}")
    out: dict = {}
    vocab = shape["vocab_size"]
    for ctx in contexts:
        row = {"decode": time_step(ex, one_seq_batch(ctx, 1, block_size, vocab), repeats)}
        for k in ks:
            batch = one_seq_batch(ctx + k, k + 1, block_size, vocab)
            row[f"verify_k{k}"] = time_step(ex, batch, repeats)
            for variant, obj, attr, value in verify_variants(ex):
                before = getattr(obj, attr)
                setattr(obj, attr, value)
                try:
                    row[f"verify_k{k}_{variant}"] = time_step(ex, batch, repeats)
                finally:
                    setattr(obj, attr, before)
            row[f"verify_k{k}_over_decode_gpu"] = row[f"verify_k{k}"]["gpu_ms"] / row["decode"]["gpu_ms"]
            row[f"verify_k{k}_over_decode_wall"] = row[f"verify_k{k}"]["wall_ms"] / row["decode"]["wall_ms"]
        out[str(ctx)] = row
        print(f"[{name}] context {ctx}: " + json.dumps(row), flush=True)
    if ks:
        print(
            f"\n[{name}] one sequence, wall ms per step (GPU-event ms) and the ratio to decode's wall ms;"
            " verify = k+1 tokens, logits for all; path in brackets; A/B: gemv = Triton GEMVs over the"
            " k+1 rows, piecewise = the path verification took before"
        )
        print("| context | decode | " + " | ".join(f"verify k={k} (gemv; piecewise)" for k in ks) + " |")
        print("|---|---|" + "---|" * len(ks))
        for ctx, row in out.items():
            cells = []
            for k in ks:
                v, d = row[f"verify_k{k}"], row["decode"]
                ab = [row.get(f"verify_k{k}_{name}") for name in ("gemv", "piecewise")]
                extra = "; ".join(f"{a['wall_ms']:.3f}: {a['wall_ms'] / d['wall_ms']:.2f}x" for a in ab if a)
                ratio = v["wall_ms"] / d["wall_ms"]
                cells.append(f"{v['wall_ms']:.3f} / {v['gpu_ms']:.3f}: {ratio:.2f}x [{v['path']}] ({extra})")
            d = row["decode"]
            first = f"| {ctx} | {d['wall_ms']:.3f} / {d['gpu_ms']:.3f} [{d['path']}] | "
            print(first + " | ".join(cells) + " |")
    del ex, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def single_stream(models: Path, prompts: list[list[int]], new_tokens: int, device: str) -> list[dict]:
    """ms/token, first token to last, one request at a time (on the GPU in BF16)."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    from trtforge.llm.sampling import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    rows, plain = [], None
    runs = [("plain", 0)] + [(m, k) for m in ("ngram", "draft") for k in KS] + [("draft-stepwise", 4)]
    for method, k in runs:
        chain = method != "draft-stepwise"  # (A/B: the draft's further steps one by one, as before)
        with make_engine(models, spec_dict(method, k, models), device, dtype, 512, 1, chain) as eng:
            eng.generate([prompts[0]], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
            per_token, outs = [], []
            base = _stats_snapshot(eng.stats)
            for p in prompts:
                handle = eng.submit(p, params)
                got, first, last = [], None, None
                for tok in handle:
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    last = now
                    got.append(tok)
                per_token.append((last - first) * 1e3 / max(len(got) - 1, 1))
                outs.append(got)
            stats = _stats_delta(eng.stats, base)
            proposer = getattr(eng._steps, "proposer", None)  # (private: the loop's proposer)
        if method == "plain":
            plain = outs
        same = sum(a == b for a, b in zip(outs, plain)) / len(outs)
        row = {"method": method, "k": k, "ms_per_token": statistics.mean(per_token), "same_as_plain": same}
        row.update(acceptance(stats) if method != "plain" else {})
        if method.startswith("draft"):
            row["chained_draft_steps"] = proposer.chain_steps
            row["folded_catch_ups"] = proposer.folded_catch_ups
        rows.append(row)
        print("[21M/3M single stream] " + json.dumps(row), flush=True)
    base_ms = rows[0]["ms_per_token"]
    for r in rows:
        r["speedup"] = base_ms / r["ms_per_token"]
    return rows


DRAFT_VARIANTS = {  # name: (proposer's chain, executor's chain_graphs, proposer's fold)
    "stepwise": (False, True, False),  # each further step a step of its own (the path before the chain)
    "chain_steps": (True, False, False),  # chained, a decode-graph replay per step, the catch-up apart
    "chain": (True, True, False),  # chained, the further steps one graph, the catch-up a step apart
    "folded": (True, True, True),  # the catch-up the chain's first step: one graph (the default)
}
# k = 1: the catch-up alone (no further step); the further steps' slope is taken over KS
PROPOSAL_KS = (1, *KS)


def draft_proposal_cost(models: Path, device: str, rounds: int, warmup: int = 8) -> dict:
    """The 3M draft's proposal alone, one sequence (BF16 on the GPU): median wall ms of
    ``DraftModelProposer.propose`` (host sync included) per k and :data:`DRAFT_VARIANTS`. The sequence
    follows the held-out text: each round it takes the leading proposals that match the text and the
    text's next token (as greedy verification would with a target that wrote the text), so the
    catch-up step feeds 1..k+1 tokens as in serving. k = 1 is the catch-up alone (run as a step apart,
    or as a chain of no further steps where folded); the slope over k = 2..6 the cost of one further
    step, and a proposal less its further steps (the intercept) what the catch-up and the proposal's
    fixed host work cost. Each variant's proposals are checked against the step-by-step ones (``agree``:
    the share of equal tokens; BF16 may flip a near-tie)."""
    from types import SimpleNamespace

    import torch

    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.loader import load_causal_lm
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.spec.proposers import DraftModelProposer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ex = TorchExecutor(
        load_causal_lm(str(models / "code-llama-3m")), 64, device=device, dtype=dtype, static_decode=True
    )
    runs = range(1, max(KS) + 2)  # catch-up runs: 1..k+1 tokens
    ex.capture_decode_graphs(max_batch=1, q_lens=runs)
    for k in PROPOSAL_KS:
        ex.capture_chain_graphs(k - 1, max_batch=1, first_q_lens=range(1, k + 2))
    text = prompts_from_eval(models, 1, 128 + (warmup + rounds) * (max(KS) + 1) + 8)[0]
    greedy = SamplingParams()
    out: dict = {}
    for k in PROPOSAL_KS:
        reference = None
        for name, (chain, graphs, fold) in DRAFT_VARIANTS.items():
            prop = DraftModelProposer(ex, k, chain=chain)
            prop.fold = fold
            ex.chain_graphs = graphs
            seq = SimpleNamespace(request_id=0, tokens=text[:128], params=greedy, generator=None)
            times, accepted, proposed = [], [], []
            for r in range(warmup + rounds):
                t = time.perf_counter()
                tokens = prop.propose([seq], [k])[0].tokens
                if r >= warmup:
                    times.append((time.perf_counter() - t) * 1e3)
                n = len(seq.tokens)
                take = next((j for j, tok in enumerate(tokens) if tok != text[n + j]), len(tokens))
                accepted.append(take)
                proposed.extend(tokens)
                seq.tokens = text[: n + take + 1]
            prop.forget([0])
            reference = reference or proposed
            ms = statistics.median(times)
            out[f"k{k}_{name}"] = row = {
                "ms_per_proposal": ms,
                "ms_per_draft_token": ms / k,
                "chained_steps": prop.chain_steps,
                "folded_catch_ups": prop.folded_catch_ups,
                "mean_matching_text": statistics.mean(accepted),
                "agree": sum(a == b for a, b in zip(proposed, reference)) / max(len(reference), 1),
            }
            print(f"[3M draft proposal] k={k} {name}: " + json.dumps(row), flush=True)
    ex.chain_graphs = True
    lo, hi = min(KS), max(KS)
    for name in DRAFT_VARIANTS:  # the cost of one more draft step: the slope over k; the rest: intercept
        at = [out[f"k{k}_{name}"]["ms_per_proposal"] for k in (lo, hi)]
        slope = out[f"ms_per_further_step_{name}"] = (at[1] - at[0]) / (hi - lo)
        out[f"ms_catch_up_intercept_{name}"] = at[0] - (lo - 1) * slope
        out[f"ms_catch_up_alone_{name}"] = out[f"k1_{name}"]["ms_per_proposal"]
    out["chain_graphs"] = ex.num_chain_graphs
    print("\n[3M draft proposal] one sequence, median wall ms per proposal (per draft token); k=1: the")
    print("catch-up alone; further step = slope over k=2..6; catch-up (intercept) = a proposal less its")
    print("further steps; agree = tokens equal to step by step")
    names = list(DRAFT_VARIANTS)
    print("| k | " + " | ".join(names) + " | folded / chain | folded / stepwise |")
    print("|---|" + "---|" * (len(names) + 2))
    for k in PROPOSAL_KS:
        v = {name: out[f"k{k}_{name}"] for name in names}
        cells = [
            f"{r['ms_per_proposal']:.3f} ({r['ms_per_draft_token']:.3f}; agree {r['agree']:.2f})"
            for r in v.values()
        ]
        f = v["folded"]["ms_per_proposal"]
        ratios = f"{f / v['chain']['ms_per_proposal']:.2f} | {f / v['stepwise']['ms_per_proposal']:.2f}"
        print(f"| {k} | " + " | ".join(cells) + f" | {ratios} |")
    for label, key in (
        ("further step", "ms_per_further_step"),
        ("catch-up (intercept)", "ms_catch_up_intercept"),
        ("catch-up alone (k=1)", "ms_catch_up_alone"),
    ):
        vals = [out[f"{key}_{name}"] for name in names]
        print(f"| {label} | " + " | ".join(f"{x:.3f}" for x in vals) + " | | |")
    del ex
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


_FIELDS = ("spec_draft_tokens", "spec_accepted_tokens", "spec_verify_rows", "decode_tokens")


def _stats_snapshot(stats) -> dict:
    return {f: getattr(stats, f) for f in _FIELDS}


def _stats_delta(stats, base: dict):
    from trtforge.llm.sched.request import SchedulerStats

    return SchedulerStats(**{f: getattr(stats, f) - base[f] for f in _FIELDS})


def project(
    costs_8b: dict,
    costs_1b: dict,
    accept_rows: list[dict],
    lookup_us: float,
    source: str,
    draft_3m: dict | None = None,
) -> list[dict]:
    """8B single-stream ms/token per method, k and context, from the step costs and the acceptance
    measured in `source`. Draft rows twice where `draft_3m` (:func:`draft_proposal_cost`) is given:
    "draft" with k steps of the 1B shape, "draft-3m" with the 3M draft's measured proposal, the
    catch-up folded into the chain (``(t_propose(k) + t_verify(k+1)) / E``: the catch-up step and the
    host's share included)."""
    out = []
    for ctx, c in costs_8b.items():
        t_dec = c["decode"]["wall_ms"]
        t_draft = costs_1b[ctx]["decode"]["wall_ms"]
        for r in accept_rows:
            if r["method"] not in ("ngram", "draft"):
                continue
            k, e = r["k"], r["mean_accepted_length"]
            t_ver = c[f"verify_k{k}"]["wall_ms"]
            variants = []
            if r["method"] == "draft":
                variants.append(
                    ("draft", (k * t_draft + t_ver) / e, f"({k} * {t_draft:.3f} + {t_ver:.3f}) / {e:.3f}")
                )
                if draft_3m is not None and f"k{k}_folded" in draft_3m:
                    t_prop = draft_3m[f"k{k}_folded"]["ms_per_proposal"]
                    variants.append(
                        ("draft-3m", (t_prop + t_ver) / e, f"({t_prop:.3f} + {t_ver:.3f}) / {e:.3f}")
                    )
            else:
                f = r["verify_share"]
                per_token = (f * (t_ver + lookup_us / 1e3) + (1 - f) * t_dec) / (f * e + 1 - f)
                formula = (
                    f"({f:.3f} * ({t_ver:.3f} + {lookup_us / 1e3:.3f}) + {1 - f:.3f} * {t_dec:.3f})"
                    f" / ({f:.3f} * {e:.3f} + {1 - f:.3f})"
                )
                variants.append(("ngram", per_token, formula))
            for method, per_token, formula in variants:
                out.append(
                    {
                        "context": int(ctx),
                        "method": method,
                        "k": k,
                        "ms_per_token": per_token,
                        "plain_ms_per_token": t_dec,
                        "ratio_to_plain": per_token / t_dec,
                        "formula": formula,
                        "acceptance_from": source,
                    }
                )
    print(f"\nprojection with the acceptance of {source}")
    print("(draft: k steps of the 1B shape; draft-3m: the 3M draft's measured chained proposal)")
    print("| context | method | k | projected 8B ms/token | plain | ratio | formula (ms) |")
    print("|---|---|---|---|---|---|---|")
    for r in out:
        print(
            f"| {r['context']} | {r['method']} | {r['k']} | {r['ms_per_token']:.2f} | "
            f"{r['plain_ms_per_token']:.2f} | {r['ratio_to_plain']:.2f} | {r['formula']} |"
        )
    return out


def run_gpu(args: argparse.Namespace, models: Path) -> dict:
    """(b); with ``--smoke``: the same code on the CPU with tiny shapes (checks the script only)."""
    import torch

    from benchmarks.bench_http import SHAPES

    device = "cpu" if args.smoke else "cuda"
    big, small = (SHAPES["tiny"], SHAPES["tiny"]) if args.smoke else (SHAPES["8b"], SHAPE_1B)
    contexts = [64, 200] if args.smoke else [512, 4096] if args.quick else [512, 2048, 8000]
    repeats = 3 if args.smoke else 10 if args.quick else 30
    name = "cpu (smoke)" if args.smoke else torch.cuda.get_device_name()
    result: dict = {"device": name, "contexts": contexts}
    result["step_costs_8b"] = step_costs(big, contexts, KS, repeats, "8B", device)
    result["step_costs_1b_draft"] = step_costs(small, contexts, (), repeats, "1B draft", device)
    if not (models / "code-llama-21m").is_dir():
        print(f"the trained models are absent ({models}): no single-stream run and no projection")
        return result
    n, new = (2, 16) if args.smoke else (4, 64) if args.quick else (8, 128)
    prompts = prompts_from_eval(models, n, args.prompt_len)
    result["draft_3m_proposal"] = d3 = draft_proposal_cost(models, device, 10 if args.smoke else 40)
    result["single_stream_21m"] = rows = single_stream(models, prompts, new, device)
    lookup = ngram_lookup_us(prompts, 4)
    result["ngram_lookup_us"] = lookup
    costs = (result["step_costs_8b"], result["step_costs_1b_draft"])
    source = f"this run's single stream ({n} prompts, BF16)"
    result["projection_8b"] = project(*costs, rows, lookup, source, d3)
    cpu = Path(args.acceptance_json)
    if cpu.is_file():  # the larger CPU table (32 prompts, FP32) as a second estimate
        table = json.loads(cpu.read_text(encoding="utf-8"))["rows"]
        result["projection_8b_cpu_acceptance"] = project(*costs, table, lookup, f"{cpu.name} (CPU table)", d3)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--gpu", action="store_true", help="the GPU measurements (b) instead of the CPU table (a)"
    )
    ap.add_argument("--quick", action="store_true", help="GPU: two contexts, fewer repeats, 4 prompts")
    ap.add_argument(
        "--smoke", action="store_true", help="with --gpu: tiny shapes on the CPU (checks the script)"
    )
    ap.add_argument("--models", default=str(MODELS), help="the trained models' folder")
    ap.add_argument(
        "--acceptance-json",
        default=str(ROOT / "benchmarks" / "results" / "speculative_cpu.json"),
        help="GPU: also project from this CPU run's acceptance (the --out of mode (a))",
    )
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    models = Path(args.models).resolve()
    if not args.gpu and not (models / "code-llama-21m").is_dir():
        sys.exit(f"the trained models are absent: {models}")
    t0 = time.perf_counter()
    result = run_gpu(args, models) if args.gpu else run_cpu(args, models)
    result.update(
        command=" ".join(sys.argv),
        machine=platform.node(),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seconds=time.perf_counter() - t0,
    )
    print(f"total {result['seconds']:.0f} s")
    if args.out:
        from trtforge._fileio import atomic_write_text

        atomic_write_text(Path(args.out), json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
