"""Run the app with uvicorn; SIGTERM (and the first Ctrl-C) drains instead of dropping requests.

On the signal the server keeps listening but answers new generation requests (and /health) with
503, waits for those in flight (streams still sending included) up to the grace period, then closes the
engine (requests still running end as 503s in OpenAI's schema, a stream with its error event and [DONE])
and stops uvicorn; a stream whose send waits on a client that reads nothing then is cut at once, its
connection reset (it would take no error event, and held uvicorn's shutdown for its own second). The
process exits 0: a drain is a normal shutdown.
An engine that stops on its own (a lost executor: every request now fails) turns /health to 503 and
the server exits 1 at once, saying why, for its supervisor to restart it (it answered 503 to every
request for ever, with /health "ok").
A second signal (a supervisor repeating SIGTERM, `timeout` plus a manual kill, Ctrl-C twice) stops at
once: the requests in flight are cancelled (their cancellation is the stop asked for, not an error: no
trace is logged for it), the app's own shutdown still runs, the engine is closed, and the signal is
raised again once uvicorn's handlers are gone, so the process ends as that signal ends it (the CLI:
"terminated", exit 143; "interrupted", 130 for Ctrl-C).
"""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import json
import logging
import math
import re
import signal
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from types import FrameType
from typing import Any

from trtforge.errors import TrtforgeError, TrtforgeWarning, UserError, shown
from trtforge.llm.server.app import DEFAULT_SEND_TIMEOUT, ServerState, connection_abort, create_app

log = logging.getLogger("trtforge.serve")

# seconds a connection's request line and headers may take to arrive (--head-timeout): a client sends them
# at once, in well under a second
DEFAULT_HEAD_TIMEOUT = 20.0


