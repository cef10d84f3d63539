"""Rich tables shared by commands: stage timings, engine manifests, ONNX summaries."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtforge.core.manifest import Manifest
from trtforge.core.shapes import format_range


def plain(value: object) -> str:
    """`value` as text rich prints literally: a path, tensor name or symbolic shape such as
    `[batch, seq]` or `[/x]` is data, not console markup (rich dropped the one and raised on the other)."""
    return escape(str(value))


def _dims(shape: list[int]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def timings_table(timings: dict[str, float]) -> Table:
    """Seconds per pipeline stage, with the total."""
    table = Table(title="stages", show_edge=False)
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for name, s in timings.items():
        table.add_row(name, f"{s:.2f}")
    table.add_row("[bold]total", f"[bold]{sum(timings.values()):.2f}")
    return table


def manifest_tables(m: Manifest, engine: Any = None) -> list[Any]:
    """The engine's identity, I/O and profiles as rich renderables. `engine`: the path the user gave (an
    engine renamed or copied with its manifest was shown by the name it was built under only)."""
    head = Table.grid(padding=(0, 2))
    size = f"{m.engine_bytes / 1e6:.2f} MB, sha256 {m.engine_sha256[:16]}…"
    name = plain(m.engine_file if engine is None else engine)
    if engine is not None and Path(engine).name != m.engine_file:
        name += f" (built as {plain(m.engine_file)})"
    head.add_row("engine", f"{name} ({size})")
    head.add_row("backend", f"{m.backend.get('name')} {m.backend.get('version')}")
    if m.backend.get("targets"):
        head.add_row("targets", ", ".join(m.backend["targets"]))
    source = f"{m.source.get('kind')}: {m.source.get('path')} (opset {m.source.get('opset')})"
    head.add_row("source", plain(source))
    head.add_row("precision", str(m.precision.get("mode")))
    head.add_row("streams", f"{m.streams} (profiles: {len(m.profiles)})")
    if m.plugins:
        head.add_row("plugins", ", ".join(p.get("name", "?") for p in m.plugins))
    head.add_row("trtforge", m.trtforge_version)
    io = Table(title="I/O", show_edge=False)
    profiles = _base_profiles(m)
    for col in ("", "name", "dtype", "shape", *(f"{plain(n)} (min:opt:max)" for n, _ in profiles)):
        io.add_column(col)
    for kind, specs in (("in", m.inputs), ("out", m.outputs)):
        for t in specs:
            ranges = [prof.get(t.name) for _, prof in profiles]
            io.add_row(
                kind, plain(t.name), t.dtype, _dims(t.shape), *(format_range(r) if r else "" for r in ranges)
            )
    return [head, io]


def generation_line(g: dict[str, Any]) -> str:
    """A step engine's `generation` section in one line: model, heads, KV cache layout and shape, the
    phase of each profile (what ``inspect`` and ``compile --generate`` print)."""

    def get(d: Any, key: str) -> Any:
        return d.get(key, "?") if isinstance(d, dict) else "?"

    c = g.get("cache") or {}
    if get(c, "layout") == "paged":
        shape = f"[<={get(c, 'num_blocks')} blocks, {get(c, 'block_size')}, {get(g, 'num_kv_heads')}, "
    else:
        shape = f"[B<={get(g, 'max_batch')}, {get(g, 'num_kv_heads')}, {get(g, 'max_seq')}, "
    shape += f"{get(g, 'head_dim')}]"
    phases = g.get("profiles")
    profiles = " ".join(f"{k}={v}" for k, v in phases.items()) if isinstance(phases, dict) else "?"
    return plain(
        f"generation: {get(g, 'model_type')} {get(g, 'num_layers')} layers, {get(g, 'num_heads')} heads / "
        f"{get(g, 'num_kv_heads')} KV heads x {get(g, 'head_dim')}, cache {get(c, 'layout')} "
        f"{get(c, 'dtype')} {shape}, profiles {profiles}"
    )


def _base_profiles(m: Manifest) -> list[tuple[str, dict[str, Any]]]:
    """The engine's distinct optimization profiles, named: `streams` copies of K base profiles are
    shown once each, a decoder step engine's by phase (prefill, decode). Only profile 0 was shown, so a
    step engine's decode ranges were not seen at all."""
    copies = max(1, m.streams)
    k = len(m.profiles) // copies if m.profiles and len(m.profiles) % copies == 0 else len(m.profiles)
    phases = (m.generation or {}).get("profiles")
    names = {v: n for n, v in phases.items() if isinstance(v, int)} if isinstance(phases, dict) else {}
    return [(names.get(i, f"profile {i}"), p) for i, p in enumerate(m.profiles[:k])]


def _io_shape(entry: dict[str, Any]) -> str:
    """An `inspect` I/O entry's shape as the table shows it: ``[batch, 4]``, ``?`` a dynamic unnamed axis."""
    if entry["shape"] is None:
        return "(no shape recorded)"
    names = entry.get("symbols") or [None] * len(entry["shape"])
    dims = [str(n) if n else ("?" if d < 0 else str(d)) for d, n in zip(entry["shape"], names)]
    return plain(f"[{', '.join(dims)}]")


