"""Models past protobuf's 2 GB (the limit brought down to a few KiB, tests/large_models.py): checked, shape
inferred, saved and run in ONNX Runtime as files with their weights in external data, never serialised
whole and never modified."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.large_models import protobuf_limit
from trtforge.core import onnx_io
from trtforge.numerics.sessions import exact_session, fast_session

LIMIT = 40_000  # bytes of weights: the model below holds 64 KiB of them and a few hundred bytes besides


def _model() -> tuple[onnx.ModelProto, np.ndarray]:
    w = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 128])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(3, np.float32), "small")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@pytest.fixture
def large(monkeypatch):
    protobuf_limit(monkeypatch, LIMIT, room=10_000)


def _raw(model: onnx.ModelProto) -> dict[str, bytes]:
    return {t.name: t.raw_data for t in model.graph.initializer}


@pytest.mark.parametrize("session", [exact_session, fast_session])
def test_a_session_of_a_large_model_reads_it_as_a_file_with_external_data(large, session):
    """make_session serialised the model to bytes for ONNX Runtime: past 2 GB protobuf cannot, and ORT
    parses no message that large. It now hands ORT a file with the weights beside it."""
    model, w = _model()
    weights = _raw(model)
    x = np.random.default_rng(1).standard_normal((2, 128)).astype(np.float32)
    (got,) = session(model).run(None, {"x": x})
    np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    assert _raw(model) == weights


def test_check_proto_takes_a_large_model_by_path(large):
    """onnx.checker refuses an in-memory model past 2 GB ("call check_model with model path instead"):
    check_proto writes it out and checks the file, full check (shape inference) included, and still
    finds what is wrong with it."""
    model, _ = _model()
    onnx_io.check_proto(model, full_check=True)
    onnx_io.check_model(model, where="the model")
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        onnx_io.check_proto(model)


def test_shapes_inferred_of_a_large_model_by_path(large):
    """onnx.shape_inference.infer_shapes serialises the model; shapes_inferred goes through
    infer_shapes_path and gives the block the model itself with its value_info, without copying its
    weights, and the model back as it was afterwards."""
    model, _ = _model()
    weights = _raw(model)
    with onnx_io.shapes_inferred(model) as typed:
        assert typed is model
        (y,) = typed.graph.value_info
        assert y.name == "y" and [d.dim_value for d in y.type.tensor_type.shape.dim] == [2, 128]
    assert not model.graph.value_info and _raw(model) == weights


def test_save_onnx_of_a_large_model_keeps_the_model_and_aligns_its_data(large, tmp_path):
    """save_onnx moved the weights out of the caller's model into the file (onnx.save_model with external
    data clears raw_data), so the model could not be used again; it measured the model with ByteSize,
    which encodes all of it. Now the model is left as it was, each large tensor starts at a page-aligned
    offset (where a reader can map it), small ones stay inside the file."""
    model, w = _model()
    weights = _raw(model)
    path = onnx_io.save_onnx(model, tmp_path / "m.onnx")
    assert _raw(model) == weights
    assert onnx_io.external_data_files(path) == [tmp_path / "m.onnx.data"]
    stored = onnx.load(str(path), load_external_data=False)
    info = {t.name: {e.key: e.value for e in t.external_data} for t in stored.graph.initializer}
    assert info["small"] == {} and int(info["w"]["offset"]) % 4096 == 0
    loaded = onnx_io.load_onnx(path)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), w)
