"""Benchmark: trtforge's split-KV decode kernel (contiguous and paged) vs torch SDPA, same run.

    PYTHONPATH=. python3 benchmarks/bench_decode_attention.py --out build/bench_decode [--sweep]

Cases (defaults): FP16, Hq=32, Hkv=8, D=128, q_len 1, B x L in {1x32768, 4x16384, 16x4096,
64x8192, 128x2048, 256x1024}, every sequence at full length L. Implementations, all in this process:
- ours-contig: decode_attention on a contiguous [B, Hkv, L, D] cache, autotuned on its first call
  (tile, pipeline depth and split count; not timed; the choice is recorded). Captured in a CUDA
  graph without a workspace of the caller's, its splits are reduced by a second kernel;
- ours-contig-ws: the same config and split count through decode_attention_raw with a workspace
  zeroed once (counters_zeroed: the kernel leaves its counters zero): the fused reduction, one
  kernel per call;
- ours-contig-2k: the same config and split count with the split reduction in a second kernel;
- ours-contig-default: the untuned default config with the split heuristic;
- ours-paged16 / ours-paged64: the kernel (autotuned) on a pool of 16- / 64-token blocks placed by a
  random permutation, read through the block table;
- ours-paged16-plugin: paged16's config through decode_attention_raw on a scratch workspace of
  undefined contents (what the PagedAttention plugin's enqueue runs after reshape-and-cache);
- cudnn / flash: torch SDPA (CUDNN_ATTENTION / FLASH_ATTENTION backend) on the contiguous cache,
  ``enable_gqa=True`` (no K/V expansion);
- gather+cudnn: the 16-token pool gathered to contiguous by advanced indexing
  (``pool[table]`` -> permute -> reshape, one copy), then cuDNN SDPA.
Each is timed once as CUDA-graph replays (triton.testing.do_bench_cudagraph, median; K/V of every case
exceed the 50 MB L2). TB/s = K+V bytes the attention must read (2·B·Hkv·L·D·2) / time, for every
implementation (so gather+cudnn's figure counts useful bytes, not the bytes its copy moves). The
contiguous autotuner's time for each candidate is recorded with its choice. Every implementation's
output is checked against cuDNN's. The ratios to cuDNN and gather+cudnn are then taken again over
--rounds interleaved rounds (each round times ours-contig, ours-contig-ws, ours-paged16, cudnn and
gather+cudnn once, one after the other; a round's ratio uses its own two times), reported as the
median with the spread, because single timings taken minutes apart drift by about as much as the
margins (benchmarks/results/decode_attention.md). Writes results.json and results.md under --out;
--sweep also times the contiguous kernel over split counts x tile configs (sweep.md), the data
behind the split heuristic.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import statistics
import subprocess
from pathlib import Path

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from trtforge.kernels import decode_attention as decode_kernel
from trtforge.kernels.decode_attention import (
    DecodeConfig,
    decode_attention,
    decode_attention_raw,
    default_decode_config,
    num_splits_for,
    workspace_elements,
)
from trtforge.kernels.device_tensor import pool_heads_major

SHAPES = [(1, 32768), (4, 16384), (16, 4096), (64, 8192), (128, 2048), (256, 1024)]
ROUND_IMPLS = ("ours-contig", "ours-contig-ws", "ours-paged16", "cudnn", "gather+cudnn")
ROUNDS = 7  # --rounds: interleaved rounds behind the ratio table
PEAK_TBS = 4.8  # H200 HBM3e datasheet figure (a lead); the 85% target is taken against it
AGREE_TOL = 4e-3


def _graph_us(fn, rep: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def _pool(k: torch.Tensor, v: torch.Tensor, page: int, gen: torch.Generator) -> tuple:
    """K and V pools [num_blocks, page, Hkv, D] (the step graph's layout) holding the caches' blocks at
    randomly permuted places (one table for both), and the table [B, L / page]."""
    b, hkv, length, d = k.shape
    nb = length // page
    table = torch.randperm(b * nb, generator=gen).view(b, nb).to(torch.int32).cuda()
    pools = []
    for cache in (k, v):
        pool = torch.empty(b * nb, page, hkv, d, dtype=cache.dtype, device=cache.device)
        pool[table.long()] = cache.view(b, hkv, nb, page, d).permute(0, 2, 3, 1, 4)
        pools.append(pool)
    return pools[0], pools[1], table


def _gather(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, L, D] from the pool: advanced-index gather of the blocks, then one permuting copy."""
    b, nb = table.shape
    _, page, hkv, d = pool.shape
    return pool[table.long()].permute(0, 3, 1, 2, 4).reshape(b, hkv, nb * page, d)


def _sdpa(backend: SDPBackend, q, k, v):
    with sdpa_kernel(backend):
        return sdpa(q, k, v, enable_gqa=True)


def _kernel_view(k, table):
    """The cache as the kernel indexes it: pools [num_blocks, page, Hkv, D] as [num_blocks, Hkv, page, D]."""
    return pool_heads_major(k) if table is not None else k


def _fixed(q, k, table, length: int) -> tuple[DecodeConfig, int]:
    """The autotuned choice for this case with its split count made explicit."""
    k = _kernel_view(k, table)
    cfg = decode_kernel._CHOICE[decode_kernel._key_of(q, k, table, length)]
    splits = decode_kernel._resolve_splits(cfg, q.shape[0] * k.shape[1], length)
    return dataclasses.replace(cfg, num_splits=splits), splits


def _short(c: DecodeConfig) -> str:
    """A candidate as block_n/warps/stages/splits (h: the heuristic's count), plus /tma."""
    return f"{c.block_n}/{c.num_warps}/{c.num_stages}/s{c.num_splits or 'h'}{'/tma' if c.tma else ''}"


def _case(b: int, length: int, hq: int, hkv: int, d: int, dtype: torch.dtype, n_rounds: int) -> tuple:
    gen = torch.Generator().manual_seed(b * length)
    q = torch.randn(b, hq, 1, d, generator=gen).to(dtype).cuda()
    k = torch.randn(b, hkv, length, d, dtype=dtype, device="cuda")
    v = torch.randn(b, hkv, length, d, dtype=dtype, device="cuda")
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    pools = {page: _pool(k, v, page, gen) for page in (16, 64)}
    out = torch.empty_like(q)
    k16, v16, t16 = pools[16]
    k64, v64, t64 = pools[64]
    default = default_decode_config(d)
    decode_attention(q, k, v, lens, out=out)  # autotune (not timed)
    decode_attention(q, k16, v16, lens, t16, out=out)
    fixed, splits = _fixed(q, k, None, length)
    fixed16, splits16 = _fixed(q, k16, t16, length)
    ws = torch.zeros(max(1, workspace_elements(b, hq, 1, d, splits)), dtype=torch.int32, device="cuda")
    ws16 = torch.full((max(1, workspace_elements(b, hq, 1, d, splits16)),), 7, dtype=torch.int32)
    ws16 = ws16.cuda()  # a scratch workspace: garbage counters, zeroed by the launch

    def raw(kc, vc, table, cfg, n, workspace, zeroed):
        decode_attention_raw(
            q, kc, vc, lens, table, out, scale=d**-0.5, config=cfg, splits=n, workspace=workspace,
            stream=0, counters_zeroed=zeroed,
        )  # fmt: skip
        return out

    unfused = dataclasses.replace(fixed, fused=False)
    impls = {
        "ours-contig": lambda: decode_attention(q, k, v, lens, out=out),
        "ours-contig-ws": lambda: raw(k, v, None, fixed, splits, ws, True),
        "ours-contig-2k": lambda: decode_attention(q, k, v, lens, out=out, config=unfused),
        "ours-contig-default": lambda: decode_attention(q, k, v, lens, out=out, config=default),
        "ours-paged16": lambda: decode_attention(q, k16, v16, lens, t16, out=out),
        "ours-paged16-plugin": lambda: raw(k16, v16, t16, fixed16, splits16, ws16, False),
        "ours-paged64": lambda: decode_attention(q, k64, v64, lens, t64, out=out),
        "cudnn": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v),
        "flash": lambda: _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v),
        "gather+cudnn": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION, q, _gather(k16, t16), _gather(v16, t16)),
    }
    ref = impls["cudnn"]().float()
    times, errors, rounds = {}, {}, {}
    for name, fn in impls.items():
        try:
            res = fn()
            torch.cuda.synchronize()
            errors[name] = (res.float() - ref).abs().max().item()
            times[name] = _graph_us(fn)
        except Exception as exc:  # a torch backend that refuses this shape: record, keep going
            times[name] = None
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    for _ in range(n_rounds):  # interleaved: every round times each of them once, one after the other
        for name in ROUND_IMPLS:
            if times.get(name) is not None:
                rounds.setdefault(name, []).append(_graph_us(impls[name], 100))
    chosen = {
        name: str(decode_kernel._CHOICE.get(decode_kernel._key_of(q, _kernel_view(kc, tb), tb, length)))
        for name, kc, tb in (("ours-contig", k, None), ("ours-paged16", k16, t16), ("ours-paged64", k64, t64))
    }
    tuned = decode_kernel.TUNING_TIMES.get(decode_kernel._key_of(q, k, None, length), {})
    chosen["autotune us (contig)"] = {
        _short(c): round(1e3 * t, 1) for c, t in sorted(tuned.items(), key=lambda x: x[1])
    }
    chosen["splits (contig, paged16)"] = f"{splits}, {splits16}"
    return times, errors, chosen, rounds


