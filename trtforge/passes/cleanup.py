"""cleanup: constant folding, dead-node / Identity / no-op Cast removal, static shape subgraphs.

All of it is onnxscript's optimizer (`onnxscript.optimizer.optimize_ir`): `FoldConstantsPass`
folds constant subgraphs, and with node-level shape inference it turns `Shape`/`Gather`/`Concat`
chains over static dims into constants; its default rewrite rules remove no-op Cast / Expand /
Transpose, `x+0`, `x*1`, Dropout and collapse Reshape chains; `RemoveUnusedNodesPass` drops dead
nodes. Functions are not inlined, so plugin reference functions survive a late cleanup.
Exported graphs also carry `Identity` nodes that the optimizer keeps; onnx_ir's
`IdentityEliminationPass` removes those that do not name a graph output.
An `EyeLike` over a dynamically shaped input (XLNet's `torch.eye(seq)`) is lowered to
`Range`/`Equal`/`Cast`: TensorRT's ONNX parser refuses EyeLike unless its shape is static.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript import optimizer

from trtforge.core.names import fresh_name
from trtforge.passes._base import PassContext, PassOutcome, PassSpec

_QUIETED_LOGS = ("onnxscript.optimizer._constant_folding", "onnx_ir.passes.common.initializer_deduplication")


def run_cleanup(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fold and clean in place; `matches` is the number of nodes removed."""
    before = _count(model)
    passthrough = {i: v.name for i, v in enumerate(model.graph.outputs) if v.is_graph_input()}
    output_names = [v.name for v in model.graph.outputs]
    body_outputs = [(g, [v.name for v in g.outputs]) for g in _subgraphs(model.graph)]
    # onnxscript's constant folder warns on stderr for every multi-output node it leaves (each Split:
    # "Skipping constant folding for op Split with multiple outputs."), in the middle of our output, and
    # onnx_ir's initializer deduplication for every weight that is also a graph input or output ("Skipped
    # deduplication of initializer 'W'"); leaving them is intended and the pass ledger records what
    # cleanup did.
    logs = [logging.getLogger(name) for name in _QUIETED_LOGS]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        optimizer.optimize_ir(model, num_iterations=2, inline=False)
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    _restore_passthrough(model.graph, passthrough)
    identity = common_passes.IdentityEliminationPass()(model)
    _restore_output_names(model.graph, output_names)
    for body, names in body_outputs:  # (a Scan body's `o = Identity(state)` made one value two outputs)
        _restore_output_names(body, names)
    lowered = _lower_dynamic_eyelike(model)
    outcome = PassOutcome()
    removed = before - _count(model)
    outcome.matches = max(removed, 0)
    outcome.per_rule["nodes_removed"] = outcome.matches
    if identity.modified:
        outcome.notes.append("removed Identity nodes")
    if lowered:
        outcome.per_rule["eyelike_lowered"] = lowered
        outcome.notes.append(f"{lowered} dynamic EyeLike lowered (TensorRT parses static EyeLike only)")
    return outcome


def _is_static(value: ir.Value) -> bool:
    return value.shape is not None and all(isinstance(d, int) for d in value.shape)


