"""Two writers of one group of outputs at once (two compiles to the same engine, two optimizes to the same
model and its data file, two reports into one directory), and a reader while a writer publishes: the
group on disk is always one run's, whole, and a reader sees it before or after a publish, never half.

Each test stops writer A right after the first rename of its group (so no timing decides the order),
runs B to its end or until it waits for A's lock (seen in /proc/locks), then lets A finish. Before
directory_lock, B's group landed between A's renames: the engine of one run beside the manifest of the
other, one run's model with the other's data file, a report whose half-written directory B deleted."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trtforge._fileio import (
    atomic_outputs,
    atomic_write_bytes,
    atomic_write_text,
    directory_lock,
    recover_staged_directory,
    sha256_bytes,
    staged_directory,
)
from trtforge.core.manifest import publish_engine, read_engine, read_manifest, verify_engine_file
from trtforge.runtime.standin import standin_manifest

OLD, ENGINE_A, ENGINE_B = b"old engine" * 10, b"engine of run A" * 11, b"engine of run B, longer" * 12


class _Pause:
    """Stops thread "A" at a chosen point (`here()`) until `release()`."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()

    def here(self) -> None:
        if threading.current_thread().name == "A" and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(60), "never released"

    def after_rename_onto(self, monkeypatch, dest: Path) -> _Pause:
        """Pause thread A right after its os.replace onto `dest` (the first rename of its group)."""
        real = os.replace

        def replace(src, dst, *args, **kwargs):
            real(src, dst, *args, **kwargs)
            if Path(dst) == dest:
                self.here()

        monkeypatch.setattr(os, "replace", replace)
        return self


def _waits_on_a_lock(pid: int | None = None) -> bool:
    """Whether process `pid` (a thread of this one by default) is blocked in flock (a '->' line of
    /proc/locks)."""
    pid = os.getpid() if pid is None else pid
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    return any("->" in line and f" {pid} " in line for line in lines)


def _race(pause: _Pause, first: Callable[[], object], second: Callable[[], object]) -> list[object]:
    """Run `first` in thread A up to its pause, then `second` in thread B until it ends or waits for a
    lock, then release A; return both results (an exception is re-raised)."""
    results: dict[str, object] = {}

    def run(name: str, fn: Callable[[], object]) -> threading.Thread:
        def body() -> None:
            try:
                results[name] = fn()
            except BaseException as e:  # (re-raised in the test's thread below)
                results[name] = e

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        return t

    a = run("A", first)
    assert pause.reached.wait(60), "writer A never reached its pause"
    b = run("B", second)
    deadline = time.monotonic() + 20  # (only where /proc/locks is missing: B waits this long)
    while b.is_alive() and not _waits_on_a_lock() and time.monotonic() < deadline:
        time.sleep(0.005)
    pause.go.set()
    a.join(60)
    b.join(60)
    assert not a.is_alive() and not b.is_alive(), "a writer hung"
    for r in results.values():
        if isinstance(r, BaseException):
            raise r
    return [results["A"], results["B"]]


def test_two_groups_into_one_directory_land_one_after_the_other(tmp_path, monkeypatch) -> None:
    """optimize's model and data file, calibrate's model and cache: two runs' groups never mix."""
    a, b = tmp_path / "m.onnx.data", tmp_path / "m.onnx"
    pause = _Pause().after_rename_onto(monkeypatch, a)

    def write(run: str) -> Callable[[], None]:
        def go() -> None:
            with atomic_outputs():
                atomic_write_text(a, f"data of {run}")
                atomic_write_text(b, f"model of {run}")

        return go

    _race(pause, write("A"), write("B"))
    assert (a.read_text(), b.read_text()) == ("data of B", "model of B")  # A's whole, then B's whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def _manifest(path: Path, data: bytes):
    m = standin_manifest(streams=1)
    m.engine_file, m.engine_bytes, m.engine_sha256 = path.name, len(data), sha256_bytes(data)
    return m


def test_two_compiles_to_one_engine_leave_one_runs_pair(tmp_path, monkeypatch) -> None:
    out = tmp_path / "m.engine"
    publish_engine(out, OLD, _manifest(out, OLD))
    pause = _Pause().after_rename_onto(monkeypatch, out)
    _race(
        pause,
        lambda: publish_engine(out, ENGINE_A, _manifest(out, ENGINE_A)),
        lambda: publish_engine(out, ENGINE_B, _manifest(out, ENGINE_B)),
    )
    assert verify_engine_file(out, read_manifest(out)) == ENGINE_B  # (was: B's engine, A's manifest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.engine", "m.engine.json"]


