"""Calibration datasets: files, text plus a tokenizer, or Python iterables -> batches of feed dicts.

Every source is validated against the model's inputs (names, dtypes, ranks, static dims, emptiness,
NaN/inf) when it is loaded, before any statistics run, so a bad dataset costs seconds, not a
calibration; of array files only the samples used are kept, and checked (a .npz member used is read
through once, a block at a time, for its CRC-32). Sources:

- ``data.npz``: input name -> array with a leading sample axis.
- a directory of ``.npz`` files (as above) and/or ``<input_name>.npy`` files: the ``.npz`` files in
  name order, then the ``.npy`` files (for a one-input model each ``.npy`` holds samples, in name order).
- ``sentences.txt`` (one sentence per line) with a tokenizer (a Hugging Face tokenizer path, or
  ``demo`` for the bundled all-MiniLM-L6-v2 tokenizer); padded per batch, so padding stays minimal.
- ``package.module:function``: a function returning an iterable of input dicts.
- from Python: a dict of arrays (as in a .npz), a torch DataLoader, or any iterable of input dicts
  (batches or single samples).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtforge._fileio import check_utf8_path
from trtforge.calibration.sources import (
    DEMO_TOKENIZER,
    Chunk,
    Part,
    array_file_kind,
    array_files,
    chunk_len,
    from_iterable,
    guarded,
    load_dir,
    load_function,
    load_npy_file,
    load_npz,
    part_len,
    read_selected,
    resolve_tokenizer,
    text_dataset,
    to_numpy,
    validate_chunk,
)
from trtforge.core.tensor_spec import DYNAMIC, TensorSpec, graph_inputs
from trtforge.errors import UserError

if TYPE_CHECKING:
    import onnx


def input_specs_from_model(model: onnx.ModelProto) -> list[TensorSpec]:
    """The model's inputs as calibration data must fit them (`trtforge.core.tensor_spec.graph_inputs`)."""
    return graph_inputs(model)


def _as_spec(s: TensorSpec | tuple) -> TensorSpec:
    """A TensorSpec with a dtype name; a (name, dtype, dims) tuple's str dims are named dynamic dims."""
    if isinstance(s, TensorSpec):
        return (
            s if isinstance(s.dtype, str) else TensorSpec(s.name, np.dtype(s.dtype).name, s.shape, s.symbols)
        )
    dims = tuple(s[2])
    shape = tuple(DYNAMIC if isinstance(d, str) else int(d) for d in dims)
    return TensorSpec(
        s[0], np.dtype(s[1]).name, shape, tuple(d if isinstance(d, str) else None for d in dims)
    )


