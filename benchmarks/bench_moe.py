"""Fused MoE layers (trtforge.kernels.moe) against the grouped formulation, per layer and end to end.

    PYTHONPATH=. python3 benchmarks/bench_moe.py --out moe.json [--quick] [--device cpu]

(1) One MoE layer's experts (routing given: the router is the same for both) at a Mixtral-8x7B shape
(H 4096, I 14336, E 8, k 2), a Qwen3-30B-A3B shape (H 2048, I 768, E 128, k 8) and a gpt-oss-20b one
(H 2880, I 2880, E 32, k 4; its experts' layout: transposed, interleaved, biased, the clamped SwiGLU),
BF16, at 1, 8, 64,
256, 1024 and 4096 tokens: the fused kernels as a CUDA graph replay (device time, events) and eagerly
(host launch time included), the grouped formulation eagerly (its host sync a layer included; it cannot
be captured). Each call reads a different copy of the layer's weights (enough copies that the weights
touched per round exceed the L2 cache), so weights come from HBM as in a real model. Reports µs a
layer, the expert-weight bandwidth (bytes of the experts the routing hits, read once) in TB/s and the
expert TFLOP/s (2 N k 3 H I). Routing: a softmax top-k over random logits with a per-expert bias
(ragged counts, as trained routers give).

(2) End to end: a small random Mixtral-shaped model (BF16; ``--e2e-model qwen3_moe``: Qwen3-30B-A3B's
layer shapes, 128 experts, k 8) served by the torch executor, decode ms/step at batch 1 and 8 after a
prompt, with CUDA graphs and the fused MoE (the default) against eager grouped MoE
(``torch_exec.MOE_FUSED`` off; the model's steps then run without graphs). ``--skip-layers``: this part
only. ``--set`` puts module settings in force for the whole run (``benchmarks/_settings.py``), e.g.
``moe.ALIGN_KERNEL_MAX_PAIRS=0`` or ``trtforge.llm.models.moe.ROUTE_KERNEL=False`` for the older paths.

``--quick`` (< 2 minutes on the H200): fewer token counts and repetitions. ``--device cpu --quick``
runs the same code paths on tiny shapes in Triton's interpreter (a check that the script runs; the
numbers mean nothing). ``--configs`` overrides the kernel's tile table with a JSON list of
``[fewest rows per expert, block_m, [up bn, bk, warps, stages], [down bn, bk, warps, stages]]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    # Triton's interpreter, set up as the kernel tests set it up (TRITON_INTERPRET before Triton reads it,
    # and its NumPy >= 2.4 scalar fix)
    import tests.kernels.conftest  # noqa: F401

import torch

from benchmarks._settings import parse_setting, set_setting

SHAPES = {  # name: (H, I, E, k); names starting "gpt-oss" in gpt-oss's layout
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "gpt-oss-20b": (2880, 2880, 32, 4),
    # session 46's families (their experts' routing is given here, so only the shapes differ)
    "glm-4.5-air": (4096, 1408, 128, 8),
    "hunyuan-a13b": (4096, 3072, 64, 8),
    "ernie-4.5-21b-a3b": (2560, 1536, 64, 6),
}
CPU_SHAPES = {"tiny-mixtral": (64, 48, 8, 2), "tiny-qwen3": (32, 16, 16, 4), "gpt-oss-tiny": (32, 24, 8, 4)}
#: gpt-oss's clamped SwiGLU (its config's swiglu_alpha / swiglu_limit)
GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0
TOKENS = (1, 8, 64, 256, 1024, 4096)
QUICK_TOKENS = (1, 64, 1024)
CPU_TOKENS = (1, 8, 64)
L2_BYTES = 256 << 20  # weights touched per round of copies at least this (the H200's L2 is 50 MB)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _routing(n: int, e: int, k: int, dev: torch.device, dtype: torch.dtype, seed: int):
    """Top-k of a softmax over random logits plus a fixed per-expert bias (ragged counts), renormalized."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, e, generator=g) + torch.linspace(1.0, -1.0, e)
    weights, experts = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)).to(dev, dtype), experts.to(dev)


