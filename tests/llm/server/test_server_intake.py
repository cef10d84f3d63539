"""`trtforge serve --max-intake 2`: at most two requests have their bodies read, parsed and tokenized at
once; a third waits with its body unread (no ``100 Continue`` for it) while /health, /metrics and
/v1/models still answer, and every slot comes back however a request ends.

Clients here are raw sockets sending ``Expect: 100-continue``: uvicorn answers ``100 Continue`` when the
app first reads the body, which is how a test sees whether a request's body is being read.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.llm.server.harness import chat_server, wait_for
from tests.llm.server.test_server_hostile import NAME, _error, _post

BODY = json.dumps({"model": NAME, "prompt": "def f(", "max_tokens": 2}).encode()
HEAD_TIMEOUT = 2  # the module's server's --head-timeout


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--num-blocks", "256", "--max-num-seqs", "4", "--max-waiting", "4", "--max-intake", "2"]
    args += ["--head-timeout", str(HEAD_TIMEOUT)]
    with chat_server(tmp_path_factory.mktemp("intake"), args) as s:
        yield s


@pytest.fixture
def open_request(server):
    """Opens a completions request sending only its headers, with ``Expect: 100-continue`` (its body is
    the test's to send); whatever a test leaves open is closed after it, failed or not."""
    opened: list[socket.socket] = []

    def open_one() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        opened.append(s)
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(BODY)
        )
        return s

    yield open_one
    for s in opened:
        s.close()


def _continued(s: socket.socket, timeout: float) -> bool:
    """Whether the server answered ``100 Continue`` (began reading the body) within `timeout` seconds."""
    s.settimeout(timeout)
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            chunk = s.recv(1)
            assert chunk, f"the server closed the connection: {head!r}"
            head += chunk
    except TimeoutError:
        assert not head, head
        return False
    assert head.startswith(b"HTTP/1.1 100 "), head
    return True


def _response(s: socket.socket) -> tuple[int, bytes]:
    """The final response's status and body (the request said Connection: close)."""
    s.settimeout(60)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _intake(server) -> tuple[float, float]:
    m = server.metrics()
    return m["trtforge_http_requests_intake"], m["trtforge_http_requests_intake_waiting"]


def _others_answer(server) -> None:
    """/health, /metrics and /v1/models take no intake slot: they answer at once while all are held."""
    import httpx

    for path in ("/health", "/metrics", "/v1/models"):
        start = time.monotonic()
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path
        assert time.monotonic() - start < 2, path


def test_a_request_past_the_bound_waits_unread_until_a_slot_frees(server, open_request):
    """Two bodies arriving slowly hold both slots: the third request's body is not read (no 100 Continue)
    until one of them is answered, then it is read and served."""
    a, b = open_request(), open_request()
    assert _continued(a, 10) and _continued(b, 10)
    half = len(BODY) // 2
    a.sendall(BODY[:half])
    b.sendall(BODY[:half])
    c = open_request()
    assert not _continued(c, 1.0), "a third body was read while two held the slots"
    wait_for(lambda: _intake(server) == (2, 1))
    _others_answer(server)
    assert _intake(server) == (2, 1) and not _continued(c, 0.2)
    a.sendall(BODY[half:])
    assert _response(a)[0] == 200
    assert _continued(c, 10), "the waiting request was not read once a slot freed"
    c.sendall(BODY)
    b.sendall(BODY[half:])
    assert _response(c)[0] == 200 and _response(b)[0] == 200
    wait_for(lambda: _intake(server) == (0, 0))
    server.wait_blocks_free()


def test_slots_come_back_after_refusals_disconnects_and_successes(server, open_request):
    """More 400s, 499s (cut short while read, or gone while waiting for a slot) and 200s than there are
    slots, one after another: afterwards both slots are free (two bodies are read at once again)."""
    for body in (b"{", b'{"model": "%s", "prompt": "x", "n": 0}' % NAME.encode()) * 2:
        _error(_post(server, body))
    long = json.dumps({"model": NAME, "prompt": "def f(x): return x\n" * 400, "max_tokens": 2}).encode()
    for _ in range(3):  # refused after tokenizing (past the context)
        assert _error(_post(server, long))["param"] == "prompt"
    key = 'trtforge_requests_total{endpoint="completions",status="499"}'
    before = server.metrics().get(key, 0)
    for _ in range(3):  # cut short while its body is read
        s = open_request()
        assert _continued(s, 10)
        s.sendall(BODY[:10])
        s.close()
    held = [open_request(), open_request()]
    for s in held:
        assert _continued(s, 10)
    gone = open_request()  # leaves while waiting for a slot: it is refused (499) once it has one
    wait_for(lambda: _intake(server) == (2, 1))
    gone.close()
    for s in held:
        s.sendall(BODY)
        assert _response(s)[0] == 200
    wait_for(lambda: server.metrics().get(key, 0) >= before + 4)
    for _ in range(3):
        assert _post(server, BODY).status_code == 200
    wait_for(lambda: _intake(server) == (0, 0))
    both = [open_request(), open_request()]
    assert all(_continued(s, 10) for s in both), "a slot was not given back"
    for s in both:
        s.sendall(BODY)
        assert _response(s)[0] == 200
    assert "Traceback" not in server.log(), server.log()
    server.wait_blocks_free()


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    args = ["--num-blocks", "256", "--max-num-seqs", "4", "--max-intake", "1", "--body-timeout", "1"]
    with chat_server(tmp_path_factory.mktemp("impatient"), args) as s:
        yield s


