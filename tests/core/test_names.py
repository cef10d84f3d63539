"""trtforge.core.names: the one fresh-name rule of the passes and calibration."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from trtforge.core.names import fresh_name, fresh_names, ir_graph_names, proto_graph_names


def test_fresh_name_takes_base_then_numbered_ones_and_reserves_each() -> None:
    taken = {"x_scale", "x_scale_1"}
    assert fresh_name("y", taken) == "y" and "y" in taken
    assert fresh_name("x_scale", taken) == "x_scale_2"
    assert fresh_name("x_scale", taken) == "x_scale_3"  # (the one before is taken now)
    fresh = fresh_names({"a", "a_1"})
    assert [fresh("a"), fresh("a"), fresh("b"), fresh("b")] == ["a_2", "a_3", "b", "b_1"]


def test_a_stem_begins_no_name_taken() -> None:
    """A stem names several values (`<stem>_weight`, `<stem>_split`): one that begins any name is skipped."""
    taken = {"qkv_0_weight", "qkv_0_1_matmul", "qkv_0_2x"}
    assert fresh_name("qkv_0", set(taken)) == "qkv_0"  # (as a plain name it is free)
    assert fresh_name("qkv_0", set(taken), stem=True) == "qkv_0_2"  # qkv_0_2x does not begin 'qkv_0_2_'


def _model_with_a_body() -> onnx.ModelProto:
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "w_body"], ["then_out"], name="then_add")],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "w_body")],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["else_out"], name="else_id")],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Neg", ["x"], ["neg"], name="neg_node"),
            helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then, else_branch=other),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.zeros(2, np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_graph_names_hold_every_depth_of_both_forms() -> None:
    model = _model_with_a_body()
    top = {"x", "cond", "y", "w", "neg", "neg_node", "branch"}
    body = {"then_out", "then_add", "else_out", "else_id"}
    assert top | body | {"w_body"} <= proto_graph_names(model.graph)
    assert top | body | {"w_body"} <= ir_graph_names(ir.serde.deserialize_model(model).graph)
