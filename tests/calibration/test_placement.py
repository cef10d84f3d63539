"""One test per placement rule: where Q/DQ goes, on which axis, and where it never goes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from tests.calibration import models
from trtforge.calibration.placement import name_nodes, plan_placement
from trtforge.calibration.qdq import insert_qdq
from trtforge.errors import UserError


def _producers(model):
    return {o: n for n in model.graph.node for o in n.output}


def _inputs_from_dq(model, node_name: str) -> list[bool]:
    """For each input of `node_name`: does it come from a DequantizeLinear?"""
    prod = _producers(model)
    node = next(n for n in model.graph.node if n.name == node_name)
    return [i in prod and prod[i].op_type == "DequantizeLinear" for i in node.input]


def _quantize_all(model):
    name_nodes(model)
    plan = plan_placement(model)
    scales = dict.fromkeys(plan.activation_tensors(), 0.05)
    return plan, insert_qdq(model, plan.targets, scales)


def _weight_dq_axis(model, node_name: str) -> tuple[int, np.ndarray]:
    prod = _producers(model)
    node = next(n for n in model.graph.node if n.name == node_name)
    dq = prod[node.input[1]]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    axis = next(a.i for a in dq.attribute if a.name == "axis")
    return axis, inits[dq.input[1]]


def test_gemm_inputs_matmul_weight_per_channel_axis_1_activation_per_tensor():
    m = models.mlp(k=32, hidden=64, n=32)
    plan, q = _quantize_all(m)
    assert {t.node for t in plan.targets} == {"fc1", "fc2"}
    assert _inputs_from_dq(q, "fc1") == [True, True] and _inputs_from_dq(q, "fc2") == [True, True]
    axis, scale = _weight_dq_axis(q, "fc1")
    assert axis == 1 and scale.shape == (64,)
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    zps = [inits[n.input[2]] for n in q.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert all(z.dtype == np.int8 and not z.any() for z in zps)  # symmetric INT8, zero point 0
    assert "w1" not in inits  # the float weight is replaced by an int8 one


@pytest.mark.parametrize(("trans_b", "axis"), [(True, 0), (False, 1)])
def test_gemm_weight_axis_follows_transB(trans_b, axis):
    _, q = _quantize_all(models.gemm(trans_b=trans_b))
    got_axis, scale = _weight_dq_axis(q, "gemm")
    assert got_axis == axis and scale.shape == (24,)
    assert _inputs_from_dq(q, "gemm") == [True, True, False]  # bias stays float


def test_conv_weight_axis_0_and_residual_add_quantizes_only_the_residual_input():
    plan, q = _quantize_all(models.conv_residual(c=16))
    axis, scale = _weight_dq_axis(q, "conv")
    assert axis == 0 and scale.shape == (16,)
    assert _inputs_from_dq(q, "add") == [False, True]  # conv output unquantized, residual x quantized
    rules = {d.node: (d.quantized, d.rule) for d in plan.decisions}
    assert rules["add"] == (True, "residual_add")
    assert rules["conv_small"] == (False, "small_gemm")  # 16 -> 4 channels: kept in float


def test_attention_bmm_quantizes_both_inputs_softmax_and_mask_stay_float():
    plan, q = _quantize_all(models.attention())
    assert _inputs_from_dq(q, "qk") == [True, True] and _inputs_from_dq(q, "av") == [True, True]
    assert all(d.rule == "attention_bmm" for d in plan.decisions)
    for name in ("softmax", "mask_add", "scale_mul"):
        assert not any(_inputs_from_dq(q, name))


def test_shared_tensor_is_quantized_once_and_layernorm_reads_float():
    _, q = _quantize_all(models.shared_input())
    qs = [n for n in q.graph.node if n.op_type == "QuantizeLinear"]
    assert len(qs) == 1 and qs[0].input[0] == "x"
    dq_out = {
        n.output[0] for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == qs[0].output[0]
    }
    assert all(next(n for n in q.graph.node if n.name == f"proj{i}").input[0] in dq_out for i in range(3))
    assert next(n for n in q.graph.node if n.name == "ln").input[0] == "x"


def test_small_gemm_and_excluded_nodes_stay_float_with_reasons():
    plan = plan_placement(models.small_gemm())
    assert not plan.targets and plan.decisions[0].rule == "small_gemm"
    m = models.mlp()
    plan = plan_placement(m, exclude_nodes=("fc2",))
    assert [t.node for t in plan.targets] == ["fc1"]
    assert next(d for d in plan.decisions if d.node == "fc2").reason == "excluded by the user"


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="not in the model"):
        plan_placement(models.mlp(), exclude_nodes=("nope",))
    with pytest.raises(UserError, match="cannot quantize op type"):
        plan_placement(models.mlp(), op_types=("Softmax",))


def test_qdq_model_runs_in_onnxruntime_close_to_float():
    from trtforge.numerics.sessions import exact_session

    m = models.mlp()
    x = np.random.default_rng(0).standard_normal((4, 5, 32)).astype(np.float32)
    name_nodes(m)
    plan = plan_placement(m)
    scales = {"x": float(np.abs(x).max() / 127), "r": 3.0 / 127}
    q = insert_qdq(m, plan.targets, scales)
    ref = exact_session(m).run(None, {"x": x})[0]
    out = exact_session(q).run(None, {"x": x})[0]
    cos = (ref * out).sum() / np.linalg.norm(ref) / np.linalg.norm(out)
    assert cos > 0.999 and not np.array_equal(ref, out)


def test_inserted_nodes_land_just_before_the_node_they_feed():
    """qdq.insert_before (Q/DQ insertion and SmoothQuant's Mul): each list goes right before its node,
    in its own order; nodes without inserts keep their places."""
    from onnx import helper

    from trtforge.calibration.qdq import insert_before

    graph = helper.make_graph([helper.make_node("Relu", [], [], name=n) for n in "abc"], "g", [], [])
    new = {i: [helper.make_node("Identity", [], [], name=f"{n}{i}") for n in "pq"] for i in (0, 2)}
    insert_before(graph, new)
    assert [n.name for n in graph.node] == ["p0", "q0", "a", "b", "p2", "q2", "c"]
    insert_before(graph, {})
    assert [n.name for n in graph.node] == ["p0", "q0", "a", "b", "p2", "q2", "c"]