SWEEP_CONFIGS = [(64, 4, 3), (64, 4, 2), (64, 8, 3), (128, 4, 2)]
SWEEP_SPLITS = [1, 2, 3, 4, 6, 8, 16, 32, 64, 128]


def _sweep_shape(b: int, length: int, hq: int, hkv: int, d: int, dtype: torch.dtype, sms: int) -> list:
    """Table rows for one shape: contiguous kernel time (us, graph replays) per config x split count."""
    q = torch.randn(b, hq, 1, d, dtype=dtype, device="cuda")
    k = torch.randn(b, hkv, length, d, dtype=dtype, device="cuda")
    v = torch.randn(b, hkv, length, d, dtype=dtype, device="cuda")
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    lines = []
    for bn, warps, stages in SWEEP_CONFIGS:
        cells = {}
        for n in SWEEP_SPLITS:
            if n > -(-length // bn):
                continue
            cfg = DecodeConfig(bn, warps, stages, n)
            cells[n] = _graph_us(lambda cfg=cfg: decode_attention(q, k, v, lens, out=out, config=cfg), 40)
        best = min(cells, key=cells.get)
        row = " | ".join(f"{cells[n]:.1f}" if n in cells else "" for n in SWEEP_SPLITS)
        heur = num_splits_for(b * hkv, length, sms, bn)
        best_cell = f"s={best}: {cells[best]:.1f}"
        lines.append(f"| {b}x{length} | {bn}, {warps}, {stages} | {heur} | {row} | {best_cell} |")
        print(lines[-1], flush=True)
    return lines


def _sweep(hq: int, hkv: int, d: int, dtype: torch.dtype) -> str:
    """The contiguous kernel over SWEEP_CONFIGS x SWEEP_SPLITS on every shape, as a Markdown table."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines = [
        "| B x L | config (block_n, warps, stages) | heuristic splits | "
        + " | ".join(f"s={n}" for n in SWEEP_SPLITS)
        + " | best |",
        "|---" * (len(SWEEP_SPLITS) + 4) + "|",
    ]
    for b, length in SHAPES:
        torch.cuda.empty_cache()
        lines += _sweep_shape(b, length, hq, hkv, d, dtype, sms)
    return "\n".join(lines) + "\n"


def _ratio(row: dict, ours: str, peer: str) -> str:
    """Speed-up of `ours` over `peer` (peer time / our time)."""
    a, b = row["us"][ours], row["us"][peer]
    return f"{b / a:.2f}x" if a and b else "n/a"


def _round_ratio(rounds: dict, ours: str, peer: str) -> str:
    """Median [min, max] over interleaved rounds of peer time / our time, each round's own pair."""
    if ours not in rounds or peer not in rounds:
        return "n/a"
    ratios = [p / o for o, p in zip(rounds[ours], rounds[peer])]
    return f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}, {max(ratios):.3f}]"


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def _write(rows: list, args: argparse.Namespace, hq: int, hkv: int, d: int, done: int) -> str:
    """Write results.json and results.md for the shapes measured so far of the `done` asked for
    (after each shape, so that a run cut short by a time limit keeps what it measured)."""
    names = list(rows[0]["us"])
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "commit": args.commit or _commit(),
        "config": default_decode_config(d).__dict__,
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    def tbs(row: dict, name: str) -> float | None:
        t = row["us"][name]
        return row["kv_bytes"] / (t * 1e-6) / 1e12 if t else None

    lines = [
        f"FP16, Hq={hq}, Hkv={hkv}, D={d}, q_len 1; {meta['gpu']}; torch {meta['torch']}, "
        f"Triton {meta['triton']}, cuDNN {meta['cudnn']}; {meta['date']}; commit {meta['commit']}.",
        "CUDA-graph replay medians (us) and TB/s = K+V bytes / time.",
        "",
        "| B x L | "
        + " | ".join(names)
        + " | contig/cudnn | contig-ws/cudnn | paged16/cudnn | paged16/gather | BW ours-contig |",
        "|---" * (len(names) + 6) + "|",
    ]
    for r in rows:
        cells = []
        for n in names:
            t, bw = r["us"][n], tbs(r, n)
            cells.append(f"{t:.1f} ({bw:.2f})" if t else "n/a")
        bw = tbs(r, "ours-contig")
        pct = f"{100 * bw / PEAK_TBS:.0f}%" if bw else "n/a"
        lines.append(
            f"| {r['B']}x{r['L']} | " + " | ".join(cells)
            + f" | {_ratio(r, 'ours-contig', 'cudnn')} | {_ratio(r, 'ours-contig-ws', 'cudnn')} "
            f"| {_ratio(r, 'ours-paged16', 'cudnn')} "
            f"| {_ratio(r, 'ours-paged16', 'gather+cudnn')} | {pct} |"
        )  # fmt: skip
    lines += [
        "",
        f"Interleaved rounds ({max(1, args.rounds)}: each round times "
        f"{', '.join(ROUND_IMPLS)} once, in that order):",
        "per-round ratio peer time / our time, median [min, max] over the rounds.",
        "",
        "| B x L | contig/cudnn | contig-ws/cudnn | paged16/cudnn | paged16/gather | cudnn us (median) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            _round_ratio(r["rounds_us"], ours, peer)
            for ours, peer in (
                ("ours-contig", "cudnn"), ("ours-contig-ws", "cudnn"), ("ours-paged16", "cudnn"),
                ("ours-paged16", "gather+cudnn"),
            )
        ]  # fmt: skip
        base = r["rounds_us"].get("cudnn")
        lines.append(
            f"| {r['B']}x{r['L']} | " + " | ".join(cells) + f" | {statistics.median(base):.1f} |"
            if base
            else f"| {r['B']}x{r['L']} | " + " | ".join(cells) + " | n/a |"
        )
    lines += ["", "Max |out - cuDNN| per implementation:", ""]
    for r in rows:
        errs = ", ".join(
            f"{n}: {e:.1e}" if isinstance(e, float) else f"{n}: {e}" for n, e in r["max_abs_vs_cudnn"].items()
        )
        lines.append(f"- {r['B']}x{r['L']}: {errs}")
    bad = [
        (r["B"], r["L"], n)
        for r in rows
        for n, e in r["max_abs_vs_cudnn"].items()
        if isinstance(e, float) and e > AGREE_TOL
    ]
    if bad:
        lines.append(f"\nDISAGREE beyond {AGREE_TOL}: {bad}")
    lines += ["", "Autotuned choices (block_n, warps, stages, splits; 0 = heuristic):", ""]
    lines += [f"- {r['B']}x{r['L']}: {r['chosen']}" for r in rows]
    text = "\n".join(lines) + "\n"
    if len(rows) < done:
        text += f"\n(partial: {len(rows)} of {done} shapes so far)\n"
    (args.out / "results.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench_decode"))
    ap.add_argument("--commit", default=None, help="commit id to record (default: git rev-parse)")
    ap.add_argument("--sweep", action="store_true", help="also sweep split counts x tile configs")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved timing rounds (ratio table)")
    ap.add_argument(
        "--shapes", default=",".join(f"{b}x{n}" for b, n in SHAPES), help="BxL list (default: all six)"
    )
    args = ap.parse_args()
    try:
        shapes = [tuple(int(x) for x in item.lower().split("x")) for item in args.shapes.split(",") if item]
    except ValueError:
        ap.error(f"--shapes takes BxL items separated by commas, e.g. 16x4096,1x32768; got {args.shapes!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    hq, hkv, d, dtype = 32, 8, 128, torch.float16
    rows = []
    for b, length in shapes:
        torch.cuda.empty_cache()
        times, errors, chosen, rounds = _case(b, length, hq, hkv, d, dtype, max(1, args.rounds))
        kv_bytes = 2 * b * hkv * length * d * 2
        rows.append(
            {
                "B": b,
                "L": length,
                "kv_bytes": kv_bytes,
                "us": times,
                "max_abs_vs_cudnn": errors,
                "chosen": chosen,
                "rounds_us": rounds,
            }
        )
        print(b, length, {n: (round(t, 1) if t else None) for n, t in times.items()}, chosen, flush=True)
        _write(rows, args, hq, hkv, d, done=len(shapes))
    print(_write(rows, args, hq, hkv, d, done=len(shapes)))
    if args.sweep:
        sweep = _sweep(hq, hkv, d, dtype)
        (args.out / "sweep.md").write_text(sweep)
        print(sweep)


if __name__ == "__main__":
    main()
