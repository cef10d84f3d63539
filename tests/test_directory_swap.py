"""How a staged directory takes its path's place (`_fileio.staged_directory`, through `_take_place`): `report
-o DIR`, `export-triton` and every other output that is a whole directory.

Replacing DIR by renames takes two (the old one aside, the new one in): a reader between them, and everyone
after a SIGKILL there until the next run's repair, found DIR missing. Where the filesystem has renameat2's
RENAME_EXCHANGE the two directories now trade places in one atomic step, so DIR is the old complete
directory or the new complete one at every moment, kill or not; elsewhere the two renames and their repair
stay (forced here by an exchange that fails with EINVAL, as on some overlay and NFS mounts)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trtforge import _fileio
from trtforge._fileio import recover_staged_directory, staged_directory, sweep_staged_directories, temp_name

ROOT = Path(__file__).resolve().parents[1]
FILES = ("report.html", "report.json", "report.md")


def two_renames_only(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, Path]]:
    """Make every exchange fail as a filesystem without it does (EINVAL), so staged_directory falls back to
    its two renames; returns the exchanges asked for."""
    asked: list[tuple[Path, Path]] = []

    def no_exchange(a: Path, b: Path) -> None:
        asked.append((Path(a), Path(b)))
        raise OSError(errno.EINVAL, "Invalid argument", str(a))

    monkeypatch.setattr(_fileio, "_rename_exchange", no_exchange)
    return asked


def require_exchange(directory: Path) -> None:
    """Skip, with the reason, where `directory`'s filesystem (or this kernel or C library) cannot exchange."""
    a, b = directory / ".probe-a", directory / ".probe-b"
    a.mkdir()
    b.mkdir()
    try:
        _fileio._rename_exchange(a, b)
    except OSError as e:
        pytest.skip(f"renameat2 RENAME_EXCHANGE is not available on {directory}: {e}")
    finally:
        a.rmdir()
        b.rmdir()


@pytest.fixture
def exchange(tmp_path: Path) -> None:
    """require_exchange on tmp_path."""
    require_exchange(tmp_path)


def _write(path: Path, version: str) -> None:
    with staged_directory(path) as d:
        for name in FILES:
            _fileio.write_synced(d / name, f"{version} {name}".encode())


def _version(path: Path) -> str:
    """'old' or 'new' when `path` is a complete directory of that version (each of FILES, all of one
    version), else what it is."""
    if not path.is_dir():
        return "missing"
    names = sorted(os.listdir(path))
    texts = {(path / n).read_text() for n in names}
    versions = {t.split()[0] for t in texts}
    version = next(iter(versions), "")
    if names != sorted(FILES) or len(versions) != 1 or texts != {f"{version} {n}" for n in FILES}:
        return f"incomplete or mixed: {names} {sorted(texts)}"
    return version


# A child that replaces `path` (holding the old report) by a new one through staged_directory and SIGKILLs
# itself right after its `step`-th change to the filesystem inside the swap (an exchange, a rename, the
# unlink of a file or the rmdir of a directory while the old one is removed); with "renames" the exchange
# fails as where the filesystem has none.
_KILLED_AT_A_STEP = """
import errno, os, signal, sys
from pathlib import Path
import trtforge._fileio as fileio
path, step, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
FILES = ("report.html", "report.json", "report.md")
if mode == "renames":
    def no_exchange(a, b):
        raise OSError(errno.EINVAL, "Invalid argument", str(a))
    fileio._rename_exchange = no_exchange
done = 0
def counted(real):
    def call(*args, **kwargs):
        global done
        result = real(*args, **kwargs)
        done += 1
        if done == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return call
with fileio.staged_directory(path) as d:
    for name in FILES:
        fileio.write_synced(d / name, f"new {name}".encode())
    for name in ("rename", "unlink", "rmdir"):
        setattr(os, name, counted(getattr(os, name)))
    if hasattr(fileio, "_rename_exchange"):
        fileio._rename_exchange = counted(fileio._rename_exchange)
"""


def _killed_at(path: Path, step: int, mode: str) -> int:
    """Run _KILLED_AT_A_STEP; its exit status (-9: killed at `step`; 0: it has fewer steps)."""
    path_dirs = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path_dirs)
    argv = [sys.executable, "-c", _KILLED_AT_A_STEP, str(path), str(step), mode]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, -9), proc.stderr
    return proc.returncode


