"""Crash-safe publishing of engine + manifest: every state a killed publisher can leave is settled into
a complete pair (old or new) by the reader that rt.load, inspect and compile use; malformed manifests
are UserErrors."""

from __future__ import annotations

import errno
import json
import os
import time

import pytest

from trtforge._fileio import DEAD_TEMP_AGE_S, sha256_bytes, temp_name
from trtforge.core import manifest as manifest_mod
from trtforge.core.manifest import (
    manifest_path_for,
    publish_engine,
    read_engine,
    read_manifest,
    resolve_pending,
)
from trtforge.errors import UserError
from trtforge.runtime import load
from trtforge.runtime.standin import standin_manifest

OLD, NEW = b"old engine bytes" * 8, b"new engine bytes, longer" * 9


def _manifest(path, data):
    m = standin_manifest(streams=1)
    m.engine_file, m.engine_bytes, m.engine_sha256 = path.name, len(data), sha256_bytes(data)
    return m


def _old_pair(tmp_path):
    out = tmp_path / "m.engine"
    publish_engine(out, OLD, _manifest(out, OLD))
    return out


def _loaded(out) -> bytes:
    """The engine's bytes as rt.load, inspect and export-triton read them (read_engine)."""
    return read_engine(out)[1]


def _names(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


def test_publish_writes_pair_and_nothing_else(tmp_path) -> None:
    out = _old_pair(tmp_path)
    assert _names(tmp_path) == ["m.engine", "m.engine.json"]
    assert _loaded(out) == OLD
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def _stage(out, data, token="deadbeef", *, record=True, engine_at_out=False, part=False):
    """Recreate by hand what a publisher killed at some step leaves behind, older than the age guard."""
    staged, rec, prt = (temp_name(out, f"{token}.{k}") for k in ("engine", "json", "json.part"))
    text = _manifest(out, data).to_json()
    if engine_at_out:
        out.write_bytes(data)
    else:
        staged.write_bytes(data)
    if record:
        rec.write_text(text)
    if part:
        prt.write_text(text[: len(text) // 2])
    aged = time.time() - 2 * DEAD_TEMP_AGE_S  # (killed a while ago: younger ones may be a live publisher's)
    for p in (staged, rec, prt):
        if p.exists():
            os.utime(p, (aged, aged))
    return staged, rec


@pytest.mark.parametrize(
    ("state", "read", "settled"),
    [
        ({"record": False}, OLD, OLD),  # killed while writing the staged engine: before the commit point
        ({"record": False, "part": True}, OLD, OLD),  # killed while writing the record
        # committed, no rename done: the complete old pair, rolled forward by the next compile's settling
        ({}, OLD, NEW),
        # engine renamed, manifest not yet: the reader finds the mismatch, and rolls forward
        ({"engine_at_out": True}, NEW, NEW),
    ],
)
def test_every_interrupted_state_resolves_to_a_complete_pair(tmp_path, state, read, settled) -> None:
    """What a publisher of trtforge before the group commit, killed, left (its own record). A reader reads
    a complete pair without listing the directory; the next compile (resolve_pending) settles the rest."""
    out = _old_pair(tmp_path)
    _stage(out, NEW, **state)
    assert _loaded(out) == read
    resolve_pending(out)
    assert _loaded(out) == settled
    assert _names(tmp_path) == ["m.engine", "m.engine.json"]


def test_interrupted_first_publish_leaves_nothing_or_the_new_pair(tmp_path) -> None:
    out = tmp_path / "m.engine"
    _stage(out, NEW, record=False)
    resolve_pending(out)
    assert _names(tmp_path) == []
    _stage(out, NEW)
    assert _loaded(out) == NEW


def test_record_whose_engine_is_gone_is_dropped(tmp_path) -> None:
    out = _old_pair(tmp_path)
    staged, _ = _stage(out, NEW)
    staged.unlink()  # neither a staged engine nor the engine at `out` matches the record
    assert _loaded(out) == OLD
    resolve_pending(out)
    assert _names(tmp_path) == ["m.engine", "m.engine.json"]


def test_live_publisher_is_left_alone(tmp_path) -> None:
    import fcntl

    out = _old_pair(tmp_path)
    staged, rec = _stage(out, NEW)
    fd = os.open(rec, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: looks like a live publisher
    try:
        resolve_pending(out)
        assert staged.exists() and rec.exists()
    finally:
        os.close(fd)
    resolve_pending(out)
    assert _loaded(out) == NEW and _names(tmp_path) == ["m.engine", "m.engine.json"]


def test_a_live_publisher_is_left_alone_where_flock_fails(tmp_path, monkeypatch) -> None:
    """On a filesystem whose flock fails (ENOLCK, some NFS mounts) a live publisher's staged engine holds
    no lock. Before, resolve_pending (run by every compile before it publishes) took the descriptor its
    lock probe returned, holding nothing, for a dead publisher's and deleted the files another compile to
    the same engine was still writing (its commit then failed on a missing file). Now a lock it could not
    take is no dead publisher's, as for every sweep of dead writers' files."""
    import fcntl

    def flock(_fd, _op):
        raise OSError(errno.ENOLCK, "No locks available")

    out = _old_pair(tmp_path)
    staged, _ = _stage(out, NEW, record=False)
    monkeypatch.setattr(fcntl, "flock", flock)
    assert not resolve_pending(out)
    assert staged.read_bytes() == NEW and _loaded(out) == OLD


def test_a_staged_engine_not_yet_flocked_is_not_taken_for_a_dead_publishers(tmp_path, monkeypatch) -> None:
    """A publisher creates its staged engine, then flocks it. Before, a reader's (or another compile's)
    resolve_pending between the two found it unlocked and deleted it: the publish failed after its commit
    point (FileNotFoundError renaming it), and the next reader rolled the new manifest forward beside the
    old engine ("does not match its manifest"). Forced here by running resolve_pending just before that
    flock. Now a staged file younger than the age guard is no dead publisher's, as for every sweep."""
    import fcntl

    out = _old_pair(tmp_path)
    flock, seen = fcntl.flock, []

    def reader_first(fd: int, op: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        staged = name.startswith(temp_name(out, "").name) and name.endswith(".engine")
        if staged and op == fcntl.LOCK_EX and not seen:
            seen.append(resolve_pending(out))
        flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", reader_first)
    publish_engine(out, NEW, _manifest(out, NEW))
    monkeypatch.undo()
    assert seen == [False]
    assert _loaded(out) == NEW and _names(tmp_path) == ["m.engine", "m.engine.json"]


def test_failure_before_commit_keeps_old_pair(tmp_path, monkeypatch) -> None:
    out = _old_pair(tmp_path)

    def full_disk(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(manifest_mod.os, "write", full_disk)
        with pytest.raises(UserError, match=r"cannot write '.*m\.engine': No space"):
            publish_engine(out, NEW, _manifest(out, NEW))
    assert _names(tmp_path) == ["m.engine", "m.engine.json"]
    assert _loaded(out) == OLD


def test_long_name_fits_because_staged_names_are_short(tmp_path) -> None:
    out = tmp_path / ("a" * 243 + ".engine")[-243:]
    assert len(manifest_path_for(out).name) == 248
    publish_engine(out, NEW, _manifest(out, NEW))
    assert _loaded(out) == NEW


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"\xff\xfe\x00\x01binary", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object, found a JSON list"),
        (b'"text"', "expected a JSON object"),
        (b"{}", "format is None"),
    ],
)
def test_unreadable_manifest_is_user_error(tmp_path, content, match) -> None:
    out = _old_pair(tmp_path)
    manifest_path_for(out).write_bytes(content)
    with pytest.raises(UserError, match=match):
        read_manifest(out)
    with pytest.raises(UserError, match=match):
        load(out)


def _edit(out, fn) -> None:
    path = manifest_path_for(out)
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.pop("engine_sha256"), "engine_sha256' is missing"),
        (lambda d: d.update(engine_bytes="12"), "engine_bytes must be a JSON int"),
        (lambda d: d.update(inputs={"x": 1}), "inputs must be a JSON list"),
        (lambda d: d.update(inputs=[{"name": "x", "dtype": "float32", "shape": [1, "a"]}]), "dims"),
        (lambda d: d.update(backend=None), "backend must be a JSON dict"),
        (lambda d: d.update(streams=0), "streams >= 1"),
        (lambda d: d.update(engine_sha256="abc"), "64 hex digits"),
        (
            lambda d: d["profiles"][0]["x"].update(min=[9, 4], max=[2, 4]),
            r"min <= opt <= max",
        ),
        (lambda d: d["profiles"][0]["x"].update(min=[1]), r"min <= opt <= max of equal rank"),
        (lambda d: d["profiles"].append(3), r"profiles\[1\] must be a JSON dict"),
        # fields each well-formed but disagreeing with one another (no engine is like that)
        (lambda d: d.update(engine_sha256="z" * 64), r"engine_sha256 'z+' is not hex digits"),
        (lambda d: d.update(outputs=[]), r"outputs is empty"),
        (
            lambda d: d["outputs"].append(dict(d["inputs"][0])),
            r"tensor name\(s\) \['x'\] appear more than once",
        ),
        (lambda d: d.update(inputs=[]), r"profiles\[0\] has a range for 'x', which is not an input \(\[\]\)"),
        (
            lambda d: d.update(profiles=[]),
            r"input\(s\) \['x'\] have dynamic dimensions but profiles is empty",
        ),
        (lambda d: d["profiles"].append({}), r"profiles\[1\] has no range for dynamic input\(s\) \['x'\]"),
        (
            lambda d: d["profiles"][0]["x"].update(min=[1, 5], opt=[2, 5], max=[4, 5]),
            r"profiles\[0\]\.x \[1, 5\]\.\.\[4, 5\] does not fit input 'x' \[-1, 64\]",
        ),
        (
            lambda d: d["profiles"][0]["x"].update(min=[1, 4, 1], opt=[2, 4, 1], max=[4, 4, 1]),
            r"does not fit input 'x'",
        ),
    ],
)
def test_malformed_manifest_fields(tmp_path, edit, match) -> None:
    out = _old_pair(tmp_path)
    _edit(out, edit)
    with pytest.raises(UserError, match=match):
        load(out)


def test_outputs_staged_beside_a_publish_land_with_the_pair_or_not_at_all(tmp_path, monkeypatch) -> None:
    """compile --save-onnx: the saved model is staged in an atomic_outputs block and renamed in the
    publisher's last, uninterruptible step; an interrupt before the commit point keeps the old set."""
    from trtforge._fileio import atomic_outputs, atomic_write_text

    out = _old_pair(tmp_path)
    extra = tmp_path / "model.onnx"
    extra.write_text("old model")
    real = manifest_mod.write_locked

    def interrupted_at_the_manifest(path, data, held, target):
        if target == manifest_path_for(out):
            raise KeyboardInterrupt  # Ctrl-C (the CLI turns SIGTERM into the same) while publishing
        return real(path, data, held, target)

    def compile_publishing() -> None:
        with atomic_outputs():
            atomic_write_text(extra, "new model")
            publish_engine(out, NEW, _manifest(out, NEW))

    monkeypatch.setattr(manifest_mod, "write_locked", interrupted_at_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        compile_publishing()
    assert (_loaded(out), extra.read_text()) == (OLD, "old model")
    assert _names(tmp_path) == ["m.engine", "m.engine.json", "model.onnx"]
    monkeypatch.setattr(manifest_mod, "write_locked", real)
    with atomic_outputs():
        atomic_write_text(extra, "new model")
        publish_engine(out, NEW, _manifest(out, NEW))
        assert extra.read_text() == "new model"  # renamed with the pair, not at the end of the block
    assert (_loaded(out), extra.read_text()) == (NEW, "new model")
    assert _names(tmp_path) == ["m.engine", "m.engine.json", "model.onnx"]


def test_a_publish_stopped_after_its_commit_point_is_finished_by_the_next_reader(tmp_path, monkeypatch):
    """compile --save-onnx: the saved model, the engine and the manifest are one group commit. Stopped
    (as by a SIGKILL) right after the model's rename, the next read of the engine finishes the rest;
    before, the --save-onnx model was renamed outside the engine's commit record."""
    from trtforge._fileio import atomic_outputs, atomic_write_text

    out = _old_pair(tmp_path)
    extra = tmp_path / "model.onnx"
    extra.write_text("old model")
    real = os.replace

    class Killed(BaseException):
        pass

    def replace(src, dst):
        real(src, dst)
        if dst == extra:
            raise Killed

    def compile_publishing() -> None:
        with atomic_outputs():
            atomic_write_text(extra, "new model")
            publish_engine(out, NEW, _manifest(out, NEW))

    monkeypatch.setattr(manifest_mod.os, "replace", replace)
    with pytest.raises(Killed):
        compile_publishing()
    monkeypatch.undo()
    assert _loaded(out) == NEW and extra.read_text() == "new model"
    assert _names(tmp_path) == ["m.engine", "m.engine.json", "model.onnx"]


def test_reading_an_engine_does_not_list_its_directory(tmp_path, monkeypatch) -> None:
    """Before: every read_engine (rt.load, inspect, report, export-triton) listed the engine's directory
    twice (resolve_pending, from read_engine and again from read_manifest), looking for a dead publisher's
    staged files: 0.2 s in a directory of 100,000 files, each time. Now a reader settles the group commit
    by one stat a file, and lists the directory only when the pair is not complete."""
    out = _old_pair(tmp_path)

    def no_listing(*_a, **_k):
        raise AssertionError("the directory was listed")

    monkeypatch.setattr(os, "listdir", no_listing)
    monkeypatch.setattr(os, "scandir", no_listing)
    assert _loaded(out) == OLD and read_manifest(out).engine_sha256 == sha256_bytes(OLD)


def test_inspect_finds_an_engine_whose_first_publish_stopped_after_its_commit_point(
    tmp_path, monkeypatch, capsys
) -> None:
    """A first compile to m.engine killed after its commit point, before either rename: neither file is
    in place, the commit record says both are. Before: `trtforge inspect m.engine` said it does not exist
    (it looked before anything settled the commit; rt.load found it). Now inspect settles first."""
    from trtforge.cli.main import main

    out = tmp_path / "m.engine"
    real = os.replace

    class Killed(BaseException):
        pass

    def replace(src, dst):
        if dst == out:
            raise Killed
        real(src, dst)

    monkeypatch.setattr(manifest_mod.os, "replace", replace)
    with pytest.raises(Killed):
        publish_engine(out, NEW, _manifest(out, NEW))
    monkeypatch.undo()
    assert not out.exists()
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["engine_sha256"] == sha256_bytes(NEW)
    assert _names(tmp_path) == ["m.engine", "m.engine.json"]
