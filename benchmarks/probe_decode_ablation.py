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
attention, with its reduction: the decode graphs' own attention function), ``o`` (o_proj GEMV +
residual), ``gate_up`` (norm + gate/up GEMV + SiLU), ``down`` (down GEMV + residual), ``head`` (final norm
+ LM-head GEMV), ``qkv-norm`` / ``gate_up-norm`` (the same GEMV without its RMSNorm prologue: what the
prologue costs), joined by + to ablate several.

``--configs NAME=BN,BK,WARPS[,r] ...`` instead times the unablated graph with projection NAME (qkv, o,
gate_up, down, head) launched with that GemvConfig (``r``: the reducing loop): the same GEMV's launch
choices compared where it runs, between its neighbours, rather than alone (benchmarks/sweep_quant_gemv.py);
``attn=BN,WARPS,STAGES,SPLITS`` does the same for the decode attention's DecodeConfig, and
``NAME=mma:WARPS,GROUPS`` for an INT4 projection on the tensor-core kernel (:mod:`trtforge.kernels.int4_mma`:
warps a program, groups a warp at once; a GemvConfig puts an INT4 projection on the FMA kernel). Several
configs joined by ``;`` apply together.
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
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROJECTIONS = ("qkv", "o", "gate_up", "down", "head")
ABLATIONS = ("qkv", "rope", "attn", "o", "gate_up", "down", "head", "rope+attn", "qkv-norm", "gate_up-norm")


class Mma(NamedTuple):
    """An INT4 projection's launch on the tensor-core kernel: warps a program, groups a warp at once."""

    warps: int
    groups: int


@contextlib.contextmanager
def _launch_choice(choice):
    """The `config` argument for a projection's launch under `choice` (None: the default; a GemvConfig;
    :class:`Mma`: the INT4 tensor-core kernel's rule forced to it while the launch is made, so a graph
    captured inside holds that launch)."""
    from trtforge.kernels import int4_mma

    if not isinstance(choice, Mma):
        yield choice
        return
    old = int4_mma.MMA_WARPS, int4_mma.GROUPS_PER_ITERATION
    int4_mma.MMA_WARPS, int4_mma.GROUPS_PER_ITERATION = choice.warps, choice.groups
    try:
        yield None
    finally:
        int4_mma.MMA_WARPS, int4_mma.GROUPS_PER_ITERATION = old


@contextlib.contextmanager
def ablated(ex, what: str, configs: dict | None = None):
    """Executor `ex` with the ops of `what` (names joined by +) replaced by no-ops (``-norm``: without
    the norm prologue), and projections named in `configs` launched with that GemvConfig; restored after."""
    import trtforge.llm.executors.fused_layers as fl
    from trtforge.kernels import gemv as gemv_mod

    configs = configs or {}

    parts = set(what.split("+")) if what != "none" else set()
    fused = ex._fused
    if fused is None:
        raise SystemExit("the model did not take the fused layers: nothing to ablate")
    qkv_ids = {id(w) for w, _ in fused.qkv_w}
    o_ids, down_ids = {id(w) for w in fused.o_w}, {id(w) for w in fused.down_w}
    head_id = id(fused.head_w)
    saved = {n: getattr(fl, n) for n in ("norm_gemv", "rope_and_cache", "gemv_residual", "norm_gate_up_silu")}
    saved_attn = ex.decode_attention
    real = dict(saved)
    qkv_cols = (fused.num_heads + 2 * fused.num_kv_heads) * fused.head_dim

    def norm_gemv(h, weight, eps, w, b=None):
        if ("qkv" in parts and id(w) in qkv_ids) or ("head" in parts and id(w) == head_id):
            cols = qkv_cols if id(w) in qkv_ids else int(ex.model.config.vocab_size)
            return torch.empty((h.shape[0], cols), dtype=h.dtype, device=h.device)
        if "qkv-norm" in parts and id(w) in qkv_ids:
            return gemv_mod.gemv(h, w, b)
        name = "qkv" if id(w) in qkv_ids else "head" if id(w) == head_id else None
        with _launch_choice(configs.get(name)) as config:
            return real["norm_gemv"](h, weight, eps, w, b, config=config)

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
        name = "o" if id(w) in o_ids else "down" if id(w) in down_ids else None
        with _launch_choice(configs.get(name)) as config:
            return real["gemv_residual"](x, w, residual, config=config)

    def norm_gate_up_silu(h, weight, eps, w):
        inter = int(ex.model.config.intermediate_size)
        if "gate_up" in parts:
            return torch.empty((h.shape[0], inter), dtype=h.dtype, device=h.device)
        if "gate_up-norm" in parts:
            out = torch.empty((h.shape[0], inter), dtype=h.dtype, device=h.device)
            gemv_mod._launch(h, w, out, inter, up_rows=inter)
            return out
        with _launch_choice(configs.get("gate_up")) as config:
            return real["norm_gate_up_silu"](h, weight, eps, w, config=config)

    def attention(q, *args, **kv):
        if "attn" in parts:
            return torch.empty_like(q)
        return saved_attn(q, *args, **kv)

    fl.norm_gemv, fl.rope_and_cache = norm_gemv, rope_and_cache
    fl.gemv_residual, fl.norm_gate_up_silu = gemv_residual, norm_gate_up_silu
    saved_cfg = getattr(saved_attn, "config", None)
    if "attn" in configs:
        saved_attn.config = configs["attn"]
    ex.decode_attention = attention
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(fl, n, f)
        ex.decode_attention = saved_attn
        if "attn" in configs:
            saved_attn.config = saved_cfg


