"""Report inputs: I/O specs (from ONNX or an engine manifest), generated feeds, and user data.

Generated feeds follow the specs by the rules of `trtforge.numerics.feeds` (ids within the embedding
table's rows, masks with a padded tail, other integers 0/1, floats standard normal). Dynamic axis 0
is the batch, other dynamic axes take the sequence length; static axes keep their size. User data:
a `.npz`, a dict or an iterable of feed dicts (passed as they are, so a mismatch shows up in the row
of the target that rejects it), or any calibration dataset format
(`trtforge.calibration.data.load_dataset`: directory, text + tokenizer, `module:function`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtforge._fileio import as_input_path
from trtforge.core.tensor_spec import TensorSpec, graph_inputs, is_dynamic, numpy_dtype_of
from trtforge.errors import UserError
from trtforge.numerics.feeds import MAX_FEED_BYTES, check_finite, embedding_rows, synthetic_feed

if TYPE_CHECKING:
    import onnx

    from trtforge.core.manifest import Manifest
    from trtforge.core.shapes import ShapeLimits

Feed = dict[str, np.ndarray]
_NPZ_BATCH = 8  # samples per accuracy iteration when a .npz holds more
MAX_BATCH = 1 << 20


@dataclass(frozen=True)
class ReportInput:
    """One model input as a report feeds it: its TensorSpec plus what the report knows of its values (the
    id range of an embedding input) and sizes (per-axis (min, max): an engine's profile, or model limits)."""

    tensor: TensorSpec
    vocab: int | None = None
    limits: tuple[tuple[int, int], ...] | None = None
    limit_source: str | None = None  # where `limits` came from (None: the engine profile)

    @property
    def name(self) -> str:
        """The input's name."""
        return self.tensor.name

    @property
    def dtype(self) -> np.dtype:
        """The input's NumPy dtype."""
        return self.tensor.np_dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The input's dims (-1 dynamic)."""
        return tuple(self.tensor.shape)


def vocab_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> rows of the embedding table it indexes (through casts/reshapes), where found."""
    return embedding_rows(model)


def specs_from_onnx(model: onnx.ModelProto, limits: ShapeLimits | None = None) -> list[ReportInput]:
    """Input specs of an ONNX model (initializers excluded), with vocabulary sizes where found and the
    model's known axis limits (`trtforge.core.shape_limits`) where given."""
    from trtforge.core.shapes import MAX_DIM

    vocab = vocab_sizes(model)
    specs = []
    for t in graph_inputs(model):
        axes = (limits or {}).get(t.name) or {}
        spec_limits, source = None, None
        if axes:
            spec_limits = tuple(
                (axes[a].lo, axes[a].hi) if a in axes else (1, MAX_DIM) for a in range(len(t.shape))
            )
            source = next(iter(axes.values())).source
        specs.append(ReportInput(t, vocab.get(t.name), spec_limits, source))
    return specs


def fit_sizes(
    specs: Sequence[ReportInput], batch_sizes: Sequence[int], seq_lens: Sequence[int]
) -> tuple[int, int, list[int], list[str]]:
    """Sizes the inputs can take: (accuracy batch, accuracy sequence, sweep sequences, notes).

    The accuracy feeds use the largest batch and the first sequence length, brought within every
    spec's limits; sweep lengths outside the limits stay (their rows say why), and the accuracy
    length is added when none fits.
    """
    batch_hi, seq_lo, seq_hi, source = MAX_BATCH, 1, None, None
    for s in specs:
        for axis, (lo, hi) in enumerate(s.limits or ()):
            dim = s.shape[axis] if axis < len(s.shape) else None
            if isinstance(dim, int) and not is_dynamic(dim):
                continue
            if axis == 0:
                batch_hi = min(batch_hi, hi)
            elif seq_hi is None or hi < seq_hi:
                seq_lo, seq_hi, source = max(seq_lo, lo), hi, s.limit_source or "the engine profile"
    notes = []
    batch = min(max(batch_sizes), batch_hi)
    seq, sweep = int(seq_lens[0]), [int(x) for x in seq_lens]
    if seq_hi is not None and has_seq_axis(specs):
        seq = min(max(seq, seq_lo), seq_hi)
        if not any(seq_lo <= x <= seq_hi for x in sweep):
            sweep.append(seq)
        outside = [x for x in seq_lens if not seq_lo <= x <= seq_hi]
        if outside:
            notes.append(
                f"sequence lengths {outside} cannot run: the model takes {seq_lo} to at most {seq_hi} "
                f"({source}); accuracy inputs use length {seq}."
            )
    return batch, seq, sweep, notes


def specs_from_manifest(manifest: Manifest, vocab: Mapping[str, int] | None = None) -> list[ReportInput]:
    """Input specs of an engine: dtypes and shapes from its manifest, limits from profile 0."""
    profile = manifest.profiles[0] if manifest.profiles else {}
    specs = []
    for t in manifest.inputs:
        rng = profile.get(t.name)
        limits = tuple(zip(rng.min, rng.max)) if rng is not None else None
        numpy_dtype_of(t.dtype, f"engine input '{t.name}'")  # a dtype no data can be made of: say so now
        specs.append(ReportInput(t, (vocab or {}).get(t.name), limits))
    return specs


def resolve_shape(spec: ReportInput, batch: int, seq: int | None) -> tuple[int, ...]:
    """The concrete shape of `spec` at (batch, seq); UserError saying why when it cannot be used."""
    shape = []
    for axis, d in enumerate(spec.shape):
        if isinstance(d, int) and not is_dynamic(d):  # a static 0 is an empty axis, kept
            size = d
            if axis == 0 and d != batch:
                raise UserError(f"input '{spec.name}' has a static batch of {d}, not {batch}")
        elif axis == 0:
            size = batch
        elif seq is None:
            raise UserError(f"input '{spec.name}' has dynamic axis {axis} but no sequence length was given")
        else:
            size = seq
        if spec.limits is not None and not spec.limits[axis][0] <= size <= spec.limits[axis][1]:
            lo, hi = spec.limits[axis]
            where = (
                f"the range the model takes ({spec.limit_source})"
                if spec.limit_source
                else "the engine profile"
            )
            raise UserError(f"input '{spec.name}' axis {axis} = {size} is outside {where} [{lo}, {hi}]")
        shape.append(size)
    return tuple(shape)


def static_batch(specs: Sequence[ReportInput]) -> int | None:
    """The batch size every input fixes on axis 0, if they all fix the same one."""
    sizes = {
        s.shape[0] if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0 else None for s in specs
    }
    return sizes.pop() if len(sizes) == 1 else None


def has_seq_axis(specs: Sequence[ReportInput]) -> bool:
    """True when some input has a dynamic axis other than the batch axis."""
    return any(not (isinstance(d, int) and not is_dynamic(d)) for s in specs for d in s.shape[1:])


def generate_feed(specs: Sequence[ReportInput], batch: int, seq: int | None, seed: int = 0) -> Feed:
    """One deterministic feed dict at (batch, seq) from the specs (`trtforge.numerics.feeds` rules); a
    UserError naming --batch/--seq when an input would exceed what trtforge generates."""
    shapes = [(s, resolve_shape(s, batch, seq)) for s in specs]
    for s, shape in shapes:
        nbytes = math.prod(shape) * np.dtype(s.dtype).itemsize
        if nbytes > MAX_FEED_BYTES:
            at = f"batch {batch}" + (f", sequence {seq}" if seq is not None and has_seq_axis([s]) else "")
            raise UserError(
                f"input '{s.name}' at {at} is {list(shape)} ({np.dtype(s.dtype).name}), "
                f"{nbytes / 2**30:.3g} GiB: above the {MAX_FEED_BYTES / 2**30:g} GiB trtforge generates "
                "per input. Use smaller --batch / --seq values."
            )
    return synthetic_feed(((s.name, s.dtype, shape, s.vocab) for s, shape in shapes), seed)


def _split_npz(arrays: dict[str, np.ndarray]) -> list[Feed]:
    lengths = {a.shape[0] if a.ndim else 0 for a in arrays.values()}
    if len(lengths) != 1 or (n := lengths.pop()) <= _NPZ_BATCH:
        return [arrays]
    return [{k: v[i : i + _NPZ_BATCH] for k, v in arrays.items()} for i in range(0, n, _NPZ_BATCH)]


def _load_npz(path: Path) -> list[Feed]:
    from trtforge.calibration.sources import read_npz

    arrays = read_npz(path, f"--data '{path}'")
    if not arrays:
        raise UserError(f"--data '{path}' holds no arrays; expected one array per model input name.")
    return _split_npz(arrays)


def _as_feed(item: Any, where: str) -> Feed:
    if not isinstance(item, Mapping):
        raise UserError(f"{where}: expected a dict of input name -> array, got {type(item).__name__}.")
    out = {}
    for k, v in item.items():
        if hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        out[str(k)] = np.asarray(v)
    return out


def _checked(feeds: list[Feed], where: str) -> list[Feed]:
    """`feeds`, or a UserError naming an input whose array holds no sample (nothing to compare) or a
    NaN/inf (every target's error against the reference would read NaN, or hide the fault)."""
    for feed in feeds:
        for name, array in feed.items():
            if array.ndim and array.shape[0] == 0:
                raise UserError(
                    f"{where}: input '{name}' has shape {list(array.shape)}, no samples on its first axis; "
                    "accuracy data needs at least one sample per input."
                )
            check_finite(name, array, where, "accuracy data")
    return feeds


def load_feeds(
    data: Any, specs: Sequence[ReportInput], *, tokenizer: Any = None, batch_size: int = 8
) -> tuple[list[Feed], str]:
    """Accuracy feeds from user data, plus a one-line description of the source.

    `.npz` files, dicts and iterables of dicts are returned unvalidated (each target checks them);
    other paths and `module:function` go through the calibration dataset loader against `specs`.
    """
    if isinstance(data, Mapping):
        return _checked([_as_feed(data, "data")], "the data feed dict"), "feed dict"
    if isinstance(data, (str, os.PathLike)):
        path = as_input_path(data, "--data")
        if path.suffix == ".npz" and path.is_file():
            return _checked(_load_npz(path), f"--data '{path}'"), f"{path} (.npz)"
        from trtforge.calibration.data import load_dataset

        dataset = load_dataset(
            data, [s.tensor for s in specs], batch_size=batch_size, tokenizer=tokenizer, what="--data"
        )
        return [dict(f) for f in dataset], f"{data} (calibration dataset format)"
    if isinstance(data, Iterable):
        feeds = [_as_feed(x, f"data item {i}") for i, x in enumerate(data)]
        if not feeds:
            raise UserError("data is an empty iterable; give at least one feed dict.")
        return _checked(feeds, "data"), f"{len(feeds)} feed dicts"
    raise UserError(
        f"unsupported data {type(data).__name__}: expected a .npz path, a calibration dataset "
        "(directory, text file with a tokenizer, module:function), a feed dict or an iterable of them."
    )
