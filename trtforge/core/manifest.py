"""The engine manifest (`model.engine.json`): what an engine is, where it came from, how it was built.

Written next to every engine; read back by `trtforge inspect`, the runtime (which checks the sha256,
backend and version before deserializing) and the Triton exporter. Schema id: ``trtforge.manifest/1``.

Publishing is crash-safe (:func:`publish_engine`): an interrupted or killed compile leaves the complete
old pair or the complete new pair, never a mix. Beside `D/N` it writes, with `h` a hash of `N` and `t` a
random token, the staged engine `D/.trtforge-h.t.engine` and the staged manifest `D/.trtforge-h.t.json.part`,
each flocked by the publisher until it is done, then commits them onto `N` and `N.json` as one group with
:func:`~trtforge._fileio.commit_staged` (the group commit of `trtforge._fileio`, whose module doc tells the
commit record, the commit point and the recovery), together with the files the caller staged in an
:func:`~trtforge._fileio.atomic_outputs` block (compile's --save-onnx model and its data file).
Readers (:func:`read_manifest`, :func:`read_engine`, so `rt.load` and `trtforge inspect`) finish or undo an
interrupted commit onto the pair (:func:`~trtforge._fileio.settle_commit`: one stat a file when there is
none). :func:`resolve_pending` (run by a compile before it publishes, and by a reader only when the
manifest is missing or does not match the engine: it lists `D`) also deletes the staged files of a
publisher killed before its commit point, unless their flock says the publisher lives, and settles a
commit record `D/.trtforge-h.t.json` (the new manifest) that a publisher of trtforge before the group
commit left as it was: rolled forward when its engine (staged, or already at `N`) matches its sha256, else
deleted. (Until then such a record, committed but with no file renamed yet, reads as the old pair.)
SIGINT and SIGTERM are held back for the few milliseconds of the renames. Two compiles publishing to one
engine take turns from the commit point on (an exclusive :func:`~trtforge._fileio.directory_lock` on `D`),
and readers (:func:`read_engine`: rt.load, inspect, report, export-triton) hold it shared, so nobody sees
one run's engine beside another run's manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtforge._fileio import (
    DEAD_TEMP_AGE_S,
    as_path,
    atomic_write_text,
    check_input_file,
    commit_staged,
    dead_leftover,
    directory_lock,
    fsync_dir,
    json_text,
    os_error,
    settle_commit,
    sha256_bytes,
    sha256_file,
    show_path,
    signals_deferred,
    staged_directories,
    staged_files,
    temp_name,
    write_locked,
)
from trtforge.core.tensor_spec import TensorSpec
from trtforge.errors import UserError

MANIFEST_FORMAT = "trtforge.manifest/1"
MANIFEST_SUFFIX = ".json"


@dataclass
class ShapeRange:
    """min/opt/max shape of one input within one optimization profile."""

    min: list[int]
    opt: list[int]
    max: list[int]


@dataclass
class Manifest:
    """Everything recorded about one engine file. Fields map 1:1 to the JSON document."""

    engine_file: str
    engine_sha256: str
    engine_bytes: int
    backend: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    profiles: list[dict[str, ShapeRange]]
    source: dict[str, Any]
    trtforge_version: str
    build_options: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=lambda: {"mode": "fp32"})
    plugins: list[dict[str, Any]] = field(default_factory=list)
    streams: int = 1
    records: dict[str, Any] = field(default_factory=dict)
    # Decoder step engines only (compile --generate): model shape, cache layout, phases -> profiles.
    generation: dict[str, Any] | None = None
    format: str = MANIFEST_FORMAT

    def to_json(self) -> str:
        """Serialize to indented, strict JSON (inf/nan as null; old files holding NaN are still read)."""
        d = asdict(self)
        d["inputs"] = [t.to_dict() for t in self.inputs]  # the JSON form: name, dtype, shape (-1 dynamic)
        d["outputs"] = [t.to_dict() for t in self.outputs]
        return json_text(d) + "\n"  # strict JSON: a NaN timing or error figure is null

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "manifest") -> Manifest:
        """Parse a manifest dict, raising UserError naming the first missing or malformed field."""
        if not isinstance(d, dict):
            raise UserError(f"{where}: expected a JSON object, found a JSON {type(d).__name__}.")
        if d.get("format") != MANIFEST_FORMAT:
            raise UserError(f"{where}: format is {d.get('format')!r}, expected {MANIFEST_FORMAT!r}.")
        try:
            m = cls(
                engine_file=_typed(d["engine_file"], str, "engine_file"),
                engine_sha256=_typed(d["engine_sha256"], str, "engine_sha256"),
                engine_bytes=_typed(d["engine_bytes"], int, "engine_bytes"),
                backend=_typed(d["backend"], dict, "backend"),
                inputs=[
                    _tensor(t, f"inputs[{i}]") for i, t in enumerate(_typed(d["inputs"], list, "inputs"))
                ],
                outputs=[
                    _tensor(t, f"outputs[{i}]") for i, t in enumerate(_typed(d["outputs"], list, "outputs"))
                ],
                profiles=[
                    {k: _range(v, f"profiles[{i}].{k}") for k, v in _typed(p, dict, f"profiles[{i}]").items()}
                    for i, p in enumerate(_typed(d["profiles"], list, "profiles"))
                ],
                source=_typed(d["source"], dict, "source"),
                trtforge_version=_typed(d["trtforge_version"], str, "trtforge_version"),
                build_options=_typed(d.get("build_options", {}), dict, "build_options"),
                timings=_typed(d.get("timings", {}), dict, "timings"),
                precision=_typed(d.get("precision", {"mode": "fp32"}), dict, "precision"),
                plugins=_typed(d.get("plugins", []), list, "plugins"),
                streams=_typed(d.get("streams", 1), int, "streams"),
                records=_typed(d.get("records", {}), dict, "records"),
                generation=(
                    _typed(d["generation"], dict, "generation") if d.get("generation") is not None else None
                ),
            )
        except KeyError as e:
            raise UserError(f"{where}: malformed manifest: the field {e} is missing.") from e
        except ValueError as e:
            raise UserError(f"{where}: malformed manifest: {e}.") from e
        if len(m.engine_sha256) != 64 or m.engine_bytes < 0 or m.streams < 1:
            raise UserError(
                f"{where}: malformed manifest: engine_sha256 must be 64 hex digits, engine_bytes >= 0 and "
                "streams >= 1."
            )
        if not isinstance(m.backend.get("name", ""), str):
            raise UserError(f"{where}: malformed manifest: backend.name must be a string.")
        problem = _io_problem(m)
        if problem:
            raise UserError(f"{where}: malformed manifest: {problem}.")
        return m


def _io_problem(m: Manifest) -> str | None:
    """What makes the manifest's I/O and profiles disagree with each other (an engine never does): a hex
    digest that is not hex, no outputs, a tensor named twice, a profile for a tensor that is no input or of
    another rank or fixed size, or a dynamic input some profile leaves out."""
    try:
        bytes.fromhex(m.engine_sha256)
    except ValueError:
        return f"engine_sha256 {m.engine_sha256!r} is not hex digits"
    if not m.outputs:
        return "outputs is empty; an engine has at least one output"
    names = [t.name for t in m.inputs + m.outputs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"tensor name(s) {twice} appear more than once among inputs and outputs"
    inputs = {t.name: t for t in m.inputs}
    dynamic = [t.name for t in m.inputs if -1 in t.shape]
    if dynamic and not m.profiles:
        return f"input(s) {dynamic} have dynamic dimensions but profiles is empty"
    for i, profile in enumerate(m.profiles):
        for name, rng in profile.items():
            t = inputs.get(name)
            if t is None:
                return f"profiles[{i}] has a range for '{name}', which is not an input ({sorted(inputs)})"
            fixed = all(
                d == -1 or lo == opt == hi == d for d, lo, opt, hi in zip(t.shape, rng.min, rng.opt, rng.max)
            )
            if len(rng.min) != len(t.shape) or not fixed:
                return f"profiles[{i}].{name} {rng.min}..{rng.max} does not fit input '{name}' {t.shape}"
        missing = [n for n in dynamic if n not in profile]
        if missing:
            return f"profiles[{i}] has no range for dynamic input(s) {missing}"
    return None


def recorded_symbols(records: dict[str, Any], kind: str, where: str) -> dict[str, list[str | None]]:
    """Each tensor's axis names (its ONNX graph's dim_params, None where unnamed) as the build record gives
    them (records.build.inputs/outputs: a list of {name, symbols, ...}; absent in a step engine's record,
    empty in one built before they were recorded). A record of another shape is a malformed manifest,
    refused naming the field (it ended `inspect --json` in a traceback, exit 1)."""
    build = records.get("build")
    if build is None:
        return {}
    if not isinstance(build, dict):
        raise UserError(
            f"{where}: malformed manifest: records.build must be a JSON object, found {type(build).__name__}."
        )
    entries = build.get(kind)
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise UserError(
            f"{where}: malformed manifest: records.build.{kind} must be a JSON list, found "
            f"{type(entries).__name__}."
        )
    named: dict[str, list[str | None]] = {}
    for i, t in enumerate(entries):
        symbols = t.get("symbols") if isinstance(t, dict) else None
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("name"), str)
            or not isinstance(symbols or [], list)
            or not all(s is None or isinstance(s, str) for s in symbols or [])
        ):
            raise UserError(
                f"{where}: malformed manifest: records.build.{kind}[{i}] must be an object with a string "
                f"name and symbols a list of strings or nulls (one per axis), found {json.dumps(t)[:200]}."
            )
        named[t["name"]] = list(symbols or [])
    return named


def _typed(value: Any, kind: type, what: str) -> Any:
    """`value` if it is a `kind` (bool is not an int here), else ValueError naming the field."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{what} must be a JSON {kind.__name__}, found {type(value).__name__}")
    return value


