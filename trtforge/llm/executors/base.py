"""The step protocol between the scheduler and whatever runs the model (torch, ONNX Runtime, TensorRT).

One call runs one scheduler iteration: a flat, ragged batch of new tokens from several sequences
(prompt chunks and single decode tokens mixed), whose K/V the executor writes into its paged pools
``[num_blocks, block_size, Hkv, D]`` per layer at ``slot_mapping`` before attending through each
sequence's block table. It returns logits only for the rows the scheduler samples from. The
arrays are numpy on the host; an executor moves them to its device. These are the inputs of a
paged step graph (ids, positions, lengths, block tables, slot mapping, pools).

An executor may also offer :meth:`AsyncStepExecutor.step_async`: the same step, returned without
waiting for the device, whose decode rows take their input ids from the previous step's sampled
tokens where they still lie (a :class:`TokenFeed`). The scheduler then overlaps its host work for a
step with the device running the one before (asynchronous scheduling).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from trtforge.errors import TrtforgeError, UserError, is_int
from trtforge.llm import contract


class PoolAllocationError(UserError):
    """`num_blocks` names a KV-cache pool this machine cannot allocate (or whose size overflows the
    allocator's integers); `detail` says why, for a caller that words it as its own option."""

    def __init__(self, num_blocks: int, detail: str, message: str | None = None) -> None:
        self.num_blocks = num_blocks
        self.detail = detail
        super().__init__(
            message
            or f"num_blocks {num_blocks}: the KV-cache pool of that many blocks cannot be allocated on this "
            f"machine ({detail}); pass fewer, or leave num_blocks out."
        )


@dataclass(frozen=True)
class StepBatch:
    """One iteration's work. T = new tokens in all, B = sequences, N = rows to return logits for.

    - ``input_ids`` int64 ``[T]``: new tokens, sequence after sequence (``query_start_loc`` delimits).
    - ``positions`` int64 ``[T]``: each token's position in its sequence.
    - ``query_start_loc`` int32 ``[B+1]``: sequence b owns tokens ``[qsl[b], qsl[b+1])``.
    - ``context_lens`` int32 ``[B]``: K/V length of sequence b after this step (cached + new).
    - ``block_tables`` int32 ``[B, max_blocks]``: physical blocks of each sequence, padded with 0
      beyond ``ceil(context_lens[b] / block_size)`` (never read: lengths mask them).
    - ``slot_mapping`` int64 ``[T]``: pool slot (``block * block_size + offset``) for each new token.
    - ``logits_indices`` int64 ``[N]``: rows of the T tokens whose next-token logits are wanted.
    - ``block_copies`` int64 ``[C, 2]``: (src, dst) block copies to do before any write (copy-on-write).
    - ``seq_ids``: the scheduler's ids of the B sequences (for logs and fault reports).
    - ``prompt_lens`` int32 ``[B]`` or None: each sequence's prompt length, given to executors whose
      ``kv_depends_on_prompt_len`` is true (dynamic NTK rotary rotates a prompt by its whole length).
    """

    input_ids: np.ndarray
    positions: np.ndarray
    query_start_loc: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    logits_indices: np.ndarray
    block_copies: np.ndarray
    seq_ids: tuple[Hashable, ...]
    prompt_lens: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    @property
    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start_loc)

    @property
    def is_decode_only(self) -> bool:
        """Every sequence brings exactly one token (the case CUDA graphs and decode kernels target)."""
        return self.num_tokens == self.num_seqs

    @classmethod
    def from_flat(
        cls,
        seq_ids: Sequence[Hashable],
        input_ids: Sequence[int],
        counts: Sequence[int],
        starts: Sequence[int],
        slot_mapping: Sequence[int],
        want_logits: Sequence[bool],
        block_tables: np.ndarray,
        block_copies: Sequence[tuple[int, int]] = (),
        prompt_lens: Sequence[int] | None = None,
        extra_logits: Sequence[int] | None = None,
    ) -> StepBatch:
        """The batch from flat new tokens and slots plus, per sequence, how many new tokens it brings
        (each >= 1), its first new position and whether its last new token's logits are wanted.

        `extra_logits` (per sequence, or None: all 0): how many new tokens before the last one of a
        sequence that wants logits also want theirs (speculative verification: the last accepted token
        and its k proposals give k+1 rows, in token order).

        The one place the derived arrays (offsets, positions, lengths, logits rows) are computed: the
        scheduler's plans and :meth:`build` both come here. `block_tables` is the int32 table matrix.
        """
        num_seqs, num_tokens = len(counts), len(input_ids)
        starts_ = np.array(starts, dtype=np.int64)
        if num_tokens == num_seqs:  # one token each (counts are >= 1): decode
            qsl = np.arange(num_seqs + 1, dtype=np.int32)
            positions = starts_
            context_lens = (starts_ + 1).astype(np.int32)
        else:
            lens = np.asarray(counts, dtype=np.int64).reshape(-1)
            qsl = np.zeros(num_seqs + 1, dtype=np.int32)
            np.cumsum(lens, out=qsl[1:])
            positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(starts_ - qsl[:-1], lens)
            context_lens = (starts_ + lens).astype(np.int32)
        last_rows = qsl[1:].astype(np.int64) - 1
        if extra_logits is not None and any(extra_logits):
            per = (np.asarray(extra_logits, dtype=np.int64) + 1) * np.asarray(want_logits, dtype=bool)
            firsts = np.repeat(last_rows + 1 - per, per)
            last_rows = firsts + np.arange(len(firsts)) - np.repeat(np.cumsum(per) - per, per)
        elif not all(want_logits):
            last_rows = last_rows[np.array(want_logits, dtype=bool)]
        return cls(
            input_ids=np.array(input_ids, dtype=np.int64),
            positions=positions,
            query_start_loc=qsl,
            context_lens=context_lens,
            block_tables=block_tables,
            slot_mapping=np.array(slot_mapping, dtype=np.int64),
            logits_indices=last_rows,
            block_copies=np.array(list(block_copies), dtype=np.int64).reshape(-1, 2),
            seq_ids=tuple(seq_ids),
            prompt_lens=None if prompt_lens is None else np.asarray(prompt_lens, dtype=np.int32),
        )

    @classmethod
    def build(
        cls,
        seq_ids: Sequence[Hashable],
        tokens: Sequence[Sequence[int]],
        start_positions: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        slots: Sequence[Sequence[int]],
        want_logits: Sequence[bool],
        block_copies: Sequence[tuple[int, int]] = (),
        prompt_lens: Sequence[int] | None = None,
    ) -> StepBatch:
        """Per-sequence lists (new tokens, first new position, blocks, slots) as a batch: concatenated
        and the tables padded here, the rest by :meth:`from_flat`."""
        counts = [len(t) for t in tokens]
        if not all(counts):
            raise ValueError("every sequence of a step brings at least one new token")
        widths = np.fromiter((len(b) for b in block_tables), dtype=np.int64, count=len(block_tables))
        table = np.zeros((len(tokens), max(int(widths.max(initial=0)), 1)), dtype=np.int32)
        table[np.arange(table.shape[1])[None, :] < widths[:, None]] = np.fromiter(
            itertools.chain.from_iterable(block_tables), dtype=np.int32, count=int(widths.sum())
        )
        return cls.from_flat(
            seq_ids,
            list(itertools.chain.from_iterable(tokens)),
            counts,
            start_positions,
            list(itertools.chain.from_iterable(slots)),
            want_logits,
            table,
            block_copies,
            prompt_lens,
        )


