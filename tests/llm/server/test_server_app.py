"""The server app's helpers in process, where a real server cannot reach a case on demand: an engine
that refuses a request at submission names the field at fault."""

from __future__ import annotations

import json
import logging

import pytest

from tests.llm.server.harness import need_model


@pytest.fixture(scope="module")
def engine_and_tokenizer():
    model_dir = need_model()
    pytest.importorskip("xgrammar", reason="structured output needs the `structured` extra (xgrammar)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = LLMEngine(TorchExecutor(model, num_blocks=32, block_size=16))
    engine.enable_structured_output(tok)
    yield engine, tok
    engine.close()


def _state(engine, tok):
    from types import SimpleNamespace

    return SimpleNamespace(engine=engine, tokenizer=tok)


@pytest.mark.parametrize("prompts", [[[5, 6]], [[5, 6], [7]]])
def test_a_grammar_failing_at_submission_is_a_400_naming_response_format(engine_and_tokenizer, prompts):
    """The server compiles a schema before queuing its request; one compiled only at submission (its
    grammar evicted from the cache meanwhile) fails in the engine, and the 400 still names the field."""
    from trtforge.llm.server.app import _make_choices
    from trtforge.llm.server.protocol import ApiError, CompletionRequest, parse

    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "("}}}
    body = {"model": "m", "prompt": prompts, "max_tokens": 2, "response_format": fmt}
    req = parse(CompletionRequest, json.dumps(body).encode())
    with pytest.raises(ApiError) as e:
        _make_choices(_state(*engine_and_tokenizer), req, prompts, [2] * len(prompts), None, "prompt")
    assert e.value.status == 400 and e.value.param == "response_format", e.value.message
    assert "cannot be compiled to a grammar" in e.value.message


def test_a_prompt_the_engine_refuses_names_the_prompts_field(engine_and_tokenizer):
    """A chat's template can write ids the model lacks (a tokenizer's added tokens past its embedding):
    the engine refuses them, and the 400 names messages, where the ids came from."""
    from trtforge.llm.server.app import _make_choices
    from trtforge.llm.server.protocol import ApiError, ChatCompletionRequest, parse

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    req = parse(ChatCompletionRequest, json.dumps(body).encode())
    with pytest.raises(ApiError) as e:
        _make_choices(_state(*engine_and_tokenizer), req, [[5, 99999]], [2], None, "messages")
    assert e.value.status == 400 and e.value.param == "messages" and "99999" in e.value.message


