"""`--request-timeout`: a request still generating past it ends with 504 (streamed: an error event, then
[DONE]), its blocks return, and the server keeps serving. A tiny random model, prompts as token ids."""

from __future__ import annotations

import contextlib
import json
import socket
import time

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


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """A server whose steps take 10 ms or more (tests/llm/server/faulty.py's slow_long), with a timeout."""
    model = need_model()
    args = ["--tokenizer", str(model), "--served-model-name", NAME, "--request-timeout", "20"]
    args += ["--max-num-seqs", "16", "--num-blocks", "4200"]
    s = Server("tests.llm.server.faulty:slow_long", args, tmp_path_factory.mktemp("slow") / "server.log")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.log(), s.log()


def test_a_stream_whose_client_reads_nothing_is_cancelled_at_the_timeout(slow):
    """A streaming client that sends its request and never reads (a small receive buffer): once the
    socket's buffers fill, every send of the body waits on the client, so the body never reached its own
    --request-timeout check. The request is cancelled at the timeout anyway (its 16 sequences leave the
    engine, though 4,000 tokens each would take 40 s or more), counted 504, and its connection closed a
    grace later. Before: it ran to max_tokens, and its response waited on the client forever."""
    body = json.dumps(
        {**LONG, "max_tokens": 4000, "n": 16, "logprobs": 20, "stream": True}  # ~8 MB of events in 20 s
    ).encode()
    key = 'trtforge_requests_total{endpoint="completions",status="504"}'
    before = slow.metrics().get(key, 0)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting: the window it offers)
    try:
        s.connect(("127.0.0.1", slow.port))
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        start = time.monotonic()
        wait_for(lambda: slow.metrics()["trtforge_num_requests_running"] == 16)
        m = slow.wait_blocks_free(timeout=20 + 10)  # its sequences leave the engine at the timeout
        assert time.monotonic() - start < 20 + 10
        assert m["trtforge_generation_tokens_total"] < 16 * 4000 / 2
        assert m["trtforge_http_requests_in_flight"] == 0
        wait_for(lambda: slow.metrics().get(key, 0) == before + 1)  # once its connection is closed
        log = slow.log()
        assert "read nothing for 5 s past --request-timeout 20 s" in log, log
        assert "ASGI callable" not in log, log
    finally:
        s.close()


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
