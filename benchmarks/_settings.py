"""Module settings a benchmark sets from its command line (--ab, --set): parsed, put in force, restored.

A setting is ``base`` (nothing changed) or ``module.NAME=value`` assignments joined by ``+``, e.g.
``decode_attention.FP8_V_PAIRS=False`` or ``trtforge.llm.quant.linear.FP8_FAST_ACCUM=True``.
"""

from __future__ import annotations

import argparse
import contextlib


def parse_setting(text: str) -> dict[tuple[str, str], object]:
    """A module setting (--ab, --set): ``base`` (nothing changed) or ``module.NAME=value`` assignments
    joined by ``+``, each an upper-case setting of a module of ``trtforge.kernels``
    (``decode_attention.FP8_V_PAIRS=False``) or of any trtforge module named in full
    (``trtforge.llm.quant.linear.FP8_FAST_ACCUM=True``); the value a Python literal. Anything else:
    ``argparse.ArgumentTypeError`` saying what (the caller names its option)."""
    import ast
    import importlib

    if text == "base":
        return {}
    out: dict[tuple[str, str], object] = {}
    for part in text.split("+"):
        target, eq, value = part.partition("=")
        mod, dot, name = target.strip().rpartition(".")
        if not (eq and dot and name.isupper()):
            raise argparse.ArgumentTypeError(f"base or module.NAME=value joined by '+', not {part!r}")
        full = mod if mod.startswith("trtforge.") else f"trtforge.kernels.{mod}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as exc:
            raise argparse.ArgumentTypeError(f"no module {full}") from exc
        if not hasattr(module, name):
            raise argparse.ArgumentTypeError(f"{full} has no setting {name}")
        try:
            out[(full, name)] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError) as exc:
            raise argparse.ArgumentTypeError(f"{name}: {value.strip()!r} is not a Python literal") from exc
    return out


def set_setting(setting: dict[tuple[str, str], object]) -> None:
    """Put the module settings of `setting` (:func:`parse_setting`) in force."""
    import importlib

    for (mod, name), value in setting.items():
        setattr(importlib.import_module(mod), name, value)


@contextlib.contextmanager
def applied(setting: dict[tuple[str, str], object]):
    """Module settings of `setting` (:func:`parse_setting`) in force inside the block, restored after."""
    import importlib

    old = {key: getattr(importlib.import_module(key[0]), key[1]) for key in setting}
    try:
        set_setting(setting)
        yield
    finally:
        set_setting(old)


def add_set_option(ap: argparse.ArgumentParser) -> None:
    """``--set SETTING``: module settings for a benchmark's whole run (:func:`parse_setting`'s form)."""
    ap.add_argument(
        "--set",
        dest="settings",
        default=None,
        metavar="SETTING",
        help="module settings for the whole run, put in force before the model and executor exist (so "
        "graphs capture under them): module.NAME=value joined by '+', e.g. "
        "trtforge.llm.executors.fused_layers.FUSED_FP8_QUANT=False; kept in the JSON",
    )


def apply_set_option(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """Put ``--set``'s settings in force (a bad one: the parser's usage error, exit 2); return the text."""
    if args.settings:
        try:
            set_setting(parse_setting(args.settings))
        except argparse.ArgumentTypeError as exc:
            ap.error(f"--set {args.settings!r}: {exc}")
    return args.settings
