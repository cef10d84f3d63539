"""`--request-timeout`: a request still generating past it ends with 504 (streamed: an error event, then
[DONE]), its blocks return, and the server keeps serving. A tiny random model, prompts as token ids."""

from __future__ import annotations

import contextlib
import json
import socket

import pytest

from tests.llm.server.harness import Server, need_model, wait_for

NAME = "tiny"
LONG = {"model": NAME, "prompt": [5, 6, 7], "max_tokens": 500, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = need_model()  # for its tokenizer
    args = ["--tokenizer", str(model), "--served-model-name", NAME, "--request-timeout", "0.3"]
    s = Server("tests.llm.server.faulty:tiny", args, tmp_path_factory.mktemp("timeout") / "server.log")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.log(), s.log()


def test_a_request_past_the_timeout_is_504_and_frees_its_blocks(server):
    import httpx

    r = httpx.post(server.url + "/v1/completions", json=LONG, timeout=30)
    assert r.status_code == 504 and r.json()["error"]["type"] == "server_error"
    assert r.json()["error"]["code"] == "timeout"
    assert "--request-timeout" in r.json()["error"]["message"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as s:
        lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][len("data: ") :])["error"]["code"] == "timeout"
    server.wait_blocks_free()
    short = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 3}, timeout=30)
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 3


def test_a_stream_is_counted_in_metrics_by_how_it_ended(server):
    """/metrics counts a stream once it ends: one cut by --request-timeout under 504 (its error event's
    code), one that finished under 200. Before: every stream was counted 200 as it began."""
    import httpx

    def counts() -> tuple[float, float]:
        m = server.metrics()
        key = 'trtforge_requests_total{endpoint="completions",status="%s"}'
        return m.get(key % "200", 0), m.get(key % "504", 0)

    ok0, late0 = counts()
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as s:
        lines = [line for line in s.iter_lines() if line]
    assert json.loads(lines[-2][len("data: ") :])["error"]["code"] == "timeout"
    wait_for(lambda: counts() == (ok0, late0 + 1))
    short = {**LONG, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=short, timeout=30) as s:
        assert [line for line in s.iter_lines() if line][-1] == "data: [DONE]"
    wait_for(lambda: counts() == (ok0 + 1, late0 + 1))
    server.wait_blocks_free()


class _Endless:
    """A streamed choice whose generation never ends: a piece every millisecond until it is cancelled."""

    finish_reason = None
    num_tokens = 0

    def __init__(self) -> None:
        import asyncio
        from types import SimpleNamespace

        self.cancelled = asyncio.Event()
        self.handle = SimpleNamespace(cancel=self.cancelled.set)

    async def pieces(self):
        import asyncio

        while True:
            await asyncio.sleep(0.001)
            yield "x" * 100

    def take_logprobs(self) -> list:
        return []


class _Admission:
    def release(self) -> None:
        pass


class _Requests:
    """/metrics' requests counter, recording the labels each count is made under."""

    def __init__(self) -> None:
        self.counted: list[tuple[str, ...]] = []

    def labels(self, *labels: str):
        from types import SimpleNamespace

        self.counted.append(labels)
        return SimpleNamespace(inc=lambda: None)


