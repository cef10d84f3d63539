"""Probe: does the paged pool's physical layout bind decode attention's bandwidth over FP8 pools?

    PYTHONPATH=. python3 benchmarks/probe_pool_layout.py --out build/pool_layout.json [--layouts ...]

The serving pools are [num_blocks, block_size, Hkv, D]: within a block, one kv head's key rows are
Hkv·D elements apart, so over FP8 a program gathers 128-byte rows (256 over BF16). This times the
serving path's fixed decode launch (``TritonDecodeAttention``, graph-replayed, median) over the same
K/V in other physical layouts of the same logical pool (permuted views, so the kernel only sees other
strides), at 16- and 64-token blocks, for FP8 and BF16 pools, Hq 32 / Hkv 8 / D 128, q_len 1, every
sequence at full length:
- ``slot_major``: the serving layout;
- ``heads_major``: K and V stored [num_blocks, Hkv, block_size, D] (one head's block contiguous);
- ``v_keys_major``: V stored [num_blocks, Hkv, D, block_size] (a block's keys contiguous per channel).
  P.V reads V with the keys as its reduction axis; over FP8 the slot-major tile reaches the MMA one
  byte a shared load (``ldmatrix`` cannot transpose 8-bit elements), keys-major through ``ldmatrix``
  (sm_90 compile: 256 ``ld.shared.b8`` in the tile loops -> 0, shared memory unchanged). Measured
  5-9% slower than slot-major over FP8 (H200, session 27), so serving never stored pools this way.
FP8 pools also run each layout with 4 warps forced (``--fp8-four-warps``; the default launch takes 2
at these batches, and 2 warps spill over a keys-major V). Check: every layout's output matches the
slot-major one's (max |diff| < 1e-3; the same values reach the same MMAs).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
from pathlib import Path

import torch

from benchmarks._rows import finish
from benchmarks.bench_decode_attention import _graph_us, _pool
from trtforge.kernels.kv_quant import FP8_MAX, quantize_fp8

HQ, HKV, D = 32, 8, 128
POINTS = [(241, 256), (256, 1024), (256, 2048), (64, 8192)]


def heads_major_storage(pool: torch.Tensor) -> torch.Tensor:
    """The same logical [num_blocks, block_size, Hkv, D] pool, stored [num_blocks, Hkv, block_size, D]."""
    return pool.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def keys_major_storage(pool: torch.Tensor) -> torch.Tensor:
    """The same logical [num_blocks, block_size, Hkv, D] pool, stored [num_blocks, Hkv, D, block_size]."""
    return pool.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


LAYOUTS = {
    "slot_major": lambda k, v: (k, v),
    "heads_major": lambda k, v: (heads_major_storage(k), heads_major_storage(v)),
    "v_keys_major": lambda k, v: (k, keys_major_storage(v)),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    ap.add_argument("--pages", type=int, nargs="+", default=[16, 64], help="block sizes")
    ap.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS), help="layouts")
    ap.add_argument(
        "--fp8-four-warps", choices=("on", "off"), default="on", help="FP8 pools: also time 4 warps forced"
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_pool_layout.py: needs a CUDA GPU with FP8 (sm_89+)")
    from trtforge.kernels.decode_attention import FP8_KV_DECODE_CONFIG
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    launches = {
        "default": TritonDecodeAttention(),
        "4warps": TritonDecodeAttention(config=FP8_KV_DECODE_CONFIG),
    }
    rows, failures = [], []
    for b, length in POINTS:
        for page in args.pages:
            gen = torch.Generator().manual_seed(b + length + page)
            k = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
            q = torch.randn(b, HQ, D, generator=gen).bfloat16().cuda()
            lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
            out = torch.empty_like(q)
            k16, v16, table = _pool(k, v, page, gen)
            del k, v
            ks, vs = float(k16.abs().amax()) / FP8_MAX, float(v16.abs().amax()) / FP8_MAX
            for kv in ("bf16", "fp8"):
                kp, vp, scales, elem = k16, v16, {}, 2
                if kv == "fp8":
                    kp, vp, scales, elem = (
                        quantize_fp8(k16, ks),
                        quantize_fp8(v16, vs),
                        {"k_scale": ks, "v_scale": vs},
                        1,
                    )
                ref = None
                for layout in ["slot_major"] + [x for x in args.layouts if x != "slot_major"]:
                    lk, lv = LAYOUTS[layout](kp, vp)
                    names = (
                        ["default", "4warps"] if kv == "fp8" and args.fp8_four_warps == "on" else ["default"]
                    )
                    for launch in names:
                        attn = launches[launch]
                        fn = functools.partial(attn, q, lk, lv, table, lens, D**-0.5, out=out, **scales)
                        got = fn().float().clone()
                        ref = got if ref is None else ref
                        us = _graph_us(fn)
                        diff = float((got - ref).abs().max())
                        row = {
                            "B": b,
                            "L": length,
                            "page": page,
                            "kv": kv,
                            "layout": layout,
                            "launch": launch,
                        }
                        row |= {
                            "us": round(us, 1),
                            "tb_per_s": round(2 * b * HKV * length * D * elem / us / 1e6, 3),
                            "max_diff": diff,
                        }
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        if diff >= 1e-3:
                            failures.append(
                                f"{kv} B={b} L={length} page={page} {layout} {launch}: differs by {diff}"
                            )
                    del lk, lv
                del kp, vp
            del k16, v16
            gc.collect()
            torch.cuda.empty_cache()
    return finish(args.out, rows, failures)


if __name__ == "__main__":
    sys.exit(main())
