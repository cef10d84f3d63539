"""Long prompt chunks: the varlen chunked-prefill kernel against the Hopper kernel over gathered K/V.

    PYTHONPATH=. python3 benchmarks/bench_chunk_hopper.py --out build/chunk_hopper.json

One layer of the Llama-3-8B shape (Hq 32 / Hkv 8 / D 128, BF16, 16-token pages at random places), for
the chunk sets serving's steps hold: 2048/128's mixed steps (a fresh ~1,086-token chunk, or a prompt's
tail after its first chunk, or both halves of two prompts), 1,024 after 1,000 cached keys, two fresh
2,048-token chunks. Each is timed graph-replayed (median) as serving launches it:
``prepare_chunked_prefill_varlen``'s launch, ``prepare_chunked_prefill_hopper``'s (gather + one kernel
a chunk) for each 2-warpgroup causal Hopper config, and that config's kernel alone on pre-gathered K/V
(what the gather costs). TFLOP/s counts the causal products (4 · queries · visible keys · D · Hq).
Check: every Hopper output matches the varlen kernel's (max |diff| < 0.05, BF16 outputs).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import triton

from benchmarks._rows import finish

HQ, HKV, D, PAGE = 32, 8, 128, 16
# chunk sets as (query tokens, keys incl. the chunk)
SETS = {
    "2048/128 first chunk (1,086 fresh)": [(1086, 1086)],
    "2048/128 tail (962 after 1,086)": [(962, 2048)],
    "2048/128 two prompts (500 after 1,548 + 586 fresh)": [(500, 2048), (586, 586)],
    "1,024 after 1,000": [(1024, 2024)],
    "two 2,048 fresh": [(2048, 2048), (2048, 2048)],
    "burst-like (300 fresh + 700 after 900)": [(300, 300), (700, 1600)],
}


def _us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median"))


def _flops(chunks) -> float:
    total = 0
    for ql, ctx in chunks:
        off = ctx - ql
        total += sum(off + i + 1 for i in range(ql))  # visible keys per query row
    return 4.0 * total * D * HQ


def _kernel_only(q, out, views, scale, config) -> None:
    """The Hopper kernel alone, a launch per chunk, on K/V gathered beforehand."""
    from trtforge.kernels import flash_attention_hopper as fh

    for s, ql, off, kk, vv in views:
        qc, oc = (x[s : s + ql].permute(1, 0, 2)[None] for x in (q, out))
        fh.launch(qc, kk, vv, oc, scale, True, config, q_offset=off)


def main() -> int:
    from trtforge.kernels.chunked_prefill import (
        prepare_chunked_prefill_hopper,
        prepare_chunked_prefill_varlen,
    )
    from trtforge.kernels.configs import CHUNK_HOPPER_CONFIG, hopper_configs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench_chunk_hopper.py: needs an sm_90 GPU (the Hopper kernel); its correctness is tested in "
            "tests/kernels"
        )
    configs = [c for c in hopper_configs(D, causal=True) if c.num_wg == 2]
    rows, failures = [], []
    for name, chunks in SETS.items():
        gen = torch.Generator().manual_seed(len(name))
        need = [-(-ctx // PAGE) for _, ctx in chunks]
        nblocks = sum(need) + 3
        perm = torch.randperm(nblocks, generator=gen)
        tables, used = [], 0
        for n in need:
            tables.append(perm[used : used + n])
            used += n
        width = max(need)
        table = torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables]).int().cuda()
        k_pool = torch.randn(nblocks, PAGE, HKV, D, generator=gen).bfloat16().cuda()
        v_pool = torch.randn(nblocks, PAGE, HKV, D, generator=gen).bfloat16().cuda()
        t = sum(ql for ql, _ in chunks) + 64  # 64 decode rows besides
        qkv = torch.randn(t, (HQ + 2 * HKV) * D, generator=gen).bfloat16().cuda()
        q = qkv[:, : HQ * D].view(t, HQ, D)
        starts, row = [], 64
        for ql, _ in chunks:
            starts.append(row)
            row += ql
        spans = [(s, ql, ctx) for s, (ql, ctx) in zip(starts, chunks)]
        st, lq, lens = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in zip(*spans))
        scale = D**-0.5
        ref = torch.zeros(t, HQ, D, dtype=torch.bfloat16, device="cuda")
        varlen = prepare_chunked_prefill_varlen(
            q, k_pool, v_pool, lens, table, st, lq, max(ql for ql, _ in chunks), out=ref
        )
        flops = _flops(chunks)
        us = _us(functools.partial(varlen, q, k_pool, v_pool, ref, scale))
        row0 = {"set": name, "kernel": "varlen", "us": round(us, 1), "tflops": round(flops / us / 1e6, 1)}
        rows.append(row0)
        print(json.dumps(row0), flush=True)
        pages = torch.cat(tables).int().cuda()
        for config in configs:
            out = torch.zeros_like(ref)
            launch = prepare_chunked_prefill_hopper(q, k_pool, v_pool, spans, pages, config)
            us = _us(functools.partial(launch, q, k_pool, v_pool, out, scale))
            diff = float((out.float() - ref.float()).abs().max())
            # the kernel alone, on K/V gathered once
            kc = k_pool.index_select(0, pages)
            vc = v_pool.index_select(0, pages)
            views, p0 = [], 0
            for (s, ql, ctx), n in zip(spans, need):
                kv = [x[p0 : p0 + n].view(n * PAGE, HKV, D)[:ctx].permute(1, 0, 2)[None] for x in (kc, vc)]
                views.append((s, ql, ctx - ql, *kv))
                p0 += n
            us_k = _us(functools.partial(_kernel_only, q, out, views, scale, config))
            r = {
                "set": name,
                "kernel": "hopper",
                "config": str(config),
                "serving_default": config == CHUNK_HOPPER_CONFIG,
                "us": round(us, 1),
                "tflops": round(flops / us / 1e6, 1),
                "kernel_only_us": round(us_k, 1),
                "vs_varlen": round(row0["us"] / us, 3),
                "max_diff": diff,
            }
            rows.append(r)
            print(json.dumps(r), flush=True)
            if not diff < 0.05:
                failures.append(f"{name} {config}: differs from the varlen kernel by {diff}")
    return finish(args.out, rows, failures)


if __name__ == "__main__":
    sys.exit(main())
