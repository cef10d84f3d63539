"""The one graph-input reader (`graph_inputs`) and the one TensorSpec: symbolic, fixed and unnamed dynamic
dims, non-tensor inputs, initializers listed as inputs, and the manifest's JSON form (-1) round trip."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.core.manifest import Manifest, ShapeRange
from trtforge.core.tensor_spec import DYNAMIC, TensorSpec, graph_inputs, is_dynamic, numpy_dtype_of
from trtforge.errors import UserError


def _model(inputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Identity", [inputs[0].name], ["y"])]
    graph = helper.make_graph(nodes, "g", inputs, [out], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_symbolic_fixed_and_unnamed_dims() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None, 0])
    (spec,) = graph_inputs(_model([x]))
    assert spec == TensorSpec("x", "float32", (DYNAMIC, 3, DYNAMIC, 0), ("batch", None, None, None))
    assert [is_dynamic(d) for d in spec.shape] == [True, False, True, False]  # 0: a static empty axis
    assert [spec.symbol(a) for a in range(4)] == ["batch", None, None, None]
    assert spec.is_dynamic and spec.rank_known and spec.np_dtype == np.dtype("float32")


def test_rank_unknown_and_undefined_dtype() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.INT64, None)  # no shape recorded
    u = helper.make_tensor_value_info("u", TensorProto.UNDEFINED, [2])
    specs = graph_inputs(_model([x, u]))
    assert (specs[0].shape, specs[0].rank_known, specs[0].dtype) == ((), False, "int64")
    assert (specs[1].shape, specs[1].rank_known, specs[1].dtype) == ((2,), True, "float32")


def test_initializers_listed_as_inputs_are_left_out(tmp_path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4])
    init = numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")
    model = _model([x, w], [init])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    for source in (model, path, str(path)):
        assert [s.name for s in graph_inputs(source)] == ["x"]


def test_non_tensor_input_is_refused_by_name() -> None:
    seq = helper.make_tensor_sequence_value_info("tokens", TensorProto.INT64, None)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    with pytest.raises(UserError, match=r"model input 'tokens' is a sequence, not a tensor"):
        graph_inputs(_model([x, seq]))


def test_manifest_json_keeps_minus_one_and_drops_symbols() -> None:
    """On disk a tensor is {name, dtype, shape} with -1 for dynamic dims, as every manifest so far."""
    spec = TensorSpec("x", "float32", (-1, 4), ("batch", None))
    m = Manifest(
        engine_file="m.engine",
        engine_sha256="0" * 64,
        engine_bytes=0,
        backend={"name": "tensorrt"},
        inputs=[spec],
        outputs=[TensorSpec("y", "float32", [-1, 4])],
        profiles=[{"x": ShapeRange([1, 4], [2, 4], [8, 4])}],
        source={},
        trtforge_version="0",
    )
    doc = json.loads(m.to_json())
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 4]}]
    back = Manifest.from_dict(doc)
    assert [t.shape for t in back.inputs] == [[-1, 4]] and back.inputs[0].symbols == ()


def test_numpy_dtype_of_names_the_tensor() -> None:
    assert numpy_dtype_of("bfloat16").name == "bfloat16"
    with pytest.raises(UserError, match="tensor 'q' has dtype 'quux'"):
        _ = TensorSpec("q", "quux", (1,)).np_dtype


@pytest.mark.parametrize(
    ("dims", "where"),
    [((2, 4), None), ((7, 4), None), ((2, 5), 1), ((2,), -1), ((2, 4, 1), -1)],
)
def test_shape_mismatch_rank_then_first_static_axis(dims: tuple[int, ...], where: int | None) -> None:
    from trtforge.core.tensor_spec import shape_mismatch

    assert shape_mismatch((-1, 4), dims) == where
