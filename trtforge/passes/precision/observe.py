"""Value ranges of every float tensor, observed by running the FP32 model in ONNX Runtime on the CPU.

The feeds are the user's (any iterable of input dicts, e.g. a calibration dataset) or generated from
the model's input specs by `trtforge.numerics.feeds`: token ids within the vocabulary of the embedding
table the input indexes, 0/1 attention masks with padding, normal noise for float inputs. The session
is EXACT (graph optimizations off): the statistics are of the graph as written, on any CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from trtforge.errors import UserError
from trtforge.numerics.feeds import check_feed_values, embedding_rows, model_feed
from trtforge.numerics.sessions import exact_session

# |x| at or above this is an "infinity sentinel" (torch.finfo(float32).min in attention masks), not data.
SENTINEL = 1e38
# Generated data: symbolic dims get these sizes (first dim = batch), one tuple per batch.
_GENERATED_SIZES = ((2, 16), (1, 40), (3, 8))
# Graph-output reference values kept for the post-conversion check, at most this many batches.
MAX_CHECK_BATCHES = 8


@dataclasses.dataclass
class ValueStats:
    """Running statistics of one tensor over all sample batches."""

    dtype: np.dtype
    absmax: float = 0.0  # over finite, non-sentinel values
    sentinels: int = 0  # elements with |x| >= SENTINEL or +-inf
    nans: int = 0
    shape: tuple[int, ...] = ()  # of the largest batch seen

    def update(self, a: np.ndarray) -> None:
        """Fold one observed array into the statistics."""
        if a.size > int(np.prod(self.shape, dtype=np.int64)) or not self.shape:
            self.shape = tuple(a.shape)
        if a.dtype.kind != "f" or a.size == 0:
            return
        mag = np.abs(a.astype(np.float32, copy=False))
        nan = np.isnan(mag)
        big = mag >= SENTINEL
        self.nans += int(nan.sum())
        self.sentinels += int(big.sum())
        ok = mag[~(nan | big)]
        if ok.size:
            self.absmax = max(self.absmax, float(ok.max()))


@dataclasses.dataclass
class Observation:
    """Statistics per tensor name, the feeds and FP32 outputs kept for checking, and where data came from."""

    stats: dict[str, ValueStats]
    check_feeds: list[dict[str, np.ndarray]]
    check_outputs: list[dict[str, np.ndarray]]
    source: str
    batches: int


def generate_feeds(model: onnx.ModelProto, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """A few deterministic batches shaped from the model's input specs (`trtforge.numerics.feeds`),
    no longer than the graph's position table (a CLIP text model with 16 positions takes no 40 tokens)."""
    from trtforge.core.shape_limits import graph_limits

    caps = {name: {a: lim.hi for a, lim in axes.items()} for name, axes in graph_limits(model).items()}
    for k, sizes in enumerate(_GENERATED_SIZES):
        yield model_feed(model, sizes=sizes, seed=seed + k, max_sizes=caps)


def _probe_session(model: onnx.ModelProto) -> tuple[Any, list[str]]:
    """An exact session of `model` whose outputs also list every float (or untyped) intermediate tensor,
    and their names. The outputs are added to `model` while the session is made and removed after: a
    copy of it would be one more copy of the weights."""
    g = model.graph
    typed = {vi.name: vi for vi in g.value_info}
    present = {o.name for o in g.output}
    names = [o.name for o in g.output]
    extra = []
    for node in g.node:
        for out in node.output:
            if not out or out in present:
                continue
            vi = typed.get(out)
            elem = vi.type.tensor_type.elem_type if vi is not None else 0
            if elem not in (0, onnx.TensorProto.FLOAT):
                continue
            extra.append(vi if vi is not None else onnx.ValueInfoProto(name=out))
            present.add(out)
            names.append(out)
    count = len(g.output)
    g.output.extend(extra)
    try:
        return exact_session(model, quiet=True), names
    finally:
        del g.output[count:]


def _check_feed(feed: dict, input_names: list[str], index: int) -> dict[str, np.ndarray]:
    if not isinstance(feed, dict):
        raise UserError(f"precision sample data: batch {index} is a {type(feed).__name__}, expected a dict.")
    missing = [n for n in input_names if n not in feed]
    if missing:
        raise UserError(
            f"precision sample data: batch {index} lacks model input(s) {missing}; "
            f"expected keys {input_names}, got {sorted(feed)}."
        )
    return {n: np.asarray(feed[n]) for n in input_names}


def _fallback_feeds(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], seed: int = 0) -> list:
    """Generated batches at `shapes` (a model too large for `_GENERATED_SIZES`' small dims)."""
    return [model_feed(model, shapes=shapes, seed=seed + k) for k in range(len(_GENERATED_SIZES))]


def observe(
    model: onnx.ModelProto,
    data: Iterable[dict[str, np.ndarray]] | None,
    fallback_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Observation:
    """Run the FP32 model on every batch and gather the statistics of each float tensor.

    Generated data (`data` None) that the model cannot run, e.g. 16 audio samples for a convolution
    stack, is regenerated at `fallback_shapes` (compile: the build profile's OPT) when given."""
    sess, names = _probe_session(model)
    input_names = [i.name for i in sess.get_inputs()]
    graph_outputs = [o.name for o in model.graph.output]
    source = "generated from input specs" if data is None else "user data"
    feeds = generate_feeds(model) if data is None else data
    stats: dict[str, ValueStats] = {}
    obs = Observation(stats, [], [], source, 0)
    rows = embedding_rows(model) if data is not None else {}
    for i, raw in enumerate(feeds):
        feed = _check_feed(raw, input_names, i)
        check_feed_values(feed, rows, f"precision sample data (batch {i})")
        try:
            results = sess.run(names, feed)
        except Exception as e:
            if data is None and fallback_shapes:
                retry = observe(model, _fallback_feeds(model, fallback_shapes))
                retry.source = f"generated at {dict(fallback_shapes)} (the model fails at the default sizes)"
                return retry
            shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feed.items())
            raise UserError(f"precision sample data: ONNX Runtime failed on batch {i} ({shapes}): {e}") from e
        for name, arr in [*feed.items(), *zip(names, results)]:
            if name not in stats:
                stats[name] = ValueStats(arr.dtype)
            stats[name].update(arr)
        if len(obs.check_feeds) < MAX_CHECK_BATCHES:
            obs.check_feeds.append(feed)
            obs.check_outputs.append(dict(zip(names[: len(graph_outputs)], results[: len(graph_outputs)])))
        obs.batches += 1
    if obs.batches == 0:
        raise UserError("precision sample data is empty: give at least one batch (or data=None to generate).")
    return obs
