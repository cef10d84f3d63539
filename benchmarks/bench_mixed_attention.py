"""A mixed step's attention, one layer: decode rows beside prompt chunks, serial or on two streams.

    PYTHONPATH=. python3 benchmarks/bench_mixed_attention.py --out build/mixed_attention.json

In 8B serving's mixed steps (2048/128: ~62 decode rows at ~2,100 keys beside ~1,024 prompt tokens) a
layer's attention is two kernels: the split-KV decode kernel (bandwidth-bound, ~150 µs) and the chunk
kernel (compute-bound; the persistent Hopper kernel holds a whole SM per program). On two streams they
overlap only where the GPU places both kernels' programs at once. This times, per layer, through
``TritonPagedAttention`` as served (Hq 32 / Hkv 8 / D 128, BF16, 16-token pages at random places):
the decode rows alone, the chunks alone (Hopper and varlen kernels), both serial, and both on two
streams as served; "alone" against "two streams" is what overlap could still win. (Session 28 also
timed the chunk launch issued first, and the Hopper grid capped at 48-100 programs to leave SMs to the
decode kernel, at commit bac65b7: neither helped, see BENCHMARKS.md.) Each figure is the median over
rounds of 32 back-to-back layers queued behind a sleep kernel (so the host's launches never starve the
GPU), the variants interleaved round by round. Check: every variant's output equals the serial one's
(max |diff| < 0.02).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks._rows import finish

HQ, HKV, D, PAGE = 32, 8, 128, 16
LAYERS = 32


def _ragged(n: int, lo: int, hi: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(lo, hi + 1, size=n).tolist() if n else []


# name: (decode rows' context lengths, prompt chunks as (query tokens, keys incl. the chunk))
LAYOUTS = {
    "2048/128 tail: 62 decode rows @ 2,049-2,176 + 1,024 after 1,024": (
        _ragged(62, 2049, 2176, 1),
        [(1024, 2048)],
    ),
    "2048/128 head: 62 @ 2,049-2,176 + 1,024 fresh": (_ragged(62, 2049, 2176, 2), [(1024, 1024)]),
    "2048/128 two prompts: 62 @ 2,049-2,176 + 500 after 1,548 + 524 fresh": (
        _ragged(62, 2049, 2176, 3),
        [(500, 2048), (524, 524)],
    ),
    "burst-like: 150 @ 65-2,300 + 300 fresh + 700 after 900": (
        _ragged(150, 65, 2300, 4),
        [(300, 300), (700, 1600)],
    ),
}


def _metadata(ctx_lens: list[int], q_lens: list[int], gen: torch.Generator):
    """Paged metadata of sequences (decode rows first, as the scheduler orders them) over a pool just
    large enough, blocks placed by a random permutation; the number of blocks."""
    from tests.llm.paged_metadata import mixed_metadata

    nblocks = sum(-(-c // PAGE) for c in ctx_lens) + 1
    return mixed_metadata("cuda", gen, PAGE, nblocks, ctx_lens, q_lens)[0], nblocks


def _round(attn, q, kp, vp, meta, out) -> float:
    """µs per layer over LAYERS back-to-back layers queued behind a sleep kernel."""
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)  # ~20 ms: the host queues every layer before the GPU starts them
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(LAYERS):
        attn(q, kp, vp, meta, D**-0.5, out=out)
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / LAYERS


def main() -> int:
    from trtforge.kernels.flash_attention_hopper import _sm_count
    from trtforge.llm.executors.triton_attention import TritonPagedAttention

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_mixed_attention.py: needs a CUDA GPU (sm_90 for the Hopper chunk kernel)")
    variants = {
        "serial": {"concurrent": False},
        "two streams (served)": {},
        "serial, varlen chunks": {"concurrent": False, "hopper_chunks": False},
        "two streams, varlen chunks": {"hopper_chunks": False},
    }
    rows, failures = [], []
    for name, (dec_ctx, chunks) in LAYOUTS.items():
        gen = torch.Generator().manual_seed(len(name))
        ctx = dec_ctx + [c for _, c in chunks]
        qlens = [1] * len(dec_ctx) + [ql for ql, _ in chunks]
        meta, nblocks = _metadata(ctx, qlens, gen)
        kp = torch.randn(nblocks, PAGE, HKV, D, generator=gen).bfloat16().cuda()
        vp = torch.randn(nblocks, PAGE, HKV, D, generator=gen).bfloat16().cuda()
        t = sum(qlens)
        q = torch.randn(t, HQ, D, generator=gen).bfloat16().cuda()
        # the two halves alone: the same rows, as their own steps
        nd = len(dec_ctx)
        dmeta, _ = _metadata(dec_ctx, [1] * nd, torch.Generator().manual_seed(5)) if nd else (None, 0)
        chunk_ctx, chunk_q = [c for _, c in chunks], [ql for ql, _ in chunks]
        cmeta, _ = _metadata(chunk_ctx, chunk_q, torch.Generator().manual_seed(6))
        cases = {v: (TritonPagedAttention(**kw), meta, q) for v, kw in variants.items()}
        if dmeta is not None:
            cases["decode rows alone"] = (TritonPagedAttention(), dmeta, q[:nd])
        cases["chunks alone (Hopper)"] = (TritonPagedAttention(), cmeta, q[nd:])
        cases["chunks alone (varlen)"] = (TritonPagedAttention(hopper_chunks=False), cmeta, q[nd:])
        outs = {v: torch.zeros_like(qq) for v, (_, _, qq) in cases.items()}
        for v, (attn, m, qq) in cases.items():
            for _ in range(3):  # compile, prepare
                attn(qq, kp, vp, m, D**-0.5, out=outs[v])
        torch.cuda.synchronize()
        ref = outs["serial"].float()
        samples: dict[str, list[float]] = {v: [] for v in cases}
        for _ in range(args.rounds):
            for v, (attn, m, qq) in cases.items():
                samples[v].append(_round(attn, qq, kp, vp, m, outs[v]))
        base = statistics.median(samples["serial"])
        for v, xs in samples.items():
            us = statistics.median(xs)
            row = {"layout": name, "variant": v, "us": round(us, 1), "vs_serial": round(base / us, 3)}
            if outs[v].shape == ref.shape:
                diff = float((outs[v].float() - ref).abs().max())
                row["max_diff"] = diff
                if not diff < 0.02:
                    failures.append(f"{name} / {v}: differs from serial by {diff}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    return finish(args.out, rows, failures, sms=_sm_count(0))


if __name__ == "__main__":
    sys.exit(main())
