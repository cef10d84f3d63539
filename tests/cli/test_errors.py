"""run_cli's exit codes: interrupts are 130/143 in every stage, never 1; an exception raised in the
user's own code is exit 2 naming where; a trtforge bug stays exit 1 with its trace."""

from __future__ import annotations

import importlib
import signal
import sys

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
    import time

    done: list[int] = []

    def work() -> None:
        for i in range(40):  # 2 s of the command's own work
            _InterruptedFinalizer(signum if i == 3 else None)
            time.sleep(0.05)
            done.append(i)

    assert run_cli(_group(work), ["go"]) == code
    assert len(done) <= 5, f"the command ran on after the signal: {len(done)} of 40 steps"
    assert "Exception ignored" not in capsys.readouterr().err
