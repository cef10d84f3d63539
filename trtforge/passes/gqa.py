"""gqa: `Attention` over repeated K/V heads -> `Attention` over the grouped K/V (opset 23).

    k_rep = Reshape(Expand(Unsqueeze(k, 2), [B, Hkv, n, S, D]), [B, Hkv*n, S, D])   (HF repeat_kv)
    Attention(q, k_rep, v_rep [, mask])  ->  Attention(q, k, v [, mask], q_num_heads, kv_num_heads)

ONNX `Attention` (23) shares each K/V head between n consecutive query heads (head h reads K/V
head h // n), which is what repeat_kv's Unsqueeze-Expand-Reshape builds, so the copies can go:
the attention reads n times fewer K/V bytes. Runs after the attention pass, on the nodes it
emitted. Every dimension of both shape tensors except n must provably be k's own (a constant
equal to k's static dim or 1 in Expand, or `Shape(t)[i]` of k or of a tensor with the same
symbolic dim); legacy exports' `Where(shape == -1, 1, shape)` around the Expand shape is peeled.
The head counts are set as attributes when both are static (4-D inputs imply them anyway).

TensorRT-RTX 1.7.1 (measured on this machine): 4-D `Attention` with 4 query and 2 K/V heads,
with a bool mask or `is_causal`, parses to IAttention and builds in FP16.
"""

from __future__ import annotations

import functools

import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern

from trtforge.passes._base import PassContext, PassOutcome, PassSpec, apply_rules

GQA_OPSET = 23
_PEEL = ("Unsqueeze", "Squeeze", "Cast", "Reshape")
# A dimension piece of a shape tensor: a constant int or the [1]-shaped value computing it.
_Piece = int | ir.Value


def _repeat_kv(op, x, unsqueeze_axes, shape5, shape4):
    return op.Reshape(op.Expand(op.Unsqueeze(x, unsqueeze_axes), shape5), shape4)


class GQAFold(pattern.RewriteRuleClassBase):
    """Attention(q, repeat_kv(k), repeat_kv(v)) -> Attention(q, k, v) (module docstring)."""

    def __init__(self) -> None:
        super().__init__(name="GQAFold", remove_nodes=False)

    def pattern(self, op, q, k, v, ku, k5, k4, vu, v5, v4):
        return op.Attention(
            q,
            _repeat_kv(op, k, ku, k5, k4),
            _repeat_kv(op, v, vu, v5, v4),
            _allow_other_inputs=True,
            _outputs=["attention"],
        )

    def check(self, context, q, k, v, attention, **b) -> pattern.MatchResult:
        result = pattern.MatchResult()
        node = attention.producer()
        if len(node.outputs) != 1 or len(node.inputs) > 4:
            return result.fail("Attention has a cache (past/present) or extra outputs", attention)
        for name, t in (("query", q), ("key", k), ("value", v)):
            if t.shape is None or t.shape.rank() != 4:
                return result.fail(f"{name} is not rank 4", t)
        reps = set()
        for name, t, u, s5, s4 in (
            ("key", k, b["ku"], b["k5"], b["k4"]),
            ("value", v, b["vu"], b["v5"], b["v4"]),
        ):
            if not _ir_utils.is_singleton_value(u, 2):
                return result.fail(f"{name} is not unsqueezed at axis 2", u)
            n = _repeats(t, s5, s4)
            if n is None:
                return result.fail(f"{name}'s Expand/Reshape is not a head repeat of {name} itself", s5)
            reps.add(n)
        if len(reps) != 1:
            return result.fail(f"key and value are repeated differently ({sorted(reps)})", v)
        return result

    def rewrite(self, op, q, k, v, attention, **b):
        node = attention.producer()
        attrs: dict = dict(node.attributes)
        q_heads, kv_heads = q.shape[1], k.shape[1]
        if isinstance(q_heads, int) and isinstance(kv_heads, int):
            attrs["q_num_heads"] = q_heads
            attrs["kv_num_heads"] = kv_heads
        inputs = [q, k, v, *node.inputs[3:]]
        return op.Attention(*inputs, **attrs)


