"""Quality of the FP8 KV cache on a trained model: perplexity and greedy agreement, default vs fp8.

    PYTHONPATH=. python3 benchmarks/bench_kv_fp8_quality.py --out build/kv_fp8_quality.json \
        [--model ../shared/models/code-llama-21m] [--windows 32] [--window-len 512] [--device cpu]

Every variant is a :class:`~trtforge.llm.executors.torch_exec.TorchExecutor` over the same model
(`from_pretrained(dir, kv_cache_dtype=...)` builds the same executor): "auto" (the KV cache in the
model's dtype: FP32 on the CPU, BF16 on a GPU), "fp8" with the default calibration (seeded random
token ids), "fp8" calibrated on held-out prompts that none of the evaluated windows overlap (the
last 64 KiB of the text), and "fp8" with vLLM's fixed scale 1.0. Perplexity: each of `--windows`
fixed windows of `--window-len` tokens (evenly spaced over the first 90% of eval_stdlib.txt) runs as
ONE prefill step whose K/V are written into the pool and read back from it by every query (so the
FP8 rounding of every key and value is in the scores), with the logits of every position;
NLL of tokens 1.. of each window, exp of the mean over all windows. Greedy agreement: the first 8
windows' first 64 tokens as prompts, 32 greedy tokens each, the share of positions equal to
"auto"'s up to the first difference and the share of identical continuations.

The perplexity through the executor is :func:`window_nll` (usable for any executor variant, e.g. a
weight-quantized one).

``--fp8-native-attention`` adds a variant that asks whether an FP8-native attention kernel would keep
the quality: over the default FP8 pools (as served), the reference attention quantizes each query row
(per head, amax / 448) and the softmax numerators (times 448) to E4M3 before their products, as a kernel
feeding Q·Kᵀ and P·V to FP8 tensor cores would (no FP8 -> FP16 conversions of K and V); row sums stay
FP32. Emulated in float32 on the torch reference path (``paged_attention._sdpa``), so it needs
``--device cpu`` or the torch kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

MODELS = Path(__file__).resolve().parents[1] / ".." / "shared" / "models"


def window_nll(executor: Any, ids: list[int]) -> tuple[float, int]:
    """Summed next-token NLL of `ids` (tokens 1..) under `executor`, from one prefill step of the whole
    window at blocks 0.. (every query attends over K/V read back from the pool); returns (sum, count)."""
    from trtforge.llm.executors.base import StepBatch

    n, bs = len(ids), executor.facts.block_size
    blocks = list(range(-(-n // bs)))
    batch = StepBatch.build(["w"], [ids], [0], [blocks], [list(range(n))], [True])
    batch = StepBatch(**{**batch.__dict__, "logits_indices": np.arange(n - 1, dtype=np.int64)})
    logits = torch.as_tensor(executor.step(batch)).float().cpu()
    target = torch.tensor(ids[1:], dtype=torch.long)
    nll = torch.nn.functional.cross_entropy(logits, target, reduction="sum")
    return float(nll), n - 1


def fp8_native_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float
) -> torch.Tensor:
    """SDPA as an FP8-native kernel would compute it (see the module docstring): E4M3 query rows with
    per-row scales, E4M3 softmax numerators scaled by 448, FP32 scores, row maxima and row sums; `k` / `v`
    are the FP8 pools' values already (codes times their scales, exact in float32)."""
    fp8 = torch.float8_e4m3fn
    group = q.shape[-3] // k.shape[-3]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    q, k, v = q.float(), k.float(), v.float()
    sq = q.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 448.0
    qq = (q / sq).to(fp8).float() * sq
    s = (qq @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    pq = (p * 448.0).to(fp8).float() / 448.0
    return (pq @ v) / p.sum(-1, keepdim=True)


@contextlib.contextmanager
def fp8_native_attention():
    """Route the torch reference attention through :func:`fp8_native_sdpa` while inside."""
    from trtforge.llm.executors import paged_attention

    saved = paged_attention._sdpa
    paged_attention._sdpa = fp8_native_sdpa
    try:
        yield
    finally:
        paged_attention._sdpa = saved


def _windows(tokens: list[int], count: int, length: int) -> list[list[int]]:
    usable = int(0.9 * len(tokens)) - length
    return [tokens[s : s + length] for s in np.linspace(0, usable, count).astype(int).tolist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODELS / "code-llama-21m"))
    ap.add_argument("--text", default=str(MODELS / "eval_stdlib.txt"))
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--window-len", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--dtype", default=None, help="model dtype (default: float32 on the CPU, bfloat16 on CUDA)"
    )
    ap.add_argument("--quick", action="store_true", help="8 windows of 256 tokens")
    ap.add_argument(
        "--fp8-native-attention",
        action="store_true",
        help="also the default FP8 pools with E4M3 queries and softmax numerators (emulated)",
    )
    ap.add_argument("--out", default=None, help="JSON results path")
    args = ap.parse_args()
    if args.quick:
        args.windows, args.window_len = 8, 256

    from transformers import AutoTokenizer

    from trtforge.llm.executors.kv_cache import KVScales
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.loader import load_causal_lm
    from trtforge.llm.service import ServingLLM

    if not Path(args.model).is_dir():
        raise SystemExit(f"model directory {args.model} is absent")
    text = Path(args.text).read_text(encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(args.model)
    tokens = tok(text)["input_ids"]
    tail = tok(text[-65536:])["input_ids"]  # calibration prompts: text no evaluated window reaches
    calib = [tail[i : i + 512] for i in range(0, min(len(tail), 2048), 512)]
    windows = _windows(tokens, args.windows, args.window_len)
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.bfloat16 if args.device != "cpu" else torch.float32)
    )
    lm = load_causal_lm(args.model).to(device=args.device, dtype=dtype)
    num_blocks = -(-args.window_len // 16) + 8
    variants: dict[str, dict[str, Any]] = {
        "auto": {},
        "fp8 (default: calibrated on seeded random ids)": {"kv_cache_dtype": "fp8"},
        "fp8 (calibrated on held-out prompts)": {"kv_cache_dtype": "fp8", "calib_prompts": calib},
        "fp8 (fixed scale 1.0, vLLM's default)": {"kv_cache_dtype": "fp8", "kv_scales": 1.0},
    }
    native = "fp8 (default) + E4M3 Q and P (emulated FP8-native attention)"
    if args.fp8_native_attention:
        variants[native] = {"kv_cache_dtype": "fp8"}
    prompts = [w[:64] for w in windows[:8]]
    results: dict[str, Any] = {
        "model": args.model,
        "device": args.device,
        "dtype": str(dtype),
        "variants": {},
    }
    greedy_ref = None
    for name, kw in variants.items():
        t0 = time.perf_counter()
        ex = TorchExecutor(lm, num_blocks=num_blocks, **kw)
        built = time.perf_counter() - t0
        total, count = 0.0, 0
        with fp8_native_attention() if name == native else contextlib.nullcontext():
            if name == native and getattr(ex, "kernels", "torch") != "torch":
                raise SystemExit("--fp8-native-attention emulates on the torch path: use --device cpu")
            for w in windows:
                s, c = window_nll(ex, w)
                total, count = total + s, count + c
            with ServingLLM(ex) as llm:
                greedy = llm.generate(prompts, max_new_tokens=32, stop_at_eos=False)
        row: dict[str, Any] = {
            "ppl": math.exp(total / count),
            "tokens": count,
            "kv_dtype": ex.facts.kv_dtype,
            "kv_bytes_per_token": ex.facts.kv_bytes_per_token,
            "scales": ex.kv_scales.how if isinstance(ex.kv_scales, KVScales) else None,
            "build_s": round(built, 2),
        }
        if greedy_ref is None:
            greedy_ref = greedy
        else:
            prefix = [
                next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), len(r))
                for g, r in zip(greedy, greedy_ref)
            ]
            row["greedy_prefix_agreement"] = sum(prefix) / sum(len(r) for r in greedy_ref)
            row["greedy_identical"] = sum(g == r for g, r in zip(greedy, greedy_ref)) / len(greedy_ref)
        results["variants"][name] = row
        print(name, json.dumps(row), flush=True)
    base = results["variants"]["auto"]["ppl"]
    for row in results["variants"].values():
        row["delta_ppl_pct"] = 100.0 * (row["ppl"] / base - 1.0)
    print("\n| variant | KV bytes/token | perplexity | ΔPPL | greedy prefix agreement | identical |")
    print("|---|---|---|---|---|---|")
    for name, row in results["variants"].items():
        agree, ident = row.get("greedy_prefix_agreement"), row.get("greedy_identical")
        agree_s = "-" if agree is None else f"{100 * agree:.1f}%"
        ident_s = "-" if ident is None else f"{100 * ident:.0f}%"
        print(
            f"| {name} | {row['kv_bytes_per_token']} | {row['ppl']:.4f} | {row['delta_ppl_pct']:+.3f}% | "
            f"{agree_s} | {ident_s} |"
        )
    if args.out:
        from trtforge._fileio import atomic_write_text

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.out), json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
