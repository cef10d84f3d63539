"""The rendered report: JSON valid against its schema, Markdown tables, HTML in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.reports._chromium import HEADLESS, dump_dom, needs_chromium
from tests.reports._tiny import classifier_onnx, classifier_weights, token_model_onnx
from trtforge.reports.api import build_report
from trtforge.reports.results import SCHEMA_FILE

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts" / "reports"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A token model (sequence sweep) with one good target, one that fails to load, one not runnable."""
    d = tmp_path_factory.mktemp("render")
    model = token_model_onnx(d / "tokens.onnx")
    broken = d / "broken.onnx"
    broken.write_bytes(b"this is not a protobuf")
    return build_report(
        str(model),
        targets=["ort", "ort-fp16", f"onnx={broken}", "trt"],
        out_dir=d / "out",
        batch_sizes=(1, 2, 4),
        seq_lens=(8, 16),
        warmup=1,
        runs=3,
        progress=False,
    )


def _validator():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the dev extra")
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_json_validates_against_schema(report):
    doc = json.loads(report.json_path.read_text())
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
    assert doc["format"] == "trtforge.report/1"


def test_schema_rejects_a_broken_document(report):
    doc = json.loads(report.json_path.read_text())
    doc["latency"][0]["batch"] = 0
    del doc["accuracy"][0]["status"]
    assert len(list(_validator().iter_errors(doc))) == 2


def test_sweep_covers_batch_and_sequence(report):
    ok = [p for p in report.report.latency if p.target == "ort"]
    assert {(p.batch, p.seq) for p in ok} == {(b, s) for b in (1, 2, 4) for s in (8, 16)}
    for p in ok:
        assert p.status == "ok" and p.p50_ms <= p.p90_ms <= p.p99_ms and p.runs == 3
        assert p.input_shapes == {"input_ids": [p.batch, p.seq], "attention_mask": [p.batch, p.seq]}
        assert p.throughput == pytest.approx(p.batch / (p.mean_ms / 1e3))


def test_markdown_summary(report):
    md = report.markdown_path.read_text()
    for heading in ("## Targets", "## Accuracy", "## Latency"):
        assert heading in md
    assert md.count("\n| target |") == 3
    assert "| ort-fp16 | y (real tokens) |" in md  # generated masks pad; padded positions left out


