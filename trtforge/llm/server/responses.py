"""OpenAI's response bodies: whole completions, SSE chunks (with the usage chunk and [DONE]), logprobs.

The streaming body reads every choice's pieces from one queue that tasks started with the request
fill (:class:`Pumps`), so the order of pieces across choices is the order they became final.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from trtforge.llm.server.generation import Choice
from trtforge.llm.server.protocol import ApiError

log = logging.getLogger("trtforge.serve")


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _token_text(tok: Any, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a byte-level BPE vocabulary spells each byte
    with -> that byte (printable bytes are themselves, the others shifted past 255)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: b for b in kept}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {chr(c): b for b, c in chars.items()}


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback pieces


def _token_bytes(tok: Any, token_id: int, text: str) -> list[int]:
    """The UTF-8 bytes of a token whose text is `text`, as chat logprobs' ``bytes`` carries them: a token
    of part of a character (byte-level BPE splits é, CJK, emoji...) decodes to U+FFFD, whose bytes are not
    the token's; its own are read from its vocabulary piece (a byte-level one, or a ``<0xC3>`` byte
    fallback), so that a client joining the tokens' bytes gets the text back, as OpenAI's field promises."""
    if "\ufffd" in text:
        convert = getattr(tok, "convert_ids_to_tokens", None)
        piece = convert(token_id) if convert is not None else None
        if isinstance(piece, str) and piece:
            m = _BYTE_PIECE.fullmatch(piece)
            if m:
                return [int(m.group(1), 16)]
            decoder = _byte_decoder()
            if all(ch in decoder for ch in piece):
                return [decoder[ch] for ch in piece]
    return list(text.encode())


def _entries(choice: Choice | list[Any]) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """(token, its logprob, the top alternatives) per generated token, from the engine's Completion
    (:class:`~trtforge.llm.penalties.TokenLogprobs` each), or of the given TokenLogprobs (a streamed
    piece's)."""
    raw = choice if isinstance(choice, list) else choice.logprobs()
    if raw is None:
        raise ApiError(500, "logprobs were asked for but the engine returned none")
    return [(int(e.token_id), float(e.logprob), [(int(t), float(v)) for t, v in e.top]) for e in raw]


class TextOffsets:
    """A choice's text offsets (the completions API's ``text_offset``): each token's is the character of
    the text it starts, or, a token of part of a character, the character it is part of. Counted on the
    tokens' bytes, not on each token's own text: a character of several tokens (byte-level BPE's é) has
    them each decode to U+FFFD alone, and counting those put the offsets past the end of the text."""

    def __init__(self) -> None:
        self.pos = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def advance(self, tok: Any, token_id: int, text: str) -> int:
        """The offset of the token `token_id` (its text `text`) that comes next."""
        at = self.pos
        self.pos += len(self._utf8.decode(bytes(_token_bytes(tok, token_id, text))))
        return at


def _completion_logprobs(
    state: Any, choice: Choice | list[Any], k: int, offsets_of: TextOffsets | None = None
) -> dict[str, Any]:
    """The completions API's logprobs object; `offsets_of`: the choice's text offsets so far (a stream's
    chunks continue them)."""
    tok, tokens, lps, tops, offsets = state.tokenizer, [], [], [], []
    at = offsets_of if offsets_of is not None else TextOffsets()
    for token, lp, items in _entries(choice):
        text = _token_text(tok, token)
        tokens.append(text)
        lps.append(lp)
        tops.append(_top_by_text(tok, items, k))
        offsets.append(at.advance(tok, token, text))
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _top_by_text(tok: Any, items: list[tuple[int, float]], k: int) -> dict[str, float]:
    """The `k` likeliest alternatives as the completions API gives them: a dict from the token's text to
    its logprob, likeliest first. Two tokens can decode to the same text (byte-level tokens of a partial
    UTF-8 character each decode to U+FFFD; a token and its duplicate in the vocabulary). The dict the
    format prescribes (OpenAI's SDK types it ``list[dict[str, float]]``) holds one entry per text, so it
    keeps the likeliest token's logprob, the one a greedy step would take, and has fewer than `k` entries
    then (a comprehension kept the last, least likely one). Chat's top_logprobs, a list of objects with
    each token's bytes, keeps every token."""
    out: dict[str, float] = {}
    for t, v in sorted(items, key=lambda x: -x[1])[:k]:
        out.setdefault(_token_text(tok, t), v)
    return out


def _chat_logprobs(state: Any, choice: Choice | list[Any], k: int) -> dict[str, Any]:
    tok, content = state.tokenizer, []
    for token, lp, items in _entries(choice):
        text = _token_text(tok, token)
        top = []
        for t, v in sorted(items, key=lambda x: -x[1])[:k]:
            t_text = _token_text(tok, t)
            top.append({"token": t_text, "logprob": v, "bytes": _token_bytes(tok, t, t_text)})
        content.append(
            {"token": text, "logprob": lp, "bytes": _token_bytes(tok, token, text), "top_logprobs": top}
        )
    return {"content": content}


def full_body(
    state: Any,
    endpoint: str,
    rid: str,
    name: str,
    req: Any,
    choices: list[Choice],
    texts: list[str],
    prompt_tokens: int,
    lp: int | None,
) -> dict[str, Any]:
    out = []
    for i, (c, text) in enumerate(zip(choices, texts)):
        if endpoint == "chat":
            logprobs = _chat_logprobs(state, c, lp) if lp is not None else None
            item = {"index": i, "message": {"role": "assistant", "content": text}}
        else:
            logprobs = _completion_logprobs(state, c, lp) if lp is not None else None
            item = {"index": i, "text": text}
        out.append({**item, "logprobs": logprobs, "finish_reason": c.finish_reason})
    return {
        "id": rid,
        "object": "chat.completion" if endpoint == "chat" else "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": out,
        "usage": _usage(prompt_tokens, sum(c.num_tokens for c in choices)),
    }


# seconds a stream past --request-timeout (its generation already cancelled) has to deliver what it holds,
# its 504 error event and [DONE] included, before its connection is closed on a client that reads nothing
STREAM_CLOSE_GRACE = 5.0
# the scope key of a function that drops the request's connection at once (app.create_app sets it where the
# server is uvicorn): closing it, uvicorn's way, waits for the bytes it holds to be read, forever for a client
# that reads nothing
ABORT_CONNECTION = "trtforge.abort_connection"
_timeout = getattr(asyncio, "timeout", None)  # (Python 3.11+: no task per send, as wait_for makes)


class ClientStalled(Exception):
    """A stream's send waited past --send-timeout on a client that reads nothing."""


class SSEResponse(StreamingResponse):
    """A stream's response, counted in /metrics' requests by status once it ends, by how it ended
    (:attr:`Pumps.status`): 200 when every choice finished, an error event's code (504 past
    --request-timeout, 500, 503), 408 when its client read nothing for --send-timeout, 499 when the
    client left first. Its HTTP status line is 200 from the start whatever follows, so counting it there
    called a stream that timed out or failed a success.

    A client that stops reading blocks every send once the socket's buffers fill (uvicorn waits for the
    transport to drain): the body waits on it, and so would its request's KV blocks and socket, forever.
    So each send waits at most ``state.send_timeout`` seconds (--send-timeout); past them the stream is
    cut: its choices are cancelled (their blocks return at the engine's next step) and its connection is
    dropped. Under --request-timeout, its generation is cancelled at the deadline (:class:`Pumps`) and its
    sending cut :data:`STREAM_CLOSE_GRACE` seconds later, whichever comes first."""

    def __init__(self, body: AsyncIterator[str], state: Any, endpoint: str, pumps: Pumps) -> None:
        super().__init__(body, media_type="text/event-stream")
        self.state, self.endpoint, self.pumps = state, endpoint, pumps
        self.drained = False  # cut by the drain's end while its send waited on its client

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        state, pumps = self.state, self.pumps
        state.streams += 1
        try:
            left = None if pumps.deadline is None else pumps.deadline + STREAM_CLOSE_GRACE - time.monotonic()
            bounded = self._bounded(send, scope.get(ABORT_CONNECTION))
            try:
                await asyncio.wait_for(super().__call__(scope, receive, bounded), left)
            except asyncio.TimeoutError:
                late = f"{STREAM_CLOSE_GRACE:g} s past --request-timeout {state.request_timeout:g} s"
                why = f"read nothing for {late}: its generation was cancelled at the timeout"
                await self._cut(scope, receive, "504", why)
            except ClientStalled:
                if self.drained:
                    why = "read nothing when the drain's --shutdown-grace ended"
                    await self._cut(scope, receive, "503", why)
                else:
                    late = f"--send-timeout {state.send_timeout:g} s"
                    why = f"read nothing for {late}: its generation is cancelled"
                    await self._cut(scope, receive, "408", why)
        except Exception:
            pumps.status = pumps.status or "500"
            raise
        finally:
            state.streams -= 1
            state.metrics.requests.labels(self.endpoint, pumps.status or "499").inc()

    def _bounded(self, send: Any, abort: Callable[[], None] | None) -> Any:
        """`send`, each call waiting at most --send-timeout for the client to read (ClientStalled past it).
        While a call waits, ``state.waiting_sends`` holds a function that cuts the stream (the drain calls
        it at its grace's end): the connection is reset, and the send raises ClientStalled with
        :attr:`drained` set (the body would otherwise go on rendering every piece queued for a
        client that is gone)."""
        limit, waiting = self.state.send_timeout, self.state.waiting_sends

        def cut() -> None:
            self.drained = True
            if abort is not None:
                abort()

        async def bounded(message: Any) -> None:
            if abort is not None:
                waiting.add(cut)
            try:
                if limit is None:
                    await send(message)
                elif _timeout is not None:
                    async with _timeout(limit):
                        await send(message)
                else:
                    await asyncio.wait_for(send(message), limit)
            except asyncio.TimeoutError:
                raise ClientStalled from None
            finally:
                waiting.discard(cut)
            if self.drained:
                raise ClientStalled

        return bounded

    async def _cut(self, scope: Any, receive: Any, status: str, why: str) -> None:
        """End a stream whose client reads nothing: its choices cancelled, its connection dropped."""
        self.pumps.cancel()
        self.pumps.status = self.pumps.status or status
        log.warning("a stream's client %s, and its connection is closed", why)
        with contextlib.suppress(Exception):
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
        abort = scope.get(ABORT_CONNECTION)
        if abort is None:
            self.state.streams_cut += 1  # (uvicorn's "returned without completing response" is ours)
            return
        if not self.drained:  # (the drain's cut has reset it: its socket is gone)
            abort()
        # returning once the server has seen the connection go (a loop turn later), it neither logs the
        # response as left incomplete nor closes the connection again
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_disconnected(receive), 1.0)


