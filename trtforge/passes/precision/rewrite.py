"""Apply precision decisions to an onnx_ir graph: retype values, convert weights, insert and fold Casts.

Low-precision nodes read and write the low type; FP32 nodes read and write FP32; a Cast goes wherever
a value's type and its consumer's disagree (one Cast per value and type, shared by its consumers).
Weights are converted once per target type (sentinels like -3.4e38 saturate to the format's limit).
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from trtforge.core.names import fresh_name
from trtforge.passes.precision.observe import SENTINEL
from trtforge.passes.precision.rules import ANY_TYPE_INPUTS, FLOAT, Decision, is_float

_SUFFIX = {ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16", ir.DataType.FLOAT: "fp32"}
_FLOATS = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE)
_SMALL_INTS = (ir.DataType.BOOL, ir.DataType.INT8, ir.DataType.UINT8)
_MID_INTS = (ir.DataType.INT16, ir.DataType.UINT16)


@dataclasses.dataclass
class RewriteStats:
    casts_inserted: int = 0
    initializers_converted: int = 0
    saturated: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def to_low_array(array: np.ndarray, low: ir.DataType) -> tuple[np.ndarray, bool]:
    """Convert FP32 values to `low`, saturating sentinels (|x| >= 1e38) to the format's finite limit."""
    low_np = low.numpy()
    big = np.abs(array) >= SENTINEL
    finite_big = big & np.isfinite(array)
    if finite_big.any():
        limit = float(ml_dtypes.finfo(low_np).max)
        array = np.where(finite_big, np.sign(array) * limit, array)
    return array.astype(np.float32).astype(low_np), bool(finite_big.any())


def lossless(src: ir.DataType | None, dst: ir.DataType | None) -> bool:
    """True when every value of `src` is exactly representable in `dst`."""
    if src is None or dst is None:
        return False
    if src == dst:
        return True
    if src in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return dst in (ir.DataType.FLOAT, ir.DataType.DOUBLE)
    if src == ir.DataType.FLOAT:
        return dst == ir.DataType.DOUBLE
    if src in _SMALL_INTS:
        return dst in _FLOATS
    if src in _MID_INTS:
        return dst in (ir.DataType.FLOAT, ir.DataType.DOUBLE)
    if src == ir.DataType.INT32:
        return dst == ir.DataType.DOUBLE
    return False