@pytest.mark.parametrize("grace", [3600.0, 0.1])
def test_a_stream_whose_client_reads_nothing_is_cancelled_at_the_timeout(monkeypatch, caplog, grace):
    """A streaming client that reads nothing: once the socket's buffers fill, every send of the body waits
    on it, so the body never reaches its own --request-timeout check. Its generation is cancelled at the
    timeout anyway (while the send still waits: the grace is an hour), and STREAM_CLOSE_GRACE later its
    connection is dropped and the stream counted 504. Before: it ran to max_tokens, and its response waited
    on the client forever.

    In process, over the server's own response and pumps: the client is an ASGI send that never returns
    once the body starts (a client whose buffers are full, whatever the machine's speed; a real server
    needed megabytes of events for that, which a loaded machine did not make before the timeout), and
    each wait is for an event, its timeout a hang guard only."""
    import asyncio
    import logging
    from types import SimpleNamespace

    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    from trtforge.llm.server import responses

    monkeypatch.setattr(responses, "STREAM_CLOSE_GRACE", grace)
    caplog.set_level(logging.WARNING, logger="trtforge.serve")

    async def run() -> None:
        choices = [_Endless(), _Endless()]
        metrics = SimpleNamespace(requests=_Requests())
        state = SimpleNamespace(
            request_timeout=0.2, send_timeout=None, metrics=metrics, streams=0, waiting_sends=set()
        )
        pumps = responses.Pumps(choices, _Admission(), state.request_timeout)
        req = SimpleNamespace(stream_options=None, logprobs=None)
        body = responses.stream(state, "completions", "cmpl-1", NAME, req, choices, 3, pumps)
        response = responses.SSEResponse(body, state, "completions", pumps)
        blocked, gone, never = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                blocked.set()
                await never.wait()

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, responses.ABORT_CONNECTION: gone.set}
        serving = asyncio.ensure_future(response(scope, receive, send))
        await asyncio.wait_for(blocked.wait(), 30)
        assert state.streams == 1 and len(state.waiting_sends) == 1  # (what a drain's end cuts)
        await asyncio.wait_for(asyncio.gather(*(c.cancelled.wait() for c in choices)), 30)
        assert all(t.done() for t in pumps.tasks)
        if grace > 60:  # the send still waits: the connection stays until the grace is over
            assert not gone.is_set() and not serving.done()
            serving.cancel()
            return
        await asyncio.wait_for(serving, 30)
        assert gone.is_set() and metrics.requests.counted == [("completions", "504")]
        assert state.streams == 0 and not state.waiting_sends

    asyncio.run(run())
    if grace < 60:
        assert "read nothing for 0.1 s past --request-timeout 0.2 s" in caplog.text, caplog.text


@pytest.fixture(scope="module")
def stalling(tmp_path_factory):
    """slow_long's server with --send-timeout 1 and no --request-timeout."""
    model = need_model()
    args = ["--tokenizer", str(model), "--served-model-name", NAME, "--send-timeout", "1"]
    args += ["--max-num-seqs", "16", "--num-blocks", "4200"]
    s = Server("tests.llm.server.faulty:slow_long", args, tmp_path_factory.mktemp("stall") / "server.log")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.log(), s.log()


def test_a_stream_whose_client_never_reads_is_cut_at_the_send_timeout(stalling):
    """A streaming client that sends its request and never reads, with no --request-timeout: once the
    socket's buffers filled, every send waited on it, and its request ran on to max_tokens (40 s or more
    here) and then held its socket for ever. Now a send waiting past --send-timeout cuts the stream: its
    16 sequences leave the engine (every KV block back) long before their 4,000 tokens, it is counted 408,
    and its connection is dropped at once (a close, uvicorn's, would wait for the client to read the
    buffered bytes first)."""
    body = json.dumps({**LONG, "max_tokens": 4000, "n": 16, "logprobs": 20, "stream": True}).encode()
    key = 'trtforge_requests_total{endpoint="completions",status="408"}'
    before = stalling.metrics().get(key, 0)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting: the window it offers)
    try:
        s.connect(("127.0.0.1", stalling.port))
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_for(lambda: stalling.metrics()["trtforge_num_requests_running"] == 16)
        # (a hang guard only: how soon the buffers fill depends on the machine's load; that the stream was
        # cut, not run out, is what the count of tokens generated says)
        m = stalling.wait_blocks_free(timeout=600)
        assert m["trtforge_generation_tokens_total"] < 16 * 4000 / 2
        wait_for(lambda: stalling.metrics()["trtforge_http_requests_in_flight"] == 0)
        wait_for(lambda: stalling.metrics().get(key, 0) == before + 1)
        s.settimeout(10)
        read = 0
        with contextlib.suppress(ConnectionResetError):  # (the server's reset may come before any EOF)
            while chunk := s.recv(2**16):
                read += len(chunk)
        # what the client's own small buffer held, not the server's buffered megabytes (a close waits for
        # the client to read those)
        assert read < 2**16, read
        log = stalling.log()
        assert "read nothing for --send-timeout 1 s" in log, log
        assert "ASGI callable" not in log, log
    finally:
        s.close()


def test_send_timeout_is_a_serving_option_with_a_default(built_state):
    from trtforge.errors import UserError
    from trtforge.llm.server.app import DEFAULT_SEND_TIMEOUT
    from trtforge.llm.server.run import ServeOptions

    assert built_state(None, "m", ServeOptions()).send_timeout == DEFAULT_SEND_TIMEOUT == 60.0
    assert built_state(None, "m", ServeOptions(send_timeout=2.5)).send_timeout == 2.5
    with pytest.raises(UserError, match="--send-timeout nan"):
        ServeOptions(send_timeout=float("nan"))