def test_a_streamed_choice_failing_on_a_server_bug_ends_the_stream_with_a_500():
    """A choice whose text fails with an unexpected error (a server bug, not an ApiError) must end its
    stream with an error event and [DONE]: the stream waited on it forever (no --request-timeout)."""
    import asyncio
    from types import SimpleNamespace

    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    from trtforge.llm.server.responses import Pumps, stream

    class Broken:
        finish_reason = None
        num_tokens = 0
        handle = SimpleNamespace(cancel=lambda: None)

        async def pieces(self):
            yield "def"
            raise RuntimeError("a bug")

        def take_logprobs(self):
            return []

    class Admission:
        released = 0

        def release(self) -> None:
            self.released += 1

    async def run() -> list[str]:
        admission = Admission()
        choices = [Broken()]
        pumps = Pumps(choices, admission)
        state = SimpleNamespace(request_timeout=None)
        req = SimpleNamespace(stream_options=None)
        gen = stream(state, "completions", "cmpl-1", "m", req, choices, 1, pumps)
        out = await asyncio.wait_for(_collect(gen), 10)
        assert admission.released >= 1
        return out

    async def _collect(gen) -> list[str]:
        return [chunk async for chunk in gen]

    out = asyncio.run(run())
    assert out[-1] == "data: [DONE]\n\n", out
    error = json.loads(out[-2].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and error["code"] is None, error
    assert "RuntimeError" in error["message"], error


def test_continuous_usage_counts_the_tokens_streamed_so_far_and_the_choices_own_prompt():
    """With continuous_usage_stats, each chunk's usage is its choice's as of that chunk: the tokens of the
    pieces streamed up to it, and the prompt the choice continues. Before, a chunk read the choice's count
    when the body got to it, which counted the tokens of pieces still queued behind it (a client reading
    slower than the engine generates), and every chunk named the prompt tokens of all of a request's
    prompts."""
    import asyncio
    from types import SimpleNamespace

    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    from trtforge.llm.server.responses import Pumps, stream

    class Counted:
        """A choice of three pieces of one token each, all final before the body reads the first."""

        finish_reason = "length"
        handle = SimpleNamespace(cancel=lambda: None)

        def __init__(self, prompt_len: int) -> None:
            self.prompt_len, self.num_tokens = prompt_len, 0

        async def pieces(self):
            for piece in ("a", "b", "c"):
                self.num_tokens += 1
                yield piece

        def take_logprobs(self):
            return []

    async def run() -> list[dict]:
        choices = [Counted(5), Counted(7)]  # two prompts, of 5 and 7 tokens
        pumps = Pumps(choices, SimpleNamespace(release=lambda: None))
        await asyncio.wait(pumps.tasks)  # every piece queued before the body reads one
        state = SimpleNamespace(request_timeout=None)
        options = SimpleNamespace(include_usage=True, continuous_usage_stats=True)
        req = SimpleNamespace(stream_options=options, logprobs=None)
        gen = stream(state, "completions", "cmpl-1", "m", req, choices, 12, pumps)
        return [json.loads(c.removeprefix("data: ")) async for c in gen if c != "data: [DONE]\n\n"]

    chunks = asyncio.run(run())
    for i, prompt_len in ((0, 5), (1, 7)):
        usage = [c["usage"] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert [u["completion_tokens"] for u in usage] == [1, 2, 3, 3], usage  # (the last: the finish's)
        assert {u["prompt_tokens"] for u in usage} == {prompt_len}, usage
    assert chunks[-1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(need_model())


def test_a_logit_bias_is_built_once_per_request_and_shared_by_its_choices(tokenizer, monkeypatch):
    """2 prompts x n=3: the map is parsed and checked once for the request, not once per choice (256
    choices of a 4,096-entry map were 0.9 s of the event loop); every choice's params are unchanged."""
    from types import SimpleNamespace

    import numpy as np

    from trtforge.llm import sampling
    from trtforge.llm.server import protocol
    from trtforge.llm.server.app import _check_request, _make_choices
    from trtforge.llm.server.protocol import CompletionRequest, parse, sampling_params

    prompts = [[5, 6], [7]]
    bias = {str(i): float(i % 201 - 100) for i in range(4096)}
    body = {"model": "m", "prompt": prompts, "n": 3, "temperature": 1, "seed": 7, "logit_bias": bias}
    raw = json.dumps(body).encode()
    calls = {"parse": 0, "check": 0}
    parse_bias, check_bias = protocol.logit_bias, sampling.SamplingParams._check_logit_bias

    def counted_parse(value):
        calls["parse"] += 1
        return parse_bias(value)

    def counted_check(self, bad):
        calls["check"] += self.logit_bias is not None
        return check_bias(self, bad)

    class Engine:
        def submit_many(self, prompts, params, on_events, labels):
            self.params = params
            return [SimpleNamespace(cancel=lambda: None) for _ in params]

    monkeypatch.setattr(protocol, "logit_bias", counted_parse)
    monkeypatch.setattr(sampling.SamplingParams, "_check_logit_bias", counted_check)
    engine, req = Engine(), parse(CompletionRequest, raw)
    state = SimpleNamespace(
        engine=engine, tokenizer=tokenizer, max_model_len=2048, vocab_size=4096, structured_error=None
    )
    _check_request(state, req, None)
    choices = _make_choices(state, req, prompts, [2, 2], None, "prompt")
    assert calls == {"parse": 1, "check": 1}, calls
    params = [c.params for c in choices]
    assert len(params) == 6 and engine.params == params
    first = params[0]
    assert all(
        p.logit_bias is first.logit_bias and p.logit_bias_arrays is first.logit_bias_arrays for p in params
    )
    monkeypatch.undo()
    alone = parse(CompletionRequest, raw)  # each choice's params built on their own, as before
    expected = [sampling_params(alone, 2, None, j) for _ in prompts for j in range(3)]
    assert params == expected and len({p.seed for p in params}) == 3
    for p, e in zip(params, expected):
        assert all(np.array_equal(a, b) for a, b in zip(p.logit_bias_arrays, e.logit_bias_arrays))


def _app_over_no_model(tokenizer=None, **state_kw):
    """The app over a stand-in engine and `tokenizer` (none: enough for the routes that read no request)."""
    from types import SimpleNamespace

    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    from trtforge.llm.server.app import ServerState, create_app

    mem = SimpleNamespace(usage=0.0, used_blocks=0, total_blocks=8)
    stats = SimpleNamespace(
        preemptions=0, spec_draft_tokens=0, spec_accepted_tokens=0, spec_verify_rows=0, spec_acceptance_rate=0
    )
    engine = SimpleNamespace(num_running=0, num_waiting=0, fatal_error=None)
    llm = SimpleNamespace(memory_stats=lambda: mem, stats=stats, engine=engine)
    state = ServerState(llm, tokenizer, ["m"], max_model_len=64, max_num_seqs=1, max_waiting=1, **state_kw)
    return state, create_app(state)


def test_health_answers_while_a_prompt_is_being_tokenized():
    """Texts are tokenized off the event loop: while a request's tokenizing is held (a tokenizer that
    waits to be let go), /health is answered. Before, tokenizing a batch of long prompts on the loop held
    every other client for seconds; shown by the order of events, where a bound on /health's wait in
    seconds (tests/llm/server/test_server_tokenize.py) failed on a busy machine."""
    import asyncio
    import threading

    import httpx

    class HeldTokenizer:
        """Encodes "held" only once let go (60 s at most: the failure's own end), anything else at once."""

        def __init__(self) -> None:
            self.entered, self.release, self.done = threading.Event(), threading.Event(), threading.Event()

        def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
            if text == "held":
                self.entered.set()
                self.release.wait(60)
                self.done.set()
            return {"input_ids": [5] * 60}

    tok = HeldTokenizer()
    _, app = _app_over_no_model(tok)

    async def run() -> tuple[int, bool, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
            body = {"model": "m", "prompt": "held", "max_tokens": 8}
            request = asyncio.ensure_future(c.post("/v1/completions", json=body))
            assert await asyncio.to_thread(tok.entered.wait, 60), "the prompt was never tokenized"
            health = (await c.get("/health")).status_code
            held = not tok.done.is_set()
            tok.release.set()
            return health, held, await request

    health, held, r = asyncio.run(run())
    assert health == 200 and held, "/health was answered only once the prompt's tokenizing had ended"
    # tokenized, then refused: 60 prompt tokens leave 4 of max_model_len 64 for max_tokens 8
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_texts_are_tokenized_and_metrics_answer_while_every_compile_waits():
    """More requests waiting on their schemas' compiles than the event loop's default executor has
    threads: while every compile is held (an engine whose compile waits to be let go), a plain request's
    text is tokenized (here refused after it, max_tokens past the room left) and /metrics answers. Before,
    the waits took every default-executor thread, which tokenizing and /metrics need. Shown by events in
    process: test_server_tokenize.py's live version slept 0.5 s for "the compiles have begun"."""
    import asyncio
    import os
    import threading

    import httpx

    from trtforge.errors import UserError

    waiting = min(32, (os.cpu_count() or 1) + 4) + 4  # more than the default executor has threads
    release, lock, entered = threading.Event(), threading.Lock(), [0]

    def hold(fmt: dict):
        with lock:
            entered[0] += 1
        release.wait(60)  # (the failure's own end)
        raise UserError("the test's compile, let go")

    state, app = _app_over_no_model(lambda text, add_special_tokens=True: {"input_ids": [5] * 60})
    state.llm.engine.hold_response_format = hold
    state.max_waiting = waiting + 1

    async def run() -> tuple[httpx.Response, int, list[httpx.Response]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
            fmt = {"type": "json_object"}
            body = {"model": "m", "prompt": "x", "max_tokens": 2, "response_format": fmt}
            held = [asyncio.ensure_future(c.post("/v1/completions", json=body)) for _ in range(waiting)]
            deadline = asyncio.get_running_loop().time() + 60
            while entered[0] < waiting:
                assert asyncio.get_running_loop().time() < deadline, f"{entered[0]} compiles began"
                await asyncio.sleep(0.01)
            plain = c.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 8})
            plain_answer = await asyncio.wait_for(plain, 30)
            metrics_status = (await asyncio.wait_for(c.get("/metrics"), 30)).status_code
            assert not release.is_set()
            release.set()
            return plain_answer, metrics_status, await asyncio.gather(*held)

    plain, metrics, held = asyncio.run(run())
    # tokenized, then refused: max_tokens 8 past the 4 left of max_model_len 64 after 60 prompt tokens
    assert plain.status_code == 400 and plain.json()["error"]["param"] == "max_tokens", plain.text
    assert metrics == 200
    assert all(r.status_code == 400 and r.json()["error"]["param"] == "response_format" for r in held)


@pytest.mark.parametrize("path", ["/health", "/metrics", "/v1/models", "/v1/models/m", "/v1/models/gpt-4o"])
def test_head_answers_as_get_without_a_body(path):
    """A load balancer's (or `curl -I`'s) HEAD /health got 405: FastAPI's app.get registers GET alone.
    HEAD now gets GET's status and headers, and no body."""
    from fastapi.testclient import TestClient

    _, app = _app_over_no_model()
    with TestClient(app) as client:
        got, head = client.get(path), client.head(path)
    assert head.status_code == got.status_code != 405, head.status_code
    assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
    if path != "/metrics":  # (its numbers, and so its length, move between the two requests)
        assert head.headers["content-length"] == got.headers["content-length"] == str(len(got.content))


def test_head_health_says_draining_too():
    from fastapi.testclient import TestClient

    state, app = _app_over_no_model()
    state.draining = True
    with TestClient(app) as client:
        assert client.head("/health").status_code == 503


def test_health_says_the_engine_stopped_with_503():
    """An engine stopped by a lost executor fails every request: /health said "ok" all the same (the
    server also exits: tests/llm/server/test_server_limits.py)."""
    from fastapi.testclient import TestClient

    state, app = _app_over_no_model()
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        state.llm.engine.fatal_error = RuntimeError("gone")
        r = client.get("/health")
        state.draining = True  # (as the server sets it while it exits): the engine's stop is still said
        again = client.get("/health")
    assert r.status_code == 503 and r.json() == {"status": "engine stopped", "error": "gone"}
    assert again.status_code == 503 and again.json() == r.json()


def test_every_get_route_answers_head():
    """Each GET route of the app takes HEAD as well: a route added later with app.get would not."""
    from fastapi.routing import APIRoute

    _, app = _app_over_no_model()
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert routes
    for route in routes:
        assert "HEAD" in route.methods or "GET" not in route.methods, route.path


def test_a_wrong_method_is_a_405_naming_the_allowed_ones():
    """RFC 9110: a 405 carries Allow (the handler that rewrites it in OpenAI's schema dropped it)."""
    from fastapi.testclient import TestClient

    _, app = _app_over_no_model()
    with TestClient(app) as client:
        r = client.get("/v1/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["code"] is None
        assert set(client.post("/health").headers["allow"].split(", ")) == {"GET", "HEAD"}


@pytest.mark.parametrize(
    ("status", "raised", "kind", "code"),
    [
        (400, "BadRequestError", "invalid_request_error", None),
        (401, "AuthenticationError", "invalid_request_error", "invalid_api_key"),
        (404, "NotFoundError", "invalid_request_error", None),
        (405, "APIStatusError", "invalid_request_error", None),
        (408, "APIStatusError", "invalid_request_error", None),
        (413, "APIStatusError", "invalid_request_error", None),
        (415, "APIStatusError", "invalid_request_error", None),
        (429, "RateLimitError", "rate_limit_error", "rate_limit_exceeded"),
        (431, "APIStatusError", "invalid_request_error", None),
        (500, "InternalServerError", "server_error", None),
        (503, "InternalServerError", "service_unavailable_error", None),
        (504, "InternalServerError", "server_error", "timeout"),
    ],
)
def test_every_error_reads_in_the_openai_client_as_openais_do(status, raised, kind, code):
    """error.code was the HTTP status, a number: OpenAI's is a string naming the condition, or null, and
    its client reads ours as the string "404"; 401 and 404 said types OpenAI never sends
    (authentication_error, not_found_error). Each status now reads in the openai client as OpenAI's:
    its exception class, OpenAI's type, a code of OpenAI's or None, the param given."""
    openai = pytest.importorskip("openai")
    from trtforge.llm.server.protocol import ApiError

    http = getattr(openai._base_client, "httpx2", None) or openai._base_client.httpx
    client = openai.OpenAI(api_key="k", base_url="http://127.0.0.1:1/v1", max_retries=0)
    request = http.Request("POST", "http://127.0.0.1:1/v1/completions")
    body = ApiError(status, "why", "prompt").body()
    got = client._make_status_error_from_response(http.Response(status, json=body, request=request))
    assert type(got).__name__ == raised and (got.type, got.code, got.param) == (kind, code, "prompt")
    named = ApiError(404, "no model", "model", "model_not_found").body()["error"]
    assert (named["type"], named["code"]) == ("invalid_request_error", "model_not_found")


def _parsed(kind: str, extra: dict):
    from trtforge.llm.server.protocol import ChatCompletionRequest, CompletionRequest, parse

    if kind == "completions":
        return parse(CompletionRequest, json.dumps({"model": "m", "prompt": "x", **extra}).encode())
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    return parse(ChatCompletionRequest, json.dumps(chat).encode())


@pytest.mark.parametrize(
    ("kind", "extra", "param", "meant"),
    [
        ("completions", {"max_token": 5}, "max_token", "max_tokens"),
        ("completions", {"temprature": 0.5}, "temprature", "temperature"),
        ("chat", {"maxTokens": 5}, "maxTokens", "max_tokens"),
        ("chat", {"top-p": 0.5}, "top-p", "top_p"),
        ("chat", {"max_completion_token": 5}, "max_completion_token", "max_completion_tokens"),
        (
            "completions",
            {"stream": True, "stream_options": {"include_usgae": True}},
            "stream_options.include_usgae",
            "stream_options.include_usage",
        ),
        (
            "chat",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "shema": {"type": "integer"}},
                }
            },
            "response_format.json_schema.shema",
            "response_format.json_schema.schema",
        ),
    ],
)
def test_a_misspelled_field_is_a_400_naming_the_field_meant(kind, extra, param, meant):
    """Unknown fields were ignored silently: max_token (for max_tokens) generated to the default length,
    temprature sampled at 1, a json_schema's "shema" let any JSON through. A misspelling of a field this
    server reads is now a 400 naming both (OpenAI refuses any unknown field)."""
    from trtforge.llm.server.protocol import ApiError, check_fields

    with pytest.raises(ApiError) as e:
        check_fields(_parsed(kind, extra))
    assert e.value.status == 400 and e.value.param == param, e.value.message
    assert e.value.message.startswith(f"{param}: ") and f"did you mean {meant}?" in e.value.message


def test_many_unknown_fields_are_refused_before_they_are_matched():
    """Each unknown field is matched against the fields read (difflib): 300,000 of them in a 6 MB body
    held the event loop 65 s. Past MAX_UNKNOWN_FIELDS the request is a 400 at once; a name longer than
    any field's is not matched at all."""
    import time

    from trtforge.llm.server.protocol import MAX_UNKNOWN_FIELDS, ApiError, check_fields

    many = _parsed("completions", {f"max_tok{i}": 1 for i in range(100_000)})
    start = time.perf_counter()
    with pytest.raises(
        ApiError, match=f"100,000 fields this server does not read; at most {MAX_UNKNOWN_FIELDS}"
    ):
        check_fields(many)
    assert time.perf_counter() - start < 0.5
    assert (
        len(check_fields(_parsed("completions", {f"max_tok{i}": 1 for i in range(MAX_UNKNOWN_FIELDS)}))) == 64
    )
    (long,) = check_fields(_parsed("chat", {"max_tokens" * 100_000: 1}))  # (ignored, its name cut short)
    assert long.startswith("'max_tokensmax_tokens") and long.endswith("(1,000,000 characters)"), long


def test_every_field_the_openai_client_sends_is_read_or_ignored_never_refused():
    """A field of OpenAI's API (or vLLM's) that this server does not read is ignored, never taken for a
    misspelling: min_tokens is one letter from max_tokens. No field the installed openai client's create()
    calls can send is taken for a misspelling (a client that adds one near a read field's name fails this
    test until OTHER_FIELDS lists it; one far from every name is ignored, so a newer client alone does not
    fail it), and a request of all the listed ones passes."""
    pytest.importorskip("openai")
    from openai.types import completion_create_params as completion
    from openai.types.chat import ChatCompletionStreamOptionsParam
    from openai.types.chat import completion_create_params as chat
    from openai.types.shared_params.response_format_json_schema import JSONSchema

    from trtforge.llm.server import protocol as p

    for model, params, where in [
        (p.CompletionRequest, completion.CompletionCreateParamsBase, ""),
        (p.ChatCompletionRequest, chat.CompletionCreateParamsBase, ""),
        (p.StreamOptions, ChatCompletionStreamOptionsParam, "stream_options"),
        (p.JsonSchema, JSONSchema, "response_format.json_schema"),
    ]:
        read = {f.alias or n for n, f in model.model_fields.items()}
        unlisted = set(params.__annotations__) - read - p.OTHER_FIELDS[where]
        # (a field a newer client adds is ignored and logged; one taken for a misspelling would be a 400)
        refused = {name: p._misspelled(name, sorted(read)) for name in unlisted}
        assert not {k: v for k, v in refused.items() if v}, f"{where or 'top level'}: {refused}"
    assert p.UNSERVED.keys() | p.UNSERVED_CHAT.keys() <= p.OTHER_FIELDS[""]
    for kind, model in [("completions", p.CompletionRequest), ("chat", p.ChatCompletionRequest)]:
        read = {f.alias or n for n, f in model.model_fields.items()}
        others = dict.fromkeys(p.OTHER_FIELDS[""] - read, "v")
        ignored = p.check_fields(
            _parsed(kind, {**others, "stream": True, "stream_options": {"include_obfuscation": 1}})
        )
        assert "reasoning_effort" in ignored and "stream_options.include_obfuscation" in ignored, ignored
        assert not {"user", "store", "min_tokens"} & set(ignored), ignored


def test_an_ignored_field_is_logged_once_per_name(caplog):
    """A field this server does not read is served without, logged once per name (a label such as user
    is not): whoever runs the server sees what its clients send that it ignores."""
    from fastapi.testclient import TestClient

    _, app = _app_over_no_model()
    body = {"model": "m", "prompt": [5], "max_tokens": 1, "frobnicate": 1, "user": "u", "verbosity": "low"}
    with TestClient(app) as client, caplog.at_level(logging.WARNING, logger="trtforge.serve"):
        for _ in range(3):
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 400 and "tokenizer" in r.json()["error"]["message"], r.text  # (no model)
    said = [r.getMessage() for r in caplog.records if "is not one this server reads" in r.getMessage()]
    assert len(said) == 2 and "'frobnicate'" in said[0] and "'verbosity'" in said[1], said


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("messages", "param", "meant"),
    [
        ([{"role": "user", "contnet": "hi"}], "messages.0.contnet", "messages.0.content"),
        (
            [{"role": "user", "content": "a"}, {"role": "tool", "toolCallId": "c1", "content": "{}"}],
            "messages.1.toolCallId",
            "messages.1.tool_call_id",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "txt": "hi"}]}],
            "messages.0.content.0.txt",
            "messages.0.content.0.text",
        ),
        (
            [{"role": "assistant", "content": [{"type": "refusal", "refusl": "no"}]}],
            "messages.0.content.0.refusl",
            "messages.0.content.0.refusal",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "fucntion": {}}]}],
            "messages.0.tool_calls.0.fucntion",
            "messages.0.tool_calls.0.function",
        ),
        (
            [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "argumnets": "{}"}}]}],
            "messages.0.tool_calls.0.function.argumnets",
            "messages.0.tool_calls.0.function.arguments",
        ),
    ],
)
def test_a_misspelled_field_inside_a_message_is_a_400_naming_where_it_is(messages, param, meant):
    """Inside messages, their content parts and tool calls, unknown fields were ignored silently: a
    message's "contnet" sent an empty turn, a tool call's "argumnets" none. As at the top level, a
    misspelling of a field read there is a 400 naming it, where it is, and the field meant."""
    from trtforge.llm.server.protocol import ApiError, check_fields

    with pytest.raises(ApiError) as e:
        check_fields(_parsed("chat", {"messages": messages}))
    assert e.value.status == 400 and e.value.param == param, e.value.message
    assert e.value.message.startswith(f"{param}: ") and f"did you mean {meant}?" in e.value.message