def _dims(value: Any, what: str, lowest: int) -> list[int]:
    dims = _typed(value, list, what)
    for d in dims:
        _typed(d, int, f"{what} dims")
        if d < lowest:
            raise ValueError(f"{what} has dimension {d}; dimensions are >= {lowest}")
    return dims


def _tensor(t: Any, what: str) -> TensorSpec:
    from trtforge.core.backend import MANIFEST_DTYPES

    t = _typed(t, dict, what)
    dtype = _typed(t.get("dtype"), str, f"{what}.dtype")
    if dtype not in MANIFEST_DTYPES:
        raise ValueError(f"{what}.dtype is {dtype!r}; expected one of {sorted(MANIFEST_DTYPES)}")
    return TensorSpec(
        name=_typed(t.get("name"), str, f"{what}.name"),
        dtype=dtype,
        shape=_dims(t.get("shape"), f"{what}.shape", -1),
    )


def _range(r: Any, what: str) -> ShapeRange:
    r = _typed(r, dict, what)
    lo, opt, hi = (_dims(r.get(k), f"{what}.{k}", 0) for k in ("min", "opt", "max"))
    if not len(lo) == len(opt) == len(hi) or any(not a <= b <= c for a, b, c in zip(lo, opt, hi)):
        raise ValueError(f"{what} needs min <= opt <= max of equal rank, found {lo} / {opt} / {hi}")
    return ShapeRange(lo, opt, hi)