def _pieces(shape: ir.Value) -> list[_Piece] | None:
    """The elements of a 1-D shape tensor as ints / (tensor, axis) / None (unknown)."""
    v = shape
    for _ in range(3):
        node = v.producer()
        if node is not None and node.op_type == "Where" and _is_minus_one_guard(node):
            v = node.inputs[2]
        elif (
            node is not None
            and node.op_type == "Reshape"
            and _ir_utils.is_singleton_value(node.inputs[1], -1)
        ):
            v = node.inputs[0]
        else:
            break
    if v.const_value is not None:
        return [int(d) for d in v.const_value.numpy().reshape(-1)]
    node = v.producer()
    if node is None or node.op_type != "Concat":
        return None
    out: list[_Piece] = []
    for piece in node.inputs:
        if piece is None or piece.shape is None or piece.shape.rank() != 1 or piece.shape[0] != 1:
            return None
        const = _ir_utils.get_singleton_value(piece)
        out.append(int(const) if const is not None else piece)
    return out


def _is_minus_one_guard(where: ir.Node) -> bool:
    """Where(Equal(s, -1s), 1s, s): the legacy exporter's guard, which maps -1 to 1."""
    cond, ones, s = where.inputs
    eq = cond.producer() if cond is not None else None
    if eq is None or eq.op_type != "Equal" or s not in eq.inputs:
        return False
    other = next((i for i in eq.inputs if i is not s), None)
    return other is not None and ones is not None and _all_equal(ones, 1) and _all_equal(other, -1)