def _grouped(x, gate_up, down, weights, experts, biases=None):
    """SparseMoe's grouped formulation (llm.models.moe) on raw tensors: sort, bincount (host sync), a
    GEMM pair per expert hit, weighted sum back per token (`biases`: gpt-oss's layout and its biases)."""
    import torch.nn.functional as F

    k = experts.shape[1]
    order = torch.argsort(experts.reshape(-1), stable=True)
    counts = torch.bincount(experts.reshape(-1), minlength=gate_up.shape[0]).tolist()
    token = order // k
    rows = x[token]
    outs, start = [], 0
    for e, n in enumerate(counts):
        if n:
            if biases is None:
                gate, up = F.linear(rows[start : start + n], gate_up[e]).chunk(2, dim=-1)
                outs.append(F.linear(F.silu(gate) * up, down[e]))
            else:  # gpt-oss's layout, as SparseMoe's grouped gpt_oss branch computes it
                pre = rows[start : start + n] @ gate_up[e] + biases[0][e]
                gate = pre[:, ::2].clamp(max=GPT_OSS_LIMIT)
                up = pre[:, 1::2].clamp(-GPT_OSS_LIMIT, GPT_OSS_LIMIT)
                outs.append((up + 1) * gate * torch.sigmoid(gate * GPT_OSS_ALPHA) @ down[e] + biases[1][e])
            start += n
    y = (torch.cat(outs) * weights.reshape(-1)[order, None]).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token, y)


