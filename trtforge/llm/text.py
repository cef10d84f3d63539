"""Text around the token engine: the model's tokenizer, incremental detokenization, stop strings, chat.

The engine speaks token ids; people and the OpenAI API speak text. A stream of ids becomes text that
is *final* as it is emitted: a byte-level BPE token may end inside a multi-byte UTF-8 character, and
its bytes are held back until the character is whole (:class:`IncrementalDetokenizer`). Stop strings
are matched on that text, so one split across tokens still stops; the text that might start a stop
string is held back until it cannot, and a stop string itself is never emitted (:class:`StopMatcher`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtforge.errors import UserError, clipped, shown

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# tokens of the prompt's end decoded with the first output tokens, so that a tokenizer which drops a
# leading space at the start of a decode (SentencePiece) keeps it inside a sequence (vLLM uses 5 too)
_CONTEXT_TOKENS = 5


def has_tokenizer(directory: str | os.PathLike[str]) -> bool:
    """Whether `directory` holds a Hugging Face tokenizer (what save_pretrained writes beside a model)."""
    p = Path(directory)
    return p.is_dir() and any((p / f).is_file() for f in TOKENIZER_FILES)


def load_tokenizer(name: str | os.PathLike[str]) -> Any:
    """A Hugging Face tokenizer from a local directory (offline: nothing is downloaded)."""
    p = Path(name)
    if not has_tokenizer(p):
        raise UserError(
            f"'{name}' holds no tokenizer ({', '.join(TOKENIZER_FILES)}); name a tokenizer directory "
            "(--tokenizer DIR), or give token ids."
        )
    from transformers import AutoTokenizer

    try:
        # (never the directory's own tokenizer code: transformers would ask on stdin whether to run it)
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # the user's tokenizer files: corrupt json, unknown class, missing vocab
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise UserError(
            f"cannot load the tokenizer in '{p}' ({type(e).__name__}: {first}); expected the files a "
            "tokenizer's save_pretrained writes."
        ) from e


def model_tokenizer(model: str, tokenizer: str | None) -> Any | None:
    """The tokenizer named, else the model directory's own, else None (a model given as ids only). A
    `model` path that does not exist is said as such here, before any "holds no tokenizer" about it."""
    if tokenizer is not None:
        return load_tokenizer(tokenizer)
    if ":" not in str(model) and not os.path.exists(model):  # (not 'package.module:factory' either)
        raise UserError(
            f"MODEL '{model}' does not exist; expected a save_pretrained directory, a step graph "
            "(.onnx) or engine, or a 'package.module:factory' reference."
        )
    if has_tokenizer(model):
        return load_tokenizer(model)
    return None


def check_text(text: str, what: str) -> str:
    """`text` if it is valid Unicode that encodes as UTF-8; else a UserError naming `what`.

    Command-line arguments with undecodable bytes arrive as lone surrogates (Python's surrogateescape).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text.encode("utf-8", "surrogateescape")[e.start : e.end]
        raise UserError(
            f"{what} is not valid UTF-8 text (bytes {bad!r} at character {e.start}); give UTF-8 text, or "
            "token ids."
        ) from None
    return text


def encode_prompt(tok: Any, text: str, what: str = "the prompt") -> list[int]:
    """Token ids of a text prompt, the tokenizer's special tokens (BOS) included."""
    check_text(text, what)
    if not text.strip():  # special tokens alone (BOS, [CLS] [SEP]) are no prompt
        raise UserError(f"{what} {shown(text)} is empty; give the text to continue.")
    ids = [int(t) for t in tok(text, add_special_tokens=True)["input_ids"]]
    if not ids:
        raise UserError(f"{what} {shown(text)} tokenizes to no tokens.")
    return ids


def read_chat_template(path: str | os.PathLike[str]) -> str:
    """The Jinja chat template in file `path` (--chat-template FILE)."""
    if str(path) == "":  # (Path('') is the current directory)
        raise UserError(
            "--chat-template is empty (''); expected a Jinja template file or the name of one of the "
            "tokenizer's named chat templates."
        )
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--chat-template '{p}': cannot read it as UTF-8 text ({e}).") from None
    if not text.strip():
        raise UserError(f"--chat-template '{p}' is empty; expected a Jinja chat template.")
    _check_template_syntax(text, f"--chat-template '{p}'")
    return text


# where a tokenizer directory keeps its chat template, in the order transformers reads them
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def check_chat_template(tok: Any, source: str) -> None:
    """UserError when the chat template that tokenizer `tok` ships (the one a chat is rendered with when
    no --chat-template replaces it) is not valid Jinja, naming `source` (the tokenizer's directory as
    the user gave it), the file it came from and the line.

    A server would otherwise start, answer /health and /v1/completions, and refuse every chat with a 400
    that blamed the client for the server's template; a template that cannot compile formats no chat
    at all, so it is refused before the model loads, with the way out (--chat-template FILE). A
    tokenizer with no template (a base model) is no error: chat requests say so, completions serve."""
    try:
        template = tok.get_chat_template()  # as apply_chat_template picks it: a named set's "default"
    except (AttributeError, ValueError, TypeError):  # no template, or several and none the default
        return
    if not isinstance(template, str):
        return
    directory = Path(getattr(tok, "name_or_path", "") or ".")
    file = next((f for f in _TEMPLATE_FILES if (directory / f).is_file()), None)
    where = f"the chat template of {source}" + (f" ({file})" if file else "")
    _check_template_syntax(
        template,
        where,
        "; /v1/chat/completions could format no chat with it. Give --chat-template FILE (a Jinja "
        "template of your own, e.g. this one corrected) to serve chat with that instead",
    )


def _check_template_syntax(text: str, where: str, remedy: str = "") -> None:
    """UserError naming `where` (``--chat-template 'FILE'``, or a tokenizer's own template) and the line of
    a Jinja syntax error in `text`, then `remedy`: found only when a chat was rendered, it was a 400 to
    every chat request, blaming the client for the server's template. Compiled as transformers compiles
    chat templates (its sandbox, loop controls and ``{% generation %}`` tag); a transformers without that
    function leaves the check to the first chat."""
    from jinja2 import TemplateSyntaxError
    from transformers.utils import chat_template_utils

    compile_template = getattr(chat_template_utils, "_compile_jinja_template", None)
    if compile_template is None:
        return
    try:
        compile_template(text)
    except TemplateSyntaxError as e:
        why = (e.message or "a syntax error").rstrip(".")
        raise UserError(f"{where}: not a valid Jinja template, line {e.lineno}: {why}{remedy}.") from None


class NoChatTemplateError(UserError):
    """A chat request reached a tokenizer with no chat template and none was given."""


def named_chat_templates(tok: Any) -> dict[str, str]:
    """The tokenizer's named chat templates: transformers lets ``chat_template`` be a dict {name: Jinja
    template} (``{"default": ..., "tool_use": ...}``); {} for a single template or none."""
    own = getattr(tok, "chat_template", None)
    return {str(k): v for k, v in own.items()} if isinstance(own, dict) else {}


def resolve_chat_template(tok: Any, chosen: str | None) -> str | None:
    """The Jinja template a chat is rendered with, picked as transformers' ``get_chat_template`` picks it:
    `chosen` when given (the name of one of the tokenizer's named templates, else a template's text);
    without one, the tokenizer's own: its single template, or of named ones the one called "default".
    None when there is none to use (:func:`missing_chat_template` says why)."""
    named = named_chat_templates(tok)
    if chosen is not None:
        return named.get(chosen, chosen)
    if named:
        return named.get("default")
    own = getattr(tok, "chat_template", None)
    return own if isinstance(own, str) and own else None


def chat_template_by_name(tok: Any, name: str, what: str = "--chat-template") -> str:
    """The tokenizer's chat template named `name` (``--chat-template NAME``), its Jinja checked; UserError
    naming `what` and listing the names the tokenizer has when it has none of that name."""
    named = named_chat_templates(tok)
    if name not in named:
        raise UserError(f"{what} {shown(name)}: {_no_such_template(tok)}.")
    _check_template_syntax(named[name], f"{what} {shown(name)} (the tokenizer's template of that name)")
    return named[name]


def _no_such_template(tok: Any) -> str:
    """Why a name picks no template of `tok`, and what to give instead."""
    names = sorted(named_chat_templates(tok))
    if not names:
        return (
            "the tokenizer has no named chat templates; give a Jinja template file (--chat-template FILE) "
            "or leave it out to use the tokenizer's own"
        )
    return (
        f"the tokenizer has no chat template of that name; its named templates are {', '.join(names)} "
        "(give one of them, or a Jinja template file)"
    )


def missing_chat_template(tok: Any) -> str:
    """Why chats cannot be formatted with `tok` alone and how to fix it (for the 400 of every chat and
    for the warning ``trtforge serve`` gives at startup)."""
    names = sorted(named_chat_templates(tok))
    if names:
        return (
            f"this model's tokenizer has named chat templates ({', '.join(names)}) but none named 'default', "
            "so /v1/chat/completions cannot pick one; start the server with --chat-template NAME (one of "
            "those) or --chat-template FILE (a Jinja template), or use /v1/completions."
        )
    return (
        "this model's tokenizer has no chat template, so /v1/chat/completions cannot format messages; "
        "start the server with --chat-template FILE (a Jinja template), or use /v1/completions."
    )


def apply_chat_template(
    tok: Any, messages: list[dict[str, Any]], template: str | None, add_generation_prompt: bool = True
) -> list[int]:
    """The prompt ids of a chat: the messages rendered by `template` (else the tokenizer's own, as
    :func:`resolve_chat_template` picks it)."""
    if template is None:
        template = resolve_chat_template(tok, None)
    if template is None:
        raise NoChatTemplateError(missing_chat_template(tok))
    try:
        text = tok.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as e:  # the template is the user's Jinja: a syntax error, an undefined variable
        why = clipped(f"{type(e).__name__}: {e}")
        raise UserError(f"the chat template failed on these messages ({why}).") from e
    # the template writes the special tokens it wants (BOS included): none added here
    return [int(t) for t in tok(text, add_special_tokens=False)["input_ids"]]


class IncrementalDetokenizer:
    """Turns a growing list of output ids into text pieces, each final when emitted.

    Each push decodes a short window (from the last emitted piece's start) twice, without and with the
    new ids; the difference is new text, unless it ends in U+FFFD, the mark of a character whose bytes
    are not all there yet, in which case it waits for more ids. :meth:`finish` emits what is left.
    """

    def __init__(self, tok: Any, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True) -> None:
        self.tok = tok
        self.skip = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)

    def push(self, new_ids: Sequence[int]) -> str:
        """The text that `new_ids` complete (may be empty)."""
        self.ids.extend(int(t) for t in new_ids)
        return self._advance(final=False)

    def finish(self) -> str:
        """Whatever text is held back (an incomplete character comes out as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self.read_offset >= len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if (full.endswith("\ufffd") and not final) or len(full) <= len(prefix):
            return ""  # an incomplete character, or ids that decode to nothing (skipped special tokens)
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]


class StopMatcher:
    """Cuts a text stream at the first stop string, which is never emitted.

    Text that could be the start of a stop string is held back until the next piece shows whether it
    is one; :meth:`finish` releases it when the stream ends without a stop.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped: str | None = None

    def push(self, text: str) -> str:
        """The part of `text` (after what was held) that is final; sets :attr:`stopped` on a stop."""
        if self.stopped is not None:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            at, stop = min(hits)
            self.stopped, self.held = stop, ""
            return buf[:at]
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def finish(self) -> str:
        out, self.held = ("" if self.stopped is not None else self.held), ""
        return out


