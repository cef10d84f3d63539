"""The `paged` attention strategy: a paged-cache step in standard ONNX -> one PagedAttention node per layer.

Matched form (what the decoder's paged step graph holds with either exporter, and what the plugin's
reference function holds), pools [num_blocks, block_size, Hkv, D]:

    flat    = Reshape(pool, [-1, Hkv, D])                   (a constant, or Concat(-1, Shape(pool)[2:]))
    pool'   = Reshape(ScatterND(flat, Unsqueeze(slots, -1), U), Shape(pool) or its static shape)
    K       = Reshape(Transpose(Gather(pool', table, axis=0), perm=[0, 3, 1, 2, 4]))   [B, Hkv, L, D]
    K'      = K, optionally through Cast and Where(valid, K, 0 or CastLike(0, K))      (V likewise)
    O       = Attention(q or Cast(q), K', V', mask), optionally followed by Cast / CastLike to q's dtype

U [B, S, Hkv, D] is the new rows (Transpose(k, perm=[0, 2, 1, 3]) or already in that order). The
slot mapping and block table are the rank-2 integer graph inputs behind the write and gather
indices (through Cast / Clip); the lengths are the graph inputs behind the mask, named by the step
graph contract (``past_lens`` + ``new_lens``) or by the node's own (``seq_lens`` + ``query_lens``).
The node computes the op's own semantics (query i of row b at position past[b] + i, keys j <= it
and j < past[b] + new[b]); that the matched graph computes the same is not inferred from its index
arithmetic but proved by the pass manager's ONNX Runtime check. Sliding-window layers (a window
shorter than the step graph's max_seq, read from its generation metadata, or a lower bound in a
mask without metadata) are refused: the paged kernels have no window mask; so are chunked layers (Llama
4's attention chunks shorter than max_seq, read from the same metadata). Soft-capped layers (Gemma 2)
hold no Attention node (the step graph spells their attention out) and are left as they are, as is an
Attention node with a ``softcap`` attribute: the paged kernels have no cap. ALiBi layers (BLOOM, MPT,
falcon-rw) are spelled out too, so the PagedAttention plugin never sees them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from trtforge.core.onnx_io import GENERATION_KEY, parse_generation
from trtforge.errors import UserError
from trtforge.passes._base import PassOutcome

_INT32 = ir.DataType.INT32
_INTS = (ir.DataType.INT32, ir.DataType.INT64)
_LENGTH_NAMES = (("past_lens", "new_lens"), ("seq_lens", "query_lens"))


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


def _is_fill_constant(value: ir.Value | None) -> bool:
    """A constant, possibly through Cast / CastLike (the fill value of Where(valid, K, 0))."""
    node = value.producer() if value is not None else None
    if node is not None and node.op_type in ("Cast", "CastLike") and node.domain in ("", "ai.onnx"):
        value = node.inputs[0]
    return _is_constant(value)


def _constant_ints(value: ir.Value | None) -> list[int] | None:
    """The int64 values of a constant / initializer 1-D tensor (None otherwise)."""
    if value is None:
        return None
    tensor = value.const_value
    node = value.producer()
    if tensor is None and node is not None and node.op_type == "Constant":
        attr = node.attributes.get("value")
        tensor = attr.as_tensor() if attr is not None else None
    if tensor is None:
        return None
    array = np.asarray(tensor.numpy())
    return [int(x) for x in array.reshape(-1)] if array.dtype.kind in "iu" and array.ndim <= 1 else None


def _strip_cache_casts(value: ir.Value) -> ir.Value:
    """K' -> K through any Cast and Where(valid, K, 0) wrappers."""
    while True:
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return value
        if node.op_type == "Cast":
            value = node.inputs[0]
        elif node.op_type == "Where" and _is_fill_constant(node.inputs[2]):
            value = node.inputs[1]
        else:
            return value


def _static_dims(value: ir.Value) -> list[int | None] | None:
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in value.shape]


def _is_shape_of(target: ir.Value, pool: ir.Value, start: int | None) -> bool:
    node = _producer(target, "Shape")
    if node is None or node.inputs[0] is not pool or node.attributes.get_int("end", None) is not None:
        return False
    return node.attributes.get_int("start", 0) == (start or 0)


def _flat_target_ok(target: ir.Value, pool: ir.Value) -> bool:
    """[-1, Hkv, D] for `pool` [N, bs, Hkv, D]: a matching constant or Concat(-1, Shape(pool)[2:])."""
    dims = _static_dims(pool)
    const = _constant_ints(target)
    if const is not None:
        return dims is not None and len(dims) == 4 and const == [-1, dims[2], dims[3]]
    concat = _producer(target, "Concat")
    if concat is None or len(concat.inputs) != 2:
        return False
    return _constant_ints(concat.inputs[0]) == [-1] and _is_shape_of(concat.inputs[1], pool, 2)


