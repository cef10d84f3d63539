"""Probe: where the contiguous decode kernel's time goes, against cuDNN SDPA in the same rounds.

    PYTHONPATH=. python3 benchmarks/probe_decode_bandwidth.py --out build/probe [--rounds 3]

Each part answers one question; timings are CUDA-graph replay medians taken in interleaved rounds (every
implementation of a case once per round, cuDNN among them; the figure is the median over rounds):
- configs: fixed TMA launch configs (keys per tile, warps, pipeline depth) at
  the six acceptance shapes of issue #18 (FP16, Hq=32, Hkv=8, D=128, q_len 1), with the split
  count the autotuner chose last (results/decode_attention.md);
- pairs: at L = 4096 (Hq=16, Hkv=4), B·Hkv from 120 to 264 programs, one split each: is the time
  set by HBM (it grows with the bytes) or by each SM's own rate (flat up to 132 programs)?
- ramp: B=16, Hkv=8, L from 256 to 16384, one split: time = fixed cost + bytes / rate;
- pdl: the 16x4096 launch as a programmatic dependent launch (its prologue overlaps the previous
  replay's tail), for information;
- kernels: the kernels cuDNN and ours launch at each shape (grid, block, registers, shared memory);
- promotion: our tensor descriptors re-encoded with each L2 promotion (Triton fixes 128 B);
- overlap: whether consecutive launches in one CUDA graph overlap (cuDNN's and ours);
- stamps: per-program start/end times of one-split launches (the tail), and whether slow programs
  follow their (batch, kv head) pair or their SM.
The length-load variants measured in session 10 are in commit f57857f (results/decode_attention.md).
Writes probe.json and probe.md under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from trtforge.kernels.decode_attention import DecodeConfig, decode_attention_raw, workspace_elements

SHAPES = {(1, 32768): 16, (4, 16384): 4, (16, 4096): 1, (64, 8192): 1, (128, 2048): 1, (256, 1024): 1}
CONFIGS = [(128, 4, 3), (128, 4, 4), (128, 8, 4), (128, 8, 3), (128, 4, 2), (64, 4, 3), (64, 4, 4)]


def _us(fn, rep: int) -> float:
    return 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def _problem(b: int, length: int, hq: int, hkv: int, d: int = 128) -> dict:
    q = torch.randn(b, hq, 1, d, dtype=torch.float16, device="cuda")
    k = torch.randn(b, hkv, length, d, dtype=torch.float16, device="cuda")
    v = torch.randn(b, hkv, length, d, dtype=torch.float16, device="cuda")
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    return {"q": q, "k": k, "v": v, "lens": lens, "out": torch.empty_like(q), "bytes": 2 * k.numel() * 2}


def _ours(p: dict, cfg: DecodeConfig, splits: int, pdl: bool = False):
    b, hq, _, d = p["q"].shape
    ws = torch.zeros(max(1, workspace_elements(b, hq, 1, d, splits)), dtype=torch.int32, device="cuda")

    def fn():
        if pdl:
            from trtforge.kernels import decode_attention as decode_kernel

            decode_kernel._launch(
                p["q"], p["k"], p["v"], p["lens"], None, p["out"], d**-0.5, cfg, splits, ws, pdl=True
            )
        else:
            decode_attention_raw(
                p["q"], p["k"], p["v"], p["lens"], None, p["out"], scale=d**-0.5, config=cfg, splits=splits,
                workspace=ws, stream=0, counters_zeroed=True,
            )  # fmt: skip
        return p["out"]

    return fn


_PROMOTION: list = [None]  # CUtensorMapL2promotion for descriptors encoded while set (None: Triton's 128 B)


def _install_promotion_patch() -> None:
    """Re-encode Triton's host tensor descriptors with the L2 promotion in _PROMOTION[0] while it is set.

    Triton 3.6 fixes CU_TENSOR_MAP_L2_PROMOTION_L2_128B; the descriptor lives 128 bytes into its
    PyCUtensorMap object (after the 128-aligned object header). Checked: re-encoding at 128 B gives
    the same 128 bytes."""
    import ctypes

    utils = triton.runtime.driver.active.utils
    orig = utils.fill_tma_descriptor
    cuda = ctypes.CDLL("libcuda.so.1")
    enc = cuda.cuTensorMapEncodeTiled
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32

    def encode(obj, level, addr, swizzle, elem_size, elem_type, block, shape, strides, padding):
        rank = len(block)
        dims = (u64 * rank)(*[int(x) for x in reversed(shape)])
        gstr = (u64 * max(rank - 1, 1))(*[elem_size * int(strides[rank - i - 2]) for i in range(rank - 1)])
        box = (u32 * rank)(*[int(x) for x in reversed(block)])
        ones = (u32 * rank)(*([1] * rank))
        res = enc(
            ctypes.c_void_p(id(obj) + 128), ctypes.c_int(elem_type), u32(rank), ctypes.c_void_p(addr),
            dims, gstr, box, ones, ctypes.c_int(0), ctypes.c_int(swizzle), ctypes.c_int(level),
            ctypes.c_int(1 if padding == 1 else 0),
        )  # fmt: skip
        assert res == 0, f"cuTensorMapEncodeTiled: {res}"

    def fill(addr, swizzle, elem_size, elem_type, block, shape, strides, padding):
        obj = orig(addr, swizzle, elem_size, elem_type, block, shape, strides, padding)
        if _PROMOTION[0] is not None:
            encode(obj, _PROMOTION[0], addr, swizzle, elem_size, elem_type, block, shape, strides, padding)
        return obj

    buf = torch.empty(4096, 128, dtype=torch.float16, device="cuda")  # also makes the CUDA context
    probe = orig(buf.data_ptr(), 3, 2, 6, [64, 64], [4096, 128], [128, 1], 0)
    before = ctypes.string_at(id(probe) + 128, 128)
    encode(probe, 2, buf.data_ptr(), 3, 2, 6, [64, 64], [4096, 128], [128, 1], 0)
    assert ctypes.string_at(id(probe) + 128, 128) == before, (
        "descriptor offset/encoding differs from Triton's"
    )
    utils.fill_tma_descriptor = fill


def _ours_promoted(p: dict, cfg: DecodeConfig, splits: int, level: int):
    """_ours, its tensor descriptors encoded at L2 promotion `level` (0 none, 1 64 B, 2 128 B, 3 256 B)."""
    inner = _ours(p, cfg, splits)

    def fn():
        _PROMOTION[0] = level
        try:
            return inner()
        finally:
            _PROMOTION[0] = None

    return fn


def _stamp_run(p: dict, cfg: DecodeConfig, shift: int) -> list:
    """One eager one-split launch with STAMP, pair i on program i - shift: per pair (start ns, end ns, SM)."""
    from trtforge.kernels import decode_attention as dk

    q, k, v, out = p["q"], p["k"], p["v"], p["out"]
    b, hq, s_q, d = q.shape
    hkv = k.shape[1]
    stamps = torch.zeros(b * hkv * 3, dtype=torch.int64, device="cuda")
    kd, vd = dk._tma_descriptors(k, v, cfg.block_n)
    opts = dk._split_options(cfg, hq // hkv, s_q, d, 0, True, False, True, 0, False, q.dtype, k.dtype)
    opts["STAMP"] = True
    dk._decode_split_kernel[(1, b * hkv)](
        q, k, v, kd, vd, p["lens"], p["lens"], out, stamps, out, p["lens"],
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), shift,
        hkv, 1, 0, float(d**-0.5), 1.0, 0.0, None, None, **opts,  # (v_scale 1, no cap, ALiBi or sinks)
    )  # fmt: skip
    torch.cuda.synchronize()
    return stamps.view(-1, 3).tolist()


def _rel_durations(runs: list, by: int) -> dict:
    """Mean duration relative to each launch's median, per pair (by=0) or per SM (by=2)."""
    acc: dict = {}
    for st in runs:
        med = statistics.median(e - s for s, e, _ in st)
        for i, (s, e, sm) in enumerate(st):
            acc.setdefault(i if by == 0 else sm, []).append((e - s) / med)
    return {k: statistics.mean(v) for k, v in acc.items()}