def manifest_path_for(engine_path: str | os.PathLike[str]) -> Path:
    """`model.engine` -> `model.engine.json`."""
    p = Path(engine_path)
    return p.with_name(p.name + MANIFEST_SUFFIX)


def write_manifest(manifest: Manifest, engine_path: str | os.PathLike[str]) -> Path:
    """Write the manifest beside the engine, atomically; returns its path (engines: publish_engine)."""
    path = manifest_path_for(engine_path)
    atomic_write_text(path, manifest.to_json())
    return path


def read_manifest(engine_path: str | os.PathLike[str]) -> Manifest:
    """Load the manifest that belongs to `engine_path` (UserError if absent or malformed).

    First settles what an interrupted compile left beside the engine (the module doc).
    """
    engine_path = as_path(engine_path, "the engine")  # (bytes too, as os paths may be)
    if not engine_path.name:
        raise UserError(f"'{show_path(engine_path)}' is not an engine file path.")
    if engine_path.is_dir():  # (it read "has no manifest 'DIR.json'")
        raise UserError(
            f"engine '{show_path(engine_path)}' is a directory; expected an engine file (MODEL.engine, with "
            "MODEL.engine.json beside it)."
        )
    settle_for_reading(engine_path)
    path = manifest_path_for(engine_path)
    if engine_path.name.endswith(".engine" + MANIFEST_SUFFIX) and not path.exists() and engine_path.is_file():
        engine = engine_path.with_suffix("")  # the manifest was given: it read "no manifest 'X.json.json'"
        raise UserError(
            f"'{show_path(engine_path)}' is an engine's manifest; give the engine '{show_path(engine)}' "
            "(its manifest is read beside it)."
        )
    if not path.is_file() and Path(engine_path).suffix.lower() in (".onnx", ".pt2"):
        raise UserError(
            f"'{show_path(engine_path)}' is a model, not an engine: build one first with "
            f"`trtforge compile {show_path(engine_path)} -o MODEL.engine` (engine and manifest together)."
        )
    if not path.is_file() and not os.path.lexists(engine_path):  # neither is there: a wrong path
        raise UserError(
            f"engine '{show_path(engine_path)}' does not exist (nor its manifest '{show_path(path)}')."
        )
    if path.is_dir():
        raise UserError(
            f"manifest '{show_path(path)}' of engine '{show_path(engine_path)}' is a directory; expected the "
            "JSON file trtforge writes beside every engine it builds. Rebuild with `trtforge compile`."
        )
    if not path.is_file():
        raise UserError(
            f"engine '{show_path(engine_path)}' has no manifest '{show_path(path)}'. trtforge writes one "
            "beside every engine it builds; rebuild with `trtforge compile`, or keep the .engine.json next "
            "to the .engine file."
        )
    return _parse_manifest_file(path)


