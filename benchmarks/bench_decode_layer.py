"""Where a small-batch decode step's GPU time goes: per-op times of the fused Llama layer, GEMV sweep, graph.

    PYTHONPATH=. python3 benchmarks/bench_decode_layer.py --out decode_layer.json [--sweep]

On the TinyLlama-1.1B-shaped model of bench_serving.py (random FP16 weights, CUDA): (1) every op of
one decode layer and the logits head, current path (cuBLAS projections + separate norm/SiLU kernels)
and GEMV path (:mod:`trtforge.kernels.gemv`), each timed as a CUDA graph running the op
over all 22 layers' weights (so weights come from HBM, not L2: the 22 layers are 1.9 GB) divided by
22, with the bytes it must read and the bandwidth that gives; (2) with ``--sweep``, the GEMV launch
configs per projection and row count, and cuBLAS against the best GEMV at 1..16 rows (the threshold);
(3) the executor's whole decode-graph replay at each ``--batches`` size, GEMV path off and on;
(4) with ``--attn-shapes BxL ...``, decode-attention split counts per shape, and with ``--pdl-compare``
the GEMV table and graphs with programmatic dependent launches off (``TRTFORGE_PDL=0``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.bench_serving import build_model
from trtforge.kernels import gemv as gemv_kernels
from trtforge.kernels.decode_attention import DecodeConfig, decode_attention
from trtforge.kernels.fused_layer import rms_norm, rope_and_cache, silu_mul
from trtforge.kernels.gemv import GemvConfig, gemv_residual, norm_gate_up_silu, norm_gemv
from trtforge.llm.executors.fused_layers import GEMV_MAX_TOKENS
from trtforge.llm.executors.torch_exec import TorchExecutor

BLOCK = 16


def replay_ms(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    """Device time of one replay of a captured `graph`: once to warm, then `reps` back to back between
    CUDA events (its kernels and the launch gaps inside it; no host work), ms a replay."""
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def graph_us(fn: Callable[[], object], per_call: int, reps: int = 15, inner: int = 5) -> float:
    """Median GPU time of one of the `per_call` ops `fn` runs, from CUDA-graph replays (events)."""
    cur = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        fn()  # compile / lazy init outside capture
    cur.wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / inner / per_call)
    del graph
    return statistics.median(times)


class Layerwise:
    """Inputs of one decode step at `m` rows over the executor's 22 layers and pools (context `ctx`)."""

    def __init__(self, ex: TorchExecutor, m: int, ctx: int) -> None:
        f = ex._fused
        self.ex, self.f, self.m, self.ctx = ex, f, m, ctx
        dev, hidden = ex.device, int(ex.model.config.hidden_size)
        g = torch.Generator(device=dev).manual_seed(m)
        self.h = torch.randn(m, hidden, device=dev, generator=g).half()
        width = -(-ctx // BLOCK)
        self.tables = torch.arange(m * width, dtype=torch.int32, device=dev).view(m, width)
        self.ctx_lens = torch.full((m,), ctx, dtype=torch.int32, device=dev)
        self.slots = (self.tables[:, -1].long() * BLOCK + (ctx - 1) % BLOCK).to(torch.int32)
        self.rope = f.rope_tables(self.h, torch.full((m,), ctx - 1, device=dev))
        lay = f.layers[0]
        self.x = rms_norm(self.h, lay.input_layernorm.weight, lay.input_layernorm.variance_epsilon)
        self.qkv = F.linear(self.x, f.qkv_w[0][0])
        self.q = rope_and_cache(self.qkv, *self.rope, self.slots, ex.k_pools[0], ex.v_pools[0],
                                f.num_heads, f.num_kv_heads)  # fmt: skip
        self.o = self.q.reshape(m, -1).contiguous()
        inter = int(f.gate_up_w[0].shape[0]) // 2
        self.gu = F.linear(self.x, f.gate_up_w[0])
        self.a = silu_mul(self.gu)
        lay0 = f.layers[0]
        self.shapes = {  # (n, k, gated) of each projection, as the kernels' default_config takes them
            "qkv": (*f.qkv_w[0][0].shape, False),
            "o": (*lay0.self_attn.o_proj.weight.shape, False),
            "gate_up": (inter, hidden, True),
            "down": (*lay0.mlp.down_proj.weight.shape, False),
        }

    def ops(self, gemv: bool, configs: dict | None = None) -> list[tuple[str, Callable[[int], object], int]]:
        """(name, fn(layer), bytes one call must read) of one layer's ops, current or GEMV path."""
        f, ex, cfg = self.f, self.ex, configs or {}
        lay = f.layers
        kv = 2 * self.m * self.ctx * f.num_kv_heads * f.head_dim * 2

        def nbytes(t: torch.Tensor) -> int:
            return t.numel() * t.element_size()

        def attention(i):
            return ex.decode_attention(self.q, ex.k_pools[i], ex.v_pools[i], self.tables, self.ctx_lens,
                                       ex._adapter.scales[i], None)  # fmt: skip

        def rope(i):
            return rope_and_cache(self.qkv, *self.rope, self.slots, ex.k_pools[i], ex.v_pools[i],
                                  f.num_heads, f.num_kv_heads)  # fmt: skip

        def norm_of(i, which):
            return getattr(lay[i], which)

        wo = lambda i: lay[i].self_attn.o_proj.weight  # noqa: E731
        wd = lambda i: lay[i].mlp.down_proj.weight  # noqa: E731
        qkv_b, gu_b = nbytes(f.qkv_w[0][0]), nbytes(f.gate_up_w[0])
        o_b, d_b = nbytes(wo(0)), nbytes(wd(0))
        if not gemv:
            ln = lambda i, w: rms_norm(self.h, norm_of(i, w).weight, norm_of(i, w).variance_epsilon)  # noqa: E731
            return [
                ("input_norm", lambda i: ln(i, "input_layernorm"), 0),
                ("qkv GEMM (cuBLAS)", lambda i: F.linear(self.x, f.qkv_w[i][0], f.qkv_w[i][1]), qkv_b),
                ("rope + KV write", rope, 0),
                ("attention", attention, kv),
                ("o_proj addmm (+res)", lambda i: torch.addmm(self.h, self.o, wo(i).t()), o_b),
                ("post_norm", lambda i: ln(i, "post_attention_layernorm"), 0),
                ("gate_up GEMM (cuBLAS)", lambda i: F.linear(self.x, f.gate_up_w[i]), gu_b),
                ("silu * up", lambda i: silu_mul(self.gu), 0),
                ("down addmm (+res)", lambda i: torch.addmm(self.h, self.a, wd(i).t()), d_b),
            ]
        n1 = lambda i: norm_of(i, "input_layernorm")  # noqa: E731
        n2 = lambda i: norm_of(i, "post_attention_layernorm")  # noqa: E731

        def qkv(i):
            return norm_gemv(self.h, n1(i).weight, n1(i).variance_epsilon, *f.qkv_w[i], config=cfg.get("qkv"))

        def gate_up(i):
            w, c = f.gate_up_w[i], cfg.get("gate_up")
            return norm_gate_up_silu(self.h, n2(i).weight, n2(i).variance_epsilon, w, config=c)

        return [
            ("norm + qkv GEMV", qkv, qkv_b),
            ("rope + KV write", rope, 0),
            ("attention", attention, kv),
            ("o_proj GEMV + res", lambda i: gemv_residual(self.o, wo(i), self.h, config=cfg.get("o")), o_b),
            ("norm + gate_up GEMV + silu*up", gate_up, gu_b),
            ("down GEMV + res", lambda i: gemv_residual(self.a, wd(i), self.h, config=cfg.get("down")), d_b),
        ]

    def head_ops(self, gemv: bool, config: GemvConfig | None = None) -> list[tuple[str, Callable, int]]:
        norm, head = self.f.inner.norm, self.f.model.lm_head
        b = head.weight.numel() * head.weight.element_size()
        if gemv:
            return [("final norm + lm_head GEMV", lambda _: norm_gemv(
                self.h, norm.weight, norm.variance_epsilon, head.weight, config=config), b)]  # fmt: skip
        return [
            ("final norm", lambda _: rms_norm(self.h, norm.weight, norm.variance_epsilon), 0),
            ("lm_head GEMM (cuBLAS)", lambda _: head(self.x), b),
        ]


def per_op_table(lw: Layerwise, gemv: bool) -> list[dict]:
    layers = len(lw.f.layers)
    rows = []
    for name, fn, nbytes in lw.ops(gemv):
        us = graph_us(lambda fn=fn: [fn(i) for i in range(layers)], layers)
        rows.append({"op": name, "us": us, "bytes": nbytes, "TBps": nbytes / us / 1e6 if nbytes else None})
    for name, fn, nbytes in lw.head_ops(gemv):
        us = graph_us(lambda fn=fn: [fn(0) for _ in range(2)], 2)
        rows.append({"op": name, "us": us, "bytes": nbytes, "TBps": nbytes / us / 1e6 if nbytes else None,
                     "per_step_only": True})  # fmt: skip
    return rows


def layer_sum(rows: list[dict], layers: int) -> dict:
    per_layer = sum(r["us"] for r in rows if not r.get("per_step_only"))
    head = sum(r["us"] for r in rows if r.get("per_step_only"))
    return {"per_layer_us": per_layer, "step_ms": (per_layer * layers + head) / 1e3}


def candidates(m: int, shape: tuple[int, int, bool]) -> list[GemvConfig]:
    """Launch configs to sweep at `m` rows for an ``(n, k, gated)`` projection: the default first, then
    FP32-FMA tiles of <= ~32 partials a thread and tensor-core tiles, shuffled."""
    bm = 1 << (m - 1).bit_length()
    if m == 1:
        grid = itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048), (4, 8), (1,))
    else:
        grid = itertools.product((4, 8, 16), (128, 256, 512, 1024), (4, 8), (1,))
    fma = [GemvConfig(bn, bk, w, st) for bn, bk, w, st in grid if bm * bn * bk <= 4096 * w]
    dot = [GemvConfig(bn, bk, 4, st, True) for bn, bk, st in itertools.product((16, 32), (128, 256), (3, 4))]
    first = gemv_kernels.default_config(m, *shape, torch.cuda.get_device_properties(0).multi_processor_count)
    rest = [c for c in fma + dot if c != first]
    random.Random(0).shuffle(rest)
    return [first, *rest]


