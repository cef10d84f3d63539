"""The FastAPI app: OpenAI's /v1/completions, /v1/chat/completions and /v1/models, plus /health and
/metrics, over one :class:`~trtforge.llm.service.ServingLLM`.

Request bodies are JSON sent as ``Content-Type: application/json`` (415 otherwise, as vLLM answers).
Streaming is server-sent events as OpenAI sends them: ``data: {chunk}`` lines, ``finish_reason`` in
each choice's last chunk, a usage chunk with ``stream_options.include_usage``, then ``data: [DONE]``.
Load is bounded: past ``max_num_seqs + max_waiting`` sequences in flight a request gets 429 with
Retry-After; while the server drains (SIGTERM) new requests get 503. Before that, at most ``max_intake``
requests at once have their bodies read, parsed and tokenized; the others wait with their bodies unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import os
import socket
import struct
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from trtforge.errors import UserError, shown
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.server.generation import Choice, Dispatcher
from trtforge.llm.server.metrics import Metrics
from trtforge.llm.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    check_fields,
    error_body,
    parse,
    response_format,
    sampling_params,
)
from trtforge.llm.server.responses import ABORT_CONNECTION, Pumps, SSEResponse, full_body, stream
from trtforge.llm.structured import GrammarError
from trtforge.llm.text import apply_chat_template, check_text

log = logging.getLogger("trtforge.serve")


TOKENIZE_THREADS = 4  # encodes take the tokenizer's lock in turn: more threads only wait
COMPILE_WAIT_THREADS = 32  # each waits on a schema's compile (the compiler's own threads do the work)


# seconds a stream's send waits for a client that reads nothing (--send-timeout): its socket's buffers are
# full by then (megabytes), so a client that reads at all drains them far sooner
DEFAULT_SEND_TIMEOUT = 60.0


def default_intake() -> int:
    """Requests read, parsed and tokenized at once unless --max-intake says: 4 per CPU, 8 to 64. The work
    is the event loop's parse and TOKENIZE_THREADS' encodes, so more at once mostly overlap bodies still
    arriving; each can hold ~10x its 16 MiB as Python objects (64 of them: ~10 GB)."""
    return max(8, min(64, 4 * (os.cpu_count() or 1)))


@dataclass
class ServerState:
    """What the routes share: the model, its text side, limits and the drain flag."""

    llm: Any
    tokenizer: Any
    served_model_names: list[str]
    max_model_len: int
    max_num_seqs: int
    max_waiting: int
    api_key: str | None = None
    chat_template: str | None = None
    request_timeout: float | None = None
    max_request_bytes: int = 16 * 2**20
    body_timeout: float = 60.0  # seconds a body may take to arrive (408 past them)
    # seconds a stream's send may wait for its client to read (responses.SSEResponse); None: no limit
    send_timeout: float | None = DEFAULT_SEND_TIMEOUT
    max_intake: int | None = None  # requests read, parsed and tokenized at once; None: default_intake()
    allowed_origins: tuple[str, ...] = ()  # origins granted CORS (:func:`create_app`); none: no browser page
    vocab_size: int | None = None  # the model's logits' width: logit_bias ids are checked against it
    # the ids a prompt may hold (the embedding's; None: vocab_size), wider where the LM head is pruned
    input_vocab_size: int | None = None
    # other names a request may give for served_model_names[0], not listed by /v1/models: `serve MODEL`'s
    # MODEL as typed (vLLM serves under it), answered under the listed name
    model_aliases: tuple[str, ...] = ()
    draining: bool = False
    structured_error: str | None = None  # why response_format cannot be served, if it cannot
    sequences: int = 0
    requests: int = 0
    # streams cut on a client that reads nothing whose connection could not be reset (no uvicorn transport),
    # not yet logged by uvicorn
    streams_cut: int = 0
    # streamed responses still sending (responses.SSEResponse): a drain waits for them as for `requests`,
    # whose admission a stream gives back once its generation ends, before its last events are sent
    streams: int = 0
    # a function for each stream whose send waits on a client that reads nothing (its socket's buffers
    # full) that cuts it, its connection reset (responses.SSEResponse): called at the drain's grace's end
    waiting_sends: set[Callable[[], None]] = field(default_factory=set, init=False)
    # the ignored request fields logged so far (:func:`_log_ignored`: each name once)
    ignored_logged: set[str] = field(default_factory=set, init=False)
    metrics: Metrics = field(init=False)
    intake: asyncio.Semaphore = field(init=False)  # max_intake slots (:func:`_intake`)
    # set on the event loop once `draining` is (:meth:`drain_begun`): requests not yet admitted, waiting for
    # an intake slot or sending their bodies, are refused with 503 then (:func:`_unless_draining`)
    drain_started: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    dispatcher: Any = None  # set on the event loop's start (generation.Dispatcher)
    # held around each encode: texts are tokenized on worker threads, and a Hugging Face fast tokenizer
    # raises "Already borrowed" when one thread changes its settings while another encodes
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # the threads that tokenize (:func:`_off_loop`): not the loop's default executor, whose threads
    # requests waiting on a schema's compile can all hold
    tokenize_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="tokenize"),
        init=False,
    )
    # the threads that wait on schema compiles, for the same reason: /metrics renders on the default one
    compile_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(COMPILE_WAIT_THREADS, thread_name_prefix="compile-wait"),
        init=False,
    )

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.engine_stats)
        if self.max_intake is None:
            self.max_intake = default_intake()
        self.intake = asyncio.Semaphore(self.max_intake)
        if self.tokenizer is not None:  # the first encode resets a tokenizer.json's padding/truncation
            self.tokenizer("", add_special_tokens=False)  # (a write): done here, before any decode runs

    @property
    def engine(self) -> Any:
        return self.llm.engine

    def drain_begun(self) -> None:
        """Call on the event loop once `draining` is set (the server's tick does): wakes the requests
        still in intake to their 503."""
        if self.draining and not self.drain_started.is_set():
            self.drain_started.set()

    def engine_stats(self) -> dict[str, Any]:
        mem, stats = self.llm.memory_stats(), self.llm.stats
        return {
            "running": self.engine.num_running,
            "waiting": self.engine.num_waiting,
            "usage": mem.usage,
            "used_blocks": mem.used_blocks,
            "blocks": mem.total_blocks,
            "preemptions": stats.preemptions,
            "spec_draft_tokens": stats.spec_draft_tokens,
            "spec_accepted_tokens": stats.spec_accepted_tokens,
            "spec_verify_rows": stats.spec_verify_rows,
            "spec_acceptance_rate": stats.spec_acceptance_rate,
        }


def _error(e: ApiError, endpoint: str, state: ServerState) -> JSONResponse:
    state.metrics.requests.labels(endpoint, str(e.status)).inc()
    headers = {"Retry-After": "1"} if e.status == 429 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _check_key(state: ServerState, request: Request) -> None:
    """401 unless the request carries ``Authorization: Bearer KEY`` (compared in constant time, so the
    answer's timing does not tell a client how much of a guess was right)."""
    if state.api_key is None:
        return
    scheme, _, key = request.headers.get("authorization", "").strip().partition(" ")
    # the scheme's name is case-insensitive (RFC 7235: curl users write "bearer"), the key is not
    sent = key.lstrip(" ").encode("utf-8", "surrogateescape") if scheme.lower() == "bearer" else b""
    if not hmac.compare_digest(sent, state.api_key.encode("utf-8", "surrogateescape")):
        raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)")


# OpenAI's error code for a prompt (plus the tokens asked for) past the model's context, which clients test
# for to shorten the conversation and retry
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"

# characters of a model name a request may send beyond the longest served one: a longer one names no model
MAX_MODEL_NAME_CHARS = 256


def _check_model(state: ServerState, name: str) -> str:
    """`name` if it is served (the first served name for one of its aliases); a 404 naming it if not, or a
    400 if it is longer than any model name (a malformed request rather than a model this server lacks)."""
    if name in state.served_model_names:
        return name
    if name in state.model_aliases:
        return state.served_model_names[0]
    most = max([MAX_MODEL_NAME_CHARS, *(len(n) for n in [*state.served_model_names, *state.model_aliases])])
    if len(name) > most:
        raise ApiError(
            400,
            f"model: expected the name of a served model (at most {most:,} characters), got {shown(name)}; "
            f"/v1/models lists them",
            "model",
        )
    raise ApiError(
        404,
        f"model {shown(name)} is not served here; /v1/models lists {state.served_model_names}",
        "model",
        "model_not_found",  # OpenAI's code for it, which clients test for
    )


# ignored field names logged at most (each once): clients choose them, and a set of every one ever sent
# would grow without bound
MAX_LOGGED_IGNORED = 256


def _log_ignored(state: ServerState, paths: list[str]) -> None:
    """A warning for each field of `paths` (the request's ignored ones) not logged before: the request is
    served without it, which its sender may not expect. Once per name, at most :data:`MAX_LOGGED_IGNORED`."""
    for path in paths:
        if path in state.ignored_logged or len(state.ignored_logged) > MAX_LOGGED_IGNORED:
            continue
        state.ignored_logged.add(path)
        if len(state.ignored_logged) > MAX_LOGGED_IGNORED:
            log.warning("more ignored request fields: no more of them are logged")
            return
        log.warning("request field %s is not one this server reads: ignored (logged once)", shown(path))


def _prompt_list(prompt: Any) -> list[Any]:
    """The prompts of a completions request, each a text or a list of ids (400 if there is none)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    if not prompt:
        raise ApiError(400, "prompt: give at least one prompt", "prompt")
    return prompt


def _check_fits(state: ServerState, prompts: int, n: int) -> None:
    """400 for a request of more sequences than the server ever holds: 429 would have it retry forever."""
    limit = state.max_num_seqs + state.max_waiting
    if prompts * n > limit:
        param = "n" if prompts == 1 else "prompt"
        raise ApiError(
            400,
            f"{param}: {prompts} prompt(s) x n={n} is {prompts * n} sequences, more than this server ever "
            f"holds ({limit}: --max-num-seqs {state.max_num_seqs} + --max-waiting {state.max_waiting}); "
            "send fewer per request",
            param,
        )


async def _off_loop(state: ServerState, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(state, *args)` on a tokenizing thread, awaited: tokenizer work never runs on the event loop."""
    return await asyncio.get_running_loop().run_in_executor(state.tokenize_pool, fn, state, *args)


def _encode(state: ServerState, text: str, special: bool) -> list[int]:
    """`text`'s token ids, under the tokenizer's lock; a worker thread's work, never the event loop's
    (the Rust tokenizer releases the GIL, so the loop keeps answering other clients meanwhile)."""
    with state.tokenizer_lock:
        return [int(t) for t in state.tokenizer(text, add_special_tokens=special)["input_ids"]]


def _refuse_huge(state: ServerState, text: str, param: str) -> None:
    """400 for a text far past the model's context, found by tokenizing prefixes of it (growing 4x) rather
    than all of it: 10 MB of text is 10 s of tokenizing, and the request's answer would wait for it."""
    limit = state.max_model_len
    cut = 8 * (limit + 1)
    while cut < len(text):
        n = len(_encode(state, text[:cut], False))
        if n > 2 * limit:
            raise ApiError(
                400,
                f"{param}: {len(text):,} characters, far past this model's maximum context length of {limit} "
                f"tokens (the first {cut:,} characters alone are {n:,} tokens)",
                param,
                CONTEXT_LENGTH_EXCEEDED,
            )
        cut *= 4


def _check_json(request: Request) -> None:
    """415 unless the request says its body is JSON (``Content-Type: application/json``, any parameters),
    as vLLM refuses it: a body sent as text/plain or a form was parsed as JSON anyway, so a web page on
    any origin could drive generation through a visitor's browser (a browser sends those types cross-origin
    without asking first; application/json needs a CORS preflight, granted to --allowed-origins only), and
    curl's ``-d`` without ``-H 'Content-Type: application/json'`` worked here but fails elsewhere. A body
    sent compressed (Content-Encoding: gzip, which the server does not undo) is a 415 saying so, as RFC 7694
    has it, not a 400 calling its bytes invalid JSON."""
    sent = request.headers.get("content-type", "")
    if sent.partition(";")[0].strip().lower() != "application/json":
        got = f"Content-Type {shown(sent)}" if sent else "no Content-Type"
        raise ApiError(
            415, f"the request body must be JSON, sent as Content-Type: application/json; got {got}"
        )
    coding = request.headers.get("content-encoding", "").strip()
    if coding.lower() not in ("", "identity"):
        raise ApiError(
            415, f"the request body must be sent uncompressed, got Content-Encoding {shown(coding)}"
        )


def _check_draining(state: ServerState) -> None:
    """503 once the server drains: a batch still being tokenized stops there rather than hold up the exit."""
    if state.draining:
        raise ApiError(503, "the server is shutting down; retry on another replica")


def _prompt_ids(state: ServerState, prompt: list[Any]) -> list[list[int]]:
    """The token ids of each prompt of :func:`_prompt_list` (texts are tokenized). Blocking: run it on a
    worker thread (a batch of long texts is seconds of tokenizing)."""
    out = []
    for p in prompt:
        if isinstance(p, str):
            if state.tokenizer is None:
                raise ApiError(400, "prompt: this model has no tokenizer; send token ids", "prompt")
            _check_draining(state)
            _refuse_huge(state, p, "prompt")
            ids = _encode(state, check_text(p, "prompt"), True)
            _check_vocab(state, ids, f"prompt[{len(out)}]" if len(prompt) > 1 else "prompt", tokenized=True)
        else:
            ids = list(p)
            _check_vocab(state, ids, f"prompt[{len(out)}]" if len(prompt) > 1 else "prompt")
        if not ids:
            raise ApiError(400, "prompt: a prompt tokenizes to no tokens", "prompt")
        out.append(ids)
    return out


def _check_vocab(
    state: ServerState, ids: list[int], where: str, param: str = "prompt", tokenized: bool = False
) -> None:
    """400 naming `where` for a token id outside the model's vocabulary (its embedding would fail).
    `tokenized`: the ids are the server's tokenizer's (of a text or a chat), so the message says that the
    tokenizer is not this model's (the engine's own refusal named an internal request id)."""
    vocab = state.input_vocab_size if state.input_vocab_size is not None else state.vocab_size
    if vocab is not None and ids and (min(ids) < 0 or max(ids) >= vocab):
        bad = next(t for t in ids if not 0 <= t < vocab)
        if tokenized:
            raise ApiError(
                400,
                f"{where}: the server's tokenizer gave token id {bad}, outside the vocabulary [0, {vocab}) "
                "of this model: the tokenizer is not this model's (see the server's --tokenizer)",
                param,
            )
        raise ApiError(
            400,
            f"{where}: token id {shown(bad)} is outside the vocabulary [0, {vocab}) of this model",
            param,
        )


def _chat_prompt(state: ServerState, req: ChatCompletionRequest) -> list[list[int]]:
    """The token ids of a chat's messages, rendered by the chat template. Blocking, as :func:`_prompt_ids`."""
    if state.tokenizer is None:
        raise ApiError(400, "messages: this model has no tokenizer to format a chat", "messages")
    messages = [
        {
            "role": m.role,
            "content": check_text(m.text(f"messages.{i}.content"), "messages"),
            **m.template_fields(),
        }
        for i, m in enumerate(req.messages)
    ]
    _refuse_huge(state, "\n".join(f"{m['role']}: {m['content']}" for m in messages), "messages")
    if state.chat_template is not None and "developer" not in state.chat_template:
        # OpenAI's developer role is its system role under a newer name (its clients send it for system
        # prompts); a template that never names it renders it as a role the model never saw, or raises
        for m in messages:
            if m["role"] == "developer":
                m["role"] = "system"
    try:
        with state.tokenizer_lock:
            template = state.chat_template
            ids = apply_chat_template(state.tokenizer, messages, template, req.add_generation_prompt)
    except UserError as e:
        raise ApiError(400, str(e), "messages") from None
    _check_vocab(state, ids, "messages", "messages", tokenized=True)
    return [ids]


def _asked(req: Any) -> tuple[int | None, str]:
    """The new tokens `req` asks for, and the field it named them in (chat's max_completion_tokens, which
    OpenAI prefers, else max_tokens)."""
    if getattr(req, "max_completion_tokens", None) is not None:
        return req.max_completion_tokens, "max_completion_tokens"
    return req.max_tokens, "max_tokens"


def _budget(
    state: ServerState, ids: list[int], req: Any, default: int | None, where: str, prompt_param: str
) -> int:
    """max_tokens for a prompt (`where`, from field `prompt_param`): as `req` asks (400 past the model
    length), else `default` or what is left."""
    asked, field_name = _asked(req)
    room = state.max_model_len - len(ids)
    if room < 1:
        raise ApiError(
            400,
            f"{where}: {len(ids)} tokens, but this model's maximum context length is {state.max_model_len} "
            "tokens (prompt plus at least one new token)",
            prompt_param,
            CONTEXT_LENGTH_EXCEEDED,
        )
    if asked is not None and asked > room:
        raise ApiError(
            400,
            f"{field_name}: {shown(asked)} new tokens after a {len(ids)}-token prompt exceed this model's "
            f"maximum context length {state.max_model_len}",
            field_name,
            CONTEXT_LENGTH_EXCEEDED,
        )
    return asked if asked is not None else min(default or room, room)


def _check_request(state: ServerState, req: Any, lp: int | None) -> None:
    """The refusals that need no tokenizing, made before a request's texts are tokenized."""
    asked, field_name = _asked(req)
    if asked is not None and asked >= state.max_model_len:
        raise ApiError(
            400,
            f"{field_name}: {shown(asked)} new tokens leave no room for a prompt in this model's maximum "
            f"context length of {state.max_model_len} tokens",
            field_name,
        )
    fmt = req.response_format
    if fmt is not None and fmt.type != "text" and state.structured_error is not None:
        raise ApiError(400, f"response_format: {state.structured_error}", "response_format")
    if req.stream_options is not None and not req.stream:  # as OpenAI and vLLM refuse it
        raise ApiError(
            400, "stream_options: only allowed with stream=true; set stream or leave it out", "stream_options"
        )
    bias, vocab = req.logit_bias_map, state.vocab_size
    if bias and vocab is not None and max(bias) >= vocab:
        raise ApiError(
            400,
            f"logit_bias: token id {max(bias)} is outside the model's vocabulary [0, {vocab})",
            "logit_bias",
        )
    stops = getattr(req, "stop_token_ids", None)
    if stops and vocab is not None and max(stops) >= vocab:  # (negative ids: the sampling check's 400)
        bad = next(t for t in stops if t >= vocab)
        raise ApiError(
            400,
            f"stop_token_ids: token id {shown(bad)} is outside the model's vocabulary [0, {vocab}): "
            "the model never samples it",
            "stop_token_ids",
        )
    if state.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: the server needs one to return text")


class _Admission:
    """Counts a request's sequences in flight; refuses it when the waiting queue would overflow."""

    def __init__(self, state: ServerState, sequences: int) -> None:
        if state.draining:
            raise ApiError(503, "the server is shutting down; retry on another replica")
        limit = state.max_num_seqs + state.max_waiting
        if state.sequences + sequences > limit:
            raise ApiError(
                429,
                f"the server is at capacity ({state.sequences} sequences in flight, limit {limit}); retry",
            )
        self.state, self.n = state, sequences
        state.sequences += sequences
        state.requests += 1
        state.metrics.in_flight.inc()

    def release(self) -> None:
        if self.n:
            self.state.sequences -= self.n
            self.state.requests -= 1
            self.state.metrics.in_flight.dec()
            self.n = 0


@contextlib.asynccontextmanager
async def _intake(state: ServerState) -> AsyncIterator[None]:
    """One of ``max_intake`` slots, held from reading a request's body until it is parsed and tokenized
    (its admission follows at once) or refused: bodies of up to 16 MiB (token ids ~10x that once parsed)
    on hundreds of connections would otherwise all be in memory at once. A request waits for its slot with
    its body unread (uvicorn stops reading it); the drain's start refuses it (:func:`_unless_draining`)."""
    m = state.metrics
    m.intake_waiting.inc()
    try:
        await state.intake.acquire()  # cancelled while waiting: no slot taken, none to give back
    finally:
        m.intake_waiting.dec()
    m.intake.inc()
    try:
        yield
    finally:
        m.intake.dec()
        state.intake.release()


async def _body(request: Request, limit: int, timeout: float) -> bytes:
    """The request's body, refused (413) as soon as it is known to exceed `limit` bytes: parsing is where
    a big body costs (200 MB of token ids took 48 s of the event loop and 18 GB). ApiError 499 if the
    client closes the connection before it is all here, 408 if it is not all here within `timeout`
    seconds (the body is read under an intake slot, which a trickling client would hold forever)."""
    too_big = ApiError(413, f"the request body exceeds --max-request-bytes {limit:,}; send a smaller one")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_big
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout)
    except ClientDisconnect:
        raise ApiError(499, "the client closed the connection before its request body arrived") from None
    except asyncio.TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within --body-timeout {timeout:g} s; send it faster"
        ) from None
    return b"".join(chunks)


