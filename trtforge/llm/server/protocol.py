"""The OpenAI request bodies the server accepts, and their mapping onto :class:`SamplingParams`.

Field names and ranges follow OpenAI's API, plus vLLM's extensions (top_k, min_p, repetition_penalty,
ignore_eos, stop_token_ids). Unknown fields are ignored (OpenAI's own that this server does not read, such as
``user``, and other servers' extensions), the server logging each name once, except one that misspells a
field this server reads (``max_token``, ``temprature``, ``maxTokens``, a message's ``contnet``): a 400 naming
both and where it is (:func:`check_fields`, in the request and its stream_options, response_format, messages,
their content parts and tool calls), since ignoring it would leave that field at its default unseen. Types are
strict, as OpenAI's are: an integer field takes no ``true``, ``"2"`` or ``2.0``, a boolean no ``"yes"`` or
``1`` (a number field does take an integer: ``temperature: 1``); NaN and infinities are refused. ``null``
for an optional field means its default, as OpenAI's nullable fields do. A bad field becomes
:class:`ApiError` 400 naming it; OpenAI's error schema is :func:`error_body`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
import sys
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtforge.errors import shown, shown_name
from trtforge.llm.sampling import (
    LOGIT_BIAS_LIMIT,
    MAX_LOGPROBS,
    MAX_TOKEN_ID_DIGITS,
    SEED_MAX,
    SEED_MIN,
    SamplingParams,
    child_seed,
    token_id_of,
)


class ApiError(Exception):
    """An HTTP error with OpenAI's error body (``{"error": {message, type, param, code}}``), shaped as
    OpenAI's: `type` its class of error for the status (:data:`TYPES`), `code` a string naming the
    condition or null (OpenAI's codes where it has one: ``model_not_found``, ``invalid_api_key``, ...).
    A numeric code (the status, as vLLM sends) is no OpenAI code: its clients read ``error.code`` as a
    string to test ("404"), and a stream's error event, sent after a 200, has no other status to tell."""

    # OpenAI's types: a client's error is an invalid_request_error (401 and 404 too), a 429 a
    # rate_limit_error, a 503 a service_unavailable_error, any other server error a server_error
    TYPES: ClassVar[dict[int, str]] = {429: "rate_limit_error", 503: "service_unavailable_error"}
    # the code of a status whose raiser names none (others: null)
    CODES: ClassVar[dict[int, str]] = {
        401: "invalid_api_key",
        429: "rate_limit_exceeded",
        504: "timeout",
    }

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body for HTTP `status` (:class:`ApiError`'s type and code for it)."""
    return {
        "error": {
            "message": message,
            "type": ApiError.TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code if code is not None else ApiError.CODES.get(status),
        }
    }


MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 256  # characters per stop string


class _Base(BaseModel):
    """Strict types (pydantic's lax mode took ``max_tokens: true`` as 1 and ``stream: "yes"`` as true)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """``null`` for a field with a default is that default (OpenAI's optional fields are nullable,
        and clients send ``"temperature": null`` for "unset"); a required field's null stays an error."""
        if isinstance(data, dict) and any(v is None for v in data.values()):
            optional = _optional_fields(cls)
            data = {k: v for k, v in data.items() if v is not None or k not in optional}
        return data


def _optional_fields(model: type[BaseModel]) -> frozenset[str]:
    """The names (as the JSON spells them) of `model`'s fields that have a default."""
    return frozenset(f.alias or name for name, f in model.model_fields.items() if not f.is_required())


class _Open(_Base):
    """A request object whose unknown fields are kept (as model_extra) for :func:`check_fields`."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class StreamOptions(_Open):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk carries its choice's usage so far
    continuous_usage_stats: bool = False


class JsonSchema(_Open):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


# vLLM's request extensions this server does not serve, each with its neutral values (those that leave the
# answer as it is served; null is neutral too) and what it would change. Unknown fields are ignored, but a
# client that sends one of these at another value asks for another answer (no end before min_tokens, the stop
# string kept, its own chat template...): answered without it, it would get something else with no sign of it
UNSERVED: dict[str, tuple[tuple[Any, ...], str]] = {
    "min_tokens": ((0,), "a minimum length (end-of-sequence and stops held back until it)"),
    "include_stop_str_in_output": ((False,), "stop strings kept in the output"),
    "skip_special_tokens": ((True,), "special tokens kept in the output text"),
    "spaces_between_special_tokens": ((True,), "special tokens joined without spaces"),
    "use_beam_search": ((False,), "beam search"),
    "prompt_logprobs": ((), "the prompt's logprobs"),
    "allowed_token_ids": ((), "a vocabulary restricted to some ids"),
    "bad_words": (([],), "banned words"),
    "truncate_prompt_tokens": ((), "a prompt truncated to its last tokens"),
    "guided_json": ((), "guided decoding (send response_format instead)"),
    "guided_regex": ((), "guided decoding by a regular expression"),
    "guided_choice": ((), "guided decoding among choices"),
    "guided_grammar": ((), "guided decoding by a grammar"),
    "structured_outputs": ((), "structured outputs (send response_format instead)"),
}
# the chat endpoint's own: its prompt is the chat template's, which these change
UNSERVED_CHAT: dict[str, tuple[tuple[Any, ...], str]] = {
    "chat_template": ((), "a chat template of the request's own (the server's is set by --chat-template)"),
    "chat_template_kwargs": (({},), "arguments to the chat template"),
    "continue_final_message": ((False,), "the last message continued rather than answered"),
    "echo": ((False,), "the last message echoed"),
    "documents": ((), "documents for the chat template"),
    "audio": ((), "audio output"),
    "modalities": ((["text"],), "outputs other than text"),
}


def _refuse_unserved_fields(req: BaseModel, table: dict[str, tuple[tuple[Any, ...], str]]) -> None:
    """ApiError 400 naming the first field of `table` that `req` sets to a value other than its neutral ones
    (a value is neutral when it equals one of them and has its JSON type: ``min_tokens: false`` is not 0)."""
    extra = req.model_extra or {}
    for name, (neutral, what) in table.items():
        value = extra.get(name)
        if value is None or any(type(value) is type(n) and value == n for n in neutral):
            continue
        raise ApiError(
            400,
            f"{name}: not served by this server ({what}); send the request without {name}",
            name,
        )


# The fields of other APIs that this server does not read, per object (its path; "" the request): OpenAI's
# (its chat and completions requests, as the openai client types them) and vLLM's extensions. Accepted and
# ignored (logged), never taken for a misspelling of a field this server reads (min_tokens is one letter
# from max_tokens). tests/llm/server check that every field the openai client can send is here or read.
OTHER_FIELDS: dict[str, frozenset[str]] = {
    "": frozenset(
        {
            # OpenAI's
            *("audio", "best_of", "echo", "function_call", "functions", "metadata", "modalities"),
            *("moderation", "parallel_tool_calls", "prediction", "prompt_cache_key", "prompt_cache_options"),
            *("prompt_cache_retention", "reasoning_effort", "safety_identifier", "service_tier", "store"),
            *("suffix", "tool_choice", "tools", "user", "verbosity", "web_search_options"),
            # vLLM's
            *("add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt", "chat_template"),
            *("chat_template_kwargs", "continue_final_message", "documents", "guided_choice"),
            *("guided_decoding_backend", "guided_grammar", "guided_json", "guided_regex"),
            *("guided_whitespace_pattern", "include_reasoning", "include_stop_str_in_output"),
            *("kv_transfer_params", "length_penalty", "logits_processors", "min_tokens"),
            *("mm_processor_kwargs", "priority", "prompt_embeds", "prompt_logprobs", "request_id"),
            *("return_token_ids", "return_tokens_as_token_ids", "skip_special_tokens"),
            *("spaces_between_special_tokens", "structural_tag", "structured_outputs"),
            *("truncate_prompt_tokens", "use_beam_search", "vllm_xargs"),
        }
    ),
    "stream_options": frozenset({"include_obfuscation"}),
    "response_format.json_schema": frozenset({"description"}),
    # a message: OpenAI's (an assistant turn's audio, refusal and deprecated function_call; annotations, which
    # clients echo back from a response's message), vLLM's (a reasoning model's reasoning, echoed back)
    "messages.*": frozenset(
        {"audio", "refusal", "function_call", "annotations", "reasoning", "reasoning_content"}
    ),
    "messages.*.content.*": frozenset({"prompt_cache_breakpoint"}),
    "messages.*.tool_calls.*": frozenset(),
    "messages.*.tool_calls.*.function": frozenset(),
    "messages.*.tool_calls.*.custom": frozenset(),
}
# a content part's fields by its type (OpenAI's types; those but text and refusal are refused by
# :meth:`ChatMessage.text`), and a tool call's (given to the chat template as sent): what check_fields
# matches an unknown field of theirs against (a part of another type: against every part field)
PART_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text"}),
    "refusal": frozenset({"type", "refusal"}),
    "image_url": frozenset({"type", "image_url"}),
    "input_audio": frozenset({"type", "input_audio"}),
    "file": frozenset({"type", "file"}),
}
_ANY_PART_FIELDS = frozenset().union(*PART_FIELDS.values())
MEDIA_PARTS = ("image_url", "input_audio", "file")  # OpenAI's content parts of other media than text
TOOL_CALL_FIELDS: dict[str, frozenset[str]] = {
    "": frozenset({"id", "type", "function", "custom"}),
    "function": frozenset({"name", "arguments"}),
    "custom": frozenset({"name", "input"}),
}
# the fields that only label a request (for billing, caching, tracing) and change nothing in its answer:
# ignored without a log line
LABEL_FIELDS = frozenset(
    {"user", "metadata", "store", "service_tier", "safety_identifier", "request_id", "priority", "cache_salt"}
    | {"prompt_cache_key", "prompt_cache_options", "prompt_cache_retention"}
)
# how alike (difflib's ratio) an unknown field's name and a read one's must be to call it a misspelling:
# max_token, temprature, top-p, stream_option, presense_penalty are; temp, length_penalty are not
MISSPELLING_RATIO = 0.8
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# unknown fields a request may hold: each is matched against the fields read (a fifth of a millisecond of the
# event loop), and 300,000 of them in a 6 MB body held every client for 65 s
MAX_UNKNOWN_FIELDS = 64
# a longer name misspells no field (at ratio 0.8 it is at most 1.5x the field's length: 21 at most here)
MAX_FIELD_NAME_CHARS = 64


def _misspelled(name: str, fields: list[str]) -> str | None:
    """The field of `fields` that unknown field `name` misspells, or None: the same once its case and
    dashes are undone (maxTokens, max-tokens), else the likeliest within :data:`MISSPELLING_RATIO`."""
    if len(name) > MAX_FIELD_NAME_CHARS:
        return None
    plain = _CAMEL.sub("_", name).lower().replace("-", "_")
    if plain in fields:
        return plain
    close = difflib.get_close_matches(plain, fields, n=1, cutoff=MISSPELLING_RATIO)
    return close[0] if close else None


# (its path in the request, its path as OTHER_FIELDS keys it (each array index a *), the fields read there,
# its fields that are not)
_Object = tuple[str, str, frozenset[str], dict[str, Any]]


def _unread(obj: dict[str, Any], read: frozenset[str]) -> dict[str, Any]:
    """The fields of raw JSON object `obj` (a content part, a tool call) that are not in `read`."""
    return {k: obj[k] for k in obj.keys() - read} if not obj.keys() <= read else {}


def _model_fields(model: BaseModel) -> frozenset[str]:
    """The names (as the JSON spells them) of `model`'s fields."""
    return _class_fields(type(model))


@functools.cache
def _class_fields(cls: type[BaseModel]) -> frozenset[str]:
    return frozenset(f.alias or n for n, f in cls.model_fields.items())


def _objects(req: BaseModel) -> Iterator[_Object]:
    """The objects of `req` holding fields this server does not read (:data:`_Object` each): the request
    and its stream_options and response_format (kept as model_extra), its messages, their content parts,
    their tool calls and those calls' function or custom objects (raw JSON, checked against
    :data:`PART_FIELDS` and :data:`TOOL_CALL_FIELDS`). Made one at a time: a conversation echoed back
    from responses may hold hundreds of thousands of messages of OpenAI's fields."""
    text_part = PART_FIELDS["text"]
    yield "", "", _model_fields(req), req.model_extra or {}
    for name in ("stream_options", "response_format"):
        obj = getattr(req, name, None)
        if obj is not None and obj.model_extra:
            yield name, name, _model_fields(obj), obj.model_extra
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.json_schema is not None and fmt.json_schema.model_extra:
        where = "response_format.json_schema"
        yield where, where, _model_fields(fmt.json_schema), fmt.json_schema.model_extra
    for i, m in enumerate(getattr(req, "messages", ())):
        if m.model_extra:
            yield f"messages.{i}", "messages.*", _model_fields(m), m.model_extra
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if part.keys() <= text_part:  # (most parts: a text part of its fields alone)
                    continue
                kind = part.get("type")
                read = PART_FIELDS.get(kind, _ANY_PART_FIELDS) if isinstance(kind, str) else _ANY_PART_FIELDS
                yield f"messages.{i}.content.{j}", "messages.*.content.*", read, _unread(part, read)
        for j, call in enumerate(m.tool_calls or ()):
            at = f"messages.{i}.tool_calls.{j}"
            yield at, "messages.*.tool_calls.*", TOOL_CALL_FIELDS[""], _unread(call, TOOL_CALL_FIELDS[""])
            for key in ("function", "custom"):
                inner = call.get(key)
                if isinstance(inner, dict):
                    read = TOOL_CALL_FIELDS[key]
                    yield f"{at}.{key}", f"messages.*.tool_calls.*.{key}", read, _unread(inner, read)


def check_fields(req: BaseModel) -> list[str]:
    """The paths of `req`'s fields that this server ignores (unknown ones, and other APIs' it does not
    read), but for :data:`LABEL_FIELDS`, each once (a message's as ``messages.*.refusal``); ApiError 400
    for one that misspells a field it reads (as OpenAI answers an unknown field), naming both and where it
    is (``messages.2.contnet``): ignored, it would leave the field meant at its default; 400 too past
    :data:`MAX_UNKNOWN_FIELDS` unknown fields, OTHER_FIELDS' not counted (no client sends so many), before
    any is matched."""
    unknown: list[tuple[str, frozenset[str], str]] = []  # (where, the fields read there, name) to match
    count = 0
    ignored: dict[tuple[str, str], None] = {}  # (generic path, name): each once, however many messages
    for where, generic, read, extra in _objects(req):
        other = OTHER_FIELDS.get(generic, frozenset())
        for name, value in extra.items():
            if name not in other:
                count += 1
                if count > MAX_UNKNOWN_FIELDS:
                    continue
                if value is not None:  # (null is "unset": no misspelling left a field at its default)
                    unknown.append((where, read, name))
            ignored[generic, name] = None
    if count > MAX_UNKNOWN_FIELDS:
        raise ApiError(
            400,
            f"the request holds {count:,} fields this server does not read; at most "
            f"{MAX_UNKNOWN_FIELDS} are ignored",
        )
    for where, read, name in unknown:
        meant = _misspelled(name, sorted(read))
        if meant is not None:
            path = f"{where}.{_printable(name)}" if where else _printable(name)
            said = f"{where}.{meant}" if where else meant
            raise ApiError(
                400,
                f"{path}: not a field of this API; did you mean {said}? (unknown fields are ignored, and "
                f"{said} would have been left at its default)",
                path,
            )
    labels = LABEL_FIELDS | UNSERVED.keys() | UNSERVED_CHAT.keys()
    return [
        f"{generic}.{_printable(name)}" if generic else _printable(name)
        for generic, name in ignored
        if not (generic == "" and name in labels)
    ]


class _Sampling(_Open):
    """The fields completions and chat share (unknown ones are kept, as model_extra, for
    :meth:`refuse_unserved` to look :data:`UNSERVED` up in and :func:`check_fields` to check)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)  # OpenAI's range: 0 keeps the likeliest token only
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)  # OpenAI's: any int64
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    ignore_eos: bool = False
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None  # token id (a decimal string) -> bias (:func:`logit_bias`)

    @functools.cached_property
    def logit_bias_map(self) -> dict[int, float] | None:
        """:func:`logit_bias` of this request, built on first use only: its checks and every choice's
        params read it, and a map may hold a vocabulary's worth of entries."""
        return logit_bias(self.logit_bias)

    def refuse_unserved(self) -> None:
        """400 naming a field that would change the answer but that this server cannot serve: ignoring it
        (as unknown fields are) would answer something else than what was asked, with no sign of it."""
        _refuse_unserved_fields(self, UNSERVED)

    def stops(self) -> list[str]:
        """The stop strings, bounded: each is matched against every text piece on the event loop, at a
        cost that grows with their number times their length (300,000 held every client for 12 s)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise ApiError(400, "stop: stop strings must be non-empty", "stop")
        if len(stops) > MAX_STOPS:
            raise ApiError(400, f"stop: at most {MAX_STOPS} stop strings, got {len(stops)}", "stop")
        longest = max(stops, key=len, default="")
        if len(longest) > MAX_STOP_CHARS:
            raise ApiError(
                400, f"stop: a stop string is at most {MAX_STOP_CHARS} characters, got {len(longest)}", "stop"
            )
        return stops


# each member tried in order, each array failing at its first bad item: in pydantic's default (smart)
# mode, 5M token ids were first tried as strings with an error each, 6 s of the event loop
_Prompt = Annotated[
    str
    | Annotated[list[str], Field(fail_fast=True)]
    | Annotated[list[int], Field(fail_fast=True)]
    | Annotated[list[list[int]], Field(fail_fast=True)],
    Field(union_mode="left_to_right"),
]


class CompletionRequest(_Sampling):
    prompt: _Prompt
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None

    def refuse_unserved(self) -> None:
        super().refuse_unserved()
        if self.best_of is not None and self.best_of not in (1, self.n):
            raise ApiError(
                400,
                f"best_of: {self.best_of} is not served (choosing the best of several samples); send "
                f"best_of equal to n ({self.n}) or leave it out",
                "best_of",
            )
        if self.suffix:
            raise ApiError(
                400,
                "suffix: text insertion is not supported by this server; send it without suffix",
                "suffix",
            )


class ChatMessage(_Open):
    role: str
    content: str | list[dict[str, Any]] | None = None
    # given to the chat template as OpenAI's clients send them (a participant's name, an assistant turn's
    # tool calls and the id a tool's answer refers to), as vLLM and transformers' templates take them
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def template_fields(self) -> dict[str, Any]:
        """The fields other than role and content that the chat template is given (those sent). A tool
        call's ``function.arguments``, which OpenAI sends as a JSON text, is given as the object it spells
        (templates render ``arguments | tojson`` or read its items, as vLLM gives them); as sent when it is
        not a JSON object."""
        out: dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls is not None:
            calls = []
            for call in self.tool_calls:
                function = call.get("function")
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    try:
                        args = json.loads(function["arguments"])
                    except ValueError:
                        args = None
                    if isinstance(args, dict):
                        call = {**call, "function": {**function, "arguments": args}}
                calls.append(call)
            out["tool_calls"] = calls
        return out

    def text(self, where: str) -> str:
        """The message's text (its text and refusal parts joined: a refusal part is an assistant turn's
        words, as vLLM renders it); ApiError 400 naming the part of `where` (the field path of this
        message's content) of another type. OpenAI's image_url, input_audio and file parts are refused
        saying so: the model reads text only, and answering without them would answer another question."""
        if isinstance(self.content, list):
            parts = []
            for j, part in enumerate(self.content):
                kind = part.get("type")
                if kind not in ("text", "refusal"):
                    media = ", which this server does not take (its model reads text only)"
                    media = media if kind in MEDIA_PARTS else ""
                    raise ApiError(
                        400,
                        f"{where}.{j}: a content part of type {shown(kind)}{media}; "
                        "only text parts are supported "
                        '({"type": "text", "text": "..."}), and an assistant\'s refusal parts',
                        f"{where}.{j}",
                    )
                text = part.get(kind)
                if not isinstance(text, str):
                    param = f"{where}.{j}.{kind}"
                    raise ApiError(400, f"{param}: expected a string, got {_json_type(text)}", param)
                parts.append(text)
            return "".join(parts)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None

    def refuse_unserved(self) -> None:
        super().refuse_unserved()
        _refuse_unserved_fields(self, UNSERVED_CHAT)
        # tool_choice "none" (function_call "none" for functions) asks for an answer with no tool call, as
        # this server's answers are: served, as vLLM serves it (agents send their tools on every turn); the
        # chat template is not given the tools
        choice = {"tools": self.tool_choice, "functions": self.function_call}
        for name in ("tools", "functions"):
            if getattr(self, name) and choice[name] != "none":
                raise ApiError(
                    400,
                    f"{name}: tool calling is not supported by this server (its answers hold no tool calls); "
                    f"send the request without {name}",
                    name,
                )
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none", "auto"):
                raise ApiError(
                    400, f"{name}: tool calling is not supported by this server; leave it out", name
                )


# a \\u escape of a surrogate (D800-DFFF), or the raw bytes of one (json.loads decodes with surrogatepass)
_MAY_HOLD_SURROGATES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _check_unicode(data: Any) -> None:
    """ApiError 400 naming the first string of `data` (key or value) that holds a lone surrogate.

    JSON can spell one (``"\\ud800"``) though no UTF-8 text holds it; the tokenizer and the response's
    encoder then fail on it. Iterative, so a deeply nested body costs no recursion.
    """
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
            continue
        children = []
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            name = f"{where}.{_printable(key)}" if where else _printable(key)
            if isinstance(key, str):
                _check_text(key, name)
            if isinstance(item, (str, dict, list)):
                children.append((name, item))
        stack.extend(reversed(children))


class _HugeInt(str):
    """The digits of a JSON integer past Python's int-to-str limit (:func:`_huge_integer` reads them)."""


def _huge_integer(raw: bytes) -> ApiError:
    """ApiError 400 naming the field of `raw`'s first integer past Python's int-to-str limit, and its size.

    ``json.loads`` refuses such a body whole, naming neither; it is parsed again (only then: a hook on
    every integer slows a body of a million token ids) with the long ones kept as digits, to find it."""
    limit = sys.get_int_max_str_digits()

    def parse_int(text: str) -> int | str:
        return int(text) if limit == 0 or len(text.lstrip("-")) <= limit else _HugeInt(text)

    digits, field = 0, None
    stack: list[tuple[str, Any]] = [("", json.loads(raw, parse_int=parse_int))]
    while stack and field is None:
        where, value = stack.pop()
        if isinstance(value, _HugeInt):
            digits, field = len(value.lstrip("-")), where or None
        elif isinstance(value, (dict, list)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = [(f"{where}.{_printable(k)}" if where else _printable(k), v) for k, v in items]
            stack.extend(reversed(children))
    what = f"an integer of {digits:,} digits" if digits else "an integer"
    return ApiError(
        400,
        f"{field + ': ' if field else ''}{what}, more than the {limit:,} a request body may hold; no field "
        "takes a number that large",
        field,
    )


def _printable(key: str | int) -> str:
    """`key` as a field path part that encodes as UTF-8 (a lone surrogate as its escape), a long one
    (a client's own dict key) cut as :func:`~trtforge.errors.shown` cuts it."""
    return shown_name(_utf8(str(key)))


def _utf8(text: str) -> str:
    """`text` with each lone surrogate as its escape, so that it encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_text(text: str, where: str) -> None:
    """ApiError 400 naming `where` if `text` does not encode as UTF-8 (it holds a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            400,
            f"{where}: not valid Unicode text (a lone surrogate {text[e.start]!r} at character {e.start}); "
            "send UTF-8 text",
            where,
        ) from None


def parse(model: type[_Base], raw: bytes) -> Any:
    """`raw` JSON as `model`, or ApiError 400 naming the first bad field."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    except ValueError:  # valid JSON, but an integer past int()'s digit limit (Python's wording named its API)
        raise _huge_integer(raw) from None
    except RecursionError:  # arrays or objects nested past the parser's depth: the client's mistake
        raise ApiError(400, "the request body nests arrays or objects too deeply to parse") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {_json_type(data)}")
    if _MAY_HOLD_SURROGATES.search(raw):
        _check_unicode(data)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e.errors()) from None


# pydantic's names of the members of the unions above (a member that fails adds its name to the error's
# field path) and what each takes, in the API's words
_UNION_MEMBERS = {
    "str": "a string",
    "list[str]": "an array of strings",
    "list[int]": "an array of token ids (integers)",
    "list[list[int]]": "an array of token-id arrays",
    "list[dict[str,any]]": "an array of content parts (objects)",
}


# pydantic's error types for a value of the wrong JSON type, and the type the field takes
_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
}


def _json_type(value: Any) -> str:
    """`value`'s type as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({shown(value)})"
    if isinstance(value, str):
        return f"a string ({shown(value)})"
    return "an array" if isinstance(value, list) else "an object"


def _validation_error(errors: list[Any]) -> ApiError:
    """ApiError 400 for the first of pydantic's `errors`; a field of several types (prompt, stop, content)
    is named as the client spells it, with every type it takes."""
    first = errors[0]
    loc = first["loc"]
    at = next((i for i, x in enumerate(loc) if x in _UNION_MEMBERS), None)
    if at is None:
        field = ".".join(_printable(x) for x in loc) or None
        value = first["input"]
        if first["type"] == "float_type" and isinstance(value, int) and not isinstance(value, bool):
            return ApiError(400, f"{field}: expected a number, got {shown(value)}, too large for one", field)
        if first["type"] in _EXPECTED:
            return ApiError(
                400, f"{field}: expected {_EXPECTED[first['type']]}, got {_json_type(first['input'])}", field
            )
        return ApiError(400, f"{field}: {first['msg']}", field)
    field = ".".join(_printable(x) for x in loc[:at])
    members = [e["loc"][at] for e in errors if e["loc"][:at] == loc[:at] and len(e["loc"]) > at]
    kinds = list(dict.fromkeys(_UNION_MEMBERS[m] for m in members if m in _UNION_MEMBERS))
    expected = kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} or {kinds[-1]}"
    return ApiError(400, f"{field}: expected {expected}", field)


def response_format(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """OpenAI's ``response_format`` as SamplingParams takes it (None for plain text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema" and fmt.json_schema is None:
        raise ApiError(400, "response_format.json_schema is required for type json_schema", "response_format")
    out: dict[str, Any] = {"type": fmt.type}
    if fmt.json_schema is not None:  # (its declared fields: the unknown ones kept for check_fields stay out)
        spec = fmt.json_schema
        out["json_schema"] = spec.model_dump(
            by_alias=True, exclude_none=True, exclude=set(spec.model_extra or ())
        )
    return out


def logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (``{"13": -100}``: token ids as decimal strings, biases in [-100, 100])
    as SamplingParams takes it, None when empty; ApiError 400 naming ``logit_bias`` and the bad entry, or
    an id given twice ("13" and "013"), as ``generate --logit-bias`` refuses it. Ids past the model's
    vocabulary are refused when the request is queued (the engine knows it)."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        token = token_id_of(key)
        if token is None:
            raise ApiError(
                400,
                f"logit_bias: key {shown(_utf8(key))} is not a token id; expected token ids as decimal "
                f'strings (up to {MAX_TOKEN_ID_DIGITS} digits) mapped to biases, e.g. {{"13": -100}}',
                "logit_bias",
            )
        if not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            raise ApiError(
                400,
                f"logit_bias: the bias of token {key} is {shown(value)}; expected a number in "
                f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}] (-{LOGIT_BIAS_LIMIT:g} bans the token, "
                f"{LOGIT_BIAS_LIMIT:g} all but forces it)",
                "logit_bias",
            )
        if token in out:
            raise ApiError(
                400, f"logit_bias: token {token} is biased twice; give each token id once", "logit_bias"
            )
        out[token] = value
    return out


def sampling_params(
    req: _Sampling, max_tokens: int, logprobs: int | None, choice: int, like: SamplingParams | None = None
) -> SamplingParams:
    """The :class:`SamplingParams` of choice `choice` of `req` (choice i of n draws with
    :func:`~trtforge.llm.sampling.child_seed` (seed, i), as sample i of ``generate --n`` does).

    Options at their neutral values are left out, so a SamplingParams without a field for them still
    serves requests that do not use them; one that is asked for and missing is a 400 naming it. `like`,
    the params of another choice of `req`, lends these its logit_bias (:func:`_share_logit_bias`).
    """
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": req.temperature,
        # top_p 0 (OpenAI takes it) is the smallest nucleus, the likeliest token alone: top_k 1, as
        # SamplingParams' top_p is in (0, 1]
        "top_p": req.top_p or 1.0,
        "top_k": 1 if req.top_p == 0 else max(req.top_k, 0),
        "seed": None if req.seed is None else child_seed(req.seed, choice),
        "ignore_eos": req.ignore_eos,
        "stop_token_ids": tuple(req.stop_token_ids),
    }
    optional = {
        "min_p": (req.min_p, 0.0),
        "presence_penalty": (req.presence_penalty, 0.0),
        "frequency_penalty": (req.frequency_penalty, 0.0),
        "repetition_penalty": (req.repetition_penalty, 1.0),
        "logprobs": (logprobs, None),
        "response_format": (response_format(req.response_format), None),
        "logit_bias": (None if like is not None else req.logit_bias_map, None),
    }
    kwargs.update({k: v for k, (v, neutral) in optional.items() if v != neutral})
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    missing = [k for k in kwargs if k not in known]
    if missing:
        field = missing[0]
        raise ApiError(
            400,
            f"{field}: this build's SamplingParams has no {missing[0]!r} option; it cannot be served",
            field,
        )
    from trtforge.errors import UserError

    try:
        params = SamplingParams(**kwargs)
    except UserError as e:  # worded as the field the client sent, not the class it never saw
        text = str(e)
        field = next((k for k in kwargs if text.startswith(f"SamplingParams.{k} ")), None)
        message = f"{field}: {text.removeprefix(f'SamplingParams.{field} ')}" if field else text
        raise ApiError(400, message, field) from None
    return params if like is None or like.logit_bias is None else _share_logit_bias(params, like)


def _share_logit_bias(params: SamplingParams, like: SamplingParams) -> SamplingParams:
    """`params` holding `like`'s logit_bias map and its arrays, the same objects: SamplingParams copies and
    checks a map it is given, and per choice that was 0.9 s of the event loop for 256 choices of a
    4,096-entry map. Shared safely: SamplingParams is frozen and the engine only reads both."""
    object.__setattr__(params, "logit_bias", like.logit_bias)
    vars(params)["logit_bias_arrays"] = like.logit_bias_arrays  # the cached_property's slot: built once
    return params