def sweep(ex: TorchExecutor, ctx: int, ms: list[int], seconds: float) -> dict:
    """Best GEMV config per projection and row count (and every config's time), within `seconds`."""
    res: dict = {}
    deadline = time.monotonic() + seconds
    layers = len(ex._fused.layers)
    kinds = (("qkv", 0), ("o", 3), ("gate_up", 4), ("down", 5))
    weights = [2 if j == 0 else 1 for j, _ in enumerate(ms) for _ in kinds]  # the first row count: 2x time
    for m in ms:
        lw = Layerwise(ex, m, ctx)
        for kind, idx in kinds:
            w = weights.pop(0)
            until = time.monotonic() + (deadline - time.monotonic()) * w / (w + sum(weights))
            times = []
            for cfg in candidates(m, lw.shapes[kind]):
                if time.monotonic() > until:
                    break
                _, fn, nbytes = lw.ops(True, {kind: cfg})[idx]
                try:
                    us = graph_us(lambda fn=fn: [fn(i) for i in range(layers)], layers, reps=7, inner=3)
                except Exception as e:  # a config the compiler refuses (registers, shared memory)
                    print(f"  {kind} m={m} {cfg}: {type(e).__name__}")
                    continue
                times.append((us, cfg))
            if not times:
                continue
            times.sort(key=lambda t: t[0])
            best_us, best = times[0]
            res[f"{kind}/m{m}"] = {
                "best": best.__dict__,
                "us": best_us,
                "TBps": nbytes / best_us / 1e6,
                "all": [(round(t, 2), c.__dict__) for t, c in times],
            }
            print(f"sweep {kind:8s} m={m}: best {best_us:7.2f} us ({nbytes / best_us / 1e6:.2f} TB/s) {best}")
    return res


