"""rotary: HF-style rotary position embedding -> `RotaryEmbedding` (opset 23, non-interleaved).

    y = x * cos + rotate_half(x) * sin,   rotate_half(x) = Concat(-x[..., D/2:], x[..., :D/2])
    x: [B, H, S, D];  cos, sin: [B' or 1, 1, S, D], each made of two equal halves
      ->  RotaryEmbedding(x, Expand(cos_half, [B, S, 1]), Expand(sin_half, [B, S, 1]))

A cache is `Unsqueeze(c, 1)` or a constant; it is accepted when its halves are provably equal:
c = `Cos(Concat(f, f))` (HF computes `emb = cat(freqs, freqs)`, then `emb.cos() * scaling`),
`Concat(h, h)`, or a constant whose halves are equal; an optional scalar scale and Cast on top
are carried to the half. The half point must be D/2 as a constant or as `Shape(x)[3] // 2`
(legacy exports); D comes from the cache. `RotaryEmbedding` without position_ids wants caches of
exactly [B, S, D/2] (ONNX Runtime 1.32 rejects a batch-1 cache for batch 2), hence the Expand.
BSHD-layout and interleaved (GPT-J style) rotary are left decomposed.

onnxscript ships this fusion (`rules.fusion._rotary_embedding`) but it needs static head and
head-size dims (legacy exports have none), only the `Cos(Concat(f, f))` form, and passes the
batch-1 cache straight through, which ONNX Runtime rejects.

TensorRT-RTX 1.7.1 (measured on this machine): the ONNX parser maps `RotaryEmbedding` to one
`ROTARY_EMBEDDING` layer, with and without position_ids, 3-D and 4-D; FP32 and FP16 build.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern

from trtforge.passes._base import PassContext, PassOutcome, PassSpec, apply_rules
from trtforge.passes.gelu import constants_to_the_right

ROTARY_OPSET = 23
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
# A half-cache recipe: the root value, then (op, attributes, scalar operand) steps applied to it.
_Step = tuple[str, dict, ir.Value | None]


def _slice(op, x, start, end, axes, steps, four: bool):
    return op.Slice(x, start, end, axes, steps) if not four else op.Slice(x, start, end, axes)


class RotaryFusion(pattern.RewriteRuleClassBase):
    """x * cos + rotate_half(x) * sin -> RotaryEmbedding (module docstring)."""

    def __init__(self, four_input_slices: bool) -> None:
        super().__init__(
            name=f"RotaryFusion[{4 if four_input_slices else 5}-input Slice]", remove_nodes=False
        )
        self.four = four_input_slices

    def pattern(self, op, x, cos, sin, start1, end1, axes1, steps1, start2, end2, axes2, steps2):
        low = _slice(op, x, start1, end1, axes1, steps1, self.four)  # x[..., :D/2]
        high = _slice(op, x, start2, end2, axes2, steps2, self.four)  # x[..., D/2:]
        rotated = op.Concat(op.Neg(high), low, _outputs=["rotated"])
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, context, x, cos, sin, rotated, **b) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype not in _FLOATS or x.shape is None or x.shape.rank() != 4:
            return result.fail("rotary input is not a rank-4 float tensor [B, H, S, D]", x)
        widths = set()
        for name, cache in (("cos", cos), ("sin", sin)):
            recipe = _half_recipe(cache)
            if recipe is None:
                return result.fail(
                    f"{name} is not Unsqueeze([B, S, D], 1) / a [B, 1, S, D] constant that provably "
                    "repeats its first half",
                    cache,
                )
            widths.add(recipe[2])
        if len(widths) != 1 or min(widths) % 2:
            return result.fail(f"cos and sin widths {sorted(widths)} differ or are odd", sin)
        width = widths.pop()
        if isinstance(x.shape[3], int) and x.shape[3] != width:
            return result.fail(f"head size {x.shape[3]} != rotary width {width}", x)
        axis = rotated.producer().attributes.get_int("axis", 0)
        if axis not in (-1, 3):
            return result.fail(f"rotate_half concatenates on axis {axis}", rotated)
        half = width // 2
        for axes, steps in ((b["axes1"], b.get("steps1")), (b["axes2"], b.get("steps2"))):
            if _singleton(axes) not in (-1, 3) or (steps is not None and _singleton(steps) != 1):
                return result.fail("rotate_half slices are not unit-step slices of the last axis", axes)
        if _singleton(b["start1"]) != 0:
            return result.fail("the low half does not start at 0", b["start1"])
        end2 = _singleton(b["end2"])
        if end2 is None or end2 < width:
            return result.fail("the high half does not run to the end", b["end2"])
        if not (_is_half(b["end1"], x, half) and _is_half(b["start2"], x, half)):
            return result.fail(f"the halves are not split at D/2 = {half}", b["end1"])
        return result

    def rewrite(self, op, x, cos, sin, **_):
        batch_seq = op.Concat(
            op.Shape(x, start=0, end=1),
            op.Shape(x, start=2, end=3),
            op.Constant(value=ir.tensor(np.array([1], dtype=np.int64))),
            axis=0,
        )
        cos_half = op.Expand(_build_half(op, cos), batch_seq)
        sin_half = op.Expand(_build_half(op, sin), batch_seq)
        return op.RotaryEmbedding(x, cos_half, sin_half, interleaved=0)


def _singleton(v: ir.Value | None) -> int | None:
    s = _ir_utils.get_singleton_value(v) if v is not None else None
    return int(s) if isinstance(s, (int, np.integer)) else None


def _is_half(v: ir.Value, x: ir.Value, half: int) -> bool:
    """`v` is the constant D/2, or `Shape(x)[3] // 2` (through Unsqueeze/Reshape/Cast)."""
    if _singleton(v) is not None:
        return _singleton(v) == half
    node = v.producer()
    while node is not None and node.op_type in ("Unsqueeze", "Reshape", "Cast", "Squeeze"):
        node = node.inputs[0].producer()
    if node is None or node.op_type != "Div" or _singleton(node.inputs[1]) != 2:
        return False
    if node.inputs[0].dtype is None or node.inputs[0].dtype.is_floating_point():
        return False
    dim = node.inputs[0].producer()
    if dim is not None and dim.op_type == "Gather" and _singleton(dim.inputs[1]) in (3, -1):
        shape = dim.inputs[0].producer()
        return (
            shape is not None
            and shape.op_type == "Shape"
            and shape.inputs[0] is x
            and shape.attributes.get_int("start", 0) == 0
            and dim.attributes.get_int("axis", 0) == 0
        )
    if dim is not None and dim.op_type == "Shape" and dim.inputs[0] is x:
        return dim.attributes.get_int("start", 0) in (3, -1) and dim.attributes.get_int("end", 4) == 4
    return False


def _half_recipe(cache4: ir.Value) -> tuple[ir.Value | np.ndarray, list[_Step], int] | None:
    """How to compute the [B', S, D/2] first half of a [B', 1, S, D] cache, and D; None if unproven.

    The cache is `Unsqueeze(c, [1])` with c a [B', S, D] tensor of static D, or a constant with
    dim 1 of size 1. On c, a trailing Cast and a scalar-constant Mul are peeled, then it must be
    `Cos`/`Sin` of `Concat(f, f)`, `Concat(h, h)` itself, or a constant with equal halves.
    """
    node = cache4.producer()
    if cache4.const_value is not None:
        arr = cache4.const_value.numpy()
        if arr.ndim != 4 or arr.shape[1] != 1:
            return None
        return _const_half(arr[:, 0])
    if node is None or node.op_type != "Unsqueeze" or not _ir_utils.is_singleton_value(node.inputs[1], 1):
        return None
    v = node.inputs[0]
    if v.shape is None or v.shape.rank() != 3 or not isinstance(v.shape[-1], int):
        return None
    width = v.shape[-1]
    steps: list[_Step] = []
    for _ in range(4):
        node = v.producer()
        if node is None:
            break
        if node.op_type == "Cast":
            steps.append(("Cast", {"to": node.attributes.get_int("to")}, None))
            v = node.inputs[0]
        elif node.op_type == "Mul" and node.inputs[1].const_value is not None:
            if node.inputs[1].const_value.size != 1:
                return None
            steps.append(("Mul", {}, node.inputs[1]))
            v = node.inputs[0]
        elif node.op_type in ("Cos", "Sin"):
            steps.append((node.op_type, {}, None))
            v = node.inputs[0]
        else:
            break
    steps.reverse()
    if v.const_value is not None:
        found = _const_half(v.const_value.numpy())
        return (found[0], steps, width) if found is not None and found[2] == width else None
    node = v.producer()
    if node is None or node.op_type != "Concat" or len(node.inputs) != 2:
        return None
    if node.inputs[0] is not node.inputs[1] or node.attributes.get_int("axis", 0) not in (-1, 2):
        return None
    return node.inputs[0], steps, width


def _const_half(arr: np.ndarray) -> tuple[np.ndarray, list[_Step], int] | None:
    """First half of a constant [B', S, D] whose two halves along D are equal."""
    if arr.ndim != 3 or arr.shape[-1] % 2:
        return None
    h = arr.shape[-1] // 2
    if not np.array_equal(arr[..., :h], arr[..., h:]):
        return None
    return np.ascontiguousarray(arr[..., :h]), [], arr.shape[-1]


def _build_half(op, cache4: ir.Value) -> ir.Value:
    root, steps, _ = _half_recipe(cache4)
    v = op.Constant(value=ir.tensor(root)) if isinstance(root, np.ndarray) else root
    for op_type, attrs, operand in steps:
        v = (
            getattr(op, op_type)(v, operand, **attrs)
            if operand is not None
            else getattr(op, op_type)(v, **attrs)
        )
    return v


@functools.lru_cache(maxsize=1)
def rotary_rules() -> list[pattern.RewriteRule]:
    """Every operand order of the Add and the two Muls, for 5- and 4-input Slices."""
    rules: list[pattern.RewriteRule] = []
    for four in (False, True):
        rules.extend(RotaryFusion.rule(four).commute())
    return rules


def run_rotary(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fuse rotary embeddings in place."""
    outcome = PassOutcome()
    constants_to_the_right(model)
    apply_rules(model, rotary_rules(), ctx, outcome)
    return outcome


ROTARY = PassSpec(
    name="rotary",
    summary="x*cos + rotate_half(x)*sin -> RotaryEmbedding (opset 23)",
    run=run_rotary,
    min_opset=lambda ctx: ROTARY_OPSET,
)