def test_a_body_trickling_past_body_timeout_is_a_408_and_frees_its_slot(impatient):
    """Under an intake bound, a client that sends its body a byte at a time would hold its slot as long
    as it likes (here the only one): past --body-timeout it gets a 408 and the next request is read."""
    s = socket.create_connection(("127.0.0.1", impatient.port), timeout=30)
    try:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(BODY)
        )
        start = time.monotonic()
        s.sendall(BODY[:5])
        status, body = _response(s)
    finally:
        s.close()
    assert status == 408 and 0.9 < time.monotonic() - start < 10
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and "--body-timeout 1 s" in error["message"]
    assert _post(impatient, BODY).status_code == 200  # the slot came back
    m = impatient.metrics()
    assert (m["trtforge_http_requests_intake"], m["trtforge_http_requests_intake_waiting"]) == (0, 0)


def test_requests_in_intake_when_the_drain_begins_get_a_503_in_openais_schema(tmp_path):
    """SIGTERM while one request sends its body (holding the only slot) and another waits for the slot:
    no request is admitted, so the drain ends at once; both get the drain's 503 in OpenAI's schema, as
    any request arriving during it does, and the server exits 0. Before: uvicorn cancelled both a second
    after the drain ended, a plain-text 500 ``Internal Server Error``."""
    args = ["--num-blocks", "256", "--max-intake", "1", "--shutdown-grace", "60"]
    with chat_server(tmp_path, args) as server:
        opened = []
        try:
            for _ in range(2):
                s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                opened.append(s)
                s.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(BODY)
                )
                if len(opened) == 1:
                    assert _continued(s, 10)
                    s.sendall(BODY[:10])  # the rest never comes
            reading, waiting = opened
            wait_for(lambda: _intake(server) == (1, 1))
            server.terminate()
            for s in (waiting, reading):
                status, body = _response(s)
                assert status == 503, (status, body)
                error = json.loads(body)["error"]
                assert error["type"] == "service_unavailable_error" and "shutting down" in error["message"]
            assert server.proc.wait(60) == 0, server.log()
        finally:
            for s in opened:
                s.close()


def test_a_connection_whose_head_does_not_arrive_in_time_is_closed(server):
    """A connection that sends nothing, one that sends part of a head and stops, one that trickles header
    lines for longer than --head-timeout, and one whose second request (after a response, on the same
    connection) never finishes its head: each is closed at --head-timeout, with a 408 in OpenAI's schema
    where part of a head came. Before: uvicorn has no such bound, and each held its socket for ever (a
    slowloris: enough of them leave the server no file descriptor to accept real clients with). The
    waits are for the server's close; their timeout is a hang guard only."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", server.port), timeout=30)

    idle, partial, trickling = connect(), connect(), connect()
    partial.sendall(head)
    trickling.sendall(head)
    for _ in range(3 * HEAD_TIMEOUT * 4):  # a line every 0.25 s for 3x the timeout, never the blank line
        try:
            trickling.sendall(b"X-Slow: 1\r\n")
        except OSError:  # (closed already)
            break
        time.sleep(0.25)
    second = connect()  # (one opened with the others would be closed by now: it sent nothing)
    second.sendall(head + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = second.recv(65536)
        assert chunk, reply
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    second.sendall(head)  # the second request's head, never finished
    assert idle.recv(100) == b""  # closed, nothing said: no request had begun
    for s in (partial, trickling, second):
        status, body = _response(s)
        assert status == 408, body
        assert f"--head-timeout {HEAD_TIMEOUT} s" in json.loads(body)["error"]["message"], body
    for s in (idle, partial, trickling, second):
        s.close()
    assert _post(server, BODY).status_code == 200
