"""File I/O in one place: path checks that name the path, and atomic writes (temp beside, then rename).

A crash or an exception never leaves a partial output file behind; a full disk, an over-long name or a
read-only directory is the user's to fix (UserError naming the path), not an internal error.

Groups of files (a model and its external data, a model and its calibration cache, an engine and its
manifest with compile's --save-onnx) are committed as one, crash-safe even against SIGKILL
(:func:`atomic_outputs`, :func:`commit_staged`). Each file is written complete under a temp name first.
Then, holding the :func:`directory_lock` of every destination directory and SIGINT/SIGTERM back, the commit
writes a record (JSON: a token, the primary record's path, and each staged file with its destination, as
paths relative to the record's directory) beside each destination `D/N` as `D/.trtforge-h.commit` (`h` a
hash of `N`, :func:`temp_name`), each written as `.commit.part` (flocked) and renamed so it appears whole:
the secondary records first, then the first destination's (the primary). The primary's appearance is the
commit point. It then renames the staged files onto their destinations and removes the records, secondaries
first. Whoever next touches a destination (:func:`check_input_file`, so every model reader,
:func:`check_output_path`, so every writer, the calibration cache reader and the engine readers, by
:func:`settle_commit`: one stat when there is no record) finds an interrupted commit by its record and
settles it under the same locks: with the primary record there (same token) it renames the staged files
still there (roll forward), without it it deletes them (roll back); then it removes the records. So a group
reads as the old one or the new one, never a mix. A record is data on disk (one may come from an unpacked
archive): a damaged one, or one naming what no commit of its destinations could (a staged file that is no
trtforge staged name beside its destination, an absolute path, a roll forward onto a destination without
that commit's record beside it, a staged file that is no regular file), is a UserError naming it, nothing
renamed or deleted; a staged file a live process holds is never touched, and a roll-back a read-only
directory forbids is left undone (the old group stands whole). What a kill before the commit point leaves
(staged files no record names, each flocked while its writer lives) is hidden, never read as an output, and
swept (:func:`dead_leftover`) by the next commit onto that output, the next read of it as a model or cache
(:func:`check_input_file`'s `sweep`), or the roll-back of its group.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from trtforge.errors import UserError

try:
    import fcntl
except ImportError:  # (not POSIX: nothing is locked)
    fcntl = None  # type: ignore[assignment]

# OSError numbers that describe the user's filesystem, not a trtforge bug (exit code 2).
USER_ERRNOS = frozenset(
    getattr(errno, n)
    for n in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENAMETOOLONG", "EFBIG", "ENOTDIR", "EISDIR")
    if hasattr(errno, n)
)


def show_path(path: str | os.PathLike[str]) -> str:
    """A path as text safe to print: undecodable bytes of a non-UTF-8 name shown as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def os_error(e: OSError, path: str | os.PathLike[str], action: str = "write") -> UserError:
    """A UserError for an OSError the user can fix (disk full, name too long, permissions), naming `path`."""
    hint = {
        errno.ENOSPC: " Free some space or write elsewhere.",
        errno.ENAMETOOLONG: " Use a shorter file name.",
    }.get(e.errno or 0, "")
    return UserError(f"cannot {action} '{show_path(path)}': {e.strerror or e}.{hint}")


def _name_max(directory: Path) -> int:
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def check_name_length(path: Path, what: str = "output") -> None:
    """UserError when the last component of `path` is longer than its filesystem allows."""
    parent = path.parent if str(path.parent) else Path(".")
    limit = _name_max(parent) if parent.is_dir() else 255
    n = len(os.fsencode(path.name))
    if n > limit:
        raise UserError(
            f"{what} '{show_path(path)}': the file name is {n} bytes long; this filesystem allows {limit}. "
            "Use a shorter name."
        )


