"""What a precision conversion did, JSON-ready: every node kept in FP32 and why, casts, counts, checks."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class KeptNode:
    """A float node left in FP32, with every rule that asked for it (first one decided)."""

    name: str
    op_type: str
    reasons: list[str]


@dataclasses.dataclass
class OutputCheck:
    """The converted model's output against the FP32 model's on the same sample batches (ONNX Runtime)."""

    name: str
    max_abs_err: float
    max_rel_err: float
    min_cosine: float
    finite: bool


@dataclasses.dataclass
class PrecisionRecord:
    """Ledger of one `convert_precision` call; `to_dict()` goes into the engine manifest."""

    precision: str
    status: str = "converted"  # converted | noop-fp32 | already-low-precision
    message: str = ""
    keep_io_types: bool = True
    data_source: str = ""
    sample_batches: int = 0
    data_max: float | None = None
    init_max: float | None = None
    opset_before: int | None = None
    opset_after: int | None = None
    float_nodes: int = 0
    low_precision_nodes: int = 0
    kept_fp32: list[KeptNode] = dataclasses.field(default_factory=list)
    casts_inserted: int = 0
    casts_removed: int = 0
    initializers_converted: int = 0
    initializers_saturated: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    verification: list[OutputCheck] = dataclasses.field(default_factory=list)
    verification_mode: str = ""
    seconds: float = 0.0  # observe + classify + rewrite
    check_seconds: float = 0.0  # the ONNX Runtime check of the result

    @property
    def fp32_nodes(self) -> int:
        """How many float nodes stayed FP32."""
        return len(self.kept_fp32)

    def reason_counts(self) -> dict[str, int]:
        """How many kept nodes each rule (the text before ':') decided."""
        counts: dict[str, int] = {}
        for kept in self.kept_fp32:
            key = kept.reasons[0].split(":", 1)[0]
            counts[key] = counts.get(key, 0) + 1
        return counts

    def summary(self) -> str:
        """One line for logs and the CLI."""
        if self.status != "converted":
            return f"precision {self.precision}: {self.status} ({self.message})"
        return (
            f"precision {self.precision}: {self.low_precision_nodes}/{self.float_nodes} float nodes in "
            f"{self.precision.upper()}, {self.fp32_nodes} kept FP32 {self.reason_counts()}, "
            f"casts +{self.casts_inserted}/-{self.casts_removed}, {self.seconds:.2f}s"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (for the manifest and `--json` output)."""
        d = dataclasses.asdict(self)
        d["fp32_nodes"] = self.fp32_nodes
        d["reason_counts"] = self.reason_counts()
        return d
