"""The speculative-decoding flags shared by `trtforge generate` and `trtforge serve`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def speculative_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add --speculative-method, --speculative-model and --num-speculative-tokens to a command."""
    fn = click.option(
        "--num-speculative-tokens",
        "num_speculative_tokens",
        default=None,
        type=click.IntRange(1, 16),
        help="Tokens proposed per step and sequence, each verified in one target step (default 4).",
    )(fn)
    fn = click.option(
        "--speculative-model",
        "speculative_model",
        default=None,
        help="Draft model (save_pretrained directory or module:factory; the tokenizer of MODEL) for "
        "--speculative-method draft, which it implies.",
    )(fn)
    return click.option(
        "--speculative-method",
        "speculative_method",
        type=click.Choice(["ngram", "draft"]),
        default=None,
        help="Speculative decoding (torch executor): ngram (prompt lookup) or draft (a draft model). "
        "Greedy output is unchanged; sampled output keeps its distribution.",
    )(fn)


def speculative_config(method: str | None, model: str | None, num_tokens: int | None) -> dict | None:
    """The ``speculative=`` dict of the flags (None: off); UserError for flags that do not go together."""
    from trtforge.errors import UserError

    if method is None and model is not None:
        method = "draft"
    if method is None:
        if num_tokens is not None:
            raise UserError("--num-speculative-tokens needs --speculative-method (ngram or draft).")
        return None
    if method == "draft" and model is None:
        raise UserError("--speculative-method draft needs --speculative-model DIR (the draft model).")
    if method == "ngram" and model is not None:
        raise UserError("--speculative-model names a draft model; --speculative-method ngram uses none.")
    spec: dict[str, Any] = {"method": method, "num_tokens": num_tokens or 4}
    if model is not None:
        spec["model"] = _draft_source(model)
    return spec


def check_draft_tokenizer_option(spec: dict | None, tok: Any, tokenizer: str | None, model: str) -> None:
    """The draft's tokenizer against ``--tokenizer DIR``'s where MODEL has none of its own (module:factory,
    a directory without tokenizer files), before either model loads: a target directory's own tokenizer
    is compared with the draft's where the models load (:func:`trtforge.llm.text.check_draft_directories`),
    but the loader never sees --tokenizer, so without this a draft of another tokenizer ran, nearly every
    proposal rejected."""
    from trtforge.cli._options import arguments_as_flags
    from trtforge.llm.text import check_draft_against, has_tokenizer

    if spec is not None and tok is not None and tokenizer is not None and not has_tokenizer(model):
        with arguments_as_flags():  # (a refusal of the draft's tokenizer names --speculative-model)
            check_draft_against(tok, f"--tokenizer {tokenizer}", spec.get("model"))


def _draft_source(model: str) -> str:
    """`model` if it can name a draft model (a directory, or module:factory); else a UserError naming
    --speculative-model, before the target model loads (the loader's message named neither the flag
    nor, for '', the path given: it spoke of '.')."""
    from pathlib import Path

    from trtforge.errors import UserError

    expected = "expected the draft model's save_pretrained directory or module:factory"
    if not model:
        raise UserError(f"--speculative-model '': the path is empty; {expected}.")
    path = Path(model)
    if path.is_dir() or (":" in model and not path.exists()):
        return model
    what = "is a file" if path.exists() else "does not exist"
    raise UserError(f"--speculative-model '{model}' {what}; {expected}.")
