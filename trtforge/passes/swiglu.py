"""swiglu: SiLU-gated MLPs -> one gate/up MatMul + Split feeding the gate.

    h = silu(x @ Wg) * (x @ Wu),   silu(g) = g * Sigmoid(g)
      ->  [g, u] = Split(x @ [Wg | Wu], [I, I], axis=-1);  h = (g * Sigmoid(g)) * u

ONNX has no SwiGLU op, and `Swish` only exists from opset 24 (the pipeline stays at 23, where
TensorRT-RTX 1.7.1 and ONNX Runtime 1.32 parse everything), so the fusion that pays is the GEMM
one: the two projections of the same activation become one MatMul, and TensorRT fuses the
remaining Sigmoid-Mul-Mul into one pointwise kernel after it. Unlike the generic sibling merge
in `qkv`, this pass only takes a pair proven to be a gate: one MatMul's output goes through
`g * Sigmoid(g)` (either operand order) and is multiplied by the other's, both reading the same
`x` with constant weights of one shape. The gate comes first in the merged weight.
"""

from __future__ import annotations

import onnx_ir as ir

from trtforge.passes._base import PassContext, PassOutcome, PassSpec
from trtforge.passes.qkv import drop_unused_initializers, merge_projections, projection_weight


def _silu_input(v: ir.Value) -> ir.Value | None:
    """g when `v` is `g * Sigmoid(g)` or `Sigmoid(g) * g`, else None."""
    node = v.producer()
    if node is None or node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    for a, b in (node.inputs, node.inputs[::-1]):
        sig = b.producer() if b is not None else None
        if sig is not None and sig.op_type == "Sigmoid" and sig.inputs[0] is a:
            return a
    return None


def _projection(v: ir.Value) -> ir.Node | None:
    """The MatMul producing `v`, directly or through a constant bias Add."""
    node = v.producer()
    if node is not None and node.op_type == "Add" and len(node.inputs) == 2:
        a, b = node.inputs
        node = a.producer() if b is not None and b.const_value is not None and a is not None else None
    if node is None or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
        return None
    return node


def _gate(mul: ir.Node) -> tuple[ir.Node, ir.Node] | None:
    """(gate MatMul, up MatMul) when `mul` is silu(x @ Wg) * (x @ Wu) on one x, else None."""
    if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
        return None
    for silu, up in (mul.inputs, mul.inputs[::-1]):
        g = _silu_input(silu) if silu is not None else None
        if g is None or up is None or g is up:
            continue
        gate_mm, up_mm = _projection(g), _projection(up)
        if gate_mm is None or up_mm is None:
            continue
        x = gate_mm.inputs[0]
        wg, wu = projection_weight(gate_mm, x), projection_weight(up_mm, x)
        if wg is None or wu is None or wg.shape != wu.shape or wg.dtype != wu.dtype:
            continue
        return gate_mm, up_mm
    return None


def run_swiglu(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Merge the gate and up projections of every SiLU-gated MLP in place."""
    graph = model.graph
    outcome = PassOutcome()
    for mul in list(graph):
        if mul.graph is not graph:  # removed by an earlier merge
            continue
        pair = _gate(mul)
        if pair is None:
            continue
        x = pair[0].inputs[0]
        group = [(n, projection_weight(n, x)) for n in pair]
        if merge_projections(graph, x, group, f"trtforge_swiglu_{outcome.matches}") is None:
            if ctx.debug:
                outcome.rejected.append(f"swiglu: gate of '{mul.name}' feeds a graph output; not merged")
            continue
        outcome.matches += 1
    if outcome.matches:
        outcome.per_rule["SwiGLU gate/up -> MatMul+Split"] = outcome.matches
    drop_unused_initializers(graph)
    return outcome


SWIGLU = PassSpec(
    name="swiglu",
    summary="silu(x@Wg) * (x@Wu) -> one MatMul over [Wg | Wu] + Split",
    run=run_swiglu,
)