def threshold(ex: TorchExecutor, ctx: int, ms: list[int], best: dict) -> list[dict]:
    """Per row count: one layer's projections (with their folded ops) on cuBLAS vs the GEMV path (the
    sweep's best configs where it ran at that row count, else the defaults)."""
    layers = len(ex._fused.layers)
    rows = []
    for m in ms:
        lw = Layerwise(ex, m, ctx)
        cfgs = {k: GemvConfig(**best[f"{k}/m{m}"]["best"]) for k in ("qkv", "o", "gate_up", "down")
                if f"{k}/m{m}" in best}  # fmt: skip
        tot = {}
        for gemv in (False, True):
            tot[gemv] = sum(
                graph_us(lambda fn=fn: [fn(i) for i in range(layers)], layers, reps=7, inner=3)
                for name, fn, _ in lw.ops(gemv, cfgs)
                if name not in ("rope + KV write", "attention")
            )
        rows.append({"m": m, "cublas_us": tot[False], "gemv_us": tot[True]})
        print(
            f"threshold m={m:3d}: cuBLAS path {tot[False]:7.2f} us/layer, GEMV path {tot[True]:7.2f} us/layer"
        )
    return rows


def e2e(
    ex: TorchExecutor, ctx: int, batches: list[int], gemv_rows: int, modes=(False, True), reps: int = 50
) -> dict:
    """Decode-graph replay time (ms/step) per batch size, GEMV path off and on; their logits' difference."""
    res: dict = {}
    default = ex._fused.gemv_max_tokens
    ex._static_buffers()  # the inputs buffer the graphs read
    wb = next(w for w in ex._width_buckets if w * BLOCK >= ctx)
    logits = {}
    for on in modes:
        ex._fused.gemv_max_tokens = gemv_rows if on else 0
        ex._graphs.clear()
        ex._graph_pool = None  # a fresh pool: capturing into the cleared graphs' pool asserted in torch 2.11
        for b in batches:
            graph = ex._capture(b, wb)
            ids, pos, slots, lens, _, tables = ex._static_views(b, wb)
            width = -(-ctx // BLOCK)
            ids.copy_(torch.arange(b, device=ex.device) * 7 + 3)
            pos.fill_(ctx - 1)
            tables.copy_(torch.arange(b * wb, dtype=torch.int32, device=ex.device).view(b, wb))
            slots.copy_(tables[:, width - 1] * BLOCK + (ctx - 1) % BLOCK)
            lens.fill_(ctx)
            ms = replay_ms(graph, reps)
            logits[(on, b)] = ex._static["logits"][:b].clone()
            res[f"{'gemv' if on else 'cublas'}/b{b}"] = ms
            print(f"decode graph b={b:3d} gemv={'on ' if on else 'off'}: {ms:.4f} ms/step")
    ex._fused.gemv_max_tokens = default
    for b in batches if len(modes) == 2 else ():
        ref, got = logits[(False, b)].double(), logits[(True, b)].double()
        res[f"logits_rel_diff/b{b}"] = float((got - ref).abs().max() / ref.abs().max())
    return res


def attention_candidates() -> list[tuple[str, DecodeConfig, bool]]:
    """(name, config, PDL) of the decode-attention launches to compare: the split-KV default (heuristic
    split count; graph capture reduces in a second kernel), fixed split counts, and un-split launches."""
    out = [
        ("split-heuristic", DecodeConfig(64, 4, 3), True),
        ("split-heuristic-nopdl", DecodeConfig(64, 4, 3), False),
    ]
    out += [(f"split{n}", DecodeConfig(64, 4, 3, n), True) for n in (4, 8, 16, 32)]
    out.append(("direct-n128-w4-s2", DecodeConfig(128, 4, 2, 1), True))
    return out


def attention_sweep(ex: TorchExecutor, shapes: list[tuple[int, int]]) -> dict:
    """Decode attention per layer (us, CUDA graph over the 22 layers' pools) for each candidate launch at
    each (batch, context) shape; the block table is exactly as wide as the context."""
    layers = len(ex._fused.layers)
    res: dict = {}
    for b, ctx in shapes:
        lw = Layerwise(ex, b, ctx)
        q = lw.q.unsqueeze(2)
        row = {}
        rule = ex.decode_attention.config_for(
            b,
            ex._fused.num_kv_heads,
            ex._fused.head_dim,
            ctx,
            torch.cuda.get_device_properties(0).multi_processor_count,
        )
        for name, cfg, pdl in [(f"default-rule-{rule.num_splits}", rule, True), *attention_candidates()]:

            def fn(i, cfg=cfg, pdl=pdl, q=q, lens=lw.ctx_lens, tables=lw.tables):
                return decode_attention(q, ex.k_pools[i], ex.v_pools[i], lens, tables,
                                        scale=ex._adapter.scales[i], config=cfg, pdl=pdl)  # fmt: skip

            try:
                row[name] = graph_us(lambda fn=fn: [fn(i) for i in range(layers)], layers, reps=7, inner=3)
            except Exception as e:  # a config the compiler refuses (registers, shared memory)
                print(f"  attention b={b} ctx={ctx} {name}: {type(e).__name__}: {e}")
        best = min(row, key=row.get)
        res[f"b{b}/ctx{ctx}"] = {"best": best, "us": row}
        top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.items(), key=lambda kv: kv[1])[:6])
        print(f"attention b={b:3d} ctx={ctx:5d}: best {best} {row[best]:.2f} us; {top}")
    return res