@dataclass
class ServeOptions:
    """What ``trtforge serve`` was asked for beyond the model itself."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_names: tuple[str, ...] = ()
    # a Jinja template, or the name of one of the tokenizer's named templates (transformers' dict of
    # them); None: the tokenizer's own (of named ones, "default")
    chat_template: str | None = None
    max_waiting: int = 256
    request_timeout: float | None = None
    max_request_bytes: int = 16 * 2**20
    body_timeout: float = 60.0
    head_timeout: float = DEFAULT_HEAD_TIMEOUT
    send_timeout: float | None = DEFAULT_SEND_TIMEOUT
    max_intake: int | None = None  # None: app.default_intake()
    shutdown_grace: float = 30.0
    log_level: str = "warning"
    # origins (scheme://host[:port], or "*") whose web pages may call the server from a browser (CORS)
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """UserError naming the flag of a value that would start a server unlike the one asked for: an
        empty --host listened on every interface, an empty --api-key let every client in (an unset ``$KEY``
        gave no key, and no header matched it), a NaN timeout made every request time out at once (or a
        drain never end)."""
        if not self.host.strip():
            # (an unset $HOST gave "", which binds every interface: a server meant for one reachable by all)
            raise UserError(
                f"--host {shown(self.host)}: expected an address or host name to listen on (127.0.0.1 for "
                "this machine alone, 0.0.0.0 for every interface)."
            )
        key = self.api_key
        if key is not None and (not key or key != key.strip() or not (key.isascii() and key.isprintable())):
            # (an HTTP header is read as Latin-1: a key of other characters, sent as UTF-8, never matched)
            raise UserError(
                f"--api-key {shown(key)}: expected a non-empty key of printable ASCII characters "
                "without leading or trailing spaces (clients send it as `Authorization: Bearer KEY`); leave "
                "--api-key out to serve without one."
            )
        for name in self.served_model_names:
            if not name.strip() or not name.isprintable():
                raise UserError(
                    f"--served-model-name {shown(name)}: expected a name clients can send as the request's "
                    '"model" (non-empty printable text).'
                )
        for origin in self.allowed_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                # (a browser's Origin header is exactly scheme://host[:port]: "http://localhost:3000/" never
                # matched it, and the page's requests failed with nothing in the server's log)
                raise UserError(
                    f"--allowed-origins {shown(origin)}: expected an origin as a browser sends it, "
                    "scheme://host[:port] with no path or trailing slash (http://localhost:3000), or '*'."
                )
        timeouts = {
            "--request-timeout": self.request_timeout,
            "--body-timeout": self.body_timeout,
            "--head-timeout": self.head_timeout,
            "--send-timeout": self.send_timeout,
            "--shutdown-grace": self.shutdown_grace,
        }
        for flag, value in timeouts.items():
            if value is not None and math.isnan(value):
                raise UserError(f"{flag} nan: expected a number of seconds.")


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+", re.IGNORECASE)


def _imports() -> Any:
    """uvicorn, once the server's dependencies are importable and uvicorn has the internals the server
    relies on (:func:`check_uvicorn`); a UserError saying which is missing otherwise."""
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise UserError(
            f"trtforge serve needs the server's dependencies ({e.name} is missing): "
            "pip install 'trtforge[serve]'."
        ) from None
    check_uvicorn(uvicorn)
    return uvicorn


# What the server relies on of uvicorn beyond its documented Config/Server API, which a uvicorn release
# may change without notice (check_uvicorn tries each at startup):
# - BoundedHead (_http_protocol) subclasses uvicorn.protocols.http.httptools_impl.HttpToolsProtocol:
#   httptools' parser calls the protocol's own on_message_begin and on_headers_complete, each read goes
#   through data_received, `transport` is the connection's, and STATUS_LINE[431] is the 431 status line.
#   Its ``loop`` times each head (--head-timeout) and ``cycle.response_complete`` says whether a response
#   is still running. Where these change, the head bounds silently stop applying (or every request fails
#   in the parser). Without httptools, TimedHead (_h11_protocol) subclasses uvicorn's H11Protocol: its
#   connection_made, data_received and on_response_complete, ``conn`` (the h11.Connection, whose
#   their_state leaves IDLE once a head is whole), ``loop`` and ``transport``.
# - _App (app.connection_abort) finds the connection's transport as the ASGI send's
#   ``__self__.transport`` (send is the request cycle's bound method) and drops it with ``abort()``.
#   Where that changes, a stream cut on a client that reads nothing keeps its socket open for ever.
# - _DrainingServer overrides uvicorn.Server's handle_exit, on_tick, startup and shutdown and sets or
#   reads its should_exit, force_exit, started and server_state.tasks: a drain needs every one.
SERVER_HOOKS = ("handle_exit", "on_tick", "startup", "shutdown")
SERVER_FIELDS = ("should_exit", "force_exit", "started", "server_state")


def check_uvicorn(uvicorn: Any) -> None:
    """UserError naming uvicorn's version unless it still has the internals listed above: one request,
    and one head past :data:`MAX_HEAD_BYTES` where httptools is installed, are fed through the protocol
    the server runs (:func:`_http_protocol`) over a stand-in transport, as uvicorn feeds a connection's
    reads. A uvicorn that changed them would otherwise serve on, with those bounds silently gone."""
    server = uvicorn.Server
    missing = [f"uvicorn.Server.{name}" for name in SERVER_HOOKS if not callable(getattr(server, name, None))]
    try:
        protocol = _http_protocol()
        config = uvicorn.Config(_probe_app, http=protocol, lifespan="off", log_config=None, access_log=False)
        config.load()
        probe = server(config)
        missing += [f"uvicorn.Server's {name}" for name in SERVER_FIELDS if not hasattr(probe, name)]
        missing += asyncio.run(_probe_protocol(config, probe.server_state, protocol))
    except (ImportError, AttributeError, TypeError, LookupError) as e:  # an internal changed shape
        missing.append(f"a request through uvicorn's HTTP protocol failed ({type(e).__name__}: {e})")
    if missing:
        version = getattr(uvicorn, "__version__", "(version unknown)")
        raise UserError(
            f"trtforge serve relies on uvicorn internals that the installed uvicorn {version} lacks: "
            f"{'; '.join(missing)}. Without them it would serve with its bounds on request heads and "
            f"stalled streams, or its drain, silently gone; install a release that has them "
            f"(pip install 'uvicorn<{version}')."
        )


async def _probe_app(scope: Any, receive: Any, send: Any) -> None:
    """:func:`check_uvicorn`'s app: drops the connection as the server's app does (:func:`connection_abort`)
    once it has answered, or answers 500 where it cannot."""
    abort = connection_abort(send)
    status = 500 if abort is None else 200
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
    if abort is not None:
        abort()


class _ProbeTransport(asyncio.Transport):
    """A connection's transport for :func:`check_uvicorn`: keeps what is written and how it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        """(uvicorn's flow control pauses a connection's reads; the probe's come all at once)"""

    def resume_reading(self) -> None:
        """(as :meth:`pause_reading`)"""


async def _probe_protocol(config: Any, server_state: Any, protocol: Any) -> list[str]:
    """What of the internals :func:`check_uvicorn` checks the HTTP protocol class `config` loaded lacks."""
    missing = []

    protocols = []

    def connect(reads: list[bytes]) -> _ProbeTransport:
        proto = config.http_protocol_class(config=config, server_state=server_state, app_state={})
        protocols.append(proto)
        transport = _ProbeTransport()
        proto.connection_made(transport)
        for data in reads:
            if not transport.is_closing():
                proto.data_received(data)
        return transport

    answered = connect([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"])
    for _ in range(100):  # (the app runs as a task of its own: a few loop turns)
        if answered.aborted or answered.written.startswith(b"HTTP/1.1 500"):
            break
        await asyncio.sleep(0)
    if not answered.aborted:
        missing.append("the ASGI send's __self__.transport.abort() (the request cycle's transport)")
    if protocol.parser == "h11":  # (h11 bounds a head's size itself; the head's time is ours to bound)
        connect([b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"])  # (a whole head)
        connect([b"GET / HTTP/1.1\r\nHost: x\r\n"])  # (part of one)
        if protocols[-2].head_timer is not None or protocols[-1].head_timer is None:
            missing.append(
                "H11Protocol's connection_made, data_received and conn.their_state (a head's arrival was "
                "not timed)"
            )
        for proto in protocols:
            proto.connection_lost(None)
    else:
        piece = b"X: " + b"a" * (MAX_HEAD_BYTES // 4) + b"\r\n"
        large = connect([b"GET / HTTP/1.1\r\n", *[piece] * 6, b"\r\n"])
        if not large.written.startswith(b"HTTP/1.1 431"):
            missing.append(
                "HttpToolsProtocol's parser callbacks on_message_begin and on_headers_complete, its "
                "data_received, transport and STATUS_LINE[431] (a head past the bound was not refused)"
            )
    return missing


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (as uvicorn binds one) and listening, made before the model loads:
    a port in use or an address not of this machine is a UserError at once, not after minutes of loading a
    model. It listens at once because SO_REUSEADDR (kept, so a restart binds past the old server's
    TIME_WAIT connections) lets two sockets bind one port while neither listens: a second ``serve`` on the
    port loaded its model too, and one of the two failed only when uvicorn listened. Connections made
    while the model loads wait in the backlog. :func:`run` serves on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except (OSError, OverflowError) as e:
        sock.close()
        raise UserError(_cannot_listen(host, port, e)) from None
    sock.set_inheritable(True)
    return sock


# connections the listening socket queues unaccepted (uvicorn's --backlog default)
LISTEN_BACKLOG = 2048


def _cannot_listen(host: str, port: int, e: BaseException) -> str:
    """The refusal of `host`:`port` for `e`, the bind's or listen's error, saying what holds it where that
    is known (the port in use, the address not this machine's, a port the user may not open)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    why = getattr(e, "strerror", None) or str(e)
    code = getattr(e, "errno", None)
    if code == errno.EADDRINUSE:
        return (
            f"cannot listen on {where} ({why}): port {port} is held there by another trtforge serve (one "
            f"still loading its model included) or another program (`ss -tanp 'sport = :{port}'` names "
            "it); stop it, or give another --port."
        )
    if code == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {where} ({why}): --host {host} is not an address of this machine; give one "
            "of its addresses (127.0.0.1 for this machine alone, 0.0.0.0 for every interface)."
        )
    if code == errno.EACCES:
        return (
            f"cannot listen on {where} ({why}): ports below 1024 need privileges this process lacks; give "
            "--port 1024 or above."
        )
    return f"cannot listen on {where} ({why}); give another --host or --port."


