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
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtforge.errors import TrtforgeError, UserError
from trtforge.llm.blocks import BlockManager, MemoryStats, NoFreeBlocksError
from trtforge.llm.executor import StepBatch, StepExecutor
from trtforge.llm.sampling import SamplingParams, sample


class StepFailedError(TrtforgeError):
    """The executor failed the step a request was part of; the request ends with this error."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
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

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


@dataclass(frozen=True)
class RequestOutput:
    """What a step produced for one request: its new tokens, and how it ended if it did."""

    request_id: Hashable
    new_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]  # every generated token, filled once the request has finished
    finished: bool
    finish_reason: str | None = None
    error: BaseException | None = None


@dataclass
class SchedulerConfig:
    """Batching limits. ``max_model_len=None`` takes the executor's, capped at what the pool holds."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_prefill_chunk: int = 512
    # prompt tokens per step while some sequence decodes in it: bounds how long a prefill stalls them
    max_prefill_tokens_with_decodes: int = 1024
    watermark: float = 0.01
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    seed: int = 0

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
        self.block_manager = BlockManager(
            executor.num_blocks, executor.block_size, enable_prefix_caching=self.config.enable_prefix_caching
        )
        capacity = executor.num_blocks * executor.block_size
        wanted = self.config.max_model_len or executor.max_model_len
        self.max_model_len = min(wanted, executor.max_model_len, capacity)
        self.step_hook = step_hook
        self.stats = SchedulerStats()
        self._watermark_blocks = int(self.config.watermark * executor.num_blocks)
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
        vocab = self.executor.vocab_size
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
        eos = params.eos_token_id if params.eos_token_id is not None else self.executor.eos_token_id
        return Sequence_(
            request_id=request_id,
            tokens=tokens,
            prompt_len=len(tokens),
            params=params,
            eos_token_id=None if params.ignore_eos else eos,
            generator=params.make_generator(int(self._seed_source.integers(2**63))),
            arrival=next(self._arrivals),
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
        return bool(self._waiting or self._running or self._finished_outputs)

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
        """Schedule, run and sample one batch; return the outputs of every request that changed."""
        outputs, self._finished_outputs = self._finished_outputs, []
        scheduled, copies = self._schedule()
        if not scheduled:
            return outputs
        self.stats.steps += 1
        self.stats.max_running = max(self.stats.max_running, len(self._running))
        batch = self._build_batch(scheduled, copies)
        if self.step_hook is not None:
            self.step_hook(self, batch)
        try:
            logits = self.executor.step(batch)
            if tuple(logits.shape) != (len(batch.logits_indices), self.executor.vocab_size):
                raise StepFailedError(
                    f"executor returned logits of shape {tuple(logits.shape)}, expected "
                    f"{(len(batch.logits_indices), self.executor.vocab_size)}"
                )
        except Exception as exc:  # an executor fault ends this step's requests, not the engine
            self.stats.failed_steps += 1
            error = (
                exc if isinstance(exc, StepFailedError) else StepFailedError(f"executor step failed: {exc!r}")
            )
            if error is not exc:
                error.__cause__ = exc
            for seq, _, _ in scheduled:
                if seq.status is RequestStatus.FINISHED:
                    continue  # aborted while the step ran
                self._running.remove(seq)
                self._finish(seq, "error", error)
                outputs.append(self._output(seq, (), finished=True))
            return outputs
        samplers = [seq for seq, n, _ in scheduled if seq.num_computed + n == len(seq.tokens)]
        new_tokens = iter(
            sample(logits, [s.params for s in samplers], [s.generator for s in samplers]).tolist()
        )
        for seq, n, _ in scheduled:
            wants = seq.num_computed + n == len(seq.tokens)
            token = next(new_tokens) if wants else None
            if seq.status is RequestStatus.FINISHED:
                continue  # aborted while the step ran: its blocks are already free
            seq.num_computed += n
            self.block_manager.mark_computed(seq.request_id, seq.num_computed)
            if token is None:
                continue
            seq.tokens.append(token)
            self.stats.generated_tokens += 1
            reason = self._stop_reason(seq)
            if reason is not None:
                self._running.remove(seq)
                self._finish(seq, reason)
            outputs.append(self._output(seq, (token,), finished=reason is not None))
        return outputs

    def _schedule(self) -> tuple[list[tuple[Sequence_, int, list[int]]], list[tuple[int, int]]]:
        bm = self.block_manager
        budget = self.config.max_num_batched_tokens
        chunk = self.config.max_prefill_chunk
        scheduled: list[tuple[Sequence_, int, list[int]]] = []
        copies: list[tuple[int, int]] = []
        preempted = False
        # with any decode in the step, prompt tokens are capped so that the decodes are not stalled long
        decoding = any(len(s.tokens) - s.num_computed == 1 for s in self._running)
        prefill_budget = self.config.max_prefill_tokens_with_decodes if decoding else budget
        i = 0
        stats = self.stats
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            left = len(seq.tokens) - seq.num_computed
            if left == 1:  # the common decode case, without the general path's bookkeeping
                slot = bm.append_token(seq.request_id, seq.tokens[-1])
                if slot is not None:
                    scheduled.append((seq, 1, [slot]))
                    if seq.num_computed >= seq.prompt_len:
                        stats.decode_tokens += 1
                    else:
                        stats.prefill_tokens += 1
                    budget -= 1
                    i += 1
                    continue
            n = min(left, chunk, budget) if left == 1 else min(left, chunk, budget, prefill_budget)
            if n == 0:
                i += 1  # a prompt chunk waits for the next step's prefill budget
                continue
            while True:
                try:
                    slots, cp = bm.append_slots(
                        seq.request_id, seq.tokens[seq.num_computed : seq.num_computed + n]
                    )
                    break
                except NoFreeBlocksError:
                    victim = self._running[-1]
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
            if seq.status is not RequestStatus.RUNNING:
                break  # seq itself was the newest: everything after it is preempted too
            copies.extend(cp)
            scheduled.append((seq, n, slots))
            self._count_tokens(seq, n)
            budget -= n
            if left > 1:
                prefill_budget -= n
            i += 1
        while (
            self._waiting
            and not preempted
            and min(budget, prefill_budget) > 0
            and len(self._running) < self.config.max_num_seqs
        ):
            seq = self._waiting[0]
            needed = bm.free_blocks_needed(seq.tokens)
            reserve = self._watermark_blocks if self._running else 0
            if bm.num_free_blocks - needed < reserve or bm.prefix_in_flight(seq.tokens):
                break
            self._waiting.popleft()
            cached = bm.allocate(seq.request_id, seq.tokens)
            self.stats.prefix_hit_tokens += cached
            seq.num_computed = cached
            n = min(len(seq.tokens) - cached, chunk, budget, prefill_budget)
            slots, cp = bm.append_slots(seq.request_id, seq.tokens[cached : cached + n])
            copies.extend(cp)
            seq.status = RequestStatus.RUNNING
            bisect.insort(self._running, seq, key=lambda s: s.arrival)
            scheduled.append((seq, n, slots))
            self._count_tokens(seq, n)
            budget -= n
            prefill_budget -= n
        scheduled.sort(key=lambda item: item[0].arrival)
        return scheduled, copies

    def _count_tokens(self, seq: Sequence_, n: int) -> None:
        if n == 1 and seq.num_computed + 1 == len(seq.tokens) and seq.num_computed >= seq.prompt_len:
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

    def _build_batch(
        self, scheduled: list[tuple[Sequence_, int, list[int]]], copies: list[tuple[int, int]]
    ) -> StepBatch:
        view = self.block_manager.block_table_view
        return StepBatch.build(
            seq_ids=[s.request_id for s, _, _ in scheduled],
            tokens=[s.tokens[s.num_computed : s.num_computed + n] for s, n, _ in scheduled],
            start_positions=[s.num_computed for s, _, _ in scheduled],
            block_tables=[view(s.request_id) for s, _, _ in scheduled],
            slots=[slots for _, _, slots in scheduled],
            want_logits=[s.num_computed + n == len(s.tokens) for s, n, _ in scheduled],
            block_copies=copies,
        )

    def _stop_reason(self, seq: Sequence_) -> str | None:
        token = seq.tokens[-1]
        p = seq.params
        if token == seq.eos_token_id or token in p.stop_token_ids:
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
