"""Continuous (iteration-level) batching over a paged KV pool; executor-independent.

Every :meth:`Scheduler.step` forms one batch: each running sequence brings its next token (decode)
or its next prompt chunk (chunked prefill), then waiting requests are admitted first-come
first-served while the pool keeps a watermark of free blocks. When a running sequence needs a block
and none is free, the newest running sequence is preempted by *recompute*: its blocks are freed and
it goes back to the head of the queue keeping its generated tokens, to be prefilled again later.
Recompute rather than swap because it needs nothing from the executor but ordinary steps (no host
pool, no device-host copies, so every executor supports it), its full blocks usually survive in the
prefix cache and are re-shared rather than recomputed, and a prefill is compute-bound work the GPU
does near peak while decode is bandwidth-bound. An executor failure fails only that step's requests.

Asynchronous scheduling (``SchedulerConfig.async_scheduling``, on by default for an executor with
``step_async``) keeps one step in flight: step n is scheduled as if every sequence sampled in step
n-1 already had that token, launched with those tokens fed from the device, and only then are step
n-1's tokens waited for and applied (appended, stop checks, outputs). The host's work for a step
then overlaps the device's for the previous one instead of following it. Outputs are identical to
the synchronous mode: every sequence samples the same tokens with the same draws of its generator;
a sequence found finished at n-1 merely has its step-n row discarded.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from trtforge.errors import TrtforgeError, UserError
from trtforge.llm.executors.base import StepBatch, StepExecutor, TokenFeed, supports_async
from trtforge.llm.sampling import SampledTokens, SamplingParams, sample, sample_async
from trtforge.llm.sched.blocks import BlockManager, MemoryStats, NoFreeBlocksError


class StepFailedError(TrtforgeError):
    """The executor failed the step a request was part of; the request ends with this error."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Sequence_:
    """One request's state: its tokens (prompt then output) and how many have K/V in the pool."""

    request_id: Hashable
    tokens: list[int]
    prompt_len: int
    params: SamplingParams
    eos_token_id: int | None
    generator: np.random.Generator
    arrival: int
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None
    error: BaseException | None = None
    # a sampled token can only stop the sequence if it is in stop_ids or the length reaches length_limit
    # (or the params have stop sequences): the per-token check short of the full one
    stop_ids: frozenset[int] = frozenset()
    length_limit: int = 0
    # asynchronous scheduling: the row of this sequence's token in the step in flight's samples while
    # that token is not known on the host yet (-1: none in flight)
    pending_row: int = -1

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


class RequestOutput(NamedTuple):
    """What a step produced for one request: its new tokens, and how it ended if it did.

    A named tuple rather than a frozen dataclass: one is made per running request per step, and a
    tuple is built several times faster.
    """

    request_id: Hashable
    new_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]  # every generated token, filled once the request has finished
    finished: bool
    finish_reason: str | None = None
    error: BaseException | None = None


