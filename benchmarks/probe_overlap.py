"""Probe: how much of a layer's decode attention hides behind other rows' GEMMs on a second stream (H200).

    PYTHONPATH=. python3 benchmarks/probe_overlap.py --out build/overlap.json

Why: a decode step's attention reads every row's K/V (memory-bound) and its projections are compute-bound
at hundreds of rows; served steps run them in turn. At 8B FP8 2048/2048, decode steps ran at 67% of their
roofline and mixed steps at 44% (session 35). Running one set of rows' attention on a side stream beside
another set's GEMMs (a decode step split in halves, or a mixed step's decode rows beside its prompt rows)
can only pay as far as the two share the GPU well. Session 36 measured both here and end to end, and
removed both executor paths: the mixed pairing hid 0-1%, and the decode halves, though a layer hid 20-22%
of its attention here, made whole served decode steps 8-21% slower (profile_mixed_step.py --ab).
This measures that on one layer of the Llama-3-8B shape (Hq 32, Hkv 8, D 128, hidden 4,096,
MLP 14,336), graph-replayed, medians:

- ``attention``: the serving decode launch (``TritonDecodeAttention``) of B rows over L keys each, over
  FP8 pools (``--kv fp8``, the served FP8 setting) or BF16 ones, pages of 16;
- ``gemms``: M rows through the layer's four products (qkv, o, gate_up, down), FP8 rowwise-scaled
  ``torch._scaled_mm`` with fast accumulation (as served) or BF16 ``torch.mm``;
- ``serial``: both in one stream (what a served step does); ``overlapped``: attention on a side stream
  beside the GEMMs, forked and joined with events inside the graph.

``hidden`` is (serial - overlapped) / min(attention, gemms): 1 = the shorter one disappears entirely.
Check: the overlapped run's outputs match the serial run's (the same kernels on the same inputs; max
|diff| <= 1e-2 of outputs of order 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks._rows import finish

HQ, HKV, D, HIDDEN, MLP = 32, 8, 128, 4096, 14336
# (name, decode rows B, keys L, GEMM rows M): the shapes served steps would pair
CASES = [
    ("2048/2048 mixed: decode rows beside prompt rows", 377, 3072, 1063),
    ("2048/2048 decode, halves", 211, 3072, 211),
    ("1000/1000 decode, halves", 244, 1504, 244),  # keys in whole pages of 16
    ("128/128 decode, halves", 246, 192, 246),
]


def _attention(b: int, length: int, kv: str, gen: torch.Generator, dev_gen: torch.Generator):
    """The serving decode launch over random K/V of `b` rows x `length` keys (pages of 16, placed by
    `gen`; values drawn on the device by `dev_gen`), into `out`."""
    from benchmarks.bench_decode_attention import _pool
    from trtforge.kernels.kv_quant import FP8_MAX, quantize_fp8
    from trtforge.llm.executors.triton_attention import TritonDecodeAttention

    k = torch.randn(b, HKV, length, D, generator=dev_gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, HKV, length, D, generator=dev_gen, device="cuda", dtype=torch.bfloat16)
    kp, vp, table = _pool(k, v, 16, gen)
    del k, v
    scales = {}
    if kv == "fp8":
        ks, vs = float(kp.abs().amax()) / FP8_MAX, float(vp.abs().amax()) / FP8_MAX
        kp, vp, scales = quantize_fp8(kp, ks), quantize_fp8(vp, vs), {"k_scale": ks, "v_scale": vs}
    q = torch.randn(b, HQ, D, generator=dev_gen, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    attn = TritonDecodeAttention()

    def run() -> None:
        attn(q, kp, vp, table, lens, D**-0.5, out=out, **scales)

    return run, out, (kp, vp, table, q, lens)


def _gemms(m: int, fp8: bool, gen: torch.Generator):
    """One layer's four products of `m` rows (outputs kept), FP8 rowwise-scaled or BF16."""
    shapes = [(HIDDEN, (HQ + 2 * HKV) * D), (HQ * D, HIDDEN), (HIDDEN, 2 * MLP), (MLP, HIDDEN)]  # (K, N)
    outs, steps, keep = [], [], []
    rows = -(-m // 16) * 16 if fp8 else m  # cuBLASLt's FP8 GEMMs take rows in 16s (served: padded too)
    for k, n in shapes:
        x = torch.randn(rows, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) / k**0.5
        o = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
        if fp8:
            xq, wq = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            sx = torch.ones(rows, 1, dtype=torch.float32, device="cuda")
            sw = torch.ones(1, n, dtype=torch.float32, device="cuda")
            keep += [xq, wq, sx, sw]

            def step(xq=xq, wq=wq, sx=sx, sw=sw, o=o) -> None:
                o.copy_(torch._scaled_mm(xq, wq.t(), sx, sw, out_dtype=torch.bfloat16, use_fast_accum=True))

        else:
            keep += [x, w]

            def step(x=x, w=w, o=o) -> None:
                torch.mm(x, w.t(), out=o)

        steps.append(step)
        outs.append(o)

    def run() -> None:
        for s in steps:
            s()

    return run, outs, keep


def measure(idx: int, name: str, b: int, length: int, m: int, kv: str, side: torch.cuda.Stream) -> dict:
    """One case: the four timings, the share of the shorter part hidden, and the outputs' agreement."""
    from benchmarks.bench_decode_attention import _graph_us

    gen, dev_gen = torch.Generator().manual_seed(idx), torch.Generator("cuda").manual_seed(idx)
    attn, attn_out, _held = _attention(b, length, kv, gen, dev_gen)
    gemm, gemm_outs, _kept = _gemms(m, kv == "fp8", dev_gen)

    def serial() -> None:
        attn()
        gemm()

    def overlapped() -> None:
        main_stream = torch.cuda.current_stream()
        side.wait_stream(main_stream)
        with torch.cuda.stream(side):
            attn()
        gemm()
        main_stream.wait_stream(side)

    serial()
    torch.cuda.synchronize()
    want = [attn_out.clone(), *(o.clone() for o in gemm_outs)]
    overlapped()
    torch.cuda.synchronize()
    diff = max(float((a.float() - w.float()).abs().max()) for a, w in zip([attn_out, *gemm_outs], want))
    t = {label: _graph_us(fn) for label, fn in (("attention", attn), ("gemms", gemm))}
    t |= {label: _graph_us(fn) for label, fn in (("serial", serial), ("overlapped", overlapped))}
    row = {"case": name, "B": b, "L": length, "M": m, "kv": kv}
    row |= {f"{k}_us": round(v, 1) for k, v in t.items()}
    row["hidden"] = round((t["serial"] - t["overlapped"]) / min(t["attention"], t["gemms"]), 3)
    row["overlapped_over_serial"] = round(t["overlapped"] / t["serial"], 3)
    row["max_diff"] = diff
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    ap.add_argument("--kv", nargs="+", choices=("fp8", "bf16"), default=["fp8", "bf16"], help="pool dtypes")
    ap.add_argument("--cases", type=int, nargs="+", default=None, help="indices into CASES (default all)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_overlap.py: needs a CUDA GPU with FP8 (sm_89+)")
    side = torch.cuda.Stream()
    rows, failures = [], []
    for idx, (name, b, length, m) in enumerate(CASES):
        if args.cases is not None and idx not in args.cases:
            continue
        for kv in args.kv:
            row = measure(idx, name, b, length, m, kv, side)
            torch.cuda.empty_cache()
            rows.append(row)
            print(
                f"{name:48s} {kv:4s}  attention {row['attention_us']:7.1f} us  gemms {row['gemms_us']:7.1f}"
                f"  serial {row['serial_us']:7.1f}  overlapped {row['overlapped_us']:7.1f} "
                f"({row['overlapped_over_serial']:.3f}x; {row['hidden']:.0%} of the shorter hidden)",
                flush=True,
            )
            # the same kernels on the same inputs: equal, unless a library is nondeterministic
            if row["max_diff"] > 1e-2:
                failures.append(
                    f"{name} {kv}: the overlapped outputs differ from the serial ones by {row['max_diff']}"
                )
    return finish(args.out, rows, failures)


if __name__ == "__main__":
    sys.exit(main())
