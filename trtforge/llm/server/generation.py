"""One sequence of a request on the event loop: the engine's token events become final text pieces.

The engine thread calls back with each step's tokens; the callback only hands them to the event
loop. A stop string found in the text cancels the request in the engine (its blocks return at the
next step); so does closing the choice early (a client that went away, a timeout).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from trtforge.llm.engine import EngineClosedError
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import StepFailedError
from trtforge.llm.server.protocol import ApiError
from trtforge.llm.structured import GrammarError
from trtforge.llm.text import TextStream

FINISH_REASONS = {"stop": "stop", "length": "length"}


class Dispatcher:
    """Hands engine events to the event loop with one wake-up per batch of them, not one per event.

    The engine thread calls back once per request per step; waking the loop for each (a write to its
    self-pipe) would cost the engine thread a system call per running request per step. Events queue
    in a deque, and a drain is scheduled only when none is pending; the drain runs on the loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: collections.deque = collections.deque()
        self.scheduled = False

    def put(self, queue: asyncio.Queue, event: Any) -> None:  # the engine's thread
        self.pending.append((queue, event))
        if not self.scheduled and not self.loop.is_closed():
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self.scheduled = False  # before popping: an event appended from now on schedules its own drain
        pending = self.pending
        while pending:
            queue, event = pending.popleft()
            queue.put_nowait(event)


class Choice:
    """One generated sequence: iterate its text pieces, read how it finished (:meth:`submit_all`
    queues a request's choices)."""

    def __init__(
        self, state: Any, prompt: Sequence[int], params: SamplingParams, stops: Sequence[str]
    ) -> None:
        self.state = state
        self.events: asyncio.Queue = asyncio.Queue()
        self.text = TextStream(state.tokenizer, prompt, stops)
        self.prompt_len = len(prompt)
        self.num_tokens = 0
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.completion: Any = None
        self.start = time.perf_counter()
        self.last: float | None = None
        self.prompt, self.params = list(prompt), params
        self.handle: Any = None
        self.pending_logprobs: list[Any] = []  # of tokens counted but not yet streamed (take_logprobs)

    @staticmethod
    def submit_all(state: Any, choices: Sequence[Choice], labels: Sequence[str | None]) -> None:
        """Queue `choices` in one engine call, all or none (a refused one raises UserError naming its
        label; a closing engine, ApiError 503), so that a request's choices start in the same step."""
        try:
            handles = state.engine.submit_many(
                [c.prompt for c in choices],
                [c.params for c in choices],
                on_events=[c._forward for c in choices],
                labels=labels,
            )
        except EngineClosedError as e:
            raise ApiError(503, f"the server is shutting down ({e})") from None
        for choice, handle in zip(choices, handles):
            choice.handle = handle

    def _forward(self, event: Any) -> None:  # the engine's thread
        self.state.dispatcher.put(self.events, event)

    def _observe(self, tokens: tuple[int, ...]) -> None:
        now, m = time.perf_counter(), self.state.metrics
        if self.last is None:
            m.ttft.observe(now - self.start)
        else:
            m.itl.observe((now - self.last) / len(tokens))
        self.last = now
        m.generation_tokens.inc(len(tokens))

    async def pieces(self) -> AsyncIterator[str]:
        """Text pieces as they become final; sets :attr:`finish_reason` at the end."""
        try:
            while True:
                event = await self.events.get()
                if isinstance(event, tuple):  # the tokens of one step
                    self._observe(event)
                    piece, used = self._push(event)
                    self.num_tokens += used
                    self.token_ids.extend(event[:used])
                    step_logprobs = getattr(event, "logprobs", None)  # (a StepTokens where asked)
                    if step_logprobs:
                        self.pending_logprobs.extend(step_logprobs[:used])
                    if self.text.stopped is not None:
                        self.handle.cancel()
                        self.finish_reason = "stop"
                        if piece:
                            yield piece
                        if self.params.logprobs is not None:  # the stopped request's, up to the stop
                            self.completion = await self._cancelled_completion()
                        return
                    if piece:
                        yield piece
                    continue
                self.completion = completion = self.handle.completion()
                if completion.error is not None:
                    raise _api_error(completion.error)
                tail = self.text.finish()
                if tail:
                    yield tail
                self.finish_reason = FINISH_REASONS.get(completion.finish_reason, completion.finish_reason)
                return
        finally:
            self.state.metrics.e2e.observe(time.perf_counter() - self.start)
            self.handle.cancel()  # a no-op once finished; else the client left or timed out

    def _push(self, tokens: tuple[int, ...]) -> tuple[str, int]:
        """The text of `tokens` (one step's) that is final, and how many of them count: all, or on a stop
        string those up to the one completing it. A step of several tokens (speculative decoding) may
        run past a stop; the tokens after it are not the output, so usage and logprobs leave them out,
        and a request counts the same tokens with a draft as without."""
        if len(tokens) == 1 or not self.text.matcher.stops:
            return self.text.push(tokens), len(tokens)
        pieces = []
        for k, token in enumerate(tokens, 1):
            pieces.append(self.text.push((token,)))
            if self.text.stopped is not None:
                return "".join(pieces), k
        return "".join(pieces), len(tokens)

    async def _cancelled_completion(self) -> Any:
        """The Completion of a request cancelled on a stop string (its logprobs): the engine's abort, or
        its own finish if that came first, is the next non-token event."""
        while isinstance(event := await self.events.get(), tuple):
            pass
        del event
        return self.handle.completion()

    def take_logprobs(self) -> list[Any]:
        """The TokenLogprobs of the tokens counted since the last call: a stream sends them with the piece
        they led to (a token whose text is held back goes with the next piece, or the finish)."""
        out, self.pending_logprobs = self.pending_logprobs, []
        return out

    async def collect(self) -> str:
        return "".join([p async for p in self.pieces()])

    def logprobs(self) -> list[Any] | None:
        """Per generated token, what the engine reports for it (``Completion.logprobs``), if anything: of
        those counted (:attr:`num_tokens`; a stopped request's engine may have sampled past its stop)."""
        raw = getattr(self.completion, "logprobs", None)
        return None if raw is None else list(raw[: self.num_tokens])


def _api_error(err: BaseException) -> ApiError:
    if isinstance(err, StepFailedError):
        return ApiError(500, f"the model failed the step this request was in ({err}); retry it")
    if isinstance(err, EngineClosedError):
        return ApiError(503, f"the server is shutting down ({err})")
    if isinstance(err, GrammarError):  # the request's schema, which this tokenizer cannot spell
        return ApiError(400, str(err), "response_format")
    return ApiError(500, f"generation failed ({type(err).__name__}: {err})")
