"""layernorm / rmsnorm: decomposed normalizations -> `LayerNormalization` (17+) / `RMSNormalization` (23).

    LayerNorm:  y = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * scale [+ bias]
    RMSNorm:    y = x * 1/sqrt(mean(x^2) + eps) * scale

The rules are onnxscript's own (`onnxscript.rewriter.rules.fusion._layer_norm` and
`_rms_normalization`), applied with operand commutation so `scale * normalized`, `bias + y`,
`eps + var` match too. Those rules cover: the square as `Pow(d, 2)` or `Mul(d, d)`, the division
as `Div` or `Reciprocal`+`Mul`, with or without bias, epsilon as an initializer or a `Constant`,
float/double inputs (the shipped check; FP16 graphs are normalised before casting).
They match `ReduceMean` with axes as an input, the opset-18 form, so this pass raises the model
to opset 18 first (the version converter rewrites older `ReduceMean(axes=...)` attributes); RMSNorm
needs opset 23.
"""

from __future__ import annotations

import functools

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.fusion import _layer_norm, _rms_normalization

from trtforge.passes._base import PassContext, PassOutcome, PassSpec, apply_rules

LAYERNORM_OPSET = 18
RMSNORM_OPSET = 23


@functools.lru_cache(maxsize=1)
def layernorm_rules() -> list[pattern.RewriteRule]:
    """Shipped LayerNorm rules with every commuted operand order (core first, then the bias add)."""
    core = _layer_norm.LayerNormFusion.rule()
    bias = _layer_norm.LayerNormBiasFusion.rule()
    return [*core.commute(), *bias.commute()]


@functools.lru_cache(maxsize=1)
def rmsnorm_rules() -> list[pattern.RewriteRule]:
    """Shipped RMSNorm rules (both `scale * y` and `y * scale` orders are already separate rules)."""
    return list(_rms_normalization.rms_normalization_rules)


def run_layernorm(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fuse decomposed LayerNorms in place."""
    outcome = PassOutcome()
    apply_rules(model, layernorm_rules(), ctx, outcome)
    return outcome


def run_rmsnorm(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fuse decomposed RMSNorms in place."""
    outcome = PassOutcome()
    apply_rules(model, rmsnorm_rules(), ctx, outcome)
    return outcome


LAYERNORM = PassSpec(
    name="layernorm",
    summary="decomposed LayerNorm -> LayerNormalization",
    run=run_layernorm,
    min_opset=lambda ctx: LAYERNORM_OPSET,
)
RMSNORM = PassSpec(
    name="rmsnorm",
    summary="decomposed RMSNorm -> RMSNormalization (opset 23)",
    run=run_rmsnorm,
    min_opset=lambda ctx: RMSNORM_OPSET,
)
