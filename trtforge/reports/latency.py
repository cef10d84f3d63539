"""Latency: warm-up, N timed runs per (batch, sequence) point, percentiles, throughput, peak memory.

Times are the runners' own (`BaseRunner.last_inference_time()`: the inference call only, no input
generation or validation). Peak memory: for host runs, the process's peak resident set during the
point (VmHWM, reset through /proc/self/clear_refs when the point starts) minus the resident set
before the target was loaded (after `malloc_trim`), i.e. the target's weights, arena and activations
(approximate: memory an earlier target freed but an allocator kept can be reused unseen); for CUDA runs,
torch's `max_memory_allocated` during the point. Where neither can be measured the field is null
and `memory_method` says why.

Runners that compute differently when timed (ONNX Runtime: exact session for accuracy, fast for
latency) expose `use_purpose`; each point switches them to FAST and records the session and, for host
runs, the CPU's ISA (`trtforge.numerics.cpu`), since fast kernels depend on it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.errors import UserError
from trtforge.numerics.cpu import isa_summary
from trtforge.numerics.sessions import FAST
from trtforge.reports.inputs import ReportInput, generate_feed, has_seq_axis, resolve_shape, static_batch
from trtforge.reports.results import FAILED, NOT_RUN, OK, LatencyPoint

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+)\s+kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _malloc_trim() -> None:
    """glibc's malloc_trim(0): return free heap pages to the OS (no-op where glibc is absent)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class MemoryProbe:
    """Peak memory of one latency point: host RSS high-water mark or torch CUDA peak."""

    def __init__(self, kind: str):
        self.kind = kind
        self.method, self._base = self._method(kind), 0

    @staticmethod
    def _method(kind: str) -> str:
        if kind == "cuda":
            return "torch.cuda.max_memory_allocated during the point"
        if _status_kib("VmHWM") is None:
            return "not measured: /proc/self/status has no VmHWM on this system"
        try:
            _CLEAR_REFS.write_text("5")
        except OSError as e:
            return f"not measured: cannot reset the RSS high-water mark ({e.strerror})"
        return "host peak RSS (VmHWM) during the point above the RSS before the target was loaded"

    @property
    def available(self) -> bool:
        return not self.method.startswith("not measured")

    def before_load(self) -> None:
        """Record the host RSS before the target is loaded (the baseline of every point), after handing
        memory freed by earlier targets back to the OS so this target's own growth shows in the RSS."""
        if self.available and self.kind != "cuda":
            gc.collect()
            _malloc_trim()
            self._base = _status_kib("VmRSS") or 0

    def start(self) -> None:
        """Reset the peak at the start of a point."""
        if not self.available:
            return
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            _CLEAR_REFS.write_text("5")

    def peak_bytes(self) -> int | None:
        if not self.available:
            return None
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated())
        hwm = _status_kib("VmHWM")
        return None if hwm is None else max(hwm - self._base, 0) * 1024


def measure_point(
    runner: Any,
    specs: Sequence[ReportInput],
    target: str,
    batch: int,
    seq: int | None,
    *,
    warmup: int,
    runs: int,
    memory: MemoryProbe,
    seed: int = 0,
) -> LatencyPoint:
    """Time `runner` (already active) at one point; failures become the point's status and reason."""
    point = LatencyPoint(target, batch, seq, warmup=warmup, runs=runs, memory_method=memory.method)
    point.cpu_isa = isa_summary() if memory.kind != "cuda" else None
    try:
        feed = generate_feed(specs, batch, seq, seed)
    except UserError as e:
        point.status, point.reason = NOT_RUN, str(e)
        return point
    point.input_shapes = {k: list(v.shape) for k, v in feed.items()}
    try:
        if hasattr(runner, "use_purpose"):
            runner.use_purpose(FAST)
            point.session = runner.purpose
        memory.start()
        runner.infer(feed)  # validates the feed once; also the first warm-up run
        for _ in range(max(warmup - 1, 0)):
            runner.infer(feed, check_inputs=False)
        times = []
        for _ in range(runs):
            runner.infer(feed, check_inputs=False)
            times.append(runner.last_inference_time())
        point.peak_memory_bytes = memory.peak_bytes()
    except Exception as e:
        point.status, point.reason = FAILED, f"{type(e).__name__}: {str(e).strip()[:500]}"
        return point
    ms = np.asarray(times, dtype=np.float64) * 1e3
    point.mean_ms, point.min_ms = float(ms.mean()), float(ms.min())
    point.p50_ms, point.p90_ms, point.p99_ms = (float(x) for x in np.percentile(ms, [50, 90, 99]))
    point.throughput = batch / (point.mean_ms / 1e3) if point.mean_ms > 0 else None
    point.status = OK
    return point


def sweep_points(
    specs: Sequence[ReportInput], batch_sizes: Sequence[int], seq_lens: Sequence[int]
) -> list[tuple]:
    """(batch, seq) points; seq is None when no input has a dynamic non-batch axis."""
    seqs: list[int | None] = list(seq_lens) if has_seq_axis(specs) else [None]
    fixed = static_batch(specs)
    return [(b, s) for b in ([fixed] if fixed else batch_sizes) for s in seqs]


def check_point(specs: Sequence[ReportInput], batch: int, seq: int | None) -> str | None:
    """Why (batch, seq) cannot be fed to these specs (static dims, engine profile), or None."""
    try:
        for s in specs:
            resolve_shape(s, batch, seq)
    except UserError as e:
        return str(e)
    return None
