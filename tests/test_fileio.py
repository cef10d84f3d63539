"""Atomic writes: all or nothing, usual permissions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtforge._fileio import atomic_open, atomic_write_bytes, check_output_path
from trtforge.errors import UserError


def test_atomic_write_leaves_nothing_on_failure(tmp_path) -> None:
    def crash_mid_write() -> None:
        with atomic_open(tmp_path / "out.bin") as f:
            f.write(b"partial")
            raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        crash_mid_write()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_permissions_follow_umask(tmp_path) -> None:
    atomic_write_bytes(tmp_path / "a.bin", b"x")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o666 & ~mask


def _writer_inside_atomic_open(path: Path) -> subprocess.Popen:
    """A process stopped inside atomic_open(path), its half-written temp file beside `path`."""
    code = (
        "import sys, time\nfrom trtforge._fileio import atomic_open\n"
        "with atomic_open(sys.argv[1]) as f:\n"
        "    f.write(b'half'); f.flush(); print('ready', flush=True); time.sleep(120)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_killed_writers_temp_file_is_removed_by_the_next_write(tmp_path) -> None:
    """Before: a writer killed (SIGKILL) inside atomic_open left its `.NAME.XXXXXXXX.tmp` beside the output
    for good (`compile --save-onnx s.onnx` killed: a `.s.onnx.*.tmp` of the graph, never settled by the
    next compile). The next write of that path removes it now; a live writer's (held by its flock), a
    just-made one's and files of other names stay."""
    from trtforge._fileio import DEAD_TEMP_AGE_S

    out = tmp_path / "s.onnx"
    dead, live = _writer_inside_atomic_open(out), _writer_inside_atomic_open(out)
    try:
        dead.kill()
        dead.wait()
        live_temps = {p.name for p in tmp_path.iterdir()}
        assert len(live_temps) == 2
        old = time.time() - 2 * DEAD_TEMP_AGE_S
        for p in tmp_path.iterdir():
            os.utime(p, (old, old))
        (tmp_path / ".s.onnx.young123.tmp").write_bytes(b"a writer that has just made it")
        (tmp_path / ".s.onnx.notes.tmp").write_bytes(b"a user's file")
        os.utime(tmp_path / ".s.onnx.notes.tmp", (old, old))
        atomic_write_bytes(out, b"new")
        left = sorted(p.name for p in tmp_path.iterdir())
        assert out.read_bytes() == b"new"
        assert len(left) == 4 and {".s.onnx.young123.tmp", ".s.onnx.notes.tmp", "s.onnx"} < set(left)
        assert len(live_temps & set(left)) == 1  # the live writer's, not the dead one's
    finally:
        live.kill()
        live.wait()


def test_check_output_path(tmp_path) -> None:
    (tmp_path / "exists").write_text("x")
    with pytest.raises(UserError, match="already exists"):
        check_output_path(tmp_path / "exists", force=False)
    assert check_output_path(tmp_path / "exists", force=True) == tmp_path / "exists"
    with pytest.raises(UserError, match="is a directory"):
        check_output_path(tmp_path, force=True)


def test_atomic_outputs_appear_together_or_not_at_all(tmp_path) -> None:
    """Before: calibrate/optimize/report renamed each output as it was written, so an interrupt between two
    left a new model beside an old cache (or a new report.json beside an old report.html)."""
    from trtforge._fileio import atomic_outputs, atomic_write_text

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")
    b.write_text("old b")

    def interrupted() -> None:
        with atomic_outputs():
            atomic_write_text(a, "new a")
            assert a.read_text() == "old a"  # staged, not yet in place
            raise KeyboardInterrupt  # Ctrl-C (the CLI turns SIGTERM into the same) between the two writes

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    with atomic_outputs():
        atomic_write_text(a, "new a")
        with atomic_outputs():  # a nested block joins the outer one
            atomic_write_text(b, "new b")
        assert b.read_text() == "old b"
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_save_onnx_atomic_joins_the_group_and_leaves_no_temp_dir(tmp_path) -> None:
    import onnx

    from tests.models import tiny_onnx
    from trtforge._fileio import atomic_outputs, atomic_write_text
    from trtforge.core.onnx_io import save_onnx_atomic

    model = onnx.load(str(tiny_onnx(tmp_path / "src.onnx")))

    def failing() -> None:
        with atomic_outputs():
            save_onnx_atomic(model, tmp_path / "out.onnx")
            raise RuntimeError("the ledger failed")

    with pytest.raises(RuntimeError):
        failing()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.onnx"]
    with atomic_outputs():
        save_onnx_atomic(model, tmp_path / "out.onnx")
        atomic_write_text(tmp_path / "ledger.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json", "out.onnx", "src.onnx"]
    assert onnx.load(str(tmp_path / "out.onnx")).graph.node


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt here, as in a command's main thread (a pytest-xdist worker
    ignores it)."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _mkdtemp_then_interrupted(made: list[Path], monkeypatch) -> None:
    """tempfile.mkdtemp that makes its directory, then receives SIGINT before it returns: the moment a
    Ctrl-C or `timeout`'s SIGTERM left a work directory behind in TMPDIR."""
    import os
    import signal
    import tempfile
    import time

    real = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        path = real(*args, **kwargs)
        made.append(Path(path))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # (an unheld signal is raised in here, before the path is returned)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)


def test_a_work_directory_is_removed_even_if_an_interrupt_lands_as_it_is_made(
    tmp_path, monkeypatch, sigint_raises
) -> None:
    from trtforge._fileio import work_directory

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    made: list[Path] = []
    _mkdtemp_then_interrupted(made, monkeypatch)
    with pytest.raises(KeyboardInterrupt), work_directory("trtforge-") as d:
        (d / "x.onnx").write_bytes(b"x")
    assert made and not made[0].exists() and not list(tmp_path.iterdir())


