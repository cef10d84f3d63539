"""The self-contained HTML report: inline CSS, tables, and plots embedded as base64 PNG."""

from __future__ import annotations

import base64
import html
import json

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
from trtforge.reports.plots import error_histograms, latency_plot, lm_quality_plot, lm_speed_plot
from trtforge.reports.results import OK, Report

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { background: #e3f6e3; } .fail { background: #fbe0e0; } .skip { background: #f3f3f3; color: #666; }
.reason { max-width: 36em; font-size: 0.95em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.4em 0; }
.meta { color: #555; }
"""
_CLASS = {
    "PASS": "pass",
    "OK": "pass",
    "FAIL": "fail",
    "FAILED": "fail",
    "NOT RUN": "skip",
    "NOT_RUN": "skip",
    "NOT COMPARED": "skip",
}


def _table(table_id: str, header: list[str], rows: list[list[str]], status_col: int | None) -> str:
    out = [f'<table id="{table_id}"><thead><tr>']
    out += [f"<th>{html.escape(h)}</th>" for h in header]
    out.append("</tr></thead><tbody>")
    for row in rows:
        cls = _CLASS.get(row[status_col].split(":")[0].upper(), "") if status_col is not None else ""
        out.append(f'<tr class="{cls}">' if cls else "<tr>")
        for cell in row:
            kind = "num" if cell[:1].isdigit() or (cell[:1] == "-" and cell[1:2].isdigit()) else "reason"
            out.append(f'<td class="{kind}">{html.escape(cell)}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _lm_body(report: Report) -> list[str]:
    """The LLM report's quality and speed sections, with their plots."""
    e = html.escape
    s = report.settings
    body = [
        f"<h2>Quality vs {e(str(report.reference))}</h2>",
        f'<p class="meta">Text: {e(str(s.get("accuracy_data")))}; {s.get("accuracy_iterations")} windows of '
        f"{s.get('window_len')} tokens (starts {e(str(s.get('window_starts')))}). Δ ppl = perplexity / "
        "reference − 1; top-1 agreement = positions whose argmax is the reference's.</p>",
    ]
    png = lm_quality_plot(report)
    if png is not None:
        body.append(_img(png, "perplexity and top-1 agreement per variant"))
    body.append(_table("quality", LM_QUALITY_HEADER, [lm_quality_cells(q) for q in report.lm_quality], 7))
    body.append(
        f"<h2>Speed</h2><p class='meta'>B requests of {s.get('prompt_len')} prompt tokens submitted at once, "
        f"{s.get('new_tokens')} greedy tokens each, on {e(str(s.get('device')))}. TTFT = median time to the "
        "first token; ITL = mean time between a request's tokens; tok/s = generated tokens / wall time.</p>"
    )
    png = lm_speed_plot(report)
    if png is not None:
        body.append(_img(png, "TTFT, inter-token latency and throughput vs batch size"))
    body.append(
        _table("speed", LM_SPEED_HEADER, [lm_speed_cells(p) for p in report.lm_speed], 6)
        if report.lm_speed
        else "<p>No speed measurements.</p>"
    )
    return body


def _head(report: Report) -> list[str]:
    e = html.escape
    return [
        f"<h1>{e(report.title)}</h1>",
        f'<p class="meta">Source: {e(report.source["kind"])} <code>{e(report.source["label"])}</code> · '
        f"reference <code>{e(str(report.reference))}</code> · created {e(report.created)}</p>",
        f"<p><strong>{e(headline(report))}</strong></p>",
        "<h2>Targets</h2>",
        _table("targets", TARGET_HEADER, [target_cells(t) for t in report.targets], 4),
    ]


def _encoder_body(report: Report) -> list[str]:
    e = html.escape
    s = report.settings
    body = [
        f"<h2>Accuracy vs {e(str(report.reference))}</h2>",
        f'<p class="meta">Inputs: {e(str(s.get("accuracy_data")))}; '
        f"{s.get('accuracy_iterations')} iteration(s). Relative errors are relative to the reference; "
        "rel L2 = ||t − r|| / ||r||; SNR = reference power over error power.</p>",
        _table("accuracy", ACCURACY_HEADER, [accuracy_cells(r) for r in report.accuracy], 13)
        if report.accuracy
        else "<p>No accuracy comparisons.</p>",
    ]
    hists = error_histograms(report)
    if hists:
        body.append("<h2>Error histograms</h2>")
        body += [_img(png, f"absolute error histogram of {name}") for name, png in hists]
    body.append(
        f"<h2>Latency</h2><p class='meta'>Warm-up {s.get('warmup')}, {s.get('runs')} timed runs per point; "
        "throughput = batch / mean latency.</p>"
    )
    lat = latency_plot(report)
    if lat is not None:
        body.append(_img(lat, "latency and throughput vs batch size"))
    body.append(
        _table("latency", LATENCY_HEADER, [latency_cells(p) for p in report.latency], 9)
        if report.latency
        else "<p>No latency measurements.</p>"
    )
    return body


def _tail(report: Report) -> list[str]:
    e = html.escape
    threads = {t.name: t.threads for t in report.targets if t.threads}
    records = {t.name: t.records for t in report.targets if t.records}
    body = []
    if report.notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in report.notes) + "</ul>")
    body.append("<h2>Environment and settings</h2>")
    for label, obj in (
        ("environment", report.environment),
        ("settings", report.settings),
        ("threads", threads),
        ("preparation records", records),
    ):
        body.append(f"<h3>{label}</h3><pre>{e(json.dumps(obj, indent=2, default=str))}</pre>")
    return body


def render_html(report: Report) -> str:
    """One HTML page holding everything (no external resources): an output comparison, or an LLM
    report's quality and speed."""
    e = html.escape
    middle = _lm_body(report) if report.is_lm else _encoder_body(report)
    body = [*_head(report), *middle, *_tail(report)]
    ok = sum(t.status == OK for t in report.targets)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{e(report.title)} ({ok}/{len(report.targets)} targets ran)</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