def _back_target_ok(target: ir.Value, pool: ir.Value) -> bool:
    """The pool's own shape: Shape(pool), or a constant of its static dims (-1/0 where dynamic)."""
    if _is_shape_of(target, pool, None):
        return True
    dims, const = _static_dims(pool), _constant_ints(target)
    if dims is None or const is None or len(const) != 4:
        return False
    same = all(c == d if d is not None else c in (-1, 0) for c, d in zip(const, dims))
    return same and const.count(-1) <= 1


class _Side:
    """One pool's write + gather: the pool, its updated value, the new rows U and the index values."""

    def __init__(self, pool: ir.Value, written: ir.Value, rows: ir.Value, slots: ir.Value, table: ir.Value):
        self.pool, self.written, self.rows, self.slots, self.table = pool, written, rows, slots, table


def _gathered_pool(value: ir.Value) -> _Side | str:
    """The write + gather behind a gathered cache K/V, or why it is not the paged form."""
    reshape = _producer(_strip_cache_casts(value), "Reshape")
    transpose = _producer(reshape.inputs[0] if reshape else None, "Transpose")
    gather = _producer(transpose.inputs[0] if transpose else None, "Gather")
    if gather is None or gather.attributes.get_int("axis", 0) != 0:
        return "k/v are not gathered from a ScatterND-written pool through a block table"
    if _ints(transpose, "perm") != [0, 3, 1, 2, 4]:
        return (
            f"the gathered blocks are transposed with perm {_ints(transpose, 'perm')}, not [0, 3, 1, 2, 4] "
            "(pools must be [num_blocks, block_size, Hkv, D])"
        )
    back = _producer(gather.inputs[0], "Reshape")
    scatter = _producer(back.inputs[0] if back else None, "ScatterND")
    if scatter is None or scatter.attributes.get_string("reduction", "none") != "none":
        return "k/v are not gathered from a ScatterND-written pool through a block table"
    flat = _producer(scatter.inputs[0], "Reshape")
    if flat is None:
        return "the ScatterND does not write the pool flattened to [num_blocks * block_size, Hkv, D]"
    pool = flat.inputs[0]
    if pool.shape is None or pool.shape.rank() != 4:
        return f"pool '{pool.name}' is not of rank 4 [num_blocks, block_size, Hkv, D]"
    if not _flat_target_ok(flat.inputs[1], pool) or not _back_target_ok(back.inputs[1], pool):
        return f"pool '{pool.name}' is not flattened to [-1, Hkv, D] and reshaped back to its own shape"
    unsqueeze = _producer(scatter.inputs[1], "Unsqueeze")
    if unsqueeze is None:
        return "the write indices are not Unsqueeze(slot_mapping, -1)"
    return _Side(pool, back.outputs[0], scatter.inputs[2], unsqueeze.inputs[0], gather.inputs[1])


def _int_inputs(starts: Iterable[ir.Value | None], rank: int, graph: ir.Graph) -> list[ir.Value]:
    """The integer graph inputs of `rank` among the ancestors of `starts` (graph order)."""
    inputs = {id(v) for v in graph.inputs}
    found: set[int] = set()
    seen: set[int] = set()
    stack = [v for v in starts if v is not None]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) in inputs and v.dtype in _INTS and v.shape is not None and v.shape.rank() == rank:
            found.add(id(v))
        node = v.producer()
        if node is not None:
            stack.extend(i for i in node.inputs if i is not None)
    return [v for v in graph.inputs if id(v) in found]


def _one_input(value: ir.Value, rank: int, graph: ir.Graph) -> ir.Value | None:
    found = _int_inputs([value], rank, graph)
    return found[0] if len(found) == 1 else None


def _mask_ops(mask: ir.Value) -> set[str]:
    ops: set[str] = set()
    seen: set[int] = set()
    stack = [mask]
    while stack:
        v = stack.pop()
        node = v.producer()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        ops.add(node.op_type)
        stack.extend(i for i in node.inputs if i is not None)
    return ops


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


def _generation(model: ir.Model) -> dict | None:
    """The step graph's generation section (its sliding windows and head counts decide refusals here);
    None for a graph without one; UserError for one that is not a JSON object (read as none, a window the
    paged kernels cannot mask would go unrefused)."""
    text = model.metadata_props.get(GENERATION_KEY)
    return parse_generation(text, model.graph.name or "the model") if text else None