def test_a_compile_session_leaves_no_work_directory_when_interrupted(
    tmp_path, monkeypatch, sigint_raises
) -> None:
    from trtforge.compiler.session import CompileSession

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    made: list[Path] = []
    _mkdtemp_then_interrupted(made, monkeypatch)
    with pytest.raises(KeyboardInterrupt), CompileSession(tmp_path / "m.engine"):
        pass
    assert made and not list((tmp_path / "tmp").iterdir())
    monkeypatch.undo()
    with CompileSession(tmp_path / "m.engine") as session:  # (the next one, uninterrupted, as before)
        assert session.workdir.is_dir()
        workdir = session.workdir
    assert not workdir.exists()


def _run_inside_work_directory(tmpdir: Path) -> tuple[subprocess.Popen, Path]:
    """A process stopped inside work_directory (as a compile is), TMPDIR `tmpdir`, and its directory."""
    code = (
        "import time\nfrom trtforge._fileio import work_directory\n"
        "with work_directory('trtforge-') as d:\n"
        "    (d / 'model.onnx').write_bytes(b'an export'); print(d, flush=True); time.sleep(120)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), TMPDIR=str(tmpdir))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_runs_work_directory_is_removed_by_the_next_run(tmp_path, monkeypatch) -> None:
    """Before: a compile killed by SIGKILL (or the OOM killer) left its `trtforge-XXXXXXXX` work directory
    in TMPDIR for good, maybe gigabytes of ONNX exports. The next run's work directory removes it now, and
    one killed a moment ago too (a compile --generate killed while exporting, run again at once: its work
    directory, a step graph of the model's size, stayed beside the next run's for five minutes, an age
    guard no live run needs, since a run marks its directory only once it holds its flock); a live run's
    (flocked), a just-made one's (not marked yet), a user's `trtforge-mybackup` and other names stay."""
    from trtforge._fileio import work_directory

    dead, dead_dir = _run_inside_work_directory(tmp_path)
    live, live_dir = _run_inside_work_directory(tmp_path)
    young, young_dir = _run_inside_work_directory(tmp_path)
    try:
        for proc in (dead, young):
            proc.kill()
            proc.wait()
        users = [tmp_path / "trtforge-mybackup", tmp_path / "trtforge-report-notes", tmp_path / "other"]
        for d in users:
            d.mkdir()
            (d / "keep.txt").write_text("the user's")
        just_made = tmp_path / "trtforge-abcdefgh"  # (made by a run that has not flocked and marked it yet)
        just_made.mkdir()
        old = time.time() - 3600
        for d in (dead_dir, live_dir, *users):
            os.utime(d, (old, old))
        assert dead_dir.is_dir() and (dead_dir / "model.onnx").is_file()
        monkeypatch.setenv("TMPDIR", str(tmp_path))
        monkeypatch.setattr("tempfile.tempdir", None)
        with work_directory("trtforge-") as mine:
            assert not dead_dir.exists() and not young_dir.exists()
            assert (live_dir / "model.onnx").is_file() and just_made.is_dir()
            assert all((d / "keep.txt").is_file() for d in users)
        assert not mine.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [live_dir.name, just_made.name, *(d.name for d in users)]
        )
    finally:
        for proc in (dead, live, young):
            proc.kill()
            proc.wait()


def test_signals_deferred_holds_the_clis_timer_reraise_too() -> None:
    """The CLI raises a held interrupt again from a SIGALRM handler (trtforge.cli._errors): inside a
    deferred block it must wait for the block's end like SIGINT itself."""
    import signal

    from trtforge._fileio import signals_deferred

    class Late(Exception):
        pass

    def on_alarm(_signum, _frame):
        raise Late()

    inside: list[bool] = []

    def block() -> None:
        with signals_deferred():
            signal.raise_signal(signal.SIGALRM)
            signal.raise_signal(signal.SIGALRM)
            inside.append(True)  # reached: nothing was raised in the block

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with pytest.raises(Late):
            block()
        assert inside == [True]
    finally:
        signal.signal(signal.SIGALRM, old)


def test_the_write_probe_leaves_nothing_when_interrupted(tmp_path, monkeypatch, sigint_raises) -> None:
    import os
    import signal
    import tempfile
    import time

    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        return made

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.delattr(os, "O_TMPFILE", raising=False)  # (the named probe, where a filesystem has no other)
    with pytest.raises(KeyboardInterrupt):
        check_output_path(tmp_path / "m.engine", force=False)
    with pytest.raises(KeyboardInterrupt), atomic_open(tmp_path / "m.json", "w") as f:
        f.write("{}")
    assert not list(tmp_path.iterdir())


def test_staged_directory_killed_between_its_renames_is_repaired(tmp_path):
    """A SIGKILL after the old directory was moved aside and before the new one took its place: the
    next run puts the old one back (then replaces it as usual); a half-written new one is removed."""
    from trtforge._fileio import recover_staged_directory, staged_directory, temp_name

    path = tmp_path / "rep"
    old, new = temp_name(path, "old"), temp_name(path, "new")
    old.mkdir()
    (old / "a").write_text("old")
    new.mkdir()
    (new / "a").write_text("half")
    recover_staged_directory(path)
    assert (path / "a").read_text() == "old" and not old.exists() and not new.exists()
    with staged_directory(path) as d:
        (d / "b").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"] and [p.name for p in path.iterdir()] == ["b"]


