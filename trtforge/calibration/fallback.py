"""Accuracy-guided fallback: rank quantized nodes by sensitivity, return the most sensitive to float
until the held-out accuracy target holds.

Sensitivity of a node = 1 - mean output cosine (vs the float model) with only that node quantized.
The number of nodes to return is found by bisection over the ranking (each probe builds the Q/DQ
model and runs the held-out samples in ONNX Runtime), then the result is checked once more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trtforge.calibration.calibrator import mean_cosine, run_outputs
from trtforge.calibration.placement import QuantTarget
from trtforge.calibration.qdq import insert_qdq
from trtforge.numerics.sessions import exact_session, run

if TYPE_CHECKING:
    import onnx

    from trtforge.calibration.data import CalibrationDataset


@dataclass
class FallbackResult:
    """Targets kept in INT8, those returned to float (with sensitivities) and the accuracy reached."""

    kept: list[QuantTarget]
    returned: list[dict[str, Any]] = field(default_factory=list)
    accuracy: dict[str, Any] = field(default_factory=dict)


class _Evaluator:
    def __init__(self, model: onnx.ModelProto, holdout: CalibrationDataset, scales: dict, real_tokens: bool):
        self.model, self.scales, self.real_tokens = model, scales, real_tokens
        self.reference = run_outputs(exact_session(model), holdout)
        self.probes = 0

    def __call__(self, targets: list[QuantTarget]) -> tuple[float, float]:
        self.probes += 1
        if not targets:
            return 1.0, 1.0
        session = exact_session(insert_qdq(self.model, targets, self.scales))
        outs = [run(session, feed) for feed, _ in self.reference]
        return mean_cosine(self.reference, outs, real_tokens=self.real_tokens)


def accuracy_fallback(
    model: onnx.ModelProto,
    targets: list[QuantTarget],
    scales: dict[str, float],
    holdout: CalibrationDataset,
    target: float,
    *,
    real_tokens: bool,
    progress: bool = True,
) -> FallbackResult:
    """Keep as many `targets` in INT8 as the cosine `target` on `holdout` allows (see the module doc)."""
    evaluate = _Evaluator(model, holdout, scales, real_tokens)
    full_mean, full_min = evaluate(targets)
    acc: dict[str, Any] = {
        "target": target,
        "metric": f"mean per-sample output cosine vs FP32 on {holdout.num_samples} held-out samples",
        "held_out_samples": holdout.num_samples,
        "all_quantized": {"mean": full_mean, "min": full_min},
    }
    if full_mean >= target:
        acc.update(final={"mean": full_mean, "min": full_min}, probes=evaluate.probes)
        return FallbackResult(list(targets), [], acc)
    sens = []
    for t in _iterate(targets, progress, "ranking sensitivity"):
        mean, _ = evaluate([t])
        sens.append((1.0 - mean, t))
    sens.sort(key=lambda p: -p[0])
    ranked = [t for _, t in sens]
    lo, hi = 1, len(ranked)  # the answer k (nodes returned) lies in [lo, hi]; k = len keeps nothing
    best = (1.0, 1.0)
    while lo < hi:
        mid = (lo + hi) // 2
        mean, mn = evaluate(ranked[mid:])
        if mean >= target:
            hi, best = mid, (mean, mn)
        else:
            lo = mid + 1
    k = lo
    if k == len(ranked) or best == (1.0, 1.0):
        best = evaluate(ranked[k:])
    returned = [
        {
            "node": t.node,
            "op_type": t.op_type,
            "rule": t.rule,
            "sensitivity": s,
            "reason": f"alone in INT8 it costs {s:.2e} output cosine; returned to float to reach {target}",
        }
        for s, t in sens[:k]
    ]
    kept_ids = {id(t) for t in ranked[k:]}
    acc.update(final={"mean": best[0], "min": best[1]}, probes=evaluate.probes)
    return FallbackResult([t for t in targets if id(t) in kept_ids], returned, acc)


def _iterate(items: list[QuantTarget], progress: bool, description: str):
    if not progress:
        yield from items
        return
    from rich.console import Console
    from rich.progress import track

    yield from track(items, description=description, console=Console(stderr=True))
