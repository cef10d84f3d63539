"""The report's result objects. Runners and the comparator produce them; renderers only read them.

`Report.to_dict()` is the JSON document (schema `report.schema.json` beside this file, format id
``trtforge.report/1``). Raw output arrays stay in :class:`TargetRun` and never reach the JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtforge._fileio import json_text
from trtforge.numerics.compare import Tolerance  # the one Tolerance; re-exported for report users

REPORT_FORMAT = "trtforge.report/1"
SCHEMA_FILE = Path(__file__).with_name("report.schema.json")

# Target status values: it ran; it was attempted and failed (reason says why); it was not attempted
# because this machine cannot run it (reason says why).
OK, FAILED, NOT_RUN = "ok", "failed", "not_run"


@dataclass
class TargetInfo:
    """One row of the target table: what was run, how it was prepared, and whether it ran."""

    name: str
    kind: str  # torch | onnxruntime | tensorrt
    precision: str
    device: str
    description: str
    status: str = OK
    reason: str | None = None
    derived_from: str | None = None
    prepare_seconds: float | None = None
    threads: dict[str, Any] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)


@dataclass
class Check:
    """One tolerance check of one output: what was checked, the measured value, the verdict."""

    name: str
    passed: bool
    detail: str


@dataclass
class Histogram:
    """Absolute-error histogram over log-spaced bins; `zeros` counts exact matches."""

    edges: list[float]
    counts: list[int]
    zeros: int


@dataclass
class AccuracyRow:
    """Accuracy of one output of one target against the reference target."""

    target: str
    output: str
    reference: str
    status: str = OK
    reason: str | None = None
    shape: list[int] | None = None
    elements: int = 0
    padding_excluded: int | None = None  # [batch, seq] positions left out as padding (attention mask 0)
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    mean_rel: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    min_row_cosine: float | None = None  # worst cosine of one row (sample, or token after masking)
    snr_db: float | None = None
    top1: float | None = None
    top5: float | None = None
    tolerance: Tolerance | None = None
    checks: list[Check] = field(default_factory=list)
    passed: bool | None = None
    histogram: Histogram | None = None


@dataclass
class LatencyPoint:
    """Latency of one target at one (batch, sequence) point."""

    target: str
    batch: int
    seq: int | None
    status: str = OK
    reason: str | None = None
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    warmup: int = 0
    runs: int = 0
    mean_ms: float | None = None
    min_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    throughput: float | None = None  # samples (batch rows) per second at the mean latency
    peak_memory_bytes: int | None = None
    memory_method: str | None = None
    session: str | None = None  # ONNX Runtime targets: "fast" (timing); accuracy is always "exact"
    cpu_isa: str | None = None  # host-CPU points: the ISA the kernels were picked for


@dataclass
class LmQuality:
    """A causal LM variant's quality on a text against the reference variant (LLM reports)."""

    target: str
    status: str = OK
    reason: str | None = None
    perplexity: float | None = None
    delta_ppl_pct: float | None = None  # 100 * (ppl / reference ppl - 1)
    nll_per_token: float | None = None
    tokens: int = 0  # predicted tokens the perplexity averages over
    top1_agreement: float | None = None  # fraction of those positions whose argmax is the reference's
    kv_bytes_per_token: int | None = None  # K and V of one token over every layer
    kv_dtype: str | None = None


@dataclass
class LmSpeed:
    """A serving variant's speed at one batch size (LLM reports): B requests submitted at once."""

    target: str
    batch: int
    status: str = OK
    reason: str | None = None
    prompt_tokens: int | None = None
    new_tokens: int | None = None
    ttft_ms: float | None = None  # median time to first token over the batch's requests
    itl_ms: float | None = None  # mean inter-token latency over the requests
    throughput_tok_s: float | None = None  # generated tokens / wall time of the batch
    wall_s: float | None = None


@dataclass
class Report:
    """Everything a report says; renderers (HTML, Markdown, JSON) read only this."""

    title: str
    created: str
    source: dict[str, Any]
    reference: str | None
    settings: dict[str, Any]
    environment: dict[str, Any]
    targets: list[TargetInfo]
    accuracy: list[AccuracyRow]
    latency: list[LatencyPoint]
    notes: list[str] = field(default_factory=list)
    format: str = REPORT_FORMAT
    lm_quality: list[LmQuality] = field(default_factory=list)  # causal-LM reports only
    lm_speed: list[LmSpeed] = field(default_factory=list)

    @property
    def is_lm(self) -> bool:
        """A causal-LM variant report (quality and speed tables) rather than an output comparison."""
        return self.source.get("kind") == "causal_lm"

    def summary(self) -> dict[str, Any]:
        """Counts for the headline: targets by status, accuracy rows passed/failed/not compared."""
        compared = [r for r in self.accuracy if r.status == OK]
        if self.is_lm:
            measured = [q for q in self.lm_quality if q.status == OK]
            failed = any(t.status == FAILED for t in self.targets)
            return {
                "targets": {s: sum(t.status == s for t in self.targets) for s in (OK, FAILED, NOT_RUN)},
                "accuracy_passed": 0,
                "accuracy_failed": 0,
                "accuracy_not_compared": sum(q.status != OK for q in self.lm_quality),
                "all_passed": bool(measured) and not failed,
            }
        # an output the target lacks, or gives in another shape, failed (compare.py marks it FAILED)
        mismatched = sum(r.status == FAILED for r in self.accuracy)
        return {
            "targets": {s: sum(t.status == s for t in self.targets) for s in (OK, FAILED, NOT_RUN)},
            "accuracy_passed": sum(r.passed is True for r in compared),
            "accuracy_failed": sum(r.passed is False for r in compared) + mismatched,
            "accuracy_not_compared": sum(r.status not in (OK, FAILED) for r in self.accuracy),
            "all_passed": bool(compared) and not mismatched and all(r.passed is not False for r in compared),
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (validated against `report.schema.json` in tests)."""
        d = asdict(self)
        if not self.is_lm:  # the encoder report's document is unchanged
            del d["lm_quality"], d["lm_speed"]
        d["summary"] = self.summary()
        return d

    def to_json(self) -> str:
        """Indented JSON. JSON has no inf/nan: those (an exact match's SNR) are written as null."""
        return json_text(self.to_dict()) + "\n"


@dataclass
class TargetRun:
    """In-memory outputs of one target over the accuracy feeds (one dict per iteration)."""

    name: str
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
