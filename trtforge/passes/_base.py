"""Pass records, the JSON ledger, and the helper that runs an onnxscript rule set and explains misses.

A pass is a named function over an `onnx_ir.Model` (in place) that returns a `PassOutcome`: how
many matches it rewrote and, in debug mode, why candidate matches were rejected. The pipeline
(`trtforge.passes.pipeline`) wraps each pass with timing, node counts, the opset raise the pass
needs, and the ONNX Runtime check, and appends a `PassRecord` to the `PassLedger`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchingTracer, MatchStatus
from onnxscript.rewriter._rewrite_rule import RULE_NAME_TAG

from trtforge.errors import UserError

ATTENTION_STRATEGIES = ("native", "plugin", "paged", "none")
# A rule is re-applied until it stops matching (nested patterns appear after an outer rewrite), at most:
_MAX_SWEEPS = 4
# Helper ops a rewrite may emit around the fused op; not counted in the per-rule ledger (the last six:
# the folded-heads attention's rank changes, runtime scale, masked_fill and fully-masked-row handling).
_PLUMBING = frozenset(
    {"Transpose", "Shape", "Concat", "Constant", "Expand", "Reshape", "Cast"}
    | {"Unsqueeze", "Squeeze", "Div", "Where", "Not", "ReduceMin"}
)


class VerificationError(UserError):
    """A pass changed the model's outputs beyond tolerance in ONNX Runtime (names pass, output, error)."""


@dataclasses.dataclass(frozen=True)
class PassContext:
    """Options every pass may read; frozen so passes cannot leak state into each other."""

    attention: str = "native"
    debug: bool = False


@dataclasses.dataclass
class PassOutcome:
    """What one pass did: matches rewritten (per rule) and, in debug mode, rejected candidates."""

    matches: int = 0
    per_rule: dict[str, int] = dataclasses.field(default_factory=dict)
    rejected: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class PassSpec:
    """A registered pass: its name, the default-domain opset it needs, and the function that runs it.

    `min_opset(ctx)` returns the opset the emitted ops need (None: any), so the pipeline raises the
    model's opset only for passes that emit newer ops, and records that it did.
    """

    name: str
    summary: str
    run: Callable[[ir.Model, PassContext], PassOutcome]
    min_opset: Callable[[PassContext], int | None] = lambda ctx: None


@dataclasses.dataclass
class VerificationRecord:
    """Largest difference between the outputs before and after one pass, over all outputs."""

    max_abs_error: float
    max_rel_error: float
    worst_output: str
    per_output: dict[str, dict[str, float]]


@dataclasses.dataclass
class PassRecord:
    """One line of the ledger."""

    name: str
    matches: int
    nodes_before: int
    nodes_after: int
    seconds: float
    per_rule: dict[str, int] = dataclasses.field(default_factory=dict)
    opset_before: int | None = None
    opset_after: int | None = None
    rejected: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    verification: VerificationRecord | None = None


@dataclasses.dataclass
class PassLedger:
    """Everything the pipeline did, JSON-serialisable with `to_dict()` (goes into the engine manifest)."""

    attention: str
    verify: bool
    opset_before: int | None
    opset_after: int | None = None
    verify_skipped_reason: str | None = None
    passes: list[PassRecord] = dataclasses.field(default_factory=list)

    @property
    def opset_changed(self) -> bool:
        """True when the default-domain opset was raised by some pass."""
        return self.opset_before != self.opset_after

    def matches(self, name: str) -> int:
        """Matches rewritten by the pass called `name` (0 if it did not run)."""
        return sum(r.matches for r in self.passes if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of builtins (json.dumps-able)."""
        d = dataclasses.asdict(self)
        d["opset_change"] = (
            {"from": self.opset_before, "to": self.opset_after} if self.opset_changed else None
        )
        return d


def opset_of(model: ir.Model) -> int | None:
    """The model's default-domain ("" or "ai.onnx") opset version."""
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def _rejections(tracer: MatchingTracer) -> list[str]:
    """Turn a MatchingTracer's best partial matches into one line per rejected candidate."""
    lines = []
    for rule, infos in tracer.best_matches_map.items():
        for info in infos:
            if info.status == MatchStatus.SUCCESS:
                continue
            reason = info.match_result.reason or "pattern did not match"
            lines.append(
                f"{rule.name or 'rule'}: {info.status.name.lower()} at node "
                f"'{info.root_node.name}' ({info.root_node.op_type}): {reason}"
            )
    return lines


def apply_rules(
    model: ir.Model, rules: list[pattern.RewriteRule], ctx: PassContext, outcome: PassOutcome
) -> int:
    """Apply the rules together until nothing matches; count matches and the ops each rule emitted.

    Per-rule counts come from the rule-name tag onnxscript stamps on every emitted node
    ("Rule -> OpType": n). In debug mode, a MatchingTracer run afterwards records why each
    remaining best candidate was rejected.
    """
    ruleset = pattern.RewriteRuleSet(rules)
    existing = {id(n) for n in model.graph}
    total = 0
    for _ in range(_MAX_SWEEPS):
        k = ruleset.apply_to_model(model)
        total += k
        if k == 0:
            break
    for node in model.graph:
        tag = node.metadata_props.get(RULE_NAME_TAG)
        if tag and id(node) not in existing and node.op_type not in _PLUMBING:
            key = f"{tag} -> {node.op_type}"
            outcome.per_rule[key] = outcome.per_rule.get(key, 0) + 1
    if ctx.debug:
        tracer = MatchingTracer()
        ruleset.apply_to_model(model, tracer=tracer)
        outcome.rejected.extend(_rejections(tracer))
    outcome.matches += total
    return total
