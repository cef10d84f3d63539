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


# An output whose per-sample cosine to the FP32 output falls below this after conversion has lost its
# meaning, not a few bits: each of the 27 encoders of the test zoo (tests/passes/_zoo.py, fused, generated
# data) stays above 0.9999 in BF16 and at 0.999999 or above in FP16; an activation FP16 flushes gives 0.
MIN_CHECK_COSINE = 0.99


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

    def check_problems(self) -> list[str]:
        """What the check against FP32 found wrong, one phrase per output: not finite where FP32 is, or
        a per-sample cosine below :data:`MIN_CHECK_COSINE`. Empty when the conversion kept the outputs."""
        problems = []
        for c in self.verification:
            if not c.finite:
                problems.append(f"output '{c.name}' is not finite where the FP32 model's is")
            elif c.min_cosine < MIN_CHECK_COSINE:
                problems.append(
                    f"output '{c.name}' agrees with the FP32 model's to a cosine of only {c.min_cosine:.3f} "
                    f"(error up to {c.max_rel_err:.1%} of its largest value)"
                )
        return problems

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (for the manifest and `--json` output)."""
        d = dataclasses.asdict(self)
        d["fp32_nodes"] = self.fp32_nodes
        d["reason_counts"] = self.reason_counts()
        return d
