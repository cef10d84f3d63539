"""The text layer: incremental detokenization across multi-byte characters, stop strings split
across tokens, chat templates, the tokenizer from the model directory."""

from __future__ import annotations

import pytest

from tests.llm.server.harness import MODEL
from trtforge.errors import UserError
from trtforge.llm.text import (
    IncrementalDetokenizer,
    NoChatTemplateError,
    StopMatcher,
    TextStream,
    apply_chat_template,
    check_text,
    model_tokenizer,
    resolve_chat_template,
)

TEXT = "def f():\n    return 'héllo wörld 日本語 🙂 ok'  # ✓ ünïcödé"


@pytest.fixture(scope="module")
def tok():
    if not MODEL.is_dir():
        pytest.skip(f"the trained model is absent: {MODEL}")
    return model_tokenizer(str(MODEL), None)


def test_pieces_are_final_and_join_to_the_text(tok):
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) < len(TEXT.encode()), "byte-level BPE merges bytes"
    assert any("\ufffd" in tok.decode([i]) for i in ids), "some token must split a character"
    d = IncrementalDetokenizer(tok, [0])
    pieces = [d.push([i]) for i in ids] + [d.finish()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT


def test_a_stop_string_split_across_tokens_stops_and_is_never_emitted(tok):
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    stop = "wörld 日"
    s = TextStream(tok, [0], [stop, "zzz"])
    pieces = [s.push([i]) for i in ids] + [s.finish()]
    assert "".join(pieces) == TEXT[: TEXT.index(stop)] and s.stopped == stop
    assert not any(stop in p for p in pieces)


def test_stop_matcher_holds_back_a_possible_prefix_only():
    m = StopMatcher(["END"])
    assert m.push("abc E") == "abc " and m.push("N") == "" and m.push("x") == "ENx"
    assert m.push("yyE") == "yy" and m.push("ND tail") == "" and m.stopped == "END"
    m = StopMatcher(["ab"])
    assert m.push("xa") == "x" and m.finish() == "a"


def test_chat_template_is_required_and_applied(tok):
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(NoChatTemplateError, match="--chat-template"):
        apply_chat_template(tok, msgs, None)
    ids = apply_chat_template(tok, msgs, "{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
    assert tok.decode(ids) == "<hi>"


@pytest.mark.parametrize(
    ("named", "chosen", "rendered"),
    [
        ({"default": "D{{ messages[0]['content'] }}", "rag": "R{{ messages[0]['content'] }}"}, None, "Dhi"),
        ({"default": "D{{ messages[0]['content'] }}", "rag": "R{{ messages[0]['content'] }}"}, "rag", "Rhi"),
        ({"tool_use": "T{{ messages[0]['content'] }}", "rag": "R{{ messages[0]['content'] }}"}, "rag", "Rhi"),
        ({"rag": "R"}, "<{{ messages[0]['content'] }}>", "<hi>"),  # not a name: a template's text
    ],
)
def test_a_named_chat_template_is_picked_as_transformers_picks_it(tok, monkeypatch, named, chosen, rendered):
    monkeypatch.setattr(tok, "chat_template", named)
    template = resolve_chat_template(tok, chosen)
    assert tok.decode(apply_chat_template(tok, [{"role": "user", "content": "hi"}], template)) == rendered


def test_named_chat_templates_without_a_default_are_a_clear_error(tok, monkeypatch):
    """Before: transformers' "multiple chat templates with no default" ValueError, passed on as "the chat
    template failed on these messages" (the client's fault)."""
    monkeypatch.setattr(tok, "chat_template", {"tool_use": "T", "rag": "R"})
    assert resolve_chat_template(tok, None) is None
    with pytest.raises(NoChatTemplateError) as e:
        apply_chat_template(tok, [{"role": "user", "content": "hi"}], None)
    assert "named chat templates (rag, tool_use) but none named 'default'" in str(e.value)
    assert "--chat-template NAME" in str(e.value) and "--chat-template FILE" in str(e.value)


def test_undecodable_text_is_a_user_error():
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(UserError, match=r"--prompt is not valid UTF-8.*xe9"):
        check_text(bad, "--prompt")


def test_a_chat_templates_own_error_is_passed_on_bounded(tok):
    """A template may raise with what a client sent (``raise_exception(messages[0]['content'])``): the 400
    names the failure and keeps its start, not the whole text."""
    huge = "x" * 100_000
    template = "{{ raise_exception(messages[0]['content']) }}"
    with pytest.raises(UserError, match="chat template failed on these messages") as e:
        apply_chat_template(tok, [{"role": "user", "content": huge}], template)
    assert len(str(e.value)) < 500 and "(100,0" in str(e.value)


def test_a_missing_model_path_is_said_before_its_tokenizer(tmp_path):
    """`generate MISSING --prompt ...` and `serve MISSING` said "holds no tokenizer" of a path that does not
    exist; a factory reference (no path) still gets None (ids only), an existing directory without one too."""
    from trtforge.errors import UserError
    from trtforge.llm.text import model_tokenizer

    with pytest.raises(UserError, match=r"MODEL '.*nope' does not exist; expected a save_pretrained"):
        model_tokenizer(str(tmp_path / "nope"), None)
    assert model_tokenizer("pkg.module:factory", None) is None
    assert model_tokenizer(str(tmp_path), None) is None
