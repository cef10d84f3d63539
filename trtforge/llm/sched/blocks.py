"""Paged KV-cache block manager: one pool of block ids, per-sequence block tables, shared prefixes.

Bookkeeping over block ids (no tensors): the executor owns the pools ``[num_blocks, block_size, Hkv, D]``
and this module decides which slot each new token's K/V goes to. Each block table is mirrored in a
row of one int32 matrix, so a step's tables come out in one gather. Full blocks are identified by a
chained SHA-256 of their token ids (the digest of a block covers every token before it), so
sequences whose prompts start alike share those blocks, counted by reference. A block freed with a
digest stays in an evictable LRU cache until its slot is needed, so a later prompt can reuse it.
Writes into a block another sequence also holds (after :meth:`BlockManager.fork`) copy it first.

A slot may be reserved for a token whose value is not known yet (``None``: a token still being
sampled on the device, under asynchronous scheduling); :meth:`BlockManager.fill_token` gives the
value later. Digests cover known values only, so such a placeholder never reaches the prefix cache.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trtforge.errors import TrtforgeError, UserError, is_int

_ROOT_DIGEST = b"trtforge-kv-root"


class NoFreeBlocksError(TrtforgeError):
    """The pool has no block left for a request; the scheduler preempts a sequence and retries."""


@dataclass(frozen=True)
class MemoryStats:
    """Pool occupancy: blocks referenced by a sequence, free (cached or not), and slots wasted; with the
    real bytes a block takes over every layer's K and V (``block_bytes``, 0 where unknown) and the
    cache's element type (``kv_dtype``, e.g. "bfloat16" or "float8_e4m3fn"); ``graph_bytes``: GPU memory
    the pool's sizing set aside for the executor's CUDA graphs (0 where none was)."""

    total_blocks: int
    used_blocks: int
    free_blocks: int
    cached_free_blocks: int
    block_size: int
    tokens_held: int
    waste_slots: int
    block_bytes: int = 0
    kv_dtype: str = ""
    graph_bytes: int = 0

    @property
    def usage(self) -> float:
        """Fraction of the pool's blocks that a live sequence references."""
        return self.used_blocks / self.total_blocks

    @property
    def bytes_per_token(self) -> float:
        """K/V bytes one token takes over every layer."""
        return self.block_bytes / self.block_size

    @property
    def total_bytes(self) -> int:
        """Bytes of the blocks the block manager hands out."""
        return self.total_blocks * self.block_bytes

    @property
    def used_bytes(self) -> int:
        """Bytes of the blocks live sequences reference."""
        return self.used_blocks * self.block_bytes


@dataclass(slots=True)
class _Table:
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    computed_tokens: int = 0
    registered: int = 0
    pending: bool = False  # the last slot's token is not known yet (`tokens` lacks it)
    row: int = -1  # this table's row of BlockManager._rows (its blocks, then zeros)


def _chain_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


