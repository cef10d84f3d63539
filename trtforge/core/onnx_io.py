"""Load and save ONNX models in both forms: a single file, or a file plus external data (> 2 GB).

Every stage that touches disk goes through here, so the 2 GB protobuf limit is handled once.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trtforge._fileio import sha256_file
from trtforge.errors import UserError, shown

if TYPE_CHECKING:
    import onnx

# The oldest default-domain opset ONNX Runtime has kernels for (older files need converting first).
MIN_OPSET = 7
# Protobuf refuses to serialize messages of 2 GiB or more; stay well clear of it.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
# The metadata_props key of a decoder step graph's generation section (llm.contract writes and reads it;
# its engine's manifest carries the same section as `generation`): one key for every wing that tells a step
# graph from an encoder's.
GENERATION_KEY = "trtforge.generation"


def parse_generation(text: str, where: str) -> dict:
    """The generation section `text` (the :data:`GENERATION_KEY` metadata) of the step graph `where` as a
    dict; UserError naming the graph and the key when it is not JSON or not a JSON object (a damaged or
    hand-edited graph: the executors and the paged pass would act on it wrongly or fail deep inside)."""
    import json

    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, nesting past the parser's depth
        raise UserError(
            f"step graph '{where}': its '{GENERATION_KEY}' metadata is not valid JSON ({e}); expected the "
            "JSON object trtforge writes. Export the graph again with `trtforge compile MODEL --generate "
            "--save-onnx step.onnx`."
        ) from e
    if not isinstance(data, dict):
        raise UserError(
            f"step graph '{where}': its '{GENERATION_KEY}' metadata is not a JSON object (it is "
            f"{text[:40]!r}); expected the JSON object trtforge writes. Export the graph again with "
            "`trtforge compile MODEL --generate --save-onnx step.onnx`."
        )
    return data


def external_data_files(path: str | os.PathLike[str]) -> list[Path]:
    """The external-data files an ONNX file refers to (empty for a self-contained file)."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    base = Path(path).parent
    files = set()
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            loc = next(e.value for e in t.external_data if e.key == "location")
            files.add(base / loc)
    return sorted(files)


def model_files(path: str | os.PathLike[str]) -> dict[str, Path]:
    """The ONNX file and the external-data files it uses, by what they are (for messages)."""
    files = {"input model": Path(path)}
    for i, f in enumerate(external_data_files(path)):
        files[f"external data file #{i + 1} of the model"] = f
    return files


