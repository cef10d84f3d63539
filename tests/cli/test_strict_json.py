"""Every JSON document trtforge writes is strict JSON: no NaN / Infinity words, which Python's json writes
by default and strict readers (jq, JavaScript's JSON.parse, Go) refuse. Non-finite numbers are null."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.models import tiny_onnx
from trtforge.cli.main import main


def _strict(text: str) -> object:
    """Parse `text` as a strict reader does: the words NaN, Infinity and -Infinity are refused."""

    def refuse(word: str) -> None:
        raise ValueError(f"not strict JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def test_json_text_writes_non_finite_numbers_as_null() -> None:
    from trtforge._fileio import json_text

    doc = {"a": float("nan"), "b": [float("inf"), -math.inf, 1.5], "c": {"d": np.float64("nan")}}
    assert _strict(json_text(doc)) == {"a": None, "b": [None, None, 1.5], "c": {"d": None}}


def test_a_manifest_holding_nan_is_written_strict_and_an_old_one_is_still_read(tmp_path: Path) -> None:
    """Before: Manifest.to_json wrote a NaN timing or an infinite error figure as the bare words NaN /
    Infinity (the .engine.json a strict reader could not parse). Now they are null; a manifest written
    before, holding those words, is still read."""
    from trtforge._fileio import sha256_bytes
    from trtforge.core.manifest import publish_engine, read_manifest
    from trtforge.runtime.standin import standin_manifest

    data = b"engine bytes" * 4
    out = tmp_path / "m.engine"
    m = standin_manifest(streams=1)
    m.engine_file, m.engine_bytes, m.engine_sha256 = out.name, len(data), sha256_bytes(data)
    m.timings = {"build": float("nan")}
    m.records = {"precision": {"max_rel_error": float("inf"), "snr_db": -math.inf}}
    publish_engine(out, data, m)
    text = (tmp_path / "m.engine.json").read_text()
    doc = _strict(text)
    assert doc["timings"] == {"build": None}
    assert doc["records"]["precision"] == {"max_rel_error": None, "snr_db": None}

    old = json.loads(text)  # as a manifest of an earlier trtforge wrote it
    old["timings"] = {"build": float("nan")}
    old["records"]["precision"]["max_rel_error"] = float("inf")
    (tmp_path / "m.engine.json").write_text(json.dumps(old, indent=2))
    assert "NaN" in (tmp_path / "m.engine.json").read_text()
    back = read_manifest(out)
    assert math.isnan(back.timings["build"]) and back.records["precision"]["max_rel_error"] == math.inf


def test_the_optimize_ledger_is_strict_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a non-finite figure in the pass ledger (a verification error of an output that overflows)
    was written as NaN / Infinity in --ledger's file."""
    from trtforge.passes._base import PassLedger

    real = PassLedger.to_dict
    monkeypatch.setattr(PassLedger, "to_dict", lambda self: {**real(self), "figure": float("nan")})
    model = tiny_onnx(tmp_path / "m.onnx")
    ledger = tmp_path / "ledger.json"
    argv = ["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--ledger", str(ledger)]
    assert main(argv) == 0
    doc = _strict(ledger.read_text())
    assert doc["figure"] is None and doc["passes"]


def _matmul_onnx(path: Path) -> Path:
    """x[B,32] @ W[32,32]: a MatMul large enough to quantize."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_the_calibration_report_is_strict_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `calibrate --report` wrote a non-finite accuracy figure (an SNR of an exact match is
    infinite) as Infinity."""
    from trtforge.calibration.api import CalibrationRecord

    real = CalibrationRecord.to_dict
    monkeypatch.setattr(
        CalibrationRecord, "to_dict", lambda self: {**real(self), "accuracy": {"snr_db": math.inf}}
    )
    model = _matmul_onnx(tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32))
    report = tmp_path / "calib.json"
    argv = ["calibrate", str(model), "--data", str(tmp_path / "c.npz"), "-o", str(tmp_path / "q.onnx")]
    assert main([*argv, "--report", str(report), "--quiet"]) == 0
    doc = _strict(report.read_text())
    assert doc["accuracy"] == {"snr_db": None} and doc["method"]


def test_step_graph_generation_metadata_is_strict_json_and_an_old_one_is_still_read() -> None:
    """Before: set_generation_metadata wrote with json.dumps, so a step graph of a gpt-oss whose attention
    sink is -inf (a head with no sink, which refuse_nan_weights lets be) carried the word -Infinity in its
    ``trtforge.generation`` metadata, which a strict reader refuses. Now it is null, as in the manifest's
    copy; a graph written before, holding the words, is still read."""
    import onnx

    from trtforge.llm.contract import METADATA_KEY, generation_metadata, set_generation_metadata

    proto = onnx.ModelProto()
    set_generation_metadata(proto, {"max_seq": 16, "attn_sinks": [[-math.inf, 1.5]], "x": float("nan")})
    text = next(p.value for p in proto.metadata_props if p.key == METADATA_KEY)
    assert _strict(text) == {"max_seq": 16, "attn_sinks": [[None, 1.5]], "x": None}
    assert generation_metadata(proto, "step.onnx")["attn_sinks"] == [[None, 1.5]]

    old = onnx.ModelProto()
    old.metadata_props.add(key=METADATA_KEY, value='{"max_seq": 16, "attn_sinks": [[-Infinity, 1.5]]}')
    assert generation_metadata(old, "old.onnx")["attn_sinks"] == [[-math.inf, 1.5]]
