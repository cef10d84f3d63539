"""Activation statistics: run the model in ONNX Runtime with the tensors to quantize exposed as extra
graph outputs, one batch at a time, folding each batch into per-tensor histograms and dropping it.

Memory is bounded by one batch of activations plus NUM_BINS counters per tensor, whatever the
sample count. With ``real_tokens`` the statistics cover only positions where ``attention_mask`` is 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trtforge.calibration.data import rejected_data_is_user_error
from trtforge.calibration.histogram import TensorHistogram, select_real_tokens
from trtforge.numerics.compare import masked_rows, row_cosines
from trtforge.numerics.feeds import check_feed_values, embedding_rows
from trtforge.numerics.sessions import exact_session, run

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

    from trtforge.calibration.data import CalibrationDataset

MASK_INPUT = "attention_mask"


@dataclass
class Statistics:
    """Histograms per tensor and what it took to collect them."""

    tensors: dict[str, TensorHistogram]
    samples: int
    batches: int
    seconds: float
    real_tokens: bool


def with_outputs(model: onnx.ModelProto, tensors: Iterable[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph also outputs `tensors` (types from value_info/shape inference)."""
    import onnx
    from onnx import TensorProto, helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    existing = {o.name for o in out.graph.output}
    wanted = [t for t in tensors if t not in existing]
    if not wanted:
        return out
    types = {vi.name: vi.type.tensor_type.elem_type for vi in out.graph.value_info}
    if any(t not in types for t in wanted):
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
            types.update({vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info})
        except (onnx.shape_inference.InferenceError, ValueError):
            pass  # unknown types default to FLOAT below; ORT reports a real mismatch itself
    for t in wanted:
        out.graph.output.append(helper.make_tensor_value_info(t, types.get(t) or TensorProto.FLOAT, None))
    return out


def has_mask_input(model: onnx.ModelProto) -> bool:
    """True when the model takes an ``attention_mask`` input of rank 2 ([batch, seq])."""
    for vi in model.graph.input:
        if vi.name == MASK_INPUT:
            return len(vi.type.tensor_type.shape.dim) == 2
    return False


def collect_statistics(
    model: onnx.ModelProto,
    dataset: CalibrationDataset,
    tensors: list[str],
    *,
    real_tokens: bool,
    channel_tensors: Iterable[str] = (),
    progress: bool = True,
    description: str = "calibrating",
    histograms: bool = True,
) -> Statistics:
    """Stream `dataset` through `model` and return |x| statistics of `tensors` (see the module doc).

    `histograms=False` keeps only max (and channel max): enough for method "max" and SmoothQuant.
    """
    channel = set(channel_tensors)
    stats = {t: TensorHistogram(per_channel=t in channel, histogram=histograms) for t in tensors}
    session = exact_session(with_outputs(model, tensors), quiet=True)  # a refusal is raised, not logged
    rows = embedding_rows(model)
    t0 = time.perf_counter()
    samples = batches = 0
    with _progress(progress, description, len(dataset)) as advance:
        for feed in dataset:
            check_feed_values(feed, rows, f"calibration data {dataset.source}")
            with rejected_data_is_user_error(dataset.source):
                outs = run(session, feed, tensors)
            mask = feed.get(MASK_INPUT) if real_tokens else None
            for name, value in zip(tensors, outs):
                stats[name].update(select_real_tokens(value, mask) if mask is not None else value)
            del outs
            n = len(next(iter(feed.values())))
            samples += n
            batches += 1
            advance(n)
    return Statistics(stats, samples, batches, time.perf_counter() - t0, real_tokens)


class _progress:
    """A rich progress bar over batches (or nothing when disabled); yields an advance(n_samples) callable."""

    def __init__(self, enabled: bool, description: str, total: int):
        self.enabled, self.description, self.total = enabled, description, total
        self._bar: Any = None

    def __enter__(self):
        if not self.enabled:
            return lambda n: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("batches · {task.fields[samples]} samples"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._bar.__enter__()
        task = self._bar.add_task(self.description, total=self.total, samples=0)
        seen = [0]

        def advance(n: int) -> None:
            seen[0] += n
            self._bar.update(task, advance=1, samples=seen[0])

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def run_outputs(session: ort.InferenceSession, dataset: CalibrationDataset) -> list[tuple[dict, list]]:
    """(feed, model outputs) per batch of a small dataset (held-out accuracy checks)."""
    with rejected_data_is_user_error(dataset.source):
        return [(feed, run(session, feed)) for feed in dataset]


def mean_cosine(
    reference: list[tuple[dict, list]], candidate: list[list[np.ndarray]], *, real_tokens: bool
) -> tuple[float, float]:
    """(mean, min) over samples of the per-sample cosine of each float output, worst output first.

    With `real_tokens`, padded positions are zeroed in both before the cosine.
    """
    per_output: list[list[float]] = []
    for (feed, ref_outs), cand_outs in zip(reference, candidate):
        mask = feed.get(MASK_INPUT) if real_tokens else None
        for k, (r, c) in enumerate(zip(ref_outs, cand_outs)):
            if not np.issubdtype(np.asarray(r).dtype, np.floating):
                continue
            cos = row_cosines(*masked_rows(r, c, mask))
            while len(per_output) <= k:
                per_output.append([])
            per_output[k].extend(cos.tolist())
    if not per_output:
        return 1.0, 1.0
    means = [float(np.mean(v)) for v in per_output if v]
    k = int(np.argmin(means))
    return means[k], float(np.min(per_output[k]))