async def _disconnected(receive: Any) -> None:
    """Returns once ASGI's `receive` says the client is gone."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Pumps:
    """Each choice's pieces forwarded into one queue, by tasks started with the request (not with the
    response body): a client gone before the body starts still has its choices run out and its
    admission released, instead of left waiting on a generator that never runs."""

    def __init__(self, choices: list[Choice], admission: Any, timeout: float | None = None) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.admission = admission
        self.choices = choices
        # past `timeout` seconds the choices are cancelled here, not only where the body reads the queue:
        # that read waits while a client that stops reading holds the body's send (:class:`SSEResponse`)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        loop = asyncio.get_running_loop()
        self.timer = None if timeout is None else loop.call_later(timeout, self.cancel)
        # how the stream ended, as /metrics counts it (:class:`SSEResponse`): "200" once every choice
        # finished, an error event's code; None while it runs (a client gone before the end: 499)
        self.status: str | None = None
        self.tasks = [asyncio.ensure_future(self._pump(i, c)) for i, c in enumerate(choices)]
        asyncio.gather(*self.tasks, return_exceptions=True).add_done_callback(lambda _: admission.release())

    def cancel(self) -> None:
        """Stop every choice: its pump, and its request in the engine (its blocks return at the next step)."""
        if self.timer is not None:
            self.timer.cancel()
        for t in self.tasks:
            t.cancel()
        for c in self.choices:
            c.handle.cancel()

    async def _pump(self, i: int, c: Choice) -> None:
        # each piece with the logprobs of the tokens that led to it (where asked: else []) and the choice's
        # tokens counted with it (a continuous usage's, read here: later pieces may queue before it is sent)
        try:
            async for piece in c.pieces():
                self.queue.put_nowait((i, (piece, c.take_logprobs(), c.num_tokens), None))
            self.queue.put_nowait((i, (None, c.take_logprobs(), c.num_tokens), c.finish_reason))
        except ApiError as e:
            self.queue.put_nowait((i, None, e))
        except Exception as e:  # a server bug: logged with its trace; the stream ends with a 500, not waits
            log.error("internal error streaming a choice", exc_info=e)
            self.queue.put_nowait((i, None, ApiError(500, f"internal server error ({type(e).__name__})")))


def _streamed_top(req: Any, chat: bool) -> int | None:
    """The top alternatives per token a stream's logprobs carry (None: no logprobs asked for)."""
    asked = getattr(req, "logprobs", None)
    if chat:
        return (getattr(req, "top_logprobs", None) or 0) if asked else None
    return asked


