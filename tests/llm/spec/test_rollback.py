"""Rolling back rejected proposals in the block manager: blocks freed or reused, never leaked."""

from __future__ import annotations

import pytest

from trtforge.llm.sched.blocks import BlockManager


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_truncate_frees_the_blocks_past_the_kept_tokens_and_reuses_the_last(prefix_caching):
    bm = BlockManager(8, 4, enable_prefix_caching=prefix_caching)
    bm.allocate("a", list(range(6)))
    bm.append_slots("a", list(range(6)))
    bm.mark_computed("a", 6)
    slots, _ = bm.append_slots("a", [10, 11, 12, 13, 14])  # last token + 4 proposals: 11 tokens, 3 blocks
    assert bm.num_free_blocks == 5
    bm.truncate("a", 7)  # one proposal accepted
    bm.check_invariants()
    assert bm.num_tokens("a") == 7 and bm.num_free_blocks == 6
    again, _ = bm.append_slots("a", [99])  # the next token reuses the rejected proposal's slot
    assert again == [slots[1]]
    bm.check_invariants()
    bm.free("a")
    bm.check_invariants()
    assert bm.num_free_blocks == 8


def test_truncate_refuses_to_cut_into_cached_blocks():
    bm = BlockManager(8, 4)
    bm.allocate("a", list(range(9)))
    bm.append_slots("a", list(range(9)))
    bm.mark_computed("a", 9)  # blocks 0 and 1 are offered to the prefix cache
    with pytest.raises(ValueError, match="cached"):
        bm.truncate("a", 7)
    bm.truncate("a", 8)
    bm.check_invariants()
    bm.free("a")
    assert bm.num_free_blocks == 8