def as_path(value: object, what: str) -> Path:
    """`value` as a Path when it is one (str or os.PathLike), else a UserError naming `what` (an API caller
    passing None or a number would otherwise get os.fspath's TypeError)."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, (str, os.PathLike)):
        raise UserError(f"{what} must be a path (str or os.PathLike), got {type(value).__name__} {value!r}.")
    return Path(value)


def as_input_path(value: object, what: str) -> Path:
    """`as_path` for a file trtforge reads (a model, data, an engine): its name must also be UTF-8."""
    p = as_path(value, what)
    check_utf8_path(p, what)
    return p


def check_utf8_path(value: str | os.PathLike[str], what: str) -> None:
    """UserError when the path of a file to read holds bytes that are not UTF-8 (a shell's `$'\\xff'`,
    decoded by Python as surrogates): ONNX's checker and loaders take UTF-8 names only and fail deep inside.
    Output names may be any bytes (they are written through os calls and shown escaped)."""
    text = os.fspath(value)
    if isinstance(text, str) and not _encodes(text):
        raise UserError(
            f"{what} '{show_path(text)}' holds bytes that are not valid UTF-8; trtforge reads models and "
            "data by UTF-8 names only (ONNX's loaders and the JSON records take no other): rename the file "
            "(or its folder) to a UTF-8 name."
        )


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_input_file(path: str | os.PathLike[str], what: str = "input file", *, sweep: bool = False) -> Path:
    """An existing, readable regular file with a UTF-8 name, else a UserError saying which it is not.
    An interrupted group commit onto it is settled first (:func:`settle_commit`); with `sweep`, what its
    writers killed before their commit point left beside it is removed too (:func:`_sweep_staged`), as
    its next writer would: a model's reader, so that a killed compile --save-onnx's staged copy of it is
    not left for good where that path is never written again. (A sweep lists the directory: a command's
    model, not each of many data files.)"""
    as_input_path(path, what)
    if not str(path):
        raise UserError(f"{what}: the path is empty.")
    p = Path(path)
    settle_commit(p)
    if sweep and p.name not in ("", ".", ".."):
        _sweep_staged(p)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise UserError(f"{what} '{show_path(p)}' does not exist.") from None
    except OSError as e:
        raise os_error(e, p, "read") from e
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{what} '{show_path(p)}' is a directory; expected a file.")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(
            f"{what} '{show_path(p)}' is not a regular file (a pipe or device?); expected a file."
        )
    return p


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def check_distinct_outputs(paths: dict[str, str | os.PathLike[str] | None]) -> None:
    """UserError when two output options name the same file (one would silently overwrite the other)."""
    seen: dict[str, str] = {}
    for option, path in paths.items():
        if path is None or not str(path):
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise UserError(
                f"{option} and {seen[key]} name the same file '{show_path(path)}'; give each its own path."
            )
        seen[key] = option


def refuse_overwriting_inputs(
    outputs: dict[str, str | os.PathLike[str] | None], inputs: dict[str, str | os.PathLike[str] | None]
) -> None:
    """UserError when an output path names one of the command's input files (--force or not): writing it
    would destroy the source while it is still being read."""
    for out_what, out in outputs.items():
        if out is None or not os.fspath(out):
            continue
        for in_what, src in inputs.items():
            if src is not None and os.fspath(src) and _same_file(out, src):
                # (a label that names its file already, "file 'config.json' of the model directory 'hf'",
                # is not followed by the path again)
                named = "" if in_what.endswith("'") else f" '{show_path(src)}'"
                raise UserError(
                    f"{out_what} '{show_path(out)}' is the {in_what}{named} itself; writing it would destroy "
                    "an input. Give the output another path."
                )


def check_output_path(path: str | os.PathLike[str], *, force: bool, what: str = "output") -> Path:
    """Validate that `path` can be written: a file name (not a directory), parent exists and is writable,
    the name fits the filesystem, no clobbering without force."""
    text = os.fspath(as_path(path, what)) if not isinstance(path, str) else path
    if not str(text):
        raise UserError(f"{what}: the path is empty; expected a file name.")
    if str(text).endswith(("/", os.sep)):
        raise UserError(
            f"{what} '{show_path(text)}' ends with '/', so it names a directory; expected a file path "
            "such as DIR/model.engine."
        )
    p = Path(text)
    check_name_length(p, what)
    settle_commit(p)  # (whether it exists is decided after a killed writer's commit onto it is settled)
    if p.is_dir():
        raise UserError(f"{what} '{show_path(text)}' is a directory; expected a file path.")
    if p.exists() and not p.is_file():
        raise UserError(f"{what} '{show_path(p)}' exists and is not a regular file; expected a file path.")
    if p.exists() and not force:
        raise UserError(f"{what} '{show_path(p)}' already exists; pass --force (force=True) to overwrite it.")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        missing = "is a file, not a directory" if parent.exists() else "does not exist"
        raise UserError(f"cannot write {what} '{show_path(p)}': directory '{show_path(parent)}' {missing}.")
    try:
        _probe_writable(parent)
    except OSError as e:
        raise UserError(
            f"cannot write {what} '{show_path(p)}': directory '{show_path(parent)}' is not writable "
            f"({e.strerror})."
        ) from e
    return p


def _probe_writable(directory: Path) -> None:
    """Make a file in `directory` and let it go, OSError when that cannot be done: a real probe (os.access
    says yes to root even on read-only or special filesystems). An unnamed file (O_TMPFILE), where the
    filesystem has them, which nothing (not even a SIGKILL) can leave behind; elsewhere a named one, made
    and removed with interrupts held (one between the two left it behind)."""
    unnamed = getattr(os, "O_TMPFILE", 0)
    if unnamed:
        try:
            os.close(os.open(directory, unnamed | os.O_WRONLY, 0o600))
            return
        except OSError as e:  # (a filesystem or kernel without it: the named probe below)
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    with signals_deferred():
        fd, probe = tempfile.mkstemp(prefix=".trtforge-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)


def temp_name(path: Path, tag: str) -> Path:
    """A hidden sibling of `path` whose name stays short however long `path`'s name is."""
    digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:12]
    return path.with_name(f".trtforge-{digest}.{tag}")


