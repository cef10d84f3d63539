"""rmsnorm: decomposed RMSNorm -> `RMSNormalization` (opset 23).

    y = scale * (x * 1/sqrt(mean(x^2, axis=-1) + eps))    [x optionally Cast up, the product Cast back]

Forms matched: the square as `Pow(x, 2)` or `Mul(x, x)`; the inverse root as `Reciprocal(Sqrt)`,
`Div(1, Sqrt)` (legacy exports of `torch.rsqrt`) or a `Div(x, Sqrt)`; either operand order of the
two products (constants are first moved right, as in the GELU pass). onnxscript's shipped rule
(`rules.fusion._rms_normalization`) covers only the Reciprocal form with an explicit
`noop_with_empty_axes` attribute, so legacy exports never matched it; it also accepts any
`scale`, while `RMSNormalization` needs one broadcastable to the normalised axis.

Checks: the mean runs over the last axis only (keepdims), epsilon is a float scalar, the scale is a
rank-1 vector as long as that axis, and the output type is the scale's (the op's `V`). A compute
Cast (HF's `.to(float32)`) becomes `stash_type`.

TensorRT-RTX 1.7.1 (measured): the ONNX parser maps `RMSNormalization` to reduce + elementwise
layers (no dedicated layer) and builds FP32 and FP16; the fused node is still one node to place
precision on and what ONNX Runtime runs as one kernel.
"""

from __future__ import annotations

import functools

import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern

from trtforge.passes._base import PassContext, PassOutcome, PassSpec, apply_rules
from trtforge.passes.gelu import constants_to_the_right

RMSNORM_OPSET = 23
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
_STASH = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


def _mul(op, a, b, swap: bool):
    return op.Mul(b, a) if swap else op.Mul(a, b)


class RMSNormFusion(pattern.RewriteRuleClassBase):
    """scale * (x / sqrt(mean(x^2) + eps)) -> RMSNormalization(x, scale) (module docstring)."""

    def __init__(self, swap_norm: bool, swap_scale: bool) -> None:
        super().__init__(name=f"RMSNormFusion[{int(swap_norm)}{int(swap_scale)}]")
        self.swap_norm, self.swap_scale = swap_norm, swap_scale

    def pattern(self, op, x, scale, epsilon, axes, compute_dtype, target_dtype):
        xc = pattern.OrValue([op.Cast(x, to=compute_dtype), x], tag_var="compute_cast", tag_values=[1, 0])
        square = pattern.OrValue([op.Pow(xc, 2.0), op.Mul(xc, xc)])
        mean = op.ReduceMean(square, axes, _outputs=["mean_square"])
        root = op.Sqrt(op.Add(mean, epsilon))
        normalized = pattern.OrValue(
            [
                _mul(op, xc, op.Reciprocal(root), self.swap_norm),
                _mul(op, xc, op.Div(1.0, root), self.swap_norm),
                op.Div(xc, root),
            ]
        )
        normalized = pattern.OrValue([op.Cast(normalized, to=target_dtype), normalized])
        return _mul(op, normalized, scale, self.swap_scale)

    def check(self, context, x, scale, epsilon, axes, mean_square, **b) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype not in _FLOATS:
            return result.fail(f"RMSNorm input dtype {x.dtype} is not floating point", x)
        if scale.dtype not in _FLOATS:
            return result.fail(f"RMSNorm scale dtype {scale.dtype} is not floating point", scale)
        eps = _ir_utils.get_singleton_value(epsilon)
        if not isinstance(eps, float) or eps < 0:
            return result.fail("epsilon is not a non-negative float scalar", epsilon)
        reduce = mean_square.producer()
        attrs = reduce.attributes
        if attrs.get_int("keepdims", 1) != 1 or attrs.get_int("noop_with_empty_axes", 0) != 0:
            return result.fail("ReduceMean does not keep dims", mean_square)
        axis = _single_axis(axes)
        rank = x.shape.rank() if x.shape is not None else None
        if axis is None or not (axis == -1 or (rank is not None and axis == rank - 1)):
            return result.fail(f"mean is not over the last axis only (axes {axes})", axes)
        if scale.shape is None or scale.shape.rank() != 1:
            return result.fail("scale is not a rank-1 vector over the normalised axis", scale)
        width, length = (x.shape[-1] if rank else None), scale.shape[0]
        if isinstance(width, int) and width != length:
            return result.fail(f"scale length {length} != normalised axis size {width}", scale)
        stash = ir.DataType(b["compute_dtype"].as_int()) if b.get("compute_cast") else x.dtype
        if b.get("compute_cast") and stash not in _STASH:
            return result.fail(f"RMSNorm computed in {stash}, not float/double", x)
        if x.dtype != scale.dtype and stash != scale.dtype:
            return result.fail(f"input {x.dtype} and scale {scale.dtype} types differ", x)
        return result

    def rewrite(self, op, x, scale, epsilon, **b):
        stash = ir.DataType(b["compute_dtype"].as_int()) if b.get("compute_cast") else x.dtype
        if x.dtype != scale.dtype:  # x is Cast up to the scale's type before the norm, as it was
            x = op.Cast(x, to=int(scale.dtype))
        if stash not in _STASH:
            stash = ir.DataType.FLOAT
        return op.RMSNormalization(
            x,
            scale,
            axis=-1,
            epsilon=float(_ir_utils.get_singleton_value(epsilon)),
            stash_type=int(stash),
        )


def _single_axis(axes: ir.Value | None) -> int | None:
    if axes is None or axes.const_value is None:
        return None
    values = axes.const_value.numpy().reshape(-1).tolist()
    return int(values[0]) if len(values) == 1 else None


@functools.lru_cache(maxsize=1)
def rmsnorm_rules() -> list[pattern.RewriteRule]:
    """Both operand orders of the normalising product and of the scale product."""
    return [RMSNormFusion.rule(sn, ss) for sn in (False, True) for ss in (False, True)]


def run_rmsnorm(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fuse decomposed RMSNorms in place."""
    outcome = PassOutcome()
    constants_to_the_right(model)
    apply_rules(model, rmsnorm_rules(), ctx, outcome)
    return outcome


RMSNORM = PassSpec(
    name="rmsnorm",
    summary="decomposed RMSNorm -> RMSNormalization (opset 23)",
    run=run_rmsnorm,
    min_opset=lambda ctx: RMSNORM_OPSET,
)