def _parse_manifest_file(path: Path) -> Manifest:
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise os_error(e, path, "read") from e
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError (a binary file), nesting
        raise UserError(f"manifest '{show_path(path)}' is not valid JSON: {e}.") from e
    return Manifest.from_dict(data, where=f"manifest '{show_path(path)}'")


def verify_engine_file(engine_path: str | os.PathLike[str], manifest: Manifest) -> bytes:
    """Read the engine bytes and check size and sha256 against the manifest; returns the bytes."""
    p = Path(engine_path)
    if not p.is_file():
        if os.path.exists(p):  # a directory, a pipe (whose read waited forever) or a device: says which
            check_input_file(p, "engine file")
        raise UserError(
            f"engine file '{show_path(p)}' does not exist; only its manifest "
            f"'{show_path(manifest_path_for(p))}' is here. Keep the engine beside its manifest, or rebuild "
            "both with `trtforge compile`."
        )
    try:
        data = p.read_bytes()
    except OSError as e:
        raise os_error(e, p, "read") from e
    if len(data) != manifest.engine_bytes or sha256_bytes(data) != manifest.engine_sha256:
        raise UserError(
            f"engine '{show_path(p)}' does not match its manifest: {len(data)} bytes with sha256 "
            f"{sha256_bytes(data)[:16]}…, manifest says {manifest.engine_bytes} bytes, "
            f"{manifest.engine_sha256[:16]}…. The file was truncated or modified; rebuild it."
        )
    return data


def read_engine(
    engine_path: str | os.PathLike[str], manifest: Manifest | None = None
) -> tuple[Manifest, bytes]:
    """The manifest (`manifest`, or the one beside the engine) and the engine's bytes checked against it
    (:func:`verify_engine_file`), read under a shared :func:`~trtforge._fileio.directory_lock` on the
    engine's directory: a compile publishing over the pair meanwhile is seen wholly before or after its
    renames, never as its new engine beside the old manifest (a false "does not match" error)."""
    p = as_path(engine_path, "the engine")
    settle_for_reading(p)  # (what a dead compile left is settled, renaming, before the shared lock)
    try:
        with directory_lock([p.parent], shared=True):
            found = read_manifest(p) if manifest is None else manifest
            return found, verify_engine_file(p, found)
    except UserError:
        if not resolve_pending(p):  # (an engine beside its old manifest: a compile of before the group commit
            raise  # killed between its two renames, whose record names the new manifest)
    with directory_lock([p.parent], shared=True):
        found = read_manifest(p)
        return found, verify_engine_file(p, found)


def settle_for_reading(out: Path) -> None:
    """What a reader of engine `out` settles before it looks at the pair: an interrupted group commit onto
    the pair (one stat each when there is none), and, only when the manifest is missing, whatever else a
    dead publisher left (:func:`resolve_pending`, which lists the directory: a reader of an engine among
    thousands of files must not pay for that each time; a compile does, before it publishes)."""
    if not out.name:
        return
    settle_commit(out, manifest_path_for(out))
    if not manifest_path_for(out).is_file():
        resolve_pending(out)


# ------------------------------------------------------------------------- crash-safe publishing
_ENGINE, _RECORD, _PART = "engine", "json", "json.part"


