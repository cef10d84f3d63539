"""`trtforge serve` gives the chat template a message's fields beyond role and content, as OpenAI's
clients send them: ``name``, an assistant turn's ``tool_calls`` (their arguments as the object they spell)
and a tool answer's ``tool_call_id`` (they were dropped, so a template that renders them rendered another
conversation). A server of its own, with a template that renders them."""

from __future__ import annotations

import copy
import json

import pytest

from tests.llm.server.harness import Server, need_model

NAME = "code-llama-21m"
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}{% if m.name %} ({{ m.name }}){% endif %}: {{ m['content'] }}"
    "{% for c in m.tool_calls or [] %} call {{ c.function.name }}({{ c.function.arguments.path }})"
    "{% endfor %}"
    "{% if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = need_model()
    tmp = tmp_path_factory.mktemp("messages")
    (tmp / "chat.jinja").write_text(TEMPLATE)
    s = Server(str(model), ["--chat-template", str(tmp / "chat.jinja"), "--num-blocks", "64"], tmp / "log")
    yield s
    assert s.stop() == 0, s.log()
    assert "Traceback" not in s.log(), s.log()


def test_name_tool_calls_and_tool_call_id_reach_the_chat_template(server):
    import openai
    from transformers import AutoTokenizer

    messages = [
        {"role": "user", "content": "read the config", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_json", "arguments": json.dumps({"path": "config.json"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "{}"},
    ]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=1, temperature=0)

    rendered = copy.deepcopy(messages)
    rendered[1]["content"] = ""
    rendered[1]["tool_calls"][0]["function"]["arguments"] = {"path": "config.json"}
    tok = AutoTokenizer.from_pretrained(str(need_model()))
    text = tok.apply_chat_template(rendered, chat_template=TEMPLATE, tokenize=False)
    text += "# assistant:"
    assert "(alice)" in text and "call read_json(config.json)" in text and "[call_1]" in text, text
    assert r.usage.prompt_tokens == len(tok(text, add_special_tokens=False)["input_ids"])


def test_arguments_that_are_not_a_json_object_are_given_as_sent(server):
    import httpx

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    body = {"model": NAME, "messages": [{"role": "assistant", "tool_calls": [call]}], "max_tokens": 1}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    body["messages"][0]["name"] = 5
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.name", r.text