async def stream(
    state: Any,
    endpoint: str,
    rid: str,
    name: str,
    req: Any,
    choices: list[Choice],
    prompt_tokens: int,
    pumps: Pumps,
) -> AsyncIterator[str]:
    """The SSE body: every choice's pieces as they come, its finish, the usage chunk, [DONE]."""
    created, chat = int(time.time()), endpoint == "chat"
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    # vLLM's continuous_usage_stats: each chunk's usage is its choice's so far (vLLM's, which clients read)
    continuous = include_usage and req.stream_options.continuous_usage_stats
    head = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": name,
    }

    lp = _streamed_top(req, chat)
    offsets = [TextOffsets() for _ in choices]  # each choice's (the completions API's text_offset)

    def logprobs(index: int, entries: list[Any]) -> dict[str, Any] | None:
        if lp is None:
            return None
        if chat:
            return _chat_logprobs(state, entries, lp)
        return _completion_logprobs(state, entries, lp, offsets[index])

    def chunk(
        index: int,
        text: str | None,
        finish: str | None,
        role: bool = False,
        entries: list[Any] | None = None,
        count: int = 0,
    ) -> str:
        """One choice's chunk; `count`: its tokens up to and with this chunk (a continuous usage's)."""
        # a chunk of no tokens (the role's, a finish after the last piece) carries none: null, as OpenAI
        # sends it, not an empty list
        lps = logprobs(index, entries) if entries else None
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            body = {"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}
        else:
            body = {"index": index, "text": text or "", "logprobs": lps, "finish_reason": finish}
        if continuous:  # (the choice's own prompt: a request of several prompts counts them all at the end)
            extra = {"usage": _usage(choices[index].prompt_len, count)}
        else:
            extra = {"usage": None} if include_usage else {}
        return _sse({**head, "choices": [body], **extra})

    merged, deadline = pumps.queue, pumps.deadline
    try:
        if chat:
            for i in range(len(choices)):
                yield chunk(i, None, None, role=True)
        left = len(choices)
        while left:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                i, piece, end = await asyncio.wait_for(merged.get(), timeout)
            except asyncio.TimeoutError:
                err = ApiError(
                    504, f"the request did not finish within --request-timeout {state.request_timeout} s"
                )
                pumps.status = str(err.status)
                yield _sse(err.body())
                break
            if isinstance(end, ApiError):
                pumps.status = str(end.status)
                yield _sse(end.body())
                break
            text, entries, count = piece
            if text is not None:
                yield chunk(i, text, None, entries=entries, count=count)
            else:
                yield chunk(i, None, end, entries=entries, count=count)
                left -= 1
        else:
            pumps.status = "200"
            if include_usage:
                usage = _usage(prompt_tokens, sum(c.num_tokens for c in choices))
                yield _sse({**head, "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"
    finally:
        pumps.cancel()
        pumps.admission.release()