def publish_engine(
    engine_path: str | os.PathLike[str], data: bytes, manifest: Manifest, *, replace: bool = True
) -> Path:
    """Write `data` to `engine_path` and `manifest` beside it as one (see the module doc); returns the
    manifest path. A failure before the commit point leaves the old pair and no staged file. Called in an
    :func:`~trtforge._fileio.atomic_outputs` block, the block's staged files land with the pair.
    `replace=False` (a compile without --force) refuses, at the commit point, an output that exists by
    then: another run wrote it since the compile's own check, and only --force overwrites."""
    out = Path(engine_path)
    token = secrets.token_hex(4)
    staged, part = (temp_name(out, f"{token}.{kind}") for kind in (_ENGINE, _PART))
    mpath = manifest_path_for(out)
    pair = [(staged, out), (part, mpath)]
    with contextlib.ExitStack() as held:
        try:
            write_locked(staged, data, held, out)
            write_locked(part, manifest.to_json().encode(), held, mpath)
            # another compile to the same engine commits and renames its pair before or after this one,
            # not between (taken before the commit point: an interrupt while waiting keeps the old pair)
            settle_commit(out, mpath)  # (a dead compile's, before the locks)
            held.enter_context(directory_lock([out.parent, *staged_directories()]))
            if not replace:
                _refuse_existing([out, mpath, *staged_files()])
            with signals_deferred():
                commit_staged(pair)  # with the caller's other outputs (--save-onnx): one commit
        except BaseException:
            for p, _ in pair:  # (emptied at the commit point: the commit record owns them from there)
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            raise
    return mpath


def _refuse_existing(paths: list[Path]) -> None:
    """UserError for the first of `paths` that exists: written by another run while this one worked."""
    for path in paths:
        if os.path.lexists(path):
            raise UserError(
                f"output '{show_path(path)}' was written by another run while this compile ran (it did not "
                "exist when the compile started); it is left as that run wrote it. Pass --force "
                "(force=True) to overwrite it."
            )


def resolve_pending(engine_path: str | os.PathLike[str]) -> bool:
    """Settle the staged files of dead publishers of `engine_path`: finish a committed publish whose
    engine matches its record, delete everything else (see the module doc). Live publishers are left be
    (where flock fails, as on some NFS mounts, none can be told from a dead one: all are left), and so are
    files younger than DEAD_TEMP_AGE_S, as by every sweep of dead writers' files
    (:func:`~trtforge._fileio.dead_leftover`): a publisher creates its staged engine, then flocks it, and
    a reader between the two deleted it (the publish then failed on the missing file after its commit
    point, and the next reader rolled its manifest forward beside the old engine).
    True when it settled a dead publisher's staged files (it lists the directory to find them)."""
    out = Path(engine_path)
    if not out.name:  # '', '.', '/': no file is published there (it was temp_name's ValueError)
        return False
    settle_commit(out, manifest_path_for(out))
    parent = out.parent if str(out.parent) else Path(".")
    prefix = temp_name(out, "").name
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return False
    tokens = {n[len(prefix) :].split(".", 1)[0] for n in names}
    settled = False
    for token in sorted(tokens):
        files = {kind: temp_name(out, f"{token}.{kind}") for kind in (_ENGINE, _RECORD, _PART)}
        present = [p for p in files.values() if os.path.lexists(p)]
        try:
            with contextlib.ExitStack() as held:
                if not present or not all(
                    held.enter_context(dead_leftover(p, DEAD_TEMP_AGE_S)) for p in present
                ):
                    continue  # none, a live compile's, or too young to tell (its flock may be coming)
                with directory_lock([parent]):  # (not between a live compile's two renames)
                    _settle(out, files[_ENGINE], files[_RECORD], files[_PART])
                    settled = True
        except OSError as e:
            raise UserError(
                f"an interrupted compile left staged files beside '{show_path(out)}' that could not be "
                f"settled ({e.strerror or e}); make the directory writable and retry, or delete "
                f"'{show_path(parent)}/{prefix}*' and rebuild."
            ) from e
    if tokens:
        fsync_dir(parent)
    return settled


def _settle(out: Path, staged: Path, record: Path, part: Path) -> None:
    """Roll a dead publisher's committed record forward, or drop its files."""
    if record.is_file():
        try:
            manifest: Manifest | None = _parse_manifest_file(record)
        except UserError:
            manifest = None
        if manifest is not None and staged.is_file() and sha256_file(staged) == manifest.engine_sha256:
            os.replace(staged, out)
            os.replace(record, manifest_path_for(out))
        elif manifest is not None and out.is_file() and sha256_file(out) == manifest.engine_sha256:
            os.replace(record, manifest_path_for(out))
    for p in (staged, record, part):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


__all__ = [
    "MANIFEST_FORMAT",
    "Manifest",
    "ShapeRange",
    "TensorSpec",
    "manifest_path_for",
    "publish_engine",
    "read_engine",
    "read_manifest",
    "resolve_pending",
    "settle_for_reading",
    "sha256_file",
    "verify_engine_file",
    "write_manifest",
]
