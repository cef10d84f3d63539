"""qkv: sibling projections of one tensor -> one MatMul over concatenated weights + Split.

    q = x @ Wq (+ bq);  k = x @ Wk (+ bk);  v = x @ Wv (+ bv)
      ->  [q, k, v] = Split(x @ [Wq | Wk | Wv] (+ [bq | bk | bv]), [Nq, Nk, Nv], axis=-1)

This is a grouping of independent nodes around a shared input, not a chain, so it is a plain
onnx_ir walk rather than a pattern rule. Candidates: `MatMul(x, W)` with W a constant rank-2
initializer; two or more on the same `x` with the same dtype and input size are merged (Q/K/V in
attention, also gate/up projections when the swiglu pass did not take them), in graph order.
Widths may differ: grouped-query attention has Nk = Nv < Nq (Llama, Mistral, Qwen2), and the
ledger names such a group "Q/K/V (GQA ...)". Bias `Add`s with constant [N] vectors are folded
in when at least one member has one (Qwen2 has q/k/v biases); members without get zeros (x + 0
is exact). A group whose outputs are graph outputs is skipped, and so are MatMuls inside If/Loop/Scan
bodies (they read `x` from the outer scope but are not the main graph's siblings). GPT-2's `Gemm`
c_attn is already merged and matches nothing.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from trtforge.core.names import fresh_name, ir_graph_names
from trtforge.passes._base import PassContext, PassOutcome, PassSpec


def projection_weight(node: ir.Node, x: ir.Value) -> np.ndarray | None:
    """W of `MatMul(x, W)` with W a constant rank-2 tensor, else None."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    if node.inputs[0] is not x:
        return None
    w = node.inputs[1]
    if w is None or w.const_value is None or w.const_value.shape.rank() != 2:
        return None
    return w.const_value.numpy()


def _bias(node: ir.Node, n_out: int) -> tuple[ir.Node, np.ndarray] | None:
    """The single `Add(out, b)` consumer with b a constant [N] vector, if there is one."""
    out = node.outputs[0]
    users = out.consumers()
    if len(users) != 1 or users[0].op_type != "Add" or users[0].domain not in ("", "ai.onnx"):
        return None
    add = users[0]
    if add.graph is not node.graph:  # an Add inside an If/Loop/Scan body reads it; not a bias of ours
        return None
    other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    if other is None or other.const_value is None:
        return None
    b = other.const_value.numpy()
    if b.ndim != 1 or b.shape[0] != n_out:
        return None
    return add, b


def _is_graph_output(graph: ir.Graph, values: list[ir.Value]) -> bool:
    outs = {id(v) for v in graph.outputs}
    return any(id(v) in outs for v in values)


def _fill_biases(biases: list, group: list[tuple[ir.Node, np.ndarray]]) -> list | None:
    """Biases with zeros for the members that have none, or None when nothing is to be folded."""
    present = [b for b in biases if b is not None]
    if not present or len({b[1].dtype for b in present}) != 1:
        return None
    dtype = present[0][1].dtype
    return [b if b is not None else (None, np.zeros(w.shape[1], dtype)) for b, (_, w) in zip(biases, group)]


def layout(widths: list[int]) -> str:
    """Ledger label of a merged group: Q/K/V (with the GQA head-width ratio) or N projections."""
    if len(widths) == 3 and widths[1] == widths[2]:
        q, kv = widths[0], widths[1]
        if q == kv:
            return "Q/K/V"
        if q > kv and q % kv == 0:
            return f"Q/K/V (GQA, q:kv width {q // kv}:1)"
    return f"{len(widths)} projections"


