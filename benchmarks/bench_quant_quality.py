"""Quantization quality on the trained 21M code model: perplexity and greedy top-1 agreement.

Every variant scores the SAME windows of ``eval_stdlib.txt`` (held-out CPython stdlib code): N windows
of L tokens at evenly spaced starts in the file's first four fifths; the perplexity is over every
next-token prediction in them, the agreement is the share of positions whose argmax equals the
reference's. INT4-AWQ calibrates on prompts from the file's LAST fifth (never scored).

Variants (``--variants``, comma-separated; a new one is one entry in ``VARIANTS``; ``*-executor`` and
``kv-fp8`` score every position through the torch executor's paged pools, one prefill step a batch):
- ``bf16``: the reference: the model's BF16 weights, executed in float32 (exact);
- ``fp8``: ``quantize_model(..., "fp8")``: W8A8 E4M3 per-channel weights, per-token activations,
  executed exactly (E4M3 products in float32: the CPU reference path of the serving executor);
- ``int4-rtn`` / ``int4-awq``: INT4 group 128, asymmetric, dequantized to float32;
- ``int8-sq``: the step-graph compile path's INT8 SmoothQuant W8A8 (``quantize_step``, alpha 0.8,
  max calibration on the same calibration prompts), run in exact ONNX Runtime (optimizations off);
- ``fp8-executor``: ``fp8`` through the serving executor (the same numbers, as a check of that path);
- ``bf16-gpu``, ``fp8-gpu``, ``fp8-gpu-fast``: the model served on a CUDA GPU in BF16 through the torch
  executor, unquantized or FP8 W8A8 (cuBLASLt with exact accumulation, or with fast accumulation:
  ``FP8_FAST_ACCUM``), against the same float32 reference;
- ``kv-fp8``: ``kv_cache_dtype="fp8"`` (wip/kvfp8), in the default list where the executor takes it;
- ``head-fp8``, ``fp8+head-fp8``, ``int4-awq+head-fp8``: ``lm_head_quantization="fp8"`` alone and with
  those projections: the LM head in E4M3 with per-row scales, W8A8 here as every position is scored
  (serving decode runs it weight-only at one token: the more exact of the two).

The quantized torch variants run the model's own forward with the :class:`QuantLinear` modules in
place: the same modules and math the torch executor's CPU path runs.

    python benchmarks/bench_quant_quality.py --out benchmarks/results/quant_quality.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

MODELS = Path(__file__).resolve().parents[1] / ".." / "shared" / "models"


def windows(
    ids: list[int], n: int, length: int, calib: int, calib_len: int
) -> tuple[np.ndarray, list[list[int]]]:
    """`n` eval windows in the first 4/5 of `ids`; `calib` calibration prompts from the last 1/5."""
    split = len(ids) * 4 // 5
    starts = np.linspace(0, split - length, n).astype(int)
    evals = np.stack([np.asarray(ids[s : s + length]) for s in starts])
    cstarts = np.linspace(split, len(ids) - calib_len, calib).astype(int)
    return evals, [list(ids[s : s + calib_len]) for s in cstarts]


def torch_logits(model: torch.nn.Module, evals: np.ndarray, batch: int) -> np.ndarray:
    out = []
    with torch.inference_mode():
        for b in range(0, len(evals), batch):
            ids = torch.as_tensor(evals[b : b + batch], dtype=torch.long)
            out.append(model(input_ids=ids, use_cache=False).logits.float().numpy())
    return np.concatenate(out)


def executor_logits(model: torch.nn.Module, evals: np.ndarray, batch: int, **executor_kwargs) -> np.ndarray:
    """Every position's logits through the serving path: the torch executor's paged pools, one prefill
    step of `batch` windows (each its own sequence and blocks), logits of every token."""
    from trtforge.llm.executors.base import StepBatch
    from trtforge.llm.executors.torch_exec import TorchExecutor

    block = 16
    length = evals.shape[1]
    per_seq = -(-length // block)
    ex = TorchExecutor(model, num_blocks=per_seq * batch, block_size=block, **executor_kwargs)
    out = []
    for b in range(0, len(evals), batch):
        rows = evals[b : b + batch]
        n = len(rows)
        tables = np.arange(n * per_seq, dtype=np.int32).reshape(n, per_seq)
        slots = (tables[:, :, None] * block + np.arange(block)).reshape(n, -1)[:, :length]
        step = StepBatch(
            input_ids=rows.reshape(-1).astype(np.int64),
            positions=np.tile(np.arange(length, dtype=np.int64), n),
            query_start_loc=(np.arange(n + 1) * length).astype(np.int32),
            context_lens=np.full(n, length, np.int32),
            block_tables=tables,
            slot_mapping=slots.reshape(-1).astype(np.int64),
            logits_indices=np.arange(n * length, dtype=np.int64),
            block_copies=np.zeros((0, 2), np.int64),
            seq_ids=tuple(range(n)),
        )
        out.append(ex.step(step).float().cpu().numpy().reshape(n, length, -1))
    return np.concatenate(out)


def gpu_executor_logits(
    model: torch.nn.Module, evals: np.ndarray, batch: int, quantization: str | None, fast_accum: bool
) -> np.ndarray:
    """:func:`executor_logits` on the GPU as served: the model in BF16 on CUDA, quantized there (FP8: the
    W8A8 GEMMs on cuBLASLt, ``FP8_FAST_ACCUM`` = `fast_accum` while it runs)."""
    from trtforge.llm.quant import linear, quantize_model

    if not torch.cuda.is_available():
        raise SystemExit("the *-gpu variants need a CUDA GPU")
    m = copy.deepcopy(model).to("cuda", torch.bfloat16)
    if quantization is not None:
        quantize_model(m, quantization)
    old = linear.FP8_FAST_ACCUM
    linear.FP8_FAST_ACCUM = fast_accum
    try:
        return executor_logits(m, evals, batch)
    finally:
        linear.FP8_FAST_ACCUM = old


def int8_sq_logits(
    model: torch.nn.Module, evals: np.ndarray, calib: list[list[int]], batch: int
) -> np.ndarray:
    """The compile path's INT8 SmoothQuant step graph (all-position logits), exact ONNX Runtime."""
    import tempfile

    from trtforge.llm.compile.export import export_step
    from trtforge.llm.compile.int8 import quantize_step
    from trtforge.numerics.sessions import exact_session

    length = evals.shape[1]
    with tempfile.TemporaryDirectory() as tmp:
        exp = export_step(
            model, max_seq=length, max_batch=batch, max_prefill=length, all_logits=True, workdir=Path(tmp)
        )
        q, _ = quantize_step(exp.model, exp.generation, [c[:length] for c in calib])
    sess = exact_session(q.SerializeToString(), quiet=True)
    g = exp.generation
    names = [i.name for i in sess.get_inputs()]
    out = []
    for b in range(0, len(evals), batch):
        ids = evals[b : b + batch].astype(np.int64)
        rows = ids.shape[0]
        feeds = {
            "input_ids": ids,
            "position_ids": np.repeat(np.arange(length, dtype=np.int64)[None], rows, 0),
            "past_lens": np.zeros(rows, np.int64),
            "new_lens": np.full(rows, length, np.int64),
        }
        shape = (rows, int(g["num_kv_heads"]), length, int(g["head_dim"]))
        for n in names:
            if n not in feeds:
                feeds[n] = np.zeros(shape, np.float32)
        out.append(sess.run(["logits"], feeds)[0])
    return np.concatenate(out)


