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
