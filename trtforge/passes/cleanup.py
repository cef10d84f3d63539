"""cleanup: constant folding, dead-node / Identity / no-op Cast removal, static shape subgraphs.

All of it is onnxscript's optimizer (`onnxscript.optimizer.optimize_ir`): `FoldConstantsPass`
folds constant subgraphs, and with node-level shape inference it turns `Shape`/`Gather`/`Concat`
chains over static dims into constants; its default rewrite rules remove no-op Cast / Expand /
Transpose, `x+0`, `x*1`, Dropout and collapse Reshape chains; `RemoveUnusedNodesPass` drops dead
nodes. Functions are not inlined, so plugin reference functions survive a late cleanup.
Exported graphs also carry `Identity` nodes that the optimizer keeps; onnx_ir's
`IdentityEliminationPass` removes those that do not name a graph output.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript import optimizer

from trtforge.passes._base import PassContext, PassOutcome, PassSpec


def run_cleanup(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fold and clean in place; `matches` is the number of nodes removed."""
    before = _count(model)
    optimizer.optimize_ir(model, num_iterations=2, inline=False)
    identity = common_passes.IdentityEliminationPass()(model)
    outcome = PassOutcome()
    removed = before - _count(model)
    outcome.matches = max(removed, 0)
    outcome.per_rule["nodes_removed"] = outcome.matches
    if identity.modified:
        outcome.notes.append("removed Identity nodes")
    return outcome


def _count(model: ir.Model) -> int:
    return sum(1 for _ in model.graph)


CLEANUP = PassSpec(
    name="cleanup",
    summary="constant folding, dead/Identity/no-op removal, static shape subgraphs",
    run=run_cleanup,
)
