"""Custom-domain nodes are found wherever they sit, and ONNX Runtime's missing kernels are named by node."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from trtforge._custom_ops import custom_nodes, refuse_unknown_to_onnxruntime
from trtforge.errors import UserError


def _vi(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4])


def _model() -> onnx.ModelProto:
    """Custom ops in the main graph, an If branch and a local function; standard, contrib, trtforge and
    local-function nodes beside them."""
    then = helper.make_graph(
        [helper.make_node("Branchy", ["x"], ["t"], domain="com.acme")], "then", [], [_vi("t")]
    )
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [_vi("e")])
    fn = helper.make_function(
        "local.fns",
        "Twice",
        ["a"],
        ["b"],
        [helper.make_node("Inner", ["a"], ["b"], domain="com.inner")],
        [helper.make_opsetid("", 17), helper.make_opsetid("com.inner", 1)],
    )
    nodes = [
        helper.make_node("FancyOp", ["x"], ["f"], name="fancy", domain="com.acme", plugin_version="3"),
        helper.make_node("Gelu", ["f"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node("FlashAttention", ["g"], ["a"], name="ours", domain="trtforge"),
        helper.make_node("Twice", ["a"], ["w"], name="fn", domain="local.fns"),
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")])
    opsets = [helper.make_opsetid(d, v) for d, v in [("", 17), ("com.acme", 1), ("com.microsoft", 1)]]
    return helper.make_model(graph, opset_imports=opsets, functions=[fn])


def test_custom_nodes_are_found_in_subgraphs_and_functions() -> None:
    found = {(n.name, n.op_type, n.domain, n.where, n.plugin_version) for n in custom_nodes(_model())}
    assert found == {
        ("fancy", "FancyOp", "com.acme", "the main graph", "3"),
        ("gelu", "Gelu", "com.microsoft", "the main graph", "1"),
        ("#0", "Branchy", "com.acme", "a subgraph of node 'branch'", "1"),
        ("#0", "Inner", "com.inner", "function 'local.fns:Twice'", "1"),
    }


def test_onnxruntime_unknown_ops_are_named_but_its_contrib_ops_pass() -> None:
    with pytest.raises(UserError) as e:
        refuse_unknown_to_onnxruntime(_model(), "'m.onnx'", "Do something.")
    text = str(e.value)
    assert text.startswith("'m.onnx' holds 3 node(s) of custom op(s) com.acme:Branchy, com.acme:FancyOp, ")
    assert "node 'fancy' (op 'FancyOp' of domain 'com.acme', in the main graph)" in text
    assert "in function 'local.fns:Twice'" in text and text.endswith("Do something.")
    assert "Gelu" not in text  # ONNX Runtime ships com.microsoft:Gelu


def test_a_model_of_standard_ops_has_no_custom_nodes(tmp_path) -> None:
    from tests.models import tiny_onnx

    proto = onnx.load(str(tiny_onnx(tmp_path / "m.onnx")))
    assert custom_nodes(proto) == []
    refuse_unknown_to_onnxruntime(proto, "'m.onnx'", "")