def _stamp_summary(runs: dict) -> list[str]:
    """Table cells: end-time quantiles and tail of the unrotated layout, durations, and r(pair), r(SM)."""
    st = runs[0][-1]
    t0 = min(s for s, _, _ in st)
    ends = sorted((e - t0) / 1e3 for _, e, _ in st)
    durs = sorted((e - s) / 1e3 for s, e, _ in st)

    def q(xs, f):
        return xs[min(len(xs) - 1, int(f * len(xs)))]

    cells = [f"{q(ends, f):.1f}" for f in (0.1, 0.5, 0.9)] + [
        f"{ends[-1]:.1f}",
        f"{ends[-1] - q(ends, 0.5):.1f}",
    ]
    cells.append(f"{durs[0]:.1f} / {q(durs, 0.5):.1f} / {durs[-1]:.1f}")
    a_runs, b_runs = runs.values()
    for by in (0, 2):
        a, b = _rel_durations(a_runs, by), _rel_durations(b_runs, by)
        keys = sorted(set(a) & set(b))
        cells.append(f"{statistics.correlation([a[k] for k in keys], [b[k] for k in keys]):.2f}")
    return cells


def _cudnn(p: dict):
    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(p["q"], p["k"], p["v"], enable_gqa=True)

    return fn


def _rounds(impls: dict, rounds: int, rep: int) -> dict:
    """Median over `rounds` interleaved rounds of each implementation's graph-replay median (us)."""
    ref = impls["cudnn"]().float()
    errs = {}
    for name, fn in impls.items():
        errs[name] = (fn().float() - ref).abs().max().item()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            samples[name].append(_us(fn, rep))
    return {n: {"us": statistics.median(s), "samples": s, "err": errs[n]} for n, s in samples.items()}


