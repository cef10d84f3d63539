"""gelu: erf and tanh GELU formulas -> `Gelu` (opset 20, approximate "none" / "tanh").

    erf:   y = 0.5 * x * (1 + erf(x / sqrt(2)))                      (x * 1/sqrt(2) too)
    tanh:  y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  (x^3 as Pow or x*x*x)

onnxscript ships these formulas only as `com.microsoft` fusions (`ort_fusions/gelu.py`), and in a
single association order; exporters group the three-way product `0.5 * x * (1 + ...)` three ways,
so each form is one rule class parameterised by grouping and by the order of its non-constant
operands; constants are first moved to the right of every Add/Mul (exact: both commute).
Constants are matched with onnxscript's tolerance (rel 1e-5).

SiLU (`x * Sigmoid(x)`) is left alone on purpose: the standard `Swish` op only exists from opset
24, TensorRT's pointwise fusion already runs `Sigmoid` and `Mul` as one kernel, and keeping the
two ops keeps graphs at opset 23 where TensorRT-RTX and ONNX Runtime 1.32 parse everything.
"""

from __future__ import annotations

import functools
import math

import onnx_ir as ir
from onnxscript import optimizer
from onnxscript.rewriter import pattern

from trtforge.passes._base import PassContext, PassOutcome, PassSpec, apply_rules

GELU_OPSET = 20
_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
# How `0.5 * x * g` is associated: ((x*0.5)*g), ((x*g)*0.5), (x*(0.5*g)).
_GROUPINGS = ("xh_g", "xg_h", "x_hg")


def _mul(op, a, b, swap: bool):
    return op.Mul(b, a) if swap else op.Mul(a, b)


def _half_x_g(op, x, g, grouping: str, swap: bool):
    """0.5 * x * g in one association; `swap` flips the outer product's operands."""
    if grouping == "xh_g":
        return _mul(op, op.Mul(x, 0.5), g, swap)
    if grouping == "xg_h":
        return op.Mul(_mul(op, x, g, swap), 0.5)
    return _mul(op, x, op.Mul(g, 0.5), swap)


class _GeluBase(pattern.RewriteRuleClassBase):
    approximate = "none"

    def __init__(self, grouping: str, swap: bool, swap_inner: bool = False) -> None:
        super().__init__(name=f"{type(self).__name__}[{grouping}]")
        self.grouping, self.swap, self.swap_inner = grouping, swap, swap_inner

    def check(self, context, x, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype not in _FLOATS:
            return result.fail(f"GELU input dtype {x.dtype} is not floating point", x)
        return result

    def rewrite(self, op, x, **_):
        return op.Gelu(x, approximate=self.approximate)


class GeluErfFusion(_GeluBase):
    """0.5 * x * (1 + erf(x / sqrt(2))) -> Gelu(x)."""

    def pattern(self, op, x):
        scaled = pattern.OrValue([op.Div(x, _SQRT_2), op.Mul(x, 1.0 / _SQRT_2)])  # x / sqrt(2)
        one_plus_erf = op.Add(op.Erf(scaled), 1.0)  # 1 + erf(.)
        return _half_x_g(op, x, one_plus_erf, self.grouping, self.swap)  # 0.5 * x * (.)


class GeluTanhFusion(_GeluBase):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> Gelu(x, approximate="tanh")."""

    approximate = "tanh"

    def pattern(self, op, x):
        x2 = op.Mul(x, x)
        cube = pattern.OrValue([op.Pow(x, 3.0), op.Mul(x2, x), op.Mul(x, x2)])  # x^3
        inner = _add(op, x, op.Mul(cube, 0.044715), self.swap_inner)  # x + 0.044715 x^3
        one_plus_tanh = op.Add(op.Tanh(op.Mul(inner, _SQRT_2_OVER_PI)), 1.0)
        return _half_x_g(op, x, one_plus_tanh, self.grouping, self.swap)


def _add(op, a, b, swap: bool):
    return op.Add(b, a) if swap else op.Add(a, b)


def constants_to_the_right(model: ir.Model) -> int:
    """Put the constant operand of every Add/Mul second (commutative, so exact); returns swaps made.

    With constants canonicalised, the rules only need variants for the operand order of
    non-constant pairs instead of onnxscript's full `commute()` product (hundreds of rules).
    """
    optimizer.basic_constant_propagation(model.graph)
    swaps = 0
    for node in model.graph:
        if node.op_type not in ("Add", "Mul") or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        if a is not None and b is not None and a.const_value is not None and b.const_value is None:
            node.replace_input_with(0, b)
            node.replace_input_with(1, a)
            swaps += 1
    return swaps


@functools.lru_cache(maxsize=1)
def gelu_rules() -> list[pattern.RewriteRule]:
    """Both GELU forms, every grouping, both orders of each non-constant operand pair."""
    rules: list[pattern.RewriteRule] = []
    for grouping in _GROUPINGS:
        for swap in (False, True):
            rules.append(GeluErfFusion.rule(grouping, swap))
            for swap_inner in (False, True):
                rules.append(GeluTanhFusion.rule(grouping, swap, swap_inner))
    return rules


def run_gelu(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fuse GELU formulas in place."""
    outcome = PassOutcome()
    constants_to_the_right(model)
    apply_rules(model, gelu_rules(), ctx, outcome)
    return outcome


GELU = PassSpec(
    name="gelu",
    summary="erf/tanh GELU formulas -> Gelu (opset 20)",
    run=run_gelu,
    min_opset=lambda ctx: GELU_OPSET,
)
