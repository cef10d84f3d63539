"""SIGINT and SIGTERM sent to real `optimize`, `calibrate`, `report` and `export-triton` runs over the
outputs of an earlier run, early, mid-run and near the end (tests/compiler/test_kill.py does `compile`).
Each run exits 130/143 (or 0, or by the signal itself once its work is done and its handlers are gone),
leaves the old outputs or a complete new set (never a mix of runs, never a half-written file) and no
staged file or work directory behind."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.compiler.test_kill import _env, _ours, _slow_onnx

# fractions of an uninterrupted run at which the signal is sent, alternating SIGINT and SIGTERM
FRACTIONS = (0.15, 0.4, 0.6, 0.8, 0.95, 1.1)
CODES = {signal.SIGINT: {0, 130, -signal.SIGINT}, signal.SIGTERM: {0, 143, -signal.SIGTERM}}


def _onnx_ok(d: Path) -> str:
    import onnx

    model = onnx.load(str(d / "out.onnx"))
    onnx.checker.check_model(model)
    return model.SerializeToString().hex()[:64] + str(len(model.SerializeToString()))


def _report_ok(d: Path) -> str:
    """One run's report: all three files, and the html and md carry the json's creation time."""
    rep = d / "rep"
    assert sorted(p.name for p in rep.iterdir()) == ["report.html", "report.json", "report.md"]
    created = json.loads((rep / "report.json").read_text())["created"]
    assert created in (rep / "report.md").read_text(), "report.md is from another run than report.json"
    assert created in (rep / "report.html").read_text(), "report.html is from another run than report.json"
    return created


def _triton_ok(d: Path) -> str:
    model = d / "repo" / "m"
    assert sorted(str(p.relative_to(model)) for p in model.rglob("*")) == [
        "1",
        "1/model.plan",
        "config.pbtxt",
    ]
    assert (model / "1" / "model.plan").read_bytes() == (d.parent / "m.engine").read_bytes()
    text = (model / "config.pbtxt").read_text()
    assert text.rstrip().endswith("}") and 'name: "m"' in text
    return text


def _argv(command: str, root: Path, d: Path) -> tuple[list[str], object]:
    model, out = root / "m.onnx", str(d / "out.onnx")
    return {
        "optimize": (["optimize", str(model), "-o", out, "--force"], _onnx_ok),
        "calibrate": (
            ["calibrate", str(model), "--data", str(root / "calib.npz"), "-o", out, "--force"],
            _onnx_ok,
        ),
        "report": (["report", str(model), "-o", str(d / "rep"), "--targets", "ort,ort-fused"], _report_ok),
        "export-triton": (
            ["export-triton", str(root / "m.engine"), "-o", str(d / "repo"), "--force"],
            _triton_ok,
        ),
    }[command]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trtforge.cli.main", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )


@pytest.mark.parametrize(
    "command",
    ["optimize", "calibrate", "report", pytest.param("export-triton", marks=pytest.mark.trt_build)],
)
def test_signal_at_any_point_leaves_old_or_complete_new_outputs(command, tmp_path) -> None:
    _slow_onnx(tmp_path / "m.onnx", layers=30, width=64)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((16, 8, 64)).astype(np.float32))
    if command == "export-triton":
        build = _run(
            ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.engine"), "-q"],
            _env(tmp_path / "t"),
        )
        assert build.communicate(timeout=300)[0] is not None and build.returncode == 0
    base = tmp_path / "base"
    base.mkdir()
    argv, check = _argv(command, tmp_path, base)
    t0 = time.monotonic()
    first = _run(argv, _env(tmp_path / "tmpbase"))
    log = first.communicate(timeout=300)[0]
    full = time.monotonic() - t0
    assert first.returncode == 0, log
    check(base)
    names = sorted(str(p.relative_to(base)) for p in base.rglob("*"))
    for i, frac in enumerate(FRACTIONS):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        d = tmp_path / f"run{i}"
        shutil.copytree(base, d)
        tmp = tmp_path / f"tmp{i}"
        argv, check = _argv(command, tmp_path, d)
        proc = _run(argv, _env(tmp))
        time.sleep(frac * full)
        proc.send_signal(sig)
        log = proc.communicate(timeout=120)[0]
        where = f"{command}: {sig.name} at {frac:.2f} of {full:.1f}s, rc {proc.returncode}"
        assert proc.returncode in CODES[sig], f"{where}\n{log}"
        if proc.returncode in (130, 143):
            assert "Traceback" not in log, f"{where}\n{log}"
        assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == names, f"{where}: leftovers or losses"
        check(
            d
        )  # complete, whichever run it is from (a signal held back by the publish exits 130/143 after it)
        assert not _ours(tmp), f"{where}: {_ours(tmp)} left in TMPDIR"