def score(logits: np.ndarray, evals: np.ndarray, ref_top1: np.ndarray | None) -> dict[str, float]:
    """Perplexity over every next-token prediction, and top-1 agreement with the reference."""
    lg = torch.as_tensor(logits[:, :-1]).double()
    nll = torch.nn.functional.cross_entropy(
        lg.reshape(-1, lg.shape[-1]), torch.as_tensor(evals[:, 1:]).reshape(-1)
    )
    top1 = logits.argmax(-1)
    agree = 1.0 if ref_top1 is None else float((top1 == ref_top1).mean())
    return {"ppl": math.exp(float(nll)), "top1_agreement": agree}


def quantized(
    method: str | None, lm_head: str | None = None
) -> Callable[[torch.nn.Module, list[list[int]]], torch.nn.Module]:
    def make(model: torch.nn.Module, calib: list[list[int]]) -> torch.nn.Module:
        from trtforge.llm.quant import quantize_model

        m = copy.deepcopy(model)
        prompts = calib if method == "int4-awq" else None
        record = quantize_model(m, method, prompts, lm_head_quantization=lm_head)
        m.quant_record = record.to_dict()  # type: ignore[attr-defined]
        return m

    return make


def executor_supports(option: str) -> bool:
    """Whether this tree's TorchExecutor takes `option` (kv_cache_dtype arrives with wip/kvfp8)."""
    import inspect

    from trtforge.llm.executors.torch_exec import TorchExecutor

    return option in inspect.signature(TorchExecutor).parameters