def measure(model, prompt: list[int], what: str, reps: int, configs: dict | None = None) -> dict:
    """One executor with `what` ablated: its decode graphs captured, a few tokens decoded after `prompt`,
    then each graph's replay time (us) and the width bucket the served context uses."""
    from bench_decode_layer import replay_ms

    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.sched.scheduler import SchedulerConfig

    ex = TorchExecutor(model, num_blocks=256, block_size=16, static_decode=True, max_decode_batch=1)
    with ablated(ex, what, configs):
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


def _config(text: str) -> tuple[str, str, object]:
    """--configs' NAME=BN,BK,WARPS[,r]: (the text, the projection, its GemvConfig); NAME=mma:WARPS,GROUPS:
    an INT4 projection's tensor-core launch (:class:`Mma`); or attn=BN,WARPS,STAGES,SPLITS: the decode
    attention's DecodeConfig (its first tile prefetched early, as served)."""
    from trtforge.kernels.decode_attention import DecodeConfig
    from trtforge.kernels.gemv import GemvConfig

    name, eq, spec = text.partition("=")
    if name in PROJECTIONS and spec.startswith("mma:"):
        nums = spec[4:].split(",")
        if len(nums) != 2 or not all(p.isdigit() and int(p) > 0 for p in nums):
            raise argparse.ArgumentTypeError(f"NAME=mma:WARPS,GROUPS, not {text!r}")
        return text, name, Mma(int(nums[0]), int(nums[1]))
    if name == "attn":
        nums = spec.split(",")
        if len(nums) != 4 or not all(p.isdigit() for p in nums):
            raise argparse.ArgumentTypeError(f"attn=BN,WARPS,STAGES,SPLITS, not {text!r}")
        bn, warps, stages, splits = (int(p) for p in nums)
        return text, name, DecodeConfig(bn, warps, stages, splits, early_kv=True)
    parts = spec.split(",")
    if not (eq and name in PROJECTIONS and len(parts) in (3, 4) and all(p.isdigit() for p in parts[:3])):
        raise argparse.ArgumentTypeError(
            f"expected NAME=BN,BK,WARPS[,r] with NAME one of {PROJECTIONS}, got {text!r}"
        )
    if len(parts) == 4 and parts[3] != "r":
        raise argparse.ArgumentTypeError(
            f"the fourth field is r (the reducing loop) or nothing, got {text!r}"
        )
    bn, bk, warps = (int(p) for p in parts[:3])
    return (
        text,
        name,
        GemvConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=1, reduce=len(parts) == 4),
    )


def _configs(text: str) -> tuple[str, dict]:
    """One --configs value: configs joined by ';' (:func:`_config`), applied together."""
    return text, {name: cfg for _, name, cfg in map(_config, text.split(";"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["bf16", "fp8+head-fp8"])
    ap.add_argument(
        "--ablations", nargs="*", default=list(ABLATIONS), help="ops to ablate (none given: only --configs)"
    )
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=50, help="replays a timing (5 timings a graph, median)")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=[],
        type=_configs,
        help="NAME=BN,BK,WARPS[,r]: the unablated graph with projection NAME on that GemvConfig; "
        "NAME=mma:WARPS,GROUPS: an INT4 projection on the tensor-core kernel so launched; "
        "attn=BN,WARPS,STAGES,SPLITS: the decode attention so launched; ';' joins several",
    )
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
            runs = [("none", "none", None)] + [(w, w, None) for w in args.ablations]
            runs += [(text, "none", cfgs) for text, cfgs in args.configs]
            runs.append(("none (again)", "none", None))
            for key, what, configs in runs:
                rows[key] = measure(model, prompt, what, args.reps, configs)
                print(f"{name:14s} {key:24s} {rows[key]['us']:9.1f} us  ({rows[key]['bucket']})", flush=True)
                result["variants"][name] = {"rows": rows}
                _write(args.out, result)  # a run cut at its time limit keeps the rows it timed
        base = statistics.mean([rows["none"]["us"], rows["none (again)"]["us"]])
        margins = {w: base - rows[w]["us"] for w in args.ablations}
        margins |= {text: base - rows[text]["us"] for text, _ in args.configs}
        result["variants"][name] = {"rows": rows, "baseline_us": base, "marginal_us_a_step": margins}
        print(f"{name}: baseline {base:.1f} us a token; saved us a token (a layer):", flush=True)
        for w, m in margins.items():
            per = m if w == "head" or w.startswith("head=") else m / args.layers
            print(f"    {w:24s} {m:8.1f}  ({per:6.2f})", flush=True)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    _write(args.out, result)


def _write(path: str | None, result: dict) -> None:
    """`result` as JSON at `path` (if given), replaced whole: a temporary file renamed over it."""
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, path)


if __name__ == "__main__":
    main()