async def _take_in(
    state: ServerState, request: Request, endpoint: str, kind: type
) -> tuple[Any, str, list[list[int]], list[int], int | None]:
    """:func:`_read_request` under an :func:`_intake` slot (waited for first)."""
    async with _intake(state):
        _check_draining(state)  # it may have begun while this request waited for its slot
        return await _read_request(state, request, endpoint, kind)


async def _unless_draining(state: ServerState, work: Any) -> Any:
    """`work`'s result, or a 503 (as :func:`_check_draining` answers) as soon as the drain begins first: a
    request not admitted yet, waiting for an intake slot or sending its body, would be refused at its
    admission anyway, and the drain would not wait for it; uvicorn cancelled it once the last admitted
    request ended (a plain-text 500, ``Internal Server Error``)."""
    task = asyncio.ensure_future(work)
    drain = asyncio.ensure_future(state.drain_started.wait())
    cut = False
    try:
        await asyncio.wait({task, drain}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        drain.cancel()
        if not task.done():
            task.cancel()  # (its intake slot is given back as it unwinds)
            cut = True
    if cut:
        await asyncio.wait({task})  # (unwound before the answer; its CancelledError is not ours)
        _check_draining(state)
    return task.result()


async def _read_request(
    state: ServerState, request: Request, endpoint: str, kind: type
) -> tuple[Any, str, list[list[int]], list[int], int | None]:
    """`request` read, parsed, checked and tokenized (under an :func:`_intake` slot): the parsed request,
    the model name it asked for, its prompts' ids, each prompt's max_tokens and the logprobs it asked for."""
    req = parse(kind, await _body(request, state.max_request_bytes, state.body_timeout))
    name = _check_model(state, req.model)
    req.refuse_unserved()
    _log_ignored(state, check_fields(req))
    if endpoint == "chat":
        _check_fits(state, 1, req.n)
        if req.top_logprobs is not None and not req.logprobs:  # as OpenAI and vLLM refuse it
            raise ApiError(400, "top_logprobs: needs logprobs set to true", "top_logprobs")
        lp = (req.top_logprobs or 0) if req.logprobs else None
        _check_request(state, req, lp)
        prompts = await _off_loop(state, _chat_prompt, req)
        return req, name, prompts, [_budget(state, prompts[0], req, None, "messages", "messages")], lp
    if req.echo:
        raise ApiError(400, "echo: echoing the prompt is not supported", "echo")
    items = _prompt_list(req.prompt)
    _check_fits(state, len(items), req.n)
    lp = req.logprobs
    _check_request(state, req, lp)
    prompts = await _off_loop(state, _prompt_ids, items)
    budgets = [
        _budget(state, p, req, 16, f"prompt[{i}]" if len(prompts) > 1 else "prompt", "prompt")
        for i, p in enumerate(prompts)
    ]
    return req, name, prompts, budgets, lp


async def _watch_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _run_all(state: ServerState, request: Request, choices: list[Choice]) -> list[str]:
    """Every choice's whole text; cancelled when the client leaves or the request times out."""
    gather = asyncio.ensure_future(asyncio.gather(*(c.collect() for c in choices)))
    gather.add_done_callback(_retrieve)  # a cancelled gather's error is ours to drop, not asyncio's to log
    watch = asyncio.ensure_future(_watch_disconnect(request))
    try:
        done, _ = await asyncio.wait(
            {gather, watch}, timeout=state.request_timeout, return_when="FIRST_COMPLETED"
        )
        if gather in done:
            return gather.result()
        if watch in done:
            raise ApiError(499, "the client closed the connection")
        raise ApiError(504, f"the request did not finish within --request-timeout {state.request_timeout} s")
    finally:
        for t in (gather, watch):
            t.cancel()
        for c in choices:
            c.handle.cancel()


async def _hold_grammar(state: ServerState, fmt: dict[str, Any]) -> Callable[[], None]:
    """`fmt`'s grammar compiled on a worker thread (off the event loop and the engine's lock) and held in
    the cache until the returned function is called (:meth:`LLMEngine.hold_response_format`); a 400
    naming response_format when it does not compile. A request cancelled meanwhile lets go of it once
    the compile ends."""
    future = state.compile_pool.submit(state.engine.hold_response_format, fmt)
    try:
        return await asyncio.wrap_future(future)
    except UserError as e:
        raise ApiError(400, str(e), "response_format") from None
    except asyncio.CancelledError:
        future.add_done_callback(_release_held)
        raise


def _release_held(future: Any) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result()()


def _make_choices(
    state: ServerState, req: Any, prompts: list[list[int]], max_tokens: list[int], lp: int | None, param: str
) -> list[Choice]:
    """Queue every choice of `req` in the engine, all or none; a refusal is a 400 naming `param` (the
    field its prompts came from), or response_format when its grammar failed."""
    stops = req.stops()
    choices: list[Choice] = []
    labels: list[str | None] = []
    first: SamplingParams | None = None  # its logit_bias is every other choice's (built once)
    try:
        for i, (ids, budget) in enumerate(zip(prompts, max_tokens)):
            for j in range(req.n):
                params = sampling_params(req, budget, lp, j, first)
                first = params if first is None else first
                choices.append(Choice(state, ids, params, stops))
                labels.append(f"prompt[{i}]" if len(prompts) > 1 else None)
        Choice.submit_all(state, choices, labels)  # all or none
    except UserError as e:  # the engine refused the request (a token id outside the vocabulary, ...)
        grammar = isinstance(e, GrammarError) or isinstance(e.__cause__, GrammarError)
        raise ApiError(400, str(e), "response_format" if grammar else param) from None
    return choices


class _App(FastAPI):
    """FastAPI, each HTTP request's scope holding a function that drops its connection at once
    (:func:`connection_abort`): a stream cut on a client that reads nothing must let go of its socket
    (:class:`~trtforge.llm.server.responses.SSEResponse`), and uvicorn's close of it waits for that client
    to read the bytes it still holds."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        abort = connection_abort(send) if scope["type"] == "http" else None
        if abort is not None:
            scope[ABORT_CONNECTION] = abort
        await super().__call__(scope, receive, send)


def connection_abort(send: Any) -> Callable[[], None] | None:
    """A function that drops the connection of ASGI `send` at once, found through uvicorn's internals (its
    send is its request cycle's bound method, whose ``transport`` is the connection's, with ``abort()``);
    None under another server. ``run.check_uvicorn`` checks at startup that uvicorn still has them."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if callable(getattr(transport, "abort", None)):
        return functools.partial(_reset, transport)
    return None


