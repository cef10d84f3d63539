"""Issue #15 acceptance: a BERT with 64 positions compiles and reports within its limits, a range it
cannot run is refused with exit 2 before the build, and the API and the CLI record the same build for
the same request."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.compiler._shape_models import broadcast_model
from tests.models import bert64_factory, bert_inputs
from trtforge.cli.main import main

FACTORY = "tests.models:bert64_factory"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


@pytest.fixture
def no_builder(monkeypatch):
    """Fail the test if the TensorRT builder starts (the check must stop the compile before it)."""
    import trtforge.compiler.build as build

    def refuse(*_a, **_k):
        raise AssertionError("the builder ran")

    monkeypatch.setattr(build, "_progress", refuse)


@pytest.mark.trt_build
@pytest.mark.slow
def test_bert64_dynamic_profile_stays_within_its_positions(tmp_path, capsys) -> None:
    out = tmp_path / "b.engine"
    rc, text = _run(["compile", FACTORY, "-o", str(out), "--dynamic", "batch,seq"], capsys)
    assert rc == 0, text
    m = json.loads((tmp_path / "b.engine.json").read_text())
    for name, rng in m["profiles"][0].items():
        assert rng["max"][1] <= 64 and rng["min"][1] >= 1, (name, rng)
    limits = m["records"]["build"]["shape_limits"]["input_ids"]["1"]
    assert limits["max"] == 64 and "max_position_embeddings" in limits["source"]
    assert m["records"]["build"]["shape_check"]["ran"] == ["MIN", "MAX"]
    assert "--shape input_ids:1x1:2x8:32x64" in text  # the derived range, printed in --shape syntax


@pytest.mark.trt_build
@pytest.mark.slow
def test_bert64_shape_beyond_positions_exit_2_before_build(tmp_path, capsys, no_builder) -> None:
    argv = ["compile", FACTORY, "-o", str(tmp_path / "b.engine"), "--dynamic", "batch,seq"]
    rc, text = _run([*argv, "--shape", "input_ids:1x1:2x16:4x128"], capsys)
    assert rc == 2, text
    assert "--shape input_ids: dim 1 ranges 1..128, but the model takes at most 64" in text
    assert "--shape input_ids:1x1:2x16:4x64" in text and "Traceback" not in text
    assert "running stage" not in text  # refused right after export, before the graph stages
    assert not list(tmp_path.iterdir())


@pytest.mark.trt_build
def test_shape_max_the_model_cannot_run_exit_2_before_build(tmp_path, capsys, no_builder) -> None:
    """No limit is visible in this graph: running it in ONNX Runtime at MAX finds it."""
    model = tmp_path / "b.onnx"
    broadcast_model(model, width=64)
    # --no-passes: pass verification feeds its own lengths, which this graph does not take either
    argv = [
        "compile",
        str(model),
        "-o",
        str(tmp_path / "b.engine"),
        "--no-passes",
        "--shape",
        "x:1x1:1x64:1x128",
    ]
    rc, text = _run(argv, capsys)
    assert rc == 2, text
    assert "cannot run at the profile's MAX shapes (x 1x128)" in text and "--shape x:1x1:1x64:1x64" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.onnx"]


@pytest.mark.trt_build
@pytest.mark.slow
def test_bert64_report_runs_every_cpu_target(tmp_path, capsys) -> None:
    argv = ["report", FACTORY, "-o", str(tmp_path / "r"), "--batch", "1,2", "--runs", "1", "--warmup", "0"]
    rc, text = _run([*argv, "--no-progress"], capsys)
    assert rc == 0, text
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    status = {t["name"]: (t["status"], t.get("reason")) for t in doc["targets"]}
    for name in ("torch", "ort", "ort-fused", "ort-fp16", "ort-int8"):
        assert status[name][0] == "ok", (name, status[name])
    for t in doc["targets"]:
        assert t["status"] == "ok" or t["kind"] == "tensorrt", t
    assert all(shape["input_ids"][1] <= 64 for shape in doc["settings"]["accuracy_input_shapes"])
    assert any("at most 64 (config.max_position_embeddings = 64" in n for n in doc["notes"])
    ran = [p for p in doc["latency"] if p["status"] == "ok"]
    assert ran and all(p["seq"] <= 64 for p in ran)
    targets = {t["name"]: t for t in doc["targets"]}
    assert targets["ort-fused"]["records"]["attention"] == "none"  # FP32 graph: attention decomposed
    assert targets["ort-fp16"]["derived_from"] == "ort-fused@native"
    assert targets["ort-int8"]["records"]["int8_rest"] == "fp16"


@pytest.mark.trt_build
@pytest.mark.slow
def test_api_and_cli_record_the_same_build_for_the_same_request(tmp_path, capsys) -> None:
    """INT8 through `trtforge.compile` and through `trtforge compile`: same precision, same options."""
    import trtforge
    from trtforge.compiler.stages import PrecisionOptions

    calib = tmp_path / "calib.npz"
    np.savez(calib, **{k: v.numpy() for k, v in bert_inputs(4, 8).items()})
    cli_engine = tmp_path / "cli.engine"
    argv = ["compile", FACTORY, "-o", str(cli_engine), "--dynamic", "batch,seq", "-q"]
    rc, text = _run([*argv, "--precision", "int8", "--calib-data", str(calib)], capsys)
    assert rc == 0, text
    cli = json.loads((tmp_path / "cli.engine.json").read_text())
    module, example = bert64_factory()
    api = trtforge.compile(
        module,
        example,
        tmp_path / "api.engine",
        dynamic="batch,seq",
        precision=PrecisionOptions(mode="int8", calib_data=str(calib), progress=False),
        progress=False,
    ).manifest
    assert api.build_options == cli["build_options"]
    assert api.precision == cli["precision"]
    assert api.precision["int8_rest"] == "fp16" and api.precision["attention"] == "native"
    assert [{k: dataclasses.asdict(v) for k, v in p.items()} for p in api.profiles] == cli["profiles"]
    assert api.records["build"]["shape_limits"] == cli["records"]["build"]["shape_limits"]
    assert api.records["passes"]["attention"] == cli["records"]["passes"]["attention"] == "native"
    assert api.records["build"]["layer_types"] == cli["records"]["build"]["layer_types"]
