"""Engine builds with TensorRT-RTX on the CPU: a real engine, a truthful manifest."""

from __future__ import annotations

import json

import pytest

from tests.models import BERT_INPUTS, bert_inputs, tiny_bert, tiny_onnx
from trtforge._fileio import sha256_file
from trtforge.compiler.build import BuildOptions, build_engine
from trtforge.core.manifest import read_manifest, verify_engine_file
from trtforge.errors import UserError

pytestmark = pytest.mark.trt_build

SHAPES = [f"{n}:1x1:4x16:8x64" for n in BERT_INPUTS]


def test_tiny_bert_module_to_engine(tmp_path) -> None:
    import trtforge

    out = tmp_path / "bert.engine"
    result = trtforge.compile(
        tiny_bert(),
        bert_inputs(2, 8),
        out,
        dynamic="batch,seq",
        output_names=["last_hidden_state", "pooler_output"],
        shapes=SHAPES,
        progress=False,
    )
    assert out.is_file() and result.manifest_path == tmp_path / "bert.engine.json"
    m = read_manifest(out)
    assert m.engine_sha256 == sha256_file(out) and m.engine_bytes == out.stat().st_size
    assert verify_engine_file(out, m) == out.read_bytes()
    assert [(t.name, t.dtype, t.shape) for t in m.inputs] == [(n, "int64", [-1, -1]) for n in BERT_INPUTS]
    assert [(t.name, t.dtype) for t in m.outputs] == [
        ("last_hidden_state", "float32"),
        ("pooler_output", "float32"),
    ]
    assert m.outputs[0].shape == [-1, -1, 32]
    assert len(m.profiles) == 1
    for name in BERT_INPUTS:
        rng = m.profiles[0][name]
        assert (rng.min, rng.opt, rng.max) == ([1, 1], [4, 16], [8, 64])
    assert m.backend["name"] == "tensorrt_rtx"
    assert set(m.timings) == {"export", "passes", "build"} and all(s > 0 for s in m.timings.values())
    assert m.precision["mode"] == "fp32" and m.precision["attention"] == "none"
    assert m.records["passes"]["attention"] == "none" and m.records["passes"]["verify"]
    assert m.records["export"]["exporter"] == "dynamo" and m.records["export"]["verified"]
    assert m.records["build"]["layer_types"]["MATRIX_MULTIPLY"] > 0
    assert len(m.source["onnx_sha256"]) == 64
    on_disk = json.loads((tmp_path / "bert.engine.json").read_text())
    assert on_disk["format"] == "trtforge.manifest/1"


@pytest.mark.parametrize("mode", ["fp16", "int8"])
def test_low_precision_compile_has_fused_attention(tmp_path, mode: str) -> None:
    """FP16 (and INT8 with FP16 elsewhere) graphs get native attention: TRT attention layers per block."""
    import numpy as np

    import trtforge
    from trtforge.compiler.stages import PrecisionOptions

    np.savez(tmp_path / "calib.npz", **{k: v.numpy() for k, v in bert_inputs(4, 8).items()})
    precision = (
        PrecisionOptions(
            mode="int8", int8_rest="fp16", calib_data=str(tmp_path / "calib.npz"), progress=False
        )
        if mode == "int8"
        else mode
    )
    result = trtforge.compile(
        tiny_bert(),
        bert_inputs(2, 8),
        tmp_path / "b.engine",
        dynamic="batch,seq",
        output_names=["last_hidden_state", "pooler_output"],
        shapes=SHAPES,
        precision=precision,
        progress=False,
    )
    m = result.manifest
    assert m.precision["attention"] == "native" and m.precision["float"] == "fp16"
    layers = m.records["build"]["layer_types"]
    assert layers.get("ATTENTION_INPUT") == 2 and layers.get("ATTENTION_OUTPUT") == 2, layers
    assert "fp16" in m.records
    if mode == "int8":
        assert layers.get("QUANTIZE", 0) > 0 and layers.get("DEQUANTIZE", 0) > 0, layers
        assert "int8" in m.records