def fsync_dir(directory: Path) -> None:
    """Make renames inside `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory if str(directory) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a file written by another library (onnx.save) to disk, before a commit renames it into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO]:
    """Open a temp file next to `path` for writing; rename it onto `path` only if the block succeeds.

    The temp file is held by an flock until it is renamed (at the end of an enclosing
    :func:`atomic_outputs` block), so a later writer of `path` tells a killed writer's leftover, which it
    removes (:func:`_sweep_staged`), from a live one's."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    tmp, held = None, None
    try:
        _sweep_staged(p)  # (what writers of it killed by SIGKILL left)
        try:  # (interrupts held: one between the file's creation and this block's cleanup left it behind)
            with signals_deferred():
                fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:40]}.", suffix=".tmp", dir=parent)
                held = try_lock(Path(tmp))  # (while staged: a later writer's sweep leaves it be)
        except OSError as e:
            # a missing directory is the user's path too (the caller's check may not have seen this path)
            raise (os_error(e, p) if e.errno in USER_ERRNOS or e.errno == errno.ENOENT else e) from e
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        with signals_deferred():
            staged_rename(Path(tmp), p, cleanup=_closer(held))
            held = None
    except BaseException as e:
        if held is not None and held >= 0:
            os.close(held)
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in USER_ERRNOS:
            raise os_error(e, p) from e
        raise


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back (delivered when the block ends) so a group of renames is not split.

    The Python handlers are swapped for one that only records (main thread only, where handlers run and
    can be set). Blocking the signals with pthread_sigmask instead held nothing once the process had
    other threads (torch's, ONNX Runtime's): the kernel hands a process's signal to any thread that does
    not block it, and Python then runs the handler in the main thread, inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = [signal.SIGINT, signal.SIGTERM]
    alarm = getattr(signal, "SIGALRM", None)
    if alarm is not None and callable(signal.getsignal(alarm)):  # the CLI re-raises a held interrupt by it
        sigs.append(alarm)
    held: list[int] = []
    old = {s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(held):  # each once, to the handler the block found
            signal.raise_signal(s)


#: the names of trtforge's work directories in TMPDIR: a prefix of :func:`work_directory` (`trtforge-`,
#: `trtforge-report-`, ...) and tempfile's eight random characters
_WORK_NAME = re.compile(r"trtforge-(?:[a-z]+-)*[a-z0-9_]{8}")
#: the file inside a work directory saying that its process holds an flock on it for as long as it lives
#: (made once the flock is held: a marked directory whose flock nobody holds is a killed run's, at any age)
_WORK_MARK = ".trtforge-work"
#: seconds after which a staged file or directory that no live writer holds is a killed writer's (a live
#: one takes its flock microseconds after creating it)
DEAD_TEMP_AGE_S = 5.0


@contextlib.contextmanager
def work_directory(prefix: str) -> Iterator[Path]:
    """A fresh temporary directory in TMPDIR (named `prefix` + random), removed with what is in it when
    the block ends, however it ends. It is made with SIGINT/SIGTERM held back, so no interrupt lands
    between its creation and the point from which its removal is certain: one that did left it behind in
    TMPDIR. What no `finally` survives (SIGKILL, the OOM killer) left it for good, maybe gigabytes of
    ONNX exports: so the directory is flocked for as long as its process lives (and marked so), and each
    new one first removes the killed runs' (:func:`sweep_dead_work_directories`)."""
    if not _WORK_NAME.fullmatch(prefix + "x" * 8):
        raise ValueError(f"work directory prefix {prefix!r} is not of the form 'trtforge-[word-]...'")
    sweep_dead_work_directories()
    path: Path | None = None
    held: int | None = None
    forget = _own_directory(None)
    try:
        with signals_deferred():
            path = Path(tempfile.mkdtemp(prefix=prefix))
            held = _open_directory(path)
        if held is not None and fcntl is not None:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # (a filesystem without flock: unmarked, so never swept as dead)
                pass
            else:
                forget = _own_directory(held)
                (path / _WORK_MARK).touch()
        yield path
    finally:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        forget()
        if held is not None:
            os.close(held)


def sweep_dead_work_directories(tmpdir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the work directories (:func:`work_directory`) that runs killed by SIGKILL left in `tmpdir`
    (TMPDIR by default), and return them. Only a directory that is named as ours, owned by this user,
    marked as held by its process's flock and not flocked now (its process is gone) is removed, at any
    age: a run marks its directory only once it holds the flock, so no age guard is needed, and a run
    started again at once after a kill does not find the killed run's export (gigabytes for an LLM) still
    there. A live run's, a just-made (unmarked) one, a user's `trtforge-notes` and another user's stay.
    The mark goes last, so an interrupted removal is finished by the next sweep."""
    if fcntl is None:
        return []
    parent = Path(tmpdir if tmpdir is not None else tempfile.gettempdir())
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    uid, removed = os.getuid(), []
    for name in names:
        entry = parent / name
        try:
            if not _WORK_NAME.fullmatch(name) or entry.lstat().st_uid != uid:
                continue
            if not (entry / _WORK_MARK).is_file():
                continue
        except OSError:  # (gone, or not ours to look into: not ours to remove)
            continue
        with dead_leftover(entry, 0.0) as dead:
            if dead and _empty_work_directory(entry):
                removed.append(entry)
    return removed


def _empty_work_directory(entry: Path) -> bool:
    """Remove a dead work directory `entry`, its mark last (so an interrupted removal is finished by the
    next sweep, and what could not be removed keeps its mark: retried); whether it is gone."""
    try:
        for child in entry.iterdir():
            if child.name != _WORK_MARK:
                _remove(child)
        if os.listdir(entry) != [_WORK_MARK]:
            return False
        (entry / _WORK_MARK).unlink()
        entry.rmdir()
    except OSError:
        return False
    return True


class _Locked(threading.local):
    dirs: set[tuple[int, int]] | None = None


_LOCKED = _Locked()
# Directories this process holds by an exclusive flock to say it is alive (its work directories, staging
# directories): a directory_lock on one of them, from any thread, is not taken again. flock locks belong to
# an open file, not a process: a second descriptor's lock waited on the first's for ever (report --generate
# read its exported ONNX, under a shared lock, in its own flocked work directory).
_OWN_DIRS: set[tuple[int, int]] = set()


def _own_directory(fd: int | None) -> Callable[[], None]:
    """Record the directory open at `fd` (None or -1: nothing), flocked by this process, as its own (see
    _OWN_DIRS); returns what forgets it, to call before `fd` is closed."""
    if fd is None or fd < 0:
        return lambda: None
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    _OWN_DIRS.add(key)
    return lambda: _OWN_DIRS.discard(key)


@contextlib.contextmanager
def directory_lock(directories: Iterable[str | os.PathLike[str]], *, shared: bool = False) -> Iterator[None]:
    """Hold an flock on each of `directories` (exclusive for a writer, shared for a reader) while the
    block runs: two processes publishing groups of files into one directory (two compiles to the same
    engine, two optimizes to the same model and its data file) rename theirs one group after the other,
    not interleaved into a mix of both runs, and a reader of a group (an engine and its manifest) sees it
    before or after a publish, never half renamed. The lock is on the directory itself, so it leaves no
    file behind. Taken in a fixed order (no deadlock between two writers), before any signal is held back
    (Ctrl-C still stops the wait); a directory this thread holds already is not taken again. Where flock
    is missing (non-POSIX, some network filesystems) nothing is locked."""
    held = _LOCKED.dirs if _LOCKED.dirs is not None else set()
    _LOCKED.dirs = held
    fds: dict[tuple[int, int], int] = {}
    if fcntl is None:
        yield
        return
    try:
        for d in directories:
            fd = _open_directory(Path(d))
            if fd is None:
                continue
            key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
            if key in held or key in fds or key in _OWN_DIRS:
                os.close(fd)
                continue
            fds[key] = fd
        for key in sorted(fds):
            with contextlib.suppress(OSError):  # (a filesystem without flock: unlocked, as before)
                fcntl.flock(fds[key], fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            held.add(key)
        yield
    finally:
        for key, fd in fds.items():
            held.discard(key)
            os.close(fd)  # (releases the flock)


def _open_directory(directory: Path) -> int | None:
    try:
        return os.open(directory if str(directory) else ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None


class _Group(threading.local):
    renames: list[tuple[Path, Path]] | None = None
    cleanups: list[Callable[[], None]] | None = None


_GROUP = _Group()


@contextlib.contextmanager
def atomic_outputs() -> Iterator[None]:
    """The files written atomically inside this block (atomic_open, atomic_write_*, save_onnx_atomic) are
    committed into place as one group when it succeeds (a commit record, then the renames, SIGINT/SIGTERM
    held back; a SIGKILL in between is settled by the next access: the module doc), and removed when it
    fails: a command's outputs appear as a complete new set or not at all. Nested blocks join."""
    if _GROUP.renames is not None:
        yield
        return
    _GROUP.renames, _GROUP.cleanups = [], []
    renames, cleanups = _GROUP.renames, _GROUP.cleanups
    try:
        try:
            yield
        finally:
            _GROUP.renames = _GROUP.cleanups = None
        settle_commit(*(dest for _, dest in renames))  # (a dead writer's, before our locks are taken)
        with directory_lock(staged_directories(renames)), signals_deferred():
            _commit_group(renames)
    finally:
        for tmp, _ in renames:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        for cleanup in cleanups:
            cleanup()


def staged_directories(renames: list[tuple[Path, Path]] | None = None) -> list[Path]:
    """The directories that the staged files (of `renames`, by default the enclosing
    :func:`atomic_outputs` block's) will be renamed into: what :func:`directory_lock` must hold."""
    renames = _GROUP.renames if renames is None else renames
    return [dest.parent if str(dest.parent) else Path(".") for _, dest in renames or ()]


def staged_files() -> list[Path]:
    """The destinations of the files staged so far in the enclosing :func:`atomic_outputs` block."""
    return [dest for _, dest in _GROUP.renames or ()]


def commit_staged(also: list[tuple[Path, Path]] | None = None) -> None:
    """Commit the files staged so far in the enclosing :func:`atomic_outputs` block (if any) and the
    caller's own staged files `also` (staged path, destination) into place now, as one group (see the
    module doc). The caller holds SIGINT/SIGTERM back and the :func:`directory_lock` of every destination's
    directory (:func:`staged_directories` gives the block's). At the commit point `also` and the block's
    list are emptied: from then on the record owns the staged files, and neither the caller's cleanup nor
    the block's may delete them (a failed rename after it is finished by the next access)."""
    _commit_group(_GROUP.renames if _GROUP.renames is not None else [], also if also is not None else [])


def _commit_group(*groups: list[tuple[Path, Path]]) -> None:
    """Rename the staged files of `groups` (lists of (staged, destination)) onto their destinations as one
    commit: records, commit point, renames, records removed (the module doc); each list is emptied at the
    commit point. The caller holds the destinations' directory locks and SIGINT/SIGTERM back."""
    renames = [r for group in groups for r in group]
    if not renames:
        return
    dests = list(dict.fromkeys(dest for _, dest in renames))
    settle_commit(*dests)  # (a dead writer's record where ours go is finished or undone first)
    for dest in dests:
        _sweep_staged(dest)
    records = [temp_name(dest, _COMMIT) for dest in dests]
    token = secrets.token_hex(8)
    try:
        for record in records[1:]:
            _write_record(record, token, records[0], renames)
        for parent in {r.parent for r in records[1:]}:
            fsync_dir(parent)
        _write_record(records[0], token, records[0], renames)  # the commit point
        fsync_dir(records[0].parent)
    except BaseException as e:
        for record in records:
            _unlink_record(record, token)
        if isinstance(e, OSError) and e.errno in USER_ERRNOS:
            raise os_error(e, dests[0]) from e
        raise
    for group in groups:
        group.clear()
    try:
        for tmp, dest in renames:
            os.replace(tmp, dest)
    except OSError as e:  # (the records stay: the next access to the group finishes it)
        raise (os_error(e, dest) if e.errno in USER_ERRNOS else e) from e
    for parent in {dest.parent for dest in dests}:
        fsync_dir(parent)
    for record in [*records[1:], records[0]]:  # (the primary last: a secondary never outlives it)
        _unlink_record(record, token)


# ------------------------------------------------------------------------- group commit records
_COMMIT, _COMMIT_FORMAT, _STAGING = "commit", "trtforge.commit/1", ".stage"


def _real(path: Path) -> str:
    """`path` with its directory resolved (not its last component: a link there is replaced, not followed),
    so that a path relative to another real directory reaches it however the caller spelled it."""
    return os.path.join(os.path.realpath(path.parent if str(path.parent) else "."), path.name)


def _record_part(record: Path) -> Path:
    """The name commit record `record` is written under before it is renamed into place whole."""
    return record.with_name(record.name + ".part")


def _write_record(record: Path, token: str, primary: Path, renames: list[tuple[Path, Path]]) -> None:
    """Write the commit record `record` whole (as its .part, fsynced, then renamed into place)."""
    base = os.path.dirname(_real(record))

    def rel(p: Path) -> str:
        return os.path.relpath(_real(p), base)

    text = json.dumps(
        {
            "format": _COMMIT_FORMAT,
            "token": token,
            "commit": rel(primary),
            "files": [[rel(tmp), rel(dest)] for tmp, dest in renames],
        }
    )  # (ensure_ascii: the surrogates of undecodable name bytes round-trip)
    part = _record_part(record)
    with contextlib.suppress(FileNotFoundError):
        part.unlink()  # (a killed commit's: ours is made new, so its age and its flock are ours)
    output = next((dest for _, dest in renames if temp_name(dest, _COMMIT) == record), record)
    with contextlib.ExitStack() as held:  # (flocked while written: a sweep tells a killed writer's part)
        write_locked(part, text.encode("ascii"), held, output)
        os.replace(part, record)


def _read_record(record: Path) -> tuple[str, Path, list[tuple[Path, Path]]] | None:
    """(token, primary record, [(staged, destination)]) of commit record `record`, None when it is gone;
    a UserError naming it when it is not a record (nothing trtforge writes: it was damaged or edited), or
    names what no commit of its destinations could (:func:`_check_record`). Paths come back absolute and
    normalized against the record's real directory, as :func:`_write_record` made them relative."""
    try:
        data = json.loads(_record_bytes(record))
        if data["format"] != _COMMIT_FORMAT or not isinstance(data["token"], str) or not data["token"]:
            raise ValueError(f"format {data['format']!r}")
        base = os.path.realpath(record.parent if str(record.parent) else ".")

        def at(rel: object) -> Path:
            if not isinstance(rel, str) or not rel or "\0" in rel:
                raise ValueError(f"{rel!r} is not a path")
            if os.path.isabs(rel):  # (what _write_record writes never is)
                raise _not_genuine(record, f"'{show_path(rel)}' is not a path relative to its directory")
            return Path(os.path.normpath(os.path.join(base, rel)))

        files = [(at(tmp), at(dest)) for tmp, dest in data["files"]]
        primary = at(data["commit"])
    except FileNotFoundError:
        return None
    except OSError as e:
        raise os_error(e, record, "read") from e
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise UserError(
            f"'{show_path(record)}' is the record of an interrupted write of a group of files (a model and "
            f"its data file, an engine and its manifest), but it is damaged ({type(e).__name__}: {e}), so "
            "whether to finish or undo that write is unknown. Delete it, check the files beside it (or write "
            "them again), and retry."
        ) from e
    _check_record(record, primary, files)
    return data["token"], primary, files


#: bytes a commit record may hold (one names each staged file of its group once: a few KiB)
_RECORD_MAX = 1 << 20


def _record_bytes(record: Path) -> bytes:
    """The bytes of commit record `record`: a regular file of at most _RECORD_MAX bytes, else ValueError
    (a pipe there made every reader wait forever, a link to /dev/zero read until memory ran out)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(record, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("it is a symbolic link") from e
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        data = f.read(_RECORD_MAX + 1)
    if len(data) > _RECORD_MAX:
        raise ValueError(f"it holds more than {_RECORD_MAX} bytes")
    return data


def _not_genuine(record: Path, why: str) -> UserError:
    """The UserError for a record that no trtforge commit writes (from an unpacked archive, or edited)."""
    return UserError(
        f"'{show_path(record)}' has the name of the record of an interrupted trtforge write of a group of "
        f"files, but {why}; no trtforge commit writes that (the record came from elsewhere, such as an "
        "unpacked archive, or was edited), so nothing it names was renamed or deleted. Delete it, check the "
        "files beside it (or write them again), and retry."
    )


def _check_record(record: Path, primary: Path, files: list[tuple[Path, Path]]) -> None:
    """UserError unless the record names what a commit of its destinations could: each staged file a
    trtforge staged name beside its destination (atomic_open's temp file; a staged name from
    :func:`temp_name` of a destination in that directory) or that destination's name in a staging
    directory beside it (save_onnx_atomic's); the record itself the record of one of its destinations, and
    its primary that of the first. Settling it then renames or deletes nothing else."""
    if not files:
        raise _not_genuine(record, "it names no file")
    ours = _real(record)
    if not any(ours == str(temp_name(dest, _COMMIT)) for _, dest in files):
        raise _not_genuine(record, "none of the destinations it names is the file it stands beside")
    if primary != temp_name(files[0][1], _COMMIT):
        raise _not_genuine(record, f"its commit point '{show_path(primary)}' is not its first destination's")
    hashes: dict[Path, set[str]] = {}
    for _, dest in files:
        hashes.setdefault(dest.parent, set()).add(temp_name(dest, "").name)
    for tmp, dest in files:
        if not _is_staged_name(tmp, dest, hashes[dest.parent]):
            raise _not_genuine(
                record,
                f"it names '{show_path(tmp)}' as the staged file of '{show_path(dest)}', which is no "
                "staged name of it",
            )


_STAGED_TEMP = r"[a-z0-9_]{8}\.tmp"  # (tempfile's random names: atomic_open's temp file)
_STAGED_TAG = r"[0-9a-f]{8}\.[a-z]+(\.[a-z]+)*"  # (a publisher's token and kind: publish_engine's)
_STAGING_DIR = r"[a-z0-9_]{8}" + re.escape(_STAGING)  # (scratch_directory_beside's)


def _is_staged_name(tmp: Path, dest: Path, prefixes: set[str]) -> bool:
    """Whether `tmp` is a name trtforge stages `dest` under: `prefixes` are the :func:`temp_name` prefixes
    (`.trtforge-h.`) of the group's destinations in `dest`'s directory (a publisher's staged manifest, a
    staging directory holding a model's data file, are named after the group's engine or model)."""
    if not dest.name or dest.name in (".", ".."):
        return False
    any_prefix = "|".join(re.escape(p) for p in sorted(prefixes))
    if tmp.parent == dest.parent:
        return bool(
            re.fullmatch(re.escape(f".{dest.name[:40]}.") + _STAGED_TEMP, tmp.name)
            or re.fullmatch(f"(?:{any_prefix}){_STAGED_TAG}", tmp.name)
        )
    return (
        tmp.name == dest.name
        and tmp.parent.parent == dest.parent
        and bool(re.fullmatch(f"(?:{any_prefix}){_STAGING_DIR}", tmp.parent.name))
    )


def _unlink_record(record: Path, token: str) -> None:
    """Remove `record` (and its .part) if it is the commit record of `token`."""
    with contextlib.suppress(FileNotFoundError):
        _record_part(record).unlink()
    found = _read_record(record)
    if found is not None and found[0] == token:
        record.unlink()


def settle_commit(*paths: str | os.PathLike[str]) -> None:
    """Finish or undo an interrupted group commit onto any of `paths` (see the module doc): a dead
    writer's, since a live one holds the directory locks until its records are gone. Call it before
    reading a file of a group, or deciding whether it exists; it costs one stat a path when there is no
    record. What cannot be renamed or removed is a UserError naming the record."""
    for path in paths:
        p = Path(path)
        if not p.name or p.name in (".", ".."):
            continue
        record = temp_name(p, _COMMIT)
        for _ in range(8):  # (each turn settles one record; another writer's may take its place meanwhile)
            if not os.path.lexists(record):
                break
            found = _read_record(record)
            if found is None:
                break
            token, primary, files = found
            dirs = {record.parent, primary.parent, *(d.parent for _, d in files)}
            with directory_lock(dirs), signals_deferred():
                again = _read_record(record)
                if again is not None and again[0] == token:  # (else another settled it meanwhile: look again)
                    try:
                        if not _settle_commit(record, token, primary, files):
                            break  # (left as it was: a read-only directory)
                    except OSError as e:
                        raise UserError(
                            f"an interrupted write of a group of files left '{show_path(record)}', which "
                            f"could not be settled ({e.strerror or e}); make its directory writable and "
                            "retry."
                        ) from e


def _settle_commit(record: Path, token: str, primary: Path, files: list[tuple[Path, Path]]) -> bool:
    """Roll the group of commit `token` (read from `record`) forward (its primary record is there) or back
    (it is not), then remove its records. Only staged files that are regular files no live process holds (by
    flock) are renamed or deleted: renamed only onto a destination beside which a record of this commit
    stands too, deleted in another directory than `record`'s only there: a record from elsewhere (an
    unpacked archive) reaches no further than its own directory, nor onto another output there. A staged
    file a roll-back cannot reach so (in another directory, whose own record the kill came before) is then
    removed only as a sweep of its output would remove it (:func:`_remove_dead`), its staging directory
    and its record's half-written part with it; a younger one is left to that output's next reader or
    writer (:func:`_sweep_staged`). Everything is checked before anything is renamed. A roll-back that the
    directory's permissions (or a read-only filesystem) forbid is left undone (False): the old group it
    keeps is whole, so a reader reads it."""
    committed = os.path.lexists(primary) and (_read_record(primary) or ("",))[0] == token
    here = Path(_real(record)).parent
    vouched = set()  # (destinations beside which a record of this commit stands)
    for dest in dict.fromkeys(d for _, d in files):
        rec = temp_name(dest, _COMMIT)
        if str(rec) == _real(record) or (os.path.lexists(rec) and (_read_record(rec) or ("",))[0] == token):
            vouched.add(dest)
    reach = {d for _, d in files if d in vouched or d.parent == here}
    try:
        with contextlib.ExitStack() as held:
            act = _settleable(record, committed, vouched, here, files, held)
            for tmp, dest in act:
                if committed:
                    os.replace(tmp, dest)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
        for tmp, dest in files:
            if tmp.parent != dest.parent and dest in reach:
                with contextlib.suppress(OSError):  # (save_onnx_atomic's staging directory, empty now)
                    tmp.parent.rmdir()
        for parent in {dest.parent for dest in reach}:
            fsync_dir(parent)
        records = list(dict.fromkeys(temp_name(dest, _COMMIT) for _, dest in files if dest in reach))
        for rec in [r for r in records if r != primary] + [primary]:
            _unlink_record(rec, token)
    except OSError as e:
        if committed or e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        # (rolled back: no destination was touched, so the old group stands whole; in a directory this
        # process may not write, the record and staged files stay, hidden, for a writer to clear)
        return False
    if not committed:
        for tmp, dest in files:
            if dest not in reach:  # (what a writer holds: its staged file or the staging directory of it,
                _remove_dead(tmp if tmp.parent == dest.parent else tmp.parent)  # and its record's part)
                _remove_dead(_record_part(temp_name(dest, _COMMIT)))
    return True


def _settleable(
    record: Path,
    committed: bool,
    vouched: set[Path],
    here: Path,
    files: list[tuple[Path, Path]],
    held: contextlib.ExitStack,
) -> list[tuple[Path, Path]]:
    """The (staged, destination) pairs of `files` that settling `record` (in directory `here`) may rename
    (`committed`: only onto a destination with a record of the commit beside it, `vouched`, as every
    destination has until its staged file is renamed) or delete (also in `here`), each staged file's flock
    taken and kept by `held`; a UserError for what no genuine commit leaves."""
    act: list[tuple[Path, Path]] = []
    for tmp, dest in files:
        try:
            st = os.lstat(tmp)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise _not_genuine(record, f"'{show_path(tmp)}', which it names as staged, is no file")
        if dest not in vouched:
            if committed:
                raise _not_genuine(record, f"'{show_path(dest)}' has no record of that commit beside it")
            if dest.parent != here:
                continue
        fd = try_lock(tmp, follow=False)
        if fd is None:
            if committed:
                raise UserError(
                    f"'{show_path(record)}' records an interrupted write of a group of files whose "
                    f"staged file '{show_path(tmp)}' a running process holds; retry when it has finished."
                )
            continue  # (a live writer's own staged file: not ours to delete)
        if fd >= 0:
            held.callback(os.close, fd)
        if committed and os.path.isdir(dest) and not os.path.islink(dest):
            raise _not_genuine(record, f"its destination '{show_path(dest)}' is a directory")
        act.append((tmp, dest))
    return act


def _closer(fd: int | None) -> Callable[[], None]:
    """A cleanup closing descriptor `fd` (None or -1: nothing) once."""
    fds = [fd] if fd is not None and fd >= 0 else []
    return lambda: os.close(fds.pop()) if fds else None


def staged_rename(tmp: Path, dest: Path, cleanup: Callable[[], None] | None = None) -> None:
    """Rename `tmp` onto `dest` now, or with the rest of the enclosing :func:`atomic_outputs` block;
    `cleanup` runs after the rename (or after the block), whether or not the rename succeeded."""
    if _GROUP.renames is None:
        try:
            os.replace(tmp, dest)
        finally:
            if cleanup is not None:
                cleanup()
        return
    _GROUP.renames.append((tmp, dest))
    if cleanup is not None:
        _GROUP.cleanups.append(cleanup)


def _remove(path: Path) -> None:
    """Remove `path`, a directory tree (what of it can be) or a file or link (which rmtree refuses)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def recover_staged_directory(path: str | os.PathLike[str]) -> None:
    """Repair what a run killed (SIGKILL) inside :func:`staged_directory` left beside `path`: its old
    directory is put back when `path` is missing (the kill came between the two renames of a filesystem
    without the exchange, :func:`_take_place`), else removed; a half-written new directory, or the old
    contents an exchange swapped out under its name, is removed when it is a dead writer's
    (:func:`_remove_dead_new`). Call it before looking at `path` (whether it exists)."""
    path = Path(path)
    old = temp_name(path, "old")
    parent = path.parent if str(path.parent) else Path(".")
    with directory_lock([parent]), signals_deferred():  # (no swap of another writer's is half done)
        if os.path.lexists(old):
            if not os.path.lexists(path):
                os.rename(old, path)
            else:
                _remove(old)
        stem = temp_name(path, "new").name
        for leftover in parent.glob(glob.escape(stem) + "*"):
            _remove_dead_new(leftover)


#: the new directories of :func:`staged_directory` (`temp_name(path, "new.PID.THREAD")`), of any `path`
_STAGED_NEW = re.compile(r"\.trtforge-[0-9a-f]{12}\.new\.[0-9]+\.[0-9]+")


def sweep_staged_directories(parent: str | os.PathLike[str]) -> None:
    """Remove the new directories (or the old contents swapped out under their names) that writers
    killed inside :func:`staged_directory` left in `parent`, whatever path each was staged for
    (:func:`recover_staged_directory` looks for one path's only): an `export-triton --version N` killed
    while writing left the plan inside the model directory, which only an export of that same version
    then removed."""
    parent = Path(parent)
    with directory_lock([parent]), signals_deferred():
        try:
            names = os.listdir(parent)
        except OSError:  # (no directory: nothing was staged in it)
            return
        for name in names:
            if _STAGED_NEW.fullmatch(name):
                _remove_dead_new(parent / name)


def _remove_dead_new(leftover: Path) -> None:
    """Remove a :func:`staged_directory` new directory that is a killed writer's, or the old contents
    that an exchange (:func:`_take_place`) put under that name, which a kill stopped the removal of (a
    directory, or the file or link a new directory replaced). The caller holds the parent's lock, under
    which a writer makes and flocks its new directory and swaps it in, so an unlocked one is dead at any
    age, and a link there (no writer makes one) is what a swap left."""
    if os.path.islink(leftover):
        _remove(leftover)
        return
    with dead_leftover(leftover, 0.0) as dead:
        if dead:
            _remove(leftover)


def scratch_directory_beside(path: Path) -> tuple[Path, Callable[[], None]]:
    """A new hidden directory beside `path` to write `path`'s group of files in (save_onnx_atomic's model
    and data file), flocked while in use, and the cleanup that lets it go. The cleanup removes it once
    its staged files are gone (renamed into place, or deleted with a group that failed before its commit
    point), and leaves it while a file in it is still staged: a commit stopped after its commit point,
    whose record names that file for the roll-forward (which then removes the directory). A dead
    writer's, unlocked, is swept by the next commit onto `path`."""
    parent = path.parent if str(path.parent) else Path(".")
    tmp, fd = None, None
    try:
        with signals_deferred():  # (raised at its end, an interrupt held here finds `tmp` to remove)
            tmp = Path(tempfile.mkdtemp(prefix=temp_name(path, "").name, suffix=_STAGING, dir=parent))
            fd = try_lock(tmp)
            forget = _own_directory(fd)
    except BaseException:
        if fd is not None and fd >= 0:
            os.close(fd)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise

    def cleanup() -> None:
        forget()
        if fd is not None and fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            tmp.rmdir()

    return tmp, cleanup


def _sweep_staged(dest: Path) -> None:
    """Remove what writers of `dest` killed before their commit point left beside it (atomic_open's temp
    files, staging directories, a half-written commit record's part): those whose flock no live writer
    holds. Where flock is missing nothing is swept (a live writer's could not be told apart)."""
    if fcntl is None:
        return
    parent = dest.parent if str(dest.parent) else Path(".")
    part = _record_part(temp_name(dest, _COMMIT)).name
    files = re.compile(re.escape(f".{dest.name[:40]}.") + r"[a-z0-9_]{8}\.tmp|" + re.escape(part))
    directories = re.compile(re.escape(temp_name(dest, "").name) + r"[a-z0-9_]{8}" + re.escape(_STAGING))
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        entry = parent / name
        is_dir = entry.is_dir() and not entry.is_symlink()
        if not ((files.fullmatch(name) and entry.is_file()) or (directories.fullmatch(name) and is_dir)):
            continue
        _remove_dead(entry)


def _remove_dead(path: Path) -> None:
    """Remove `path` (a staged file, a staging directory) when it is a killed writer's leftover
    (:func:`dead_leftover`). One this process may not remove (another user's, a read-only directory)
    stays, hidden, for one that may: a reader or writer of a file beside it is not refused for it."""
    with dead_leftover(path, DEAD_TEMP_AGE_S) as dead:
        if dead:
            try:
                _remove(path)
            except OSError as e:
                if e.errno not in USER_ERRNOS:
                    raise


def try_lock(path: Path, *, follow: bool = True, strict: bool = False) -> int | None:
    """A descriptor of `path` (a file or a directory) holding a non-blocking exclusive flock, for as long
    as it stays open; None when a live process (or another descriptor) holds the lock; -1 when `path` is
    gone. Where flock is missing, the descriptor holds nothing, unless `strict`: then None there too (no
    lock taken, so whether a live process holds it is unknown). Staged outputs are held so while being
    written: a recovery that cannot take the lock leaves them to their live writer. Never waits (a pipe's
    open would, for a writer); `follow=False` refuses a symbolic link (OSError)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return -1
    if fcntl is None:
        if strict:
            os.close(fd)
            return None
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:  # (a filesystem without flock: nothing is held there)
        if strict:
            os.close(fd)
            return None
    return fd


@contextlib.contextmanager
def dead_leftover(path: Path, min_age_s: float) -> Iterator[bool]:
    """Whether `path`, a file or directory a writer holds by an flock while it lives (atomic_open's temp
    file, a staging, staged or work directory), is a killed writer's leftover: a regular file or a
    directory (not a link) whose mtime is `min_age_s` old or more (a writer takes its flock just after
    making it) and whose exclusive flock this process takes now (its writer is gone). The lock is held
    while the block runs, for the caller to remove `path`. The one test every sweep of dead writers'
    leftovers makes: where flock is missing or fails (some network filesystems), a live writer's cannot
    be told apart, so nothing is dead."""
    fd = None
    try:
        st = os.lstat(path)
        if (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and time.time() - st.st_mtime >= min_age_s:
            fd = try_lock(path, follow=False, strict=True)
    except OSError:  # (gone, a link, or not ours to open: not ours to remove)
        fd = None
    if fd is not None and fd >= 0 and (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)  # (replaced since its age was read)
        fd = None
    try:
        yield fd is not None and fd >= 0
    finally:
        if fd is not None and fd >= 0:
            os.close(fd)


#: renameat2(2)'s flags that refuse an existing destination and that swap the two paths, and the directory
#: descriptor meaning "relative to the working directory" (Linux's values: renameat2 is Linux's)
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _AT_FDCWD = 1, 2, -100
#: what renameat2 answers where the filesystem or kernel lacks the flag (some overlay and NFS mounts,
#: kernels before 3.15), and ours where the C library has no renameat2: the plain renames then
_NO_EXCHANGE = frozenset(getattr(errno, n) for n in ("EINVAL", "ENOSYS", "EOPNOTSUPP") if hasattr(errno, n))


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """The C library's renameat2 (glibc 2.28 and later), None where it has none (not Linux, an older
    glibc): looked up once, since a process's C library does not change."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _renameat2_flagged(a: Path, b: Path, flag: int) -> None:
    """renameat2(2) of `a` to `b` with `flag`; OSError as the call fails it (ENOSYS: no renameat2 here)."""
    fn = _renameat2()
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(a))
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flag) != 0:
        import ctypes

        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


