"""Markdown and JSON rendering, and `write_report` (all three files, put in place together).

Everything here reads only a :class:`~trtforge.reports.results.Report`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from trtforge._fileio import (
    atomic_outputs,
    atomic_write_text,
    recover_staged_directory,
    staged_directory,
    write_synced,
)
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


def _md_text(text: object) -> str:
    """`text` as inline Markdown: '&', '<', '>' as entities (a model, tensor or file name holding
    '<script>' is raw HTML to most Markdown viewers), line breaks as spaces (they would end a table row
    or the title)."""
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace("\r", " ").replace("\n", " ")


def _md_code(text: object) -> str:
    """`text` as a Markdown code span whose fence is longer than any run of backticks in it (a name
    holding a backtick would close a one-backtick span and leave the rest as Markdown and HTML)."""
    s = str(text).replace("\r", " ").replace("\n", " ")
    fence = "`" * (max((len(run) for run in re.findall("`+", s)), default=0) + 1)
    pad = " " if s[:1] == "`" or s[-1:] == "`" else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(c: str) -> str:
        return _md_text(c).replace("|", "\\|").replace("`", "\\`")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def lm_sections(report: Report) -> list[str]:
    """The LLM report's quality and speed sections (Markdown)."""
    s = report.settings
    return [
        f"## Quality (vs {_md_code(report.reference)}, text: {_md_text(s.get('accuracy_data'))})",
        _md_table(LM_QUALITY_HEADER, [lm_quality_cells(q) for q in report.lm_quality]),
        "",
        f"## Speed (prompt {s.get('prompt_len')} + {s.get('new_tokens')} new tokens per request, greedy; "
        f"device {_md_text(s.get('device'))})",
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
            f"## Accuracy (vs {_md_code(report.reference)}, inputs: "
            f"{_md_text(report.settings.get('accuracy_data'))})",
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
        f"# {_md_text(report.title)}",
        "",
        f"Source: {report.source['kind']} {_md_code(report.source['label'])} · reference: "
        f"{_md_code(report.reference)} · created {report.created}",
        "",
        _md_text(headline(report)),
        "",
        "## Targets",
        _md_table(TARGET_HEADER, [target_cells(t) for t in report.targets]),
        "",
        *middle,
    ]
    if report.notes:
        parts += ["## Notes", *[f"- {_md_text(n)}" for n in report.notes], ""]
    env = report.environment
    parts += [
        "## Environment",
        f"{_md_text(env.get('cpu'))} ({env.get('cpu_count')} logical CPUs; ISA "
        f"{', '.join((env.get('cpu_isa') or {}).get('isa') or ['unknown'])}), Python {env.get('python')}, "
        + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v),
        "",
    ]
    return "\n".join(parts)


REPORT_FILES = ("report.html", "report.md", "report.json")
# what an earlier run killed while writing into the directory in place left (atomic_open's temp files)
_LEFTOVER = re.compile(r"\.report\.(html|md|json)\..+\.tmp")


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path, Path]:
    """Write report.html, report.md and report.json into `out_dir`; returns their paths.

    A new directory, or one holding only an earlier report, is replaced whole: the new report is
    written into a directory staged beside it, which then takes its place (an interrupted or failed
    run leaves the old report as it was; nothing of it survives a new one). A directory holding other
    files too (not a report's: `-o .`, a build directory) keeps them: the three files are replaced
    together there, and a killed run's leftover temp files are removed (never those of a report being
    written there at the same time).
    """
    where = Path(os.path.abspath(out_dir))  # ('.' has no name to stage a sibling by)
    recover_staged_directory(where)  # an earlier run killed mid-swap: its old report goes back first
    texts = {
        "report.json": report.to_json(),
        "report.md": render_markdown(report),
        "report.html": render_html(report),
    }
    if _only_a_report(where):
        with staged_directory(where) as staged:
            for name, text in texts.items():
                write_synced(staged / name, text.encode("utf-8", "surrogateescape"))
    else:
        # all three or none, even when interrupted; each write first sweeps what a killed writer of that
        # file left (atomic_open: only temp files no live writer holds; a concurrent report's are its own)
        with atomic_outputs():
            for name, text in texts.items():
                atomic_write_text(out_dir / name, text)
    return out_dir / "report.html", out_dir / "report.md", out_dir / "report.json"


def _only_a_report(out_dir: Path) -> bool:
    """Whether `out_dir` may be replaced whole: it does not exist yet, or it is a directory holding
    nothing but what a report writes, and it is neither a mount point, a symlink, nor this process's
    working directory (or above it)."""
    if not os.path.lexists(out_dir):
        return True
    if out_dir.is_symlink() or not out_dir.is_dir() or os.path.ismount(out_dir):
        return False
    here, there = Path.cwd().resolve(), out_dir.resolve()
    if here == there or there in here.parents or not os.access(there.parent, os.W_OK | os.X_OK):
        return False  # (a directory whose parent this process may not write is written in place)
    return all(n in REPORT_FILES or _LEFTOVER.fullmatch(n) for n in os.listdir(out_dir))