def onnx_tables(summary: dict[str, Any]) -> list[Any]:
    """An ONNX summary (see inspect_cmd.summarize_onnx) as rich renderables."""
    head = Table.grid(padding=(0, 2))
    head.add_row("file", plain(summary["path"]))
    head.add_row("opsets", ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in summary["opsets"].items()))
    head.add_row("producer", plain(summary["producer"]))
    head.add_row("nodes", str(summary["nodes"]))
    head.add_row("weights", f"{summary['initializers']} tensors, {summary['weight_bytes'] / 1e6:.2f} MB")
    io = Table(title="I/O", show_edge=False)
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind in ("inputs", "outputs"):
        for t in summary[kind]:
            io.add_row(kind[:-1] if kind == "inputs" else "out", plain(t["name"]), t["dtype"], _io_shape(t))
    inner = Counter(summary.get("subgraph_ops") or {})
    if inner:
        head.add_row("in subgraphs", f"{sum(inner.values())} nodes (If/Loop/Scan bodies)")
    ops = Table(title="ops", show_edge=False)
    ops.add_column("op")
    ops.add_column("count", justify="right")
    if inner:  # the bodies' ops apart: the top-level count stays what the graph itself holds
        ops.add_column("in subgraphs", justify="right")
    for op, _ in (Counter(summary["ops"]) + inner).most_common():
        cells = [plain(op), str(summary["ops"].get(op, 0))]
        ops.add_row(*cells, *([str(inner[op])] if inner else []))
    return [head, io, ops]


def _int8_coverage(rec: dict[str, Any]) -> str:
    """What INT8 covers: the MatMuls (of all), then any other op type quantized. A convolution net read
    "0/0 MatMuls INT8" with its Convs quantized, as if nothing had been."""
    parts = (
        [f"{rec.get('matmuls_quantized')}/{rec.get('matmuls_total')} MatMuls"]
        if rec.get("matmuls_total")
        else []
    )
    by_op = rec.get("quantized_by_op") or {}
    parts += [f"{n} {op}" for op, n in sorted(by_op.items()) if op != "MatMul" and n]
    return ", ".join(parts) or "no op"


def float_check(rec: dict[str, Any]) -> str:
    """An FP16/BF16 conversion record's check against FP32 (worst over its outputs) in a few words: what
    `optimize` and `compile` print, so a conversion that lost an output is seen, not only recorded."""
    checks = [c for c in rec.get("verification") or [] if isinstance(c, dict)]
    if not checks:
        return "not checked against FP32"
    cos = min(float(c.get("min_cosine", float("nan"))) for c in checks)
    rel = max(float(c.get("max_rel_err", float("nan"))) for c in checks)
    finite = "" if all(c.get("finite", True) for c in checks) else ", NOT FINITE"
    return f"vs FP32 in exact ORT: min cosine {cos:.6f}, max error {rel:.1e} of peak{finite}"


def print_all(console: Console, items: list[Any]) -> None:
    """Print renderables separated by blank lines."""
    for item in items:
        console.print(item)
        console.print()


def stage_summary_table(records: dict[str, Any]) -> Table | None:
    """One line per graph stage saying what it changed (fusions, FP32 islands, INT8 coverage)."""
    table = Table(title="graph stages", show_edge=False)
    table.add_column("stage")
    table.add_column("what it did")
    passes = records.get("passes")
    if passes:
        fused = ", ".join(f"{p['name']} {p['matches']}" for p in passes["passes"] if p["matches"])
        check = (
            "verified by ONNX Runtime"
            if passes.get("verify") and not passes.get("verify_skipped_reason")
            else (passes.get("verify_skipped_reason") or "not verified")
        )
        what = f"{fused or 'no matches'}; attention={passes.get('attention')}; {check}"
        table.add_row("passes", plain(what))
    for mode in ("fp16", "bf16"):
        rec = records.get(mode)
        if rec:
            table.add_row(
                mode,
                f"{rec.get('low_precision_nodes')} nodes {mode}, {rec.get('fp32_nodes')} kept FP32; "
                f"{float_check(rec)}",
            )
    rec = records.get("int8")
    if rec:
        table.add_row(
            "int8",
            f"{_int8_coverage(rec)} INT8 ({rec.get('method')}, {rec.get('samples')} samples); "
            f"{len(rec.get('fallback') or [])} fell back",
        )
    for mode in ("fp8", "int4"):  # decoder step graphs (compile --generate)
        rec = records.get(mode)
        if rec:
            check = rec.get("exact_check") or {}
            table.add_row(
                mode,
                f"{rec.get('matmuls_quantized')}/{rec.get('matmuls_total')} MatMuls {mode.upper()}; "
                f"vs FP32 in exact ORT: logits rel L2 {check.get('logits_rel_l2', float('nan')):.3g}, top-1 "
                f"{check.get('top1_agreement', float('nan')):.3f}",
            )
    decomposed = (records.get("build") or {}).get("attention_decomposed")
    if decomposed:  # TensorRT prints its own "Internal Error" for the first try: say what it meant
        table.add_row(
            "build",
            plain(
                f"attention {', '.join(decomposed)} built decomposed (MatMul/Softmax kernels, slower): "
                "TensorRT has no fused attention kernel for its shapes or dtype"
            ),
        )
    return table if table.row_count else None
