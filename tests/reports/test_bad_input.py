"""Bad input never stops the report: the row of the target that rejects it says why."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from onnx import TensorProto

from tests.reports._tiny import FEATURES, by_fours_onnx, classifier_onnx, classifier_weights, inputs_npz
from trtforge._fileio import sha256_bytes
from trtforge.core.manifest import Manifest, ShapeRange, TensorSpec, write_manifest
from trtforge.errors import UserError
from trtforge.reports.api import build_report
from trtforge.reports.results import SCHEMA_FILE

FAST = {"batch_sizes": (2,), "warmup": 0, "runs": 1, "progress": False}


@pytest.fixture
def model_a(tmp_path):
    w, b = classifier_weights(0)
    return classifier_onnx(tmp_path / "a.onnx", w, b)


def _valid(path) -> dict:
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))
    return doc


def test_inputs_that_do_not_match_one_target(tmp_path, model_a):
    w, b = classifier_weights(0)
    doubles = classifier_onnx(tmp_path / "d.onnx", w, b, input_dtype=TensorProto.DOUBLE)
    inputs_npz(tmp_path / "x.npz")  # float32 x: right for a.onnx, wrong dtype for d.onnx
    target = f"onnx={doubles}"
    r = build_report(
        str(model_a), targets=["ort", target], data=tmp_path / "x.npz", out_dir=tmp_path / "o", **FAST
    )
    doc = _valid(r.json_path)
    info = next(t for t in doc["targets"] if t["name"] == target)
    assert info["status"] == "failed" and "dtype" in info["reason"].lower()
    row = next(a for a in doc["accuracy"] if a["target"] == target)
    assert row["status"] == "not_compared" and "dtype" in row["reason"].lower()
    # its own generated float64 inputs still time it
    assert [p["status"] for p in doc["latency"] if p["target"] == target] == ["ok"]
    assert target in r.html_path.read_text()


def test_data_missing_an_input(tmp_path, model_a):
    np.savez(tmp_path / "z.npz", z=np.zeros((2, FEATURES), np.float32))
    r = build_report(
        str(model_a), targets=["ort", "ort-fp16"], data=tmp_path / "z.npz", out_dir=tmp_path / "o", **FAST
    )
    doc = _valid(r.json_path)
    (row,) = doc["accuracy"]
    assert row["status"] == "not_compared" and "reference 'ort' did not run" in row["reason"]
    assert "'x'" in row["reason"] or "x" in row["reason"]
    assert doc["summary"]["all_passed"] is False


def test_target_that_fails_to_load(tmp_path, model_a):
    from onnx import helper, save

    g = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["logits"], domain="com.example")],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    save(m, str(tmp_path / "bad.onnx"))
    target = f"onnx={tmp_path / 'bad.onnx'}"
    r = build_report(str(model_a), targets=["ort", target], out_dir=tmp_path / "o", **FAST)
    doc = _valid(r.json_path)
    info = next(t for t in doc["targets"] if t["name"] == target)
    assert info["status"] == "failed" and "NoSuchOp" in info["reason"]
    assert next(a for a in doc["accuracy"] if a["target"] == target)["status"] == "not_compared"
    assert doc["targets"][0]["status"] == "ok"


def test_engine_source_that_cannot_run_here(tmp_path, model_a):
    """An engine (with manifest) as the source: the ort row runs its source ONNX; trt says why not.

    The engine bytes are not an engine: this tests the report's handling, nothing is executed as one.
    Where a runnable TensorRT exists, deserializing them fails and the row says so instead.
    """
    engine = tmp_path / "a.engine"
    engine.write_bytes(b"not a real engine")
    manifest = Manifest(
        engine_file=engine.name,
        engine_sha256=sha256_bytes(engine.read_bytes()),
        engine_bytes=engine.stat().st_size,
        backend={"name": "tensorrt_rtx", "version": "1.7.1"},
        inputs=[TensorSpec("x", "float32", [-1, FEATURES])],
        outputs=[TensorSpec("logits", "float32", [-1, 10])],
        profiles=[{"x": ShapeRange([1, FEATURES], [4, FEATURES], [4, FEATURES])}],
        source={"kind": "onnx", "path": str(model_a)},
        trtforge_version="0.1.0",
    )
    write_manifest(manifest, engine)
    r = build_report(
        str(engine), out_dir=tmp_path / "o", batch_sizes=(2, 8), warmup=0, runs=1, progress=False
    )
    doc = _valid(r.json_path)
    assert doc["source"]["kind"] == "engine" and doc["settings"]["targets"] == ["ort", "trt"]
    trt = next(t for t in doc["targets"] if t["name"] == "trt")
    assert trt["status"] in ("not_run", "failed") and trt["reason"]
    assert next(a for a in doc["accuracy"] if a["target"] == "trt")["status"] == "not_compared"


def test_bad_arguments_are_user_errors(tmp_path, model_a):
    with pytest.raises(UserError, match="unknown report target 'ort-fp8'"):
        build_report(str(model_a), targets=["ort-fp8"], out_dir=tmp_path / "o", progress=False)
    with pytest.raises(UserError, match="does not exist"):
        build_report(str(tmp_path / "nope.onnx"), out_dir=tmp_path / "o", progress=False)
    with pytest.raises(UserError, match="batch sizes"):
        build_report(str(model_a), batch_sizes=(0,), out_dir=tmp_path / "o", progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        build_report(str(model_a), out_dir=tmp_path / "file", progress=False)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data": "missing.npz"}, r"--data '.*missing\.npz' does not exist"),
        ({"calibration_data": "missing.npz"}, r"--calib-data '.*missing\.npz' does not exist"),
        ({"tolerances": {"no_such_output": {"atol": 1.0}}}, r"the model has no output 'no_such_output'"),
        ({"tolerances": {"trt-zz/": {"atol": 1.0}}}, r"no target 'trt-zz' in this report"),
    ],
    ids=["missing data", "missing calibration data", "tolerance for an unknown output", "unknown target"],
)
def test_bad_arguments_fail_without_leaving_a_report_directory(tmp_path, model_a, kwargs, message):
    """Before: a missing --data surfaced as 'calibration data' and left the new report directory behind;
    a tolerance for an output or target the report lacks checked nothing."""
    with pytest.raises(UserError, match=message):
        build_report(str(model_a), targets=["ort", "ort-fp16"], out_dir=tmp_path / "o", **kwargs, **FAST)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("reference", ["ort", "onnx", "torch"])
def test_a_tolerance_for_an_unknown_output_is_refused_before_any_target_is_prepared(
    tmp_path, model_a, monkeypatch, reference
):
    """Before: the key was checked against the reference's outputs once every target had been prepared
    and run (INT8 calibration, engine builds and the latency sweep: minutes), then refused."""
    from tests.reports._tiny import mlp_factory
    from trtforge.reports.targets import Preparer

    prepared: list[str] = []
    real = Preparer.prepare
    monkeypatch.setattr(Preparer, "prepare", lambda self, name: prepared.append(name) or real(self, name))
    source, targets, ref, output = {
        "ort": (str(model_a), ["ort", "ort-fp16"], "ort", "logits"),
        "onnx": (str(model_a), ["ort", f"onnx={model_a}"], f"onnx={model_a}", "logits"),
        "torch": (mlp_factory(), ["torch", "ort"], "torch", "output_0"),  # (named by the export)
    }[reference]
    kw = {**FAST, "targets": targets, "reference": ref, "out_dir": tmp_path / "o"}
    for key, message in (("logit", "has no output 'logit'"), ("ort-fp8/", "no target 'ort-fp8'")):
        with pytest.raises(UserError, match=message):
            build_report(source, tolerances={key: {}}, **kw)
    assert prepared == [] and not (tmp_path / "o").exists()
    r = build_report(source, tolerances={output: {}}, **kw)
    assert prepared == targets and r.report.accuracy[0].output == output


def test_a_tokenizer_nothing_reads_is_refused(tmp_path, model_a):
    """Before: a tokenizer given where no text file of sentences was (arrays, or generated inputs) was
    dropped without a word: the report measured other inputs than the sentences meant."""
    from trtforge.reports.api import _check_tokenizer_read

    inputs_npz(tmp_path / "x.npz")
    (tmp_path / "s.txt").write_text("a sentence\n")
    npz, text = str(tmp_path / "x.npz"), str(tmp_path / "s.txt")
    for data, calibration in ((text, None), (npz, text), (None, text)):
        _check_tokenizer_read("demo", data, calibration)  # read: no error
    _check_tokenizer_read(None, npz, None)
    with pytest.raises(UserError, match=r"and no --data or --calib-data is given \(inputs are generated"):
        build_report(str(model_a), targets=["ort"], tokenizer="demo", out_dir=tmp_path / "o", **FAST)
    with pytest.raises(
        UserError, match=rf"and --data '{re.escape(npz)}' is not one \(arrays or module:function\)"
    ):
        build_report(str(model_a), targets=["ort"], data=npz, tokenizer="t", out_dir=tmp_path / "o", **FAST)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text", ["y:atol=nan", "y:rtol=-1", ":cosine=2", "y:top1=1.5", "y:snr=nan"])
def test_tolerance_values_outside_their_range_are_refused(text):
    from trtforge.reports.compare import parse_tolerance

    with pytest.raises(UserError, match=r"must be in \["):
        parse_tolerance(text)


@pytest.mark.parametrize("as_npz", [True, False])
def test_accuracy_data_without_samples_is_refused(tmp_path, model_a, as_npz):
    """Before: an internal error from the cosine of zero rows, after every target had run."""
    empty = {"x": np.zeros((0, FEATURES), np.float32)}
    if as_npz:
        np.savez(tmp_path / "e.npz", **empty)
    data = str(tmp_path / "e.npz") if as_npz else empty
    with pytest.raises(UserError, match=r"input 'x' has shape \[0, \d+\], no samples on its first axis"):
        build_report(str(model_a), targets=["ort"], data=data, out_dir=tmp_path / "o", **FAST)
    assert not (tmp_path / "o").exists()


def test_tolerances_of_outputs_named_with_a_slash(tmp_path):
    """Before: an output named 'enc/out:0' (tf2onnx's and many exporters' style) could get no tolerance:
    '--tolerance enc/out:0:...' read 'enc' as a target and 'ort-fused/enc/out:0' read 'ort-fused/enc'
    ("no target ... in this report", exit 2); keys are now matched whole, as they are looked up."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["enc/out:0"])],
        "slash",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("enc/out:0", TensorProto.FLOAT, ["N", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    kw = {**FAST, "targets": ["ort", "ort-fused"]}
    for key, atol in (("enc/out:0", 0.5), ("ort-fused/enc/out:0", 0.25)):
        r = build_report(tmp_path / "m.onnx", out_dir=tmp_path / "o", tolerances={key: {"atol": atol}}, **kw)
        (row,) = r.report.accuracy
        assert (row.output, row.tolerance.atol, row.passed) == ("enc/out:0", atol, True)
    with pytest.raises(UserError, match=r"the model has no output 'enc/out'"):
        build_report(tmp_path / "m.onnx", out_dir=tmp_path / "o", tolerances={"ort-fused/enc/out": {}}, **kw)
    with pytest.raises(UserError, match=r"no target 'enc'"):
        build_report(tmp_path / "m.onnx", out_dir=tmp_path / "o", tolerances={"enc/x": {}}, **kw)


def test_fused_targets_verify_at_the_sizes_the_report_feeds(tmp_path):
    """Before: ort-fused's pass verification fed its own small generated sizes ([2, 7] here), which a
    model running only at some lengths rejects: the target failed (its row told the user to pass
    `compile --shape` or --no-verify, options report does not have) although the report's own
    accuracy inputs run. Verification now falls back to the accuracy feeds' shapes."""
    by_fours_onnx(tmp_path / "m.onnx")
    r = build_report(
        tmp_path / "m.onnx", targets=["ort", "ort-fused", "ort-fp16"], out_dir=tmp_path / "o",
        seq_lens=(8,), **FAST,
    )  # fmt: skip
    assert [(t.name, t.status) for t in r.report.targets] == [
        ("ort", "ok"), ("ort-fused", "ok"), ("ort-fp16", "ok"),
    ], [t.reason for t in r.report.targets]  # fmt: skip
    assert [(a.target, a.passed) for a in r.report.accuracy] == [("ort-fused", True), ("ort-fp16", True)]


def test_repeated_sweep_sizes_are_measured_once(tmp_path, model_a):
    """Before: --batch 2,2 (or a repeated --seq) measured every point twice: duplicate latency rows."""
    kw = {**FAST, "batch_sizes": (2, 1, 2)}
    r = build_report(str(model_a), targets=["ort"], out_dir=tmp_path / "o", **kw)
    assert [(p.batch, p.seq) for p in r.report.latency] == [(2, None), (1, None)]
    assert r.report.settings["batch_sizes"] == [2, 1]


def test_a_model_without_inputs(tmp_path):
    """Before: a graph with no inputs (a constant, a stored table) had empty specs, read as 'no specs':
    no accuracy feeds were made, and comparing the reference's zero runs raised IndexError, an internal
    error after every target had run."""
    import onnx
    from onnx import helper, numpy_helper

    from trtforge.reports.compare import compare_target
    from trtforge.reports.results import TargetRun

    table = numpy_helper.from_array(np.arange(3, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=table)],
        "constant",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = build_report(tmp_path / "m.onnx", targets=["ort", "ort-fused"], out_dir=tmp_path / "o", **FAST)
    assert [(a.target, a.output, a.passed) for a in r.report.accuracy] == [("ort-fused", "y", True)]
    (row,) = compare_target(TargetRun("ort", []), TargetRun("t", []), "fp32")
    assert row.status == "not_compared" and "no accuracy inputs" in row.reason


def test_a_torch_export_archive_is_refused_as_what_it_is(tmp_path):
    """Before: a .pt2 source was read as an engine without its manifest: "'m.pt2' is a model, not an
    engine". The message now says report does not take torch.export archives, and what to pass."""
    archive = tmp_path / "m.pt2"
    archive.write_bytes(b"PK\x03\x04")  # (refused by its suffix: the archive is never opened)
    with pytest.raises(UserError, match=r"is a torch\.export archive, which report does not take") as info:
        build_report(str(archive), targets=["ort"], out_dir=tmp_path / "o", **FAST)
    assert "--save-onnx" in str(info.value) and not (tmp_path / "o").exists()
