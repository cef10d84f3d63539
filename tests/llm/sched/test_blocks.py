"""Block manager: allocation on append, freeing, prefix sharing by digest, copy-on-write, waste accounting."""

from __future__ import annotations

import random

import pytest

from trtforge.errors import UserError
from trtforge.llm.sched.blocks import BlockManager, NoFreeBlocksError


def test_append_allocates_on_demand_and_free_returns_everything():
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.allocate("a", [1, 2, 3, 4, 5]) == 0
    slots, copies = bm.append_slots("a", [1, 2, 3, 4, 5])
    assert copies == []
    table = bm.block_table("a")
    assert len(table) == 2
    assert slots == [table[0] * 4 + i for i in range(4)] + [table[1] * 4]
    stats = bm.memory_stats()
    assert (stats.used_blocks, stats.free_blocks, stats.tokens_held, stats.waste_slots) == (2, 6, 5, 3)
    slots, _ = bm.append_slots("a", [6, 7, 8])
    assert slots == [table[1] * 4 + i for i in (1, 2, 3)]
    assert bm.memory_stats().waste_slots == 0
    bm.append_slots("a", [9])
    assert len(bm.block_table("a")) == 3
    bm.check_invariants()
    bm.free("a")
    assert bm.num_free_blocks == 8
    bm.check_invariants()


def test_pool_exhaustion_raises_and_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    bm.allocate("a", [0] * 8)
    bm.append_slots("a", [0] * 8)
    bm.allocate("b", [1])
    with pytest.raises(NoFreeBlocksError):
        bm.append_slots("b", [1])
    assert bm.num_tokens("b") == 0 and bm.block_table("b") == []
    bm.check_invariants()


def test_prefix_blocks_are_shared_only_after_they_are_computed():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(10))
    bm.allocate("a", prompt)
    bm.append_slots("a", prompt)
    assert bm.allocate("b", [*prompt, 99]) == 0, "blocks not yet written must not be shared"
    bm.free("b")
    bm.mark_computed("a", len(prompt))
    assert bm.allocate("c", [*prompt, 99]) == 8
    assert bm.block_table("c") == bm.block_table("a")[:2]
    # an identical prompt leaves its last token to run (it needs logits), so at most the full blocks before it
    assert bm.allocate("d", list(range(8))) == 4
    stats = bm.memory_stats()
    assert stats.used_blocks == 3, "a's 3 blocks; c and d hold a's first blocks by reference"
    bm.check_invariants()


def test_freed_prefix_stays_cached_until_evicted():
    bm = BlockManager(num_blocks=4, block_size=4)
    prompt = list(range(9))
    bm.allocate("a", prompt)
    bm.append_slots("a", prompt)
    bm.mark_computed("a", 9)
    bm.free("a")
    stats = bm.memory_stats()
    assert stats.free_blocks == 4 and stats.cached_free_blocks == 2
    assert bm.free_blocks_needed(prompt) == 3
    assert bm.allocate("b", prompt) == 8
    bm.free("b")
    # a different sequence that needs every block evicts the cached ones
    bm.allocate("c", [7] * 16)
    bm.append_slots("c", [7] * 16)
    bm.free("c")
    assert bm.allocate("d", prompt) == 0
    bm.check_invariants()


def test_digest_covers_every_earlier_token():
    bm = BlockManager(num_blocks=16, block_size=2)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.append_slots("a", [1, 2, 3, 4, 5])
    bm.mark_computed("a", 5)
    # same second block, different first block: no hit at all
    assert bm.allocate("b", [9, 9, 3, 4, 5]) == 0
    assert bm.allocate("c", [1, 2, 8, 8, 5]) == 2


def test_fork_shares_blocks_and_copies_the_partial_block_on_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("p", [1, 2, 3, 4, 5, 6])
    bm.append_slots("p", [1, 2, 3, 4, 5, 6])
    bm.fork("p", "c")
    assert bm.memory_stats().used_blocks == 2
    slots, copies = bm.append_slots("c", [7])
    parent, child = bm.block_table("p"), bm.block_table("c")
    assert child[0] == parent[0] and child[1] != parent[1]
    assert copies == [(parent[1], child[1])]
    assert slots == [child[1] * 4 + 2]
    slots, copies = bm.append_slots("p", [8])
    assert copies == [] and slots == [parent[1] * 4 + 2], "the parent is now the only owner"
    bm.check_invariants()
    bm.free("p")
    bm.free("c")
    assert bm.num_free_blocks == 8


