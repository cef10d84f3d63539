"""Whether a draft model speaks the target's tokens: their tokenizers compared id for id.

A draft model proposes token ids that the target verifies. Verification keeps the output exact
whatever the draft proposes, so a draft trained on another tokenizer of the same vocabulary size
runs, and is slower than no draft at all: its id 300 means another string than the target's, nearly
every proposal is rejected. The vocabulary size alone does not tell; the id -> token maps do.

What matters is what each id means, not how text is split into ids (the draft never tokenizes: it
reads the target's ids), so the maps are compared, not the merges or normalizers:

- the regular vocabulary (the tokens the tokenizer's model learned) differs in more than
  :data:`MAX_REGULAR_MISMATCH` of its ids: another tokenizer, refused (:class:`UserError`);
- only added tokens differ (special and chat tokens a family's instruct or code sibling adds, ids the
  other leaves unused or names otherwise), or a handful of regular ones: a legitimate pair whose
  proposals miss only around those tokens, accepted with a :class:`DraftTokenizerWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

from trtforge.errors import TrtforgeWarning, UserError
from trtforge.llm.vocab import MAX_REGULAR_MISMATCH, Diff, compare_vocabularies, regular_size


class DraftTokenizerWarning(TrtforgeWarning):
    """The draft's tokenizer differs from the target's in added tokens only (or in a few tokens)."""


def _examples(diffs: list[Diff], n: int = 3) -> str:
    def shown(token: str | None) -> str:
        return "unused" if token is None else repr(token)

    return "; ".join(f"id {i} is {shown(a)} in the target, {shown(b)} in the draft" for i, a, b in diffs[:n])


def check_draft_tokenizer(target: Any, draft: Any, target_name: str, draft_name: str) -> None:
    """UserError when `draft` (a tokenizer) maps ids to other tokens than `target`; a
    :class:`DraftTokenizerWarning` when only added tokens (or a few regular ones) differ."""
    regular, added = compare_vocabularies(target, draft)
    size = regular_size(target)
    pair = f"the speculative draft model '{draft_name}' and the target '{target_name}'"
    if len(regular) > MAX_REGULAR_MISMATCH * size:
        raise UserError(
            f"{pair} have different tokenizers: {len(regular)} of the target's {size} regular token "
            f"ids mean other tokens in the draft's ({_examples(regular)}). The draft's proposals would "
            "mean other text and be rejected (the output stays exact, only slower); a draft model must "
            "share the target's tokenizer."
        )
    if regular or added:
        diffs = regular + added
        warnings.warn(
            f"{pair} have tokenizers that differ at {len(diffs)} id(s) ({len(added)} of added or special "
            f"tokens; {_examples(diffs)}); proposals around those tokens will be rejected.",
            DraftTokenizerWarning,
            stacklevel=4,
        )