class BlockManager:
    """Allocates pool blocks to sequences on append and frees them on finish, sharing full prefix blocks.

    Slots are ``block_id * block_size + offset``. Only blocks whose K/V an executor has written
    (:meth:`mark_computed`) are offered to other sequences, so a failed step never leaves a cached
    block that holds garbage.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        if not is_int(num_blocks) or num_blocks < 1:
            raise UserError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if not is_int(block_size) or block_size < 1:
            raise UserError(f"block_size must be a positive integer, got {block_size!r}")
        self.num_blocks = num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.enable_prefix_caching = enable_prefix_caching
        self._refcount = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._digest_of: dict[int, bytes] = {}
        self._cached: dict[bytes, int] = {}
        self._inflight: dict[bytes, int] = {}
        self._tables: dict[Hashable, _Table] = {}
        self._rows = np.zeros((8, 16), dtype=np.int32)  # grown on demand
        self._free_rows: list[int] = list(range(7, -1, -1))

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references (never used, or cached and evictable)."""
        return len(self._free) + len(self._evictable)

    def has_sequence(self, seq_id: Hashable) -> bool:
        return seq_id in self._tables

    def block_table(self, seq_id: Hashable) -> list[int]:
        """The physical block ids of `seq_id`, in logical order (a copy)."""
        return list(self._table(seq_id).blocks)

    def block_table_view(self, seq_id: Hashable) -> Sequence[int]:
        """The block ids of `seq_id` without copying; valid until the next change to that sequence."""
        return self._table(seq_id).blocks

    def block_table_array(self, seq_ids: Sequence[Hashable], width: int) -> np.ndarray:
        """int32 ``[len(seq_ids), width]``: the block ids of each sequence, zero-padded (a fresh array).

        `width` must be at least the longest of the tables (a shorter one would cut them).
        """
        tables = self._tables
        return self._rows[[tables[s].row for s in seq_ids], :width]

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._table(seq_id).num_tokens

    def blocks_for(self, num_tokens: int) -> int:
        """How many blocks hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def _prefix_hits(self, token_ids: Sequence[int]) -> tuple[list[int], bool]:
        """Cached blocks matching the leading full blocks of `token_ids`, stopping at the first miss,
        and whether that miss is a block some sequence is computing in the current step.

        The last token is never covered, so a prompt always has at least one token to run and
        produce logits from.
        """
        if not self.enable_prefix_caching:
            return [], False
        hits: list[int] = []
        parent = _ROOT_DIGEST
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            parent = _chain_digest(parent, token_ids[i * bs : (i + 1) * bs])
            block = self._cached.get(parent)
            if block is None:
                return hits, parent in self._inflight
            hits.append(block)
        return hits, False

    def prefix_in_flight(self, token_ids: Sequence[int]) -> bool:
        """True when the next full block of `token_ids` beyond the cached ones is being computed now.

        A scheduler defers such a prompt by a step to share that block instead of computing it twice.
        """
        return self._prefix_hits(token_ids)[1]

    def free_blocks_needed(self, token_ids: Sequence[int]) -> int:
        """Free-pool blocks that admitting a prompt of `token_ids` consumes (new blocks + evictable hits)."""
        hits, _ = self._prefix_hits(token_ids)
        revived = sum(1 for b in hits if self._refcount[b] == 0)
        return self.blocks_for(len(token_ids)) - len(hits) + revived

    def memory_stats(self) -> MemoryStats:
        """Blocks used/free/total and waste: allocated slots that hold no token (each block counted once)."""
        filled: dict[int, int] = {}
        for t in self._tables.values():
            for i, b in enumerate(t.blocks):
                n = min(self.block_size, t.num_tokens - i * self.block_size)
                filled[b] = max(filled.get(b, 0), n)
        held = sum(filled.values())
        used = self.num_blocks - self.num_free_blocks
        return MemoryStats(
            total_blocks=self.num_blocks,
            used_blocks=used,
            free_blocks=self.num_free_blocks,
            cached_free_blocks=len(self._evictable),
            block_size=self.block_size,
            tokens_held=held,
            waste_slots=used * self.block_size - held,
        )

    # ---- mutation ------------------------------------------------------------------------------
    def _table(self, seq_id: Hashable) -> _Table:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise KeyError(f"sequence {seq_id!r} holds no blocks") from None

    def _new_table(self, seq_id: Hashable, table: _Table) -> None:
        """Register `table` under `seq_id` and give it a matrix row holding its blocks."""
        if not self._free_rows:
            n = self._rows.shape[0]
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
            self._free_rows.extend(range(2 * n - 1, n - 1, -1))
        table.row = self._free_rows.pop()
        self._tables[seq_id] = table
        self._sync_row(table, 0)

    def _sync_row(self, table: _Table, start: int) -> None:
        """Copy ``table.blocks[start:]`` into its matrix row (widening the matrix when it is too narrow)."""
        end = len(table.blocks)
        if end > self._rows.shape[1]:
            wider = np.zeros((self._rows.shape[0], max(end, 2 * self._rows.shape[1])), dtype=np.int32)
            wider[:, : self._rows.shape[1]] = self._rows
            self._rows = wider
        if end == start + 1:
            self._rows[table.row, start] = table.blocks[start]
        elif end > start:
            self._rows[table.row, start:end] = table.blocks[start:]

    def _take_block(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            digest = self._digest_of.pop(block)
            if self._cached.get(digest) == block:
                del self._cached[digest]
        else:
            raise NoFreeBlocksError(f"all {self.num_blocks} KV blocks are in use")
        self._refcount[block] = 1
        return block

    def _ref(self, block: int) -> None:
        if self._refcount[block] == 0:
            del self._evictable[block]
        self._refcount[block] += 1

    def _unref(self, block: int) -> None:
        self._refcount[block] -= 1
        assert self._refcount[block] >= 0, f"block {block} released more often than taken"
        if self._refcount[block] == 0:
            if block in self._digest_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def allocate(self, seq_id: Hashable, prompt_ids: Sequence[int]) -> int:
        """Start `seq_id`: share the cached leading full blocks of `prompt_ids`; return the tokens they cover.

        The remaining prompt tokens get slots through :meth:`append_slots` (a chunk at a time).
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        hits, _ = self._prefix_hits(prompt_ids)
        table = _Table()
        parent = _ROOT_DIGEST
        for b in hits:
            self._ref(b)
            parent = self._digest_of[b]
            table.blocks.append(b)
            table.digests.append(parent)
        cached = len(hits) * self.block_size
        table.num_tokens = table.computed_tokens = cached
        table.registered = len(hits)
        table.tokens = list(prompt_ids[:cached])
        self._new_table(seq_id, table)
        return cached

    def append_slots(
        self, seq_id: Hashable, token_ids: Sequence[int | None]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Reserve one slot per token of `token_ids` at the end of `seq_id`; return (slots, block copies).

        A copy ``(src, dst)`` must be done by the executor before it writes the slots: it is the
        copy-on-write of a partly filled last block another sequence still references. On
        :class:`NoFreeBlocksError` nothing changes. The last token may be None: not known yet
        (:meth:`fill_token` gives it).
        """
        table = self._table(seq_id)
        if table.pending:
            raise ValueError(f"sequence {seq_id!r} has a token without a value; fill_token it first")
        if len(token_ids) == 1:
            slot = self.append_token(seq_id, token_ids[0])
            if slot is not None:
                return [slot], []
        bs = self.block_size
        n_new = len(token_ids)
        have = len(table.blocks) * bs
        need_blocks = self.blocks_for(table.num_tokens + n_new) - len(table.blocks)
        last = table.blocks[-1] if table.blocks else None
        cow = last is not None and table.num_tokens < have and n_new > 0 and self._refcount[last] > 1
        if need_blocks + int(cow) > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"sequence {seq_id!r} needs {need_blocks + int(cow)} more KV blocks, "
                f"{self.num_free_blocks} are free"
            )
        copies: list[tuple[int, int]] = []
        first_changed = len(table.blocks)
        if cow:
            new = self._take_block()
            self._unref(last)
            table.blocks[-1] = new
            copies.append((last, new))
            first_changed -= 1
        for _ in range(need_blocks):
            table.blocks.append(self._take_block())
        self._sync_row(table, first_changed)
        start = table.num_tokens
        slots = [table.blocks[p // bs] * bs + p % bs for p in range(start, start + n_new)]
        table.num_tokens += n_new
        if n_new and token_ids[-1] is None:
            table.pending = True
            token_ids = token_ids[:-1]
        table.tokens.extend(int(t) for t in token_ids)
        if self.enable_prefix_caching:
            self._add_digests(table)
        return slots, copies

    def append_token(self, seq_id: Hashable, token_id: int | None) -> int | None:
        """The decode fast path of :meth:`append_slots`: the slot of one token that fits the sequence's
        own, not yet full last block; None (and no change) when a new block or a copy is needed.
        `token_id` None reserves the slot of a token whose value :meth:`fill_token` gives later."""
        table = self._tables.get(seq_id)
        if table is None:
            raise KeyError(f"sequence {seq_id!r} holds no blocks")
        blocks, n = table.blocks, table.num_tokens
        bs = self.block_size
        have = len(blocks) * bs
        if n >= have or self._refcount[blocks[-1]] != 1 or table.pending:
            return None  # (a pending table: append_slots raises)
        table.num_tokens = n + 1
        if token_id is None:
            table.pending = True
            return blocks[-1] * bs + n % bs
        table.tokens.append(int(token_id))
        if self.enable_prefix_caching and n + 1 == have:
            self._add_digests(table)
        return blocks[-1] * bs + n % bs

    def fill_token(self, seq_id: Hashable, token_id: int) -> None:
        """Give the value of `seq_id`'s last token, reserved with None; a no-op when none is pending
        (or the sequence holds no blocks). Digests the block it completes; caches it if computed."""
        table = self._tables.get(seq_id)
        if table is None or not table.pending:
            return
        table.pending = False
        table.tokens.append(int(token_id))
        if self.enable_prefix_caching and table.num_tokens % self.block_size == 0:
            self._add_digests(table)
            self._register(table)

    def _add_digests(self, table: _Table) -> None:
        """Digest every full block whose token values are all known (``tokens`` holds them)."""
        bs = self.block_size
        while len(table.digests) < len(table.tokens) // bs:
            i = len(table.digests)
            parent = table.digests[-1] if table.digests else _ROOT_DIGEST
            digest = _chain_digest(parent, table.tokens[i * bs : (i + 1) * bs])
            table.digests.append(digest)
            self._inflight[digest] = self._inflight.get(digest, 0) + 1

    def _drop_inflight(self, digest: bytes) -> None:
        left = self._inflight[digest] - 1
        if left:
            self._inflight[digest] = left
        else:
            del self._inflight[digest]

    def mark_computed(self, seq_id: Hashable, num_tokens: int) -> None:
        """Record that the K/V of the first `num_tokens` tokens of `seq_id` is written; cache full blocks."""
        table = self._table(seq_id)
        if num_tokens > table.num_tokens:
            raise ValueError(f"{num_tokens} computed tokens but sequence {seq_id!r} holds {table.num_tokens}")
        table.computed_tokens = max(table.computed_tokens, num_tokens)
        self._register(table)

    def _register(self, table: _Table) -> None:
        """Offer the table's computed, digested blocks to the prefix cache."""
        if table.registered == len(table.digests):
            return
        while table.registered < min(len(table.digests), table.computed_tokens // self.block_size):
            i = table.registered
            digest, block = table.digests[i], table.blocks[i]
            self._drop_inflight(digest)
            if digest not in self._cached and block not in self._digest_of:
                self._cached[digest] = block
                self._digest_of[block] = digest
            table.registered += 1

    def mark_computed_many(self, items: Sequence[tuple[Hashable, int]]) -> None:
        """:meth:`mark_computed` for each (sequence, computed tokens) pair, in order."""
        tables = self._tables
        for seq_id, num_tokens in items:
            table = tables.get(seq_id)
            if table is None or num_tokens > table.num_tokens or table.registered < len(table.digests):
                self.mark_computed(seq_id, num_tokens)  # the general case, and its errors
            elif num_tokens > table.computed_tokens:
                table.computed_tokens = num_tokens

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Give `child_id` the blocks of `parent_id` by reference (parallel sampling); writes copy later."""
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r} already holds blocks")
        src = self._table(parent_id)
        for b in src.blocks:
            self._ref(b)
        self._new_table(
            child_id,
            _Table(
                blocks=list(src.blocks),
                num_tokens=src.num_tokens,
                tokens=list(src.tokens),
                digests=list(src.digests),
                computed_tokens=src.computed_tokens,
                registered=src.registered,
                pending=src.pending,
            ),
        )
        for d in src.digests[src.registered :]:
            self._inflight[d] += 1

    def truncate(self, seq_id: Hashable, num_tokens: int) -> None:
        """Cut `seq_id` back to its first `num_tokens` tokens (speculative decoding's rollback of rejected
        proposals): blocks past them go back to the pool, digests of blocks no longer full are dropped,
        and the kept last block's later slots are reused by the next appends.

        Only tokens not yet offered to the prefix cache can go: `num_tokens` must not be below the
        registered (cached) full blocks, nor above the tokens held."""
        table = self._table(seq_id)
        if table.pending:
            raise ValueError(f"sequence {seq_id!r} has a token without a value; fill_token it first")
        if not table.registered * self.block_size <= num_tokens <= table.num_tokens:
            raise ValueError(
                f"cannot cut sequence {seq_id!r} to {num_tokens} tokens: it holds {table.num_tokens}, "
                f"{table.registered * self.block_size} of them in cached blocks"
            )
        if num_tokens == table.num_tokens:
            return
        keep_digests = num_tokens // self.block_size
        for d in table.digests[keep_digests:]:
            self._drop_inflight(d)  # (all unregistered: registered blocks lie below num_tokens)
        del table.digests[keep_digests:]
        del table.tokens[num_tokens:]
        table.num_tokens = num_tokens
        table.computed_tokens = min(table.computed_tokens, num_tokens)
        keep = self.blocks_for(num_tokens)
        for b in reversed(table.blocks[keep:]):
            self._unref(b)
        self._rows[table.row, keep : len(table.blocks)] = 0
        del table.blocks[keep:]

    def free(self, seq_id: Hashable) -> None:
        """Release every block of `seq_id` (a no-op for a sequence holding none)."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            return
        for d in table.digests[table.registered :]:
            self._drop_inflight(d)
        for b in reversed(table.blocks):
            self._unref(b)
        self._rows[table.row, : len(table.blocks)] = 0
        self._free_rows.append(table.row)

    def check_invariants(self) -> None:
        """Raise AssertionError if reference counts, free lists and tables disagree (for tests)."""
        counts = [0] * self.num_blocks
        for t in self._tables.values():
            for b in t.blocks:
                counts[b] += 1
        assert counts == self._refcount, "reference counts disagree with the block tables"
        rows = [t.row for t in self._tables.values()]
        assert len(set(rows)) == len(rows) and not set(rows) & set(self._free_rows), "matrix rows are shared"
        for t in self._tables.values():
            assert len(t.blocks) == self.blocks_for(t.num_tokens), "a table holds blocks beyond its tokens"
            assert len(t.tokens) == t.num_tokens - t.pending, "a table's known tokens disagree with its count"
            row = self._rows[t.row]
            assert row[: len(t.blocks)].tolist() == t.blocks, "a matrix row disagrees with its table"
            assert not row[len(t.blocks) :].any(), "a matrix row holds blocks beyond its table"
        assert not self._rows[self._free_rows].any(), "a free matrix row holds blocks"
        free = set(self._free) | set(self._evictable)
        assert len(free) == len(self._free) + len(self._evictable), "a block is on two free lists"
        assert free == {b for b in range(self.num_blocks) if counts[b] == 0}, "free list is wrong"
        inflight: dict[bytes, int] = {}
        for t in self._tables.values():
            for d in t.digests[t.registered :]:
                inflight[d] = inflight.get(d, 0) + 1
        assert inflight == self._inflight, "in-flight digests disagree with the tables"
        for digest, b in self._cached.items():
            assert self._digest_of.get(b) == digest, "cache index and block digests disagree"