class ExecutorLostError(TrtforgeError):
    """The executor can run no further step (a tensor-parallel worker died): the engine fails every
    request it holds with this error and shuts down, rather than failing one step's requests."""


@dataclass(frozen=True)
class TokenFeed:
    """Input ids a step takes from the previous step's sampled tokens without them visiting the host.

    Before running, the executor sets ``input_ids[rows[i]] = tokens[sources[i]]`` on its device;
    `tokens` is the previous step's int64 token tensor ``[N_prev]`` (where the sampler left it), and
    the batch's own ids at `rows` are placeholders.
    """

    rows: np.ndarray  # int64 [M]: token indices of the batch
    sources: np.ndarray  # int64 [M]: indices into `tokens`
    tokens: Any

    def __len__(self) -> int:
        return int(self.rows.shape[0])


@runtime_checkable
class StepExecutor(Protocol):
    """Runs steps of one model over paged KV pools it owns; knows nothing of requests or scheduling."""

    @property
    def facts(self) -> ExecutorFacts:
        """Its pool geometry, vocabulary, length limit and EOS ids (:class:`ExecutorFacts`)."""
        ...

    def step(self, batch: StepBatch) -> Any:
        """Do the block copies, write the new K/V, attend; return logits ``[N, vocab]`` (torch or numpy)."""
        ...


class AsyncStepExecutor(StepExecutor, Protocol):
    """A step executor that can run a step without the host waiting for the device."""

    def step_async(self, batch: StepBatch, feed: TokenFeed | None) -> Any:
        """:meth:`StepExecutor.step` after applying `feed` to the input ids, returning device logits
        ``[N, vocab]`` (a torch tensor) without synchronising with the device."""
        ...


def check_max_model_len(value: Any, max_seq: int, why: str) -> int:
    """`value` (None: `max_seq`) as the longest sequence an executor over a step graph or engine serves;
    UserError unless it is an integer in [2, `max_seq`] (`why` says where max_seq comes from). One rule for
    every such executor: the paged one had turned 0 into max_seq and 2.5 into 2."""
    value = max_seq if value is None else value
    if not is_int(value) or not 2 <= value <= max_seq:
        raise UserError(f"max_model_len must be an integer in [2, {max_seq}] ({why}), got {value!r}.")
    return int(value)