def test_streams_copy_profiles_and_derived_defaults(tmp_path) -> None:
    path = tiny_onnx(tmp_path / "t.onnx")
    seen = {}
    data, record = build_engine(
        path, BuildOptions(streams=3, progress=False, opt_level=0, workspace_mb=64), on_derived=seen.update
    )
    assert len(data) == record.engine_bytes > 0
    assert len(record.profiles) == 3 and record.profiles[0] == record.profiles[2]
    rng = seen["x"]
    assert (rng.min, rng.opt, rng.max) == ([1, 4], [8, 4], [32, 4])


def test_static_model_needs_no_profile(tmp_path) -> None:
    data, record = build_engine(
        tiny_onnx(tmp_path / "s.onnx", dynamic_batch=False), BuildOptions(progress=False)
    )
    assert data and record.profiles == [] and record.inputs[0].shape == [2, 4]


def test_timing_cache_ignored_on_rtx_with_warning(tmp_path) -> None:
    _, record = build_engine(
        tiny_onnx(tmp_path / "t.onnx"), BuildOptions(timing_cache=tmp_path / "tc.bin", progress=False)
    )
    assert record.timing_cache is None
    assert any("--timing-cache ignored" in w for w in record.warnings)
    assert not (tmp_path / "tc.bin").exists()


def test_rtx_targets(tmp_path) -> None:
    _, record = build_engine(tiny_onnx(tmp_path / "t.onnx"), BuildOptions(targets=["sm89"], progress=False))
    assert record.targets == ["SM89"]
    assert BuildOptions(targets="sm86,SM89").targets == ["SM86", "SM89"]
    assert BuildOptions(targets=["SM89", "sm89,SM86"]).targets == ["SM89", "SM86"]


@pytest.mark.parametrize("targets", [["SM99"], "SM89,SM999", [""], ["NONE"], [" "]])
def test_bad_targets_are_refused_when_the_options_are_made(targets) -> None:
    """Before: refused by the builder, after the export and every pass had run."""
    with pytest.raises(UserError, match=r"--target .*expected one or more of CURRENT, SM75, .*SM89"):
        BuildOptions(targets=targets)


def test_target_current_without_a_gpu_is_refused(monkeypatch) -> None:
    from trtforge.core import backend

    monkeypatch.setattr(backend, "probe_gpu", lambda: backend.GpuInfo(False, reason="no GPU here"))
    with pytest.raises(UserError, match=r"--target CURRENT builds for this machine's GPU.*no GPU here"):
        BuildOptions(targets=["current"])


def test_bad_target_is_refused_before_the_export(tmp_path, monkeypatch) -> None:
    import trtforge
    from trtforge.compiler import export

    def no_export(*_a, **_k):
        raise AssertionError("the export ran")

    monkeypatch.setattr(export, "export_module", no_export)
    with pytest.raises(UserError, match="--target 'SM999'"):
        trtforge.compile(tiny_bert(), bert_inputs(1, 4), tmp_path / "o.engine", targets=["SM999"])
    assert list(tmp_path.iterdir()) == []


