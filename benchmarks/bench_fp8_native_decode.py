"""FP8-native decode attention (E4M3 Q and P on FP8 wgmma) against the serving FP8 decode launch.

    PYTHONPATH=. python3 benchmarks/bench_fp8_native_decode.py --out build/fp8_native_decode.json

Over E4M3 pools of the Llama-3-8B shape (Hq 32 / Hkv 8 / D 128, 16-token pages at random places, every
sequence at full length), per served shape B x keys: the serving launch (``TritonDecodeAttention``,
widening K/V to FP16) and :func:`~trtforge.kernels.fp8_native_decode.fp8_native_paged_decode` at each
``--configs BLOCK_N,WARPS`` (its split heuristic), with V as served and stored keys-major ([N, Hkv, D,
page]: K-major for the FP8 wgmma, so no byte-wide transpose; serving does not allocate that layout),
graph-replayed medians, the K/V bytes over the time in TB/s (H200: 4.8 peak; BF16 pools read ~4.3 with
the serving kernel). Check: every output within 0.1 of the serving one (both against the same FP8
values; the native kernel also rounds Q and P to E4M3).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch

from benchmarks.bench_decode_attention import _graph_us, _pool
from trtforge._fileio import atomic_write_text

HQ, HKV, D, PAGE = 32, 8, 128, 16
POINTS = [(241, 256), (256, 1024), (256, 2048), (64, 8192), (751, 1152)]  # (751 x 1,152: 128/2048 FP8)


def main() -> int:
    from trtforge.kernels.fp8_native_decode import fp8_native_paged_decode
    from trtforge.kernels.kv_quant import FP8_MAX, quantize_fp8
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    ap.add_argument("--configs", nargs="+", default=["128,4", "64,4", "128,8"], help="BLOCK_N,WARPS")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench_fp8_native_decode.py: needs a CUDA GPU with FP8 (sm_89+; FP8 wgmma on sm_90); the "
            "kernel is tested in the interpreter in tests/kernels"
        )
    serving = TritonDecodeAttention()
    rows, failures = [], []
    for b, length in POINTS:
        gen = torch.Generator().manual_seed(b + length)
        k = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, HKV, length, D, dtype=torch.bfloat16, device="cuda")
        q = torch.randn(b, HQ, D, generator=gen).bfloat16().cuda()
        lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        k16, v16, table = _pool(k, v, PAGE, gen)
        del k, v
        ks, vs = float(k16.abs().amax()) / FP8_MAX, float(v16.abs().amax()) / FP8_MAX
        kp, vp = quantize_fp8(k16, ks), quantize_fp8(v16, vs)
        del k16, v16
        gb = 2 * b * HKV * length * D / 1e9
        out = torch.empty_like(q)
        fn = functools.partial(serving, q, kp, vp, table, lens, D**-0.5, out=out, k_scale=ks, v_scale=vs)
        ref = fn().float().clone()
        us = _graph_us(fn)
        row = {"B": b, "L": length, "kernel": "serving", "us": round(us, 1)}
        row["tb_per_s"] = round(gb / us * 1e3, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        layouts = {"served": vp, "v-keys-major": vp.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)}
        for config, (layout, v_pool) in itertools.product(args.configs, layouts.items()):
            bn, warps = (int(x) for x in config.split(","))
            nat = torch.empty_like(q)
            fn = functools.partial(
                fp8_native_paged_decode, q, kp, v_pool, lens, table, D**-0.5,
                k_scale=ks, v_scale=vs, out=nat, block_n=bn, num_warps=warps,
            )  # fmt: skip
            diff = float((fn().float() - ref).abs().max())
            us_n = _graph_us(fn)
            r = {"B": b, "L": length, "kernel": f"native {bn}x{warps} {layout}", "us": round(us_n, 1)}
            r |= {"tb_per_s": round(gb / us_n * 1e3, 3), "vs_serving": round(us / us_n, 3), "max_diff": diff}
            rows.append(r)
            print(json.dumps(r), flush=True)
            if not diff < 0.1:
                failures.append(f"B={b} L={length} {r['kernel']}: {diff} from the serving launch")
        del kp, vp, layouts, v_pool
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "rows": rows, "failures": failures}
    atomic_write_text(args.out, json.dumps(result))
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