# name -> (label, how it runs, its argument): "torch": the model's forward after make(model, calib);
# "executor": every position through the torch executor, (make or None, executor keywords); "sq": the
# INT8 step graph. A new variant is one entry here.
VARIANTS: dict[str, tuple[str, str, object]] = {
    "bf16": ("BF16 weights (fp32 execution, the reference)", "torch", None),
    "fp8": ("FP8 W8A8 (E4M3, per-channel weights, per-token activations)", "torch", quantized("fp8")),
    "int4-rtn": ("INT4 RTN (group 128, asymmetric)", "torch", quantized("int4-rtn")),
    "int4-awq": (
        "INT4 AWQ (group 128, asymmetric, alpha grid of 21 + clipping)",
        "torch",
        quantized("int4-awq"),
    ),
    "head-fp8": ("FP8 LM head alone (E4M3 per-row, W8A8)", "torch", quantized(None, "fp8")),
    "fp8+head-fp8": ("FP8 W8A8 + FP8 LM head", "torch", quantized("fp8", "fp8")),
    "int4-awq+head-fp8": ("INT4 AWQ + FP8 LM head", "torch", quantized("int4-awq", "fp8")),
    "int8-sq": ("INT8 SmoothQuant W8A8 (step graph, exact ORT)", "sq", None),
    "fp8-executor": ("FP8 W8A8 through the torch executor (paged pools)", "executor", (quantized("fp8"), {})),
    "kv-fp8": ("FP8 KV cache (torch executor)", "executor", (None, {"kv_cache_dtype": "fp8"})),
    "bf16-gpu": ("BF16 served on the GPU (torch executor, BF16 activations)", "gpu", (None, False)),
    "fp8-gpu": ("FP8 W8A8 served on the GPU (cuBLASLt, exact accumulation)", "gpu", ("fp8", False)),
    "fp8-gpu-fast": ("FP8 W8A8 served on the GPU (cuBLASLt, fast accumulation)", "gpu", ("fp8", True)),
}
DEFAULT = ("bf16", "fp8", "int4-rtn", "int4-awq", "int8-sq")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODELS / "code-llama-21m"))
    ap.add_argument("--text", default=str(MODELS / "eval_stdlib.txt"))
    ap.add_argument("--windows", type=int, default=48)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--calib-prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument(
        "--variants",
        default=",".join(v for v, (_, how, _) in VARIANTS.items() if how != "gpu"),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all but the *-gpu ones, which need CUDA)",
    )
    ap.add_argument("--quick", action="store_true", help="8 windows of 256 tokens, 8 calibration prompts")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if args.quick:
        args.windows, args.length, args.calib_prompts = 8, 256, 8
    if args.variants is None:
        args.variants = ",".join(DEFAULT + (("kv-fp8",) if executor_supports("kv_cache_dtype") else ()))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if not Path(args.model).is_dir():
        raise SystemExit(f"{args.model} is absent (the trained models live in ../shared/models)")

    from transformers import AutoTokenizer

    from trtforge.llm.models.loader import load_causal_lm

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model)
    ids = tok(Path(args.text).read_text(encoding="utf-8"))["input_ids"]
    evals, calib = windows(ids, args.windows, args.length, args.calib_prompts, args.length)
    model = load_causal_lm(args.model)  # float32 (the BF16 checkpoint, upcast exactly)
    results: dict[str, dict] = {}
    ref_top1 = None
    if "bf16" not in variants:
        variants.insert(0, "bf16")  # every delta is against it
    for name in ["bf16", *[v for v in variants if v != "bf16"]]:
        label, how, arg = VARIANTS[name]
        t0 = time.perf_counter()
        extra: dict = {}
        if how == "sq":
            logits = int8_sq_logits(model, evals, calib, args.batch)
        elif how == "gpu":
            quantization, fast = arg  # type: ignore[misc]
            logits = gpu_executor_logits(model, evals, args.batch, quantization, fast)
            extra = {"device": torch.cuda.get_device_name(), "fp8_fast_accum": fast}
        elif how == "executor":
            make, kwargs = arg  # type: ignore[misc]
            if "kv_cache_dtype" in kwargs and not executor_supports("kv_cache_dtype"):
                raise SystemExit(
                    f"variant {name}: this tree's TorchExecutor has no kv_cache_dtype (wip/kvfp8)"
                )
            m = copy.deepcopy(model) if make is None else make(model, calib)
            logits = executor_logits(m, evals, args.batch, **kwargs)
            extra = {"quantization": getattr(m, "quant_record", None), "executor_kwargs": kwargs}
        else:
            m = model if arg is None else arg(model, calib)  # type: ignore[operator]
            logits = torch_logits(m, evals, args.batch)
            extra = {"quantization": getattr(m, "quant_record", None)}
        r = score(logits, evals, ref_top1)
        if ref_top1 is None:
            ref_top1 = logits.argmax(-1)
        r.update(label=label, seconds=round(time.perf_counter() - t0, 1), **extra)
        results[name] = r
        base = results["bf16"]["ppl"]
        print(
            f"{name:17s} ppl {r['ppl']:.4f}  dPPL {100 * (r['ppl'] / base - 1):+.2f}%  "
            f"top-1 agreement {100 * r['top1_agreement']:.2f}%  ({r['seconds']} s)",
            flush=True,
        )
    record = {
        "model": Path(args.model).name,
        "text": Path(args.text).name,
        "windows": args.windows,
        "length": args.length,
        "eval_region": "first 4/5 of the tokenized text, evenly spaced starts",
        "calibration": f"{args.calib_prompts} prompts of {args.length} tokens from the last 1/5 of the text",
        "machine": f"{platform.node()} {platform.machine()}, {torch.get_num_threads()} torch threads",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "results": results,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