def _reset(transport: Any) -> None:
    """Drop `transport`'s connection now, with a reset: the bytes it holds are discarded, those in the
    socket's kernel buffer too (an abort alone closes the socket, and the kernel goes on delivering its
    megabytes to a client that reads nothing, as an orphaned socket)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def create_app(state: ServerState) -> FastAPI:
    """The app over `state` (``trtforge serve`` runs it with uvicorn)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.dispatcher = Dispatcher(asyncio.get_running_loop())
        try:
            yield
        finally:
            state.tokenize_pool.shutdown(wait=False, cancel_futures=True)
            state.compile_pool.shutdown(wait=False, cancel_futures=True)

    app = _App(title="trtforge", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.trtforge = state
    if state.allowed_origins:
        # (vLLM's --allowed-origins, off unless given: vLLM's default "*" lets any page a user visits call a
        # server on their machine). A browser's preflight (OPTIONS) asks before a JSON POST and carries no
        # API key; the headers it may then send are any (the OpenAI SDKs add their own x-stainless-*).
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[o.lower() for o in state.allowed_origins],  # (browsers send them lowercase)
            allow_methods=["GET", "HEAD", "POST"],
            allow_headers=["*"],
            max_age=600,
        )

    def get(path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A GET route that answers HEAD too: the same status and headers, no body (uvicorn sends none
        for HEAD). RFC 9110 asks it of every GET resource and Starlette's own Route adds it, but
        FastAPI's ``app.get`` registers GET alone: a load balancer's or ``curl -I``'s HEAD /health
        got 405."""
        return app.api_route(path, methods=["GET", "HEAD"])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        """Routing errors (404 unknown path, 405 wrong method) in OpenAI's schema too, naming the method
        and path (as OpenAI's "Invalid URL (POST /v1/x)" does), with the exception's headers (a 405's
        Allow, which RFC 9110 requires, names the methods the path takes)."""
        asked = shown(f"{request.method} {request.url.path}")
        body = error_body(e.status_code, f"{e.detail}: {asked}")
        return JSONResponse(body, status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, e: Exception) -> Response:
        """A server bug: its trace goes to the log, the client gets a 500 in OpenAI's schema."""
        log.error("internal error serving a request", exc_info=e)
        return JSONResponse(error_body(500, f"internal server error ({type(e).__name__})"), status_code=500)

    @get("/health")
    async def health() -> Response:
        failed = state.engine.fatal_error
        if failed is not None:  # (every request now fails: a load balancer must stop sending them here)
            return JSONResponse({"status": "engine stopped", "error": str(failed)}, status_code=503)
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @get("/metrics")
    async def metrics() -> Response:
        body = await asyncio.to_thread(state.metrics.render)
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    def _model_card(name: str) -> dict[str, Any]:
        """OpenAI's model object for served name `name`, with what this server runs it with."""
        spec = getattr(state.llm, "speculative", None)
        facts = getattr(getattr(state.llm, "executor", None), "facts", None)
        return {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "trtforge",
            "max_model_len": state.max_model_len,
            **({"speculative": spec.describe()} if spec is not None else {}),
            "tensor_parallel_size": getattr(facts, "tensor_parallel_size", 1),
            # what the KV pools hold (float8_e4m3fn: FP8 KV)
            "kv_cache_dtype": getattr(facts, "kv_dtype", None),
        }

    @get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            _check_key(state, request)
        except ApiError as e:
            return _error(e, "models", state)
        return JSONResponse({"object": "list", "data": [_model_card(n) for n in state.served_model_names]})

    @get("/v1/models/{name:path}")
    async def model(request: Request, name: str) -> Response:
        """One model (``client.models.retrieve(name)``); a name not served is a 404 naming it."""
        try:
            _check_key(state, request)
            return JSONResponse(_model_card(_check_model(state, name)))
        except ApiError as e:
            return _error(e, "models", state)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, "completions", CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _generate(request, "chat", ChatCompletionRequest)

    async def _generate(request: Request, endpoint: str, kind: type) -> Response:
        admission = None
        try:
            _check_key(state, request)
            _check_json(request)
            _check_draining(state)
            taken = await _unless_draining(state, _take_in(state, request, endpoint, kind))
            req, name, prompts, budgets, lp = taken
            admission = _Admission(state, len(prompts) * req.n)
            fmt = req.response_format
            release = None
            if fmt is not None and fmt.type != "text":  # compiled off the event loop and the engine's lock
                release = await _hold_grammar(state, response_format(fmt))
            try:
                choices = _make_choices(
                    state, req, prompts, budgets, lp, "messages" if endpoint == "chat" else "prompt"
                )
            finally:
                if release is not None:
                    release()
            state.metrics.prompt_tokens.inc(sum(len(p) for p in prompts) * req.n)
        except ApiError as e:
            if admission is not None:
                admission.release()
            return _error(e, endpoint, state)
        except BaseException:
            if admission is not None:
                admission.release()
            raise
        rid = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        prompt_tokens = sum(len(p) for p in prompts)  # once per prompt, whatever n is (as OpenAI counts)
        if req.stream:  # (counted in /metrics once it ends, by how it ended)
            pumps = Pumps(choices, admission, state.request_timeout)
            gen = stream(state, endpoint, rid, name, req, choices, prompt_tokens, pumps)
            return SSEResponse(gen, state, endpoint, pumps)
        try:
            texts = await _run_all(state, request, choices)
        except ApiError as e:
            return _error(e, endpoint, state)
        finally:
            admission.release()
        state.metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(full_body(state, endpoint, rid, name, req, choices, texts, prompt_tokens, lp))

    return app