def _all_equal(v: ir.Value, value: int) -> bool:
    node = v.producer()
    if v.const_value is not None:
        return bool((v.const_value.numpy() == value).all())
    if node is not None and node.op_type == "ConstantOfShape":
        fill = node.attributes.get("value")
        return fill is not None and bool((fill.as_tensor().numpy() == value).all())
    if node is not None and node.op_type == "Mul":
        a, c = node.inputs
        s = _ir_utils.get_singleton_value(c)
        return s is not None and s != 0 and value % s == 0 and _all_equal(a, value // s)
    return False


def _peel(v: ir.Value) -> ir.Value:
    while (node := v.producer()) is not None and node.op_type in _PEEL:
        v = node.inputs[0]
    return v


def _dim_source(piece: ir.Value) -> tuple[ir.Value, int] | None:
    """(t, i) when `piece` is the size of axis i of t: Shape(t)[i] or Shape(t, start=i, end=i+1)."""
    node = _peel(piece).producer()
    if node is None:
        return None
    if node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0:
        shape = node.inputs[0].producer()
        index = _ir_utils.get_singleton_value(node.inputs[1])
        if shape is not None and shape.op_type == "Shape" and isinstance(index, int) and index >= 0:
            start = shape.attributes.get_int("start", 0)
            if start >= 0:
                return shape.inputs[0], start + index
    if node.op_type == "Shape":
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", None)
        if start >= 0 and end == start + 1:
            return node.inputs[0], start
    return None


def _is_dim(piece: _Piece, t: ir.Value, axis: int, scale: int = 1) -> bool:
    """`piece` provably equals scale * (size of axis `axis` of t)."""
    d = t.shape[axis]
    if isinstance(piece, int):
        return isinstance(d, int) and piece == scale * d
    if scale != 1:  # Shape(t)[axis] * scale, as legacy exports compute Hkv * n
        node = _peel(piece).producer()
        if node is None or node.op_type != "Mul":
            return False
        for a, c in (node.inputs, node.inputs[::-1]):
            if _ir_utils.get_singleton_value(c) == scale and _is_dim(a, t, axis):
                return True
        return False
    found = _dim_source(piece)
    if found is None:
        return False
    src, i = found
    if src is t and i == axis:
        return True
    if src.shape is None or src.shape.rank() <= i:
        return False
    e = src.shape[i]
    if isinstance(d, int) or isinstance(e, int):
        return d == e
    return d.value is not None and d.value == e.value


def _repeats(t: ir.Value, shape5: ir.Value, shape4: ir.Value) -> int | None:
    """n when Expand shape is [B, Hkv, n, S, D] and Reshape shape [B, Hkv*n, S, D] of t's dims."""
    p5, p4 = _pieces(shape5), _pieces(shape4)
    if p5 is None or p4 is None or len(p5) != 5 or len(p4) != 4:
        return None
    n = p5[2]
    if not isinstance(n, int) or n < 1:
        return None
    for piece, axis in zip((p5[0], p5[1], p5[3], p5[4]), range(4)):
        if piece != 1 and not _is_dim(piece, t, axis):
            return None
    if not (_is_dim(p4[0], t, 0) and _is_dim(p4[2], t, 2) and _is_dim(p4[3], t, 3)):
        return None
    return n if _is_dim(p4[1], t, 1, scale=n) else None


@functools.lru_cache(maxsize=1)
def gqa_rules() -> list[pattern.RewriteRule]:
    """The single fold rule."""
    return [GQAFold.rule()]


def _retarget_shapes(repeated: list[ir.Value]) -> int:
    """Point `Shape` reads of folded repeats at the un-repeated K/V; returns how many moved.

    The attention pass expands a mask to Shape(key)[2]; left on the repeat, that Shape alone would
    keep the Unsqueeze-Expand-Reshape alive. Only Shapes not covering the head axis move, and
    every other axis was proven equal when the repeat was folded.
    """
    moved = 0
    for rep in repeated:
        if not rep.consumers() or any(u.op_type == "Attention" for u in rep.consumers()):
            continue  # dead already, or not folded
        source = _peel_repeat(rep)
        for use in list(rep.consumers()):
            if use.op_type != "Shape" or use.inputs[0] is not rep or source is None:
                continue
            if _reads_no_head_axis(use):
                use.replace_input_with(0, source)
                moved += 1
    return moved


def _reads_no_head_axis(shape: ir.Node) -> bool:
    """The Shape of a rank-4 tensor covers only axes >= 2, or is read only by Gathers of other axes."""
    start, end = shape.attributes.get_int("start", 0), shape.attributes.get_int("end", None)
    if start >= 2 and (end is None or end > start):
        return True
    if start != 0 or end is not None:
        return False
    users = shape.outputs[0].consumers()
    for use in users:
        index = _ir_utils.get_singleton_value(use.inputs[1]) if use.op_type == "Gather" else None
        if use.attributes.get_int("axis", 0) != 0 or not isinstance(index, int) or index % 4 == 1:
            return False
    return bool(users) and not any(v in shape.graph.outputs for v in shape.outputs)


def _peel_repeat(rep: ir.Value) -> ir.Value | None:
    """k of Reshape(Expand(Unsqueeze(k)))."""
    v: ir.Value | None = rep
    for op_type in ("Reshape", "Expand", "Unsqueeze"):
        node = v.producer() if v is not None else None
        if node is None or node.op_type != op_type:
            return None
        v = node.inputs[0]
    return v


def run_gqa(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fold repeat_kv into the Attention nodes in place."""
    outcome = PassOutcome()
    repeated = [
        v
        for n in model.graph
        if n.op_type == "Attention" and n.domain in ("", "ai.onnx")
        for v in n.inputs[1:3]
        if v is not None and v.producer() is not None and v.producer().op_type == "Reshape"
    ]
    if apply_rules(model, gqa_rules(), ctx, outcome):
        moved = _retarget_shapes(repeated)
        if moved:
            outcome.notes.append(f"{moved} Shape read(s) of folded K/V repeats moved to the grouped K/V")
    return outcome


GQA = PassSpec(
    name="gqa",
    summary="Attention over repeat_kv(K/V) -> Attention over grouped K/V heads (opset 23)",
    run=run_gqa,
    min_opset=lambda ctx: GQA_OPSET if ctx.attention == "native" else None,
)