def _eager_us(fn, dev: torch.device, reps: int) -> float:
    """Median wall time of one call of `fn` (several back to back, then a sync), µs."""
    fn()
    _sync(dev)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync(dev)
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def _graph_us(fn, reps: int) -> float:
    """Median device time of one replay of a CUDA graph of `fn` (events), µs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    del graph
    return statistics.median(times)


def bench_layer(name: str, shape, tokens, dev: torch.device, reps: int) -> list[dict]:
    """One row a token count: fused (graph, eager) and grouped (eager) µs a layer call, with the expert
    weights' bandwidth and the expert FLOP rate each reaches."""
    from trtforge.kernels.moe import fused_moe, moe_config

    h, i, e, k = shape
    gpt_oss = name.startswith("gpt-oss")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    expert_bytes = 3 * h * i * torch.finfo(dtype).bits // 8
    # enough copies of the layer that one token's k experts in each exceed the L2 cache
    copies = 1 if dev.type != "cuda" else max(1, min(16, -(-L2_BYTES // (k * expert_bytes))))
    g = torch.Generator(dev).manual_seed(0)
    up_shape, down_shape = ((e, h, 2 * i), (e, i, h)) if gpt_oss else ((e, 2 * i, h), (e, h, i))
    gate_up = [torch.randn(up_shape, generator=g, device=dev, dtype=dtype) / h**0.5 for _ in range(copies)]
    down = [torch.randn(down_shape, generator=g, device=dev, dtype=dtype) / i**0.5 for _ in range(copies)]
    biases = [None] * copies
    opts: list[dict] = [{} for _ in range(copies)]
    if gpt_oss:  # gpt-oss's experts: transposed, interleaved, biased, the clamped SwiGLU
        biases = [
            (
                torch.randn(e, 2 * i, generator=g, device=dev).to(dtype),
                torch.randn(e, h, generator=g, device=dev).to(dtype),
            )
            for _ in range(copies)
        ]
        swiglu = {"activation": "gpt_oss_swiglu", "alpha": GPT_OSS_ALPHA, "limit": GPT_OSS_LIMIT}
        opts = [
            {"transposed": True, "interleaved": True, "gate_up_bias": b[0], "down_bias": b[1]} | swiglu
            for b in biases
        ]
    rows = []
    for n in tokens:
        routings = [_routing(n, e, k, dev, dtype, seed=n * 100 + c) for c in range(copies)]
        hit = statistics.mean(int(torch.unique(ex).numel()) for _, ex in routings)
        x = torch.randn(n, h, generator=g, device=dev, dtype=dtype)

        def fused(x=x, routings=routings):
            for c, (w, ex) in enumerate(routings):
                fused_moe(x, gate_up[c], down[c], w, ex, **opts[c])

        def grouped(x=x, routings=routings):
            for c, (w, ex) in enumerate(routings):
                _grouped(x, gate_up[c], down[c], w, ex, biases[c])

        w0, ex0 = routings[0]
        want = _grouped(x, gate_up[0], down[0], w0, ex0, biases[0])
        got = fused_moe(x, gate_up[0], down[0], w0, ex0, **opts[0])
        err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        row = {"shape": name, "tokens": n, "copies": copies, "block_m": moe_config(n, k, e).block_m}
        row |= {"experts_hit": hit, "max_rel_diff_vs_grouped": err}
        if dev.type == "cuda":
            row["fused_graph_us"] = _graph_us(fused, reps) / copies
        row["fused_eager_us"] = _eager_us(fused, dev, reps) / copies
        row["grouped_eager_us"] = _eager_us(grouped, dev, reps) / copies
        touched, flops = hit * expert_bytes, 2 * n * k * 3 * h * i
        for key in ("fused_graph_us", "fused_eager_us", "grouped_eager_us"):
            if key in row:
                tag = key.removesuffix("_us")
                row[f"{tag}_weight_TBps"] = touched / row[key] / 1e6
                row[f"{tag}_TFLOPps"] = flops / row[key] / 1e6
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


#: the end-to-end models (--e2e-model): the name their rows carry, transformers' config and model classes,
#: and the config on the GPU and (tiny) on the CPU. Qwen3-30B-A3B's layer shapes: many small experts, where
#: the routing and the alignment weigh most.
E2E_MODELS = {
    "mixtral": (
        "mixtral-shaped 4 layers H1024 I3584 E8 k2",
        "MixtralConfig",
        "MixtralForCausalLM",
        {"hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 4, "num_attention_heads": 16}
        | {"vocab_size": 32000, "num_key_value_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2},
        {"hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4}
        | {"vocab_size": 1024, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2},
    ),
    "qwen3_moe": (
        "qwen3-30b-a3b-shaped 4 layers H2048 I768 E128 k8",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"hidden_size": 2048, "moe_intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 32}
        | {"vocab_size": 32000, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128}
        | {"num_experts_per_tok": 8, "intermediate_size": 8192, "norm_topk_prob": True},
        {"hidden_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4}
        | {"vocab_size": 1024, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 16}
        | {"num_experts_per_tok": 4, "intermediate_size": 256, "norm_topk_prob": True},
    ),
}


def _e2e_model(family: str, dev: torch.device, tiny: bool):
    """The random-weight end-to-end model of `family` (:data:`E2E_MODELS`), BF16 on the GPU, FP32 on the
    CPU, initialized where it runs (the CPU's init of the experts is slow)."""
    import transformers as tf

    _, config_cls, model_cls, full, small = E2E_MODELS[family]
    torch.manual_seed(0)
    cfg = getattr(tf, config_cls)(max_position_embeddings=2048, **(small if tiny else full))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with torch.device(dev):
        return getattr(tf, model_cls)(cfg).to(dtype).eval()


def _decode_ms(ex, batch: int, prompt: int, steps: int, vocab: int) -> float:
    """Median ms of one decode step of `batch` sequences after a `prompt`-token prefill (greedy, tokens
    read back each step as a serving loop does)."""
    from trtforge.llm.executors.base import StepBatch

    bs = ex.facts.block_size
    blocks = -(-(prompt + steps + 8) // bs)
    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(batch)]
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, vocab, (prompt,), generator=g).tolist() for _ in range(batch)]
    ids = [str(b) for b in range(batch)]

    def slots(b: int, lo: int, hi: int) -> list[int]:
        return [tables[b][p // bs] * bs + p % bs for p in range(lo, hi)]

    first = StepBatch.build(
        ids, prompts, [0] * batch, tables, [slots(b, 0, prompt) for b in range(batch)], [True] * batch
    )
    tokens = ex.step(first).argmax(-1).tolist()
    times = []
    for s in range(steps):
        pos = prompt + s
        step = StepBatch.build(
            ids,
            [[t] for t in tokens],
            [pos] * batch,
            tables,
            [slots(b, pos, pos + 1) for b in range(batch)],
            [True] * batch,
        )
        t = time.perf_counter()
        tokens = ex.step(step).argmax(-1).tolist()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[2:] if len(times) > 4 else times)


def bench_end_to_end(dev: torch.device, batches, steps: int, family: str = "mixtral") -> list[dict]:
    import trtforge.llm.executors.torch_exec as te

    tiny = dev.type != "cuda"
    model = _e2e_model(family, dev, tiny)
    vocab = int(model.config.vocab_size)
    blocks = 64 * max(batches) + 64
    rows = []
    for fused in (True, False):
        te.MOE_FUSED = fused
        try:
            ex = te.TorchExecutor(model, num_blocks=blocks, block_size=16, max_decode_batch=max(batches))
        finally:
            te.MOE_FUSED = True
        if tiny and fused:  # the executor keeps grouped on the CPU: the check runs fused in the interpreter
            ex._adapter.moe_formulation = "fused"
        for b in batches:
            row = {
                "model": f"tiny-{family}" if tiny else E2E_MODELS[family][0],
                "moe": ex._adapter.moe_formulation,
                "cuda_graphs": ex.use_cuda_graphs,
                "batch": b,
                "decode_ms_per_step": _decode_ms(ex, b, prompt=32, steps=steps, vocab=vocab),
            }
            row["ms_per_token"] = row["decode_ms_per_step"] / b
            row["decode_graphs"] = ex.num_cuda_graphs
            print(json.dumps(row), flush=True)
            rows.append(row)
        del ex
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _table(spec: str):
    from trtforge.kernels.moe import MoeConfig, MoeTile

    return tuple(
        (int(f), MoeConfig(int(bm), MoeTile(*up), MoeTile(*dn))) for f, bm, up, dn in json.loads(spec)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tokens", type=str, default=None, help="comma-separated token counts")
    ap.add_argument("--configs", type=str, default=None, help="JSON tile table (see the docstring)")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--skip-layers", action="store_true", help="the end-to-end part only")
    ap.add_argument("--e2e-model", default="mixtral", choices=sorted(E2E_MODELS))
    ap.add_argument("--shapes", type=str, default=None, help="comma-separated names of SHAPES (default: all)")
    ap.add_argument(
        "--set",
        type=parse_setting,
        default={},
        help="module settings for the run, e.g. moe.ALIGN_KERNEL_MAX_PAIRS=0 (benchmarks/_settings.py)",
    )
    args = ap.parse_args()
    set_setting(args.set)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "bench_moe: no CUDA device (use --device cpu --quick for a check on the interpreter)"
        )
    import trtforge.kernels.moe as km

    if args.configs:
        km.MOE_CONFIGS = _table(args.configs)
    cpu = dev.type == "cpu"
    tokens = (
        tuple(int(t) for t in args.tokens.split(","))
        if args.tokens
        else CPU_TOKENS
        if cpu
        else QUICK_TOKENS
        if args.quick
        else TOKENS
    )
    reps = 3 if cpu else 10 if args.quick else 30
    out: dict = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "quick": args.quick,
        "configs": [
            [f, c.block_m, list(vars(c.up).values()), list(vars(c.down).values())] for f, c in km.MOE_CONFIGS
        ],
        "settings": {f"{mod}.{name}": repr(value) for (mod, name), value in args.set.items()},
        "layers": [],
    }
    t0 = time.perf_counter()
    shapes = CPU_SHAPES if cpu else SHAPES
    if args.shapes and not cpu:
        unknown = sorted(set(args.shapes.split(",")) - set(SHAPES))
        if unknown:
            ap.error(f"--shapes: unknown {unknown}; known: {sorted(SHAPES)}")
        shapes = {n: SHAPES[n] for n in args.shapes.split(",")}
    for name, shape in {} if args.skip_layers else shapes.items():
        out["layers"] += bench_layer(name, shape, tokens, dev, reps)
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the shape's weights, before the next one's
    if not args.skip_e2e:
        steps = 8 if cpu else 24 if args.quick else 64
        out["end_to_end"] = bench_end_to_end(dev, (1, 8), steps=steps, family=args.e2e_model)
    out["seconds"] = time.perf_counter() - t0
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