class TextStream:
    """One request's output as text: detokenized incrementally, cut at its stop strings."""

    def __init__(self, tok: Any, prompt_ids: Sequence[int], stops: Sequence[str] = ()) -> None:
        self.detok = IncrementalDetokenizer(tok, prompt_ids)
        self.matcher = StopMatcher(stops)
        self.text = ""

    @property
    def stopped(self) -> str | None:
        """The stop string that ended the text, or None."""
        return self.matcher.stopped

    def push(self, new_ids: Sequence[int]) -> str:
        piece = self.matcher.push(self.detok.push(new_ids))
        self.text += piece
        return piece

    def finish(self) -> str:
        piece = "" if self.stopped is not None else self.matcher.push(self.detok.finish())
        piece += self.matcher.finish()
        self.text += piece
        return piece


def check_draft_directories(target: Any, draft: Any) -> None:
    """A speculative draft's tokenizer against the target's
    (:func:`~trtforge.llm.spec.tokenizers.check_draft_tokenizer`), both given as directories that hold
    one (read offline); nothing to compare otherwise (an nn.Module, module:factory, or a directory
    without tokenizer files: the vocabulary sizes are still compared once loaded)."""
    paths = [x for x in (target, draft) if isinstance(x, (str, os.PathLike))]
    if len(paths) != 2 or not all(has_tokenizer(p) for p in paths):
        return
    if _same_tokenizer_files(target, draft):  # (a family's models often carry byte-identical files)
        return
    from trtforge.llm.spec.tokenizers import check_draft_tokenizer

    check_draft_tokenizer(load_tokenizer(target), _draft_tokenizer(draft), str(target), str(draft))


