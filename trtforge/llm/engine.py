"""LLMEngine: a background loop stepping the scheduler, fed by submissions from any thread or event loop.

Callers get a :class:`RequestHandle` per request: iterate it for tokens as they are sampled, wait for
the :class:`Completion`, or cancel it. Submissions are validated in the caller's thread (a bad
request raises UserError there) and handed to the loop through an inbox, so a submitting thread
never waits for a step to finish. The thread drives a step loop (:func:`make_step_loop`: schedule ->
execute + sample -> update, :mod:`trtforge.llm.loop`; one step in flight, :mod:`trtforge.llm.async_loop`).
Under asynchronous scheduling a step's outputs come out of the next step; the thread keeps stepping
while one is in flight, and flushes it on close.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from trtforge.errors import TrtforgeError, UserError
from trtforge.llm import gc_heap
from trtforge.llm.async_loop import AsyncStepLoop
from trtforge.llm.executors.base import (
    AsyncStepExecutor,
    ExecutorLostError,
    StepExecutor,
    supports_async,
)
from trtforge.llm.loop import StepHook, StepLoop
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.blocks import MemoryStats
from trtforge.llm.sched.scheduler import RequestOutput, Scheduler, SchedulerConfig, SchedulerStats

if TYPE_CHECKING:
    from trtforge.llm.spec.proposers import Proposer


def make_step_loop(
    executor: StepExecutor,
    config: SchedulerConfig | None = None,
    step_hook: StepHook | None = None,
    proposer: Proposer | None = None,
) -> StepLoop:
    """A scheduler over `executor` and the loop that runs it: asynchronous where the executor offers
    ``step_async`` and ``config.async_scheduling`` is not False (True requires it), else synchronous.

    With a `proposer` (speculative decoding, :mod:`trtforge.llm.spec_loop`) the loop is synchronous:
    a step's accepted tokens decide the next one's inputs (``async_scheduling=True`` is refused)."""
    if proposer is not None and not getattr(executor, "supports_speculation", False):
        raise UserError(
            f"speculative decoding needs an executor that returns logits for every verified token (the "
            f"torch executor: trtforge.llm.from_pretrained); {type(executor).__name__} returns one row of "
            "logits per sequence. Drop the proposer or serve the model's directory."
        )
    scheduler = Scheduler(executor, config)
    if proposer is not None:
        if scheduler.config.async_scheduling:
            raise UserError(
                "SchedulerConfig.async_scheduling=True cannot run with speculative decoding: each step's "
                "accepted tokens decide the next step's inputs (leave it None or False)"
            )
        from trtforge.llm.spec_loop import SpeculativeStepLoop

        return SpeculativeStepLoop(executor, scheduler, proposer, step_hook)
    wanted, offered = scheduler.config.async_scheduling, supports_async(executor)
    if wanted and not offered:
        raise UserError(
            f"SchedulerConfig.async_scheduling=True needs an executor with step_async; "
            f"{type(executor).__name__} runs steps synchronously only (leave it None or False)"
        )
    if offered if wanted is None else wanted:
        return AsyncStepLoop(cast(AsyncStepExecutor, executor), scheduler, step_hook)
    return StepLoop(executor, scheduler, step_hook)


class EngineClosedError(TrtforgeError):
    """The engine was closed (or its loop died) before the request finished."""


@dataclass(frozen=True)
class Completion:
    """A finished request: generated token ids and why it ended ("stop", "length", "abort", "error");
    `logprobs`: one :class:`~trtforge.llm.penalties.TokenLogprobs` per token when the params asked."""

    request_id: Hashable
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finish_reason: str
    error: BaseException | None = None
    logprobs: tuple[Any, ...] | None = None


_DONE = object()


class StepTokens(tuple):
    """One step's new token ids, a tuple as any other, with their TokenLogprobs (`logprobs`) for a request
    that asked for them: what a stream sends with each piece. Only those requests' events are made as
    this class; the others' stay plain tuples."""

    logprobs: tuple[Any, ...] | None

    def __new__(cls, ids: tuple[int, ...], logprobs: tuple[Any, ...] | None) -> StepTokens:
        obj = super().__new__(cls, ids)
        obj.logprobs = logprobs
        return obj


