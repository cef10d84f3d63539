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


def test_compile_calib_data_help_says_what_it_is_with_generate() -> None:
    """Before: compile's --calib-data help named only the encoder path's data (.npz, sentences.txt, ...),
    nothing of the token-id prompt file --generate reads, nor that only int8/fp8 take it there."""
    command = cli.get_command(click.Context(cli), "compile")
    (option,) = [p for p in command.params if p.name == "calib_data"]
    assert ".npz" in option.help and "sentences.txt" in option.help  # (the encoder path's, as before)
    generate = option.help[option.help.index("With --generate") :]
    assert "token-id prompts" in generate and "int8" in generate and "fp8" in generate
    assert "refused" in generate
    # (the other commands keep the shared text)
    calibrate = cli.get_command(click.Context(cli), "calibrate")
    assert all("--generate" not in (p.help or "") for p in calibrate.params if p.name == "calib_data")


def test_help_says_what_happens_without_the_option() -> None:
    """Before: calibrate wrote OUTPUT.calib.cache without --calib-cache, which its help did not say;
    --speculative-model alone speculates with the draft (method implied), which its help did not say
    either; and `trtforge --help` described generate without the TensorRT step engine it also runs."""

    def help_of(command: str, name: str) -> str:
        (param,) = [p for p in cli.get_command(click.Context(cli), command).params if p.name == name]
        return " ".join(param.help.split())

    assert "Default: OUTPUT's name ending .calib.cache" in help_of("calibrate", "calib_cache")
    assert "Default" not in help_of("compile", "calib_cache")  # (compile writes none unasked)
    for command in ("generate", "serve"):
        assert "--speculative-method draft, which it implies" in help_of(command, "speculative_model")
    top = " ".join(cli.get_help(click.Context(cli, info_name="trtforge")).split())
    assert "a step engine (TensorRT)" in top


def test_the_same_option_is_spelled_the_same_on_every_command() -> None:
    """Before: report's output directory was only -o/--out-dir (every other command: -o/--output) and
    calibrate's --quiet had no -q (compile's: -q/--quiet); `--output DIR` or `-q` copied from one
    command to the other was 'No such option'."""
    spelled: dict[str, set[str]] = {}
    for name in [*COMMANDS, "generate", "serve"]:
        for param in cli.get_command(click.Context(cli), name).params:
            if isinstance(param, click.Option) and ({"-o", "-q"} & set(param.opts)):
                key = "-o" if "-o" in param.opts else "-q"
                spelled.setdefault(key, set()).add(name)
                assert {"-o": "--output", "-q": "--quiet"}[key] in param.opts, (name, param.opts)
    assert spelled["-o"] == {"optimize", "compile", "calibrate", "report", "export-triton"}
    assert spelled["-q"] >= {"compile", "calibrate"}


def test_every_command_shows_its_examples_after_its_options() -> None:
    """Before: `inspect -h` printed its examples above the options (in the docstring); every other
    command's follow the options, in the epilog."""
    for name in [*COMMANDS, "generate", "serve"]:
        command = cli.get_command(click.Context(cli), name)
        assert "Examples:" in (command.epilog or ""), name
        assert "Examples:" not in (command.help or ""), name
