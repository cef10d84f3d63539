"""Every `trtforge ...` command line the README and the commands' `--help` show parses as written:
its options exist on that command and take the values shown (choices, numbers), so a renamed or
removed option cannot stay documented. Parsing only (click's make_context): nothing runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from trtforge.cli.main import COMMANDS, cli

README = Path(__file__).resolve().parents[2] / "README.md"
# a file name a documented line passes (optimize's MODEL must exist to parse): made empty in the test's cwd
FILE_ARG = re.compile(r"^[\w./-]+\.(onnx|engine|npz|txt|jinja|json|pt2)$")


def _joined(lines: list[str]) -> list[str]:
    """`lines` with backslash continuations joined and shell comments dropped."""
    out: list[str] = []
    for line in lines:
        text = line.split("  #")[0].rstrip()
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + text.strip()
        else:
            out.append(text.strip())
    return out


def readme_lines() -> list[str]:
    """The README's `trtforge COMMAND ...` lines: those of its code blocks and its inline code spans."""
    text = README.read_text(encoding="utf-8")
    found: list[str] = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        found += [line for line in _joined(block.splitlines()) if line.startswith("trtforge ")]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`(trtforge [^`]+)`", prose):
        if len(span.split()) > 2:  # (a bare `trtforge generate` names the command; it is no command line)
            found.append(" ".join(span.split()).replace(",...", ""))
    return [line for line in found if line.split()[1] in COMMANDS and "..." not in line and " | " not in line]


def help_lines() -> list[str]:
    """The example lines of `trtforge --help` and of every command's `--help`."""
    texts = [cli.get_help(click.Context(cli, info_name="trtforge"))]
    for name in COMMANDS:
        command = cli.get_command(click.Context(cli), name)
        texts.append(command.get_help(click.Context(command, info_name=f"trtforge {name}")))
    found: list[str] = []
    for text in texts:
        found += [line for line in _joined(text.splitlines()) if line.startswith("trtforge ")]
    return [line for line in found if line.split()[1] in COMMANDS]


def _variants(line: str) -> list[list[str]]:
    """The argv lists `line` stands for: each `[...]` part taken, each `a|b|c` value tried in turn."""
    args = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
    alternatives = [i for i, a in enumerate(args) if "|" in a and not a.startswith("-")]
    if not alternatives:
        return [args]
    i = alternatives[0]
    return [[*args[:i], choice, *args[i + 1 :]] for choice in args[i].split("|")]


def _parse(line: str, where: Path) -> None:
    for argv in _variants(line):
        for arg in argv:
            if FILE_ARG.match(arg) and not (where / arg).exists():
                (where / arg).parent.mkdir(parents=True, exist_ok=True)
                (where / arg).write_bytes(b"")
        name, rest = argv[0], argv[1:]
        command = cli.get_command(click.Context(cli), name)
        try:
            command.make_context(f"trtforge {name}", list(rest))
        except click.ClickException as e:
            pytest.fail(f"documented `{line}` does not parse ({' '.join(argv)}): {e.format_message()}")


def test_the_readme_and_help_show_commands() -> None:
    """The extraction itself finds what it should (else the tests below would check nothing)."""
    readme, shown = readme_lines(), help_lines()
    assert len(readme) >= 20 and {line.split()[1] for line in readme} >= {"compile", "generate", "serve"}
    assert len(shown) >= 30 and {line.split()[1] for line in shown} == set(COMMANDS)


@pytest.mark.parametrize("line", readme_lines())
def test_a_readme_command_line_parses(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _parse(line, tmp_path)


@pytest.mark.parametrize("line", help_lines())
def test_a_help_example_parses(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _parse(line, tmp_path)


def test_every_flag_the_readme_names_exists() -> None:
    """A flag named anywhere in the README's prose (`--max-num-seqs`, `--calib-data`, ...) is an option
    of some command (or of the test suite's own pytest options, tests/conftest.py), so a renamed one is
    caught even where no full command line shows it."""
    conftest = (README.parent / "tests" / "conftest.py").read_text(encoding="utf-8")
    known = {"--help", *re.findall(r'addoption\(\s*"(--[a-z][a-z0-9-]*)"', conftest)}
    for name in COMMANDS:
        for param in cli.get_command(click.Context(cli), name).params:
            known.update(param.opts, getattr(param, "secondary_opts", ()))
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", README.read_text(encoding="utf-8")))
    assert len(named) > 40 and sorted(named - known) == []