def merge_projections(
    graph: ir.Graph, x: ir.Value, group: list[tuple[ir.Node, np.ndarray]], stem: str
) -> list[ir.Value] | None:
    """Replace the MatMuls of `group` (in order) by one MatMul + Split; returns the Split outputs.

    None (graph untouched) when a member's output is a graph output.
    """
    nodes = [n for n, _ in group]
    widths = [int(w.shape[1]) for _, w in group]
    biases = _fill_biases([_bias(n, w.shape[1]) for n, w in group], group)
    use_bias = biases is not None
    finals = [n.outputs[0] for n in nodes]
    if use_bias:
        finals = [b[0].outputs[0] if b[0] is not None else f for b, f in zip(biases, finals)]
    if _is_graph_output(graph, finals):
        return None
    # a model that already holds a 'trtforge_qkv_0_weight' (one optimized before) made register_initializer
    # raise, or a second definition of that name: the stem begins no name in the graph
    stem = fresh_name(stem, ir_graph_names(graph), stem=True)
    w_value = ir.Value(name=f"{stem}_weight", const_value=ir.tensor(np.concatenate([w for _, w in group], 1)))
    graph.register_initializer(w_value)
    matmul = ir.node("MatMul", [x, w_value], name=f"{stem}_matmul")
    new_nodes = [matmul]
    merged = matmul.outputs[0]
    if use_bias:
        b_value = ir.Value(name=f"{stem}_bias", const_value=ir.tensor(np.concatenate([b[1] for b in biases])))
        graph.register_initializer(b_value)
        add = ir.node("Add", [merged, b_value], name=f"{stem}_bias_add")
        new_nodes.append(add)
        merged = add.outputs[0]
    split_sizes = ir.Value(name=f"{stem}_split", const_value=ir.tensor(np.array(widths, dtype=np.int64)))
    graph.register_initializer(split_sizes)
    split = ir.node(
        "Split", [merged, split_sizes], attributes={"axis": -1}, num_outputs=len(group), name=f"{stem}_split"
    )
    new_nodes.append(split)
    first = min(nodes, key=_position(graph))
    graph.insert_before(first, new_nodes)
    for old, new in zip(finals, split.outputs):
        name, old.name = old.name, None
        new.name = name
        new.shape = old.shape
        if old.dtype is not None:  # (an earlier merge's output, swiglu's gate/up, is untyped)
            new.dtype = old.dtype
        old.replace_all_uses_with(new)
    dead = [b[0] for b in biases if b[0] is not None] if use_bias else []
    graph.remove([*dead, *nodes], safe=True)
    return list(split.outputs)


def _position(graph: ir.Graph):
    order = {id(n): i for i, n in enumerate(graph)}
    return lambda n: order[id(n)]


def run_qkv(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Merge sibling constant-weight MatMuls in place; `matches` is the number of groups merged."""
    graph = model.graph
    outcome = PassOutcome()
    position = _position(graph)
    sources = list(graph.inputs) + [o for n in graph for o in n.outputs]
    for x in sources:
        group: dict[tuple, list[tuple[ir.Node, np.ndarray]]] = {}
        for node in list(x.consumers()):
            if node.graph is not graph:  # a MatMul inside an If/Loop/Scan body: not a sibling here
                continue
            w = projection_weight(node, x)
            if w is not None:
                group.setdefault((w.dtype, w.shape[0]), []).append((node, w))
        for members in group.values():
            if len(members) < 2:
                continue
            members.sort(key=lambda m: position(m[0]))
            if merge_projections(graph, x, members, f"trtforge_qkv_{outcome.matches}") is not None:
                outcome.matches += 1
                key = f"{layout([int(w.shape[1]) for _, w in members])} -> MatMul+Split"
                outcome.per_rule[key] = outcome.per_rule.get(key, 0) + 1
            elif ctx.debug:
                outcome.rejected.append(f"qkv: projections of '{x.name}' feed graph outputs; not merged")
    drop_unused_initializers(graph)
    return outcome


def drop_unused_initializers(graph: ir.Graph) -> None:
    """Remove initializers nothing reads any more (the weights a merge replaced)."""
    inputs = {id(v) for v in graph.inputs}
    for name, v in list(graph.initializers.items()):
        if not v.uses() and id(v) not in inputs and v not in graph.outputs:
            del graph.initializers[name]


QKV = PassSpec(
    name="qkv",
    summary="sibling Q/K/V MatMuls (+bias) -> one MatMul + Split",
    run=run_qkv,
)