def set_pdl(on: bool) -> None:
    """Turn programmatic dependent launches on or off for the launches that follow (TRTFORGE_PDL)."""
    import os

    os.environ["TRTFORGE_PDL"] = "1" if on else "0"
    gemv_kernels.pdl_supported.cache_clear()


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}\n| op | us | MB read | TB/s |\n| --- | --- | --- | --- |")
    for r in rows:
        tb = f"{r['TBps']:.2f}" if r["TBps"] else ""
        print(f"| {r['op']} | {r['us']:.2f} | {r['bytes'] / 1e6:.1f} | {tb} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--context", type=int, default=512, help="tokens in each sequence's KV cache")
    ap.add_argument("--table-batches", type=int, nargs="+", default=[1])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 64], help="decode-graph batch sizes")
    ap.add_argument("--gemv-max-tokens", type=int, default=8, help="GEMV path up to this batch when on")
    ap.add_argument("--sweep", action="store_true", help="sweep the GEMV launch configs")
    ap.add_argument("--sweep-rows", type=int, nargs="+", default=[1, 8, 4])
    ap.add_argument("--sweep-seconds", type=float, default=150.0, help="stop sweeping after this long")
    ap.add_argument("--threshold-rows", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    ap.add_argument("--skip-cublas", action="store_true", help="no cuBLAS per-op table")
    ap.add_argument(
        "--pdl-compare", action="store_true", help="GEMV per-op table and graphs with PDL off too"
    )
    ap.add_argument(
        "--attn-shapes", type=str, nargs="*", default=[], help="attention sweep shapes as BATCHxCONTEXT"
    )
    args = ap.parse_args()

    model = build_model(False, "cuda", torch.float16)
    blocks = max(max(args.batches), max(args.table_batches)) * (-(-args.context // BLOCK) + 16)
    ex = TorchExecutor(model, num_blocks=blocks, block_size=BLOCK, kernels="triton",
                       max_decode_batch=max(args.batches))  # fmt: skip
    assert ex._fused is not None, ex.fused_refusal
    layers = len(ex._fused.layers)
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "model": "TinyLlama-1.1B shape, random FP16",
        "context": args.context,
        "gemv_max_tokens": args.gemv_max_tokens,
        "default_gemv_max_tokens": GEMV_MAX_TOKENS,
        "per_op": {},
    }
    with torch.inference_mode():
        if args.attn_shapes:
            shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.attn_shapes]
            res["attention_sweep"] = attention_sweep(ex, shapes)
            save(res, args.out)
        if args.pdl_compare:
            set_pdl(False)
            for m in args.table_batches:
                rows = per_op_table(Layerwise(ex, m, args.context), True)
                res["per_op"][f"gemv_nopdl/m{m}"] = {"rows": rows, **layer_sum(rows, layers)}
                print_table(f"gemv_nopdl/m{m}: per op, PDL off", rows)
                print("sum:", layer_sum(rows, layers))
            res["decode_graph_ms_nopdl"] = e2e(
                ex, args.context, args.batches, args.gemv_max_tokens, modes=(True,)
            )
            set_pdl(True)
            save(res, args.out)
        for m in args.table_batches:
            lw = Layerwise(ex, m, args.context)
            for gemv in (False, True) if not args.skip_cublas else (True,):  # --skip-cublas: the table only
                rows = per_op_table(lw, gemv)
                key = f"{'gemv' if gemv else 'cublas'}/m{m}"
                res["per_op"][key] = {"rows": rows, **layer_sum(rows, layers)}
                print_table(f"{key}: per op (us, CUDA-graph replay over {layers} layers)", rows)
                print("sum:", layer_sum(rows, layers))
        res["decode_graph_ms"] = e2e(ex, args.context, args.batches, args.gemv_max_tokens)
        save(res, args.out)
        if args.sweep:
            res["sweep"] = sweep(ex, args.context, args.sweep_rows, args.sweep_seconds)
            save(res, args.out)
            tuned = use_tuned(ex, res["sweep"])
            res["tuned_configs"] = tuned
            print("tuned:", json.dumps(tuned))
            for m in args.table_batches:
                rows = per_op_table(Layerwise(ex, m, args.context), True)
                res["per_op"][f"gemv_tuned/m{m}"] = {"rows": rows, **layer_sum(rows, layers)}
                print_table(f"gemv_tuned/m{m}: per op", rows)
                print("sum:", layer_sum(rows, layers))
            rows_on = args.gemv_max_tokens
            res["decode_graph_ms_tuned"] = e2e(ex, args.context, args.batches, rows_on, modes=(True,))
            save(res, args.out)
            if args.threshold_rows:
                res["threshold"] = threshold(ex, args.context, args.threshold_rows, res["sweep"])
    save(res, args.out)


def use_tuned(ex: TorchExecutor, best: dict) -> dict:
    """Make the sweep's best config per projection and row count the kernels' default (the row count
    maps to the smallest swept one >= it); return them as ``{kind: {rows: config dict}}``."""
    f = ex._fused
    lay = f.layers[0]
    kinds = {
        (tuple(f.qkv_w[0][0].shape), False): "qkv",
        (tuple(lay.self_attn.o_proj.weight.shape), False): "o",
        ((f.gate_up_w[0].shape[0] // 2, f.gate_up_w[0].shape[1]), True): "gate_up",
        (tuple(lay.mlp.down_proj.weight.shape), False): "down",
    }
    table: dict = {}
    for key, val in best.items():
        kind, m = key.split("/m")
        table.setdefault(kind, {})[int(m)] = val["best"]
    fallback = gemv_kernels.default_config

    def tuned(m: int, n: int, k: int, gated: bool, num_sms: int = 132) -> GemvConfig:
        per_m = table.get(kinds.get(((n, k), gated), "qkv"))
        if not per_m:
            return fallback(m, n, k, gated, num_sms)
        ms = sorted(per_m)
        return GemvConfig(**per_m[next((x for x in ms if x >= m), ms[-1])])

    gemv_kernels.default_config = tuned
    return table


def save(res: dict, path: str) -> None:
    """Write the results so far (temp file, then rename: a stopped run leaves the last whole file)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.rename(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
