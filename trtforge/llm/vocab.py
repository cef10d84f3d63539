"""Two tokenizers compared id for id: which ids mean other tokens in one than in the other.

What an id means, not how text is split into ids, decides whether two tokenizers speak the same tokens:
a speculative draft reads the target's ids (:mod:`trtforge.llm.spec.tokenizers`), and the LLM report's
``--tokenizer`` must be the model's own (:mod:`trtforge.llm.report`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_REGULAR_MISMATCH", "Diff", "compare_vocabularies", "regular_size"]

# the share of the regular vocabulary whose ids may differ before the tokenizers count as different
# ones: two byte-level BPEs trained apart share only their byte tokens' ids (~94% differ at 4,096
# tokens), while a family's tokenizers differ in none or a few repaired entries
MAX_REGULAR_MISMATCH = 0.01


def _maps(tok: Any) -> tuple[dict[int, str], set[int]]:
    """(id -> token of the whole vocabulary, the ids of added tokens)."""
    by_id = {int(i): str(t) for t, i in tok.get_vocab().items()}
    added = {int(i) for i in getattr(tok, "added_tokens_decoder", {}) or {}}
    return by_id, added


def regular_size(tok: Any) -> int:
    """How many ids of `tok`'s vocabulary are regular (learned by its model, not added), at least 1: what
    :data:`MAX_REGULAR_MISMATCH` is a share of."""
    by_id, added = _maps(tok)
    return max(1, len(by_id) - len(added))


Diff = tuple[int, str | None, str | None]  # an id, its token in the target, in the draft (None: unused)


def compare_vocabularies(target: Any, draft: Any) -> tuple[list[Diff], list[Diff]]:
    """(regular, added): the ids whose tokens differ between two tokenizers, as (id, target token,
    draft token) (`target`: the reference one, `draft`: the other), None where one does not use the id.
    An id counts as added when it is an added token's in either tokenizer."""
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