def kv_block_bytes(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, itemsize: int) -> int:
    """Bytes one block takes over every layer: its K and its V, ``block_size`` tokens of Hkv x D each (the
    sizing's blocks and :attr:`ExecutorFacts.kv_bytes_per_token` alike)."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


def supports_async(executor: object) -> bool:
    """Whether `executor`'s class defines ``step_async``.

    Looked up on the class, not the instance, so that a wrapper delegating unknown attributes to an
    asynchronous executor (``__getattr__``) stays synchronous rather than bypassing its own ``step``.
    """
    return callable(getattr(type(executor), "step_async", None))


@dataclass(frozen=True)
class ExecutorFacts:
    """What an executor tells the scheduler, the engine and the service about itself: its KV pool
    geometry and the model's vocabulary, length limit and end-of-sequence ids, fixed once it is built.

    - ``num_blocks`` / ``block_size``: the blocks of each layer's pool the block manager hands out (a
      scratch block some executors keep past them is not counted) and the tokens per block;
    - ``vocab_size``: the logits' width (the LM head's rows): sampling, logit biases, grammar bitmasks and
      speculative drafts range over it;
    - ``input_vocab_size``: the ids a prompt may hold (the embedding's rows); wider than ``vocab_size``
      where the LM head is pruned to a prefix of the vocabulary (Apertus 1.5's ``output_vocab_size``).
      None (the default) resolves to ``vocab_size``;
    - ``max_model_len``: the longest sequence (prompt + output) the executor runs;
    - ``eos_token_ids``: every end-of-sequence id of the model (any of them ends a request);
    - ``num_layers`` / ``num_kv_heads`` / ``head_dim`` / ``kv_dtype`` (a numpy-style name) and
      ``kv_element_bytes``: one pool's ``[blocks, block_size, num_kv_heads, head_dim]`` elements;
    - ``kv_pool_bytes``: the bytes the executor's K/V pools take, scratch block and spare buffers
      included;
    - ``kv_depends_on_prompt_len``: a token's K/V depends on its prompt's length (dynamic NTK rotary),
      so no prefix can be shared and the scheduler sends each batch's ``prompt_lens``;
    - ``tensor_parallel_size``: the ranks the model is split over; one rank's executor counts its own
      share of the KV heads and pool bytes, the driver the scheduler reads counts the whole model's.
    - ``quantization``: the weight quantization the executor runs ("fp8", "int4-awq", "int4-rtn"), or
      None for the model's own dtype; ``lm_head_quantization``: the LM head's ("fp8"), or None.
    - ``step_token_buckets``: ascending token counts a step with prompt tokens is padded to (the padded
      rows run through the linear layers like real ones); empty: no padding. The scheduler fills a
      step's padding with prompt tokens (``SchedulerConfig.fill_step_buckets``).
    - ``cuda_graphs_refusal``: why the executor never captures CUDA graphs of this model (sparse MoE
      MLPs the fused MoE kernels cannot run: data-dependent expert groups), or None.
    """

    num_blocks: int
    block_size: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str
    kv_element_bytes: int
    kv_pool_bytes: int
    kv_depends_on_prompt_len: bool = False
    tensor_parallel_size: int = 1
    quantization: str | None = None
    lm_head_quantization: str | None = None
    step_token_buckets: tuple[int, ...] = ()
    cuda_graphs_refusal: str | None = None
    input_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.input_vocab_size is None:
            object.__setattr__(self, "input_vocab_size", self.vocab_size)
        if self.input_vocab_size < self.vocab_size:
            raise ValueError(
                f"ExecutorFacts: input_vocab_size {self.input_vocab_size} is below the logits' width "
                f"vocab_size {self.vocab_size}; expected the embedding to take every id the head emits"
            )

    @property
    def eos_token_id(self) -> int | None:
        """The model's first end-of-sequence id, or None."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token's keys and values take over every layer."""
        return kv_block_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, self.kv_element_bytes)

    @classmethod
    def of_step_graph(
        cls,
        generation: dict[str, Any],
        *,
        num_blocks: int,
        max_model_len: int,
        kv_dtype: str,
        kv_element_bytes: int,
        kv_pool_bytes: int,
        block_size: int | None = None,
    ) -> ExecutorFacts:
        """The facts of an executor over a step graph or engine, whose generation metadata
        (:mod:`trtforge.llm.contract`) gives the block size, vocabulary, EOS ids and pool shape;
        `block_size` for a slot graph, whose block is a whole cache row (its max_seq)."""
        g = generation
        return cls(
            num_blocks=int(num_blocks),
            block_size=int(g["cache"]["block_size"] if block_size is None else block_size),
            vocab_size=int(g["vocab_size"]),
            input_vocab_size=contract.input_vocab_size(g),
            max_model_len=int(max_model_len),
            eos_token_ids=tuple(int(i) for i in g.get("eos_token_ids") or []),
            num_layers=int(g["num_layers"]),
            num_kv_heads=int(g["num_kv_heads"]),
            head_dim=int(g["head_dim"]),
            kv_dtype=kv_dtype,
            kv_element_bytes=int(kv_element_bytes),
            kv_pool_bytes=int(kv_pool_bytes),
        )
