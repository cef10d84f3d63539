"""Tiny ONNX models for report tests whose outputs numpy can compute independently."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FEATURES, CLASSES = 16, 10


def classifier_weights(seed: int, noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(W[16,10], b[10]) from `seed`, optionally perturbed by seeded noise of scale `noise`."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    b = rng.standard_normal(CLASSES).astype(np.float32)
    if noise:
        pert = np.random.default_rng(seed)
        w = (w + noise * pert.standard_normal(w.shape)).astype(np.float32)
        b = (b + noise * pert.standard_normal(b.shape)).astype(np.float32)
    return w, b


def classifier_onnx(path: Path, w: np.ndarray, b: np.ndarray, *, input_dtype: int | None = None) -> Path:
    """logits[batch, 10] = x[batch, 16] @ W + b (opset 17), saved to `path`; `input_dtype` (an ONNX
    TensorProto type) makes x that type, cast to float inside."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dtype = TensorProto.FLOAT if input_dtype is None else input_dtype
    xf = "x" if dtype == TensorProto.FLOAT else "xf"
    nodes = [helper.make_node("MatMul", [xf, "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"])]
    if dtype != TensorProto.FLOAT:
        nodes.insert(0, helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes,
        "tiny_classifier",
        [helper.make_tensor_value_info("x", dtype, ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def token_model_onnx(path: Path, vocab: int = 50, *, width: int = 4, matmul: bool = False) -> Path:
    """y[batch, seq, width] = Embedding(ids) * mask[..., None]: integer ids through a Gather, a 0/1 mask.
    `matmul`: the embedding goes through a MatMul(W[width, width]) first (INT8 calibration quantizes one
    of width 16 or more)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = rng.standard_normal((vocab, width)).astype(np.float32)
    axis = np.array([-1], np.int64)
    weights = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(axis, "axis")]
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["emb"])]
    if matmul:
        weights.append(numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "W"))
        nodes.append(helper.make_node("MatMul", ["emb", "W"], ["proj"]))
    nodes += [
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis"], ["mask3"]),
        helper.make_node("Mul", ["proj" if matmul else "emb", "mask3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_tokens",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", width])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def by_fours_onnx(path: Path) -> Path:
    """y[N, 4, S/4] = Reshape(x[N, S]) (opset 17), saved to `path`: a model that runs only at sequence
    lengths divisible by 4, so some sizes a report tries fail where others run."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "by_fours",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "K"])],
        [numpy_helper.from_array(np.array([0, 4, -1], np.int64), "shape")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def inputs_npz(path: Path, samples: int = 12, seed: int = 1) -> np.ndarray:
    """Write x[samples, 16] to `path` (.npz) and return it."""
    x = np.random.default_rng(seed).standard_normal((samples, FEATURES)).astype(np.float32)
    np.savez(path, x=x)
    return x


def mlp_factory():
    """`module:factory` source for CLI tests: (tiny MLP classifier, example inputs)."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.GELU(), torch.nn.Linear(32, CLASSES))
    return module.eval(), (torch.randn(2, FEATURES),)
