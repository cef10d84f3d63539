"""`trtforge serve` tokenizes texts off its event loop: a batch of long prompts (seconds of tokenizing)
holds no other client.

A server of its own, with a waiting queue long enough (1,024) for a batch of a thousand prompts.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.llm.server.harness import chat_server, wait_for

NAME = "code-llama-21m"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--num-blocks", "256", "--max-num-seqs", "4", "--max-waiting", "1024"]
    with chat_server(tmp_path_factory.mktemp("tokenize"), args) as s:
        yield s


def _health_waits_during(server, send) -> tuple[object, float, list[float]]:
    """`send()`'s answer and time, and how long each /health check waited while it was in flight."""
    import httpx

    waits: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t = time.monotonic()
            httpx.get(server.url + "/health", timeout=60)
            waits.append(time.monotonic() - t)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        start = time.monotonic()
        r = send()
        took = time.monotonic() - start
    finally:
        done.set()
        poller.join()
    return r, took, waits


def test_a_batch_of_long_prompts_is_tokenized_without_holding_the_server(server):
    """1,000 prompts of ~2,000 tokens each, all legal, are seconds of tokenizing; health checks answer
    meanwhile. max_tokens 100 makes each prompt too long only once tokenized: a 400 naming it. (That
    /health answers while tokenizing is still going on is shown by events in process:
    test_server_app.py's test_health_answers_while_a_prompt_is_being_tokenized; a bound here of 0.5 s on
    each check's wait failed on a busy machine.)"""
    import httpx

    prompt = "def f(x): return x\n" * 250  # 2,000 tokens, under the model's 2,048
    body = json.dumps({"model": NAME, "prompt": [prompt] * 1000, "max_tokens": 100}).encode()

    def send():
        return httpx.post(server.url + "/v1/completions", content=body, headers=JSON, timeout=120)

    r, took, waits = _health_waits_during(server, send)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "max_tokens" and "2048" in err["message"], err
    assert took > 1.0, f"the batch tokenized in {took:.2f} s: too fast to show the event loop held"
    assert len(waits) > 3, (took, waits)
    server.wait_blocks_free()


def test_texts_are_tokenized_while_requests_wait_on_schema_compiles(server):
    """A request waiting on its schema's compile held a thread of the event loop's default executor (at
    most 32); with more of them waiting than it has, a plain text request and /metrics are served all the
    same, and so is every schema request. That the plain request and /metrics are answered while every
    compile still waits is shown by events in process (test_server_app.py's
    test_texts_are_tokenized_and_metrics_answer_while_every_compile_waits): here a sleep of 0.5 s stood
    for "the compiles have begun", and bounds of 1.5 s and 1 s failed on a busy machine, where the
    4,000-repeat patterns' compiles also passed the compiler's 30 s limit."""
    import os

    import httpx

    waiting = min(32, (os.cpu_count() or 1) + 4) + 4  # more than the server's default executor has threads

    def slow(i: int) -> bytes:
        schema = {"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": "[a-z]{1,1000}"}}}
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        return json.dumps({"model": NAME, "prompt": "{", "max_tokens": 2, "response_format": fmt}).encode()

    answers: list = []

    def send(body: bytes) -> None:
        answers.append(httpx.post(server.url + "/v1/completions", content=body, headers=JSON, timeout=120))

    senders = [threading.Thread(target=send, args=(slow(i),)) for i in range(waiting)]
    for t in senders:
        t.start()
    # (the schema requests taken in: admitted, or already answered)
    wait_for(lambda: len(answers) == waiting or server.metrics()["trtforge_http_requests_in_flight"] > 0)
    plain = json.dumps({"model": NAME, "prompt": "def f(x):", "max_tokens": 2}).encode()
    r = httpx.post(server.url + "/v1/completions", content=plain, headers=JSON, timeout=120)
    metrics = httpx.get(server.url + "/metrics", timeout=120)
    for t in senders:
        t.join(120)
    assert r.status_code == 200, r.text
    assert metrics.status_code == 200
    assert [a.status_code for a in answers] == [200] * waiting, [
        a.text for a in answers if a.status_code != 200
    ]
    server.wait_blocks_free()
