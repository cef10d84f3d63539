"""Tiny ONNX models built with onnx.helper for placement, Q/DQ and API tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(m)
    return m


def mlp(k: int = 32, hidden: int = 64, n: int = 32, seed: int = 0) -> onnx.ModelProto:
    """x[b, s, k] -> MatMul -> Relu -> MatMul -> y; plus a residual Add of x (shared input)."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": (rng.standard_normal((k, hidden)) / np.sqrt(k)).astype(np.float32),
        "w2": (rng.standard_normal((hidden, n)) / np.sqrt(hidden)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["o"], name="fc2"),
        helper.make_node("Add", ["o", "x"], ["y"], name="residual"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", n])],
        inits,
    )


def masked_mlp(k: int = 32, n: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x[b, s, k], attention_mask[b, s] -> MatMul -> times the mask -> y: a model whose statistics can skip
    padding (only_real_tokens)."""
    rng = np.random.default_rng(seed)
    inits = {
        "w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
        "axes": np.array([-1], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Unsqueeze", ["mf", "axes"], ["m3"], name="unsqueeze"),
        helper.make_node("Mul", ["h", "m3"], ["y"], name="mask"),
    ]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", n])],
        inits,
    )


def shared_input(k: int = 32, seed: int = 0) -> onnx.ModelProto:
    """x feeds three MatMuls (like Q/K/V) and a LayerNormalization; outputs are summed."""
    rng = np.random.default_rng(seed)
    inits = {f"w{i}": rng.standard_normal((k, k)).astype(np.float32) for i in range(3)}
    inits["gamma"] = np.ones(k, np.float32)
    inits["beta"] = np.zeros(k, np.float32)
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"], name=f"proj{i}") for i in range(3)]
    nodes += [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1),
        helper.make_node("Sum", ["m0", "m1", "m2", "ln"], ["y"], name="sum"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", k])],
        inits,
    )


def attention(seq: int = 8, d: int = 16, seed: int = 0) -> onnx.ModelProto:
    """q, k, v [b, seq, d] activations: softmax(q k^T * scale + mask) v, with a -inf mask constant."""
    mask = np.zeros((seq, seq), np.float32)
    mask[np.triu_indices(seq, 1)] = -np.inf
    inits = {"scale": np.array(1.0 / np.sqrt(d), np.float32), "mask": mask}
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scale_mul"),
        helper.make_node("Add", ["ss", "mask"], ["sm"], name="mask_add"),
        helper.make_node("Softmax", ["sm"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="av"),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", seq, d]) for n in ("q", "k", "v")]
    return _model(nodes, vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", seq, d])], inits)


def gemm(trans_b: bool, k: int = 32, n: int = 24, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "bias"], ["y"], name="gemm", transB=int(trans_b))]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
        {"w": w, "bias": np.zeros(n, np.float32)},
    )


def conv_residual(c: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x -> Conv(c->c) -> Add(x) -> Relu: the residual block TensorRT fuses as Conv + Add."""
    rng = np.random.default_rng(seed)
    inits = {
        "w": (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32),
        "small_w": np.ones((4, c, 1, 1), np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["cv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["cv", "x"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
        helper.make_node("Conv", ["y", "small_w"], ["z"], name="conv_small"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", c, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", 4, 8, 8])],
        inits,
    )


def small_gemm() -> onnx.ModelProto:
    w = np.ones((32, 8), np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="tiny")]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        {"w": w},
    )