def test_openais_message_fields_not_read_are_accepted_and_logged_once_per_name():
    """A message's, content part's or tool call's field of OpenAI's schema that the server does not read
    (an assistant turn's refusal, audio, function_call; annotations a client echoes back from a response;
    a part's prompt_cache_breakpoint) is no misspelling: accepted, and named once for the log however many
    messages hold it. No field the openai client's message, part or tool call types hold is refused."""
    pytest.importorskip("openai")
    from openai.types.chat import (
        ChatCompletionAssistantMessageParam,
        ChatCompletionContentPartImageParam,
        ChatCompletionContentPartInputAudioParam,
        ChatCompletionContentPartRefusalParam,
        ChatCompletionContentPartTextParam,
        ChatCompletionDeveloperMessageParam,
        ChatCompletionFunctionMessageParam,
        ChatCompletionMessageCustomToolCallParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionSystemMessageParam,
        ChatCompletionToolMessageParam,
        ChatCompletionUserMessageParam,
    )
    from openai.types.chat.chat_completion_content_part_param import File
    from openai.types.chat.chat_completion_message_custom_tool_call_param import Custom
    from openai.types.chat.chat_completion_message_function_tool_call_param import Function

    from trtforge.llm.server import protocol as p

    messages = (ChatCompletionAssistantMessageParam, ChatCompletionDeveloperMessageParam)
    messages += (ChatCompletionFunctionMessageParam, ChatCompletionSystemMessageParam)
    messages += (ChatCompletionToolMessageParam, ChatCompletionUserMessageParam)
    parts = {
        "text": ChatCompletionContentPartTextParam,
        "refusal": ChatCompletionContentPartRefusalParam,
        "image_url": ChatCompletionContentPartImageParam,
        "input_audio": ChatCompletionContentPartInputAudioParam,
        "file": File,
    }
    calls = (ChatCompletionMessageFunctionToolCallParam, ChatCompletionMessageCustomToolCallParam)
    for where, types, read in [
        ("messages.*", messages, set(p._model_fields(p.ChatMessage.model_construct()))),
        ("messages.*.tool_calls.*", calls, p.TOOL_CALL_FIELDS[""]),
        ("messages.*.tool_calls.*.function", (Function,), p.TOOL_CALL_FIELDS["function"]),
        ("messages.*.tool_calls.*.custom", (Custom,), p.TOOL_CALL_FIELDS["custom"]),
        *[("messages.*.content.*", (t,), p.PART_FIELDS[kind]) for kind, t in parts.items()],
    ]:
        sent = set().union(*(t.__annotations__ for t in types))
        unlisted = sent - set(read) - p.OTHER_FIELDS[where]
        refused = {name: p._misspelled(name, sorted(read)) for name in unlisted}
        assert not {k: v for k, v in refused.items() if v}, f"{where}: {refused}"

    echoed = {"role": "assistant", "content": "x", "refusal": None, "audio": {"id": "a"}, "annotations": []}
    turn = {"role": "user", "content": [{"type": "text", "text": "hi", "prompt_cache_breakpoint": {}}]}
    old = {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}, "tool_calls": [CALL]}
    ignored = check_fields_of([turn, old, *[echoed, turn] * 100])  # (300 fields of OpenAI's: no bound)
    assert sorted(ignored) == [
        "messages.*.annotations",
        "messages.*.audio",
        "messages.*.content.*.prompt_cache_breakpoint",
        "messages.*.function_call",
        "messages.*.refusal",
    ], ignored