def run(
    llm: Any,
    tokenizer: Any,
    model_name: str,
    options: ServeOptions,
    aliases: tuple[str, ...] = (),
    sock: socket.socket | None = None,
) -> int:
    """Serve `llm` until SIGTERM/SIGINT, drain, close it; returns the exit code (0). Without
    ``options.served_model_names`` it is served as `model_name`, which requests may also call by
    `aliases` (``serve MODEL``'s MODEL as typed). `sock`: the socket of :func:`listen` (else the server
    binds options.host:options.port itself)."""
    from trtforge.llm.text import missing_chat_template, resolve_chat_template

    uvicorn = _imports()
    template = options.chat_template
    if tokenizer is not None:
        template = resolve_chat_template(tokenizer, template)
        if template is None:  # said once here, not only in every chat request's 400
            warnings.warn(missing_chat_template(tokenizer), TrtforgeWarning, stacklevel=2)
    g = llm.engine
    facts = getattr(getattr(llm, "executor", None), "facts", None)
    state = ServerState(
        llm=llm,
        tokenizer=tokenizer,
        served_model_names=list(dict.fromkeys(options.served_model_names or (model_name,))),
        model_aliases=() if options.served_model_names else tuple(a for a in aliases if a != model_name),
        max_model_len=g.max_model_len,
        max_num_seqs=g.config.max_num_seqs,
        max_waiting=options.max_waiting,
        api_key=options.api_key,
        chat_template=template,
        request_timeout=options.request_timeout,
        max_request_bytes=options.max_request_bytes,
        body_timeout=options.body_timeout,
        send_timeout=options.send_timeout,
        max_intake=options.max_intake,
        allowed_origins=options.allowed_origins,
        vocab_size=getattr(facts, "vocab_size", None),
        input_vocab_size=getattr(facts, "input_vocab_size", None),
    )
    try:  # response_format requests compile grammars over the tokenizer (the structured extra)
        llm.engine.enable_structured_output(tokenizer)
    except UserError as e:
        state.structured_error = str(e)
    config = uvicorn.Config(
        create_app(state),
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        access_log=False,
        http=_http_protocol(options.head_timeout),
        timeout_graceful_shutdown=1,
        lifespan="on",
    )
    server = _DrainingServer(config, state, options.shutdown_grace)
    quiet = _QuietCancellations(server, state)
    uvicorn_log = logging.getLogger("uvicorn.error")  # (where uvicorn logs a request's or lifespan's end)
    uvicorn_log.addFilter(quiet)
    try:
        server.run(sockets=None if sock is None else [sock])  # on uvloop where installed, as uvicorn picks
    except SystemExit as e:  # uvicorn exits this way when it cannot bind (it has logged why)
        if server.started:
            raise
        raise UserError(
            f"cannot listen on {options.host}:{options.port} (in use, or not an address of this machine)."
        ) from e
    finally:
        uvicorn_log.removeFilter(quiet)
        llm.close()
    if server.forced is not None:  # (uvicorn's handlers are gone: the process's own handling ends it)
        signal.raise_signal(server.forced)
    if server.engine_failed is not None:
        raise TrtforgeError(
            f"the engine stopped ({server.engine_failed}), failing every request, so the server exited "
            "(exit 1) for its supervisor to restart it"
        )
    return 0


