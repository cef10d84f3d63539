"""run_cli's exit codes: interrupts are 130/143 in every stage, never 1; an exception raised in the
user's own code is exit 2 naming where; a trtforge bug stays exit 1 with its trace."""

from __future__ import annotations

import importlib
import signal
import sys
import time

import click
import pytest

from trtforge.cli._errors import EXIT_SIGINT, EXIT_SIGTERM, Terminated, run_cli


def _group(fn) -> click.Group:
    @click.group()
    def cli() -> None:
        pass

    @cli.command("go")
    def go() -> None:
        fn()

    return cli


@pytest.mark.parametrize(("exc", "code"), [(KeyboardInterrupt, EXIT_SIGINT), (Terminated, EXIT_SIGTERM)])
def test_interrupt_in_any_stage_is_130_or_143(exc, code, capsys) -> None:
    def stage() -> None:
        raise exc()

    assert run_cli(_group(stage), ["go"]) == code
    assert "Traceback" not in capsys.readouterr().err


def test_sigterm_is_raised_as_terminated_while_a_command_runs(capsys) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert run_cli(_group(lambda: signal.raise_signal(signal.SIGTERM)), ["go"]) == EXIT_SIGTERM
    assert "terminated" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # restored afterwards


def test_exception_from_user_code_is_exit_2_naming_it(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "user_helpers_mod.py").write_text("def work():\n    return {}['missing']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    work = importlib.import_module("user_helpers_mod").work
    assert run_cli(_group(work), ["go"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "your code raised KeyError: 'missing'" in err and "user_helpers_mod.py:2 in work" in err


def test_trtforge_bug_stays_internal_error_with_trace(capsys) -> None:
    from trtforge.core.shapes import format_range

    assert run_cli(_group(lambda: format_range(None)), ["go"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error" in err


def test_error_inside_a_compiled_extension_is_not_blamed_on_the_user(capsys, monkeypatch) -> None:
    """numpy's Cython frames carry relative file names (`numpy/random/_common.pyx`): a failure there under
    trtforge's own code is trtforge's (exit 1 with the trace), not 'your code raised'."""
    import numpy as np

    from trtforge.numerics import feeds

    monkeypatch.setattr(feeds, "MAX_FEED_BYTES", 2**80)  # let numpy itself fail the allocation
    rng = np.random.default_rng(0)
    assert run_cli(_group(lambda: feeds.synthetic_array("x", np.float32, (10**5,) * 3, rng)), ["go"]) == 1
    err = capsys.readouterr().err
    assert "_common.pyx" in err and "your code raised" not in err and "internal error" in err


class _InterruptedFinalizer:
    """Garbage whose finalizer is running when the signal arrives (a closed engine, a weight loader's
    thread pool being collected)."""

    def __init__(self, signum: int | None) -> None:
        self.signum = signum

    def __del__(self) -> None:
        import os
        import time

        if self.signum is not None:
            os.kill(os.getpid(), self.signum)
            time.sleep(0.05)  # (the handler runs here, in the finalizer)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, EXIT_SIGINT), (signal.SIGTERM, EXIT_SIGTERM)])
def test_an_interrupt_swallowed_by_a_finalizer_still_stops_the_command(signum, code, capsys) -> None:
    """Python ignores an exception raised inside __del__ or a weakref callback ("Exception ignored
    in ..."): a Ctrl-C that landed there was lost, the run went on to its end and wrote its outputs,
    then exited 130. It is raised again where the command's own code runs."""
    done: list[int] = []

    def work() -> None:
        for i in range(40):  # 2 s of the command's own work
            _InterruptedFinalizer(signum if i == 3 else None)
            time.sleep(0.05)
            done.append(i)

    assert run_cli(_group(work), ["go"]) == code
    assert len(done) <= 5, f"the command ran on after the signal: {len(done)} of 40 steps"
    assert "Exception ignored" not in capsys.readouterr().err


def _import_module_that_signals(tmp_path, monkeypatch, name: str, body: str):
    """A command that imports a fresh module `name` (top-level code `body`), then works 2 s."""
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delitem(sys.modules, name, raising=False)
    done: list[int] = []

    def work() -> None:
        importlib.import_module(name)
        for i in range(40):
            time.sleep(0.05)
            done.append(i)

    return work, done


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, EXIT_SIGINT), (signal.SIGTERM, EXIT_SIGTERM)])
def test_an_interrupt_inside_an_import_is_raised_once_the_import_ends(
    tmp_path, monkeypatch, signum, code, capsys
) -> None:
    """A native extension's initialization calls back into Python (torch's does, importing its Python
    half); an exception thrown through it aborted the process (SIGABRT from pybind11, or SIGSEGV),
    instead of exit 130/143 after the cleanup. The interrupt waits for the import, then stops the
    command before its own work goes on."""
    body = (
        "import os, time\n"
        f"os.kill(os.getpid(), {int(signum)})\n"
        "time.sleep(0.2)\n"  # the handler runs in here: inside the import
        "COMPLETE = True\n"
    )
    work, done = _import_module_that_signals(tmp_path, monkeypatch, "signals_at_import_mod", body)
    assert run_cli(_group(work), ["go"]) == code
    assert getattr(sys.modules.get("signals_at_import_mod"), "COMPLETE", False), "the import was cut short"
    assert len(done) <= 1, f"the command ran on after the import: {len(done)} of 40 steps"
    assert "Traceback" not in capsys.readouterr().err


def test_a_second_interrupt_inside_an_import_is_raised_at_once(tmp_path, monkeypatch, capsys) -> None:
    """A user's module doing long work at import time stays interruptible: the second Ctrl-C stops it."""
    body = (
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.1)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(3)\n"
        "COMPLETE = True\n"
    )
    work, done = _import_module_that_signals(tmp_path, monkeypatch, "signals_twice_at_import_mod", body)
    t = time.monotonic()
    assert run_cli(_group(work), ["go"]) == EXIT_SIGINT
    assert time.monotonic() - t < 1.5 and not done
    assert not getattr(sys.modules.get("signals_twice_at_import_mod"), "COMPLETE", False)


def test_no_timer_is_left_to_interrupt_the_cleanup(tmp_path, monkeypatch) -> None:
    """The interrupt raised by a second signal cancels the first one's timer: the cleanup after it
    (finally blocks, rollbacks) is not interrupted a second time."""
    body = "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.05)\n" + (
        "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(1)\n"
    )
    work, _ = _import_module_that_signals(tmp_path, monkeypatch, "signals_cleanup_mod", body)
    cleaned: list[bool] = []

    def command() -> None:
        try:
            work()
        finally:
            time.sleep(0.1)  # 10 timer periods
            cleaned.append(True)

    assert run_cli(_group(command), ["go"]) == EXIT_SIGINT
    assert cleaned == [True]


def test_a_native_crash_prints_where_it_happened(tmp_path) -> None:
    """A segfault inside a native library ends the process by the signal, which nothing can turn into an
    exit code; the Python stack of each thread is on stderr, so the report names where it crashed."""
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "crashing_factory_mod.py").write_text(
        "import ctypes\n\ndef make():\n    return ctypes.string_at(0)  # a native crash\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{root}")
    proc = subprocess.run(
        [sys.executable, "-m", "trtforge.cli.main", "compile", "crashing_factory_mod:make", "-o", "x.engine"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-2000:])
    assert "Segmentation fault" in proc.stderr and "crashing_factory_mod.py" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.engine").exists()


