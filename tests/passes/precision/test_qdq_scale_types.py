"""A quantized MatMul whose weight scale FP16 cannot hold (tiny weights after SmoothQuant, as in
MobileBERT): its activation Q/DQ stays FP32 too, so both operands' scales keep one type (TensorRT
refuses 'type mismatch between matmul operand scales')."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.passes.precision import convert_precision


def qdq_matmul(weight_scale: float) -> onnx.ModelProto:
    """y[b, s, 8] = DQ(Q(x)) @ DQ(W_int8) (+ Relu), per-channel weight scale `weight_scale`."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "x_zero"),
        numpy_helper.from_array(rng.integers(-127, 128, (16, 8)).astype(np.int8), "w_int8"),
        numpy_helper.from_array(np.full(8, weight_scale, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(8, np.int8), "w_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"], name="x_dq"),
        helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["wd"], name="w_dq", axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _scale_types(model: onnx.ModelProto) -> dict[str, int]:
    inits = {i.name: i.data_type for i in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    return {n.name: inits.get(n.input[1], -1) for n in qdq}


def test_tiny_weight_scale_keeps_every_operand_scale_fp32():
    out, record = convert_precision(qdq_matmul(1e-7), "fp16")
    assert set(_scale_types(out).values()) == {TensorProto.FLOAT}
    kept = {k.name: k.reasons for k in record.kept_fp32}
    assert {"x_q", "x_dq", "w_dq"} <= set(kept)
    assert "quantized operand" in kept["x_dq"][0]


def test_normal_weight_scale_converts_every_operand_scale():
    out, _ = convert_precision(qdq_matmul(1e-2), "fp16")
    assert set(_scale_types(out).values()) == {TensorProto.FLOAT16}


@pytest.mark.trt_build
def test_tiny_weight_scale_int8_matmul_builds(tmp_path):
    import trtforge

    path = tmp_path / "qdq.onnx"
    onnx.save(qdq_matmul(1e-7), str(path))
    result = trtforge.compile(str(path), output=tmp_path / "qdq.engine", precision="fp16")
    assert result.engine_path.exists()