class CalibrationDataset:
    """Validated samples, yielded as batches of feed dicts ``{input_name: np.ndarray}``.

    Array files are kept only for the samples used (``.npy`` and numpy.savez's ``.npz`` memory-mapped);
    text sources keep sentences and tokenize one batch at a time. Samples with different trailing shapes
    never share a batch.
    """

    def __init__(
        self,
        specs: list[TensorSpec],
        *,
        source: str,
        batch_size: int,
        chunks: list[Chunk] | None = None,
        sentences: list[str] | None = None,
        tokenize: Callable[[list[str]], Chunk] | None = None,
        order: np.ndarray | None = None,
        fixed_batch: bool = False,
    ):
        self.specs = specs
        self.source = source
        self.batch_size = batch_size
        self._chunks = chunks
        self._sentences = sentences
        self._tokenize = tokenize
        if chunks is not None:
            self._index = [(c, r) for c, ch in enumerate(chunks) for r in range(chunk_len(ch))]
        else:
            self._index = [(0, r) for r in range(len(sentences or []))]
        self._order = np.arange(len(self._index)) if order is None else order
        self.fixed_batch = fixed_batch  # the model has a static batch size: drop incomplete batches

    @property
    def num_samples(self) -> int:
        """Number of samples this dataset yields."""
        return len(self._order)

    def __len__(self) -> int:
        """Number of batches."""
        if self.fixed_batch:
            return sum(len(g) // self.batch_size for g in self._groups())
        return sum(-(-len(g) // self.batch_size) for g in self._groups())

    def _subset(self, order: np.ndarray, source: str) -> CalibrationDataset:
        ds = CalibrationDataset.__new__(CalibrationDataset)
        ds.__dict__.update(self.__dict__)
        ds._order, ds.source = order, source
        return ds

    def split(self, holdout: int) -> tuple[CalibrationDataset, CalibrationDataset]:
        """(first n - holdout samples, last holdout samples): held-out data for accuracy checks."""
        if not 0 < holdout < self.num_samples:
            raise UserError(
                f"cannot hold out {holdout} of the {self.num_samples} samples of {self.source}; "
                "provide more calibration samples."
            )
        cut = self.num_samples - holdout
        return (
            self._subset(self._order[:cut], self.source),
            self._subset(self._order[cut:], f"{self.source} (held out)"),
        )

    def take(self, n: int) -> CalibrationDataset:
        """The first `n` samples."""
        return self._subset(self._order[:n], self.source)

    def _groups(self) -> list[list[int]]:
        if self._chunks is None:
            return [list(self._order)]
        groups: dict[tuple, list[int]] = {}
        for i in self._order:
            c, _ = self._index[i]
            key = tuple(a.shape[1:] for a in self._chunks[c].values())
            groups.setdefault(key, []).append(int(i))
        return list(groups.values())

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for group in self._groups():
            for start in range(0, len(group), self.batch_size):
                idx = group[start : start + self.batch_size]
                if self.fixed_batch and len(idx) < self.batch_size:
                    continue
                if self._chunks is None:
                    assert self._tokenize is not None and self._sentences is not None
                    yield self._tokenize([self._sentences[self._index[i][1]] for i in idx])
                else:
                    yield {
                        s.name: np.stack(
                            [self._chunks[self._index[i][0]][s.name][self._index[i][1]] for i in idx]
                        )
                        for s in self.specs
                    }

    @property
    def tokenized(self) -> bool:
        """Whether the samples are sentences tokenized per batch (a text file), not arrays."""
        return self._sentences is not None

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary (source, samples, batch size)."""
        return {"source": self.source, "samples": self.num_samples, "batch_size": self.batch_size}


# "/onnxruntime_src/.../reshape_helper.h:84 onnxruntime::ReshapeHelper::ReshapeHelper(const ..., bool) "
# before a kernel's reason: ORT's source file and C++ signature, noise to the user.
_ORT_SOURCE_LOCATION = re.compile(r"^\S+\.(?:h|cc|cpp):\d+ [^()]*\([^()]*\)\s*")
_ORT_NODE = re.compile(r"while running (\w+) node\. Name:'([^']*)'")


@contextlib.contextmanager
def rejected_data_is_user_error(source: str) -> Iterator[None]:
    """ONNX Runtime refusing the user's samples (a shape, a dtype, token ids outside the vocabulary) is
    the user's to fix: a UserError naming the data, with ONNX Runtime's reason. A kernel failing on the
    data's sizes (a Reshape that cannot split an image of the wrong side into its windows) is ORT's
    `Fail`, not `InvalidArgument`: the model ran on generated inputs, so that is the data's too."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

    try:
        yield
    except (InvalidArgument, Fail) as e:
        reason = str(e).split("Status Message:", 1)[-1].strip() or str(e)
        reason = _ORT_SOURCE_LOCATION.sub("", reason)
        node = _ORT_NODE.search(str(e))
        if node:
            reason = f"{reason.rstrip('. ')} (at {node[1]} node '{node[2]}')"
        raise UserError(
            f"ONNX Runtime rejected a batch of calibration data {source}: {reason[:400]}. Check that the "
            "data "
            "fits the model (token ids within its vocabulary, shapes within its dimensions, dtypes)."
        ) from e


#: the tokens a text sample is truncated to, unless the caller says otherwise (the engine's profile may)
TEXT_MAX_LENGTH = 128


def load_dataset(
    spec: Any,
    input_specs: list[TensorSpec] | list[tuple],
    *,
    batch_size: int = 8,
    max_samples: int | None = None,
    shuffle_seed: int | None = None,
    tokenizer: Any = None,
    max_length: int = TEXT_MAX_LENGTH,
    what: str = "calibration data",
) -> CalibrationDataset:
    """Load and validate calibration data for a model with inputs `input_specs` (see the module doc).

    `what` names the data in messages (the option it came from: --precision-data, --data, ...).
    Of `.npz`/`.npy` files and directories only the samples used are kept (and checked for NaN/inf and
    cast; each .npz member used is read through once for its CRC-32, a block at a time): shapes and
    dtypes come from the files' headers, and without `shuffle_seed` a directory's files are opened in
    order only until they hold `max_samples`.
    `shuffle_seed` shuffles the samples before `max_samples` takes the first ones: a random subset of a
    file, directory, text or dict of arrays. A module:function or iterable is read to its end and all of
    it shuffled; with `max_samples` too it is refused, since it is read only to its first samples.

    Raises UserError naming the file/input and what was expected when the data does not fit the model.
    """
    specs = [_as_spec(s) for s in input_specs]
    static_batch = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0}
    fixed_batch = len(static_batch) == 1
    if fixed_batch:
        batch_size = static_batch.pop()  # the model fixes its batch size
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}.")
    if max_samples is not None and max_samples < 1:
        raise UserError(f"sample count must be >= 1, got {max_samples}.")
    if shuffle_seed is not None and (
        isinstance(shuffle_seed, bool) or not isinstance(shuffle_seed, (int, np.integer)) or shuffle_seed < 0
    ):
        raise UserError(f"the shuffle seed (--shuffle-seed) must be an integer >= 0, got {shuffle_seed!r}.")
    if isinstance(spec, (str, os.PathLike)) and not os.fspath(spec).strip():
        raise UserError(f"{what} is an empty path; expected a file, directory or module:function.")
    if isinstance(spec, (str, os.PathLike)):
        check_utf8_path(spec, what)
    chunks: list[Chunk] | None = None
    parts: list[Part] | None = None  # files whose data is read once the samples are picked
    sentences = tokenize = None
    if isinstance(spec, (str, os.PathLike)) and Path(spec).exists():
        path = Path(spec)
        source = str(path)
        kind = array_file_kind(path)
        if path.is_dir():  # (unshuffled, only the files that hold the first max_samples are opened)
            parts = load_dir(path, specs, need=max_samples if shuffle_seed is None else None)
        elif kind == ".npz":
            parts = [load_npz(path, specs)]
        elif kind == ".npy":
            parts = [load_npy_file(path, specs)]
        else:
            sentences, tokenize = text_dataset(path, specs, tokenizer, max_length)
    elif isinstance(spec, str) and ":" in spec and not spec.endswith((".npz", ".txt", ".npy")):
        source = spec
        _refuse_shuffling_a_stream(shuffle_seed, max_samples, f"{what} '{spec}' (a module:function)")
        chunks = from_iterable(load_function(spec, what), specs, f"data function '{spec}'", max_samples)
    elif isinstance(spec, (str, os.PathLike)):
        raise UserError(f"{what} '{spec}' does not exist (expected a file, directory or module:function).")
    elif isinstance(spec, dict):
        source = "in-memory arrays"
        arrays = {k: to_numpy(v, f"calibration arrays: input {k!r}") for k, v in spec.items()}
        chunks = [validate_chunk(arrays, specs, "calibration arrays")]
    elif isinstance(spec, Iterable):
        source = type(spec).__name__
        _refuse_shuffling_a_stream(shuffle_seed, max_samples, f"{what} ({source}, an iterable)")
        chunks = from_iterable(
            guarded(spec, f"calibration data ({source})"), specs, f"calibration data ({source})", max_samples
        )
    else:
        raise UserError(f"unsupported {what} {type(spec).__name__}; see trtforge calibrate --help.")
    if parts is not None:
        n = sum(part_len(p) for p in parts)
    else:
        n = sum(chunk_len(c) for c in chunks) if chunks is not None else len(sentences or [])
    if n == 0:
        raise UserError(f"{what} {source} is empty: it holds no samples.")
    try:  # (unshuffled, only the samples used are indexed: a file's header may declare 10**12 of them)
        if shuffle_seed is not None:
            order = np.random.default_rng(shuffle_seed).permutation(n)[:max_samples]
        else:
            order = np.arange(n if max_samples is None else min(n, max_samples))
    except (MemoryError, ValueError) as e:  # (numpy: "array is too big" past its sizes)
        raise UserError(
            f"{what} {source} holds {n:,} samples, too many to index on this machine ({type(e).__name__}); "
            "take a subset with a sample count (calibrate --samples N, compile --calib-samples N), "
            "without --shuffle-seed."
        ) from e
    if fixed_batch and len(order) < batch_size:
        raise UserError(
            f"the model has a static batch size {batch_size} but calibration data {source} has only "
            f"{len(order)} sample(s); provide at least {batch_size}."
        )
    if parts is not None:  # read the samples picked, and only those
        chunks, order = read_selected(parts, order, specs)
    dataset = CalibrationDataset(
        specs,
        source=source,
        batch_size=batch_size,
        chunks=chunks,
        sentences=sentences,
        tokenize=tokenize,
        order=order,
        fixed_batch=fixed_batch,
    )
    if fixed_batch and len(dataset) == 0:  # (before: 'no value at all ... a zero-length axis', after a run)
        groups = dataset._groups()
        raise UserError(
            f"the model has a static batch size {batch_size}, and calibration data {source} has no "
            f"{batch_size} samples of one shape to fill a batch (samples of different shapes never share "
            f"one): its {len(order)} samples come in {len(groups)} shapes, at most "
            f"{max(len(g) for g in groups)} of each. Give at least {batch_size} samples of one shape."
        )
    return dataset


def data_files(spec: Any, what: str = "calibration data") -> dict[str, Path]:
    """The files calibration data `spec` is read from, by how messages name them: the file itself, a
    directory's .npz/.npy files (its other files are not data), or a module:function's module file once
    :func:`load_dataset` has imported it. Outputs must not overwrite them (checked with
    `trtforge._fileio.refuse_overwriting_inputs`); in-memory data gives none."""
    if not isinstance(spec, (str, os.PathLike)) or not os.fspath(spec).strip():
        return {}
    path = Path(spec)
    if path.is_file():
        return {what: path}
    if path.is_dir():
        npz, npy = array_files(path)
        return {f"file '{p.name}' of the {what} directory '{spec}'": p for p in (*npz, *npy)}
    module = sys.modules.get(os.fspath(spec).partition(":")[0].strip()) if ":" in os.fspath(spec) else None
    source = getattr(module, "__file__", None)
    return {f"module file of the {what} function '{spec}'": Path(source)} if source else {}


def _refuse_shuffling_a_stream(shuffle_seed: int | None, max_samples: int | None, where: str) -> None:
    """UserError when a seed would shuffle a stream that a sample count cuts short: --shuffle-seed with
    --samples N picks a random N of a file's samples, but a module:function or iterable (possibly endless)
    is read only to its first N or so (as many as its items hold), so the seed only reordered those, a
    window that depended on the size of its items. Without a count a stream is read to its end (at most
    UNBOUNDED_SAMPLE_LIMIT samples) and every sample is shuffled."""
    if shuffle_seed is None or max_samples is None:
        return
    raise UserError(
        f"the shuffle seed (--shuffle-seed, shuffle_seed) with a sample count (--samples {max_samples}) "
        f"picks a random {max_samples} of all the samples, but {where} is read only as far as its first "
        f"{max_samples} (it may never end), so there is nothing to pick from. Shuffle in the source "
        "itself (a seeded shuffle in the function, a DataLoader's shuffle=True), or drop the seed, or drop "
        "the count to read the source to its end and shuffle all of it."
    )


def check_profile(
    dataset: CalibrationDataset, profile: Mapping[str, Any], what: str = "--calib-data"
) -> None:
    """UserError naming the input and axis when array samples of `dataset` fall outside `profile` (input
    -> ShapeRange, the --shape ranges the engine is built for) on an axis past the sample axis: the
    engine never runs such inputs, so their activation ranges are not the ones to calibrate on (a
    sequence of 512 tokens for a 128-token engine). The batch axis is calibration's own (--batch-size).
    Text samples are tokenized per batch later and are not checked here."""
    from trtforge.core.shapes import format_range

    if dataset._chunks is None:
        return
    for c in sorted({dataset._index[i][0] for i in dataset._order}):
        for name, a in dataset._chunks[c].items():
            rng = profile.get(name)
            if rng is None or len(rng.min) != a.ndim:
                continue
            for axis in range(1, a.ndim):
                lo, hi = int(rng.min[axis]), int(rng.max[axis])
                if not lo <= a.shape[axis] <= hi:
                    raise UserError(
                        f"{what} {dataset.source}: input '{name}' has size {a.shape[axis]} on axis {axis}, "
                        f"outside the engine's profile {lo}..{hi} there "
                        f"(--shape {name}:{format_range(rng)}); "
                        "the engine never runs such inputs, so their activation ranges are not the ones to "
                        "calibrate on. Give samples within the profile, or widen --shape."
                    )


# resolve_tokenizer and DEMO_TOKENIZER are read from here by the CLI (generate, calibrate).
__all__ = [
    "DEMO_TOKENIZER",
    "TEXT_MAX_LENGTH",
    "CalibrationDataset",
    "check_profile",
    "data_files",
    "input_specs_from_model",
    "load_dataset",
    "rejected_data_is_user_error",
    "resolve_tokenizer",
]