class Rewriter:
    """One conversion of one graph; keeps the caches so a value is converted at most once per type."""

    def __init__(self, graph: ir.Graph, low: ir.DataType):
        self.graph = graph
        self.low = low
        self.stats = RewriteStats()
        self._converted: dict[tuple[ir.Value, ir.DataType], ir.Value] = {}
        self._names = {v.name for n in graph for v in n.outputs} | {v.name for v in graph.inputs}
        self._names |= set(graph.initializers)

    def apply(self, decisions: dict[ir.Node, Decision], keep_io_types: bool) -> RewriteStats:
        low = self.low
        dtype_now: dict[ir.Value, ir.DataType] = {}
        for node, d in decisions.items():
            if d.low:
                for i, v in enumerate(node.outputs):
                    if is_float(v) and i not in d.fixed_outputs:
                        dtype_now[v] = low
        if not keep_io_types:
            for v in self.graph.inputs:
                if is_float(v):
                    dtype_now[v] = low
        for node, d in decisions.items():
            for i, v in enumerate(node.inputs):
                if not is_float(v) or (node.op_type, i) in ANY_TYPE_INPUTS:
                    continue
                need = low if d.low and i not in d.fixed_inputs else FLOAT
                if dtype_now.get(v, FLOAT) != need:
                    node.replace_input_with(i, self._convert(v, need))
        for v in [v for v, t in dtype_now.items() if t == low]:  # subgraphs stay FP32 (rules.py): a
            for user, i in list(v.uses()):  # low-precision graph input read in one is read as an FP32 copy
                if user.graph is not self.graph:
                    user.replace_input_with(i, self._convert(v, FLOAT))
        for v, t in dtype_now.items():
            v.dtype = t
        for node, d in decisions.items():
            if d.low:
                self._retype_attributes(node)
        self._fix_outputs(keep_io_types)
        return self.stats

    def _convert(self, v: ir.Value, dtype: ir.DataType) -> ir.Value:
        key = (v, dtype)
        if key in self._converted:
            return self._converted[key]
        if v.const_value is not None and not v.is_graph_input() and dtype == self.low:
            array, saturated = to_low_array(v.const_value.numpy().astype(np.float32), self.low)
            name = fresh_name(f"{v.name}__{_SUFFIX[dtype]}", self._names)
            new = ir.Value(name=name, type=ir.TensorType(dtype), shape=v.shape, const_value=ir.tensor(array))
            new.const_value.name = name
            self.graph.register_initializer(new)
            self.stats.initializers_converted += 1
            if saturated:
                self.stats.saturated.append(v.name)
        else:
            new = self._cast(v, dtype)
        self._converted[key] = new
        return new

    def _cast(self, v: ir.Value, dtype: ir.DataType) -> ir.Value:
        out = ir.Value(
            name=fresh_name(f"{v.name}__{_SUFFIX[dtype]}", self._names),
            type=ir.TensorType(dtype),
            shape=v.shape,
        )
        node = ir.node(
            "Cast", [v], {"to": dtype}, outputs=[out], name=fresh_name(f"{v.name}__cast", self._names)
        )
        self.graph.append(node)
        self.stats.casts_inserted += 1
        return out

    def _retype_attributes(self, node: ir.Node) -> None:
        low = self.low
        op = node.op_type
        if op == "Cast" and node.attributes["to"].as_int() == FLOAT:
            node.attributes["to"] = ir.AttrInt64("to", low)
        elif op == "EyeLike" and "dtype" in node.attributes and node.attributes["dtype"].as_int() == FLOAT:
            node.attributes["dtype"] = ir.AttrInt64("dtype", low)
        elif op == "ConstantOfShape":
            attr = node.attributes.get("value")
            value = attr.as_tensor().numpy() if attr is not None else np.zeros(1, np.float32)
            array, _ = to_low_array(value.astype(np.float32), low)
            node.attributes["value"] = ir.AttrTensor("value", ir.tensor(array))
        elif op == "Constant" and "value" in node.attributes:
            t = node.attributes["value"].as_tensor()
            if t.dtype == FLOAT:
                array, _ = to_low_array(t.numpy(), low)
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(array))
        elif op == "LayerNormalization":
            stash = node.attributes.get("stash_type")
            if stash is not None and stash.as_int() != 1:
                node.attributes["stash_type"] = ir.AttrInt64("stash_type", 1)
                self.stats.notes.append(f"{node.name}: stash_type set to 1 (statistics in FP32)")

    def _fix_outputs(self, keep_io_types: bool) -> None:
        """With keep_io_types, low-precision graph outputs get a final Cast that takes over the name."""
        if not keep_io_types:
            return
        for idx, v in enumerate(list(self.graph.outputs)):
            if v.dtype != self.low or v.is_graph_input():
                continue
            original = v.name
            v.name = fresh_name(f"{original}__{_SUFFIX[self.low]}", self._names)
            out = ir.Value(name=original, type=ir.TensorType(FLOAT), shape=v.shape)
            self.graph.append(ir.node("Cast", [v], {"to": FLOAT}, outputs=[out], name=f"{original}__cast"))
            self.graph.outputs[idx] = out
            self.stats.casts_inserted += 1


def fold_casts(model: ir.Model) -> None:
    """Drop Casts to the type their input already has; skip a Cast in a chain when its step is lossless.

    x:fp16 -> Cast(fp32) -> Cast(fp16) becomes x; x:fp32 -> Cast(fp16) -> Cast(fp32) is NOT folded
    (the round trip rounds, so it is a real conversion).
    """
    graph = model.graph
    changed = True
    while changed:
        changed = False
        for node in list(graph):
            if node.op_type != "Cast" or node.graph is None:
                continue
            src, out = node.inputs[0], node.outputs[0]
            to = ir.DataType(node.attributes["to"].as_int())
            prev = src.producer() if src is not None else None
            if prev is not None and prev.op_type == "Cast" and lossless(prev.inputs[0].dtype, src.dtype):
                node.replace_input_with(0, prev.inputs[0])
                src = prev.inputs[0]
                changed = True
            if src is not None and src.dtype == to and not out.is_graph_output():
                out.replace_all_uses_with(src)
                graph.remove(node, safe=True)
                changed = True
    ir.passes.common.RemoveUnusedNodesPass()(model)
