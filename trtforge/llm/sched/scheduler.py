"""Continuous (iteration-level) batching over a paged KV pool; executor-independent and model-free.

:meth:`Scheduler.schedule` plans one step and runs nothing: each running sequence brings its next
token (decode) or its next prompt chunk (chunked prefill), then waiting requests are admitted
first-come first-served while the pool keeps a watermark of free blocks. When a running sequence
needs a block and none is free, the newest running sequence is preempted by *recompute*: its blocks
are freed and it goes back to the head of the queue keeping its generated tokens, to be prefilled
again later. Recompute rather than swap because it needs nothing from the executor but ordinary
steps (no host pool, no device-host copies, so every executor supports it), its full blocks usually
survive in the prefix cache and are re-shared rather than recomputed, and a prefill is compute-bound
work the GPU does near peak while decode is bandwidth-bound.

The loop (:mod:`trtforge.llm.loop`) runs the plan's batch and samples; :meth:`Scheduler.computed`
records that the step's K/V are written, :meth:`Scheduler.update` applies the sampled tokens (append,
stop checks, outputs, freeing finished requests) and :meth:`Scheduler.fail` ends the requests of a
failed step. Under asynchronous scheduling (:mod:`trtforge.llm.async_loop`) :meth:`Scheduler.defer`
marks a plan's tokens as still on the device: the next plan counts them as known and has their rows
fed on the device.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from trtforge.errors import UserError, is_int
from trtforge.llm.executors.base import StepExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.blocks import BlockManager, MemoryStats, NoFreeBlocksError
from trtforge.llm.sched.plan import StepPlan
from trtforge.llm.sched.request import (
    RequestOutput,
    RequestStatus,
    SchedulerConfig,
    SchedulerStats,
    Sequence_,
    StepFailedError,
)
from trtforge.llm.structured import GrammarError

__all__ = [
    "RequestOutput",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "Sequence_",
    "StepFailedError",
    "StepPlan",
]


class Scheduler:
    """Owns the requests and the block manager; plans steps and applies their results.

    `executor` gives the facts the plans need (pool size, block size, vocabulary, longest sequence,
    end-of-sequence ids); the scheduler never runs it. Not thread-safe: :class:`trtforge.llm.engine.
    LLMEngine` serialises calls with a lock. A request aborted between :meth:`schedule` and
    :meth:`update` is dropped from that step's results.
    """

    def __init__(self, executor: StepExecutor, config: SchedulerConfig | None = None) -> None:
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
        self.stats = SchedulerStats()
        self._watermark_blocks = int(self.config.watermark * facts.num_blocks)
        self._waiting: deque[Sequence_] = deque()
        self._running: list[Sequence_] = []
        self._requests: dict[Hashable, Sequence_] = {}
        self._finished_outputs: list[RequestOutput] = []
        self._arrivals = itertools.count()
        self._seed_source = np.random.default_rng(self.config.seed)
        # compiles requests' response_format grammars (a trtforge.llm.structured.GrammarCompiler for the
        # model's tokenizer); None: such requests are refused
        self.grammar: Any = None

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
        try:
            hash(request_id)
        except TypeError as exc:
            raise UserError(
                f"request {request_id!r}: a request id must be hashable (a str or an int, say), "
                f"got a {type(request_id).__name__}"
            ) from exc
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise UserError(
                f"request {request_id!r}: sampling params must be a SamplingParams, got {params!r}"
            )
        if isinstance(prompt, (str, bytes)):
            raise UserError(f"request {request_id!r}: the prompt must be a sequence of token ids, got text")
        if params.stop:
            raise UserError(
                f"request {request_id!r}: SamplingParams.stop holds text stop strings {list(params.stop)!r}, "
                "which the token engine cannot match (it has no tokenizer; `trtforge serve` and `trtforge "
                "generate` match them on the decoded text); give their token ids as stop_sequences instead"
            )
        try:
            tokens = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        except TypeError:
            tokens = None
        # the common prompt is plain ints: one pass in C (type() is exact: a bool is not an int here)
        if tokens is None or set(map(type, tokens)) - {int}:
            bad = None if tokens is None else next((i for i, t in enumerate(tokens) if not is_int(t)), None)
            if tokens is None or bad is not None:
                got = type(prompt).__name__  # (else: the first element that is no token id, by position)
                if tokens is not None and bad is not None:
                    got = f"{type(tokens[bad]).__name__} {tokens[bad]!r} at position {bad}"
                raise UserError(
                    f"request {request_id!r}: the prompt must be a flat sequence of integer token ids, "
                    f"got {got}"
                )
            tokens = [int(t) for t in tokens]
        if not tokens:
            raise UserError(f"request {request_id!r}: the prompt is empty; give at least one token id")
        vocab = self.facts.input_vocab_size  # (the ids the embedding takes)
        if min(tokens) < 0 or max(tokens) >= vocab:
            bad = [t for t in tokens if not 0 <= t < vocab]
            raise UserError(
                f"request {request_id!r}: token id {bad[0]} is outside the vocabulary [0, {vocab})"
            )
        width = self.facts.vocab_size  # (the logits', narrower where the LM head is pruned)
        bias = params.logit_bias_arrays
        if bias is not None and int(bias[0].max()) >= width:
            raise UserError(
                f"request {request_id!r}: SamplingParams.logit_bias holds token id {int(bias[0].max())}, "
                f"outside the model's logits [0, {width}); bias only ids below {width}"
            )
        stops = [t for t in params.stop_token_ids if t >= width]
        if stops:  # (as the server refuses them: a stop the model never samples never stops anything)
            raise UserError(
                f"request {request_id!r}: SamplingParams.stop_token_ids holds token id {stops[0]}, outside "
                f"the model's logits [0, {width}): the model never samples it"
            )
        if len(tokens) >= self.max_model_len:
            f = self.facts
            why = (
                f" (the KV pool's {f.num_blocks} blocks of {f.block_size} tokens bound it)"
                if self.max_model_len == f.num_blocks * f.block_size < f.max_model_len
                else ""
            )
            raise UserError(
                f"request {request_id!r}: the prompt has {len(tokens)} tokens but the maximum sequence "
                f"length is {self.max_model_len}{why} (prompt + at least one generated token)"
            )
        if params.eos_token_id is not None:
            eos_ids: tuple[int, ...] = (params.eos_token_id,)
        else:  # every id of the model's
            eos_ids = self.facts.eos_token_ids
        eos_ids = () if params.ignore_eos else eos_ids
        eos = eos_ids[0] if eos_ids else None
        if params.n != 1:
            raise UserError(
                f"request {request_id!r}: SamplingParams.n={params.n}; a scheduler request is one sample, "
                "queue each of params.expand() (the engine's generate and submit_n do)"
            )
        matcher = None
        if params.response_format is not None:
            if self.grammar is None:
                raise UserError(
                    f"request {request_id!r}: SamplingParams.response_format needs the model's tokenizer "
                    "(load the model with one, e.g. from its directory)"
                )
            matcher = self.grammar.matcher(params.response_format)
        return Sequence_(
            matcher=matcher,
            logprobs=None if params.logprobs is None else [],
            request_id=request_id,
            tokens=tokens,
            prompt_len=len(tokens),
            params=params,
            eos_token_id=eos,
            seed=params.stream_seed(int(self._seed_source.integers(2**63))),
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
        """Whether there is work: requests waiting or running, or outputs not taken yet."""
        return bool(self._waiting or self._running or self._finished_outputs)

    def take_outputs(self) -> list[RequestOutput]:
        """The outputs made between steps (aborted requests), once."""
        outputs, self._finished_outputs = self._finished_outputs, []
        return outputs

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def running_request_ids(self) -> list[Hashable]:
        return [s.request_id for s in self._running]

    def running_sequences(self) -> list[Sequence_]:
        """The running sequences (a copy of the list), in arrival order: a proposer reads their tokens
        and sets their ``draft`` before :meth:`schedule` (speculative decoding)."""
        return list(self._running)

    def memory_stats(self) -> MemoryStats:
        """The block manager's occupancy with the executor's real bytes per block and cache dtype."""
        facts = self.facts
        return dataclasses.replace(
            self.block_manager.memory_stats(),
            block_bytes=facts.kv_bytes_per_token * facts.block_size,
            kv_dtype=facts.kv_dtype,
        )

    # ---- one step: plan, then results ----------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Plan the next step (an empty plan when nothing can run): its sequences, tokens, slots, block
        copies and samplers, with its batch built. Reserves the slots; runs and samples nothing."""
        plan = self._plan()
        if plan:
            self.stats.steps += 1
            self.stats.max_running = max(self.stats.max_running, len(self._running))
            plan.make_batch(self.block_manager, self._prompt_lens)
        return plan

    def computed(self, plan: StepPlan) -> None:
        """The plan's tokens have their K/V written (or, asynchronously, its writes are queued on the device
        ahead of any later step's reads, which is what a later step needs)."""
        finished = RequestStatus.FINISHED
        for seq, n in zip(plan.seqs, plan.counts):
            if seq.status is not finished:  # else aborted while the step ran: its blocks are already free
                # (proposals count once verified: update_speculative)
                seq.num_computed += n - len(seq.draft)
        self.block_manager.mark_computed_many(
            [(s.request_id, s.num_computed) for s in plan.seqs if s.status is not finished]
        )

    def defer(self, plan: StepPlan) -> None:
        """The plan's sampled tokens stay on the device for now (asynchronous scheduling): the next plans
        count each as known, and read it from row ``pending_row`` of the plan's samples."""
        for row, seq in enumerate(plan.samplers):
            seq.pending_row = row

    def update(
        self, plan: StepPlan, tokens: Sequence[int], logprobs: Sequence[Any] | None = None
    ) -> list[RequestOutput]:
        """Apply the tokens sampled for the plan's samplers (row order): append each to its sequence,
        advance its grammar, keep its `logprobs` (per row, from the sampler), finish those it stops
        (freeing their blocks); return the outputs of the requests that changed.

        A token that was deferred (:meth:`defer`) may already have a slot reserved, valueless, by the
        next launched step. If this token finishes its sequence, its blocks are freed at once although
        that step may still be writing into them (this token's K/V, the token fed on the device).
        Reusing them is safe by stream order: a step that hands one of those blocks to another sequence
        is launched after that step, on the same device stream (an executor runs its steps in order),
        so the late write lands before the new owner's writes, and a sequence reads only slots written
        before it reads them (its own, or a shared prefix's). The prefix cache stays sound: a
        placeholder enters no digest; a block this token completes is digested only here, from the real
        value, and the late write puts there that token's true K/V. (If the step before failed instead,
        nothing is filled, so nothing of it is cached.)
        """
        finished = RequestStatus.FINISHED
        fill = self.block_manager.fill_token
        outputs: list[RequestOutput] = []
        generated = 0
        for row, (seq, token) in enumerate(zip(plan.samplers, tokens)):
            if seq.pending_row >= 0:
                seq.pending_row = -1
                deferred = True
            else:
                deferred = False
            if seq.status is finished:
                continue  # aborted or failed meanwhile: its blocks are already free
            reason = self._append(seq, token)
            if deferred:
                fill(seq.request_id, token)  # the next step reserved this token's slot, valueless
            generated += 1
            lp = None
            if seq.logprobs is not None and logprobs is not None:
                lp = (logprobs[row],)
                seq.logprobs.append(logprobs[row])
            if reason is not None:
                outputs.append(self._retire(seq, reason, (token,), lp))
            else:
                outputs.append(RequestOutput(seq.request_id, (token,), (), False, logprobs=lp))
        self.stats.generated_tokens += generated
        return outputs

    def update_speculative(
        self, plan: StepPlan, tokens: Sequence[Sequence[int]], logprobs: Sequence[Any] | None = None
    ) -> list[RequestOutput]:
        """Apply a verified step (synchronous steps only): for each sampler (row order) the tokens it
        emits, its accepted proposals then one token of the target's (a sequence without proposals: one
        token, with its `logprobs` row).

        The K/V of the rejected proposals is rolled back first: the sequence's table is cut to its
        last accepted token (blocks past it go back to the pool; the slots of a kept block are reused
        by the next step), and the accepted ones count as computed. Then the tokens are appended one by
        one with the stop checks; a stop ends the sequence there and drops the tokens after it.
        """
        finished = RequestStatus.FINISHED
        bm, stats = self.block_manager, self.stats
        outputs: list[RequestOutput] = []
        generated = 0
        for row, (seq, new) in enumerate(zip(plan.samplers, tokens)):
            k = len(seq.draft)
            seq.draft = []
            if seq.status is finished:
                continue  # aborted or failed meanwhile: its blocks are already free
            if k:
                accepted = len(new) - 1
                stats.spec_draft_tokens += k
                stats.spec_accepted_tokens += accepted
                stats.spec_verify_rows += 1
                seq.num_computed += accepted
                bm.truncate(seq.request_id, seq.num_computed)
                bm.mark_computed(seq.request_id, seq.num_computed)
            lp = None
            if seq.logprobs is not None and logprobs is not None and not k:
                lp = (logprobs[row],)
                seq.logprobs.append(logprobs[row])
            emitted: list[int] = []
            reason = None
            for token in new:
                emitted.append(token)
                reason = self._append(seq, token)
                if reason is not None:
                    break
            generated += len(emitted)
            if reason is not None:
                outputs.append(self._retire(seq, reason, tuple(emitted), lp))
            else:
                outputs.append(RequestOutput(seq.request_id, tuple(emitted), (), False, logprobs=lp))
        stats.generated_tokens += generated
        return outputs

    def fail(self, plan: StepPlan, exc: Exception) -> list[RequestOutput]:
        """End every unfinished sequence of a failed step with a StepFailedError caused by `exc`."""
        self.stats.failed_steps += 1
        error = exc if isinstance(exc, StepFailedError) else StepFailedError(f"executor step failed: {exc!r}")
        if error is not exc:
            error.__cause__ = exc
        outputs: list[RequestOutput] = []
        for seq in plan.samplers:
            seq.pending_row = -1
        for seq in plan.seqs:
            if seq.status is RequestStatus.FINISHED:
                continue  # aborted while the step ran, or already finished by the step before
            if seq.status is RequestStatus.RUNNING:
                self._running.remove(seq)
            else:
                self._waiting.remove(seq)
            self._finish(seq, "error", error)
            outputs.append(self._output(seq, (), finished=True))
        return outputs

    def _prefill_budget_with_decodes(self, ones: int) -> int:
        """Prompt tokens a step with `ones` one-token rows (decodes) takes: the configured cap, raised so
        that the step's tokens reach the executor's next padding bucket (``fill_step_buckets``), since
        the padding would be computed anyway; never past ``max_num_batched_tokens``."""
        cap = self.config.max_prefill_tokens_with_decodes
        buckets = self.facts.step_token_buckets
        if not (self.config.fill_step_buckets and buckets):
            return cap
        want = ones + cap
        for b in buckets:
            if b >= want:
                return max(cap, min(b, self.config.max_num_batched_tokens) - ones)
        return cap

    def _plan(self) -> StepPlan:
        bm = self.block_manager
        append_token = bm.append_token
        budget = self.config.max_num_batched_tokens
        chunk = self.config.max_prefill_chunk
        plan = StepPlan()
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
            draft = seq.draft
            if left == 1 and not draft:  # the common decode case, without the general path's bookkeeping
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
                ones = sum(1 for s in running if len(s.tokens) + (s.pending_row >= 0) - s.num_computed == 1)
                if ones:
                    prefill_budget = self._prefill_budget_with_decodes(ones)
            if draft:  # speculative verification: the last token and its proposals, within the budget
                del draft[budget - 1 :]
                run: list = [tokens[-1], *draft]
                n = len(run)
            else:
                n = min(left, chunk, budget) if left == 1 else min(left, chunk, budget, prefill_budget)
                if n == 0:
                    i += 1  # a prompt chunk waits for the next step's prefill budget
                    continue
                run = [None] if pending else tokens[start : start + n]
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
            if draft:
                plan.speculative = True
                self.stats.decode_tokens += 1
            else:
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
            prefill_budget = self._prefill_budget_with_decodes(len(seqs))
        # blocks the running sequences will still take as they grow to their whole length (only kept when
        # admission reserves them: reserve_max_tokens)
        growth = self._growth_blocks() if self._waiting and self.config.reserve_max_tokens else 0
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
            if self.config.reserve_max_tokens and running:
                # its own growth past the prompt, and everyone else's
                reserve += growth + bm.blocks_for(seq.length_limit) - bm.blocks_for(len(seq.tokens))
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
            if self.config.reserve_max_tokens:
                growth += bm.blocks_for(seq.length_limit) - len(bm.block_table_view(seq.request_id))
        plan.finish()
        return plan

    def _growth_blocks(self) -> int:
        """Blocks the running sequences do not hold yet but will at their whole length (length_limit)."""
        bm = self.block_manager
        blocks_for, held = bm.blocks_for, bm.block_table_view
        return sum(max(0, blocks_for(s.length_limit) - len(held(s.request_id))) for s in self._running)

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
        seq.draft = []
        seq.num_preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(seq)

    def _append(self, seq: Sequence_, token: int) -> str | None:
        """Append a sampled `token` to `seq` and advance its grammar; the reason it stops there, if it
        does (the full check runs only where a stop is possible). A grammar that cannot go on (its
        GrammarError) ends this sequence with that error, not the engine's loop with every request."""
        seq.tokens.append(token)
        if seq.matcher is not None:
            try:
                seq.matcher.accept(token)
            except GrammarError as e:
                seq.error = e
                return "error"
        if (
            token in seq.stop_ids
            or len(seq.tokens) >= seq.length_limit
            or seq.params.stop_sequences
            or seq.matcher is not None
        ):
            return self._stop_reason(seq)
        return None

    def _retire(self, seq: Sequence_, reason: str, new: tuple[int, ...], lp: Any) -> RequestOutput:
        """Finish `seq` (running, or preempted while its tokens were in flight) for `reason`: its final
        output carrying the `new` tokens and their logprobs `lp`."""
        if seq.status is RequestStatus.RUNNING:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self._finish(seq, reason, seq.error if reason == "error" else None)
        return self._output(seq, new, finished=True)._replace(logprobs=lp)

    def _stop_reason(self, seq: Sequence_) -> str | None:
        token = seq.tokens[-1]
        p = seq.params
        if token in seq.stop_ids:  # the stop ids and every end-of-sequence id
            return "stop"
        if seq.matcher is not None and seq.matcher.is_terminated:
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
            output_logprobs=tuple(seq.logprobs) if finished and seq.logprobs is not None else None,
        )