def _kill_at_every_step(tmp_path: Path, mode: str, sweep: str) -> list[tuple[str, str]]:
    """Replace tmp_path/rep (the old report) in a child killed after each step of its swap in turn, until
    one runs to its end; after each kill, the version found at rep and then after the repair (`sweep`:
    the next writer's recover_staged_directory, or sweep_staged_directories of the parent), which must
    leave nothing beside rep."""
    path = tmp_path / "rep"
    _write(path, "old")
    found: list[tuple[str, str]] = []
    for step in range(1, 50):
        if _killed_at(path, step, mode) == 0:
            assert _version(path) == "new"
            return found
        seen = _version(path)
        if sweep == "recover":
            recover_staged_directory(path)
        else:
            sweep_staged_directories(tmp_path)
        found.append((seen, _version(path)))
        assert sorted(os.listdir(tmp_path)) == ["rep"], (step, found)
        _write(path, "old")  # (each kill point starts from the old report)
    raise AssertionError(f"the swap never ran to its end: {found}")


@pytest.mark.parametrize("sweep", ["recover", "sweep"])
def test_a_directory_replaced_by_exchange_is_whole_at_every_kill_point(tmp_path, exchange, sweep) -> None:
    """Before: a SIGKILL after the old report was renamed aside and before the new one was renamed in left
    DIR missing (the old one hidden beside it) until the next run put it back. Now the two trade places
    in one exchange: killed after it, or at any point while the swapped-out old one is removed, DIR is
    the new report, whole, and what is left of the old one (under the new one's staged name, held by no
    live process) the next writer's recovery, or the sweep of the parent, removes."""
    found = _kill_at_every_step(tmp_path, "exchange", sweep)
    assert found == [("new", "new")] * len(found), found
    assert len(found) >= 1 + len(FILES), "the exchange and each unlink of the old report were kill points"


def test_without_the_exchange_the_two_renames_and_their_repair_still_hold(tmp_path) -> None:
    """Where the filesystem cannot exchange (renameat2 fails with EINVAL or ENOSYS: some overlay and NFS
    mounts, older kernels), the swap falls back to its two renames: killed between them DIR is missing,
    the old report aside, and the next writer's recovery puts it back; killed later, DIR is the new one;
    nothing is left beside it after the repair."""
    found = _kill_at_every_step(tmp_path, "renames", "recover")
    assert found[0] == ("missing", "old"), found
    assert found[1:] == [("new", "new")] * (len(found) - 1) and len(found) >= 2, found


def test_the_exchange_is_chosen_at_each_call(tmp_path, monkeypatch, exchange) -> None:
    """One process may write to filesystems with and without the exchange: a failed exchange (EINVAL)
    falls back to the two renames for that call only, and the next call asks again."""
    path = tmp_path / "rep"
    _write(path, "old")
    asked = two_renames_only(monkeypatch)
    renames: list[Path] = []
    real = os.rename

    def rename(src, dst):
        renames.append(Path(dst))
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    _write(path, "new")
    assert _version(path) == "new" and len(asked) == 1 and temp_name(path, "old") in renames
    monkeypatch.undo()  # (the exchange works again)
    monkeypatch.setattr(os, "rename", rename)
    renames.clear()
    _write(path, "old")
    assert _version(path) == "old" and renames == [] and sorted(os.listdir(tmp_path)) == ["rep"]


@pytest.mark.parametrize("old_kind", ["file", "link"])
def test_an_exchanged_out_file_or_link_killed_before_its_removal_is_swept(
    tmp_path, exchange, old_kind
) -> None:
    """A staged directory replacing a file or a link (export-triton --force over a file at the model's
    path) exchanges with it too; killed before its removal, the file or link sits under the new
    directory's staged name, where the sweeps, which removed only directories there, now remove it."""
    path = tmp_path / "rep"
    if old_kind == "file":
        path.write_text("old")
    else:
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    left = temp_name(path, "new.1.2")
    left.mkdir()
    (left / "report.json").write_text("new")
    _fileio._rename_exchange(left, path)  # (what a writer killed right after its exchange left)
    recover_staged_directory(path)
    assert (path / "report.json").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == sorted(["rep", *(["elsewhere"] if old_kind == "link" else [])])