def check_draft_against(target: Any, target_name: str, draft: Any) -> None:
    """A draft directory's tokenizer against a target's given as an object (``generate --tokenizer DIR``
    for a target without its own, such as module:factory): see :func:`check_draft_directories`."""
    from trtforge.llm.spec.tokenizers import check_draft_tokenizer

    if isinstance(draft, (str, os.PathLike)) and has_tokenizer(draft):
        check_draft_tokenizer(target, _draft_tokenizer(draft), target_name, str(draft))


def _draft_tokenizer(draft: Any) -> Any:
    """The draft directory's tokenizer, its refusal naming the option (the loader's "cannot load the
    tokenizer in '...'" read as MODEL's own; a command words it as --speculative-model)."""
    from trtforge.llm.spec.config import DRAFT_REFUSAL

    try:
        return load_tokenizer(draft)
    except UserError as exc:
        raise UserError(f"{DRAFT_REFUSAL}{exc}") from exc


def _same_tokenizer_files(a: Any, b: Any) -> bool:
    """Whether two directories hold the same tokenizer files, byte for byte."""
    for name in TOKENIZER_FILES:
        fa, fb = Path(a) / name, Path(b) / name
        if fa.is_file() != fb.is_file() or (fa.is_file() and fa.read_bytes() != fb.read_bytes()):
            return False
    return True
