"""Table headers and cells shared by the Markdown and HTML reports, and the one-line headline.

Everything here reads only :mod:`trtforge.reports.results` records and returns plain strings.
"""

from __future__ import annotations

import math
from typing import Any

from trtforge.reports.results import OK, AccuracyRow, LatencyPoint, LmQuality, LmSpeed, Report, TargetInfo


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


LM_QUALITY_HEADER = [
    "variant", "perplexity", "Δ ppl %", "top-1 agreement", "predicted tokens", "KV bytes/token", "KV dtype",
    "status",
]  # fmt: skip
LM_SPEED_HEADER = ["variant", "batch", "TTFT ms", "ITL ms", "tok/s", "prompt + new", "status"]


def _status(status: str, reason: str | None) -> str:
    return "ok" if status == OK else f"{status}: {reason}"


def lm_quality_cells(q: LmQuality) -> list[str]:
    """Cells of the LLM quality table."""
    delta = "–" if q.delta_ppl_pct is None else f"{q.delta_ppl_pct:+.2f}"
    return [
        q.target, fmt(q.perplexity, ".4f"), delta, fmt(q.top1_agreement, ".4f"), str(q.tokens or "–"),
        fmt(q.kv_bytes_per_token, "d"), q.kv_dtype or "–", _status(q.status, q.reason),
    ]  # fmt: skip


def lm_speed_cells(p: LmSpeed) -> list[str]:
    """Cells of the LLM speed table."""
    shape = "–" if p.prompt_tokens is None else f"{p.prompt_tokens} + {p.new_tokens}"
    return [
        p.target, str(p.batch or "–"), fmt(p.ttft_ms, ".4g"), fmt(p.itl_ms, ".4g"),
        fmt(p.throughput_tok_s, ".4g"), shape, _status(p.status, p.reason),
    ]  # fmt: skip


def headline(report: Report) -> str:
    """One sentence: targets run and accuracy verdicts."""
    s = report.summary()
    t = s["targets"]
    if report.is_lm:
        best = [q for q in report.lm_quality if q.status == OK and q.delta_ppl_pct is not None]
        # by magnitude: a perplexity 3% lower is a larger change than one 0.9% higher (the most positive
        # delta was named "the largest change" whatever the others)
        worst = max(best, key=lambda q: abs(q.delta_ppl_pct or 0.0), default=None)
        tail = f"; largest perplexity change {worst.target} {worst.delta_ppl_pct:+.2f}%" if worst else ""
        return (
            f"{t['ok']} variant(s) ran, {t['failed']} failed, {t['not_run']} not runnable here; "
            f"reference {report.reference}{tail}."
        )
    return (
        f"{t['ok']} target(s) ran, {t['failed']} failed, {t['not_run']} not runnable here; "
        f"accuracy vs {report.reference}: {s['accuracy_passed']} passed, {s['accuracy_failed']} failed, "
        f"{s['accuracy_not_compared']} not compared."
    )