def check_fields_of(messages: list) -> list[str]:
    from trtforge.llm.server.protocol import check_fields

    return check_fields(_parsed("chat", {"messages": messages}))


def test_unknown_fields_inside_messages_count_toward_the_bound():
    """Each unknown field is matched against the fields read: those of messages, parts and tool calls count
    toward MAX_UNKNOWN_FIELDS with the request's own, so thousands of messages of unknown fields cannot
    hold the event loop; one far from every name read is accepted and logged once."""
    from trtforge.llm.server.protocol import MAX_UNKNOWN_FIELDS, ApiError

    part = {"type": "text", "text": "a", "frobnicate": 1}
    many = [{"role": "user", "content": [part], "frobnicate": 1}] * (MAX_UNKNOWN_FIELDS // 2 + 1)
    with pytest.raises(ApiError, match=f"{MAX_UNKNOWN_FIELDS + 2} fields this server does not read"):
        check_fields_of(many)
    ignored = check_fields_of(many[: MAX_UNKNOWN_FIELDS // 2])
    assert ignored == ["messages.*.frobnicate", "messages.*.content.*.frobnicate"], ignored


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file", "video_url"])
def test_a_content_part_of_other_media_is_a_400_and_a_refusal_part_is_text(kind):
    """A text-only model cannot read an image, audio or file part: a 400 naming the part and saying so
    (answered without it, the request would be another question). A refusal part (an assistant turn's
    words, a type OpenAI's assistant messages take) was a 400: it is the turn's text, as vLLM reads it."""
    from trtforge.llm.server.protocol import ApiError, ChatMessage

    refusal = ChatMessage(
        role="assistant", content=[{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}]
    )
    assert refusal.text("messages.0.content") == "ab"
    m = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": kind, kind: {}}])
    with pytest.raises(ApiError) as e:
        m.text("messages.3.content")
    assert e.value.param == "messages.3.content.1", e.value.message
    said = e.value.message
    assert said.startswith(f"messages.3.content.1: a content part of type '{kind}'") and "only text" in said
    assert ("reads text only" in said) == (kind != "video_url"), said


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"]
)
def test_a_body_not_sent_as_json_is_a_415_before_it_is_read(content_type):
    """A JSON body sent as text/plain or a form (curl's -d alone) was parsed and served: a page on any
    origin could have a visitor's browser drive generation without a CORS preflight. As vLLM does, only
    application/json is read; the refusal names the header to send, in OpenAI's schema."""
    from fastapi.testclient import TestClient

    state, app = _app_over_no_model()
    body = json.dumps({"model": "m", "prompt": [5], "max_tokens": 1})
    with TestClient(app) as client:
        headers = {} if content_type is None else {"Content-Type": content_type}
        r = client.post("/v1/completions", content=body, headers=headers)
        assert r.status_code == 415, r.text
        err = r.json()["error"]
        assert "Content-Type: application/json" in err["message"] and err["type"] == "invalid_request_error"
        assert state.metrics.intake._value.get() == 0 and state.requests == 0
        for sent in ("application/json", "Application/JSON; charset=utf-8"):  # read: (no tokenizer) 400
            ok = client.post("/v1/completions", content=body, headers={"Content-Type": sent})
            assert ok.status_code == 400 and "tokenizer" in ok.json()["error"]["message"], ok.text


def test_a_compressed_body_is_a_415_saying_so():
    """A gzip body (Content-Encoding: gzip, which the server does not undo) was a 400 calling its bytes
    invalid JSON ("can't decode byte 0x8b"); identity, the default, is read."""
    import gzip

    from fastapi.testclient import TestClient

    _, app = _app_over_no_model()
    body = json.dumps({"model": "m", "prompt": [5], "max_tokens": 1}).encode()
    with TestClient(app) as client:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        r = client.post("/v1/completions", content=gzip.compress(body), headers=headers)
        assert r.status_code == 415 and "uncompressed" in r.json()["error"]["message"], r.text
        headers["Content-Encoding"] = "identity"  # read: (no tokenizer) 400
        r = client.post("/v1/completions", content=body, headers=headers)
        assert r.status_code == 400 and "tokenizer" in r.json()["error"]["message"], r.text


def test_allowed_origins_are_granted_cors_and_no_other_origin_is():
    """--allowed-origins: a browser page of that origin may call the server (its preflight before a JSON
    POST with an API key and the SDK's own headers is granted, answers carry Access-Control-Allow-Origin);
    another origin's preflight is refused, and without the option no origin is granted (OPTIONS is 405)."""
    from fastapi.testclient import TestClient

    page, other = "http://localhost:3000", "https://evil.example"
    asks = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
    }
    _, app = _app_over_no_model(allowed_origins=("http://LocalHost:3000",))
    with TestClient(app) as client:
        pre = client.options("/v1/chat/completions", headers={"Origin": page, **asks})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == page, pre.headers
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "x-stainless-os" in pre.headers["access-control-allow-headers"].lower()
        assert (
            client.get("/v1/models", headers={"Origin": page}).headers["access-control-allow-origin"] == page
        )
        refused = client.options("/v1/chat/completions", headers={"Origin": other, **asks})
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        assert (
            "access-control-allow-origin" not in client.get("/v1/models", headers={"Origin": other}).headers
        )
    _, app = _app_over_no_model()
    with TestClient(app) as client:
        pre = client.options("/v1/chat/completions", headers={"Origin": page, **asks})
        assert pre.status_code == 405 and "access-control-allow-origin" not in pre.headers


def test_completion_top_logprobs_keep_the_likeliest_of_tokens_of_one_text():
    """Two token ids that decode to the same text (byte tokens of a partial UTF-8 character both decode
    to U+FFFD) share one key of the completions API's text-keyed dict: the likeliest one's logprob is
    kept (before: the least likely overwrote it); chat's list keeps both, told apart by their bytes."""
    from types import SimpleNamespace

    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    from trtforge.llm.server.responses import _chat_logprobs, _completion_logprobs

    texts = {1: "a", 2: "\ufffd", 3: "\ufffd", 4: "b"}

    class Tok:
        def decode(self, ids, **_):
            return "".join(texts[i] for i in ids)

    top = [(3, -2.5), (1, -0.5), (2, -1.0), (4, -3.0)]  # (the engine's order is not the likeliest first)
    entry = SimpleNamespace(token_id=1, logprob=-0.5, top=top)
    choice = SimpleNamespace(logprobs=lambda: [entry])
    state = SimpleNamespace(tokenizer=Tok())
    (tops,) = _completion_logprobs(state, choice, 4)["top_logprobs"]
    assert tops == {"a": -0.5, "\ufffd": -1.0, "b": -3.0}
    assert list(tops) == ["a", "\ufffd", "b"]  # likeliest first
    assert _completion_logprobs(state, choice, 2)["top_logprobs"] == [{"a": -0.5, "\ufffd": -1.0}]
    (content,) = _chat_logprobs(state, choice, 4)["content"]
    assert [(t["token"], t["logprob"]) for t in content["top_logprobs"]] == [
        ("a", -0.5),
        ("\ufffd", -1.0),
        ("\ufffd", -2.5),
        ("b", -3.0),
    ]


@pytest.mark.parametrize("chat", [False, True], ids=["prompt", "messages"])
def test_a_tokenizer_past_the_models_vocabulary_is_a_400_naming_the_field(chat):
    """A server started with another model's tokenizer (4,096 ids over a 300-id model): a text prompt or
    a chat tokenizes to ids the model has no embedding for. The 400 named an internal request id
    ("request 'req-0': token id 1646 is outside ...") and, for a chat, the field "prompt"."""
    import threading
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from trtforge.llm.server.app import _chat_prompt, _prompt_ids
    from trtforge.llm.server.protocol import ApiError, ChatCompletionRequest, parse

    tok = AutoTokenizer.from_pretrained(need_model())
    state = SimpleNamespace(
        tokenizer=tok,
        tokenizer_lock=threading.Lock(),
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
        max_model_len=256,
        input_vocab_size=300,
        vocab_size=300,
        draining=False,
    )
    text = "def read_json(path):\n    return json.load(open(path))"
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    req = parse(ChatCompletionRequest, json.dumps(body).encode())
    with pytest.raises(ApiError) as e:
        _chat_prompt(state, req) if chat else _prompt_ids(state, [text])
    field = "messages" if chat else "prompt"
    assert e.value.status == 400 and e.value.param == field, e.value.message
    assert e.value.message.startswith(f"{field}: the server's tokenizer gave token id "), e.value.message
    assert "outside the vocabulary [0, 300)" in e.value.message and "--tokenizer" in e.value.message


def test_served_names_are_listed_once_and_aliases_apply_to_the_default_name_only(built_state):
    """`--served-model-name a --served-model-name a` listed 'a' twice in /v1/models; MODEL as typed is
    a name requests may use only where the name is MODEL's own (not one --served-model-name chose)."""
    from trtforge.llm.server.run import ServeOptions

    for names, expected, aliases in [(("a", "a", "b"), ["a", "b"], ()), ((), ["m"], ("./m/",))]:
        state = built_state(None, "m", ServeOptions(served_model_names=names), ("./m/", "m"))
        assert state.served_model_names == expected and state.model_aliases == aliases


def _bounded_head_answers(
    reads: list[bytes], head_timeout: float = 20.0, answer_after: float = 0.0, parser: str | None = None
) -> list[bytes]:
    """The status lines the server's HTTP protocol (run._http_protocol, its --head-timeout `head_timeout`,
    over `parser`: by default uvicorn's choice) writes for `reads`, fed to it one by one as reads of one
    connection, in process over an app that answers 200 `answer_after` seconds after a request's body
    arrived; then the connection is watched until it closes or every answer is out and no timer is left to
    close it."""
    import asyncio
    import re
    from unittest import mock

    uvicorn = pytest.importorskip("uvicorn")
    from uvicorn.server import ServerState

    from trtforge.llm.server.run import _http_protocol

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await asyncio.sleep(answer_after)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> list[bytes]:
        cls = _http_protocol(head_timeout, parser)
        config = uvicorn.Config(app, http=cls, lifespan="off")
        config.load()
        proto = cls(config=config, server_state=ServerState(), app_state={})
        written: list[bytes] = []
        addresses = {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}
        closed: list[bool] = []  # a closed transport delivers no more reads
        transport = mock.Mock(write=written.append, is_closing=lambda: bool(closed))
        transport.close.side_effect = lambda: closed.append(True)
        transport.get_extra_info.side_effect = lambda name, default=None: addresses.get(name, default)
        proto.connection_made(transport)
        for data in reads:
            if closed:
                break
            proto.data_received(data)
            await asyncio.sleep(0.01)
        while not closed and (
            getattr(proto, "head_timer", None) is not None  # (None: a protocol that times no head)
            or (proto.cycle and not proto.cycle.response_complete)
        ):
            await asyncio.sleep(0.01)
        return re.findall(rb"HTTP/1\.1 (\d{3}) ", b"".join(written))

    return asyncio.run(run())


def test_a_head_growing_past_the_bound_over_reads_is_a_431():
    from trtforge.llm.server.run import MAX_HEAD_BYTES

    piece = b"a" * (MAX_HEAD_BYTES // 4)
    assert _bounded_head_answers([b"GET / HTTP/1.1\r\nX: ", *[piece] * 6, b"\r\n\r\n"]) == [b"431"]
    assert _bounded_head_answers([b"GET / HTTP/1.1\r\nX: ", piece, piece, b"\r\n\r\n"]) == [b"200"]


def test_a_pipelined_request_after_a_large_body_is_not_taken_for_a_large_head():
    """The read a head begins in may end the previous request's body (pipelining): counting it took 200 KB
    of body for the next request's head, a 431. Only the reads a head goes on through count."""
    body = b"x" * 200_000
    first = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    reads = [first + body[:100], body[100:] + b"GET / HTTP/1.1\r\nHost: x\r\n", b"\r\n"]
    assert _bounded_head_answers(reads) == [b"200", b"200"]


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_head_pipelined_behind_a_running_response_is_timed_after_it(parser):
    """--head-timeout closes a connection whose next request's head stops coming; where that head was
    pipelined behind a response still running (longer than the timeout), the response is not cut: the
    head is timed again after it, then refused with a 408. Under uvicorn's h11 parser too."""
    first = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    two = [first + b"GET / HTTP/1.1\r\nHo"]
    assert _bounded_head_answers(two, 0.1, answer_after=0.5, parser=parser) == [b"200", b"408"]
    assert _bounded_head_answers([b"GET / HTTP/1.1\r\nHo"], 0.1, parser=parser) == [b"408"]
    assert _bounded_head_answers([first, b"GET / HT"], 0.1, parser=parser) == [b"200", b"408"]


def test_without_httptools_the_head_timeout_still_closes_slow_heads(monkeypatch):
    """Where httptools is not installed uvicorn parses with h11, and --head-timeout did nothing there
    (BoundedHead is httptools' protocol; the server ran h11's own, which times no head): a client that
    connected and sent nothing, or trickled its head, held its connection for ever. The h11 protocol
    times heads alike: nothing sent is a close, part of a head a 408 in OpenAI's schema, a whole one
    is answered."""
    import importlib.util

    from trtforge.llm.server.run import _http_protocol

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "httptools" else find_spec(n, *a)
    )
    assert _http_protocol(0.1).parser == "h11"
    assert _bounded_head_answers([], 0.1) == []
    assert _bounded_head_answers([b"POST / HTTP/1.1\r\nHo"], 0.1) == [b"408"]
    assert _bounded_head_answers([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"], 0.1, answer_after=0.3) == [b"200"]


def _uvicorn_refusal() -> str:
    """The message of run.check_uvicorn's refusal of the installed uvicorn (as the test broke it)."""
    uvicorn = pytest.importorskip("uvicorn")
    from trtforge.errors import UserError
    from trtforge.llm.server.run import check_uvicorn

    with pytest.raises(UserError) as e:
        check_uvicorn(uvicorn)
    message = str(e.value)
    assert f"the installed uvicorn {uvicorn.__version__} lacks" in message, message
    assert f"pip install 'uvicorn<{uvicorn.__version__}'" in message, message
    return message


def test_the_installed_uvicorn_has_the_internals_the_server_relies_on():
    from trtforge.llm.server.run import check_uvicorn

    check_uvicorn(pytest.importorskip("uvicorn"))


def test_a_uvicorn_whose_send_is_not_its_request_cycles_is_refused(monkeypatch):
    """uvicorn's send wrapped in a function (as its own message logger wraps it at the trace log level):
    the app found no transport to abort, and a stream cut on a client that reads nothing kept its socket
    open, without a word. The startup check refuses it, naming what is missing."""
    pytest.importorskip("uvicorn")
    import logging

    monkeypatch.setattr(logging.getLogger("uvicorn.error"), "level", 5)  # uvicorn's TRACE
    assert "__self__.transport.abort()" in _uvicorn_refusal()


def test_a_uvicorn_whose_parser_callbacks_changed_is_refused(monkeypatch):
    """BoundedHead counts a head's reads from HttpToolsProtocol's on_message_begin: under a uvicorn
    without it, the head bound is gone (here every request fails in the parser). Refused at startup."""
    pytest.importorskip("httptools")
    from uvicorn.protocols.http import httptools_impl

    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "on_message_begin")
    message = _uvicorn_refusal()
    assert "on_message_begin" in message and "a head past the bound was not refused" in message, message


def test_a_uvicorn_without_the_status_lines_or_server_hooks_is_refused(monkeypatch):
    pytest.importorskip("httptools")
    import uvicorn
    from uvicorn.protocols.http import httptools_impl

    monkeypatch.delattr(httptools_impl, "STATUS_LINE")
    monkeypatch.delattr(uvicorn.Server, "on_tick")
    message = _uvicorn_refusal()
    assert "uvicorn.Server.on_tick" in message and "'STATUS_LINE'" in message, message


def test_serve_refuses_a_uvicorn_without_the_internals_before_the_model_loads(monkeypatch, capsys):
    """The CLI's check runs before MODEL is even looked at: exit 2, the one message, no trace."""
    uvicorn = pytest.importorskip("uvicorn")
    from trtforge.cli.main import main

    monkeypatch.delattr(uvicorn.Server, "handle_exit")
    assert main(["serve", "/no/such/model-dir"]) == 2
    err = capsys.readouterr().err
    assert f"uvicorn {uvicorn.__version__} lacks: uvicorn.Server.handle_exit" in err, err
    assert "Traceback" not in err and "/no/such/model-dir" not in err, err