@dataclass
class SchedulerConfig:
    """Batching limits. ``max_model_len=None`` takes the executor's, capped at what the pool holds.

    ``async_scheduling``: keep one step in flight (see the module docstring). None, the default, turns it
    on for an executor with ``step_async`` (the torch executor) and off for the others (ONNX Runtime,
    TensorRT); False forces synchronous steps; True requires an executor with ``step_async``.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_prefill_chunk: int = 512
    # prompt tokens per step while some sequence decodes in it: bounds how long a prefill stalls them
    max_prefill_tokens_with_decodes: int = 1024
    watermark: float = 0.01
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    seed: int = 0
    async_scheduling: bool | None = None

    def validate(self) -> None:
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_prefill_chunk",
            "max_prefill_tokens_with_decodes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"SchedulerConfig.{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.watermark, (int, float)) or not 0 <= self.watermark < 1:
            raise UserError(f"SchedulerConfig.watermark must be a fraction in [0, 1), got {self.watermark!r}")
        if self.max_model_len is not None and (
            not isinstance(self.max_model_len, int) or self.max_model_len < 2
        ):
            raise UserError(f"SchedulerConfig.max_model_len must be None or >= 2, got {self.max_model_len!r}")
        if self.async_scheduling not in (None, True, False):
            raise UserError(
                f"SchedulerConfig.async_scheduling must be None, True or False, got {self.async_scheduling!r}"
            )


@dataclass
class SchedulerStats:
    """Counters since creation."""

    steps: int = 0
    failed_steps: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefix_hit_tokens: int = 0
    generated_tokens: int = 0
    max_running: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Plan:
    """One step's schedule. While scheduling: the sequences, their slots (flat) and, for those that
    bring more than their last token, that run of tokens. :meth:`finish` then puts them in arrival
    order and fills, per sequence, the new-token count, first new position, whether it samples, and
    all new token ids (flat)."""

    seqs: list[Sequence_] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    runs: dict[int, list[int]] = field(default_factory=dict)  # batch index -> its new tokens
    copies: list[tuple[int, int]] = field(default_factory=list)
    in_order: bool = True  # sequences were added in arrival order
    counts: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    wants: list[bool] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)

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
        else:
            # (a sequence whose last token is in flight brings that one: it samples)
            self.wants = [
                s.num_computed + n == len(s.tokens) + (s.pending_row >= 0) for s, n in zip(seqs, counts)
            ]
            self.ids = [t for j, s in enumerate(seqs) for t in runs.get(j, (s.tokens[-1],))]


@dataclass(slots=True)
class _InFlight:
    """A launched step whose sampled tokens the host has not applied yet (asynchronous scheduling)."""

    seqs: list[Sequence_]
    samplers: list[Sequence_]  # the sequences of the sampled rows, in row order
    sampled: SampledTokens


StepHook = Callable[["Scheduler", StepBatch], None]


class Scheduler:
    """Owns the requests and the block manager; each :meth:`step` runs one batch through `executor`.

    Not thread-safe: :class:`trtforge.llm.engine.LLMEngine` serialises calls with a lock. A request
    aborted while a step runs (from the step hook or the executor) is dropped from that step's results.
    `step_hook(scheduler, batch)` runs after a batch is formed and before the executor runs it.
    """

    def __init__(
        self, executor: StepExecutor, config: SchedulerConfig | None = None, step_hook: StepHook | None = None
    ) -> None:
        self.config = config or SchedulerConfig()
        self.config.validate()
        self.executor = executor
        self.facts = facts = executor.facts
        # K/V that depend on the prompt's length (dynamic rotary) are not shareable between prompts
        self._prompt_lens = facts.kv_depends_on_prompt_len
        self.block_manager = BlockManager(
            facts.num_blocks,
            facts.block_size,
            enable_prefix_caching=self.config.enable_prefix_caching and not self._prompt_lens,
        )
        capacity = facts.num_blocks * facts.block_size
        wanted = self.config.max_model_len or facts.max_model_len
        self.max_model_len = min(wanted, facts.max_model_len, capacity)
        self.step_hook = step_hook
        self.async_scheduling = supports_async(executor)
        if self.config.async_scheduling is not None:
            if self.config.async_scheduling and not self.async_scheduling:
                raise UserError(
                    f"SchedulerConfig.async_scheduling=True needs an executor with step_async; "
                    f"{type(executor).__name__} runs steps synchronously only (leave it None or False)"
                )
            self.async_scheduling = self.config.async_scheduling
        self._inflight: _InFlight | None = None
        self.stats = SchedulerStats()
        self._watermark_blocks = int(self.config.watermark * facts.num_blocks)
        self._waiting: deque[Sequence_] = deque()
        self._running: list[Sequence_] = []
        self._requests: dict[Hashable, Sequence_] = {}
        self._finished_outputs: list[RequestOutput] = []
        self._arrivals = itertools.count()
        self._seed_source = np.random.default_rng(self.config.seed)

    # ---- requests ------------------------------------------------------------------------------
    def add_request(
        self, request_id: Hashable, prompt: Sequence[int], params: SamplingParams | None = None
    ) -> None:
        """Queue a request; raise UserError (and queue nothing) for a bad prompt or parameters."""
        self.enqueue(self.make_sequence(request_id, prompt, params))

    def make_sequence(
        self, request_id: Hashable, prompt: Sequence[int], params: SamplingParams | None = None
    ) -> Sequence_:
        """Validate a request and build its state without queueing it (UserError names what is wrong)."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise UserError(
                f"request {request_id!r}: sampling params must be a SamplingParams, got {params!r}"
            )
        if isinstance(prompt, (str, bytes)):
            raise UserError(f"request {request_id!r}: the prompt must be a sequence of token ids, got text")
        try:
            tokens = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        except TypeError:
            tokens = None
        if tokens is None or not all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tokens
        ):
            raise UserError(
                f"request {request_id!r}: the prompt must be a flat sequence of integer token ids, "
                f"got {type(prompt).__name__}"
            )
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise UserError(f"request {request_id!r}: the prompt is empty; give at least one token id")
        vocab = self.facts.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise UserError(
                f"request {request_id!r}: token id {bad[0]} is outside the vocabulary [0, {vocab})"
            )
        if len(tokens) >= self.max_model_len:
            raise UserError(
                f"request {request_id!r}: the prompt has {len(tokens)} tokens but the maximum sequence "
                f"length is {self.max_model_len} (prompt + at least one generated token)"
            )
        if params.eos_token_id is not None:
            eos_ids: tuple[int, ...] = (params.eos_token_id,)
        else:  # every id of the model's
            eos_ids = self.facts.eos_token_ids
        eos_ids = () if params.ignore_eos else eos_ids
        eos = eos_ids[0] if eos_ids else None
        return Sequence_(
            request_id=request_id,
            tokens=tokens,
            prompt_len=len(tokens),
            params=params,
            eos_token_id=eos,
            generator=params.make_generator(int(self._seed_source.integers(2**63))),
            arrival=next(self._arrivals),
            stop_ids=frozenset(params.stop_token_ids) | frozenset(eos_ids),
            length_limit=min(len(tokens) + params.max_tokens, self.max_model_len),
        )

    def enqueue(self, seq: Sequence_) -> None:
        """Queue a sequence from :meth:`make_sequence`."""
        if seq.request_id in self._requests:
            raise UserError(f"request id {seq.request_id!r} is already in use by an unfinished request")
        self._requests[seq.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: Hashable) -> bool:
        """Cancel an unfinished request and free its blocks; False if it is unknown or already finished."""
        seq = self._requests.get(request_id)
        if seq is None:
            return False
        if seq.status is RequestStatus.WAITING:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
        self._finish(seq, "abort")
        self._finished_outputs.append(self._output(seq, (), finished=True))
        return True

    def has_unfinished(self) -> bool:
        """Whether a :meth:`step` has work: requests, outputs not returned yet, or a step in flight."""
        return bool(self._waiting or self._running or self._finished_outputs or self._inflight)

    def flush(self) -> list[RequestOutput]:
        """Wait for the step in flight (asynchronous scheduling) and return the outputs not returned yet."""
        outputs, self._finished_outputs = self._finished_outputs, []
        self._resolve(outputs)
        return outputs

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def running_request_ids(self) -> list[Hashable]:
        return [s.request_id for s in self._running]

    def memory_stats(self) -> MemoryStats:
        return self.block_manager.memory_stats()

    # ---- one iteration -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run and sample one batch; return the outputs of every request that changed.

        Under asynchronous scheduling the outputs are those of the step before, whose tokens are
        applied once this one is launched.
        """
        outputs, self._finished_outputs = self._finished_outputs, []
        plan = self._schedule()
        if not plan.seqs:
            self._resolve(outputs)
            return outputs
        self.stats.steps += 1
        self.stats.max_running = max(self.stats.max_running, len(self._running))
        batch = self._build_batch(plan)
        if self.step_hook is not None:
            self.step_hook(self, batch)
        try:
            if self.async_scheduling:
                logits = self.executor.step_async(batch, self._feed(plan))
            else:
                logits = self.executor.step(batch)
            if tuple(logits.shape) != (len(batch.logits_indices), self.facts.vocab_size):
                raise StepFailedError(
                    f"executor returned logits of shape {tuple(logits.shape)}, expected "
                    f"{(len(batch.logits_indices), self.facts.vocab_size)}"
                )
        except Exception as exc:  # an executor fault ends this step's requests, not the engine
            self._resolve(outputs)  # the step before completes first, as it does without asynchrony
            self._fail(plan.seqs, exc, outputs)
            return outputs
        samplers = list(itertools.compress(plan.seqs, plan.wants))
        params, generators = [s.params for s in samplers], [s.generator for s in samplers]
        if not self.async_scheduling:
            tokens = sample(logits, params, generators).tolist()
            self._mark_computed(plan)
            self._apply(samplers, tokens, outputs)
            return outputs
        sampled = sample_async(logits, params, generators)
        self._mark_computed(plan)
        previous, self._inflight = self._inflight, _InFlight(plan.seqs, samplers, sampled)
        if previous is not None:
            self._apply_inflight(previous, outputs)
        for row, seq in enumerate(samplers):  # (after the step before cleared its own)
            seq.pending_row = row
        return outputs

    def _mark_computed(self, plan: _Plan) -> None:
        """The plan's tokens have their K/V written (or, asynchronously, its writes are queued on the device
        ahead of any later step's reads, which is what a later step needs)."""
        finished = RequestStatus.FINISHED
        for seq, n in zip(plan.seqs, plan.counts):
            if seq.status is not finished:  # else aborted while the step ran: its blocks are already free
                seq.num_computed += n
        self.block_manager.mark_computed_many(
            [(s.request_id, s.num_computed) for s in plan.seqs if s.status is not finished]
        )

    def _feed(self, plan: _Plan) -> TokenFeed | None:
        """Where the rows of sequences whose last token is still in flight read it (a :class:`TokenFeed`)."""
        if self._inflight is None:
            return None
        src = np.fromiter((s.pending_row for s in plan.seqs), dtype=np.int64, count=len(plan.seqs))
        pending = src >= 0
        rows = np.flatnonzero(pending)
        if not len(rows):
            return None
        if len(plan.ids) != len(plan.seqs):  # a pending token is the single new token of its sequence
            rows = np.cumsum(plan.counts)[rows] - 1
        return TokenFeed(rows=rows, sources=src[pending], tokens=self._inflight.sampled.tokens)

    def _resolve(self, outputs: list[RequestOutput]) -> None:
        """Wait for the step in flight, if any, and apply its tokens."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            self._apply_inflight(inflight, outputs)

    def _apply_inflight(self, inflight: _InFlight, outputs: list[RequestOutput]) -> None:
        try:
            tokens = inflight.sampled.result().tolist()
        except Exception as exc:  # a device fault surfacing at the wait ends that step's requests
            for seq in inflight.samplers:
                seq.pending_row = -1
            self._fail(inflight.seqs, exc, outputs)
            return
        self._apply(inflight.samplers, tokens, outputs, in_flight=True)

    def _apply(
        self,
        samplers: list[Sequence_],
        tokens: list[int],
        outputs: list[RequestOutput],
        in_flight: bool = False,
    ) -> None:
        """Append each sampled token to its sequence and finish those it stops; `in_flight`: the tokens of
        the step in flight (asynchronous scheduling), which may have reserved their slots valueless.

        Asynchronously, a sequence may already be in the next launched step, its slot reserved for this
        token. If this token finishes it, its blocks are freed at once although that step may still be
        writing into them (this token's K/V, the token fed on the device). Reusing them is safe by stream
        order: a step that hands one of those blocks to another sequence is launched after that step, on
        the same device stream (an executor runs its steps in order), so the late write lands before the
        new owner's writes, and a sequence reads only slots written before it reads them (its own, or a
        shared prefix's). The prefix cache stays sound: a placeholder enters no digest; a block this token
        completes is digested only here, from the real value, and the late write puts there that token's
        true K/V. (If the step before failed instead, nothing is filled, so nothing of it is cached.)
        """
        finished, running = RequestStatus.FINISHED, RequestStatus.RUNNING
        fill = self.block_manager.fill_token if in_flight else None
        generated = 0
        for seq, token in zip(samplers, tokens):
            if in_flight:
                seq.pending_row = -1
            if seq.status is finished:
                continue  # aborted or failed meanwhile: its blocks are already free
            seq_tokens = seq.tokens
            seq_tokens.append(token)
            if fill is not None:
                fill(seq.request_id, token)  # the next step reserved this token's slot, valueless
            generated += 1
            if token in seq.stop_ids or len(seq_tokens) >= seq.length_limit or seq.params.stop_sequences:
                reason = self._stop_reason(seq)
                if reason is not None:
                    if seq.status is running:
                        self._running.remove(seq)
                    else:  # preempted while its token was in flight
                        self._waiting.remove(seq)
                    self._finish(seq, reason)
                    outputs.append(self._output(seq, (token,), finished=True))
                    continue
            outputs.append(RequestOutput(seq.request_id, (token,), (), False))
        self.stats.generated_tokens += generated

    def _fail(self, seqs: list[Sequence_], exc: Exception, outputs: list[RequestOutput]) -> None:
        """End every unfinished sequence of a failed step with a StepFailedError caused by `exc`."""
        self.stats.failed_steps += 1
        error = exc if isinstance(exc, StepFailedError) else StepFailedError(f"executor step failed: {exc!r}")
        if error is not exc:
            error.__cause__ = exc
        for seq in seqs:
            if seq.status is RequestStatus.FINISHED:
                continue  # aborted while the step ran, or already finished by the step before
            if seq.status is RequestStatus.RUNNING:
                self._running.remove(seq)
            else:
                self._waiting.remove(seq)
            self._finish(seq, "error", error)
            outputs.append(self._output(seq, (), finished=True))

    def _schedule(self) -> _Plan:
        bm = self.block_manager
        append_token = bm.append_token
        budget = self.config.max_num_batched_tokens
        chunk = self.config.max_prefill_chunk
        plan = _Plan()
        seqs, slots = plan.seqs, plan.slots
        preempted = False
        prefill_budget = budget
        decode_checked = False
        decodes = prompt_singles = 0
        running = self._running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            tokens = seq.tokens
            start = seq.num_computed
            pending = seq.pending_row >= 0  # its last token is still being sampled: its value comes later
            left = len(tokens) + pending - start
            if pending and len(tokens) + 1 >= seq.length_limit:
                i += 1  # the token in flight ends it whatever its value: nothing more to compute
                continue
            if left == 1:  # the common decode case, without the general path's bookkeeping
                slot = append_token(seq.request_id, None if pending else tokens[-1])
                if slot is not None:
                    seqs.append(seq)
                    slots.append(slot)
                    if start >= seq.prompt_len:
                        decodes += 1
                    else:
                        prompt_singles += 1
                    budget -= 1
                    i += 1
                    continue
            if left > 1 and not decode_checked:
                # with any decode in the step, prompt tokens are capped so that decodes are not stalled long
                decode_checked = True
                if any(len(s.tokens) + (s.pending_row >= 0) - s.num_computed == 1 for s in running):
                    prefill_budget = self.config.max_prefill_tokens_with_decodes
            n = min(left, chunk, budget) if left == 1 else min(left, chunk, budget, prefill_budget)
            if n == 0:
                i += 1  # a prompt chunk waits for the next step's prefill budget
                continue
            run: list = [None] if pending else tokens[start : start + n]
            while True:
                try:
                    new_slots, cp = bm.append_slots(seq.request_id, run)
                    break
                except NoFreeBlocksError:
                    victim = running[-1]
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
            if seq.status is not RequestStatus.RUNNING:
                break  # seq itself was the newest: everything after it is preempted too
            plan.copies.extend(cp)
            plan.add(seq, [tokens[-1]] if pending else run, new_slots)  # a placeholder id, fed on the device
            self._count_tokens(seq, n)
            budget -= n
            if left > 1:
                prefill_budget -= n
            i += 1
        self.stats.decode_tokens += decodes
        self.stats.prefill_tokens += prompt_singles
        if not decode_checked and seqs:
            # admission below runs only when every running sequence was visited without preemption; then
            # the ones scheduled so far all had one token left, so the step has decodes
            prefill_budget = self.config.max_prefill_tokens_with_decodes
        while (
            self._waiting
            and not preempted
            and min(budget, prefill_budget) > 0
            and len(running) < self.config.max_num_seqs
        ):
            seq = self._waiting[0]
            if seq.pending_row >= 0:
                break  # preempted with a token in flight: its prompt is complete once that arrives
            needed = bm.free_blocks_needed(seq.tokens)
            reserve = self._watermark_blocks if running else 0
            if bm.num_free_blocks - needed < reserve or bm.prefix_in_flight(seq.tokens):
                break
            self._waiting.popleft()
            cached = bm.allocate(seq.request_id, seq.tokens)
            self.stats.prefix_hit_tokens += cached
            seq.num_computed = cached
            n = min(len(seq.tokens) - cached, chunk, budget, prefill_budget)
            new_slots, cp = bm.append_slots(seq.request_id, seq.tokens[cached : cached + n])
            plan.copies.extend(cp)
            seq.status = RequestStatus.RUNNING
            bisect.insort(running, seq, key=lambda s: s.arrival)
            plan.add(seq, seq.tokens[cached : cached + n], new_slots)
            self._count_tokens(seq, n)
            budget -= n
            prefill_budget -= n
        plan.finish()
        return plan

    def _count_tokens(self, seq: Sequence_, n: int) -> None:
        known = len(seq.tokens) + (seq.pending_row >= 0)
        if n == 1 and seq.num_computed + 1 == known and seq.num_computed >= seq.prompt_len:
            self.stats.decode_tokens += 1
        else:
            self.stats.prefill_tokens += n

    def _preempt(self, seq: Sequence_) -> None:
        self._running.remove(seq)
        self.block_manager.free(seq.request_id)
        seq.status = RequestStatus.WAITING
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(seq)

    def _build_batch(self, plan: _Plan) -> StepBatch:
        """The plan's arrays in bulk; equal to ``StepBatch.build`` over per-sequence lists."""
        num_seqs, num_tokens = len(plan.seqs), len(plan.ids)
        starts = np.array(plan.starts, dtype=np.int64)
        if num_tokens == num_seqs:  # one token each (counts are >= 1): decode
            qsl = np.arange(num_seqs + 1, dtype=np.int32)
            positions = starts
            context_lens = (starts + 1).astype(np.int32)
        else:
            lens = np.array(plan.counts, dtype=np.int64)
            qsl = np.zeros(num_seqs + 1, dtype=np.int32)
            np.cumsum(lens, out=qsl[1:])
            positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(starts - qsl[:-1], lens)
            context_lens = (starts + lens).astype(np.int32)
        seq_ids = tuple([s.request_id for s in plan.seqs])
        width = max(-(-int(context_lens.max()) // self.block_manager.block_size), 1)
        if all(plan.wants):
            logits_indices = qsl[1:].astype(np.int64) - 1
        else:
            logits_indices = (qsl[1:][np.array(plan.wants, dtype=bool)] - 1).astype(np.int64)
        return StepBatch(
            input_ids=np.array(plan.ids, dtype=np.int64),
            positions=positions,
            query_start_loc=qsl,
            context_lens=context_lens,
            block_tables=self.block_manager.block_table_array(seq_ids, width),
            slot_mapping=np.array(plan.slots, dtype=np.int64),
            logits_indices=logits_indices,
            block_copies=np.array(plan.copies, dtype=np.int64).reshape(-1, 2),
            seq_ids=seq_ids,
            prompt_lens=np.array([s.prompt_len for s in plan.seqs], np.int32) if self._prompt_lens else None,
        )

    def _stop_reason(self, seq: Sequence_) -> str | None:
        token = seq.tokens[-1]
        p = seq.params
        if token in seq.stop_ids:  # the stop ids and every end-of-sequence id
            return "stop"
        out_len = len(seq.tokens) - seq.prompt_len
        for stop in p.stop_sequences:
            if out_len >= len(stop) and tuple(seq.tokens[-len(stop) :]) == stop:
                return "stop"
        if out_len >= p.max_tokens or len(seq.tokens) >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence_, reason: str, error: BaseException | None = None) -> None:
        self.block_manager.free(seq.request_id)
        seq.status = RequestStatus.FINISHED
        seq.finish_reason = reason
        seq.error = error
        del self._requests[seq.request_id]

    def _output(self, seq: Sequence_, new: tuple[int, ...], finished: bool) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new,
            output_token_ids=tuple(seq.output) if finished else (),
            finished=finished,
            finish_reason=seq.finish_reason if finished else None,
            error=seq.error,
        )
