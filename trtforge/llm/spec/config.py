"""The ``speculative=`` option: which proposer, how many tokens, checked once with a clear error."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from trtforge.errors import UserError, is_int

METHODS = ("ngram", "draft")
SPECULATIVE_KEYS = ("method", "num_tokens", "model", "prompt_lookup_min", "prompt_lookup_max", "num_blocks")
MAX_SPECULATIVE_TOKENS = 16
# how a refusal of the draft model starts (a command words it as its flag, --speculative-model)
DRAFT_REFUSAL = "speculative 'model' (the draft model): "


# the keys of one method that the other never reads ("model" has its own messages): given, they were
# ignored without a word (a draft's prompt_lookup_max=8, an ngram's num_blocks=64 changed nothing)
_NOT_FOR = {"ngram": ("num_blocks",), "draft": ("prompt_lookup_min", "prompt_lookup_max")}
_WHAT = {
    "num_blocks": "sizes the draft model's KV pool",
    "prompt_lookup_min": "is an n-gram length of prompt lookup (method 'ngram')",
    "prompt_lookup_max": "is an n-gram length of prompt lookup (method 'ngram')",
}


def _not_for(method: str, key: str) -> str:
    """Why `key` does not go with `method`."""
    other = "draft" if method == "ngram" else "ngram"
    return f"'{key}' {_WHAT[key]}: method '{method}' does not use it. Drop it, or use method '{other}'."


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding of one engine.

    - ``method``: "ngram" (prompt lookup: the continuation of the longest recent match of the
      sequence's last tokens in its own tokens) or "draft" (a second causal LM, ``model``);
    - ``num_tokens``: proposals per step and sequence (k; each verified row runs k+1 tokens);
    - ``model``: the draft model (a save_pretrained directory, an nn.Module or ``module:factory``),
      with the target's tokenizer (its vocabulary the target's or padded up to 1% smaller:
      :meth:`~trtforge.llm.spec.proposers.DraftModelProposer.check_target`); ``num_blocks``: its KV
      pool (default: the target's block count);
    - ``prompt_lookup_min`` / ``prompt_lookup_max``: the n-gram lengths tried, longest first.
    """

    method: str
    num_tokens: int = 4
    model: Any = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    num_blocks: int | None = None

    @classmethod
    def of(cls, value: Any) -> SpeculativeConfig | None:
        """The config of a ``speculative=`` value: None, a SpeculativeConfig or a dict of its fields
        (e.g. ``{"method": "draft", "model": DIR, "num_tokens": 4}``); UserError names what is wrong."""
        if value is None or isinstance(value, SpeculativeConfig):
            if value is not None:
                value.check()
            return value
        if not isinstance(value, dict):
            raise UserError(
                f"speculative must be None or a dict such as {{'method': 'ngram', 'num_tokens': 4}}, "
                f"got {type(value).__name__}"
            )
        unknown = sorted(set(value) - set(SPECULATIVE_KEYS))
        if unknown:
            raise UserError(
                f"speculative has unknown keys {unknown}; the keys are {', '.join(SPECULATIVE_KEYS)}"
            )
        if "method" not in value:
            raise UserError(f"speculative needs a 'method': one of {', '.join(METHODS)}")
        config = cls(**value)
        config.check()
        return config

    def check(self) -> None:
        def bad(what: str) -> UserError:
            return UserError(f"speculative {what}")

        if self.method not in METHODS:
            raise bad(f"'method' must be one of {', '.join(METHODS)}, got {self.method!r}")
        for name, low, high in (
            ("num_tokens", 1, MAX_SPECULATIVE_TOKENS),
            ("prompt_lookup_min", 1, 64),
            ("prompt_lookup_max", 1, 64),
        ):
            v = getattr(self, name)
            if not is_int(v) or not low <= v <= high:
                raise bad(f"'{name}' must be an integer in [{low}, {high}], got {v!r}")
            object.__setattr__(self, name, int(v))  # (frozen: the one normalisation, a NumPy integer's)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise bad(
                f"'prompt_lookup_min' ({self.prompt_lookup_min}) exceeds 'prompt_lookup_max' "
                f"({self.prompt_lookup_max})"
            )
        if self.method == "draft" and self.model is None:
            raise bad("method 'draft' needs a 'model': the draft model's directory (or nn.Module)")
        if (
            self.method == "draft"
            and isinstance(self.model, (str, os.PathLike))
            and not os.fspath(self.model)
        ):
            raise bad("'model' is an empty path (''); expected the draft model's directory (or nn.Module)")
        if self.method == "ngram" and self.model is not None:
            raise bad("method 'ngram' takes no 'model' (it proposes from the sequence's own tokens)")
        defaults = SpeculativeConfig(method="ngram")
        for name in _NOT_FOR[self.method]:  # (at its default value, nothing is lost)
            if getattr(self, name) != getattr(defaults, name):
                raise bad(_not_for(self.method, name))
        n = self.num_blocks
        if n is not None and (not is_int(n) or n < 1):
            raise bad(f"'num_blocks' must be None or an integer >= 1, got {n!r}")
        if n is not None:
            object.__setattr__(self, "num_blocks", int(n))

    def describe(self) -> dict[str, Any]:
        """What runs, for the engine's reported configuration (the model as its string form)."""
        out: dict[str, Any] = {"method": self.method, "num_tokens": self.num_tokens}
        if self.method == "draft":
            named = isinstance(self.model, (str, os.PathLike))
            out["model"] = str(self.model) if named else type(self.model).__name__
        else:
            out["prompt_lookup_min"] = self.prompt_lookup_min
            out["prompt_lookup_max"] = self.prompt_lookup_max
        return out