class _Fuser:
    """Fuses one graph's layers; the int32 index inputs the node needs are made once and shared."""

    def __init__(self, model: ir.Model, module) -> None:
        self.model, self.graph, self.module = model, model.graph, module
        self.generation = _generation(model)
        self.made: dict[tuple, ir.Value] = {}
        self.inserted = False  # helper nodes went in (a later refusal may leave some unused)

    def _node(self, op_type: str, inputs: list[ir.Value], before: ir.Node, **attrs) -> ir.Value:
        ir_attrs = [
            ir.AttrInt64(k, v) if isinstance(v, int) else ir.AttrInt64s(k, v) for k, v in attrs.items()
        ]
        node = ir.Node("", op_type, inputs, ir_attrs, num_outputs=1)
        self.graph.insert_before(before, node)
        self.inserted = True
        return node.outputs[0]

    def _int32(self, value: ir.Value, before: ir.Node) -> ir.Value:
        if value.dtype == _INT32:
            return value
        key = ("int32", id(value))
        if key not in self.made:
            out = self._node("Cast", [value], before, to=_INT32.value)
            out.name, out.dtype = f"{value.name}__int32", _INT32
            out.shape = ir.Shape(value.shape) if value.shape is not None else None
            self.made[key] = out
        return self.made[key]

    def _lengths(self, past: ir.Value, new: ir.Value, before: ir.Node) -> tuple[ir.Value, ir.Value]:
        key = ("seq_lens", id(past), id(new))
        if key not in self.made:
            total = self._node("Add", [past, new], before)
            total.name, total.dtype = "paged_seq_lens__wide", past.dtype
            total.shape = ir.Shape(past.shape) if past.shape is not None else None
            self.made[key] = self._int32(total, before)
        return self.made[key], self._int32(new, before)

    def _metadata_heads(self, pool: ir.Value) -> int | None:
        """The query head count the step graph's metadata gives the layer of `pool` (its
        ``num_heads_per_layer`` entry where the layers' differ, as Laguna's; else ``num_heads``), None
        without metadata or, where the counts differ, a pool name naming no layer."""
        gen = self.generation
        if gen is None:
            return None
        per_layer = gen.get("num_heads_per_layer")
        if not per_layer:
            return gen.get("num_heads")
        match = re.fullmatch(r"(?:key|value)_pool\.(\d+)", pool.name or "")
        layer = int(match.group(1)) if match is not None else len(per_layer)
        return int(per_layer[layer]) if layer < len(per_layer) else None

    def _window_refusal(self, pool: ir.Value, mask: ir.Value) -> str | None:
        gen = self.generation
        match = re.fullmatch(r"(?:key|value)_pool\.(\d+)", pool.name or "")
        if gen is not None and match is not None:
            windows, max_seq = gen.get("sliding_windows") or [], gen.get("max_seq")
            layer = int(match.group(1))
            window = windows[layer] if layer < len(windows) else None
            if window is not None and (max_seq is None or int(window) < int(max_seq)):
                return (
                    f"layer {layer} attends through a sliding window of {window} tokens (shorter than the "
                    f"step graph's max_seq {max_seq}); the paged kernels have no window mask"
                )
            chunks = gen.get("attention_chunks") or []
            chunk = chunks[layer] if layer < len(chunks) else None
            if chunk is not None and (max_seq is None or int(chunk) < int(max_seq)):
                return (
                    f"layer {layer} attends in chunks of {chunk} positions (attention_chunk_size, shorter "
                    f"than the step graph's max_seq {max_seq}); the paged kernels have no chunk mask"
                )
            return None
        if {"Greater", "GreaterOrEqual"} & _mask_ops(mask):
            return "the mask bounds key positions from below (a sliding window?); the paged kernels have none"
        return None

    def fuse(self, attention: ir.Node) -> str | None:
        graph = self.graph
        inputs = list(attention.inputs)
        if len(inputs) != 4 or any(v is None for v in inputs) or len(attention.outputs) != 1:
            return "needs exactly (q, k, v, attn_mask) and one output"
        if attention.attributes.get_int("is_causal", 0):
            return "is_causal is set (the paged form carries its mask)"
        if attention.attributes.get_float("softcap", 0.0):
            return "softcap is set; the paged kernels have no soft-capping"
        k_side, v_side = _gathered_pool(inputs[1]), _gathered_pool(inputs[2])
        for side in (k_side, v_side):
            if isinstance(side, str):
                return side
        k_slots, v_slots = _one_input(k_side.slots, 2, graph), _one_input(v_side.slots, 2, graph)
        table, v_table = _one_input(k_side.table, 2, graph), _one_input(v_side.table, 2, graph)
        if k_slots is None or table is None:
            return "no single integer slot_mapping [B, S] / block table [B, max_blocks] input behind indices"
        if k_slots is not v_slots or table is not v_table:
            return "k and v pools use different slot mappings or block tables"
        if table.dtype != _INT32:
            return f"block table '{table.name}' is {table.dtype.name}; the node takes int32"
        lengths = {v.name: v for v in _int_inputs([inputs[3]], 1, graph)}
        names = next((pair for pair in _LENGTH_NAMES if set(pair) <= set(lengths)), None)
        if names is None:
            return (
                "the mask's lengths are not the step graph's past_lens / new_lens inputs (nor "
                f"seq_lens / query_lens); found {sorted(lengths) or 'none'}"
            )
        why = self._window_refusal(k_side.pool, inputs[3])
        if why is not None:
            return why
        q = inputs[0]
        q_cast = _producer(q, "Cast")
        if q_cast is not None:
            q = q_cast.inputs[0]
        heads, kv_heads, head_dim = _static(q, 1), _static(k_side.pool, 2), _static(k_side.pool, 3)
        if heads is None:  # the step graph's metadata names it
            heads = self._metadata_heads(k_side.pool)
        if heads is None or kv_heads is None:
            return "query / pool head counts are not static (and no step graph metadata gives them)"
        scale_attr = attention.attributes.get("scale")
        if scale_attr is None and head_dim is None:
            return "no scale attribute and no static head dim for the default scale"
        scale = float(scale_attr.as_float()) if scale_attr is not None else head_dim**-0.5
        try:  # validates attributes and float inputs before anything is inserted
            self.module.paged_attention_attributes(num_heads=heads, kv_num_heads=kv_heads, scale=scale)
        except UserError as e:
            return str(e)
        k_new, v_new = self._new_rows(k_side, attention), self._new_rows(v_side, attention)
        slots = self._int32(k_slots, attention)
        if names == _LENGTH_NAMES[0]:
            seq_lens, query_lens = self._lengths(lengths[names[0]], lengths[names[1]], attention)
        else:
            seq_lens, query_lens = (self._int32(lengths[n], attention) for n in names)
        try:
            node = self.module.make_paged_attention_node(
                q, k_new, v_new, k_side.pool, v_side.pool, table, slots, seq_lens, query_lens,
                num_heads=heads, kv_num_heads=kv_heads, scale=scale, name=attention.name or None,
            )  # fmt: skip
        except UserError as e:
            return str(e)
        final = _final_output(attention, q)
        graph.insert_before(attention, node)
        replaced = (final, k_side.written, v_side.written)
        for old, new in zip(replaced, node.outputs):
            name = old.name
            was_output = old in graph.outputs
            ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
            if was_output:  # graph outputs keep their names (e.g. the updated pools)
                old.name = f"{name}__replaced"
                new.name = name
        return None

    def _new_rows(self, side: _Side, before: ir.Node) -> ir.Value:
        """[B, Hkv, S, D] new rows behind U [B, S, Hkv, D]: Transpose's input, or a new Transpose."""
        transpose = _producer(side.rows, "Transpose")
        if transpose is not None and _ints(transpose, "perm") == [0, 2, 1, 3]:
            return transpose.inputs[0]
        out = self._node("Transpose", [side.rows], before, perm=[0, 2, 1, 3])
        out.dtype = side.rows.dtype
        if side.rows.shape is not None and side.rows.shape.rank() == 4:
            s = list(side.rows.shape)
            out.shape = ir.Shape([s[0], s[2], s[1], s[3]])
        return out


def fuse_paged_attention(model: ir.Model, module, outcome: PassOutcome) -> None:
    """Replace every matched paged step attention by a ``trtforge::PagedAttention`` node, in place.

    `module` is ``trtforge.plugins.attention.paged_onnx_node``; rejections go to `outcome.rejected`.
    """
    fuser = _Fuser(model, module)
    for attention in [n for n in model.graph if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]:
        why = fuser.fuse(attention)
        if why is None:
            outcome.matches += 1
            outcome.per_rule["PagedAttentionFusion"] = outcome.per_rule.get("PagedAttentionFusion", 0) + 1
        else:
            outcome.rejected.append(f"PagedAttentionFusion at {attention.name or 'Attention'}: {why}")
    if outcome.matches or fuser.inserted:
        RemoveUnusedNodesPass()(model)  # the replaced write / gather / mask / attention chains
