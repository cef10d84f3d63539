"""`--help` of the encoder commands: every option says what it does."""

from __future__ import annotations

import click
import pytest

from trtforge.cli.main import cli

COMMANDS = ["optimize", "compile", "calibrate", "inspect", "report", "export-triton"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_says_what_it_does(name: str) -> None:
    """Before: `calibrate --help` listed --batch-size and `export-triton --help` --max-queue-delay-us with
    only their defaults, and --preferred-batch-size with only "Repeatable."."""
    command = cli.get_command(click.Context(cli), name)
    options = [p for p in command.params if isinstance(p, click.Option)]
    assert options
    assert [p.opts[-1] for p in options if len((p.help or "").replace("Repeatable.", "").strip()) < 8] == []
