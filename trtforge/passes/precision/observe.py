"""Value ranges of every float tensor, observed by running the FP32 model in ONNX Runtime on the CPU.

The feeds are the user's (any iterable of input dicts, e.g. a calibration dataset) or generated from
the model's input specs: token ids within the vocabulary of the embedding table the input indexes,
0/1 attention masks with padding, normal noise for float inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np
import onnx

from trtforge.errors import UserError

# |x| at or above this is an "infinity sentinel" (torch.finfo(float32).min in attention masks), not data.
SENTINEL = 1e38
# Generated data: symbolic dims get these sizes (first dim = batch), one tuple per batch.
_GENERATED_SIZES = ((2, 16), (1, 40), (3, 8))
# Graph-output reference values kept for the post-conversion check, at most this many batches.
MAX_CHECK_BATCHES = 8
_FOLLOW_INDEX_OPS = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"}


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


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    out: list[int | str | None] = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    return out


def _vocab_size(model: onnx.ModelProto, name: str) -> int | None:
    """Rows of the constant table a Gather indexes with `name` (through casts/reshapes), if any."""
    inits = {i.name: i for i in model.graph.initializer}
    consts = {
        n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant" and n.attribute
    }
    frontier, seen = [name], set()
    while frontier:
        cur = frontier.pop()
        seen.add(cur)
        for n in model.graph.node:
            if cur not in n.input:
                continue
            if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == cur:
                table = inits.get(n.input[0]) or consts.get(n.input[0])
                if table is not None and table.dims:
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                    return int(table.dims[axis])
            elif n.op_type in _FOLLOW_INDEX_OPS and n.input[0] == cur:
                frontier.extend(o for o in n.output if o not in seen)
    return None


def generate_feeds(model: onnx.ModelProto, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """A few deterministic batches shaped from the model's input specs (see module docstring)."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    vocab = {vi.name: _vocab_size(model, vi.name) for vi in inputs}
    for batch, other in _GENERATED_SIZES:
        sizes: dict[str, int] = {}
        feed: dict[str, np.ndarray] = {}
        for vi in inputs:
            shape = []
            for i, d in enumerate(_dims(vi)):
                if isinstance(d, int) and d > 0:
                    shape.append(d)
                else:
                    key = d if isinstance(d, str) else f"{vi.name}:{i}"
                    shape.append(sizes.setdefault(key, batch if i == 0 else other))
            dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            feed[vi.name] = _one_input(vi.name, tuple(shape), dtype, vocab[vi.name], rng)
        yield feed


def _one_input(name: str, shape: tuple[int, ...], dtype: np.dtype, vocab: int | None, rng) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if vocab is not None:
        return rng.integers(0, vocab, size=shape).astype(dtype)
    if dtype.kind in "biu" and "mask" in name.lower() and len(shape) >= 1:
        mask = np.ones(shape, dtype=dtype)
        if len(shape) >= 2 and shape[-1] > 1:
            for idx in np.ndindex(*shape[:-1]):
                mask[idx][int(rng.integers(1, shape[-1] + 1)) :] = 0
        return mask
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 2, size=shape).astype(dtype)


def _with_all_float_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy whose graph outputs also list every float (or untyped) intermediate tensor."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    typed = {vi.name: vi for vi in m.graph.value_info}
    present = {o.name for o in m.graph.output}
    names = [o.name for o in m.graph.output]
    for node in m.graph.node:
        for out in node.output:
            if not out or out in present:
                continue
            vi = typed.get(out)
            elem = vi.type.tensor_type.elem_type if vi is not None else 0
            if elem not in (0, onnx.TensorProto.FLOAT):
                continue
            m.graph.output.append(vi if vi is not None else onnx.ValueInfoProto(name=out))
            present.add(out)
            names.append(out)
    return m, names


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


def observe(model: onnx.ModelProto, data: Iterable[dict[str, np.ndarray]] | None) -> Observation:
    """Run the FP32 model on every batch and gather the statistics of each float tensor."""
    import onnxruntime as ort

    probe, names = _with_all_float_outputs(model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    input_names = [i.name for i in sess.get_inputs()]
    graph_outputs = [o.name for o in model.graph.output]
    source = "generated from input specs" if data is None else "user data"
    feeds = generate_feeds(model) if data is None else data
    stats: dict[str, ValueStats] = {}
    obs = Observation(stats, [], [], source, 0)
    for i, raw in enumerate(feeds):
        feed = _check_feed(raw, input_names, i)
        try:
            results = sess.run(names, feed)
        except Exception as e:
            raise UserError(f"precision sample data: ONNX Runtime failed on batch {i}: {e}") from e
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
