"""`trtforge serve` end to end, through the official openai client, against a real server process.

One server for the module: the trained 21M code model, an API key, a chat template of our own.
Tests marked "wip/sampling" need SamplingParams options (logprobs, penalties, structured output)
that land with the sampling branch; until then the server answers them 400 and those tests fail.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.llm.server.harness import API_KEY, chat_server, wait_for

PROMPT = "def read_json(path):"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with chat_server(tmp_path_factory.mktemp("serve"), ["--api-key", API_KEY, "--num-blocks", "1024"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def greedy(client, prompt=PROMPT, max_tokens=24, **kw):
    return client.completions.create(
        model="code-llama-21m", prompt=prompt, max_tokens=max_tokens, temperature=0, **kw
    )


def test_models_and_health(server, client):
    import httpx
    import openai

    assert [m.id for m in client.models.list().data] == ["code-llama-21m"]
    card = client.models.retrieve("code-llama-21m")
    assert card.id == "code-llama-21m" and card.owned_by == "trtforge" and card.max_model_len == 2048
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4o")
    assert httpx.get(server.url + "/v1/models/code-llama-21m").status_code == 401  # no key
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_completion_is_code_and_counts_tokens(client):
    r = greedy(client)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.text.strip()
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24
    assert greedy(client).choices[0].text == choice.text, "greedy output must be deterministic"


def test_stream_with_usage_equals_the_whole_text(client):
    whole = greedy(client, max_tokens=32).choices[0].text
    chunks = list(
        client.completions.create(
            model="code-llama-21m",
            prompt=PROMPT,
            max_tokens=32,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 32
    assert chunks[-2].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole
    assert len(chunks) > 5, "the text must arrive in pieces"


def test_a_developer_message_is_a_system_message_to_a_template_that_never_names_the_role(client):
    """OpenAI's developer role is its system role renamed, which its clients send for system prompts; the
    test template (like most models') knows no developer role, so it is given the message as system's."""

    def chat(role):
        messages = [{"role": role, "content": "Answer in Python."}, {"role": "user", "content": "hi"}]
        r = client.chat.completions.create(
            model="code-llama-21m", messages=messages, max_tokens=8, temperature=0
        )
        return r.usage.prompt_tokens, r.choices[0].message.content

    assert chat("developer") == chat("system")


def test_continuous_usage_stats_puts_each_choices_usage_so_far_in_every_chunk(client):
    """vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries its choice's
    usage so far, the last of each choice its whole; it was ignored, every chunk's usage null."""
    chunks = list(
        client.completions.create(
            model="code-llama-21m",
            prompt=PROMPT,
            max_tokens=8,
            temperature=0,
            n=2,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    for i in (0, 1):
        mine = [c for c in chunks[:-1] if c.choices[0].index == i]
        counts = [c.usage.completion_tokens for c in mine]
        assert counts == sorted(counts) and counts[0] > 0 and counts[-1] == 8, counts
        assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in mine)
        assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in mine)


def test_chat_with_a_template_and_streaming(client):
    messages = [{"role": "user", "content": "write a function"}]
    r = client.chat.completions.create(
        model="code-llama-21m", messages=messages, max_tokens=16, temperature=0
    )
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.completion_tokens == 16
    stream = client.chat.completions.create(
        model="code-llama-21m", messages=messages, max_tokens=16, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content


def test_n_choices_and_seed_reproducibility(client):
    kw = {"model": "code-llama-21m", "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": 7}
    a, b = client.completions.create(n=2, **kw), client.completions.create(n=2, **kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices], "a seed must reproduce the output"
    assert a.choices[0].text != a.choices[1].text, "the n choices must be distinct draws"
    assert a.usage.completion_tokens == 32
    other = client.completions.create(**{**kw, "seed": 8, "n": 1})
    assert other.choices[0].text != a.choices[0].text


def test_stop_strings_cut_the_text_and_are_never_emitted(client):
    whole = greedy(client, max_tokens=32).choices[0].text
    stop = whole[10:14]  # a few characters inside the text: usually split across tokens
    cut = whole[: whole.index(stop)]
    r = greedy(client, max_tokens=32, stop=[stop, "\x00never"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = list(
        client.completions.create(
            model="code-llama-21m", prompt=PROMPT, max_tokens=32, temperature=0, stop=stop, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed) == cut
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_logprobs(client):  # wip/sampling: SamplingParams.logprobs
    r = greedy(client, max_tokens=8, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 8 and len(lp.top_logprobs[0]) == 3
    assert all(x <= 0 for x in lp.token_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(
        model="code-llama-21m", messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    assert len(chat.choices[0].logprobs.content) == 4


def test_logprobs_of_a_request_cut_by_a_stop_string_are_its_tokens_up_to_the_stop(client):
    """Before: a stop string with logprobs was a 500 ("the engine returned none"): the stop cancelled the
    request and its logprobs were never read. Now they are those of the tokens counted in usage, the
    last one completing the stop, for the completions and the chat endpoint alike."""
    whole = greedy(client, max_tokens=32, logprobs=1)
    tokens = whole.choices[0].logprobs.tokens
    stop = "".join(tokens)[10:14]
    r = greedy(client, max_tokens=32, stop=stop, logprobs=2)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert r.choices[0].finish_reason == "stop" and text == "".join(tokens)[: "".join(tokens).index(stop)]
    assert len(lp.tokens) == r.usage.completion_tokens == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.tokens == tokens[: len(lp.tokens)] and stop in "".join(lp.tokens)
    assert stop not in "".join(lp.tokens[:-1])  # the last token completes the stop
    messages = [{"role": "user", "content": "hi"}]
    kw = {"model": "code-llama-21m", "messages": messages, "max_tokens": 8, "temperature": 0}
    said = client.chat.completions.create(**kw).choices[0].message.content
    chat = client.chat.completions.create(**kw, stop=said[2:4], logprobs=True, top_logprobs=1)
    assert chat.choices[0].finish_reason == "stop"
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens


@pytest.mark.parametrize("stop", [None, "JSON", "\n"])
def test_streamed_logprobs_are_the_whole_completions(client, stop):
    """Before: logprobs with stream=true was a 400 ("not served with stream=true yet"). Each chunk now
    carries the logprobs of the tokens that led to its text (text offsets continuing), and together they
    are the non-streamed answer's, up to a stop string too."""
    kw = {"max_tokens": 20, "logprobs": 2, **({"stop": stop} if stop else {})}
    whole = greedy(client, **kw)
    chunks = list(
        client.completions.create(
            model="code-llama-21m",
            prompt=PROMPT,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
    )
    got: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        for c in chunk.choices:
            if c.logprobs is None:  # (a chunk of no tokens: the finish after the last piece)
                assert c.text == "" and c.finish_reason is not None, c
                continue
            for key in got:
                got[key] += getattr(c.logprobs, key)
    want = whole.choices[0].logprobs
    assert got == {key: getattr(want, key) for key in got}
    assert len(got["tokens"]) == chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    messages = [{"role": "user", "content": "hi"}]
    chat = {"model": "code-llama-21m", "messages": messages, "max_tokens": 6, "temperature": 0}
    chat |= {"logprobs": True, "top_logprobs": 2, **({"stop": stop} if stop else {})}
    said = client.chat.completions.create(**chat).choices[0].logprobs.content
    streamed = [
        e
        for chunk in client.chat.completions.create(**chat, stream=True)
        for c in chunk.choices
        if c.logprobs is not None
        for e in c.logprobs.content or []
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in said]


def test_chat_logprobs_bytes_are_the_tokens_own_for_part_of_a_character(client):
    """Byte-level BPE spells é as two tokens (bytes C3 A9), each decoding to U+FFFD alone: their ``bytes``
    must be the token's own ([0xC3]), not U+FFFD's, so that joining them gives the text back (OpenAI's
    promise for the field). Token 129 is byte C3, forced by logit_bias; streamed and whole alike."""
    kw = {
        "model": "code-llama-21m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "logit_bias": {"129": 100},
    }
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [
        e
        for c in client.chat.completions.create(**kw, stream=True)
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    for content in (whole, streamed):
        assert len(content) == 3
        assert [e.bytes for e in content] == [[0xC3]] * 3, content
        assert content[0].top_logprobs[0].bytes == [0xC3]


def test_completion_text_offsets_count_characters_not_the_tokens_of_one(client):
    """Tokens 129 and 104 are é's two bytes (C3 A9), forced by logit_bias: "ééé" is 6 tokens, each
    decoding to U+FFFD alone. Each token's text_offset is the character it is part of ([0, 0, 1, 1, 2,
    2]); counting each token's own text put them at 0-5, past the end of the 3-character text. Streamed
    chunks continue them alike."""
    kw = {
        "model": "code-llama-21m",
        "prompt": "# caf",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 1,
        "logit_bias": {"129": 100, "104": 100},
    }
    choice = client.completions.create(**kw).choices[0]
    assert choice.text == "ééé", choice.text
    assert choice.logprobs.text_offset == [0, 0, 1, 1, 2, 2]
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == "ééé"
    assert [o for c in chunks if c.logprobs for o in c.logprobs.text_offset] == [0, 0, 1, 1, 2, 2]


def test_json_schema_output_validates(client):  # wip/sampling: structured outputs
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
        "required": ["name", "size"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="code-llama-21m",
        messages=[{"role": "user", "content": "a file as JSON"}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "file", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_penalties_change_a_repetitive_output(client):  # wip/sampling: penalties
    base = greedy(client, max_tokens=48).choices[0].text
    for kw in (
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 1.5}},
    ):
        assert greedy(client, max_tokens=48, **kw).choices[0].text != base, kw


def test_logit_bias_bans_and_forces_tokens_through_the_openai_client(client):
    """OpenAI's logit_bias (string token ids): -100 on every id that reads as the greedy first token
    makes it another, +100 on one id makes every token that one, on completions and chat; sampled
    choices never write "(" once every id that writes it is banned."""
    from transformers import AutoTokenizer

    from tests.llm.server.harness import MODEL

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    first = greedy(client, max_tokens=1).choices[0].text
    same = {str(i): -100 for i in range(len(tok)) if tok.decode([i]) == first}
    assert same, first
    assert greedy(client, max_tokens=1, logit_bias=same).choices[0].text != first
    forced_id = tok.encode("return", add_special_tokens=False)[0]
    forced = greedy(client, max_tokens=4, logit_bias={str(forced_id): 100}).choices[0].text
    assert forced == tok.decode([forced_id] * 4)
    chat = client.chat.completions.create(
        model="code-llama-21m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logit_bias={str(forced_id): 100},
    )
    assert chat.choices[0].message.content == tok.decode([forced_id] * 3)
    paren = {str(i): -100 for i in range(len(tok)) if "(" in tok.decode([i])}  # every id that writes "("
    kw = {"model": "code-llama-21m", "prompt": PROMPT, "max_tokens": 32, "temperature": 1.0, "n": 4}
    kw["seed"] = 4
    assert any("(" in c.text for c in client.completions.create(**kw).choices)
    assert not any("(" in c.text for c in client.completions.create(**kw, logit_bias=paren).choices)
    assert greedy(client, logit_bias={}).choices[0].text == greedy(client).choices[0].text


def test_64_concurrent_streams_complete_and_return_every_block(server):
    import openai

    async def one(c, i):
        stream = await c.completions.create(
            model="code-llama-21m",
            prompt=f"def f{i}(x):",
            max_tokens=12,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
            return await asyncio.gather(*(one(c, i) for i in range(64)))

    results = asyncio.run(main())
    assert all(finish == "length" and text for text, finish in results)
    m = server.wait_blocks_free()
    key = 'trtforge_requests_total{endpoint="completions",status="200"}'
    end = time.monotonic() + 20  # (a stream is counted once its response ends, just after its [DONE])
    while m.get(key, 0) < 64 and time.monotonic() < end:
        time.sleep(0.05)
        m = server.metrics()
    assert m.get(key, 0) >= 64


def test_cancel_midway_frees_the_requests_blocks(server):
    import httpx

    body = {
        "model": "code-llama-21m",
        "prompt": PROMPT,
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    key = 'trtforge_requests_total{endpoint="completions",status="%s"}'
    before = server.metrics()
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=headers, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(12):
            next(lines)
        held = server.metrics()
        assert held["trtforge_kv_cache_blocks_used"] > 0 and held["trtforge_num_requests_running"] == 1
    m = server.wait_blocks_free()  # the client left: the request is cancelled and its blocks return
    end = time.monotonic() + 20
    while m.get(key % "499", 0) == before.get(key % "499", 0) and time.monotonic() < end:
        m = server.metrics()
        time.sleep(0.05)
    # /metrics counts it as the client left it (before: 200, counted as the stream began)
    assert m.get(key % "499", 0) == before.get(key % "499", 0) + 1
    assert m.get(key % "200", 0) == before.get(key % "200", 0)


def test_streams_cut_midway_return_every_block_and_leave_the_others_output_unchanged(server, client):
    """24 streams of two choices each, cut at random points (some before their first token), while 8 others
    stream to the end at once: every KV block returns, each cut stream is counted 499 and each finished
    one 200, and the finished ones are the greedy output of the server at rest (a cancelled sequence's
    blocks, reused at once by others, corrupt no one's cache)."""
    import random

    import httpx

    prompts = [f"def f{i}(x):" for i in range(4)]
    alone = {p: greedy(client, p, 16, extra_body={"ignore_eos": True}).choices[0].text for p in prompts}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    rnd = random.Random(0)
    cuts = [rnd.randint(0, 30) for _ in range(24)]
    key = 'trtforge_requests_total{endpoint="completions",status="%s"}'
    before = server.metrics()

    async def one(c: httpx.AsyncClient, prompt: str, cut: int | None) -> str | None:
        body = {"model": "code-llama-21m", "prompt": prompt, "temperature": 0, "stream": True}
        body.update({"ignore_eos": True, "max_tokens": 16} if cut is None else {"max_tokens": 400, "n": 2})
        text, seen = "", 0
        async with c.stream("POST", server.url + "/v1/completions", json=body, headers=headers) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if cut is not None and seen == cut:
                    return None  # the client leaves
                seen += bool(line)
                if line.startswith("data: {"):
                    text += json.loads(line.removeprefix("data: "))["choices"][0]["text"]
        return text

    async def main() -> list[str | None]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as c:
            cut = [one(c, prompts[i % 4], n) for i, n in enumerate(cuts)]
            whole = [one(c, prompts[i % 4], None) for i in range(8)]
            return await asyncio.gather(*cut, *whole)

    texts = asyncio.run(main())
    assert texts[24:] == [alone[prompts[i % 4]] for i in range(8)]
    m = server.wait_blocks_free()
    assert m["trtforge_http_requests_in_flight"] == 0
    cut = before.get(key % "499", 0) + 24
    wait_for(lambda: server.metrics().get(key % "499", 0) >= cut)  # (counted once its response ends)
    m = server.metrics()
    assert m.get(key % "499", 0) == cut
    assert m.get(key % "200", 0) == before.get(key % "200", 0) + 8
    after = greedy(client, prompts[0], 16, extra_body={"ignore_eos": True})
    assert after.choices[0].text == alone[prompts[0]]


def test_a_client_that_leaves_a_non_streaming_request_cancels_it(server):
    """A non-streaming request whose client closes the connection mid-generation is cancelled in the
    engine: counted as 499 (not 200), its sequence leaves the batch and its KV blocks return in well
    under half the time the rest of its tokens would take at the rate measured just before. The client
    leaves once the metrics show the request running and making tokens; before, it left on a 1 s client
    timeout, inside which a fast machine could finish the request and a slow one not admit it (either
    way nothing was tested)."""
    import socket

    max_tokens = 1500
    ok, left = (f'trtforge_requests_total{{endpoint="completions",status="{s}"}}' for s in ("200", "499"))
    before = server.wait_blocks_free()
    body = json.dumps(
        {"model": "code-llama-21m", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
    ).encode()

    def made() -> float:
        """Tokens the request has made (AssertionError once it is not running: finished too soon)."""
        m = server.metrics()
        assert m["trtforge_num_requests_running"] == 1, f"the request is not running: {m}"
        return m["trtforge_generation_tokens_total"] - before["trtforge_generation_tokens_total"]

    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s" % (API_KEY.encode(), len(body), body)
        )
        wait_for(lambda: server.metrics()["trtforge_num_requests_running"] == 1, timeout=60)
        wait_for(lambda: made() >= 1)
        t1, n1 = time.monotonic(), made()
        wait_for(lambda: made() >= n1 + 16)
        t2, n2 = time.monotonic(), made()
    rest = (max_tokens - n2) * (t2 - t1) / (n2 - n1)  # seconds the request had left at its decode rate
    server.wait_blocks_free(timeout=rest / 2)
    wait_for(lambda: server.metrics().get(left, 0) == before.get(left, 0) + 1)
    m = server.metrics()
    assert m.get(ok, 0) == before.get(ok, 0), "the request finished instead of being cancelled"
    assert m["trtforge_generation_tokens_total"] - before["trtforge_generation_tokens_total"] < max_tokens


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (f"bearer {API_KEY}", 200),  # the scheme's name is case-insensitive (RFC 7235)
        (f"BEARER  {API_KEY}", 200),
        (f"Basic {API_KEY}", 401),
        (f"Bearer {API_KEY.upper()}x", 401),
        (API_KEY, 401),
        ("Bearer", 401),
    ],
)
def test_the_key_is_matched_and_the_scheme_in_any_case(server, header, status):
    import httpx

    got = httpx.get(server.url + "/v1/models", headers={"Authorization": header}, timeout=10)
    assert got.status_code == status


def test_bad_key_is_401(server):
    import openai

    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model="code-llama-21m", prompt="x", max_tokens=2)
    assert e.value.status_code == 401 and e.value.type == "invalid_request_error"
    assert e.value.code == "invalid_api_key", e.value.body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (json.dumps({"model": "code-llama-21m"}).encode(), "prompt"),
        (json.dumps({"model": "code-llama-21m", "prompt": "x", "max_tokens": -1}).encode(), "max_tokens"),
        (
            json.dumps({"model": "code-llama-21m", "prompt": "x", "temperature": "hot"}).encode(),
            "temperature",
        ),
        (json.dumps({"model": "code-llama-21m", "prompt": "x", "top_p": -0.1}).encode(), "top_p"),
        (json.dumps({"model": "code-llama-21m", "prompt": "x", "top_p": 1.1}).encode(), "top_p"),
        (json.dumps({"model": "code-llama-21m", "prompt": "x", "n": 0}).encode(), "n"),
        (json.dumps({"model": "code-llama-21m", "prompt": [[5, 99999]]}).encode(), "prompt"),
        (json.dumps({"model": "code-llama-21m", "prompt": [5, -1]}).encode(), "prompt"),
        (json.dumps({"model": "code-llama-21m", "prompt": "x " * 3000}).encode(), "prompt"),
        (json.dumps({"model": "code-llama-21m", "prompt": "x", "max_tokens": 5000}).encode(), "max_tokens"),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(server, body, field):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/completions", content=body, headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if field is not None:
        assert err["param"] == field and field in err["message"]


def test_a_prompt_past_the_context_is_openais_context_length_exceeded(client):
    """OpenAI's code for a prompt (plus max_tokens) past the context is "context_length_exceeded", which
    clients test for to shorten the conversation and retry; ours was the number 400. (max_tokens past the
    context alone has no such code: no shorter prompt fits it.)"""
    import openai

    calls = [
        lambda: client.completions.create(model="code-llama-21m", prompt="x " * 3000, max_tokens=1),
        lambda: client.completions.create(model="code-llama-21m", prompt=[5] * 1000, max_tokens=1500),
        lambda: client.chat.completions.create(
            model="code-llama-21m", messages=[{"role": "user", "content": "x " * 3000}]
        ),
    ]
    for call, param in zip(calls, ["prompt", "max_tokens", "messages"]):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.code == "context_length_exceeded" and e.value.param == param, e.value.body
        assert e.value.type == "invalid_request_error", e.value.body


def test_top_p_zero_is_served_as_the_likeliest_token(client):
    """OpenAI takes top_p in [0, 1]; 0 is the smallest nucleus, the likeliest token alone: at temperature 2
    with any seed, the greedy text (it was a 400, which clients written for OpenAI did not expect)."""
    want = greedy(client, max_tokens=12).choices[0].text
    for seed in (1, 2):
        r = client.completions.create(
            model="code-llama-21m", prompt=PROMPT, max_tokens=12, temperature=2, top_p=0, seed=seed
        )
        assert r.choices[0].text == want


def test_a_refused_prompt_in_a_list_names_its_index_and_none_of_the_list_runs(server, client):
    """The choices of one request are queued together, all or none: a bad second prompt is a 400 naming
    prompt[1], and the first (n=2 of it) never started (the server stays idle and serves the next)."""
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "code-llama-21m", "prompt": [[5, 6, 7], [5, 99999]], "max_tokens": 4, "n": 2}
    r = httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "prompt[1]" in message and "outside the vocabulary" in message, message
    assert r.json()["error"]["param"] == "prompt"
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    running = [line for line in metrics.splitlines() if line.startswith("trtforge_num_requests_running")]
    assert running and all(line.split()[-1] in ("0", "0.0") for line in running), running
    assert greedy(client, max_tokens=4).choices[0].text


def test_unknown_model_or_path_is_404_in_openais_schema(server):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(server.url + "/v1/completions", json={"model": "gpt-4", "prompt": "x"}, headers=headers)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(server.url + "/v1/nothing", json={}, headers=headers)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["code"] is None
    assert "POST /v1/nothing" in r.json()["error"]["message"], r.text
    err = httpx.get(server.url + "/v1/completions", headers=headers).json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] is None, err


def test_unknown_model_has_openais_model_not_found_code(client):
    import openai

    calls = [
        lambda: client.completions.create(model="gpt-4", prompt="x", max_tokens=1),
        lambda: client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}]),
        lambda: client.models.retrieve("gpt-4"),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.code == "model_not_found" and e.value.param == "model", e.value.body
        assert e.value.type == "invalid_request_error", e.value.body


def test_what_the_openai_client_sends_is_accepted(client):
    """Strict types refuse no value the openai client sends as its users write it: integers for number
    fields (temperature=1), explicit None (sent as null: the default), booleans, integer logprobs."""
    r = client.completions.create(
        model="code-llama-21m",
        prompt=[PROMPT, "import os"],
        max_tokens=3,
        temperature=1,
        top_p=1,
        presence_penalty=0,
        frequency_penalty=None,
        n=None,
        seed=3,
        stop=None,
        logprobs=1,
        echo=False,
        stream=False,
        user=None,
        extra_body={"top_k": 5, "ignore_eos": True, "stop_token_ids": None},
    )
    assert len(r.choices) == 2 and all(c.logprobs is not None for c in r.choices)
    chunks = list(
        client.chat.completions.create(
            model="code-llama-21m",
            messages=[{"role": "system", "content": None}, {"role": "user", "content": "hi"}],
            max_completion_tokens=3,
            temperature=None,
            n=1,
            stream=True,
            stream_options={"include_usage": True},
            response_format={"type": "text"},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_a_misspelled_field_through_the_openai_client_is_a_bad_request(client):
    """extra_body={"max_token": 5} was served as if max_tokens were unset (16 tokens); OpenAI's own
    fields the server does not read (user, store, reasoning_effort) are still served."""
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="code-llama-21m", prompt=PROMPT, extra_body={"max_token": 5})
    assert e.value.param == "max_token" and "did you mean max_tokens?" in e.value.message, e.value.body
    r = client.chat.completions.create(
        model="code-llama-21m",
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=2,
        user="u",
        store=False,
        reasoning_effort="low",
    )
    assert r.usage.completion_tokens <= 2


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_tokens", True, "an integer, got a boolean"),
        ("max_tokens", "2", "an integer, got a string"),
        ("n", 2.0, "an integer, got a number"),
        ("stream", "yes", "a boolean (true or false), got a string"),
        ("echo", 0, "a boolean (true or false), got a number"),
        ("temperature", False, "a number, got a boolean"),
        ("seed", "7", "an integer, got a string"),
        ("stop_token_ids", [True], "an integer, got a boolean"),
    ],
)
def test_a_value_of_the_wrong_json_type_is_400_naming_the_field(server, field, value, expected):
    """pydantic's lax mode took max_tokens true as 1, stream "yes" as true and n 2.0 as 2; OpenAI
    refuses a value of the wrong JSON type, and so does this server, naming the field and the type."""
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "code-llama-21m", "prompt": "x", "max_tokens": 2, field: value}
    r = httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].split(".")[0] == field and f"expected {expected}" in err["message"], err


def test_chat_fields_are_strictly_typed_too(server):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    chat = {"model": "code-llama-21m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for field, value in [("logprobs", 1), ("stream_options", {"include_usage": "yes"})]:
        r = httpx.post(server.url + "/v1/chat/completions", json={**chat, field: value}, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith(field), r.text
    r = httpx.post(server.url + "/v1/chat/completions", json={**chat, "temperature": None}, headers=headers)
    assert r.status_code == 200, r.text


def _extras(model, where: str = "") -> list[str]:
    """The fields of `model` (an openai type, validated) and of the models it holds that the type lacks."""
    from pydantic import BaseModel

    out = [f"{where}.{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, BaseModel):
                out += _extras(item, f"{where}.{name}[{i}]" if isinstance(value, list) else f"{where}.{name}")
    return out


def test_every_response_and_chunk_is_strictly_openais_type(server):
    """Each body, whole or streamed, of chat and completions (n=2, logprobs, a stop string, usage in
    stream_options) validates strictly against the openai package's types, with no field they lack; a
    streamed chunk that carries no tokens has ``logprobs: null``, as OpenAI sends it (its finish chunk
    carried an empty logprobs object: ``{"content": []}``). The one departure is the SDK's own: it types a
    streamed completion choice's finish_reason as never null, but OpenAI's API sends null (as here) on every
    chunk before a choice's last, and the SDK does not validate it."""
    from typing import Literal

    import httpx
    from openai.types import Completion, CompletionChoice
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    class StreamedChoice(CompletionChoice):
        finish_reason: Literal["stop", "length", "content_filter"] | None

    class StreamedCompletion(Completion):
        choices: list[StreamedChoice]

    headers = {"Authorization": f"Bearer {API_KEY}"}
    common = {"model": "code-llama-21m", "max_tokens": 12, "n": 2, "stop": ["\n\n"], "seed": 3}
    bodies = {
        "completions": ({**common, "prompt": PROMPT, "logprobs": 2}, Completion, StreamedCompletion),
        "chat/completions": (
            {
                **common,
                "messages": [{"role": "user", "content": PROMPT}],
                "logprobs": True,
                "top_logprobs": 2,
            },
            ChatCompletion,
            ChatCompletionChunk,
        ),
    }
    for path, (body, whole, chunk) in bodies.items():
        r = httpx.post(f"{server.url}/v1/{path}", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        assert _extras(whole.model_validate_json(r.text, strict=True)) == [], r.text
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{server.url}/v1/{path}", json=streamed, headers=headers, timeout=60) as s:
            lines = [line.removeprefix("data: ") for line in s.iter_lines() if line]
        assert lines[-1] == "[DONE]"
        finishes = 0
        for line in lines[:-1]:
            c = chunk.model_validate_json(line, strict=True)
            assert _extras(c) == [], line
            for choice in c.choices:
                finishes += choice.finish_reason is not None
                tokens = choice.logprobs and (
                    choice.logprobs.content if path == "chat/completions" else choice.logprobs.tokens
                )
                assert choice.logprobs is None or tokens, f"logprobs of no tokens, not null: {line}"
        assert finishes == 2 and c.choices == [] and c.usage.completion_tokens > 0, lines[-2]