class RequestHandle:
    """One submitted request: iterate for its tokens, :meth:`result` for the completion, :meth:`cancel`."""

    def __init__(
        self,
        engine: LLMEngine,
        request_id: Hashable,
        prompt: tuple[int, ...],
        on_event: Callable[[Any], None] | None = None,
    ) -> None:
        self.request_id = request_id
        self._engine = engine
        self._prompt = prompt
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._on_event = on_event
        self._done = threading.Event()
        self._completion: Completion | None = None

    def _deliver(self, out: RequestOutput) -> None:
        if out.new_token_ids:
            lps = out.logprobs
            self._push(out.new_token_ids if lps is None else StepTokens(out.new_token_ids, lps))
        if out.finished:
            self._complete(
                Completion(
                    self.request_id,
                    self._prompt,
                    out.output_token_ids,
                    out.finish_reason or "",
                    out.error,
                    out.output_logprobs,
                )
            )

    def _complete(self, completion: Completion) -> None:
        if self._done.is_set():
            return
        self._completion = completion
        self._done.set()
        self._push(_DONE)

    def _push(self, event: Any) -> None:
        self._events.put(event)
        if self._on_event is not None:
            self._on_event(event)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def completion(self, timeout: float | None = None) -> Completion:
        """Wait for the request to end and return its :class:`Completion` (failed ones carry `error`)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id!r} did not finish within {timeout} s")
        assert self._completion is not None
        return self._completion

    def result(self, timeout: float | None = None) -> Completion:
        """Like :meth:`completion`, but raise the request's error if it failed."""
        completion = self.completion(timeout)
        if completion.error is not None:
            raise completion.error
        return completion

    def cancel(self) -> None:
        """Stop generating and free the request's KV blocks (a no-op once it has finished)."""
        if not self.done:
            self._engine._cancel(self)

    def __iter__(self) -> Iterator[int]:
        """Yield token ids as they are sampled; raise the request's error if it fails."""
        while True:
            event = self._events.get()
            if event is _DONE:
                break
            yield from event
        if self._completion is not None and self._completion.error is not None:
            raise self._completion.error


# a request to queue: (label for its errors or None, prompt, params, request id or None, on_event or None)
_Request = tuple[str | None, Any, Any, Hashable | None, Callable[[Any], None] | None]


def _expand(params: Any) -> list[SamplingParams]:
    """The single-sample requests of `params` (:meth:`SamplingParams.expand`); UserError if it is not
    a SamplingParams."""
    if not isinstance(params, SamplingParams):
        raise UserError(f"sampling params must be a SamplingParams, got {params!r}")
    return params.expand()


