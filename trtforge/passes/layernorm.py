"""layernorm: decomposed LayerNorm -> `LayerNormalization` (17+); RMSNorm lives in `rmsnorm.py`.

    LayerNorm:  y = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * scale [+ bias]

The rules are onnxscript's own (`onnxscript.rewriter.rules.fusion._layer_norm`), applied with
operand commutation so `scale * normalized`, `bias + y`, `eps + var` match too. Those rules cover:
the square as `Pow(d, 2)` or `Mul(d, d)`, the division as `Div` or `Reciprocal`+`Mul`, with or
without bias, epsilon as an initializer or a `Constant`, float/double inputs (the shipped check;
FP16 graphs are normalised before casting).
They match `ReduceMean` with axes as an input, the opset-18 form, so this pass raises the model
to opset 18 first (the version converter rewrites older `ReduceMean(axes=...)` attributes).
"""

from __future__ import annotations

import functools

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.fusion import _layer_norm

from trtforge.passes._base import PassContext, PassOutcome, PassSpec, apply_rules

LAYERNORM_OPSET = 18


@functools.lru_cache(maxsize=1)
def layernorm_rules() -> list[pattern.RewriteRule]:
    """Shipped LayerNorm rules with every commuted operand order (core first, then the bias add)."""
    core = _layer_norm.LayerNormFusion.rule()
    bias = _layer_norm.LayerNormBiasFusion.rule()
    return [*core.commute(), *bias.commute()]


def run_layernorm(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fuse decomposed LayerNorms in place."""
    outcome = PassOutcome()
    apply_rules(model, layernorm_rules(), ctx, outcome)
    return outcome


LAYERNORM = PassSpec(
    name="layernorm",
    summary="decomposed LayerNorm -> LayerNormalization",
    run=run_layernorm,
    min_opset=lambda ctx: LAYERNORM_OPSET,
)