@pytest.mark.parametrize("swap", ["exchange", "renames"])
@pytest.mark.parametrize("old_kind", ["directory", "file", "link"])
def test_a_signal_during_the_staged_swap_waits_for_the_old_ones_removal(
    tmp_path, monkeypatch, sigint_raises, old_kind, swap
):
    """Before: the old directory was removed after the deferred-signal block, so an interrupt that came
    as it was moved aside was raised before its removal and left it beside `path`; an old file or link
    was never removed (rmtree refuses them, quietly). Now the swap and the removal both wait for it,
    whether the swap is one exchange (the interrupt right after it) or two renames (a filesystem without
    the exchange: the interrupt right after the first)."""
    import signal

    from tests.test_directory_swap import require_exchange, two_renames_only
    from trtforge import _fileio
    from trtforge._fileio import staged_directory, temp_name

    path = tmp_path / "rep"
    if old_kind == "directory":
        path.mkdir()
        (path / "a").write_text("old")
    elif old_kind == "file":
        path.write_text("old")
    else:
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    if swap == "exchange":
        require_exchange(tmp_path)
        real_exchange = _fileio._rename_exchange

        def exchange_then_interrupt(a, b):
            real_exchange(a, b)
            signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(_fileio, "_rename_exchange", exchange_then_interrupt)
    else:
        two_renames_only(monkeypatch)
        real = os.rename

        def rename_then_interrupt(src, dst):
            real(src, dst)
            if Path(dst) == temp_name(path, "old"):
                signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(_fileio.os, "rename", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt), staged_directory(path) as d:
        (d / "b").write_text("new")
    monkeypatch.undo()
    kept = ["elsewhere"] if old_kind == "link" else []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["rep", *kept])
    assert not path.is_symlink() and [p.name for p in path.iterdir()] == ["b"]


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing of the process's own cleanup runs after it but `finally` blocks, which
    delete no file once a group commit has passed its commit point."""


def test_a_commit_stopped_after_its_commit_point_is_finished_by_the_next_reader(tmp_path, monkeypatch):
    """calibrate's model and its cache (here in two directories) committed as one group, stopped right
    after the model's rename: before, the new model stood beside the old cache, and the cache reader read
    the old scales. Now the cache reader finds the commit record and finishes the renames."""
    from trtforge import _fileio
    from trtforge._fileio import atomic_outputs, atomic_write_text
    from trtforge.calibration.cache import read_calibration_cache, write_calibration_cache

    (tmp_path / "m").mkdir()
    (tmp_path / "c").mkdir()
    model, cache = tmp_path / "m" / "q.onnx", tmp_path / "c" / "q.calib.cache"
    model.write_text("old model")
    cache.write_text("TRT-0-MinMaxCalibration\nx: 3f800000\n")
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if Path(dst) == model:
            raise _Killed

    def calibrate_committing() -> None:
        with atomic_outputs():
            atomic_write_text(model, "new model")
            write_calibration_cache(cache, {"x": 0.5}, "max")

    monkeypatch.setattr(_fileio.os, "replace", replace)
    with pytest.raises(_Killed):
        calibrate_committing()
    monkeypatch.undo()
    assert read_calibration_cache(cache)[1] == {"x": 0.5}
    assert model.read_text() == "new model"
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["q.onnx"]
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["q.calib.cache"]


def test_a_commit_killed_before_its_commit_point_is_undone_by_the_next_reader(tmp_path) -> None:
    """What a kill leaves after the secondary record and before the primary one (the commit point): the
    reader of the secondary's file deletes the staged files and the record, and reads the old file."""
    from trtforge._fileio import _write_record, check_input_file, temp_name

    a, b = tmp_path / "m.onnx.data", tmp_path / "m.onnx"
    a.write_text("old data")
    b.write_text("old model")
    staged = [(tmp_path / ".m.onnx.data.a0000000.tmp", a), (tmp_path / ".m.onnx.b0000000.tmp", b)]
    for tmp, _ in staged:
        tmp.write_text("new")
    _write_record(temp_name(b, "commit"), "0123", temp_name(a, "commit"), staged)
    assert check_input_file(b) == b
    assert (a.read_text(), b.read_text()) == ("old data", "old model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_a_damaged_commit_record_is_a_user_error_naming_it(tmp_path) -> None:
    from trtforge._fileio import check_input_file, temp_name

    (tmp_path / "m.onnx").write_text("model")
    record = temp_name(tmp_path / "m.onnx", "commit")
    record.write_text('{"format": "trtforge.commit/1"')
    with pytest.raises(UserError, match=rf"'{record}' is the record of an interrupted write .* damaged"):
        check_input_file(tmp_path / "m.onnx")


def test_what_writers_killed_before_their_commit_point_left_the_next_commit_sweeps(tmp_path) -> None:
    """A kill while the model was being written left its staging directory (maybe gigabytes of external
    data) or atomic_open's temp file beside the output, for good. The next commit onto that output removes
    them; a live writer's, flocked, stays."""
    from trtforge._fileio import DEAD_TEMP_AGE_S, atomic_outputs, atomic_write_text, scratch_directory_beside

    out = tmp_path / "m.onnx"
    dead, let_go = scratch_directory_beside(out)
    (dead / "m.onnx.data").write_bytes(b"half the weights")
    let_go()  # (its lock goes with the process; the directory stays, not empty)
    (tmp_path / ".m.onnx.k1ll3dxx.tmp").write_text("half a model")
    live, release = scratch_directory_beside(out)
    (tmp_path / "m.onnx.notes.tmp").write_text("the user's")
    old = time.time() - 2 * DEAD_TEMP_AGE_S  # (younger ones may be a live writer's, not yet locked)
    for p in (dead, tmp_path / ".m.onnx.k1ll3dxx.tmp", live):
        os.utime(p, (old, old))
    with atomic_outputs():
        atomic_write_text(out, "model")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.onnx", "m.onnx.notes.tmp", live.name])
    release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.notes.tmp"]


def _saver_stopped_in_save_onnx_atomic(src: Path, out: Path) -> subprocess.Popen:
    """A process stopped inside a plain save_onnx_atomic(out) (no enclosing group), its model and a data
    file written into the staging directory beside `out`."""
    code = (
        "import sys, time, onnx\nimport trtforge.core.onnx_io as io\nreal = io.save_onnx\n"
        "def stalled(model, path):\n"
        "    real(model, path); open(str(path) + '.data', 'wb').write(b'half the weights')\n"
        "    print('ready', flush=True); time.sleep(120)\n"
        "io.save_onnx = stalled\nio.save_onnx_atomic(onnx.load(sys.argv[1]), sys.argv[2])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(src), str(out)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_plain_save_onnx_atomic_killed_leaves_a_staging_directory_the_next_save_sweeps(tmp_path) -> None:
    """save_onnx_atomic outside any atomic_outputs block still commits through its own group, so the
    sweep of killed writers' leftovers (_sweep_staged, run by every commit) covers its staging directory
    too: a real writer killed by SIGKILL mid-save leaves it (model and data), the next save of that path
    removes it, and a live writer's stays."""
    import onnx

    from tests.models import tiny_onnx
    from trtforge._fileio import DEAD_TEMP_AGE_S
    from trtforge.core.onnx_io import save_onnx_atomic

    (tmp_path / "src").mkdir()
    src = tiny_onnx(tmp_path / "src" / "m.onnx")
    d = tmp_path / "out"
    d.mkdir()
    out = d / "s.onnx"
    dead = _saver_stopped_in_save_onnx_atomic(src, out)
    live = _saver_stopped_in_save_onnx_atomic(src, out)
    try:
        dead.kill()
        dead.wait()
        staged = sorted(d.iterdir())
        assert len(staged) == 2 and all(p.is_dir() and (p / "s.onnx.data").is_file() for p in staged)
        old = time.time() - 2 * DEAD_TEMP_AGE_S
        for p in staged:
            os.utime(p, (old, old))
        save_onnx_atomic(onnx.load(str(src)), out)
        left = sorted(d.iterdir())
        assert len(left) == 2 and out in left and onnx.load(str(out)).graph.node
        live_dir = next(p for p in left if p != out)
        assert live_dir in staged and (live_dir / "s.onnx.data").read_bytes() == b"half the weights"
    finally:
        live.kill()
        live.wait()
    save_onnx_atomic(onnx.load(str(src)), out)  # (the live one is dead now: the next save removes it)
    assert sorted(p.name for p in d.iterdir()) == ["s.onnx"]


def _forge(record: Path, files: list[list[str]], *, commit: str | None = None, token: str = "0bad") -> None:
    """Write a commit record by hand, as an archive could carry one: `files` as (staged, destination)
    relative to the record's directory (or absolute), `commit` the primary record (by default itself)."""
    import json

    doc = {"format": "trtforge.commit/1", "token": token, "commit": commit or record.name, "files": files}
    record.write_text(json.dumps(doc))


_STAGED = ".m.onnx.abcdefgh.tmp"  # (a staged name of m.onnx: atomic_open's)


@pytest.mark.parametrize(
    ("files", "commit", "why"),
    [
        ([["../home/victim.txt", "m.onnx"]], None, "no staged name"),  # roll forward: victim moved here
        ([["{victim}", "m.onnx"]], None, "not a path relative"),  # an absolute path
        ([["../home/victim.txt", "n.onnx"], [_STAGED, "m.onnx"]], "n.onnx", "no staged name"),  # roll back
        ([[_STAGED, "m.onnx"]], "n.onnx", "commit point"),
        ([[_STAGED, "m.onnx"], ["../home/.victim.txt.abcdefgh.tmp", "../home/victim.txt"]], None, "no rec"),
        ([[_STAGED, "m.onnx"], ["x/.victim.txt.abcdefgh.tmp", "x/victim.txt"]], None, "no record"),  # a link
        ([["../home/.victim.txt.abcdefgh.tmp", "../home/victim.txt"]], None, "stands beside"),
        ([[".other.onnx.abcdefgh.tmp", "m.onnx"]], None, "no staged name"),  # another output's staged file
        ([[_STAGED, "m.onnx"], [".other.onnx.abcdefgh.tmp", "other.onnx"]], None, "no rec"),  # its output
    ],
)
def test_a_forged_commit_record_renames_or_deletes_nothing_it_could_not_have_staged(
    tmp_path, files, commit, why
) -> None:
    """Before: a reader settled any `.trtforge-*.commit` beside the file it read as it said, so one from an
    unpacked archive deleted (roll back) or moved onto the model (roll forward) any file it named: through
    `..`, an absolute path, a symlinked directory, or another output's staged file (onto that output).
    Now a record must name what a commit of its destinations could (staged names beside them, its own
    destination among them), and a roll forward onto a destination only with this commit's record beside
    it too; else a UserError naming the record, nothing renamed or deleted."""
    from trtforge._fileio import check_input_file, temp_name

    d, home = tmp_path / "archive", tmp_path / "home"
    d.mkdir()
    home.mkdir()
    victim = home / "victim.txt"
    victim.write_text("the user's")
    (home / ".victim.txt.abcdefgh.tmp").write_text("another writer's staged file")
    (d / "x").symlink_to(home)
    (d / "m.onnx").write_text("model")
    for name in (_STAGED, ".other.onnx.abcdefgh.tmp"):
        (d / name).write_text("staged")
    record = temp_name(d / "m.onnx", "commit")
    primary = temp_name(d / commit, "commit").name if commit else None
    _forge(record, [[t.format(victim=victim), dest] for t, dest in files], commit=primary)
    before = {p: p.read_text() for p in [*d.iterdir(), *home.iterdir()] if p.is_file()}
    with pytest.raises(UserError, match=rf"'{record}' has the name of the record .*{why}.*nothing it names"):
        check_input_file(d / "m.onnx")
    assert {p: p.read_text() for p in [*d.iterdir(), *home.iterdir()] if p.is_file()} == before


@pytest.mark.parametrize("kind", ["symlink", "directory", "pipe"])
def test_a_commit_record_renames_only_regular_staged_files(tmp_path, kind) -> None:
    """A record (committed: its own primary) whose staged file is a symbolic link to a file elsewhere, a
    directory or a pipe: before, the link was moved onto the output (the reader then read the other file),
    and the pipe's lock check would wait forever. Now a UserError, nothing renamed."""
    from trtforge._fileio import check_input_file, temp_name

    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("elsewhere")
    (tmp_path / "m.onnx").write_text("model")
    staged = tmp_path / _STAGED
    if kind == "symlink":
        staged.symlink_to(elsewhere)
    elif kind == "directory":
        staged.mkdir()
    else:
        os.mkfifo(staged)
    record = temp_name(tmp_path / "m.onnx", "commit")
    _forge(record, [[_STAGED, "m.onnx"]])
    with pytest.raises(UserError, match=rf"'{record}' has the name .* is no file"):
        check_input_file(tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").read_text() == "model" and not (tmp_path / "m.onnx").is_symlink()
    assert os.path.lexists(staged) and elsewhere.read_text() == "elsewhere"


def test_a_commit_record_leaves_a_live_writers_staged_file_alone(tmp_path) -> None:
    """A record naming a staged file that a running process holds (its flock): before, a roll forward
    moved the half-written file onto the output, a roll back deleted it under its writer. Now the roll
    forward is refused (UserError, nothing renamed) and the roll back leaves it."""
    import fcntl

    from trtforge._fileio import check_input_file, settle_commit, temp_name

    out = tmp_path / "m.onnx"
    out.write_text("model")
    staged = tmp_path / _STAGED
    staged.write_text("half")
    record = temp_name(out, "commit")
    fd = os.open(staged, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # (another open file description: a live writer's)
    try:
        _forge(record, [[_STAGED, "m.onnx"]])
        with pytest.raises(UserError, match="a running process holds"):
            check_input_file(out)
        assert out.read_text() == "model" and staged.read_text() == "half"
        record.unlink()  # a secondary record whose primary never came: rolled back
        (tmp_path / ".n.onnx.abcdefgh.tmp").write_text("a dead writer's")
        secondary = temp_name(tmp_path / "n.onnx", "commit")
        _forge(secondary, [[_STAGED, "m.onnx"], [".n.onnx.abcdefgh.tmp", "n.onnx"]], commit=record.name)
        settle_commit(tmp_path / "n.onnx")
        assert sorted(p.name for p in tmp_path.iterdir()) == [_STAGED, "m.onnx"]
    finally:
        os.close(fd)


_READ_ONLY_READER = """
import subprocess, sys
from pathlib import Path
from trtforge._fileio import _write_record, check_input_file, temp_name
from trtforge.errors import UserError
d = Path(sys.argv[1])
for names in (["m.onnx.data", "m.onnx"], ["n.onnx"]):  # (m's secondary record only: rolled back)
    staged = [(d / f".{name}.a0000000.tmp", d / name) for name in names]
    for tmp, out in staged:
        out.write_text("old " + out.name)
        tmp.write_text("new " + out.name)
    _write_record(temp_name(d / names[-1], "commit"), "0123", temp_name(d / names[0], "commit"), staged)
subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
import trtforge._fileio as fileio
tries, settle = [], fileio._settle_commit
fileio._settle_commit = lambda *args: tries.append(args) or settle(*args)
print(check_input_file(d / "m.onnx").read_text(), len(tries))
try:
    check_input_file(d / "n.onnx")
except UserError as e:
    print(e)
"""


def test_a_rolled_back_commit_in_a_read_only_directory_reads_the_old_group(tmp_path) -> None:
    """A record left by a writer killed before its commit point, in a directory the reader cannot write (a
    read-only mount; chmod does not stop root): before, every read of its files was a UserError (the
    roll-back could not delete the staged files). Now the reader reads the old group, which the roll-back
    keeps whole anyway; one after the commit point still asks for a writable directory (its roll forward
    is needed for a whole group)."""
    import shutil

    probe = ["unshare", "-rm", "true"]
    if not shutil.which("unshare") or subprocess.run(probe, capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare -rm), so no read-only tmpfs to test in")
    d = tmp_path / "ro"
    d.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    script = f'mount -t tmpfs tmpfs "$1" && exec "{sys.executable}" -c "$0" "$1"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, _READ_ONLY_READER, str(d)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "old m.onnx 1"  # (tried once, not once a turn of settle_commit's loop)
    assert "could not be settled (Read-only file system); make its directory writable" in lines[1]


@pytest.mark.parametrize("kind", ["pipe", "link to /dev/zero", "nested too deep"])
def test_a_commit_record_that_is_no_small_json_file_is_refused_at_once(tmp_path, kind) -> None:
    """A `.trtforge-*.commit` beside a model that is a pipe (an archive can carry one), a link to /dev/zero
    or JSON nested beyond the parser's depth: before, every reader of the model waited on the pipe
    forever, read /dev/zero until memory ran out, or failed with an internal RecursionError. Now each is a
    UserError naming the record, at once (a record is also read no further than 1 MiB)."""
    import threading

    from trtforge._fileio import check_input_file, temp_name

    (tmp_path / "m.onnx").write_text("model")
    record = temp_name(tmp_path / "m.onnx", "commit")
    if kind == "pipe":
        os.mkfifo(record)
    elif kind == "link to /dev/zero":
        record.symlink_to("/dev/zero")
    else:
        record.write_text("[" * 100_000 + "]" * 100_000)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            check_input_file(tmp_path / "m.onnx")
        except BaseException as e:
            errors.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(20)
    if reader.is_alive() and kind == "pipe":  # (let the waiting reader go)
        os.close(os.open(record, os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), "the reader is still waiting"
    assert len(errors) == 1 and isinstance(errors[0], UserError), errors
    assert f"'{record}' is the record of an interrupted write" in str(errors[0])


def test_a_commit_through_symlinks_and_odd_spellings_is_settled_from_any_spelling(
    tmp_path, monkeypatch
) -> None:
    """A group written as `./lnk/../lnk/q.onnx` (lnk a link to a directory), `c/../c/q.cache` and `lnk/out`
    (itself a link to a file elsewhere), stopped after its first rename: the reader of `real/out` finds
    the record (records are named and resolved by real directory) and finishes all three; `out` becomes
    the new file (the link is replaced, not followed), and the file it pointed to is untouched."""
    from trtforge import _fileio
    from trtforge._fileio import atomic_outputs, atomic_write_text, check_input_file

    for name in ("real", "c"):
        (tmp_path / name).mkdir()
    (tmp_path / "lnk").symlink_to(tmp_path / "real")
    (tmp_path / "elsewhere").write_text("elsewhere")
    (tmp_path / "real" / "out").symlink_to(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path)
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if Path(dst).name == "q.onnx":
            raise _Killed

    def write_group() -> None:
        with atomic_outputs():
            for path in ("./lnk/../lnk/q.onnx", "c/../c/q.cache", "lnk/out"):
                atomic_write_text(path, "new " + Path(path).name)

    monkeypatch.setattr(_fileio.os, "replace", replace)
    with pytest.raises(_Killed):
        write_group()
    monkeypatch.setattr(_fileio.os, "replace", real)
    check_input_file(tmp_path / "real" / "out")
    assert sorted(os.listdir(tmp_path / "real")) == ["out", "q.onnx"] and os.listdir("c") == ["q.cache"]
    assert [(tmp_path / p).read_text() for p in ("real/q.onnx", "c/q.cache", "real/out")] == [
        "new q.onnx",
        "new q.cache",
        "new out",
    ]
    assert not (tmp_path / "real" / "out").is_symlink()
    assert (tmp_path / "elsewhere").read_text() == "elsewhere"


def _finishes(fn, timeout: float = 20.0) -> bool:
    """Whether `fn()` returns within `timeout` seconds (run on a daemon thread: one that hangs is left)."""
    import threading

    done = threading.Event()

    def run() -> None:
        fn()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(timeout)


def test_a_group_lock_on_a_directory_this_process_holds_as_its_own_does_not_wait_on_itself(tmp_path) -> None:
    """Before: `report --generate` hung for ever. Its work directory is flocked (exclusive) for as long as
    its process lives; reading the ONNX model it exported there took a shared directory_lock on the same
    directory through a second descriptor, and flock locks belong to an open file, not a process: the
    second waited on the first. The same held for a report's staging directory and save_onnx_atomic's.
    Now a directory_lock skips the directories the process holds as its own, from any thread."""
    from trtforge._fileio import (
        atomic_outputs,
        atomic_write_text,
        directory_lock,
        scratch_directory_beside,
        staged_directory,
        work_directory,
    )

    def in_work_directory() -> None:
        with work_directory("trtforge-test-") as d:
            with directory_lock([d], shared=True):
                pass
            with atomic_outputs():
                atomic_write_text(d / "m.txt", "model")

    def in_staged_directory() -> None:
        with staged_directory(tmp_path / "report") as d, atomic_outputs():
            atomic_write_text(d / "report.json", "{}")

    def in_scratch_directory() -> None:
        d, release = scratch_directory_beside(tmp_path / "m.onnx")
        try:
            with directory_lock([d], shared=True):
                pass
        finally:
            release()

    for fn in (in_work_directory, in_staged_directory, in_scratch_directory):
        assert _finishes(fn), fn.__name__
    assert (tmp_path / "report" / "report.json").read_text() == "{}"


def _no_flock(monkeypatch) -> None:
    """Every flock fails as on a filesystem without it (some NFS mounts: ENOLCK): writers hold nothing."""
    import errno
    import fcntl

    def flock(_fd, _op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


@pytest.mark.parametrize("sweep", ["staged file", "staged directory", "work directory"])
def test_no_sweep_removes_a_live_writers_leftover_where_flock_fails(tmp_path, monkeypatch, sweep) -> None:
    """On a filesystem whose flock fails (ENOLCK), a live writer's staged file, staged directory or work
    directory holds no lock, so none can tell it from a killed writer's. Before, each sweep took the
    descriptor its lock probe returned (holding nothing) for a dead writer's and removed the live writer's
    file once it was older than the age guard (a model written for more than DEAD_TEMP_AGE_S). Now the
    sweeps share one test (dead_leftover): a lock it could not take is no dead writer's."""
    from trtforge._fileio import (
        DEAD_TEMP_AGE_S,
        atomic_write_bytes,
        recover_staged_directory,
        sweep_dead_work_directories,
        temp_name,
    )

    out = tmp_path / "m.onnx"
    if sweep == "staged file":
        live = tmp_path / ".m.onnx.abcdefgh.tmp"
        live.write_bytes(b"half a model")
    elif sweep == "staged directory":
        live = temp_name(out, "new.1234.5678")
        live.mkdir()
    else:
        live = tmp_path / "trtforge-abcdefgh"
        live.mkdir()
        (live / ".trtforge-work").touch()
    aged = time.time() - 2 * DEAD_TEMP_AGE_S
    os.utime(live, (aged, aged))
    _no_flock(monkeypatch)
    if sweep == "staged file":
        atomic_write_bytes(out, b"model")
    elif sweep == "staged directory":
        recover_staged_directory(out)
    else:
        assert sweep_dead_work_directories(tmp_path) == []
    assert live.exists()


_KILLED_AT_THE_COMMIT_POINT = """
import os, signal, sys
from pathlib import Path
import onnx
import trtforge._fileio as fileio
from trtforge.calibration.cache import write_calibration_cache
from trtforge.core.onnx_io import save_onnx_atomic
real = fileio._write_record
def killed_at_the_commit_point(record, token, primary, renames):
    if record == primary:  # (the secondary records are written: the primary's appearance commits)
        os.kill(os.getpid(), signal.SIGKILL)
    real(record, token, primary, renames)
fileio._write_record = killed_at_the_commit_point
src, model, cache = (Path(a) for a in sys.argv[1:4])
with fileio.atomic_outputs():
    if sys.argv[4] == "onnx":
        save_onnx_atomic(onnx.load(str(src)), model)
    else:
        fileio.atomic_write_text(model, "new model")
    write_calibration_cache(cache, {"x": 0.5}, "max")
"""


@pytest.mark.parametrize("model_kind", ["onnx", "text"])
def test_a_group_in_two_directories_killed_before_its_commit_point_leaves_nothing_staged(
    tmp_path, model_kind
) -> None:
    """calibrate's model (directory m, the primary) and its cache (directory c), its process killed by
    SIGKILL after the cache's record was written and before the model's (the commit point). Before, the
    cache reader rolled the group back in c only (a record reaches no further than its own directory) and
    removed the record that named the model's staged file (or staging directory: maybe gigabytes), which
    then stayed in m, named by no record, until the next write of that model. Now the roll-back removes
    it too when it is a dead writer's (dead_leftover: unlocked and old enough)."""
    from tests.models import tiny_onnx
    from trtforge._fileio import DEAD_TEMP_AGE_S
    from trtforge.calibration.cache import read_calibration_cache

    for name in ("m", "c", "src"):
        (tmp_path / name).mkdir()
    src = tiny_onnx(tmp_path / "src" / "q.onnx")
    model, cache = tmp_path / "m" / "q.onnx", tmp_path / "c" / "q.calib.cache"
    model.write_text("old model")
    cache.write_text("TRT-0-MinMaxCalibration\nx: 3f800000\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    args = [str(src), str(model), str(cache), model_kind]
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_THE_COMMIT_POINT, *args], env=env, timeout=120, capture_output=True
    )
    assert proc.returncode == -9, proc.stderr
    assert len(os.listdir(tmp_path / "m")) == 2 and len(os.listdir(tmp_path / "c")) == 3  # (+ its record)
    aged = time.time() - 2 * DEAD_TEMP_AGE_S
    for p in [*(tmp_path / "m").iterdir(), *(tmp_path / "c").iterdir()]:
        os.utime(p, (aged, aged))
    assert read_calibration_cache(cache)[1] == {"x": 1.0}  # (rolled back: the old scales)
    assert model.read_text() == "old model"
    assert os.listdir(tmp_path / "m") == ["q.onnx"] and os.listdir(tmp_path / "c") == ["q.calib.cache"]


@pytest.mark.parametrize("reader", ["inspect", "optimize"])
def test_a_killed_save_onnx_staging_directory_is_swept_by_the_next_reader(tmp_path, capsys, reader) -> None:
    """`compile --save-onnx s.onnx` killed by SIGKILL while saving left its staging directory beside
    the s.onnx of an earlier run (the new model, maybe gigabytes of its data file). Before, only the next
    write of s.onnx swept it: `inspect s.onnx` or `optimize s.onnx` read the old model and left it for
    good. Now a model reader sweeps it too, as a writer does (dead ones only: a live writer's stays)."""
    from tests.models import tiny_onnx
    from trtforge._fileio import DEAD_TEMP_AGE_S
    from trtforge.cli.main import main

    (tmp_path / "src").mkdir()
    src = tiny_onnx(tmp_path / "src" / "m.onnx")
    d = tmp_path / "out"
    d.mkdir()
    out = d / "s.onnx"
    out.write_bytes(src.read_bytes())
    dead = _saver_stopped_in_save_onnx_atomic(src, out)
    live = _saver_stopped_in_save_onnx_atomic(src, out)
    try:
        dead.kill()
        dead.wait()
        staged = [p for p in d.iterdir() if p != out]
        assert len(staged) == 2
        aged = time.time() - 2 * DEAD_TEMP_AGE_S
        for p in staged:
            os.utime(p, (aged, aged))
        argv = (
            ["inspect", str(out)] if reader == "inspect" else ["optimize", str(out), "-o", str(d / "o.onnx")]
        )
        rc = main(argv)
        assert rc == 0, capsys.readouterr()
        left = sorted(p for p in d.iterdir() if p.name != "o.onnx")
        assert len(left) == 2 and out in left
        assert all(p in staged for p in left if p != out)  # (the live writer's)
    finally:
        live.kill()
        live.wait()


_KILLED_IN_THE_WRITE_PROBE = """
import os, signal, sys
from trtforge._fileio import check_output_path
real = os.open
def open_then_killed(path, flags, *args, **kwargs):
    fd = real(path, flags, *args, **kwargs)
    if flags & (os.O_CREAT | getattr(os, "O_TMPFILE", 0)) and os.fspath(path).startswith(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)  # (the probe made, not yet removed)
    return fd
os.open = open_then_killed
check_output_path(os.path.join(sys.argv[1], "m.engine"), force=False)
"""


def test_a_write_probe_killed_midway_leaves_nothing(tmp_path) -> None:
    """check_output_path probes that the output's directory is writable by making a file there. Before, a
    SIGKILL (the OOM killer, `kill -9` of a command just started) between its creation and its removal
    left a `.trtforge-probe-XXXXXXXX` there for good: nothing sweeps that name. Now the probe is an
    unnamed file (O_TMPFILE) where the filesystem has them, which no kill can leave behind."""
    if not hasattr(os, "O_TMPFILE"):
        pytest.skip("no O_TMPFILE on this platform: the probe is a named file, removed with interrupts held")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_THE_WRITE_PROBE, str(tmp_path)],
        env=env,
        timeout=60,
        capture_output=True,
    )
    assert proc.returncode == -9, proc.stderr
    assert os.listdir(tmp_path) == []


def test_a_killed_writers_calibration_cache_temp_file_is_swept_by_the_cache_reader(tmp_path) -> None:
    """calibrate killed by SIGKILL before its commit point left the cache's staged `.q.calib.cache.*.tmp`
    beside the old cache (found by killing calibrate after each filesystem change). Before, only the next
    write of that cache swept it; compile --calib-cache (its reader) left it. Now the reader sweeps it too
    (dead ones only: a live writer's stays), as the model's reader does the model's."""
    from trtforge._fileio import DEAD_TEMP_AGE_S
    from trtforge.calibration.cache import read_calibration_cache

    cache = tmp_path / "q.calib.cache"
    cache.write_text("TRT-0-MinMaxCalibration\nx: 3f800000\n")
    dead, live = _writer_inside_atomic_open(cache), _writer_inside_atomic_open(cache)
    try:
        dead.kill()
        dead.wait()
        staged = [p for p in tmp_path.iterdir() if p != cache]
        aged = time.time() - 2 * DEAD_TEMP_AGE_S
        for p in staged:
            os.utime(p, (aged, aged))
        assert read_calibration_cache(cache)[1] == {"x": 1.0}
        left = [p for p in tmp_path.iterdir() if p != cache]
        assert len(staged) == 2 and len(left) == 1 and left[0] in staged
    finally:
        live.kill()
        live.wait()


_KILLED_WRITING_A_RECORD = """
import os, signal, sys
from pathlib import Path
import trtforge._fileio as fileio
from trtforge.calibration.cache import write_calibration_cache
real = os.replace
def replace(src, dst, *args, **kwargs):
    if str(src).endswith(".commit.part"):  # (the secondary record written, not yet in place)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *args, **kwargs)
os.replace = replace
model, cache = Path(sys.argv[1]), Path(sys.argv[2])
with fileio.atomic_outputs():
    fileio.atomic_write_text(model, "new model")
    write_calibration_cache(cache, {"x": 0.5}, "max")
"""


def test_a_commit_record_half_written_by_a_killed_writer_is_swept(tmp_path) -> None:
    """calibrate killed by SIGKILL while its cache's commit record was being written (as its `.part`, to
    appear whole by a rename): before, the `.trtforge-h.commit.part` stayed beside the cache for good
    (found by killing calibrate at random moments); nothing but a later commit onto that cache, which
    wrote over it, touched that name. Now the part is flocked while written, and swept as a dead writer's
    staged file is: by the cache's reader here, the model's reader sweeping the model's staged file."""
    from trtforge._fileio import DEAD_TEMP_AGE_S, check_input_file
    from trtforge.calibration.cache import read_calibration_cache

    model, cache = tmp_path / "q.onnx", tmp_path / "q.calib.cache"
    model.write_text("old model")
    cache.write_text("TRT-0-MinMaxCalibration\nx: 3f800000\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITING_A_RECORD, str(model), str(cache)],
        env=env,
        timeout=120,
        capture_output=True,
    )
    assert proc.returncode == -9, proc.stderr
    assert any(p.name.endswith(".commit.part") for p in tmp_path.iterdir())
    aged = time.time() - 2 * DEAD_TEMP_AGE_S
    for p in tmp_path.iterdir():
        os.utime(p, (aged, aged))
    assert read_calibration_cache(cache)[1] == {"x": 1.0}
    check_input_file(model, sweep=True)
    assert sorted(os.listdir(tmp_path)) == ["q.calib.cache", "q.onnx"]


_KILLED_REMOVING_THE_RECORDS = """
import os, signal, sys
from pathlib import Path
import onnx
import trtforge._fileio as fileio
import trtforge.core.onnx_io as onnx_io
onnx_io._has_external = lambda model: True  # (its weights in OUT.data, as for a model over 1.8 GB)
out = Path(sys.argv[2])
primary, real = fileio.temp_name(out.with_name(out.name + ".data"), "commit"), fileio._unlink_record
def unlink_record(record, token):
    if record == primary:  # (every file renamed, the secondary record removed: the primary's turn)
        os.kill(os.getpid(), signal.SIGKILL)
    real(record, token)
fileio._unlink_record = unlink_record
onnx_io.save_onnx_atomic(onnx.load(sys.argv[1]), out)
"""


def test_a_model_reader_settles_the_commit_record_of_its_data_file(tmp_path) -> None:
    """A model saved with its weights in OUT.onnx.data (optimize, calibrate over 1.8 GB, compile
    --save-onnx) commits the data file first, so the data file's record is the group's primary, removed
    last. A SIGKILL after the model's record was removed and before the primary's (found by killing
    calibrate after each filesystem change) left `.trtforge-h.commit` beside them for good: the model's
    reader settled only the model's own record. Now it settles its data file's too."""
    from tests.cli.test_kill9_optimize import _model
    from trtforge._fileio import DEAD_TEMP_AGE_S
    from trtforge.core.onnx_io import load_onnx

    (tmp_path / "src").mkdir()
    src = _model(tmp_path / "src" / "m.onnx", 1)  # (16 KiB of weights: the data file holds them)
    d = tmp_path / "out"
    d.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_REMOVING_THE_RECORDS, str(src), str(d / "s.onnx")],
        env=env,
        timeout=120,
        capture_output=True,
    )
    assert proc.returncode == -9, proc.stderr
    assert any(p.name.endswith(".commit") for p in d.iterdir())
    aged = time.time() - 2 * DEAD_TEMP_AGE_S  # (its empty staging directory: swept once that old)
    for p in d.iterdir():
        os.utime(p, (aged, aged))
    assert load_onnx(d / "s.onnx").graph.node
    assert sorted(os.listdir(d)) == ["s.onnx", "s.onnx.data"]