class LLMEngine:
    """Serves requests over `executor` with continuous batching; safe to call from many threads.

    Use as a context manager or call :meth:`close`. `step_hook` runs inside every step (tests use it
    to check invariants). `proposer`: speculative decoding (:mod:`trtforge.llm.spec`). `freeze_gc`:
    collect, then freeze the Python heap alive at the start until :meth:`close`
    (:mod:`trtforge.llm.gc_heap`), so that a full garbage collection, which holds the GIL while it
    walks every object, does not stall the step launches for 0.1 s or more.
    """

    def __init__(
        self,
        executor: StepExecutor,
        config: SchedulerConfig | None = None,
        *,
        step_hook: StepHook | None = None,
        proposer: Proposer | None = None,
        freeze_gc: bool = True,
    ) -> None:
        self._steps = make_step_loop(executor, config, step_hook, proposer)
        self._scheduler = self._steps.scheduler
        self._inbox_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._wake = threading.Condition(self._inbox_lock)
        self._inbox: list[Any] = []
        self._cancels: list[RequestHandle] = []
        self._handles: dict[Hashable, RequestHandle] = {}
        self._ids = itertools.count()
        self._closed = False
        self._fatal: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="trtforge-llm-engine", daemon=True)
        self._frozen = freeze_gc
        if freeze_gc:
            gc_heap.freeze()
        try:
            self._thread.start()
        except BaseException:
            self._thaw()
            raise

    # ---- submission ----------------------------------------------------------------------------
    def submit(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        *,
        request_id: Hashable | None = None,
        on_event: Callable[[Any], None] | None = None,
    ) -> RequestHandle:
        """Queue one request and return its handle; a bad prompt or params raise UserError here."""
        return self._queue([(None, prompt, params, request_id, on_event)])[0]

    def submit_many(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams | None] | None = None,
        *,
        on_events: Sequence[Callable[[Any], None] | None] | None = None,
        labels: Sequence[str | None] | None = None,
    ) -> list[RequestHandle]:
        """Queue many requests together, all or none: every one is checked first (a bad one raises
        UserError naming it, and none is queued), then all join the queue at once, so the next step
        schedules from all of them. `params` is one SamplingParams for all or one per prompt, each with
        ``n == 1`` (:meth:`generate` expands n); `on_events` one callback (or None) per prompt; `labels`
        how an error names each prompt (default ``prompts[i]``; None: by its request id alone).

        For requests in hand (an offline batch): submitted one by one while the engine steps, each
        check waits for the GIL behind the step's kernel launches and the step behind the checks; a
        step launched while 1,000 long prompts were submitted took 10x its time (BENCHMARKS.md,
        session 33). The checks hold the queue, so a running batch waits for them at its next step."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
            raise UserError(
                f"submit_many takes a sequence of prompts (token id lists), got {type(prompts).__name__}"
            )
        prompts = list(prompts)
        per = self._per_prompt("params", params, len(prompts))
        events = self._per_prompt("on_events", on_events, len(prompts), one=False)
        names = [f"prompts[{i}]" for i in range(len(prompts))] if labels is None else labels
        names = self._per_prompt("labels", names, len(prompts), one=False)
        return self._queue([(n, p, q, None, e) for n, p, q, e in zip(names, prompts, per, events)])

    @staticmethod
    def _per_prompt(name: str, value: Any, count: int, one: bool = True) -> list[Any]:
        """`value` for each of `count` prompts: None, one value for all (where `one`), or one each."""
        if value is None or (one and isinstance(value, SamplingParams)):
            return [value] * count
        if not isinstance(value, Iterable) or isinstance(value, (str, bytes)):
            raise UserError(f"{name} takes one value for each prompt, got {type(value).__name__}")
        values = list(value)
        if len(values) != count:
            raise UserError(f"got {count} prompts but {len(values)} {name}: give one for all or one each")
        return values

    def _queue(self, requests: list[_Request]) -> list[RequestHandle]:
        """Check every (label, prompt, params, request id, on_event) and queue them all, or raise the
        first one's UserError (prefixed by its label) and queue none."""
        with self._inbox_lock:
            self._check_open()
            seqs, rids = [], set()
            for label, prompt, params, request_id, _ in requests:
                rid = request_id
                if rid is None:  # the engine's own name, past any that a caller gave and is still in use
                    rid = f"req-{next(self._ids)}"
                    while rid in self._handles or rid in rids:
                        rid = f"req-{next(self._ids)}"
                try:
                    seq = self._scheduler.make_sequence(rid, prompt, params)  # (first: is rid hashable)
                    if rid in self._handles or rid in rids:
                        raise UserError(f"request id {rid!r} is already in use by an unfinished request")
                    seqs.append(seq)
                except UserError as exc:
                    if label is None:
                        raise
                    raise UserError(f"{label}: {exc}") from exc
                rids.add(rid)
            handles = []
            for seq, (*_, on_event) in zip(seqs, requests):
                handle = RequestHandle(self, seq.request_id, tuple(seq.tokens), on_event)
                self._handles[seq.request_id] = handle
                handles.append(handle)
            self._inbox.extend(seqs)
            self._wake.notify()
        return handles

    def submit_n(self, prompt: Sequence[int], params: SamplingParams) -> list[RequestHandle]:
        """Queue the ``params.n`` samples of one prompt (:meth:`SamplingParams.expand`), one handle each;
        they share the prompt's cached prefix blocks once its first copy has computed them."""
        samples = _expand(params)
        return self._queue([(None, prompt, p, None, None) for p in samples])

    def enable_structured_output(self, tokenizer: Any) -> None:
        """Accept requests with ``response_format``, compiling their grammars over `tokenizer`'s
        vocabulary (the model's; needs the ``structured`` extra)."""
        from trtforge.llm.structured import GrammarCompiler

        with self._inbox_lock:
            self._scheduler.grammar = GrammarCompiler(tokenizer, self._scheduler.facts.vocab_size)

    def hold_response_format(self, response_format: dict[str, Any]) -> Callable[[], None]:
        """Compile `response_format`'s grammar now and keep it cached until the returned function is
        called. A server calls this off its event loop before submitting and lets go after: no compile
        then runs under the engine's lock, not even for a grammar other clients' schemas would have
        evicted meanwhile (:meth:`trtforge.llm.structured.GrammarCompiler.hold`). UserError for a schema
        refused, failing or too slow to compile; a no-op without :meth:`enable_structured_output`, where
        submitting refuses the request."""
        grammar = self._scheduler.grammar
        if grammar is None:
            return lambda: None
        return grammar.hold(response_format)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Run every prompt to completion (batched together) and return completions in prompt order.

        `params` is one SamplingParams for all prompts or one per prompt; a prompt whose params have
        ``n > 1`` contributes its n completions in a row. If any request is invalid, UserError is
        raised and none of them runs. Failed requests come back with `error` set.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
            raise UserError(
                f"prompts must be a list of token-id lists, e.g. [[1, 2, 3]], got {type(prompts).__name__}"
            )
        prompts = prompts if hasattr(prompts, "__len__") else list(prompts)
        per = self._per_prompt("SamplingParams", params, len(prompts))
        requests = [
            (f"prompts[{i}]", prompt, sample, None, None)
            for i, (prompt, p) in enumerate(zip(prompts, per))
            for sample in _expand(SamplingParams() if p is None else p)
        ]
        handles = self._queue(requests)
        return [h.completion() for h in handles]

    def stream(self, prompt: Sequence[int], params: SamplingParams | None = None) -> Iterator[int]:
        """Yield the request's token ids as they are sampled; closing the iterator early cancels it."""
        handle = self.submit(prompt, params)
        try:
            yield from handle
        finally:
            handle.cancel()

    async def astream(
        self, prompt: Sequence[int], params: SamplingParams | None = None
    ) -> AsyncIterator[int]:
        """Async twin of :meth:`stream` for an asyncio event loop; cancelling the task cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def forward(event: Any) -> None:
            if not loop.is_closed():  # a loop that is gone has no reader left; the finally cancels
                loop.call_soon_threadsafe(events.put_nowait, event)

        handle = self.submit(prompt, params, on_event=forward)
        try:
            while True:
                event = await events.get()
                if event is _DONE:
                    break
                for token in event:
                    yield token
            completion = handle.completion()
            if completion.error is not None:
                raise completion.error
        finally:
            handle.cancel()

    # ---- state ---------------------------------------------------------------------------------
    def memory_stats(self) -> MemoryStats:
        """KV pool occupancy between steps (:meth:`~trtforge.llm.sched.blocks.BlockManager.memory_stats`)."""
        with self._step_lock:
            return self._scheduler.memory_stats()

    @property
    def stats(self) -> SchedulerStats:
        return self._scheduler.stats

    @property
    def num_running(self) -> int:
        """Sequences in the running batch now (a server's gauge; read without the step lock)."""
        return self._scheduler.num_running

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission now."""
        return self._scheduler.num_waiting

    @property
    def fatal_error(self) -> BaseException | None:
        """The error that stopped the loop (a lost executor, a scheduler bug), None while it runs or after
        a plain close: from then on every request fails, so a server reports itself unhealthy and exits."""
        return self._fatal

    @property
    def max_model_len(self) -> int:
        """The longest prompt + output a request may have (the model's, the pool's and the config's)."""
        return self._scheduler.max_model_len

    @property
    def config(self) -> SchedulerConfig:
        """The scheduler's configuration in force."""
        return self._scheduler.config

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is queued or running; False on timeout."""
        with self._wake:
            return self._wake.wait_for(
                lambda: self._closed or (not self._inbox and not self._handles), timeout=timeout
            )

    def close(self) -> None:
        """Stop the loop; unfinished requests end with EngineClosedError. The grammar compiler closes
        first, outside the queue's lock: a submission waiting there on a compile ends at once."""
        grammar = self._scheduler.grammar
        if grammar is not None:
            grammar.close()
        with self._inbox_lock:
            self._closed = True
            self._wake.notify_all()
        if threading.current_thread() is not self._thread:  # (a finalizer may run on the loop's thread)
            self._thread.join()
        self._thaw()

    def _thaw(self) -> None:
        with self._inbox_lock:
            frozen, self._frozen = self._frozen, False
        if frozen:
            gc_heap.thaw()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the loop ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if isinstance(self._fatal, ExecutorLostError):
            raise EngineClosedError(f"the engine stopped: {self._fatal}")
        if self._fatal is not None:
            raise EngineClosedError(f"the engine loop stopped on an internal error: {self._fatal!r}")
        if self._closed:
            raise EngineClosedError("the engine is closed")

    def _cancel(self, handle: RequestHandle) -> None:
        with self._inbox_lock:
            self._cancels.append(handle)
            self._wake.notify()

    def _loop(self) -> None:
        sched, steps = self._scheduler, self._steps
        try:
            while True:
                with self._wake:
                    self._wake.wait_for(
                        lambda: self._closed or self._inbox or self._cancels or steps.has_unfinished()
                    )
                    if self._closed:
                        break
                    inbox, self._inbox = self._inbox, []
                    # a cancel whose request has finished meanwhile is dropped: its id may be in use again,
                    # by a request submitted since, which it must not end
                    cancels = [h.request_id for h in self._cancels if self._handles.get(h.request_id) is h]
                    self._cancels = []
                with self._step_lock:
                    for seq in inbox:
                        sched.enqueue(seq)
                    for rid in cancels:
                        sched.abort(rid)
                    outputs = steps.step()
                self._dispatch(outputs)
            with self._step_lock:
                outputs = steps.flush()  # closed: tokens already computed still reach their streams
            self._dispatch(outputs)
        except ExecutorLostError as exc:  # the executor is gone: every waiter learns why; no traceback
            self._fatal = exc
        except BaseException as exc:  # a scheduler bug: every waiter learns of it, then it propagates
            self._fatal = exc
            raise
        finally:
            self._fail_all()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            handle = self._handles.get(out.request_id)
            if handle is None:
                continue
            handle._deliver(out)
            if out.finished:
                with self._wake:
                    del self._handles[out.request_id]
                    self._wake.notify_all()

    def _fail_all(self) -> None:
        with self._wake:
            handles, self._handles = self._handles, {}
            self._closed = True
            self._wake.notify_all()
        if isinstance(self._fatal, ExecutorLostError):
            reason = f"the engine stopped: {self._fatal}"
        elif self._fatal is not None:
            reason = "the engine loop stopped on an internal error"
        else:
            reason = "the engine was closed"
        for handle in handles.values():
            err = EngineClosedError(f"request {handle.request_id!r} did not finish: {reason}")
            err.__cause__ = self._fatal
            handle._complete(Completion(handle.request_id, handle._prompt, (), "error", err))
