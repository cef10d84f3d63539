"""Models that cannot run at the small generated verification sizes (a convolution over audio samples,
kernel 10): pass verification and the FP16 value check fall back to the caller's shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.errors import UserError
from trtforge.passes.pipeline import VerificationError, optimize_model
from trtforge.passes.precision import convert_precision


def conv_audio_model() -> onnx.ModelProto:
    """x[batch, samples] -> Conv1d(kernel 10, stride 5) -> erf GELU: needs >= 10 samples."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 1, 10)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "c1"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["x", "one"], ["x3"]),
        helper.make_node("Conv", ["x3", "w"], ["h"], strides=[5]),
        helper.make_node("Div", ["h", "sqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["e"]),
        helper.make_node("Add", ["e", "c1"], ["e1"]),
        helper.make_node("Mul", ["h", "half"], ["hh"]),
        helper.make_node("Mul", ["hh", "e1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_audio",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "frames"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_verification_without_shapes_names_the_generated_shapes():
    with pytest.raises(VerificationError, match=r"x \[2, 7\].*--shape"):
        optimize_model(conv_audio_model())


def test_verification_falls_back_to_the_given_shapes():
    fused, ledger = optimize_model(conv_audio_model(), feed_shapes={"x": [2, 400]})
    assert [n.op_type for n in fused.graph.node].count("Gelu") == 1
    assert all(p.verification is not None for p in ledger.passes)


def test_fp16_value_check_falls_back_to_the_given_shapes():
    with pytest.raises(UserError, match=r"batch 2 \(x \[3, 8\]\)"):
        convert_precision(conv_audio_model(), "fp16")
    out, record = convert_precision(conv_audio_model(), "fp16", feed_shapes={"x": [2, 400]})
    assert record.to_dict()["status"] != "failed"
    assert any(i.data_type == TensorProto.FLOAT16 for i in out.graph.initializer)
