"""Fresh names for the values, initializers and nodes a graph rewrite adds, so that a model which already
holds a name (one optimized or calibrated before, or a user's own 'x_scale') keeps it: one rule for the
passes (cleanup, the precision rewrite, the QKV merge) and for calibration's Q/DQ and SmoothQuant nodes,
on onnx_ir graphs and on ONNX protos alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir


def fresh_name(base: str, taken: set[str], *, stem: bool = False) -> str:
    """`base`, else `base_1`, `base_2`, ...: the first not in `taken`, which it joins. With `stem` it must
    also begin no name of `taken` as ``<it>_...``: a stem whose names the caller makes (``<stem>_weight``,
    ``<stem>_matmul``)."""
    name, k = base, 0
    while name in taken or (stem and any(t.startswith(f"{name}_") for t in taken)):
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def fresh_names(taken: Iterable[str]) -> Callable[[str], str]:
    """A `fresh(base)`: :func:`fresh_name` over `taken` and every name an earlier call gave."""
    used = set(taken)
    return lambda base: fresh_name(base, used)


def ir_graph_names(graph: ir.Graph) -> set[str]:
    """Every name in the onnx_ir `graph`: its inputs and initializers, and the names and outputs of its
    nodes at every depth (If/Loop/Scan bodies included, with their inputs and initializers)."""
    import onnx_ir as ir

    names = set(graph.initializers) | {v.name for v in graph.inputs if v.name}
    bodies: set[int] = {id(graph)}
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if node.name:
            names.add(node.name)
        names.update(o.name for o in node.outputs if o.name)
        body = node.graph
        if body is not None and id(body) not in bodies:  # (a body's own inputs and initializers)
            bodies.add(id(body))
            names |= set(body.initializers) | {v.name for v in body.inputs if v.name}
    return names


def proto_graph_names(graph: onnx.GraphProto) -> set[str]:
    """Every name in the ONNX `graph`: its inputs, outputs and initializers, and the names, inputs and
    outputs of its nodes, at every depth (with the bodies' own inputs, outputs and initializers)."""
    names = (
        {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    )
    for n in graph.node:
        names.add(n.name)
        names.update(n.input)
        names.update(n.output)
        for a in n.attribute:
            for body in (a.g, *a.graphs) if a.HasField("g") else a.graphs:
                names |= proto_graph_names(body)
    return names