def test_a_reader_sees_a_publish_whole_not_the_new_engine_with_the_old_manifest(
    tmp_path, monkeypatch
) -> None:
    """rt.load, inspect, report and export-triton read the pair by read_engine: one that read between
    a compile's two renames refused the (sound) engine as "does not match its manifest"."""
    out = tmp_path / "m.engine"
    publish_engine(out, OLD, _manifest(out, OLD))
    pause = _Pause().after_rename_onto(monkeypatch, out)
    _, (manifest, data) = _race(
        pause, lambda: publish_engine(out, ENGINE_A, _manifest(out, ENGINE_A)), lambda: read_engine(out)
    )
    assert data == ENGINE_A and manifest.engine_sha256 == sha256_bytes(ENGINE_A)


def test_a_reader_still_refuses_an_engine_that_does_not_match_its_manifest(tmp_path) -> None:
    from trtforge.errors import UserError

    out = tmp_path / "m.engine"
    publish_engine(out, OLD, _manifest(out, OLD))
    out.write_bytes(ENGINE_A)
    with pytest.raises(UserError, match=r"engine '.*m\.engine' does not match its manifest"):
        read_engine(out)


@pytest.mark.parametrize("force", [False, True])
def test_a_compile_without_force_leaves_an_output_another_run_wrote_meanwhile(tmp_path, force) -> None:
    """Two `compile ... -o m.engine` (no --force) at once: both found no m.engine when they started, and
    the second to finish replaced the first one's pair (and --save-onnx) without a word. Checked again at
    the commit point now: the later one is refused and leaves the other run's outputs as they are."""
    from trtforge.compiler.session import CompileSession
    from trtforge.errors import UserError

    out, onnx = tmp_path / "m.engine", tmp_path / "m.onnx"
    session = CompileSession(out, save_onnx=onnx, force=force)  # (checked: nothing there yet)
    with atomic_outputs():  # another compile publishes meanwhile
        atomic_write_text(onnx, "graph of run A")
        publish_engine(out, ENGINE_A, _manifest(out, ENGINE_A))

    def publish() -> None:
        with session:
            session.publish(ENGINE_B, _manifest(out, ENGINE_B), lambda p: atomic_write_text(p, "graph of B"))

    if force:
        publish()
    else:
        with pytest.raises(UserError, match=r"output '.*m\.engine' was written by another run .* --force"):
            publish()
    engine = ENGINE_B if force else ENGINE_A
    assert verify_engine_file(out, read_manifest(out)) == engine
    assert onnx.read_text() == ("graph of B" if force else "graph of run A")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.engine", "m.engine.json", "m.onnx"]


