"""cleanup: constant folding, dead-node / Identity / no-op Cast removal, static shape subgraphs.

All of it is onnxscript's optimizer (`onnxscript.optimizer.optimize_ir`): `FoldConstantsPass`
folds constant subgraphs, and with node-level shape inference it turns `Shape`/`Gather`/`Concat`
chains over static dims into constants; its default rewrite rules remove no-op Cast / Expand /
Transpose, `x+0`, `x*1`, Dropout and collapse Reshape chains; `RemoveUnusedNodesPass` drops dead
nodes. Functions are not inlined, so plugin reference functions survive a late cleanup.
Exported graphs also carry `Identity` nodes that the optimizer keeps; onnx_ir's
`IdentityEliminationPass` removes those that do not name a graph output.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript import optimizer

from trtforge.passes._base import PassContext, PassOutcome, PassSpec


def run_cleanup(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fold and clean in place; `matches` is the number of nodes removed."""
    before = _count(model)
    passthrough = {i: v.name for i, v in enumerate(model.graph.outputs) if v.is_graph_input()}
    output_names = [v.name for v in model.graph.outputs]
    optimizer.optimize_ir(model, num_iterations=2, inline=False)
    _restore_passthrough(model.graph, passthrough)
    identity = common_passes.IdentityEliminationPass()(model)
    _restore_output_names(model.graph, output_names)
    outcome = PassOutcome()
    removed = before - _count(model)
    outcome.matches = max(removed, 0)
    outcome.per_rule["nodes_removed"] = outcome.matches
    if identity.modified:
        outcome.notes.append("removed Identity nodes")
    return outcome


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
            holder.name = _fresh(f"{name}_inner", taken)
        taken.discard(value.name)
        value.name = name
        taken.add(name)
        seen.add(value)


def _fresh(base: str, taken: set[str]) -> str:
    k = 0
    while f"{base}{k}" in taken:
        k += 1
    taken.add(f"{base}{k}")
    return f"{base}{k}"


def _count(model: ir.Model) -> int:
    return sum(1 for _ in model.graph)


CLEANUP = PassSpec(
    name="cleanup",
    summary="constant folding, dead/Identity/no-op removal, static shape subgraphs",
    run=run_cleanup,
)