def _lower_dynamic_eyelike(model: ir.Model) -> int:
    """Rewrite each EyeLike whose input shape is not static as Equal(rows + k, cols) cast to its dtype
    (same values: out[i, j] = 1 where j - i == k). TensorRT's parser rejects a dynamic EyeLike
    ("Eyelike does not work for dynamically shaped tensors"). Needs opset 11 (Range)."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    if opset < 11:
        return 0
    graph = model.graph
    lowered = 0
    for node in list(graph):
        if node.op_type != "EyeLike" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
            continue
        x = node.inputs[0]
        dtype_attr = node.attributes.get("dtype")
        dtype = ir.DataType(dtype_attr.as_int()) if dtype_attr is not None else x.dtype
        if _is_static(x) or dtype is None:
            continue
        k_attr = node.attributes.get("k")
        new, eye = _eye_nodes(x, k_attr.as_int() if k_attr is not None else 0, dtype, node.name or "eyelike")
        out = node.outputs[0]
        eye.shape, eye.type = out.shape, out.type
        graph.insert_before(node, new)
        was_output = [i for i, v in enumerate(graph.outputs) if v is out]
        out.replace_all_uses_with(eye)
        for i in was_output:
            graph.outputs[i] = eye
        name = out.name
        graph.remove(node, safe=True)
        eye.name = name
        lowered += 1
    return lowered


def _restore_passthrough(graph: ir.Graph, passthrough: dict[int, str]) -> None:
    """Undo onnx_ir's OutputFixPass for outputs that are graph inputs: it renames the input `x` to
    `x_orig` and gives an Identity's output the name `x`, which changes the name callers feed. Point
    those outputs back at the input itself and give the input its name back."""
    for index, name in passthrough.items():
        out = graph.outputs[index]
        node = out.producer()
        if out.is_graph_input() or node is None or node.op_type != "Identity":
            continue
        source = node.inputs[0]
        if source is None or not source.is_graph_input():
            continue
        graph.outputs[index] = source
        out.replace_all_uses_with(source)
        graph.remove(node, safe=True)
        source.name = name


def _restore_output_names(graph: ir.Graph, names: list[str]) -> None:
    """Give every graph output its name back. Identity elimination merges `a -> Identity -> b` when
    both are outputs (a model returning one tensor twice), leaving one value at two positions under
    one name; the first position gets its value renamed, later ones an Identity of their own."""
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    taken |= {o.name for node in graph for o in node.outputs}
    seen: set[ir.Value] = set()
    for index, (value, name) in enumerate(zip(list(graph.outputs), names)):
        if value.name == name and value not in seen:
            seen.add(value)
            continue
        if value in seen or value.is_graph_input() or value.name in graph.initializers:
            node = ir.node("Identity", inputs=[value])
            out = node.outputs[0]
            out.shape, out.type = value.shape, value.type
            graph.append(node)
            graph.outputs[index] = out
            value = out
        if name in taken and value.name != name:  # an internal value holds the name: move it aside
            holder = next(o for node in graph for o in node.outputs if o.name == name)
            holder.name = fresh_name(f"{name}_inner", taken)
        taken.discard(value.name)
        value.name = name
        taken.add(name)
        seen.add(value)


def _subgraphs(graph: ir.Graph) -> list[ir.Graph]:
    """The If/Loop/Scan bodies in `graph`, at every depth."""
    found = []
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                found.append(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                found.extend(attr.value)
    return found


def _count(model: ir.Model) -> int:
    return sum(1 for _ in model.graph)


CLEANUP = PassSpec(
    name="cleanup",
    summary="constant folding, dead/Identity/no-op removal, static shape subgraphs",
    run=run_cleanup,
)


def _eye_nodes(x: ir.Value, k: int, dtype: ir.DataType, stem: str) -> tuple[list[ir.Node], ir.Value]:
    """Nodes computing EyeLike(x, k, dtype) for a rank-2 `x` of any shape, and their output."""
    new: list[ir.Node] = []

    def const(name: str, arr: np.ndarray) -> ir.Value:
        c = ir.node("Constant", [], attributes={"value": ir.tensor(arr, name=f"{stem}_{name}")})
        new.append(c)
        return c.outputs[0]

    def op(op_type: str, inputs: list[ir.Value], **attrs: int) -> ir.Value:
        n = ir.node(op_type, inputs, attributes=attrs, name=f"{stem}_{op_type.lower()}{len(new)}")
        new.append(n)
        return n.outputs[0]

    shape = op("Shape", [x])
    zero, one = const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64))
    rows = op("Range", [zero, op("Gather", [shape, zero]), one])
    cols = op("Range", [zero, op("Gather", [shape, one]), one])
    rows = op("Reshape", [rows, const("col_shape", np.array([-1, 1], np.int64))])
    cols = op("Reshape", [cols, const("row_shape", np.array([1, -1], np.int64))])
    if k:
        rows = op("Add", [rows, const("k", np.array(k, np.int64))])
    return new, op("Cast", [op("Equal", [rows, cols])], to=int(dtype))
