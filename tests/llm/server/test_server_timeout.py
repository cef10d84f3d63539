"""`--request-timeout`: a request still generating past it ends with 504 (streamed: an error event, then
[DONE]), its blocks return, and the server keeps serving. A tiny random model, prompts as token ids."""

from __future__ import annotations

import json

import pytest

from tests.llm.server.harness import Server, need_model

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
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    assert "--request-timeout" in r.json()["error"]["message"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as s:
        lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][len("data: ") :])["error"]["code"] == 504
    server.wait_blocks_free()
    short = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 3}, timeout=30)
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 3