@needs_chromium
def test_html_in_headless_chromium(report):
    html = report.html_path.read_text()
    assert "http://" not in html and "https://" not in html  # self-contained
    dom = dump_dom(report.html_path)
    assert len(re.findall(r"<table\b", dom)) == 3
    assert set(re.findall(r'<table id="(\w+)"', dom)) == {"targets", "accuracy", "latency"}
    # one latency figure, one error histogram (the one output y)
    assert len(re.findall(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', dom)) == 2
    assert dom.count("<tr") >= 1 + 4 + 1 + 3 + 1 + 12  # header+rows of the three tables, at least
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    subprocess.run(
        [*HEADLESS, "--window-size=1400,2400", f"--screenshot={shot}", report.html_path.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shutil.copy(report.html_path, ARTIFACTS / "report.html")


def test_plots_absent_without_data(tmp_path):
    """Nothing ran (the only ONNX target is broken): the report still renders, with no plot."""
    broken = tmp_path / "b.onnx"
    broken.write_bytes(b"garbage")
    w, b = classifier_weights(0)
    src = classifier_onnx(tmp_path / "a.onnx", w, b)
    result = build_report(
        str(src),
        targets=[f"onnx={broken}"],
        reference=f"onnx={broken}",
        out_dir=tmp_path / "o",
        progress=False,
    )
    html = result.html_path.read_text()
    assert "data:image/png" not in html and "No latency measurements" in html
    assert result.report.targets[0].status == "failed"


def test_markdown_keeps_hostile_names_as_text():
    """Before: a model, tensor or file name holding '<script>' went into report.md as raw HTML (most
    Markdown viewers render it), a backtick in a name closed its code span, a newline broke the title."""
    markdown_it = pytest.importorskip("markdown_it")
    from trtforge.reports.render import render_markdown
    from trtforge.reports.results import AccuracyRow, Report, TargetInfo

    evil = "<script>alert(1)</script>"
    report = Report(
        title=f"trtforge report: {evil}\n# not a heading.onnx",
        created="now",
        source={"kind": "onnx", "label": f"dir/`{evil}`.onnx"},
        reference="ort",
        settings={"accuracy_data": f"{evil}.npz (.npz)"},
        environment={"cpu": "x"},
        targets=[TargetInfo("ort", "onnxruntime", "fp32", "cpu", "", reason="<img src=x onerror=alert(1)>")],
        accuracy=[AccuracyRow("ort-fused", evil, "ort", status="not_compared", reason="a `b` <i>c</i>")],
        latency=[],
        notes=[f"note {evil}"],
    )
    md = render_markdown(report)
    html = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    assert "<script" not in html and "<img" not in html and "<i>" not in html, html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 5, html  # each shown as text
    assert html.count("<h1>") == 1 and md.splitlines()[0].endswith("# not a heading.onnx")


def test_plots_take_names_with_dollar_signs_literally():
    """Before: an output or target name holding two '$' (onnx=/data/$run$/m.onnx, 'y$\\cmd{$') was parsed
    as matplotlib mathtext: an unknown command raised ValueError after every target had run, an internal
    error, and no report was written."""
    from trtforge.reports.plots import error_histograms, latency_plot
    from trtforge.reports.results import AccuracyRow, Histogram, LatencyPoint, Report

    output, target = "y$\\undefinedcmd{$", "onnx=/data/$\\run{$/m.onnx"
    row = AccuracyRow(target, output, "ort$\\x{$", passed=True, max_abs=0.5)
    row.histogram = Histogram(edges=[0.1, 0.2, 0.5], counts=[3, 1], zeros=0)
    point = LatencyPoint(target, 2, None, p50_ms=1.0, p90_ms=1.5, throughput=2000.0)
    report = Report("r", "now", {}, "ort$\\x{$", {}, {}, [], [row], [point])
    ((name, png),) = error_histograms(report)
    assert name == output and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert latency_plot(report)[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.text import Text

    from trtforge.reports.plots import _text

    shown = Text(text=_text(output))
    assert shown._preprocess_math(shown.get_text()) == (output, False)  # drawn as written, not as math


def test_a_concurrent_writers_temp_file_is_left_to_it(tmp_path):
    """Two reports into one directory holding other files: the first to finish deleted every
    '.report.*.tmp' there, the other's live temp files too, and that run died with FileNotFoundError
    (a traceback, exit 1). Now only a killed writer's leftovers go (unlocked and older than a few
    seconds: what atomic_open sweeps), and a live one's stays."""
    import fcntl
    import os

    from trtforge._fileio import DEAD_TEMP_AGE_S
    from trtforge.reports.render import write_report
    from trtforge.reports.results import Report

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.engine").write_bytes(b"keep me")  # (not only a report: written in place)
    live, dead = out / ".report.md.live0001.tmp", out / ".report.md.dead0001.tmp"
    live.write_text("another run writing its report.md")
    dead.write_text("a killed run's half-written report.md")
    old = live.stat().st_mtime - 2 * DEAD_TEMP_AGE_S
    os.utime(dead, (old, old))
    os.utime(live, (old, old))  # (a slow writer's: its lock, not its age, tells it is alive)
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        write_report(Report("r", "now", {"kind": "onnx", "label": "m"}, None, {}, {}, [], [], []), out)
        assert live.read_text() == "another run writing its report.md"
    finally:
        os.close(fd)
    assert not dead.exists()
    assert sorted(p.name for p in out.iterdir()) == [
        live.name, "model.engine", "report.html", "report.json", "report.md"
    ]  # fmt: skip