# bytes a request's line and headers may take (h11, uvicorn's other parser, stops at 16 KiB; browsers' cookies
# and a bearer key fit in a few)
MAX_HEAD_BYTES = 64 * 2**10


class _HeadTimer:
    """The --head-timeout timer of :func:`_http_protocol`'s and :func:`_h11_protocol`'s protocols: started
    at the connection's start and where a request head may begin, stopped once it is whole or the
    connection is lost; `_head_late` (the protocol's) runs at the timeout. `head_seconds` is the protocol
    class's --head-timeout; `loop` uvicorn's protocol's."""

    head_seconds: float
    head_timer: asyncio.TimerHandle | None = None  # closes the connection at --head-timeout

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._untime_head()
        super().connection_lost(exc)  # type: ignore[misc]

    def _time_head(self) -> None:
        if self.head_timer is None:
            self.head_timer = self.loop.call_later(self.head_seconds, self._head_late)  # type: ignore[attr-defined]

    def _untime_head(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None


def _http_protocol(head_timeout: float = DEFAULT_HEAD_TIMEOUT, parser: str | None = None) -> Any:
    """uvicorn's httptools protocol, refusing a request whose line and headers pass :data:`MAX_HEAD_BYTES`
    with a 431 in OpenAI's schema, and closing its connection. httptools (uvicorn's choice where installed)
    has no bound of its own: one connection sending a 300 MB header grew the server by 360 MB before any
    route, the API key's check included, saw it. Without httptools uvicorn's h11, which bounds it.

    A connection whose request head (its first, or one begun after a response) has not all arrived
    `head_timeout` seconds (--head-timeout) after it began is closed, with a 408 where some of it came:
    uvicorn has no such bound, so a client that connected and sent nothing, or trickled a header a few
    bytes at a time (slowloris), held its connection and file descriptor for ever, and enough of them left
    the server none to accept real clients with. `parser`: "httptools" or "h11" (default: httptools where
    installed, as uvicorn picks); under h11 the heads are timed alike (:func:`_h11_protocol`)."""
    if parser is None:
        parser = "h11" if importlib.util.find_spec("httptools") is None else "httptools"
    if parser == "h11":
        return _h11_protocol(head_timeout)
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    from trtforge.llm.server.protocol import error_body

    class BoundedHead(_HeadTimer, HttpToolsProtocol):
        """Counts the reads a request's head goes on through: each is all head. The read a head begins in
        may end a previous request's body (pipelining) and is not counted, so the bound is
        MAX_HEAD_BYTES plus at most one read (256 KiB)."""

        parser = "httptools"
        head: int | None = None  # bytes of the current request's head counted so far; None: not in one
        begun = 0  # requests begun on this connection
        head_seconds = head_timeout

        def on_message_begin(self) -> None:
            self.head = 0
            self.begun += 1
            self._time_head()  # (after a response: uvicorn's keep-alive timer ended at the first byte)
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self.head = None
            self._untime_head()
            super().on_headers_complete()

        def _head_late(self) -> None:
            """--head-timeout passed with the head incomplete: a 408 if any of it came, then the close."""
            self.head_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._time_head()  # (a pipelined head behind a response still running: timed after it)
                return
            if self.head is None:  # (nothing of a request came)
                self.transport.close()
                return
            late = f"the request's line and headers did not arrive within --head-timeout {head_timeout:g} s"
            self._refuse(408, late)

        def _refuse(self, status: int, message: str) -> None:
            """Answer `status` in OpenAI's schema and close the connection (the request is not read on)."""
            body = json.dumps(error_body(status, message)).encode()
            head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            self.transport.write(STATUS_LINE[status] + head % len(body) + body)
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            begun = self.begun
            super().data_received(data)
            if self.head is None or self.begun != begun or self.transport.is_closing():
                return
            self.head += len(data)
            if self.head > MAX_HEAD_BYTES:
                self.head = None
                self._untime_head()
                self._refuse(
                    431, f"the request's line and headers exceed {MAX_HEAD_BYTES:,} bytes; send shorter ones"
                )

    return BoundedHead


def _h11_protocol(head_timeout: float) -> Any:
    """uvicorn's h11 protocol (where httptools is not installed), closing a connection whose request head
    has not all arrived `head_timeout` seconds after it began, as :func:`_http_protocol`'s does (with a 408
    where some of it came): uvicorn's h11 protocol has no such bound either, so without it --head-timeout
    did nothing there. h11 bounds a head's size itself (16 KiB, a 400 past it)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from trtforge.llm.server.protocol import error_body

    class TimedHead(_HeadTimer, H11Protocol):
        """Times each request's head: from the connection's start, and from each response's end where the
        connection stays open, until h11 has the whole head (its peer's state leaves IDLE)."""

        parser = "h11"
        head_seconds = head_timeout

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._untime_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # (handles a pipelined request already received)
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._time_head()

        def _head_late(self) -> None:
            """--head-timeout passed with the head incomplete: a 408 if any of it came (h11 holds it
            unparsed), then the close."""
            self.head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:
                late = (
                    f"the request's line and headers did not arrive within --head-timeout {head_timeout:g} s"
                )
                body = json.dumps(error_body(408, late)).encode()
                head = [(b"content-type", b"application/json"), (b"connection", b"close")]
                self.transport.write(
                    self.conn.send(h11.Response(status_code=408, headers=head, reason=b"Request Timeout"))
                    + self.conn.send(h11.Data(data=body))
                    + self.conn.send(h11.EndOfMessage())
                )
            self.transport.close()

    return TimedHead


class _QuietCancellations(logging.Filter):
    """Drop uvicorn's trace of a task cancelled while the server stops (a request in flight at a second
    signal, or past the drain's grace): the stop cancelled it, so it is no error of the app's. Drop too its
    error line for a stream the app cut on a client that read nothing past --request-timeout (the app
    logged that, and uvicorn's line said only that a response was left incomplete)."""

    def __init__(self, server: Any, state: ServerState) -> None:
        super().__init__()
        self.server, self.state = server, state

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        state = self.state
        if state.streams_cut and record.getMessage() == "ASGI callable returned without completing response.":
            state.streams_cut -= 1  # a stream cut on a client that reads nothing (SSEResponse logged why)
            return False
        return not (self.server.should_exit and isinstance(exc, asyncio.CancelledError))


class _DrainingServer:
    """A uvicorn.Server whose exit signal starts a drain; a second signal stops at once."""

    def __new__(cls, config: Any, state: ServerState, grace: float) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def __init__(self) -> None:
                super().__init__(config)
                self.deadline: float | None = None
                self.forced: int | None = None  # the signal that stopped the server at once
                self.engine_failed: BaseException | None = None  # the error that stopped the engine

            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                if self.deadline is not None or sig not in (signal.SIGTERM, signal.SIGINT):
                    if self.forced is None:  # a second signal: stop now
                        self.forced = sig
                        print("trtforge serve: stopping now", file=sys.stderr, flush=True)
                    self.should_exit = self.force_exit = True
                    return
                state.draining = True
                self.deadline = time.monotonic() + grace
                print(
                    f"trtforge serve: draining {state.requests} request(s) (up to {grace:g} s), "
                    "refusing new ones",
                    file=sys.stderr,
                    flush=True,
                )

            async def on_tick(self, counter: int) -> bool:
                state.drain_begun()  # (set by the signal's handler: the requests in intake are answered here)
                late = self.deadline is not None and time.monotonic() > self.deadline
                if self.deadline is not None and (late or state.requests == state.streams == 0):
                    if state.requests and not self.should_exit:
                        # past the grace: the engine is closed first, so the requests still running end
                        # as they do on any engine error (a 503 in OpenAI's schema; a stream's error event
                        # and [DONE]) in uvicorn's second of grace, not cancelled there (a plain-text 500,
                        # a stream cut off without [DONE], and uvicorn's error log line)
                        await asyncio.to_thread(state.engine.close)
                    if late and state.waiting_sends:
                        # a stream whose client reads nothing delivers no error event either: its
                        # connection is reset now, not cancelled after uvicorn's second (with an error
                        # line, its socket left to the kernel still holding megabytes for that client)
                        print(
                            f"trtforge serve: cutting {len(state.waiting_sends)} stream(s) whose clients "
                            "read nothing",
                            file=sys.stderr,
                            flush=True,
                        )
                        for cut in list(state.waiting_sends):
                            cut()
                    self.should_exit = True
                if self.engine_failed is None and state.engine.fatal_error is not None:
                    self.engine_failed = state.engine.fatal_error
                    state.draining = self.should_exit = True
                    print(
                        f"trtforge serve: the engine stopped ({self.engine_failed}); exiting",
                        file=sys.stderr,
                        flush=True,
                    )
                return await super().on_tick(counter)

            async def shutdown(self, sockets: Any = None) -> None:
                """uvicorn's shutdown; stopping at once, the requests in flight are cancelled here (not
                left to asyncio.run's teardown) and the app's lifespan still ends (uvicorn's force_exit
                skips it, and the lifespan task cancelled instead logs its trace)."""
                if self.force_exit:
                    for task in self.server_state.tasks:
                        task.cancel()
                await super().shutdown(sockets)
                if self.force_exit:
                    await self.lifespan.shutdown()

            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                if self.started:
                    url = _listening_url(config.host, config.port, self.servers)
                    print(
                        f"trtforge serve: listening on {url} (models: {', '.join(state.served_model_names)})",
                        file=sys.stderr,
                        flush=True,
                    )

        return Server()


def _listening_url(host: str, port: int, servers: list[Any]) -> str:
    """The URL clients reach: with the port the socket was bound to (``--port 0`` has the OS choose a free
    one, and the startup line said ``:0``), an IPv6 address in brackets."""
    bound = [sock.getsockname() for server in servers for sock in (server.sockets or ())]
    port = next((addr[1] for addr in bound if isinstance(addr, tuple)), port)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"