@pytest.mark.parametrize(
    "write",
    [
        "click.echo('line ' * 10_000)",  # click catches the EPIPE itself (it exited 1, no message)
        "print('line')",  # buffered until run_cli's last flush (Python's 'Exception ignored', exit 120)
    ],
)
def test_a_reader_gone_from_stdout_is_a_quiet_exit_141(write) -> None:
    """`trtforge generate ... | head -1`: once the reader has what it wanted and closed the pipe, the
    command stops quietly with a unix tool's SIGPIPE exit code (128 + 13), never exit 1 without a word."""
    import subprocess
    from pathlib import Path

    script = (
        "import sys, time, click\nfrom trtforge.cli._errors import run_cli\n"
        "@click.group()\ndef cli():\n    pass\n"
        f"@cli.command('go')\ndef go():\n    time.sleep(0.2)\n    {write}\n"
        "sys.exit(run_cli(cli, ['go']))\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""


def test_an_eof_error_is_not_hidden_as_aborted(capsys) -> None:
    """click turns any EOFError (a truncated file read deep inside a library) into Abort: it printed only
    'aborted', exit 1 and no trace, so neither the user nor a bug report said what had failed."""

    from trtforge.core import shapes

    def eof(*_args: object) -> None:
        raise EOFError("No data left in file")

    eof.__code__ = eof.__code__.replace(co_filename=shapes.__file__)  # raised inside trtforge: its bug
    assert run_cli(_group(eof), ["go"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "EOFError: No data left in file" in err and "internal error" in err
    assert "aborted" not in err


def test_ctrl_c_before_the_command_handlers_are_set_is_130_without_a_traceback(monkeypatch, capsys) -> None:
    """Ctrl-C landing while main() imports its error handling (the first ~50 ms of a run) was a
    KeyboardInterrupt traceback; nothing is written by then, so it is a plain 130."""
    from trtforge.cli.main import main

    class Interrupting:
        def find_spec(self, name, path=None, target=None):
            if name == "trtforge.cli._errors":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "trtforge.cli._errors")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert main(["inspect", "m.engine"]) == EXIT_SIGINT
    assert capsys.readouterr().err.strip() == "interrupted"


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("argv", [["--json"], []], ids=["json", "tables"])
def test_a_full_standard_output_is_named(tmp_path, argv) -> None:
    """Before: `trtforge inspect m.onnx --json > /dev/full` said "error: cannot use '?': No space left on
    device" (an OSError of sys.stdout names no file)."""
    import os
    import subprocess
    from pathlib import Path

    from tests.models import tiny_onnx

    model = tiny_onnx(tmp_path / "m.onnx")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "trtforge.cli.main", "inspect", str(model), *argv],
            env=env,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "error: cannot write the standard output: No space left on device.\n"