def test_the_drain_waits_for_streams_still_sending_and_cuts_those_stalled_at_its_grace(capsys):
    """SIGTERM with a stream whose client reads nothing took 8.2 s against --shutdown-grace 3: at the
    grace the engine closed, but the stream's send still waited on its client, so uvicorn waited its own
    second (timeout_graceful_shutdown) for the connection, then cancelled the task ("Cancel 1 running
    task(s)" in the log) and left the socket to the kernel with megabytes queued for that client; the rest
    was the interpreter's exit (about 4 s on the loaded box, the same for an idle server). And a stream
    whose generation had ended but whose events were still being sent did not count as in flight: the
    drain ended at once, and uvicorn cut it a second later.

    Now the drain waits for streams still sending, up to the grace, and at the grace resets the
    connections of those whose send waits on their client, so no connection is left for uvicorn's
    second. The grace's end is set on the draining server rather than waited for (a fake clock): the
    server's tick is driven by hand over a stand-in state."""
    import asyncio
    import importlib
    import signal
    import time
    from types import SimpleNamespace

    uvicorn = pytest.importorskip("uvicorn")
    server_run = importlib.import_module("trtforge.llm.server.run")
    cut, closed = [], []
    state = SimpleNamespace(
        draining=False,
        requests=0,
        streams=1,  # a stream whose generation ended, its last events still being sent
        waiting_sends=set(),
        drain_begun=lambda: None,
        engine=SimpleNamespace(close=lambda: closed.append(True), fatal_error=None),
    )
    config = uvicorn.Config(lambda *a: None, lifespan="off", log_config=None)
    server = server_run._DrainingServer(config, state, 3600.0)
    server.handle_exit(signal.SIGTERM, None)
    assert state.draining and not asyncio.run(server.on_tick(1))  # (tick 1: no date header to render)
    assert not server.should_exit, "the drain ended with a stream still sending"

    state.requests = 1  # a request still generating, and the stream's send waiting on its client
    state.waiting_sends.add(lambda: cut.append(True))
    assert not asyncio.run(server.on_tick(1)) and not cut and not closed
    server.deadline = time.monotonic() - 0.001  # the grace is over
    assert asyncio.run(server.on_tick(1)) and server.should_exit
    assert closed == [True] and cut == [True]
    assert "cutting 1 stream(s) whose clients read nothing" in capsys.readouterr().err


def test_a_stream_cut_at_the_drains_end_stops_at_once_counted_503(caplog):
    """The drain's cut of a stream whose send waits on its client (the function it finds in
    state.waiting_sends) resets the connection, which makes uvicorn's waiting send return; the body then
    went on rendering every piece still queued for a client that was gone (a second of the event loop at
    the drain's end on a 16-choice stream with logprobs), here for ever. Now the stream ends at the cut:
    its choices cancelled, counted 503, its cut logged. In process: the send waits until the connection
    is aborted, as uvicorn's does; each wait is for an event, its timeout a hang guard only."""
    import asyncio
    import logging
    from types import SimpleNamespace

    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    from trtforge.llm.server import responses

    caplog.set_level(logging.WARNING, logger="trtforge.serve")

    async def run() -> None:
        choices = [_Endless(), _Endless()]
        metrics = SimpleNamespace(requests=_Requests())
        state = SimpleNamespace(
            request_timeout=None, send_timeout=60.0, metrics=metrics, streams=0, waiting_sends=set()
        )
        pumps = responses.Pumps(choices, _Admission(), None)
        req = SimpleNamespace(stream_options=None, logprobs=None)
        body = responses.stream(state, "completions", "cmpl-1", NAME, req, choices, 3, pumps)
        response = responses.SSEResponse(body, state, "completions", pumps)
        blocked, gone = asyncio.Event(), asyncio.Event()

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                blocked.set()
                await gone.wait()  # (uvicorn's send returns once the connection is lost)

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, responses.ABORT_CONNECTION: gone.set}
        serving = asyncio.ensure_future(response(scope, receive, send))
        await asyncio.wait_for(blocked.wait(), 30)
        (cut,) = state.waiting_sends
        cut()
        await asyncio.wait_for(serving, 30)
        await asyncio.wait_for(asyncio.gather(*(c.cancelled.wait() for c in choices)), 30)
        assert metrics.requests.counted == [("completions", "503")]
        assert state.streams == 0 and not state.waiting_sends

    asyncio.run(run())
    assert "read nothing when the drain's --shutdown-grace ended" in caplog.text, caplog.text
