"""A real engine (TensorRT-RTX builds on the CPU) as the report source: its manifest drives the specs."""

from __future__ import annotations

import json

import pytest

from tests.reports._tiny import classifier_onnx, classifier_weights
from trtforge.cli.main import main


@pytest.mark.trt_build
def test_report_of_a_compiled_engine(tmp_path, capsys):
    w, b = classifier_weights(0)
    model = classifier_onnx(tmp_path / "a.onnx", w, b)
    engine = tmp_path / "a.engine"
    assert main(["compile", str(model), "-o", str(engine), "--shape", "x:1x16:4x16:8x16"]) == 0
    capsys.readouterr()
    out = tmp_path / "report"
    rc = main(["report", str(engine), "-o", str(out), "--batch", "1,8,16", "--runs", "2", "--no-progress"])
    text = capsys.readouterr()
    doc = json.loads((out / "report.json").read_text())
    assert doc["source"]["kind"] == "engine" and doc["settings"]["targets"] == ["ort", "trt"]
    trt = next(t for t in doc["targets"] if t["name"] == "trt")
    # the engine compared with its source ONNX; where it cannot run, nothing was compared: --check fails
    assert rc == (0 if trt["status"] == "ok" else 3), text
    if rc == 3:
        assert "nothing was compared with the reference 'ort'" in text.err
    if trt["status"] == "ok":  # a GPU TensorRT runs on: batch 16 is outside the profile
        points = {p["batch"]: p for p in doc["latency"] if p["target"] == "trt"}
        assert points[16]["status"] == "not_run" and "outside the engine profile" in points[16]["reason"]
    else:
        assert trt["status"] == "not_run" and "cannot run engines here" in trt["reason"]
    ort_points = [p["status"] for p in doc["latency"] if p["target"] == "ort"]
    assert ort_points == ["ok", "ok", "ok"]
