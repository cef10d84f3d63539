"""A tokenizer whose ``chat_template`` is a dict of named templates (transformers allows
``{"default": ..., "tool_use": ...}``): chats use its "default" one, as transformers picks it, or the one
``--chat-template NAME`` (or ``ServeOptions.chat_template``) names; without a default, chats get a 400
saying what is missing and how to fix it, the server says so once at startup, and completions serve.

The trained 21M model with its tokenizer copied into a temporary directory and its tokenizer_config.json
rewritten; tests skip when ../shared/models is absent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.llm.server.harness import MODEL, Server, need_model

NAME = "code-llama-21m"
TEMPLATES = {
    "default": "{% for m in messages %}D {{ m['content'] }}{% endfor %}",
    "tool_use": "{% for m in messages %}tool use template, a longer one: {{ m['content'] }}{% endfor %}",
    "rag": "{% for m in messages %}retrieval {{ m['content'] }} augmented generation{% endfor %}",
}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "def f(x):"}], "max_tokens": 2}


def named_tokenizer(directory: Path, templates: dict[str, str]) -> Path:
    """The trained model's tokenizer in `directory`, its chat_template the dict `templates`."""
    need_model()
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODEL / name, directory / name)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = templates
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _prompt_tokens(tok_dir: Path, template: str) -> int:
    """The tokens of CHAT's messages rendered by `template` (what the server's usage counts)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    text = tok.apply_chat_template(CHAT["messages"], chat_template=template, tokenize=False)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _serve(tmp: Path, templates: dict[str, str], *args: str) -> tuple[Server, Path]:
    tok = named_tokenizer(tmp / "tok", templates)
    # (a pool of 64 blocks holds 1,024 tokens: the length named, or the server warns of its cut context)
    argv = ["--tokenizer", str(tok), "--num-blocks", "64", "--max-model-len", "1024", "--max-num-seqs", "2"]
    argv += args
    return Server(str(MODEL), argv, tmp / "server.log"), tok


def _post(server: Server, path: str, body: dict):
    import httpx

    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize(("args", "picked"), [((), "default"), (("--chat-template", "tool_use"), "tool_use")])
def test_a_named_template_is_picked_by_default_or_by_name(tmp_path, args, picked):
    """Before: a dict-valued chat_template made every chat a 400 (transformers' "multiple chat templates
    with no default" error, passed on as the client's fault)."""
    server, tok = _serve(tmp_path, TEMPLATES, *args)
    try:
        r = _post(server, "/v1/chat/completions", CHAT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == _prompt_tokens(tok, TEMPLATES[picked]), r.json()
        counts = {_prompt_tokens(tok, t) for t in TEMPLATES.values()}
        assert len(counts) == len(TEMPLATES)  # (the templates are told apart by their prompt's length)
    finally:
        assert server.stop() == 0, server.log()
    assert "warning:" not in server.log() and "Traceback" not in server.log(), server.log()


def test_without_a_default_chats_get_a_400_saying_how_to_fix_it_and_completions_serve(tmp_path):
    named = {k: v for k, v in TEMPLATES.items() if k != "default"}
    server, _ = _serve(tmp_path, named)
    try:
        r = _post(server, "/v1/chat/completions", CHAT)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages", err
        assert "named chat templates (rag, tool_use) but none named 'default'" in err["message"], err
        assert "--chat-template NAME" in err["message"], err
        assert _post(server, "/v1/chat/completions", CHAT).status_code == 400
        done = _post(server, "/v1/completions", {"model": NAME, "prompt": "def f(x):", "max_tokens": 2})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 2, done.text
    finally:
        assert server.stop() == 0, server.log()
    log = server.log()
    assert log.count("warning: this model's tokenizer has named chat templates (rag, tool_use)") == 1, log
    assert "Traceback" not in log, log


def test_the_python_api_takes_a_templates_name(tmp_path, built_state):
    """``ServeOptions(chat_template=NAME)`` picks that named template, as transformers'
    ``apply_chat_template(chat_template=NAME)`` does; None picks "default"."""
    from transformers import AutoTokenizer

    from trtforge.llm.server.run import ServeOptions

    tok = AutoTokenizer.from_pretrained(named_tokenizer(tmp_path / "tok", TEMPLATES))
    for chosen, picked in [("rag", "rag"), (None, "default")]:
        assert built_state(tok, NAME, ServeOptions(chat_template=chosen)).chat_template == TEMPLATES[picked]