def _scan_row(store: dict, key: str, p: dict, args: argparse.Namespace) -> str:
    """Time cuDNN and one-split 128/4/3 TMA launches on problem `p` in interleaved rounds; record the
    result under store[key]; return the table cells (us, TB/s)."""
    impls = {"cudnn": _cudnn(p), "128/4/3": _ours(p, DecodeConfig(128, 4, 3, 1, tma=True), 1)}
    r = store[key] = _rounds(impls, args.rounds, args.rep)
    return " | ".join(f"{r[n]['us']:.1f} ({p['bytes'] / r[n]['us'] / 1e6:.2f})" for n in impls)


def _cfg_name(c: tuple) -> str:
    return f"{c[0]}/{c[1]}/{c[2]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=60, help="ms of replays per measurement")
    ap.add_argument("--parts", default="configs,pairs,ramp,pdl,kernels,promotion,overlap,stamps")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    res: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    res["machine"] = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}"
    md = [f"# Decode bandwidth probe ({res['machine']}, {res['date']})", ""]

    def save():
        (args.out / "probe.json").write_text(json.dumps(res, indent=1))
        (args.out / "probe.md").write_text("\n".join(md) + "\n")

    if "configs" in parts:
        md += ["## configs (us, fused split reduction; ratio = cuDNN / ours)", ""]
        md += ["| B x L | splits | cudnn | " + " | ".join(_cfg_name(c) for c in CONFIGS) + " |"]
        md += ["|---" * (len(CONFIGS) + 3) + "|"]
        res["configs"] = {}
        for (b, length), splits in SHAPES.items():
            p = _problem(b, length, 32, 8)
            impls = {"cudnn": _cudnn(p)}
            for c in CONFIGS:
                cfg = DecodeConfig(c[0], c[1], c[2], splits, tma=True)
                impls[_cfg_name(c)] = _ours(p, cfg, splits)
            r = _rounds(impls, args.rounds, args.rep)
            res["configs"][f"{b}x{length}"] = r
            base = r["cudnn"]["us"]
            cells = [f"{r[_cfg_name(c)]['us']:.1f} ({base / r[_cfg_name(c)]['us']:.3f})" for c in CONFIGS]
            md += [f"| {b}x{length} | {splits} | {base:.1f} | " + " | ".join(cells) + " |"]
            del p
            save()
        md += [""]
    if "pairs" in parts:
        md += ["## pairs: L 4096, Hq 16, Hkv 4, one split (us; TB/s)", ""]
        md += ["| B | B·Hkv | cudnn | 128/4/3 |", "|---|---|---|---|"]
        res["pairs"] = {}
        for b in (30, 32, 33, 34, 64, 66):
            md += [
                f"| {b} | {4 * b} | " + _scan_row(res["pairs"], str(b), _problem(b, 4096, 16, 4), args) + " |"
            ]
            save()
        md += [""]
    if "ramp" in parts:
        md += ["## ramp: B 16, Hq 32, Hkv 8, one split (us; TB/s)", ""]
        md += ["| L | cudnn | 128/4/3 |", "|---|---|---|"]
        res["ramp"] = {}
        for length in (256, 1024, 4096, 16384):
            md += [
                f"| {length} | "
                + _scan_row(res["ramp"], str(length), _problem(16, length, 32, 8), args)
                + " |"
            ]
            save()
        md += [""]
    if "pdl" in parts:
        p = _problem(16, 4096, 32, 8)
        cfg = DecodeConfig(128, 4, 3, 1, tma=True)
        impls = {"cudnn": _cudnn(p), "128/4/3": _ours(p, cfg, 1), "128/4/3 pdl": _ours(p, cfg, 1, pdl=True)}
        r = _rounds(impls, args.rounds, args.rep)
        res["pdl"] = r
        md += ["## pdl: 16x4096 (us)", "", " | ".join(f"{n}: {v['us']:.1f}" for n, v in r.items()), ""]
        save()
    if "promotion" in parts:
        _install_promotion_patch()
        names = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
        md += ["## promotion: TMA descriptors' L2 promotion (us; ratio = cuDNN / ours)", ""]
        md += [
            "| B x L | splits | cudnn | " + " | ".join(names) + " |",
            "|---|---|---|" + "---|" * len(names),
        ]
        res["promotion"] = {}
        for (b, length), splits in SHAPES.items():
            p = _problem(b, length, 32, 8)
            cfg = DecodeConfig(128, 4, 3, splits, tma=True)
            impls = {"cudnn": _cudnn(p), **{n: _ours_promoted(p, cfg, splits, lv) for n, lv in names.items()}}
            r = _rounds(impls, args.rounds, args.rep)
            res["promotion"][f"{b}x{length}"] = r
            base = r["cudnn"]["us"]
            cells = [f"{r[n]['us']:.1f} ({base / r[n]['us']:.3f})" for n in names]
            md += [f"| {b}x{length} | {splits} | {base:.1f} | " + " | ".join(cells) + " |"]
            del p
            save()
        md += [""]
    if "overlap" in parts:
        md += ["## overlap: consecutive launches inside one CUDA graph (torch.profiler, us)", ""]
        md += [
            "| B x L | impl | kernel durations | gaps start[i+1] - end[i] | period of the ends |",
            "|---|---|---|---|---|",
        ]
        res["overlap"] = {}
        for b, length in ((16, 4096), (64, 8192)):
            p = _problem(b, length, 32, 8)
            cfg = DecodeConfig(128, 4, 3, 1, tma=True)
            impls = {
                "cudnn": _cudnn(p),
                "ours 128/4/3": _ours(p, cfg, 1),
                "ours pdl": _ours(p, cfg, 1, pdl=True),
            }
            for name, fn in impls.items():
                rows = _graph_timeline(
                    fn, args.out / f"trace_overlap_{name.replace(' ', '_').replace('/', '')}.json"
                )
                res["overlap"].setdefault(f"{b}x{length}", {})[name] = rows
                durs = [e - s for s, e, _ in rows]
                gaps = [rows[i + 1][0] - rows[i][1] for i in range(len(rows) - 1)]
                period = (rows[-1][1] - rows[0][1]) / max(len(rows) - 1, 1)  # of the ends (PDL starts early)
                md += [
                    f"| {b}x{length} | {name} | {', '.join(f'{d:.1f}' for d in durs)} "
                    f"| {', '.join(f'{g:.2f}' for g in gaps)} | {period:.2f} |"
                ]
            del p
            save()
        md += [""]
    if "stamps" in parts:
        md += ["## stamps: per-program timeline of one-split launches (globaltimer, us)", ""]
        md += [
            "Each pair's duration relative to the launch median, over 10 eager launches, with the pairs",
            "laid on the programs as usual and rotated by half the grid: r(pair) correlates the per-pair",
            "figures of the two layouts, r(SM) the per-SM ones; the one near 1 says what slowness follows.",
            "",
            "| B x L | end p10 | end p50 | end p90 | end max | max - p50 | duration min / p50 / max "
            "| r(pair) | r(SM) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        res["stamps"] = {}
        for b, length in ((16, 1024), (16, 4096), (16, 16384)):
            p = _problem(b, length, 32, 8)
            cfg = DecodeConfig(128, 4, 3, 1, tma=True)
            runs = {shift: [_stamp_run(p, cfg, shift) for _ in range(12)][2:] for shift in (0, b * 4)}
            res["stamps"][f"{b}x{length}"] = {str(k): v for k, v in runs.items()}
            md += [f"| {b}x{length} | " + " | ".join(_stamp_summary(runs)) + " |"]
            del p
            save()
        md += [""]
    if "kernels" in parts:
        md += ["## kernels: what each launches (torch.profiler)", ""]
        md += [
            "| B x L | impl | kernel | grid | block | regs | smem bytes | us |",
            "|---|---|---|---|---|---|---|---|",
        ]
        res["kernels"] = {}
        for (b, length), splits in SHAPES.items():
            p = _problem(b, length, 32, 8)
            impls = {
                "cudnn": _cudnn(p),
                "ours 128/4/3": _ours(p, DecodeConfig(128, 4, 3, splits, tma=True), splits),
            }
            for name, fn in impls.items():
                for row in _kernels(fn, args.out / f"trace_{b}x{length}_{name.split()[0]}.json"):
                    res["kernels"].setdefault(f"{b}x{length}", []).append({"impl": name, **row})
                    md += [
                        f"| {b}x{length} | {name} | {row['name'][:60]} | {row['grid']} | {row['block']} "
                        f"| {row['regs']} | {row['smem']} | {row['us']:.1f} |"
                    ]
            del p
            save()
        md += [""]
    save()
    print((args.out / "probe.md").read_text())


def _graph_timeline(fn, trace: Path, calls: int = 6) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel of one replay of a CUDA graph holding `calls` calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    trace.unlink()
    events.sort(key=lambda e: e["ts"])
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"][:40]) for e in events]


def _kernels(fn, trace: Path) -> list[dict]:
    """The CUDA kernels one call of `fn` launches, with grid, block, registers and shared memory, from
    a torch.profiler trace (the third of three profiled calls)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    trace.unlink()
    rows = []
    for e in events[len(events) * 2 // 3 :]:
        a = e.get("args", {})
        rows.append(
            {
                "name": e["name"], "grid": a.get("grid"), "block": a.get("block"),
                "regs": a.get("registers per thread"), "smem": a.get("shared memory"),
                "us": e.get("dur", 0.0),
            }
        )  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