def test_random_workload_keeps_invariants():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=40, block_size=4)
    live: dict[int, int] = {}
    for step in range(600):
        op = rng.random()
        if op < 0.3 and len(live) < 12:
            sid = step
            prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
            bm.allocate(sid, prompt)
            try:
                bm.append_slots(sid, prompt[bm.num_tokens(sid) :])
            except NoFreeBlocksError:
                bm.free(sid)
                continue
            bm.mark_computed(sid, len(prompt))
            live[sid] = len(prompt)
        elif op < 0.8 and live:
            sid = rng.choice(list(live))
            try:
                bm.append_slots(sid, [rng.randrange(3)])
                bm.mark_computed(sid, bm.num_tokens(sid))
            except NoFreeBlocksError:
                bm.free(sid)
                del live[sid]
        elif live:
            sid = rng.choice(list(live))
            bm.free(sid)
            del live[sid]
        bm.check_invariants()
        stats = bm.memory_stats()
        assert stats.waste_slots <= len(live) * (bm.block_size - 1)
    for sid in list(live):
        bm.free(sid)
    assert bm.num_free_blocks == 40


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": 0, "block_size": 4},
        {"num_blocks": 4, "block_size": 0},
        # (before: True passed isinstance(value, int) and made a pool of one block, or blocks of one token)
        {"num_blocks": True, "block_size": 4},
        {"num_blocks": 4, "block_size": True},
    ],
)
def test_bad_configuration_is_a_user_error(kwargs):
    with pytest.raises(UserError, match="must be a positive integer"):
        BlockManager(**kwargs)


def test_sizes_take_numpy_integers_as_every_integer_option_does():
    """errors.is_int, the API's one rule for an integer option: SchedulerConfig refused np.int64 sizes
    ("must be an integer in [1, 65,536], got 4") that the executors take; both store Python ints."""
    import numpy as np

    from trtforge.llm import SchedulerConfig

    config = SchedulerConfig(
        max_num_seqs=np.int64(4), max_prefill_chunk=np.int32(8), max_model_len=np.int64(32)
    )
    config.validate()
    assert (config.max_num_seqs, config.max_prefill_chunk, config.max_model_len) == (4, 8, 32)
    assert all(type(v) is int for v in (config.max_num_seqs, config.max_prefill_chunk, config.max_model_len))
    bm = BlockManager(num_blocks=np.int64(8), block_size=np.int64(4))
    assert (type(bm.num_blocks), type(bm.block_size), bm.num_free_blocks) == (int, int, 8)


def test_a_prefix_being_computed_is_reported_in_flight_until_written_or_dropped():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(10))
    bm.allocate("a", prompt)
    bm.append_slots("a", prompt)
    assert bm.prefix_in_flight([*prompt, 5])
    assert not bm.prefix_in_flight([9, *prompt])
    bm.mark_computed("a", 10)
    assert not bm.prefix_in_flight([*prompt, 5]) and bm.allocate("b", [*prompt, 5]) == 8
    bm.allocate("c", [7] * 9)
    bm.append_slots("c", [7] * 9)
    assert bm.prefix_in_flight([7] * 12)
    bm.free("c")  # a failed step frees its sequences: nothing stays in flight or cached
    assert not bm.prefix_in_flight([7] * 12) and bm.allocate("d", [7] * 12) == 0
    bm.check_invariants()


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_placeholder_token_enters_no_digest_until_its_value_is_filled(fast_path):
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = [1, 2, 3, 4, 5, 6, 7]
    bm.allocate("a", prompt)
    bm.append_slots("a", prompt)
    bm.mark_computed("a", 7)
    # slot 7 completes the second block with a token still being sampled
    slot = bm.append_token("a", None) if fast_path else bm.append_slots("a", [None])[0][0]
    assert slot == bm.block_table("a")[1] * 4 + 3
    bm.mark_computed("a", 8)
    bm.check_invariants()
    assert bm.allocate("b", [1, 2, 3, 4, 5, 6, 7, 0, 9]) == 4, "a block holding a placeholder was cached"
    assert not bm.prefix_in_flight([1, 2, 3, 4, 5, 6, 7, 8, 9])
    with pytest.raises(ValueError, match="fill_token it first"):
        bm.append_slots("a", [9])
    assert bm.append_token("a", 9) is None  # the fast path declines too
    bm.fill_token("a", 8)
    bm.fill_token("a", 99)  # nothing pending any more: no change
    bm.check_invariants()
    assert bm.allocate("c", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8, "the filled, computed block is shared"
    assert bm.allocate("d", [1, 2, 3, 4, 5, 6, 7, 99, 9]) == 4
    bm.append_slots("a", [9])
    bm.fill_token("zzz", 1)  # a sequence holding no blocks (freed meanwhile): no-op
    for s in "abcd":
        bm.free(s)
    bm.check_invariants()
    assert bm.num_free_blocks == 16


def test_a_placeholder_freed_before_its_value_arrives_leaves_nothing_behind():
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.allocate("a", [1, 2, 3])
    bm.append_slots("a", [1, 2, 3])
    bm.mark_computed("a", 3)
    bm.append_slots("a", [None])
    bm.mark_computed("a", 4)
    bm.free("a")
    bm.fill_token("a", 4)
    bm.check_invariants()
    assert bm.memory_stats().cached_free_blocks == 1  # only the full block of known tokens
    assert bm.allocate("b", [1, 2, 3, 4, 5]) == 2
