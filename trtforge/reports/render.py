"""Markdown and JSON rendering, and `write_report` (all three files, each written atomically).

Everything here reads only a :class:`~trtforge.reports.results.Report`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trtforge._fileio import atomic_write_text
from trtforge.reports.results import OK, AccuracyRow, LatencyPoint, Report, TargetInfo


def fmt(value: Any, spec: str = ".3g", none: str = "–") -> str:
    """Format a number for a table cell ('–' for missing, 'inf' for infinite)."""
    if value is None:
        return none
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)


def fmt_bytes(n: int | None) -> str:
    """Bytes as MiB."""
    return "–" if n is None else f"{n / 2**20:.1f} MiB"


def verdict(row: AccuracyRow) -> str:
    """PASS / FAIL / the status, for a table cell."""
    if row.status != OK:
        return row.status.upper().replace("_", " ")
    return {True: "PASS", False: "FAIL", None: "no checks"}[row.passed]


def tolerance_text(row: AccuracyRow) -> str:
    """The checks that were applied, one short phrase each."""
    t = row.tolerance
    if t is None:
        return "–"
    parts = []
    if t.atol is not None or t.rtol is not None:
        parts.append(f"atol {fmt(t.atol or 0, 'g')} / rtol {fmt(t.rtol or 0, 'g')}")
    if t.min_cosine is not None:
        parts.append(f"cos ≥ {t.min_cosine:g}")
    if t.min_snr_db is not None:
        parts.append(f"SNR ≥ {t.min_snr_db:g} dB")
    if t.min_top1 is not None:
        parts.append(f"top-1 ≥ {t.min_top1:g}")
    return ", ".join(parts) or "none"


def target_cells(t: TargetInfo) -> list[str]:
    """Cells of the targets table."""
    status = t.status.upper().replace("_", " ")
    return [
        t.name,
        t.kind,
        t.precision,
        t.device,
        status,
        t.reason or "",
        t.derived_from or "",
        fmt(t.prepare_seconds, ".2f"),
    ]


TARGET_HEADER = ["target", "runtime", "precision", "device", "status", "reason", "derived from", "prepare s"]
ACCURACY_HEADER = [
    "target", "output", "max abs", "mean abs", "max rel", "mean rel", "rel L2",
    "cosine", "min row cos", "SNR dB", "top-1", "top-5", "tolerance", "result", "reason",
]  # fmt: skip
LATENCY_HEADER = [
    "target",
    "batch",
    "seq",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "mean ms",
    "samples/s",
    "peak mem",
    "status",
    "session · CPU ISA",
]


def accuracy_cells(r: AccuracyRow) -> list[str]:
    """Cells of the accuracy table."""
    output = r.output + (" (real tokens)" if r.padding_excluded else "")
    return [
        r.target, output, fmt(r.max_abs), fmt(r.mean_abs), fmt(r.max_rel), fmt(r.mean_rel), fmt(r.rel_l2),
        fmt(r.cosine, ".6f"), fmt(r.min_row_cosine, ".6f"), fmt(r.snr_db, ".1f"), fmt(r.top1, ".4f"),
        fmt(r.top5, ".4f"), tolerance_text(r), verdict(r), r.reason or "",
    ]  # fmt: skip


def latency_cells(p: LatencyPoint) -> list[str]:
    """Cells of the latency table."""
    status = "ok" if p.status == OK else f"{p.status}: {p.reason}"
    return [
        p.target, str(p.batch), fmt(p.seq, "d"), fmt(p.p50_ms, ".4g"), fmt(p.p90_ms, ".4g"),
        fmt(p.p99_ms, ".4g"), fmt(p.mean_ms, ".4g"), fmt(p.throughput, ".4g"), fmt_bytes(p.peak_memory_bytes),
        status, " · ".join(x for x in (p.session, p.cpu_isa) if x),
    ]  # fmt: skip


def headline(report: Report) -> str:
    """One sentence: targets run and accuracy verdicts."""
    s = report.summary()
    t = s["targets"]
    return (
        f"{t['ok']} target(s) ran, {t['failed']} failed, {t['not_run']} not runnable here; "
        f"accuracy vs {report.reference}: {s['accuracy_passed']} passed, {s['accuracy_failed']} failed, "
        f"{s['accuracy_not_compared']} not compared."
    )


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(c: str) -> str:
        return c.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(report: Report) -> str:
    """The Markdown summary: headline, targets, accuracy and latency tables, notes."""
    parts = [
        f"# {report.title}",
        "",
        f"Source: {report.source['kind']} `{report.source['label']}` · reference: `{report.reference}` · "
        f"created {report.created}",
        "",
        headline(report),
        "",
        "## Targets",
        _md_table(TARGET_HEADER, [target_cells(t) for t in report.targets]),
        "",
        f"## Accuracy (vs `{report.reference}`, inputs: {report.settings.get('accuracy_data')})",
        _md_table(ACCURACY_HEADER, [accuracy_cells(r) for r in report.accuracy])
        if report.accuracy
        else "none",
        "",
        f"## Latency (warm-up {report.settings.get('warmup')}, "
        f"{report.settings.get('runs')} timed runs per point)",
        _md_table(LATENCY_HEADER, [latency_cells(p) for p in report.latency]) if report.latency else "none",
        "",
    ]
    if report.notes:
        parts += ["## Notes", *[f"- {n}" for n in report.notes], ""]
    env = report.environment
    parts += [
        "## Environment",
        f"{env.get('cpu')} ({env.get('cpu_count')} logical CPUs; ISA "
        f"{', '.join((env.get('cpu_isa') or {}).get('isa') or ['unknown'])}), Python {env.get('python')}, "
        + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v),
        "",
    ]
    return "\n".join(parts)


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path, Path]:
    """Write report.html, report.md and report.json into `out_dir`; returns their paths."""
    from trtforge.reports.html import render_html

    html_path, md_path, json_path = out_dir / "report.html", out_dir / "report.md", out_dir / "report.json"
    atomic_write_text(json_path, report.to_json())
    atomic_write_text(md_path, render_markdown(report))
    atomic_write_text(html_path, render_html(report))
    return html_path, md_path, json_path