def _snapshot(path: Path) -> tuple[bool, list[str], set[str]]:
    """Read the directory at `path` through one descriptor: whether it is still the one at `path` after
    the read (one replaced meanwhile is being removed: its reads may miss files), its names, its texts.
    FileNotFoundError when `path` is missing."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = sorted(os.listdir(fd))
        texts = set()
        for name in names:
            try:
                f = os.open(name, os.O_RDONLY, dir_fd=fd)
            except FileNotFoundError:
                continue
            try:
                texts.add(os.read(f, 1 << 16).decode())
            finally:
                os.close(f)
        current = os.fstat(fd).st_ino == os.stat(path).st_ino  # (held open: its number is not reused)
    finally:
        os.close(fd)
    return current, names, texts


@pytest.mark.parametrize("swap", ["exchange", "renames"])
def test_a_reader_never_sees_the_directory_missing_or_mixed(tmp_path, monkeypatch, request, swap) -> None:
    """A thread reads DIR in a loop (through one descriptor: its listing and every file) while it is
    replaced 50 times, each filesystem step of a swap followed by a millisecond's pause (a slow disk). With
    the exchange it finds DIR at every look, all of one version. With the two renames (a filesystem
    without the exchange) it finds DIR missing between them, as it did before the exchange."""
    if swap == "exchange":
        request.getfixturevalue("exchange")
    else:
        two_renames_only(monkeypatch)
    path = tmp_path / "rep"
    _write(path, "v0")

    def paused(real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            time.sleep(0.001)
            return result

        return call

    monkeypatch.setattr(os, "rename", paused(os.rename))
    monkeypatch.setattr(_fileio, "_rename_exchange", paused(_fileio._rename_exchange))
    stop, missing, wrong, whole = threading.Event(), [], [], [0]

    def reader() -> None:
        while not stop.is_set():
            try:
                current, names, texts = _snapshot(path)
            except FileNotFoundError:
                missing.append(time.monotonic())
                continue
            if not current:
                continue
            versions = {t.split()[0] for t in texts}
            if names != sorted(FILES) or len(versions) != 1 or len(texts) != len(FILES):
                wrong.append((names, sorted(texts)))
            else:
                whole[0] += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        for k in range(1, 51):
            _write(path, f"v{k}")
    finally:
        stop.set()
        t.join(30)
    assert _version(path) == "v50" and wrong == []
    if swap == "exchange":
        assert missing == [] and whole[0] > 50
    else:
        assert missing, "the reader found DIR missing between the two renames"


def test_a_directory_made_after_the_no_replace_check_is_not_replaced(tmp_path, monkeypatch) -> None:
    """staged_directory(path, replace=False) checked that `path` was missing, then os.rename'd the new
    directory there: an empty directory another process (one that takes no lock of ours) made between the
    two was replaced, since a rename over an empty directory succeeds. Forced here by a check that answers
    as it would have a moment before the other process made it. RENAME_NOREPLACE refuses it in the rename
    itself: FileExistsError, the other process's directory left as it made it, the new one removed."""
    a, b = tmp_path / ".probe-a", tmp_path / ".probe-b"
    a.mkdir()
    try:
        _fileio._renameat2_flagged(a, b, _fileio._RENAME_NOREPLACE)
    except OSError as e:
        pytest.skip(f"renameat2 RENAME_NOREPLACE is not available on {tmp_path}: {e}")
    finally:
        (b if b.exists() else a).rmdir()
    path = tmp_path / "model"
    path.mkdir()  # (the other process's, made "after the check")
    made = path.stat().st_ino
    lexists = os.path.lexists
    monkeypatch.setattr(os.path, "lexists", lambda p: False if Path(p) == path else lexists(p))
    with pytest.raises(FileExistsError), staged_directory(path, replace=False) as d:
        (d / "model.plan").write_bytes(b"new")
    assert path.stat().st_ino == made and os.listdir(path) == []
    assert os.listdir(tmp_path) == ["model"]


def test_without_renameat2_no_replace_still_refuses_an_existing_directory(tmp_path, monkeypatch) -> None:
    """Where the C library has no renameat2 the check and the plain rename stay: an existing `path` is
    refused, a missing one written."""
    monkeypatch.setattr(_fileio, "_renameat2", lambda: None)
    path = tmp_path / "model"
    with staged_directory(path, replace=False) as d:
        (d / "model.plan").write_bytes(b"first")
    with pytest.raises(FileExistsError), staged_directory(path, replace=False) as d:
        (d / "model.plan").write_bytes(b"second")
    assert (path / "model.plan").read_bytes() == b"first" and os.listdir(tmp_path) == ["model"]
