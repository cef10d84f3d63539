"""Test-only FP32 -> FP16 cast of a whole ONNX graph (the real FP16 pass lives in passes/precision/).

Every FLOAT tensor becomes FLOAT16: initializers, Constant / ConstantOfShape values, Cast(to=FLOAT)
targets and float graph inputs/outputs. Stale value_info is dropped. Good enough to give TensorRT's
strongly typed builder an FP16 network; not a numerically careful conversion.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_FP16_MIN = float(np.finfo(np.float16).min)


def _to_fp16(t: TensorProto) -> TensorProto:
    arr = numpy_helper.to_array(t).astype(np.float32)
    arr = np.clip(arr, _FP16_MIN, -_FP16_MIN)  # finfo(float32).min mask constants stay finite
    out = numpy_helper.from_array(arr.astype(np.float16), t.name)
    return out


def cast_model_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return an FP16 copy of `model` (see module docstring)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(_to_fp16(t))
    for node in g.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(_to_fp16(attr.t))
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]
    return m


__all__ = ["cast_model_fp16", "helper"]
