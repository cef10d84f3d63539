"""Insert QuantizeLinear/DequantizeLinear into an ONNX model as TensorRT expects them (§2.1):

- activations: Q -> DQ pair, per-tensor float32 scale, zero point 0; one pair per tensor,
  shared by all its quantized consumers (other consumers keep reading the float tensor);
- weights: stored quantized with a per-channel DQ (axis per placement.py), like ModelOpt's ``dq_only``
  output, so the file shrinks about 4x; the float weight is dropped when nothing else reads it.

Formats (``fmt``): ``int8`` (opset 13+) and ``fp8`` = E4M3 (opset 19+; values round to nearest even
and saturate at +-448, as TensorRT's FP8 QuantizeLinear does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trtforge.calibration.methods import FORMAT_MAX, INT8_MAX, scale_from_amax
from trtforge.calibration.placement import QuantTarget, constant_values
from trtforge.core.names import fresh_names, proto_graph_names
from trtforge.errors import UserError

if TYPE_CHECKING:
    import onnx

MIN_OPSET = {"int8": 13, "fp8": 19}  # per-axis Q/DQ; FP8 types


def cast_to(values: np.ndarray, fmt: str) -> np.ndarray:
    """Already-scaled values in format `fmt`: int8 rounds half to even and clips to +-127; fp8 clips
    to +-448 and rounds to the nearest E4M3 value (ml_dtypes, which onnx depends on)."""
    qmax = FORMAT_MAX[fmt]
    if fmt == "int8":
        return np.clip(np.rint(values), -INT8_MAX, INT8_MAX).astype(np.int8)
    import ml_dtypes

    return np.clip(values, -qmax, qmax).astype(ml_dtypes.float8_e4m3fn)


def zero_point(fmt: str, shape: tuple[int, ...] = ()) -> np.ndarray:
    """The zero point(s) of format `fmt` (always 0: TensorRT quantizes symmetrically)."""
    return cast_to(np.zeros(shape, dtype=np.float32), fmt)


def quantize_weight(w: np.ndarray, axis: int, fmt: str = "int8") -> tuple[np.ndarray, np.ndarray]:
    """(quantized weight, per-channel float32 scale) with symmetric max calibration along `axis`."""
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=reduce_axes) if reduce_axes else np.abs(w)
    scale = scale_from_amax(amax, fmt)
    shape = [1] * w.ndim
    shape[axis] = -1
    return cast_to(w / scale.reshape(shape), fmt), scale


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def insert_qdq(
    model: onnx.ModelProto, targets: list[QuantTarget], act_scales: dict[str, float], fmt: str = "int8"
) -> onnx.ModelProto:
    """A copy of `model` with `fmt` Q/DQ for `targets`; `act_scales` maps activation tensor -> scale."""
    import onnx
    from onnx import helper, numpy_helper

    if fmt not in MIN_OPSET:
        raise UserError(f"Q/DQ format {fmt!r}: expected one of {', '.join(MIN_OPSET)}.")
    if _opset(model) < MIN_OPSET[fmt]:
        need = MIN_OPSET[fmt]
        raise UserError(
            f"the model uses ONNX opset {_opset(model)}; per-channel {fmt.upper()} Q/DQ needs opset >= "
            f"{need}. Re-export with a newer opset (torch.onnx.export(..., opset_version={max(need, 17)}))."
        )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    consts = constant_values(out)
    fresh = fresh_names(proto_graph_names(g))  # a model's own 'x_scale' or 'h_smoothed' is kept
    index = {n.name: i for i, n in enumerate(g.node)}
    before: dict[int, list[onnx.NodeProto]] = {}
    replaced: dict[tuple[str, int | None], str] = {}

    def emit(at: int, nodes: list[onnx.NodeProto]) -> None:
        before.setdefault(at, []).extend(nodes)

    def act_dq(tensor: str, at: int) -> str:
        key = (tensor, None)
        if key not in replaced:
            scale = np.float32(act_scales[tensor])
            s = fresh(f"{tensor}_scale")
            z = fresh(f"{tensor}_zero_point")
            g.initializer.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), s))
            g.initializer.append(numpy_helper.from_array(zero_point(fmt), z))
            q, dq = fresh(f"{tensor}_quantized"), fresh(f"{tensor}_dequantized")
            emit(
                at,
                [
                    helper.make_node(
                        "QuantizeLinear", [tensor, s, z], [q], name=fresh(f"{tensor}_QuantizeLinear")
                    ),
                    helper.make_node(
                        "DequantizeLinear", [q, s, z], [dq], name=fresh(f"{tensor}_DequantizeLinear")
                    ),
                ],
            )
            replaced[key] = dq
        return replaced[key]

    def weight_dq(tensor: str, axis: int, at: int) -> str:
        key = (tensor, axis)
        if key not in replaced:
            qw, scale = quantize_weight(consts[tensor].astype(np.float32), axis, fmt)
            wq, s = fresh(f"{tensor}_{fmt}"), fresh(f"{tensor}_scale")
            z = fresh(f"{tensor}_zero_point")
            g.initializer.extend(
                [
                    numpy_helper.from_array(qw, wq),
                    numpy_helper.from_array(scale, s),
                    numpy_helper.from_array(zero_point(fmt, scale.shape), z),
                ]
            )
            dq = fresh(f"{tensor}_dequantized")
            emit(
                at,
                [
                    helper.make_node(
                        "DequantizeLinear",
                        [wq, s, z],
                        [dq],
                        name=fresh(f"{tensor}_DequantizeLinear"),
                        axis=axis,
                    )
                ],
            )
            replaced[key] = dq
        return replaced[key]

    # Earliest consumer first, so each shared Q/DQ lands before every node that reads it.
    for t in sorted(targets, key=lambda t: index[t.node]):
        node = g.node[index[t.node]]
        at = index[t.node]
        for k, name in enumerate(node.input):
            if name in t.activations:
                node.input[k] = act_dq(name, at)
            elif t.weight is not None and name == t.weight and k == 1:
                node.input[k] = weight_dq(name, int(t.weight_axis or 0), at)
    insert_before(g, before)
    drop_unused_initializers(out)
    return out


def insert_before(graph: onnx.GraphProto, inserts: dict[int, list[onnx.NodeProto]]) -> None:
    """Put each list of new nodes ``inserts[i]`` just before node i of `graph`, in place: nodes that feed
    node i (a Q/DQ pair, a SmoothQuant Mul) then precede it, and the order stays topological."""
    nodes = []
    for i, n in enumerate(graph.node):
        nodes.extend(inserts.get(i, []))
        nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove, in place, the initializers nothing reads: no node (at any depth: If/Loop/Scan bodies read
    the main graph's weights by name) and no graph output (a weight the model also returns)."""
    read = _names_read(model.graph) | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name in read]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Tensor names the nodes of `graph` and of every body inside it read (a body's outputs too)."""
    read: set[str] = set()
    for n in graph.node:
        read.update(n.input)
        for a in n.attribute:
            for body in (a.g, *a.graphs) if a.HasField("g") else a.graphs:
                read |= _names_read(body) | {o.name for o in body.output}
    return read
