"""Click options generated from the policy's option dataclasses, so every command shows the same
flags, help and defaults as the API (`trtforge.core.policy`, `trtforge.compiler.build`), and what the
commands share about reading them: which options were given, the token-id prompt files.

    @option_group(PassOptions, only=("attention", "verify"))
    def cmd(attention, verify): opts = from_params(PassOptions, locals())
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import click
from click.core import ParameterSource


def _click_type(meta: Mapping[str, Any], default: Any) -> Any:
    if "choices" in meta:
        return click.Choice(list(meta["choices"]))
    if "min" in meta or "max" in meta:
        kind = click.FloatRange if isinstance(meta.get("min", meta.get("max")), float) else click.IntRange
        return kind(meta.get("min"), meta.get("max"))
    if meta.get("path"):
        return click.Path(dir_okay=False)
    return None


def _option(f: dataclasses.Field, meta: Mapping[str, Any], scope: str) -> Callable[[Any], Any]:
    flags = meta["flags"]
    default = f.default
    is_bool = isinstance(default, bool)
    kw: dict[str, Any] = {"help": scope + meta["help"]}
    if meta.get("multiple"):
        kw.update(multiple=True)
    elif is_bool and "/" not in flags[0]:
        kw.update(is_flag=True, default=default)
    else:
        kw.update(default=default, show_default=default is not None)
    kind = _click_type(meta, default)
    if kind is not None:
        kw["type"] = kind
    if "metavar" in meta:
        kw["metavar"] = meta["metavar"]
    return click.option(*flags, f.name, **kw)


def option_group(
    cls: type,
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    flags: Mapping[str, tuple[str, ...]] | None = None,
    scope: str = "",
    more_help: Mapping[str, str] | None = None,
) -> Callable[[Any], Any]:
    """Click options for the CLI fields of dataclass `cls` (parameter name = field name, default = the
    field's); `flags` renames a field's option for one command, `scope` prefixes every help text,
    `more_help` adds to a field's help what the option means in this command only."""
    wanted = set(only) if only is not None else None
    fields = [
        f
        for f in dataclasses.fields(cls)
        if "cli" in f.metadata and (wanted is None or f.name in wanted) and f.name not in set(exclude)
    ]
    if wanted is not None and wanted - {f.name for f in fields}:
        raise ValueError(f"{cls.__name__} has no CLI fields {sorted(wanted - {f.name for f in fields})}")

    def apply(command: Any) -> Any:
        for f in reversed(fields):
            meta = dict(f.metadata["cli"])
            if flags and f.name in flags:
                meta["flags"] = flags[f.name]
            if more_help and f.name in more_help:
                meta["help"] = f"{meta['help']} {more_help[f.name]}"
            if "secondary" in meta:
                off = f"{scope}Turn {meta['flags'][0]} off."
                command = click.option(meta["secondary"], f"no_{f.name}", is_flag=True, help=off)(command)
            command = _option(f, meta, scope)(command)
        return command

    return apply


def from_params(cls: type, params: Mapping[str, Any], **overrides: Any) -> Any:
    """Build `cls` from a command's parameters: empty repeatable options fall back to the field default,
    comma lists are split, a `--no-X` secondary flag sets X to None."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("cli")
        if meta is None or f.name not in params:
            continue
        value = params[f.name]
        if meta.get("multiple"):
            value = list(value) if value else f.default
        if meta.get("csv") and isinstance(value, str):
            value = [p.strip() for p in value.split(",") if p.strip()]
        if "secondary" in meta and params.get(f"no_{f.name}"):
            value = None
        values[f.name] = value
    return cls(**(values | overrides))


def flags_of(command: click.Command) -> dict[str, str]:
    """Each option of `command` by its parameter name (the API's keyword argument of the same name): its
    flag, the longest spelling."""
    return {p.name: max(p.opts, key=len) for p in command.params if p.opts and p.name}


def given_flags(ctx: click.Context, names: Iterable[str]) -> list[str]:
    """The flags (longest spelling) of those parameters in `names` the user set (on the command line or
    through the environment, not by default): what a command refuses by name when they do not apply."""
    flags = flags_of(ctx.command)
    return [
        flags.get(name, name)
        for name in names
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)
    ]


def read_prompt_ids(path: str) -> list[list[int]]:
    """A --calib-data prompt file (`compile --generate`, `generate`, `serve`): one prompt per line,
    space-separated token ids. A file that holds no prompt is refused: calibrating on nothing would
    silently fall back to random tokens (fp8) or to no calibration at all. So is one of more than
    :data:`trtforge.llm.prompts.MAX_CALIB_PROMPTS` prompts (the API's calib_prompts limit too), as soon
    as its line past them is read (not after reading a dataset of millions into memory): the user picks
    which to calibrate on."""
    from pathlib import Path

    from trtforge.errors import UserError
    from trtforge.llm.prompts import MAX_CALIB_PROMPTS, too_many_prompts

    expected = "expected a text file with one prompt per line as space-separated token ids"
    if not str(path):
        raise UserError(f"--calib-data '': the path is empty; {expected}.")
    prompts: list[list[int]] = []
    try:
        # UTF-8 whatever the locale; a BOM (Notepad's) is no part of the first id ("\ufeff1" was refused)
        with Path(path).open(encoding="utf-8-sig") as f:
            for line in f:
                if not line.strip():
                    continue
                if len(prompts) == MAX_CALIB_PROMPTS:
                    raise too_many_prompts(
                        f"--calib-data '{path}'",
                        None,
                        f"pass a file of at most that many, e.g. `head -n {MAX_CALIB_PROMPTS} {path}`",
                    )
                prompts.append([int(t) for t in line.split()])
    except (OSError, ValueError) as e:
        raise UserError(f"--calib-data '{path}': {expected} ({e}).") from e
    if not prompts:
        raise UserError(f"--calib-data '{path}' holds no prompts (it is empty or blank); {expected}.")
    return prompts


def fields_of(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as keyword arguments (shallow: values are passed as they are)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def passes_from_params(params: Mapping[str, Any], no_passes: bool | None = None) -> Any:
    """PassOptions from a command's parameters, or None for `--no-passes` (which refuses pass options;
    `no_passes` None: the command has no such flag).

    A --passes that names no pass (``--passes ""``, ``--passes ,``) is refused: it ran nothing and wrote
    the graph unfused, as though fusion had been asked for."""
    from trtforge.core.policy import PassOptions, changed, flag

    opts = from_params(PassOptions, params)
    if not no_passes and opts.names is not None and not opts.names:
        from trtforge.errors import UserError, shown
        from trtforge.passes.pipeline import DEFAULT_PASSES, PASSES

        skip = (
            "--no-passes skips fusion"
            if no_passes is not None
            else "for a precision conversion with no fusion, run --passes cleanup"
        )
        raise UserError(
            f"--passes {shown(params.get('names'))} names no pass; expected a comma-separated list of "
            f"passes among {', '.join(sorted(PASSES))} (default: the full pipeline, "
            f"{','.join(DEFAULT_PASSES)}); {skip}."
        )
    if not no_passes:
        return opts
    given = changed(opts, [f.name for f in dataclasses.fields(opts)])
    if given:
        names = ", ".join(flag(PassOptions, n, getattr(opts, n)) for n in given)
        raise click.UsageError(f"--no-passes cannot be combined with {names}: no fusion pass runs.")
    return None


# `name=value` as an API message writes a keyword argument (one inside a call's parentheses is Python
# the user could run, `from_pretrained(model_dir, kv_cache_dtype='fp8')`, and stays: see as_flags)
_KEYWORD = re.compile(r"(?<![\w-])([a-z][a-z0-9_]*)=('[^']*'|\"[^\"]*\"|[\w.+-]+)")
# a bare API argument name: only those with an underscore (`tensor_parallel_size`), because a plain word
# (executor, device) is as often prose as an argument
_NAME = re.compile(r"(?<![\w.-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w=(])")


def as_flags(message: str, flags: Mapping[str, str]) -> str:
    """`message`, an API refusal naming its keyword arguments, worded with the command's flags: the
    argument ``tensor_parallel_size`` of a ``--tensor-parallel-size`` option becomes the flag,
    ``executor='torch'`` becomes ``--executor torch``; a name the command has no option for stays."""

    def keyword(m: re.Match[str]) -> str:
        flag = flags.get(m[1])
        before = m.string[: m.start()]
        if flag is None or before.count("(") > before.count(")"):  # no option, or an argument of a call
            return m[0]
        return f"{flag} {m[2].strip(chr(39) + chr(34))}"

    text = _KEYWORD.sub(keyword, message)
    text = _NAME.sub(lambda m: flags.get(m[1], m[1]), text)
    return re.sub(r"(--[a-z][\w-]*(?: [^\s()]+)?) \(\1\)", r"\1", text)  # "kv_cache_dtype (--kv-cache-dtype)"


@contextlib.contextmanager
def arguments_as_flags() -> Iterator[None]:
    """Around an API call a command makes with its options as keyword arguments (`llm.load`,
    `from_pretrained`): a UserError naming those arguments is worded with the command's flags instead
    (:func:`as_flags`), so `trtforge generate --tensor-parallel-size 3` is told about
    ``--tensor-parallel-size``, not ``tensor_parallel_size``. The exception keeps its type: only its
    message changes."""
    from trtforge.errors import UserError

    try:
        yield
    except UserError as e:
        ctx = click.get_current_context(silent=True)
        if ctx is None or len(e.args) != 1 or not isinstance(e.args[0], str) or str(e) != e.args[0]:
            raise
        flags = flags_of(ctx.command)
        text = as_flags(e.args[0], flags)
        from trtforge.llm.spec.config import DRAFT_REFUSAL  # (the draft model's refusal names speculative=)

        if text.startswith(DRAFT_REFUSAL) and "speculative_model" in flags:
            text = f"{flags['speculative_model']}: {text.removeprefix(DRAFT_REFUSAL)}"
        e.args = (text,)
        raise