def test_parser_error_names_node(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"], name="mystery_node")],  # standard ONNX, no TensorRT importer
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(UserError, match=r"node mystery_node \(Det\)"):
        build_engine(tmp_path / "bad.onnx", BuildOptions(progress=False))

    # compile parses a temporary staged copy: the message names the user's model, not that file
    import trtforge

    with pytest.raises(UserError, match=r"rejected the graph of '.*bad\.onnx' after passes:\n.*mystery_node"):
        trtforge.compile(
            str(tmp_path / "bad.onnx"),
            output=tmp_path / "bad.engine",
            progress=False,
            passes=trtforge.core.policy.PassOptions(verify=False),
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_external_data_onnx_compiles(tmp_path) -> None:
    """The >2 GB form (weights in a side file) goes through passes and build like a single file."""
    import onnx

    import trtforge

    m = onnx.load(str(tiny_onnx(tmp_path / "t.onnx")))
    onnx.save(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    (tmp_path / "t.onnx").unlink()
    result = trtforge.compile(
        tmp_path / "ext.onnx",
        output=tmp_path / "ext.engine",
        save_onnx=tmp_path / "final.onnx",
        progress=False,
    )
    assert result.manifest.source["kind"] == "onnx" and result.engine_path.stat().st_size > 0
    import numpy as np

    from trtforge.numerics.sessions import exact_session

    x = np.ones((3, 4), np.float32)
    a = exact_session(tmp_path / "ext.onnx").run(None, {"x": x})[0]
    b = exact_session(tmp_path / "final.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(a, b, rtol=1e-6)


def _custom_op_onnx(path, op, **attrs):
    import onnx
    from onnx import TensorProto, helper

    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 4])  # noqa: E731
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="r"),
        helper.make_node(op, ["h"], ["y"], name="custom", domain="com.acme", **attrs),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x")], [vi("y")])
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)]
    onnx.save(helper.make_model(graph, opset_imports=ops), str(path))
    return path


def test_custom_op_without_a_plugin_is_named_before_the_parser(tmp_path) -> None:
    path = _custom_op_onnx(tmp_path / "c.onnx", "NoSuchPluginOp")
    with pytest.raises(
        UserError, match=r"node 'custom' \(op 'NoSuchPluginOp' of domain 'com\.acme', in the main"
    ):
        build_engine(path, BuildOptions(progress=False))


def test_custom_op_of_a_registered_plugin_passes_and_a_wrong_version_is_named(tmp_path) -> None:
    from trtforge.compiler.network import check_custom_ops
    from trtforge.core.backend import get_backend

    backend = get_backend()
    if not backend.plugin_creators():
        pytest.skip(f"{backend.name} has no plugin creator registered")
    name, version, namespace = backend.plugin_creators()[0]
    ok = _custom_op_onnx(tmp_path / "ok.onnx", name, plugin_version=version, plugin_namespace=namespace)
    check_custom_ops(ok, backend)  # left to the parser, which finds the plugin
    bad = _custom_op_onnx(tmp_path / "bad.onnx", name, plugin_version="999", plugin_namespace=namespace)
    with pytest.raises(UserError, match=rf"Registered under those names: {name} version '{version}'"):
        check_custom_ops(bad, backend)


def test_a_model_file_changed_during_the_compile_is_refused(tmp_path, monkeypatch) -> None:
    """Before: the engine was built from one version and the manifest hashed another."""
    import trtforge
    from trtforge.compiler import pipeline

    model = tiny_onnx(tmp_path / "m.onnx")
    real_build = pipeline.build_engine

    def build_then_edit(*args, **kwargs):
        result = real_build(*args, **kwargs)
        model.write_bytes(model.read_bytes() + b"\x00")  # another process rewrites the model meanwhile
        return result

    monkeypatch.setattr(pipeline, "build_engine", build_then_edit)
    with pytest.raises(UserError, match=r"the model file '.*m\.onnx' changed while it was being compiled"):
        trtforge.compile(model, output=tmp_path / "o.engine", passes=None, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_standard_op_without_importer_is_not_called_a_missing_plugin(tmp_path) -> None:
    """Before: compiling FNet (torch.fft -> ONNX DFT) failed with only TensorRT's "Plugin not found, are
    the plugin name, version, and namespace correct?", which points at plugins; none was involved."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("DFT", ["x", "", "axis"], ["y"], name="fft")],
        "dft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 2])],
        [helper.make_tensor("axis", TensorProto.INT64, [], [1])],
    )
    path = tmp_path / "dft.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    with pytest.raises(UserError) as e:
        build_engine(path, BuildOptions(progress=False))
    msg = str(e.value)
    assert "node fft (DFT)" in msg
    assert (
        "DFT: standard ONNX op(s) this TensorRT's parser has no importer for" in msg
        and "none is missing" in msg
    )