def _rename_exchange(a: Path, b: Path) -> None:
    """Swap the existing paths `a` and `b` (directories, files or links, of any two kinds) in one atomic
    step: renameat2(2) with RENAME_EXCHANGE. OSError as the call fails it (ENOSYS: no renameat2 here)."""
    _renameat2_flagged(a, b, _RENAME_EXCHANGE)


def _rename_noreplace(a: Path, b: Path) -> None:
    """Rename `a` to `b`, FileExistsError when `b` exists. Where the filesystem has renameat2's
    RENAME_NOREPLACE the kernel checks and renames in one atomic step; a plain rename would replace an
    empty directory (or any file) that another process made at `b` after a check. Elsewhere (the errnos
    of :data:`_NO_EXCHANGE`) the check, then the rename: a `b` made between the two is still replaced."""
    try:
        _renameat2_flagged(a, b, _RENAME_NOREPLACE)
    except OSError as e:
        if e.errno not in _NO_EXCHANGE:
            raise
    else:
        return
    if os.path.lexists(b):
        raise FileExistsError(errno.EEXIST, "made by another writer meanwhile", str(b))
    os.rename(a, b)


def _take_place(new: Path, path: Path) -> Path | None:
    """Put `new` (a staged directory beside `path`) in `path`'s place; return where `path`'s old contents
    are now, for the caller to remove (None: there were none). The caller holds the parent's
    :func:`directory_lock` and SIGINT/SIGTERM back.

    Why an exchange: replacing `path` by renames takes two (the old one aside, the new one in), and a
    reader between them finds `path` missing, as does everyone after a SIGKILL there until the next
    call's :func:`recover_staged_directory` puts the old one back. Where the filesystem can, the two
    trade places in one atomic step instead (renameat2's RENAME_EXCHANGE), so that a reader or a kill
    at any moment finds `path` whole, old or new; the old contents are then under `new`'s name, which
    nothing holds by flock, so a kill before their removal leaves a dead staged directory that the
    sweeps remove (:func:`_remove_dead_new`). Whether the exchange works is asked at each call (one
    process writes to several filesystems): where it does not (EINVAL, ENOSYS: some overlay and NFS
    mounts, older kernels or C libraries) the two renames, old aside to `temp_name(path, "old")`."""
    if not os.path.lexists(path):
        os.rename(new, path)
        return None
    try:
        _rename_exchange(new, path)
    except OSError as e:
        if e.errno not in _NO_EXCHANGE:
            raise
    else:
        return new
    old = temp_name(path, "old")
    os.rename(path, old)
    try:
        os.rename(new, path)
    except BaseException:
        os.rename(old, path)
        raise
    return old


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike[str], *, replace: bool = True) -> Iterator[Path]:
    """A new, empty directory beside `path` (in its parent, which must exist) to write the whole of
    `path`'s new contents into. When the block succeeds it takes `path`'s place (:func:`_take_place`: one
    atomic exchange where the filesystem has it, else two renames) and the old contents are removed,
    SIGINT/SIGTERM held back for both. When the block fails the new one is removed and `path` is as it
    was. So `path` holds the old contents or the new ones, never a mix, and nothing of the old survives
    the new; what a SIGKILL leaves beside `path` the next call (or :func:`recover_staged_directory`)
    repairs. Write into the new directory with :func:`write_synced` or plain file writes (not
    atomic_open, whose renames an enclosing :func:`atomic_outputs` block would defer past the swap).

    Two writers of one `path` at once each write a directory of their own, which each holds by an flock
    while it writes (another's recovery leaves it alone), and swap one after the other under the parent's
    :func:`directory_lock`: the last to finish wins, whole. The parent is locked only for the recovery and
    the swap, never while the block writes, so readers and writers of other files there (an engine beside
    a report being written) do not wait for it.

    With `replace=False` an existing `path` is not replaced: the swap raises FileExistsError (the new
    directory removed) when `path` exists by then, though it was missing when the caller looked (another
    writer made it meanwhile): checked by the rename itself where the filesystem can
    (:func:`_rename_noreplace`), so a process that does not take our lock cannot slip one in between."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    new = temp_name(p, f"new.{os.getpid()}.{threading.get_ident()}")
    made, held, forget = False, None, _own_directory(None)
    try:
        with directory_lock([parent]):
            recover_staged_directory(p)
            with signals_deferred():  # (made and marked with interrupts held, so the cleanup below sees it)
                try:
                    os.mkdir(new)
                except OSError as e:  # a place no directory can be made in (/proc, /sys: ENOENT)
                    raise os_error(e, p, f"create a directory in '{show_path(p.parent)}' for") from e
                made = True
            held = try_lock(new)  # (recovery leaves a held one to its live writer)
            forget = _own_directory(held)
        if p.is_dir():
            os.chmod(new, stat.S_IMODE(p.stat().st_mode))
        yield new
        fsync_dir(new)
        with directory_lock([parent]), signals_deferred():
            if replace:
                replaced = _take_place(new, p)
            else:
                _rename_noreplace(new, p)
                replaced = None
            made = False
            if replaced is not None:  # (a SIGKILL during it leaves the rest to the next call's recovery)
                _remove(replaced)
        fsync_dir(parent)
    except BaseException as e:
        if made:
            shutil.rmtree(new, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in USER_ERRNOS:
            raise os_error(e, p) from e
        raise
    finally:
        forget()
        if held is not None and held >= 0:
            os.close(held)


def write_locked(path: Path, data: bytes, held: contextlib.ExitStack, target: Path) -> None:
    """Create `path` (staged for `target`), flock it for as long as `held` lasts (the lock follows the file
    through renames), write `data` and fsync. The lock tells a sweep of dead writers' leftovers (and
    :func:`~trtforge.core.manifest.resolve_pending`) its writer is alive. A user's OSError names `target`."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise (os_error(e, target) if e.errno in USER_ERRNOS else e) from e
    held.callback(os.close, fd)
    if fcntl is not None:
        with contextlib.suppress(OSError):  # (no flock here, some NFS: no lock, and nothing is swept)
            fcntl.flock(fd, fcntl.LOCK_EX)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as e:
        raise (os_error(e, target) if e.errno in USER_ERRNOS else e) from e


def write_synced(path: Path, data: bytes) -> None:
    """Write `data` to a new file `path` and fsync it (a file of a :func:`staged_directory`, whose rename
    into place must not come before its contents reach the disk)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | memoryview) -> None:
    """Write `data` to `path` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8; undecodable path bytes kept as they were) to `path` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))


def json_finite(obj: Any) -> Any:
    """`obj` (JSON-ready) with every inf/nan float, which JSON cannot represent, replaced by None (null),
    recursively: Python's json writes them as the bare words NaN and Infinity, which strict parsers (jq,
    JavaScript) refuse."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_finite(v) for v in obj]
    return obj


def json_text(obj: Any, *, indent: int | None = 2) -> str:
    """`obj` as strict JSON, the form of every JSON document trtforge writes (manifests, ledgers,
    reports, inspect --json): inf/nan as null (:func:`json_finite`), and ``allow_nan=False`` so that
    nothing non-finite can slip through to a strict reader (jq, JavaScript, Go) that refuses the words
    NaN and Infinity."""
    import json

    return json.dumps(json_finite(obj), indent=indent, allow_nan=False)


def sha256_bytes(data: bytes | memoryview) -> str:
    """Hex sha256 of a buffer."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
