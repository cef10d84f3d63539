"""What an attention mask subgraph is made of: a causal position comparison, a padding input, or both.

Exporters build the additive mask very differently (SDPA's `Where(And(le, GatherND(mask)), 0,
finfo.min)`, eager `(1 - mask) * -inf`, `Trilu`), so the analysis is structural, not a pattern:

- *data inputs*: the graph inputs whose values (not just shapes) reach the mask; ancestors are
  walked but not through `Shape`/`Size`, whose outputs depend on shapes only.
- *causal*: exactly one causal marker: a `LessOrEqual(k_idx, q_idx)` / `GreaterOrEqual(q_idx, k_idx)`
  (or the strict forms with the sides swapped) between two non-constant position tensors, the key
  index laid out along the last axis and the query index along the one before; or a `Trilu` in the
  mask. A second marker is another ordering constraint between the positions, e.g. a sliding window
  (`k_idx > q_idx - window`, Mistral): the mask is then more than causal and stays a mask.

The native strategy only replaces a mask by `is_causal=1` when it is causal and reads no graph
input; otherwise the mask is kept as `attn_mask`, which is exact whatever the mask means. The
plugin strategy needs the (padding input, causal) decomposition; verification proves it.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

_SHAPE_ONLY = {"Shape", "Size"}
_KEEP_IF_K_LE_Q = {"LessOrEqual": True, "GreaterOrEqual": False}
_KEEP_IF_K_LT_Q = {"Less": True, "Greater": False}


@dataclasses.dataclass(frozen=True)
class MaskInfo:
    """Summary of a mask subgraph."""

    data_inputs: tuple[ir.Value, ...]
    causal: bool

    @property
    def padding_input(self) -> ir.Value | None:
        """The single [B, S] integer/bool graph input the mask reads, if that is all it reads."""
        if len(self.data_inputs) != 1:
            return None
        v = self.data_inputs[0]
        if v.shape is None or v.shape.rank() != 2 or v.dtype is None:
            return None
        if v.dtype.is_floating_point():
            return None
        return v


def _is_const(v: ir.Value | None) -> bool:
    return v is None or v.const_value is not None


def _row_col(v: ir.Value) -> tuple[bool, bool]:
    """(laid out along the last axis, laid out along the second-to-last axis) from static 1-dims."""
    if v.shape is None or v.shape.rank() < 2:
        return False, False
    last, before = v.shape[-1], v.shape[-2]
    return (before == 1 and last != 1), (last == 1 and before != 1)


def _is_causal_compare(node: ir.Node) -> bool:
    if len(node.inputs) != 2:
        return False
    a, b = node.inputs[0], node.inputs[1]
    if _is_const(a) or _is_const(b):
        return False
    a_row, a_col = _row_col(a)
    b_row, b_col = _row_col(b)
    if node.op_type in _KEEP_IF_K_LE_Q:
        key_first = _KEEP_IF_K_LE_Q[node.op_type]
    elif node.op_type in _KEEP_IF_K_LT_Q:
        # `k > q` / `q < k` select the positions to MASK (used with Where(cond, -inf, 0)).
        key_first = not _KEEP_IF_K_LT_Q[node.op_type]
    else:
        return False
    return (a_row and b_col) if key_first else (a_col and b_row)


def _is_plain_tril(node: ir.Node) -> bool:
    """Trilu keeping the lower triangle with the diagonal (upper=0, k absent or 0)."""
    if node.attributes.get_int("upper", 1) != 0:
        return False
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return True
    k = node.inputs[1].const_value
    return k is not None and int(k.numpy().reshape(-1)[0]) == 0


def analyze_mask(mask: ir.Value, graph: ir.Graph) -> MaskInfo:
    """Walk the mask's ancestors (see module docstring) and summarise them."""
    graph_inputs = {id(v) for v in graph.inputs}
    data_inputs: list[ir.Value] = []
    markers = 0
    seen: set[int] = set()
    stack = [mask]
    while stack:
        v = stack.pop()
        if v is None or id(v) in seen or v.const_value is not None:
            continue
        seen.add(id(v))
        if id(v) in graph_inputs:
            data_inputs.append(v)
            continue
        node = v.producer()
        if node is None:
            continue
        if node.op_type in _SHAPE_ONLY:
            continue
        if node.op_type == "Trilu":
            markers += 1 if _is_plain_tril(node) else 2  # a shifted or upper Trilu is no plain causal mask
        elif _is_causal_compare(node):
            markers += 1
        stack.extend(node.inputs)
    return MaskInfo(tuple(data_inputs), markers == 1)
