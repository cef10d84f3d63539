"""`trtforge serve` under bounded load: 429 past the waiting queue, an executor fault is a 500 for
its requests only, SIGTERM drains in-flight requests (new ones get 503) and exits 0.

One small server for the module (2 running + 1 waiting sequences), serving a model whose step fails
on one token id (tests/llm/server/faulty.py). The SIGTERM test ends it, so it runs last.
"""

from __future__ import annotations

import threading

import pytest

from tests.llm.server.faulty import LOST, POISON
from tests.llm.server.harness import Server, need_model, wait_for

NAME = "faulty"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = need_model()
    args = [
        "--tokenizer",
        str(model),
        "--served-model-name",
        NAME,
        "--num-blocks",
        "256",
        "--max-num-seqs",
        "2",
        "--max-waiting",
        "1",
        "--shutdown-grace",
        "60",
    ]
    s = Server("tests.llm.server.faulty:make", args, tmp_path_factory.mktemp("limits") / "server.log")
    yield s
    s.stop()


def _stream(server, max_tokens, out, key):
    import httpx

    body = {
        "model": NAME,
        "prompt": "def f(x):",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        out[key] = {"status": r.status_code, "lines": [line for line in r.iter_lines() if line]}


def test_queue_overflow_is_429_with_retry_after(server):
    import httpx

    out: dict = {}
    threads = [threading.Thread(target=_stream, args=(server, 120, out, i)) for i in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: server.metrics()["trtforge_http_requests_in_flight"] == 3)
    r = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 2})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"
    for t in threads:
        t.join()
    assert all(v["status"] == 200 and v["lines"][-1] == "data: [DONE]" for v in out.values())
    server.wait_blocks_free()


def test_an_executor_fault_fails_its_requests_only(server):
    import httpx

    url = server.url + "/v1/completions"
    r = httpx.post(url, json={"model": NAME, "prompt": [[5, POISON, 7]], "max_tokens": 4}, timeout=60)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "injected executor fault" in r.json()["error"]["message"]
    ok = httpx.post(url, json={"model": NAME, "prompt": "def g():", "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    server.wait_blocks_free()


def test_chat_without_a_template_is_400_naming_the_flag(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "--chat-template" in e.value.body["message"] and e.value.body["param"] == "messages"


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(server):
    import httpx

    out: dict = {}
    threads = [threading.Thread(target=_stream, args=(server, 120, out, i)) for i in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: server.metrics()["trtforge_num_requests_running"] == 2)
    server.terminate()
    wait_for(lambda: httpx.get(server.url + "/health").status_code == 503)
    r = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable_error"
    for t in threads:
        t.join()
    assert server.proc.wait(60) == 0
    for v in out.values():
        assert v["status"] == 200 and v["lines"][-1] == "data: [DONE]"
        assert '"finish_reason": "length"' in v["lines"][-2]
    assert "Traceback" not in server.log(), server.log()


def test_a_second_sigterm_stops_at_once_without_a_trace_and_exits_143(tmp_path):
    """A supervisor repeating SIGTERM (or `timeout` plus a manual kill) during the drain: the request in
    flight is cancelled, the log holds no asyncio CancelledError trace, and the exit is SIGTERM's 143."""
    model = need_model()
    s = Server(str(model), ["--num-blocks", "256", "--shutdown-grace", "60"], tmp_path / "server.log")
    out: dict = {}
    t = threading.Thread(target=_stream_safely, args=(s, model.name, out))
    t.start()
    try:
        wait_for(lambda: s.metrics()["trtforge_num_requests_running"] == 1)
        s.terminate()
        wait_for(lambda: "draining 1 request" in s.log())
        s.terminate()
        assert s.proc.wait(60) == 143, s.log()
    finally:
        s.stop()
        t.join(60)
    log = s.log()
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert "terminated" in log, log


def _stream_safely(server, model, out):
    """A long streamed completion whose connection the server may drop."""
    import httpx

    body = {"model": model, "prompt": "def f(x):", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            out["lines"] = [line for line in r.iter_lines() if line]
    except httpx.HTTPError as e:
        out["error"] = e


def test_an_engine_that_stops_turns_health_to_503_and_the_server_exits_1(tmp_path):
    """A lost executor (a tensor-parallel worker's death) stops the engine: every request after it failed
    with a 503, while /health said "ok" and the process ran on, so no load balancer or supervisor
    noticed. Now /health says why with 503 and the server exits 1 at once, without a trace."""
    import httpx

    model = need_model()
    args = ["--tokenizer", str(model), "--served-model-name", NAME, "--num-blocks", "64"]
    s = Server("tests.llm.server.faulty:make", args, tmp_path / "server.log")
    try:
        r = httpx.post(
            s.url + "/v1/completions",
            json={"model": NAME, "prompt": [[5, LOST]], "max_tokens": 2},
            timeout=60,
        )
        assert r.status_code == 503 and "injected loss" in r.json()["error"]["message"], r.text
        assert s.proc.wait(30) == 1, s.log()
    finally:
        s.stop()
    assert "the engine stopped (injected loss of the executor (token 4094))" in s.log(), s.log()
    assert "Traceback" not in s.log(), s.log()


def test_requests_running_past_the_grace_end_as_503s_and_streams_with_done(tmp_path):
    """SIGTERM with requests that outlast --shutdown-grace: uvicorn cancelled them, so a plain request got
    a plain-text 500 and a stream stopped without an error or [DONE] (and the log said "Cancel 2 running
    task(s)"). Now the engine is closed first: the request gets a 503 in OpenAI's schema, the stream an
    error event then [DONE], and the server exits 0."""
    import httpx

    model = need_model()
    s = Server(str(model), ["--num-blocks", "256", "--shutdown-grace", "1"], tmp_path / "server.log")
    out: dict = {}

    def plain() -> None:
        body = {"model": model.name, "prompt": "def f(x):", "max_tokens": 2000, "ignore_eos": True}
        try:
            out["plain"] = httpx.post(s.url + "/v1/completions", json=body, timeout=120)
        except httpx.HTTPError as e:
            out["plain"] = e

    threads = [
        threading.Thread(target=plain),
        threading.Thread(target=_stream_safely, args=(s, model.name, out)),
    ]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: s.metrics()["trtforge_num_requests_running"] == 2)
        s.terminate()
        assert s.proc.wait(60) == 0, s.log()
    finally:
        s.stop()
        for t in threads:
            t.join(60)
    r = out["plain"]
    assert isinstance(r, httpx.Response) and r.status_code == 503, r
    assert "shutting down" in r.json()["error"]["message"], r.text
    assert out["lines"][-1] == "data: [DONE]" and "shutting down" in out["lines"][-2], out["lines"][-2:]
    assert "Traceback" not in s.log() and "Cancel" not in s.log(), s.log()