_KILLED_WRITING_THE_REPORTS_RECORD = """
import os, signal, sys
from pathlib import Path
import trtforge._fileio as fileio
real = os.replace
def replace(src, dst, *args, **kwargs):
    if str(src).endswith(".commit.part") and Path(src).parent.name == "r":
        os.kill(os.getpid(), signal.SIGKILL)  # (the cache's record is in place, the report's half written)
    return real(src, dst, *args, **kwargs)
os.replace = replace
with fileio.atomic_outputs():
    for out in sys.argv[1:]:
        fileio.atomic_write_text(Path(out), "new " + Path(out).name)
"""


def test_a_roll_back_removes_the_half_written_record_of_an_output_elsewhere(tmp_path) -> None:
    """calibrate's model (m, the primary), cache (c) and --report (r), killed by SIGKILL while the report's
    commit record was being written (its `.part`), the cache's record in place. The cache's reader rolls
    the group back; before, the report's staged file went (a dead writer's, in another directory) but the
    `.part` of its record stayed in r for good (found by killing calibrate after each filesystem change:
    nothing reads a report to sweep it). Now the roll-back removes it too, when dead."""
    from trtforge._fileio import DEAD_TEMP_AGE_S, check_input_file

    outs = [tmp_path / "m" / "q.onnx", tmp_path / "c" / "q.calib.cache", tmp_path / "r" / "rec.json"]
    for out in outs:
        out.parent.mkdir()
        out.write_text("old " + out.name)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITING_THE_REPORTS_RECORD, *map(str, outs)],
        env=env,
        timeout=120,
        capture_output=True,
    )
    assert proc.returncode == -9, proc.stderr
    assert any(p.name.endswith(".commit.part") for p in (tmp_path / "r").iterdir())
    aged = time.time() - 2 * DEAD_TEMP_AGE_S
    for p in tmp_path.rglob("*"):
        os.utime(p, (aged, aged))
    check_input_file(outs[1])  # (no sweep: what the roll-back itself removes)
    assert [p.read_text() for p in outs] == ["old q.onnx", "old q.calib.cache", "old rec.json"]
    assert [os.listdir(out.parent) for out in outs] == [["q.onnx"], ["q.calib.cache"], ["rec.json"]]