def test_two_writers_of_one_staged_directory_take_turns(tmp_path) -> None:
    """Two `report -o rep` at once: the second one's recovery removed the first one's half-written
    directory (the staged names were fixed), whose swap then failed (FileNotFoundError). Each writes its
    own directory now and they swap one after the other: the last to finish (A, released after B) wins,
    whole, and nothing is left beside it."""
    rep = tmp_path / "rep"
    pause = _Pause()

    def write(run: str) -> Callable[[], None]:
        def go() -> None:
            with staged_directory(rep) as d:
                (d / "report.json").write_text(run)
                pause.here()
                (d / "report.md").write_text(run)

        return go

    _race(pause, write("A"), write("B"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]
    assert [(p.name, p.read_text()) for p in sorted(rep.iterdir())] == [
        ("report.json", "A"),
        ("report.md", "A"),
    ]


def test_a_staged_write_does_not_lock_its_directory_while_it_writes(tmp_path) -> None:
    """Before: staged_directory held its parent's lock for the whole write (a report: minutes), so an
    `inspect` or `rt.load` of an engine beside the report, or a compile publishing there, waited for the
    report to finish. The parent is locked only for the recovery and the swap now."""
    took = threading.Event()

    def reader() -> None:
        with directory_lock([tmp_path], shared=True):
            took.set()

    with staged_directory(tmp_path / "rep") as d:
        (d / "report.json").write_text("{}")
        t = threading.Thread(target=reader, daemon=True)
        t.start()
        assert took.wait(20), "a reader of the directory waited for the staged write"
        t.join(20)
        recover_staged_directory(tmp_path / "rep")  # another writer's recovery leaves ours be
        assert (d / "report.json").read_text() == "{}"
    assert (tmp_path / "rep" / "report.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def _external_model(directory: Path, scale: float, *, bias_first: bool) -> tuple[bytes, bytes, list]:
    """The tiny model with its weights times `scale` in m.onnx.data (bias stored first or last, so the two
    versions' offsets differ): the .onnx bytes, the data bytes and the weights."""
    import onnx
    from onnx import numpy_helper

    from tests.models import tiny_onnx

    model = onnx.load(str(tiny_onnx(directory / "src.onnx")))
    weights = [numpy_helper.to_array(t) * scale for t in model.graph.initializer]
    names = [t.name for t in model.graph.initializer]
    order = [1, 0] if bias_first else [0, 1]
    del model.graph.initializer[:]
    model.graph.initializer.extend(numpy_helper.from_array(weights[i], names[i]) for i in order)
    onnx.save(
        model, str(directory / "m.onnx"), save_as_external_data=True, location="m.onnx.data", size_threshold=0
    )
    return (directory / "m.onnx").read_bytes(), (directory / "m.onnx.data").read_bytes(), weights


def test_a_reader_of_a_model_with_external_data_sees_one_version(tmp_path, monkeypatch) -> None:
    """optimize renames OUT.onnx.data, then OUT.onnx: a reader between the two read the old model's
    offsets into the new data file, wrong weights without any error."""
    import numpy as np
    from onnx import numpy_helper

    from trtforge.core.onnx_io import load_onnx

    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "out").mkdir()
    old_model, old_data, _ = _external_model(tmp_path / "old", 1.0, bias_first=False)
    new_model, new_data, new_weights = _external_model(tmp_path / "new", -2.0, bias_first=True)
    model, data = tmp_path / "out" / "m.onnx", tmp_path / "out" / "m.onnx.data"
    model.write_bytes(old_model)
    data.write_bytes(old_data)
    pause = _Pause().after_rename_onto(monkeypatch, data)

    def publish() -> None:
        with atomic_outputs():
            atomic_write_bytes(data, new_data)
            atomic_write_bytes(model, new_model)

    _, read = _race(pause, publish, lambda: load_onnx(model))
    got = {t.name: numpy_helper.to_array(t) for t in read.graph.initializer}
    assert set(got) == {"W", "b"}
    for name, want in zip(("W", "b"), new_weights):
        np.testing.assert_array_equal(got[name], want)


# Runs `trtforge ARGV...` with os.replace stopping after its rename onto the path in TRTFORGE_TEST_PAUSE
# until the file CTL/go exists (CTL/reached, with CTL the TRTFORGE_TEST_CTL directory, says it is there).
_PAUSED_CLI = """
import os, runpy, sys, time
from pathlib import Path
stop, ctl, real = Path(os.environ["TRTFORGE_TEST_PAUSE"]), Path(os.environ["TRTFORGE_TEST_CTL"]), os.replace
def replace(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if Path(dst) == stop and not (ctl / "reached").exists():
        (ctl / "reached").touch()
        while not (ctl / "go").exists():
            time.sleep(0.01)
os.replace = replace
sys.argv = ["trtforge", *sys.argv[1:]]
runpy.run_module("trtforge.cli.main", run_name="__main__")
"""


@pytest.mark.trt_build
def test_two_compile_commands_to_one_engine_leave_a_matching_pair(tmp_path) -> None:
    """`trtforge compile a.onnx -o m.engine` and `trtforge compile b.onnx -o m.engine --force` at once:
    the second one's pair landed between the first one's two renames (b's engine, a's manifest)."""
    import subprocess
    import sys

    from tests.compiler.test_kill import _compile, _env
    from tests.models import tiny_onnx

    a, b = tiny_onnx(tmp_path / "a.onnx"), tiny_onnx(tmp_path / "b.onnx", dynamic_batch=False)
    out = tmp_path / "out" / "m.engine"
    out.parent.mkdir()
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    env = dict(_env(tmp_path / "tmpa"), TRTFORGE_TEST_PAUSE=str(out), TRTFORGE_TEST_CTL=str(ctl))
    argv = ["compile", str(a), "-o", str(out), "--no-passes", "-q", "--force"]
    first = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not (ctl / "reached").exists():
        assert first.poll() is None, first.communicate()[0]
        assert time.monotonic() < deadline, "the first compile never published"
        time.sleep(0.05)
    second = _compile(b, out, _env(tmp_path / "tmpb"), "-q", "--force")
    while second.poll() is None and not _waits_on_a_lock(second.pid):
        assert time.monotonic() < deadline, "the second compile neither ended nor waited"
        time.sleep(0.05)
    (ctl / "go").touch()
    logs = [p.communicate(timeout=240)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], logs
    manifest, _ = read_engine(out)  # (was: "does not match its manifest")
    assert "b.onnx" in json.dumps(manifest.source), manifest.source  # the second one's, which landed last
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.engine", "m.engine.json"]
