"""One step's plan, as :meth:`Scheduler.schedule` returns it: what to run and what to sample.

The plan names the sequences of the step (in arrival order), the new tokens each brings and their pool
slots, the block copies to do first, which sequences sample a token, and the :class:`StepBatch` the
executor runs. The loop (:mod:`trtforge.llm.loop`) executes it, samples with the samplers' params and
generators, and hands the tokens back to :meth:`Scheduler.update`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtforge.llm.executors.base import StepBatch
from trtforge.llm.penalties import RowHistory, penalized
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.blocks import BlockManager
from trtforge.llm.sched.request import RequestStatus, Sequence_
from trtforge.llm.structured import batch_bitmask


@dataclass
class StepPlan:
    """One step's schedule. While scheduling: the sequences, their slots (flat) and, for those that
    bring more than their last token, that run of tokens. :meth:`finish` then puts them in arrival
    order and fills, per sequence, the new-token count, first new position, whether it samples, and
    all new token ids (flat); :meth:`make_batch` flattens them into the step's batch."""

    seqs: list[Sequence_] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    runs: dict[int, list[int]] = field(default_factory=dict)  # batch index -> its new tokens
    copies: list[tuple[int, int]] = field(default_factory=list)
    in_order: bool = True  # sequences were added in arrival order
    counts: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    wants: list[bool] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    samplers: list[Sequence_] = field(default_factory=list)  # the sequences of the sampled rows, in order
    batch: StepBatch | None = None
    speculative: bool = False  # some sequence brings proposals (``Sequence_.draft``) to verify
    # (any sampled row has penalties, any has a grammar): one pass over the rows, on first use
    _extras: tuple[bool, bool] | None = field(default=None, repr=False)

    def __bool__(self) -> bool:
        return bool(self.seqs)

    def add(self, seq: Sequence_, tokens: Sequence[int], slots: list[int]) -> None:
        """Schedule `tokens` (the next ones of `seq`, from ``seq.num_computed``) into `slots`."""
        if self.seqs and seq.arrival < self.seqs[-1].arrival:
            self.in_order = False
        self.runs[len(self.seqs)] = list(tokens)
        self.seqs.append(seq)
        self.slots.extend(slots)

    def finish(self) -> None:
        seqs, runs = self.seqs, self.runs
        counts = [1] * len(seqs)
        for j, run in runs.items():
            counts[j] = len(run)
        if not self.in_order:
            offsets = list(itertools.accumulate(counts, initial=0))
            order = sorted(range(len(seqs)), key=lambda j: seqs[j].arrival)
            self.slots = [x for j in order for x in self.slots[offsets[j] : offsets[j + 1]]]
            self.runs = runs = {k: runs[j] for k, j in enumerate(order) if j in runs}
            self.seqs = seqs = [seqs[j] for j in order]
            counts = [counts[j] for j in order]
            self.in_order = True
        self.counts = counts
        self.starts = [s.num_computed for s in seqs]
        if not runs:  # every sequence brings its last token: a decode step
            self.wants = [True] * len(seqs)
            self.ids = [s.tokens[-1] for s in seqs]
            self.samplers = seqs
        else:
            # (a sequence whose last token is in flight brings that one: it samples)
            self.wants = [
                s.num_computed + n == len(s.tokens) + (s.pending_row >= 0) for s, n in zip(seqs, counts)
            ]
            if self.speculative:  # a verifying sequence brings its proposals after its last token
                self.wants = [
                    w or s.num_computed + n == len(s.tokens) + len(s.draft)
                    for w, s, n in zip(self.wants, seqs, counts)
                ]
            self.ids = [t for j, s in enumerate(seqs) for t in runs.get(j, (s.tokens[-1],))]
            self.samplers = list(itertools.compress(seqs, self.wants))

    def make_batch(self, blocks: BlockManager, with_prompt_lens: bool) -> StepBatch:
        """The finished plan as the executor's batch (through the one flattening,
        :meth:`StepBatch.from_flat`); `with_prompt_lens` for executors whose K/V depend on them."""
        seq_ids = tuple([s.request_id for s in self.seqs])
        longest = max(map(operator.add, self.starts, self.counts), default=0)
        width = max(-(-longest // blocks.block_size), 1)
        self.batch = StepBatch.from_flat(
            seq_ids,
            self.ids,
            self.counts,
            self.starts,
            self.slots,
            self.wants,
            blocks.block_table_array(seq_ids, width),
            self.copies,
            [s.prompt_len for s in self.seqs] if with_prompt_lens else None,
            [len(s.draft) for s in self.seqs] if self.speculative else None,
        )
        return self.batch

    @property
    def sampling_params(self) -> list[SamplingParams]:
        """Each sampled row's request parameters, in row order."""
        return [s.params for s in self.samplers]

    @property
    def generators(self) -> list[np.random.Generator | None]:
        """Each sampled row's generator, in row order (None for a greedy request's: it draws nothing)."""
        return [s.sampling_generator for s in self.samplers]

    def _sampler_extras(self) -> tuple[bool, bool]:
        """(any sampled row has penalties, any has a grammar), found in one pass and kept: the common
        batch has neither, and its rows are then not walked again."""
        if self._extras is None:
            penalties = any(penalized(s.params) for s in self.samplers)
            grammars = any(s.matcher is not None for s in self.samplers)
            self._extras = (penalties, grammars)
        return self._extras

    def needs_history(self) -> bool:
        """Whether a sampled row reads its request's tokens (penalties) or grammar state, so that a
        token still in flight must be applied before this plan's rows are sampled."""
        return any(self._sampler_extras())

    def sampler_inputs(self, vocab_size: int) -> tuple[list[RowHistory] | None, Any]:
        """The sampled rows' token histories (None when no row has penalties) and the grammar bitmask
        of the rows (None when no row has a grammar), for :func:`trtforge.llm.sampling.sample`."""
        seqs = self.samplers
        penalties, grammars = self._sampler_extras()
        histories = None
        if penalties:
            histories = [
                RowHistory(s.tokens[: s.prompt_len], s.output) if penalized(s.params) else None for s in seqs
            ]
        if not grammars:
            return histories, None
        live = RequestStatus.FINISHED
        matchers = [s.matcher if s.status is not live else None for s in seqs]
        return histories, batch_bitmask(matchers, vocab_size)

    def fed_rows(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(token rows of the batch, rows of the step in flight's samples) for the sequences whose last
        token is still being sampled (asynchronous scheduling), or None when there is none."""
        src = np.fromiter((s.pending_row for s in self.seqs), dtype=np.int64, count=len(self.seqs))
        pending = src >= 0
        rows = np.flatnonzero(pending)
        if not len(rows):
            return None
        if len(self.ids) != len(self.seqs):  # a pending token is the single new token of its sequence
            rows = np.cumsum(self.counts)[rows] - 1
        return rows, src[pending]
