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

# the share of the regular vocabulary whose ids may differ before the tokenizers count as different
# ones: two byte-level BPEs trained apart share only their byte tokens' ids (~94% differ at 4,096
# tokens), while a family's tokenizers differ in none or a few repaired entries
MAX_REGULAR_MISMATCH = 0.01


class DraftTokenizerWarning(TrtforgeWarning):
    """The draft's tokenizer differs from the target's in added tokens only (or in a few tokens)."""


def _maps(tok: Any) -> tuple[dict[int, str], set[int]]:
    """(id -> token of the whole vocabulary, the ids of added tokens)."""
    by_id = {int(i): str(t) for t, i in tok.get_vocab().items()}
    added = {int(i) for i in getattr(tok, "added_tokens_decoder", {}) or {}}
    return by_id, added


Diff = tuple[int, str | None, str | None]  # an id, its token in the target, in the draft (None: unused)


def compare_vocabularies(target: Any, draft: Any) -> tuple[list[Diff], list[Diff]]:
    """(regular, added): the ids whose tokens differ between two tokenizers, as (id, target token,
    draft token), None where one does not use the id. An id counts as added when it is an added
    token's in either tokenizer."""
    t_map, t_added = _maps(target)
    d_map, d_added = _maps(draft)
    added_ids = t_added | d_added
    regular: list[Diff] = []
    added: list[Diff] = []
    for i in sorted(t_map.keys() | d_map.keys()):
        a, b = t_map.get(i), d_map.get(i)
        if a != b:
            (added if i in added_ids else regular).append((i, a, b))
    return regular, added


def _examples(diffs: list[Diff], n: int = 3) -> str:
    def shown(token: str | None) -> str:
        return "unused" if token is None else repr(token)

    return "; ".join(f"id {i} is {shown(a)} in the target, {shown(b)} in the draft" for i, a, b in diffs[:n])


def check_draft_tokenizer(target: Any, draft: Any, target_name: str, draft_name: str) -> None:
    """UserError when `draft` (a tokenizer) maps ids to other tokens than `target`; a
    :class:`DraftTokenizerWarning` when only added tokens (or a few regular ones) differ."""
    regular, added = compare_vocabularies(target, draft)
    t_map, t_added = _maps(target)
    size = max(1, len(t_map) - len(t_added))
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
