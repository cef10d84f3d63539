"""matplotlib figures for the HTML report, returned as PNG bytes (Agg backend, no pyplot state)."""

from __future__ import annotations

import io
import math
from collections import defaultdict

from trtforge.reports.results import OK, Report


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return buf.getvalue()


def _text(name: str) -> str:
    """A target or output name as literal matplotlib text: every '$' escaped, so a name holding two is
    not parsed as mathtext (an unknown command in it raised ValueError and no report was written)."""
    return name.replace("$", r"\$")


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def latency_plot(report: Report) -> bytes | None:
    """p50 latency (p90 as the upper whisker) and throughput vs batch, one line per target and sequence."""
    series: dict[str, list] = defaultdict(list)
    for p in report.latency:
        if p.status == OK and p.p50_ms is not None:
            label = _text(p.target) if p.seq is None else f"{_text(p.target)} (seq {p.seq})"
            series[label].append(p)
    if not series:
        return None
    fig = _figure(11, 4.2)
    ax_lat, ax_thr = fig.subplots(1, 2)
    for label, points in sorted(series.items()):
        points.sort(key=lambda p: p.batch)
        xs = [p.batch for p in points]
        p50 = [p.p50_ms for p in points]
        upper = [max((p.p90_ms or p.p50_ms) - p.p50_ms, 0.0) for p in points]
        ax_lat.errorbar(xs, p50, yerr=[[0.0] * len(xs), upper], marker="o", capsize=3, label=label)
        ax_thr.plot(xs, [p.throughput for p in points], marker="o", label=label)
    for ax, ylabel in ((ax_lat, "latency p50 (ms), whisker p90"), (ax_thr, "throughput (samples/s)")):
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    ax_lat.set_yscale("log")
    ax_thr.set_yscale("log")
    ax_lat.set_title("Latency vs batch")
    ax_thr.set_title("Throughput vs batch")
    ax_thr.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _png(fig)


def error_histograms(report: Report) -> list[tuple[str, bytes]]:
    """One figure per output: absolute-error histograms of every compared target (log x axis)."""
    by_output: dict[str, list] = defaultdict(list)
    for row in report.accuracy:
        if row.status == OK and row.histogram is not None and row.histogram.counts:
            by_output[row.output].append(row)
    figures = []
    for output, rows in by_output.items():
        fig = _figure(7, 3.6)
        ax = fig.subplots()
        for row in rows:
            h = row.histogram
            ax.stairs(h.counts, h.edges, label=f"{_text(row.target)} (max {row.max_abs:.2g})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"|target - {_text(report.reference)}|")
        ax.set_ylabel("elements")
        ax.set_title(f"Absolute error: {_text(output)}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        figures.append((output, _png(fig)))
    return figures


def lm_quality_plot(report: Report) -> bytes | None:
    """Perplexity (bars, reference dashed) and top-1 agreement with the reference, per LLM variant
    (an infinite perplexity, which matplotlib cannot draw, stays in the tables only)."""
    rows = [q for q in report.lm_quality if q.status == OK and q.perplexity is not None]
    rows = [q for q in rows if math.isfinite(q.perplexity)]
    if not rows:
        return None
    fig = _figure(11, 3.8)
    ax_ppl, ax_agree = fig.subplots(1, 2)
    names = [q.target for q in rows]
    ax_ppl.bar(names, [q.perplexity for q in rows], color="#4c72b0")
    ref = next((q.perplexity for q in rows if q.target == report.reference), None)
    if ref is not None:
        ax_ppl.axhline(ref, color="k", linestyle="--", linewidth=1, label=f"{report.reference} {ref:.3f}")
        ax_ppl.legend(fontsize=8)
        low, high = min(q.perplexity for q in rows), max(q.perplexity for q in rows)
        ax_ppl.set_ylim(low - 0.2 * (high - low + 1e-3) - 0.02 * low, high + 0.2 * (high - low + 1e-3))
    agree = [q for q in rows if q.top1_agreement is not None]
    ax_agree.bar([q.target for q in agree], [q.top1_agreement for q in agree], color="#55a868")
    ax_agree.set_ylim(0, 1)
    ax_ppl.set_ylabel("perplexity")
    ax_agree.set_ylabel(f"top-1 agreement with {report.reference}")
    ax_ppl.set_title("Perplexity on the text")
    ax_agree.set_title("Greedy top-1 agreement")
    for ax in (ax_ppl, ax_agree):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    return _png(fig)


def lm_speed_plot(report: Report) -> bytes | None:
    """TTFT, inter-token latency and throughput vs batch size, one line per serving variant."""
    series: dict[str, list] = defaultdict(list)
    for p in report.lm_speed:
        if p.status == OK and p.throughput_tok_s is not None:
            series[p.target].append(p)
    if not series:
        return None
    fig = _figure(13, 3.8)
    axes = fig.subplots(1, 3)
    for label, points in sorted(series.items()):
        points.sort(key=lambda p: p.batch)
        xs = [p.batch for p in points]
        for ax, values in zip(
            axes,
            ([p.ttft_ms for p in points], [p.itl_ms for p in points], [p.throughput_tok_s for p in points]),
        ):
            ax.plot(xs, values, marker="o", label=label)
    for ax, ylabel in zip(axes, ("TTFT ms (median)", "inter-token latency ms", "output tokens/s")):
        ax.set_xlabel("batch size (concurrent requests)")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _png(fig)
