"""Markdown and JSON rendering, and `write_report` (all three files, each written atomically).

Everything here reads only a :class:`~trtforge.reports.results.Report`.
"""

from __future__ import annotations

from pathlib import Path

from trtforge._fileio import atomic_outputs, atomic_write_text
from trtforge.reports.cells import (
    ACCURACY_HEADER,
    LATENCY_HEADER,
    LM_QUALITY_HEADER,
    LM_SPEED_HEADER,
    TARGET_HEADER,
    accuracy_cells,
    headline,
    latency_cells,
    lm_quality_cells,
    lm_speed_cells,
    target_cells,
)
from trtforge.reports.html import render_html
from trtforge.reports.results import Report


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(c: str) -> str:
        return c.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def lm_sections(report: Report) -> list[str]:
    """The LLM report's quality and speed sections (Markdown)."""
    s = report.settings
    return [
        f"## Quality (vs `{report.reference}`, text: {s.get('accuracy_data')})",
        _md_table(LM_QUALITY_HEADER, [lm_quality_cells(q) for q in report.lm_quality]),
        "",
        f"## Speed (prompt {s.get('prompt_len')} + {s.get('new_tokens')} new tokens per request, greedy; "
        f"device {s.get('device')})",
        _md_table(LM_SPEED_HEADER, [lm_speed_cells(p) for p in report.lm_speed])
        if report.lm_speed
        else "none",
        "",
    ]


def render_markdown(report: Report) -> str:
    """The Markdown summary: headline, targets, accuracy and latency tables (or an LLM report's quality
    and speed tables), notes."""
    if report.is_lm:
        middle = lm_sections(report)
    else:
        middle = [
            f"## Accuracy (vs `{report.reference}`, inputs: {report.settings.get('accuracy_data')})",
            _md_table(ACCURACY_HEADER, [accuracy_cells(r) for r in report.accuracy])
            if report.accuracy
            else "none",
            "",
            f"## Latency (warm-up {report.settings.get('warmup')}, "
            f"{report.settings.get('runs')} timed runs per point)",
            _md_table(LATENCY_HEADER, [latency_cells(p) for p in report.latency])
            if report.latency
            else "none",
            "",
        ]
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
        *middle,
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
    html_path, md_path, json_path = out_dir / "report.html", out_dir / "report.md", out_dir / "report.json"
    with atomic_outputs():  # all three or none, even when interrupted
        atomic_write_text(json_path, report.to_json())
        atomic_write_text(md_path, render_markdown(report))
        atomic_write_text(html_path, render_html(report))
    return html_path, md_path, json_path