def source_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of an ONNX file and, in order, of the external data files it uses (one combined hash)."""
    import hashlib

    h = hashlib.sha256(sha256_file(path).encode())
    if str(path).lower().endswith(".onnx"):
        for f in external_data_files(path):
            h.update(sha256_file(f).encode())
    return h.hexdigest()


def read_onnx(
    path: str | os.PathLike[str], what: str = "ONNX model", *, external_data: bool
) -> onnx.ModelProto:
    """Parse an ONNX file (with its external data or not) and :func:`check_structure` it; UserError naming
    the file on any problem."""
    import onnx

    from trtforge._fileio import check_input_file, directory_lock, settle_commit, show_path

    p = check_input_file(path, what, sweep=True)  # (a killed writer's staged copy of it goes)
    if external_data:  # (save_onnx_atomic commits `<name>.data` first: the primary record is its)
        settle_commit(external_data_path(p))
    if p.stat().st_size == 0:
        raise UserError(f"{what} '{show_path(p)}' is empty (0 bytes); expected an ONNX model file.")
    try:  # (the model and its data file read as one, not between the renames of an optimize writing both:
        # the old model's offsets into the new data file gave wrong weights, silently)
        with directory_lock([p.parent] if external_data else [], shared=True):
            proto = onnx.load(str(p), load_external_data=False)
            if external_data:
                # (bounds first: onnx's own reader raised a bare ValueError, or read a short `length` as a
                # tensor of the wrong size that calibrate then crashed on)
                _check_external_bytes(proto, p.parent, where=f"{what} '{show_path(p)}'")
                from onnx.external_data_helper import load_external_data_for_model

                load_external_data_for_model(proto, str(p.parent))
    except UserError:
        raise
    except Exception as e:  # the file is the user's: any way onnx fails to read it (external data too)
        raise UserError(
            f"'{show_path(p)}' is not a readable ONNX model ({type(e).__name__}: {str(e)[:200]}). "
            f"Expected a protobuf ModelProto as written by torch.onnx.export or onnx.save.{_sniff(p)}"
        ) from e
    check_structure(proto, f"{what} '{show_path(p)}'")
    return proto


# Leading bytes of files often given where an ONNX model is expected, and what they are.
_MAGIC = (
    (b"\x1f\x8b", "a gzip file: decompress it first"),
    (b"PK\x03\x04", "a zip archive (torch.save writes these): export the model to ONNX first"),
    (b"\x80", "a Python pickle (an old torch.save): export the model to ONNX first"),
    (b"ftrt", "a TensorRT engine: give it to inspect, report or export-triton"),
    (b"vtrt", "a TensorRT-RTX engine: give it to inspect, report or export-triton"),
)


def _sniff(path: Path) -> str:
    """' It looks like ...' for a file whose first bytes say what it is, else ''."""
    with open(path, "rb") as f:
        head = f.read(8)
    what = next((text for magic, text in _MAGIC if head.startswith(magic)), None)
    return f" It looks like {what}." if what else ""


def min_ir_version(opsets: dict[str, int]) -> int:
    """The lowest ONNX IR version a model importing `opsets` ({domain: version}) may declare, by onnx's
    table (domains it does not know are left out). A stage that raises a model's opset raises its IR
    version to this: an IR 3 model (the ONNX model zoo's classics) kept IR 3 at opset 23, and once its
    initializers were no longer listed as graph inputs (IR < 4 needs that) the ONNX checker refused it."""
    import onnx

    ids = [onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    return onnx.helper.find_min_ir_version_for(ids, ignore_unknown=True)


def load_onnx(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load an ONNX file with its external data; UserError naming the file on any problem."""
    return read_onnx(path, external_data=True)


def check_structure(proto: onnx.ModelProto, where: str) -> None:
    """UserError for what no stage can use, said before a checker or runtime reports it in its own
    words: no graph (protobuf parses many non-ONNX files as an empty model), no outputs, an output listed
    twice, a sparse initializer, a graph input or output without an element type, an element type (of an
    initializer or graph input/output) or an opset newer than the installed onnx knows."""
    import onnx

    g = proto.graph
    if not proto.HasField("graph") or not (g.node or g.output or g.input):
        raise UserError(
            f"{where} parsed as protobuf but holds no graph (ir_version {proto.ir_version}); is it really an "
            "ONNX model? Expected a ModelProto as written by torch.onnx.export or onnx.save."
        )
    if not g.output:
        raise UserError(
            f"{where} declares no graph outputs; a model needs at least one (graph.output) to be run, "
            "verified or built."
        )
    names = [o.name for o in g.output]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(
            f"{where} lists output(s) {twice} more than once in graph.output; ONNX requires each graph "
            "output to be a distinct name (every stage would rename the copies). Return the tensor once."
        )
    sparse = [t.values.name for t in g.sparse_initializer]
    if sparse:
        raise UserError(
            f"{where} holds {len(sparse)} sparse initializer(s) {shown(sparse)}; trtforge's passes, "
            "calibration and TensorRT's parser read dense initializers only. Store them dense (numpy_helper."
            "to_array of the sparse tensor's values scattered into zeros, then numpy_helper.from_array)."
        )
    weights = {t.name for t in g.initializer}
    for kind, values in (("input", g.input), ("output", g.output)):
        for v in values:
            if (
                v.name not in weights
                and v.type.WhichOneof("value") == "tensor_type"
                and not v.type.tensor_type.elem_type
            ):
                raise UserError(
                    f"{where}: graph {kind} '{v.name}' declares no element type (elem_type 0, UNDEFINED); "
                    "ONNX Runtime and TensorRT need the dtype of every graph input and output. Set it (e.g. "
                    "TensorProto.FLOAT) where the model is built or exported."
                )
    known = set(onnx.TensorProto.DataType.values())
    for kind, name, dtype in [
        *(("initializer", t.name, t.data_type) for t in g.initializer),
        *(
            (f"graph {kind}", v.name, v.type.tensor_type.elem_type)
            for kind, values in (("input", g.input), ("output", g.output))
            for v in values
            if v.type.WhichOneof("value") == "tensor_type"
        ),
    ]:
        if dtype not in known:
            raise UserError(
                f"{where}: {kind} '{name}' has element type {dtype}, which the installed onnx "
                f"{onnx.__version__} does not know (a corrupted file, or one written by a newer ONNX)."
            )
    newest = onnx.defs.onnx_opset_version()
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < MIN_OPSET:
            raise UserError(
                f"{where} imports ONNX opset {o.version}; ONNX Runtime and TensorRT run opset {MIN_OPSET} "
                "and later. Convert it first: onnx.version_converter.convert_version(model, 17)."
            )
        if o.domain in ("", "ai.onnx") and o.version > newest:
            raise UserError(
                f"{where} imports ONNX opset {o.version}; the installed onnx {onnx.__version__} knows opsets "
                f"up to {newest}. Export with an opset <= {newest} (torch.onnx.export(..., opset_version=N))."
            )


def external_data_path(path: str | os.PathLike[str]) -> Path:
    """The external-data file :func:`save_onnx` writes beside `path` for a large model (`<name>.data`):
    one name, for the writers and for the output checks that must protect it before it is known whether
    the model will need it."""
    p = Path(path)
    return p.with_name(p.name + ".data")


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Save `model` to `path`; models near 2 GB get their weights in `<name>.data` beside it
    (:func:`save_split`; `model` is left as it was).

    Writes into the destination directory directly; callers that need atomicity save into a
    temporary directory first (see pipeline).
    """
    import onnx

    p = Path(path)
    if needs_external(model) or _has_external(model):
        save_split(model, p)
    else:
        onnx.save_model(model, str(p))
    return p


def weight_nbytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's tensors (initializers and tensor attributes, subgraphs' too) by their dims and
    dtypes, read without touching their data: protobuf's ByteSize encodes the whole message to measure it
    (40 s and a second copy of the weights at 2 GB)."""
    import math

    from onnx.external_data_helper import _get_all_tensors

    return sum(_tensor_bytes(t) or math.prod(t.dims) for t in _get_all_tensors(model))


def needs_external(model: onnx.ModelProto) -> bool:
    """True when `model` is too large for one protobuf message (:data:`EXTERNAL_DATA_THRESHOLD`): onnx's
    checker and shape inference and ONNX Runtime then take it by path only, its weights in external data
    (:func:`save_split`, :func:`model_file`)."""
    return weight_nbytes(model) >= EXTERNAL_DATA_THRESHOLD


# Each external tensor starts at a page-aligned offset: where a reader can map it rather than read it.
_DATA_ALIGNMENT = 4096
# Initializers smaller than this stay inside the ONNX file (shape constants, norms' weights).
_EXTERNAL_MIN_BYTES = 1024


def save_split(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Write `model` to `path` with the bytes of each main-graph initializer of 1 KiB or more in
    `<name>.data` (:func:`external_data_path`) at page-aligned offsets, one tensor at a time: `model` is
    neither modified nor serialised whole (past 2 GB protobuf cannot, and a copy of the weights is what
    a large model cannot afford). The rest (nodes, small constants, metadata) must fit one message."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    p = Path(path)
    data = external_data_path(p)
    skeleton = onnx.ModelProto()
    _copy_fields(model, skeleton, skip="graph")
    _copy_fields(model.graph, skeleton.graph, skip="initializer")
    with open(data, "wb") as f:
        for t in model.graph.initializer:
            out = skeleton.graph.initializer.add()
            if uses_external_data(t):
                raise ValueError(f"save_split: initializer '{t.name}' has its data outside the model")
            if not t.HasField("raw_data") or (_tensor_bytes(t) or 0) < _EXTERNAL_MIN_BYTES:
                out.CopyFrom(t)
                continue
            _copy_fields(t, out, skip="raw_data")
            f.write(b"\0" * (-f.tell() % _DATA_ALIGNMENT))
            offset = f.tell()
            f.write(t.raw_data)
            out.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", offset), ("length", f.tell() - offset)):
                out.external_data.add(key=key, value=str(value))
    p.write_bytes(skeleton.SerializeToString())
    return p


def _copy_fields(source: object, target: object, *, skip: str) -> None:
    """Copy every set field of protobuf message `source` but `skip` into the empty message `target`."""
    for field, value in source.ListFields():  # type: ignore[attr-defined]
        if field.name == skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(target, field.name).extend(value)
        elif hasattr(value, "CopyFrom"):  # a message
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


@contextlib.contextmanager
def model_file(model: onnx.ModelProto) -> Iterator[Path]:
    """`model` as an ONNX file with its weights in external data (:func:`save_split`) in a temporary
    directory, removed afterwards: what onnx's checker and shape inference and ONNX Runtime need to take a
    model past protobuf's 2 GB (by path)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trtforge-model-", ignore_cleanup_errors=True) as tmp:
        yield save_split(model, Path(tmp) / "model.onnx")


def save_onnx_atomic(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Save like :func:`save_onnx`, into a temp dir beside `path`, then rename into place.

    A failure leaves no partial model; the external-data file (if any) is named `<name>.data`.
    """
    import shutil

    from trtforge._fileio import (
        atomic_outputs,
        fsync_file,
        scratch_directory_beside,
        signals_deferred,
        staged_rename,
    )

    p = Path(path)
    tmp, cleanup = scratch_directory_beside(p)
    try:
        with atomic_outputs():  # the model and its data file together (with the caller's other outputs)
            save_onnx(model, tmp / p.name)
            data = external_data_path(tmp / p.name)
            for f in (tmp / p.name, data):  # (on disk before the commit point, as atomic_open's are)
                if f.exists():
                    fsync_file(f)
            with signals_deferred():
                if data.exists():
                    staged_rename(data, p.parent / data.name)
                staged_rename(tmp / p.name, p, cleanup=cleanup)
                cleanup = None
    except BaseException:
        # (once staged, the group removes the files, or its commit record keeps them for a roll-forward)
        if cleanup is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            cleanup()
        raise
    return p


def _has_external(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return any(uses_external_data(t) for t in _get_all_tensors(model))


def check_model(model_or_path: onnx.ModelProto | str | os.PathLike[str], *, where: str) -> None:
    """Run onnx.checker (:func:`check_proto`); UserError naming `where` when it fails."""
    import onnx

    try:
        check_proto(model_or_path)
    except onnx.checker.ValidationError as e:
        raise UserError(f"{where} fails ONNX checking: {str(e).strip().splitlines()[0][:400]}") from e
    if isinstance(model_or_path, (str, os.PathLike)):
        check_external_data(model_or_path, where=where)


def check_proto(model_or_path: onnx.ModelProto | str | os.PathLike[str], *, full_check: bool = False) -> None:
    """onnx.checker on a model or an ONNX file (whose external data it reads); a model past protobuf's
    2 GB (:func:`needs_external`) is checked as a file (:func:`model_file`), as onnx asks. onnx's
    ValidationError propagates."""
    import onnx

    if isinstance(model_or_path, (str, os.PathLike)):
        onnx.checker.check_model(os.fspath(model_or_path), full_check=full_check)
    elif needs_external(model_or_path):
        with model_file(model_or_path) as path:
            onnx.checker.check_model(str(path), full_check=full_check)
    else:
        onnx.checker.check_model(model_or_path, full_check=full_check)


@contextlib.contextmanager
def shapes_inferred(model: onnx.ModelProto) -> Iterator[onnx.ModelProto]:
    """`model` with onnx's shape inference's value_info (onnx.shape_inference.infer_shapes), for the block's
    reading. A model past protobuf's 2 GB (:func:`needs_external`) is inferred as a file
    (infer_shapes_path on :func:`model_file`) and the block gets `model` itself with the inferred value_info
    and graph outputs, given back as they were afterwards: a copy would be one more copy of the weights. A
    small one gets a new model. onnx's errors propagate."""
    import onnx

    if not needs_external(model):
        yield onnx.shape_inference.infer_shapes(model)
        return
    with model_file(model) as path:
        inferred_path = path.with_name("inferred.onnx")
        onnx.shape_inference.infer_shapes_path(str(path), str(inferred_path))
        inferred = onnx.load(str(inferred_path), load_external_data=False)
    fields = ("value_info", "output")
    saved = {f: list(getattr(model.graph, f)) for f in fields}
    for f in fields:
        del getattr(model.graph, f)[:]
        getattr(model.graph, f).extend(getattr(inferred.graph, f))
    try:
        yield model
    finally:
        for f in fields:
            del getattr(model.graph, f)[:]
            getattr(model.graph, f).extend(saved[f])


def check_external_data(path: str | os.PathLike[str], *, where: str) -> None:
    """Every external tensor's bytes lie within its data file. onnx.checker only asks that the file exist:
    a truncated one passed, and compile then failed inside a later stage (an internal error) and report
    ran every target to a failure."""
    import onnx

    _check_external_bytes(onnx.load(str(path), load_external_data=False), Path(path).parent, where=where)


def _check_external_bytes(model: onnx.ModelProto, base: Path, *, where: str) -> None:
    """:func:`check_external_data` on a model parsed without its data, whose file lies in `base`: each
    external tensor's `length` is the size its dims and dtype need, and its bytes lie within the file.
    Locations that are absolute or leave `base` are left to onnx, which refuses them."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    sizes: dict[Path, int] = {}
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        info = ExternalDataInfo(t)
        location = Path(info.location)
        if location.is_absolute() or ".." in location.parts:
            continue
        file = base / location
        if file not in sizes:
            try:
                st = file.stat()
            except OSError:
                continue  # a missing file is onnx.checker's to name
            if not stat.S_ISREG(st.st_mode):
                continue  # and so is a directory or device there
            sizes[file] = st.st_size
        offset = int(info.offset or 0)
        length = int(info.length or 0)
        size = _tensor_bytes(t)
        if length and size is not None and length != size:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
            raise UserError(
                f"{where}: tensor '{t.name}' is {list(t.dims)} {dtype} ({size} bytes), but its external data "
                f"entry gives it {length} bytes of '{file}': the model and its data file do not belong "
                "together. Save the model and its data together again."
            )
        need = length or size or 0
        if offset + need > sizes[file]:
            raise UserError(
                f"{where}: its external data file '{file}' holds {sizes[file]} bytes, but tensor '{t.name}' "
                f"is stored at bytes {offset}..{offset + need} of it: the file is truncated or belongs to "
                "another model. Save the model and its data together again."
            )


def _tensor_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes a tensor of whole-byte elements takes (None for strings and sub-byte types, packed)."""
    import math

    import onnx

    try:
        if t.data_type == onnx.TensorProto.STRING or onnx.TensorProto.DataType.Name(t.data_type) in _SUB_BYTE:
            return None
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return math.prod(t.dims) * itemsize


_SUB_BYTE = {"INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2"}
