"""Structured output: a request's ``response_format`` (JSON schema / any JSON) as a grammar over the
tokenizer's vocabulary, through xgrammar (the ``structured`` extra, imported lazily).

Each constrained request holds a :class:`GrammarMatcher`; per step :func:`batch_bitmask` packs every
row's allowed tokens into one int32 bitmask ``[rows, ceil(vocab/32)]`` (rows without a grammar allow
all), which the sampler applies to the logits on their device, and each sampled token then advances
its row's matcher. xgrammar rather than llguidance: both are maintained and install here, xgrammar's
bitmask layout is what vLLM and SGLang apply, and it compiles a schema once for every request using it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from trtforge.errors import UserError


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise UserError(
            "response_format (structured output) needs xgrammar: pip install 'trtforge[structured]'."
        ) from exc
    return xgrammar


class GrammarMatcher:
    """One request's position in its grammar: which tokens may come next, advanced token by token."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._m = matcher
        self.vocab_size = vocab_size

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write this request's allowed next tokens into row `row` of a host int32 bitmask."""
        import torch

        view = torch.from_numpy(bitmask)
        self._m.fill_next_token_bitmask(view, row)

    def accept(self, token: int) -> None:
        """Advance past `token`; a token the grammar forbids is an internal error (the mask prevents it)."""
        if not self._m.accept_token(int(token)):
            raise RuntimeError(f"the grammar rejected token {token} although the bitmask allowed it")

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its end (EOS) was accepted."""
        return bool(self._m.is_terminated())


class GrammarCompiler:
    """Compiles response formats for one tokenizer (cached per schema), makes a matcher per request.

    `vocab_size` is the model's (its logits' width), which may exceed the tokenizer's.
    """

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        xgr = _xgrammar()
        self.vocab_size = int(vocab_size)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        self._compiler = xgr.GrammarCompiler(info)
        self._xgr = xgr
        self._cache: dict[str, Any] = {}

    def _compiled(self, response_format: dict[str, Any]) -> Any:
        kind = response_format.get("type")
        if kind == "json_object":  # OpenAI's JSON mode: an object (xgrammar's builtin grammar is any value)
            key = json.dumps({"type": "object"})
        elif kind == "json_schema":
            key = json.dumps(response_format["json_schema"]["schema"], sort_keys=True)
        else:
            raise UserError(f"response_format type {kind!r} has no grammar (json_object or json_schema)")
        if key not in self._cache:
            try:
                compiled = self._compiler.compile_json_schema(key)
            except Exception as exc:  # xgrammar raises RuntimeError/ValueError for a schema it cannot use
                msg = f"response_format: the JSON schema cannot be compiled to a grammar: {exc}"
                raise UserError(msg) from exc
            self._cache[key] = compiled
        return self._cache[key]

    def matcher(self, response_format: dict[str, Any]) -> GrammarMatcher:
        """A fresh matcher at the start of `response_format`'s grammar."""
        return GrammarMatcher(self._xgr.GrammarMatcher(self._compiled(response_format)), self.vocab_size)


def batch_bitmask(matchers: Sequence[GrammarMatcher | None], vocab_size: int) -> np.ndarray | None:
    """The int32 bitmask ``[rows, ceil(vocab/32)]`` of one step (None when no row has a grammar)."""
    if all(m is None for m in matchers):
        return None
    mask = np.full((len(matchers), (vocab_size + 31) // 32), -1, dtype=np.int32)
    for row, m in enumerate(matchers):
        if m is not None:
            m.fill(mask, row)
    return mask
