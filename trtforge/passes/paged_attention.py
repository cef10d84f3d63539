"""The `paged` attention strategy: a paged-cache decode step in standard ONNX -> one PagedAttention node.

Matched form (what a paged decoder export writes, and what the plugin's reference function holds):

    k_pool' = ScatterND(k_pool, idx, Transpose(k_new, perm=[0, 2, 1, 3]))      (v likewise, same idx)
    K = Reshape(Transpose(Gather(k_pool', table_idx, axis=0), perm=[0, 2, 1, 3, 4]))   [B, Hkv, L, D]
    K' = K, optionally through Cast and Where(valid, K, 0)                            (V likewise)
    O = Attention(q or Cast(q), K', V', mask), optionally followed by Cast / CastLike to q's dtype

The block table and per-sequence lengths are the int32 graph inputs of rank 2 and rank 1 that the
write indices and the gather indices are computed from. The node computes the op's own semantics
(write at seq_lens[b] - S_q + i, LOWER_RIGHT causal mask); that the matched graph computes the same
is not inferred from its index arithmetic but proved by the pass manager's ONNX Runtime check.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from trtforge.errors import UserError
from trtforge.passes._base import PassOutcome

_INT32 = ir.DataType.INT32


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _ints(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return list(attr.as_ints()) if attr is not None else None


def _is_constant(value: ir.Value | None) -> bool:
    if value is None:
        return False
    node = value.producer()
    return value.const_value is not None or (node is not None and node.op_type == "Constant")


def _strip_cache_casts(value: ir.Value) -> ir.Value:
    """K' -> K through any Cast and Where(valid, K, 0) wrappers."""
    while True:
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return value
        if node.op_type == "Cast":
            value = node.inputs[0]
        elif node.op_type == "Where" and _is_constant(node.inputs[2]):
            value = node.inputs[1]
        else:
            return value


def _gathered_pool(value: ir.Value) -> tuple[ir.Node, ir.Value] | None:
    """(the ScatterND writing the pool, the Gather's block indices) behind a gathered cache K/V."""
    reshape = _producer(_strip_cache_casts(value), "Reshape")
    transpose = _producer(reshape.inputs[0] if reshape else None, "Transpose")
    if transpose is None or _ints(transpose, "perm") != [0, 2, 1, 3, 4]:
        return None
    gather = _producer(transpose.inputs[0], "Gather")
    if gather is None or gather.attributes.get_int("axis", 0) != 0:
        return None
    scatter = _producer(gather.inputs[0], "ScatterND")
    if scatter is None or scatter.attributes.get_string("reduction", "none") != "none":
        return None
    return scatter, gather.inputs[1]


def _new_rows(scatter: ir.Node) -> ir.Value | None:
    """k_new [B, Hkv, S_q, D] behind the ScatterND's updates Transpose(perm=[0, 2, 1, 3])."""
    transpose = _producer(scatter.inputs[2], "Transpose")
    if transpose is None or _ints(transpose, "perm") != [0, 2, 1, 3]:
        return None
    return transpose.inputs[0]


def _int32_input(starts: Iterable[ir.Value], rank: int, graph: ir.Graph) -> ir.Value | None:
    """The one int32 graph input of `rank` among the ancestors of `starts` (None if none or several)."""
    inputs = {id(v) for v in graph.inputs}
    found: dict[int, ir.Value] = {}
    seen: set[int] = set()
    stack = [v for v in starts if v is not None]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) in inputs and v.dtype == _INT32 and v.shape is not None and v.shape.rank() == rank:
            found[id(v)] = v
        node = v.producer()
        if node is not None:
            stack.extend(i for i in node.inputs if i is not None)
    return next(iter(found.values())) if len(found) == 1 else None


def _static(value: ir.Value, axis: int) -> int | None:
    if value.shape is None or value.shape.rank() <= axis:
        return None
    d = value.shape[axis]
    return d if isinstance(d, int) else None


def _final_output(attention: ir.Node, q: ir.Value) -> ir.Value:
    """The Attention output, or the Cast/CastLike back to q's dtype that is its only consumer."""
    out = attention.outputs[0]
    uses = list(out.uses())
    if len(uses) == 1 and out not in attention.graph.outputs:
        user = uses[0].node
        if user.op_type in ("Cast", "CastLike") and user.outputs[0].dtype == q.dtype:
            return user.outputs[0]
    return out


def fuse_paged_attention(model: ir.Model, module, outcome: PassOutcome) -> None:
    """Replace every matched paged decode step by a ``trtforge::PagedAttention`` node, in place.

    `module` is ``trtforge.plugins.attention.paged_onnx_node``; rejections go to `outcome.rejected`.
    """
    graph = model.graph
    for attention in [n for n in graph if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]:
        why = _fuse_one(graph, attention, module)
        if why is None:
            outcome.matches += 1
            outcome.per_rule["PagedAttentionFusion"] = outcome.per_rule.get("PagedAttentionFusion", 0) + 1
        else:
            outcome.rejected.append(f"PagedAttentionFusion at {attention.name or 'Attention'}: {why}")
    if outcome.matches:
        RemoveUnusedNodesPass()(model)  # the replaced write / gather / attention chain


def _fuse_one(graph: ir.Graph, attention: ir.Node, module) -> str | None:
    inputs = list(attention.inputs)
    if len(inputs) != 4 or any(v is None for v in inputs) or len(attention.outputs) != 1:
        return "needs exactly (q, k, v, attn_mask) and one output"
    if attention.attributes.get_int("is_causal", 0):
        return "is_causal is set (the paged form carries its mask)"
    k_side, v_side = _gathered_pool(inputs[1]), _gathered_pool(inputs[2])
    if k_side is None or v_side is None:
        return "k/v are not gathered from a ScatterND-written pool through a block table"
    (k_scatter, k_tbl), (v_scatter, v_tbl) = k_side, v_side
    if k_scatter.inputs[1] is not v_scatter.inputs[1] or k_tbl is not v_tbl:
        return "k and v pools use different write or gather indices"
    k_new, v_new = _new_rows(k_scatter), _new_rows(v_scatter)
    if k_new is None or v_new is None:
        return "the pool updates are not Transpose(new rows, perm=[0, 2, 1, 3])"
    q = inputs[0]
    q_cast = _producer(q, "Cast")
    if q_cast is not None:
        q = q_cast.inputs[0]
    k_pool, v_pool = k_scatter.inputs[0], v_scatter.inputs[0]
    table = _int32_input([k_tbl], 2, graph)
    lens = _int32_input([k_scatter.inputs[1], inputs[3]], 1, graph)
    if table is None or lens is None:
        return "no single int32 block table [B, max_blocks] / seq_lens [B] graph input behind the indices"
    heads, kv_heads, head_dim = _static(q, 1), _static(k_pool, 1), _static(q, 3)
    if heads is None or kv_heads is None:
        return "query / pool head counts are not static"
    scale_attr = attention.attributes.get("scale")
    if scale_attr is None and head_dim is None:
        return "no scale attribute and no static head dim for the default scale"
    scale = float(scale_attr.as_float()) if scale_attr is not None else head_dim**-0.5
    try:  # validates before building: a refusal leaves nothing behind
        node = module.make_paged_attention_node(
            q, k_new, v_new, k_pool, v_pool, table, lens,
            num_heads=heads, kv_num_heads=kv_heads, scale=scale, name=attention.name or None,
        )  # fmt: skip
    except UserError as e:
        return str(e)
    final = _final_output(attention, q)
    graph.insert_before(attention, node)
    replaced = (final, k_scatter.outputs[0], v_scatter.outputs[0])
    for old, new in zip(replaced, node.outputs):
        name = old.name
        was_output = old in graph.outputs
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        if was_output:  # graph outputs keep their names (e.g. the present caches)
            old.name = f"{name}__replaced"
            new.name = name
    return None
