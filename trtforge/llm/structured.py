"""Structured output: a request's ``response_format`` (JSON schema / any JSON) as a grammar over the
tokenizer's vocabulary, through xgrammar (the ``structured`` extra, imported lazily).

Each constrained request holds a :class:`GrammarMatcher`; per step :func:`batch_bitmask` packs every
row's allowed tokens into one int32 bitmask ``[rows, ceil(vocab/32)]`` (rows without a grammar allow
all), which the sampler applies to the logits on their device, and each sampled token then advances
its row's matcher. xgrammar rather than llguidance: both are maintained and install here, xgrammar's
bitmask layout is what vLLM and SGLang apply, and it compiles a schema once for every request using it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from trtforge.errors import UserError, clipped, shown, shown_name

# A served schema is a client's input: bound what one can cost. xgrammar compiles outside the GIL, but its
# time grows faster than the schema (CPU box: 72 KB of properties 3 s, 300 KB 102 s) and with a pattern's
# bounded repetitions ("[a-z]{1,2000}" 0.17 s, {1,5000} 1.1 s, {1,20000} 32 s; nested ones multiply).
MAX_SCHEMA_BYTES = 128 * 1024
MAX_PATTERN_REPEAT = 4096
# all of a schema's patterns together: each unrolls on its own (CPU box: 0.7 s a 4,096-repeat pattern), so
# 128 KB of them was half an hour of a compile thread, which no timeout stops and the exit waits for
MAX_TOTAL_PATTERN_REPEAT = 8 * MAX_PATTERN_REPEAT
# groups nested in a pattern: its scans recurse on them (Python's stack holds ~1,000; "(" * 5,000 was a
# RecursionError, a 500 from the server)
MAX_PATTERN_DEPTH = 64
# objects and arrays nested in a schema: xgrammar's compile time grows faster than the depth (CPU box: an
# array of arrays 64 deep 0.25 s, 128 deep 1.7 s, 200 deep 5 s, 900 deep past the 30 s timeout, holding a
# compile thread on); 128 KB of schema nests ~5,000 deep
MAX_SCHEMA_DEPTH = 100
# seconds all of a schema's const and enum strings may take to be matched against their schemas' patterns:
# a pattern is the client's, and one that backtracks on a value for longer leaves the rest unjudged
VALUE_CHECK_S = 1.0
# the JSON Schema formats whose strings xgrammar's grammars restrict (it lets any string through for the
# others: idn-email, uri-reference, iri, regex, ...)
CHECKED_FORMATS = frozenset(
    {"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"}
    | {"json-pointer", "relative-json-pointer"}
)
COMPILE_TIMEOUT_S = 30.0
COMPILE_WORKERS = 2
CACHE_SIZE = 128  # compiled grammars kept (least recently used dropped first)
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
# the head of xgrammar's C++ log lines, which its exceptions' texts carry: "[08:40:19] /project/cpp/x.cc:94: "
_XGRAMMAR_LOG_HEAD = re.compile(r"^\s*\[\d{2}:\d{2}:\d{2}\] \S+:\d+: ")


def xgrammar_reason(exc: BaseException) -> str:
    """xgrammar's error text without its C++ log head (a time and a source file of its build, meaningless
    to whoever wrote the schema) and trailing newline: "enum array must not be empty"."""
    return _XGRAMMAR_LOG_HEAD.sub("", str(exc)).strip()


class GrammarError(UserError):
    """A request's response_format cannot be served: refused, failed or too slow to compile (a server
    names ``response_format`` as the field at fault)."""


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise GrammarError(
            "response_format (structured output) needs xgrammar: pip install 'trtforge[structured]'."
        ) from exc
    return xgrammar


class GrammarMatcher:
    """One request's position in its grammar: which tokens may come next, advanced token by token."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self.accepted = 0  # tokens accepted so far
        self.dead_end = False  # the last fill allowed no token: the request cannot go on

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write this request's allowed next tokens into row `row` of a host int32 bitmask.

        A row that allows no token (the tokenizer cannot spell what the grammar needs next: a word-level
        or byte-fallback-free vocabulary without ``{``) is left allowing every token instead, so that the
        step samples from a valid distribution (every logit masked out made the sampler's draw
        meaningless), and :meth:`accept` then ends this request with a GrammarError saying why."""
        import torch

        view = torch.from_numpy(bitmask)
        self._m.fill_next_token_bitmask(view, row)
        self.dead_end = not bitmask[row].any()
        if self.dead_end:
            bitmask[row] = -1

    def accept(self, token: int) -> None:
        """Advance past `token`. GrammarError when the last fill was a dead end (:meth:`fill`); a token the
        grammar forbids otherwise is an internal error (the mask prevents it)."""
        if self.dead_end:
            raise GrammarError(
                f"response_format: no token of this tokenizer's vocabulary continues the grammar after "
                f"{self.accepted} generated token(s); the vocabulary cannot spell what the schema requires "
                "there"
            )
        if not self._m.accept_token(int(token)):
            raise RuntimeError(f"the grammar rejected token {token} although the bitmask allowed it")
        self.accepted += 1

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its end (EOS) was accepted."""
        return bool(self._m.is_terminated())


def pattern_repeat(pattern: str) -> int:
    """The largest product of nested bounded repetition counts in regex `pattern` (``(a{1,50}){1,40}``:
    2,000): how many copies of a piece a grammar compiler unrolls. ``*``, ``+``, ``?`` and ``{m,}``
    loop rather than unroll (counted as ``max(m, 1)``); escapes and character classes are skipped."""
    worst, i = 1, 0
    while i < len(pattern):  # an unbalanced ")" ends a top-level sequence, not the scan
        part, i = _repeat_seq(pattern, i)
        worst, i = max(worst, part), i + 1
    return worst


def _count(digits: str) -> int:
    """A quantifier's count; one of over 9 digits as 10**9, past any bound (``int()`` refuses over 4,300
    digits: a ValueError, a 500 from the server)."""
    return int(digits) if len(digits) <= 9 else 10**9


def pattern_depth(pattern: str) -> int:
    """How deep regex `pattern` nests its groups (escapes and character classes skipped)."""
    depth = deepest = i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            i = _skip_class(pattern, i)
            continue
        depth += (c == "(") - (c == ")" and depth > 0)
        deepest = max(deepest, depth)
        i += 2 if c == "\\" else 1
    return deepest


def _repeat_seq(p: str, i: int) -> tuple[int, int]:
    """The worst factor of the sequence (and alternatives) from `i` to its closing ``)``; the index after."""
    worst = 1
    while i < len(p) and p[i] != ")":
        inner = 1
        if p[i] == "\\":
            i += 2
        elif p[i] == "[":
            i = _skip_class(p, i)
        elif p[i] == "(":
            inner, i = _repeat_seq(p, i + 1)
            i += 1  # past ")"
        else:
            i += 1
        m = _QUANTIFIER.match(p, i)
        if m:
            hi = m.group(3)
            count = _count(hi) if hi else max(_count(m.group(1)), 1)  # {n}, {m,n}; {m,} loops
            i = m.end()
        else:
            count = 1
        worst = max(worst, inner * count)
    return worst, i


def check_schema(schema: Any, text: str) -> None:
    """Refuse (GrammarError naming the place) a JSON schema too costly to compile: over
    :data:`MAX_SCHEMA_BYTES` as JSON (`text`), a ``pattern`` unrolling more than
    :data:`MAX_PATTERN_REPEAT` copies (:func:`pattern_repeat`), or all its patterns together more than
    :data:`MAX_TOTAL_PATTERN_REPEAT`, or nesting objects and arrays past :data:`MAX_SCHEMA_DEPTH`. Also
    bounds what the scans of a pattern recurse on: its groups' depth (:data:`MAX_PATTERN_DEPTH`)."""
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise GrammarError(
            f"response_format: the JSON schema is {len(text.encode()):,} bytes; at most {MAX_SCHEMA_BYTES:,} "
            "compile to a grammar in reasonable time."
        )
    stack: list[tuple[Any, str, int]] = [(schema, "$", 1)]
    total = 0
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, (dict, list)) and depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(
                f"response_format: the JSON schema nests objects and arrays more than {MAX_SCHEMA_DEPTH} "
                f"deep (at {clipped(where)}); deeper ones take too long to compile to a grammar: flatten it, "
                "or use $defs and $ref for a recursive structure."
            )
        if isinstance(node, dict):
            patterns = [(node.get("pattern"), f"{where}.pattern")]
            props = node.get("patternProperties")
            if isinstance(props, dict):
                patterns += [(k, f"{where}.patternProperties[{shown(k)}]") for k in props]
            for pat, at in patterns:
                if not isinstance(pat, str):
                    continue
                groups = pattern_depth(pat)
                if groups > MAX_PATTERN_DEPTH:
                    raise GrammarError(
                        f"response_format: the schema's {at} nests groups {groups:,} deep; at most "
                        f"{MAX_PATTERN_DEPTH} are taken."
                    )
                n = pattern_repeat(pat)
                if n > MAX_PATTERN_REPEAT:
                    raise GrammarError(
                        f"response_format: the schema's {at} repeats a piece up to {n:,} times (nested "
                        f"bounded repetitions multiply); at most {MAX_PATTERN_REPEAT:,} compile in "
                        "reasonable time: use * or + for long runs, or smaller bounds."
                    )
                total += n
                if total > MAX_TOTAL_PATTERN_REPEAT:
                    raise GrammarError(
                        f"response_format: the schema's patterns repeat pieces {total:,} times in all (up to "
                        f"{at}); at most {MAX_TOTAL_PATTERN_REPEAT:,} compile in reasonable time: use * or + "
                        "for long runs, or smaller bounds."
                    )
            stack += [(v, f"{where}.{shown_name(k)}", depth + 1) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node)]


# schema keywords whose values are subschemas: one (a dict or bool), a list of them, or a map of name -> one
_SUBSCHEMA = (
    "items",
    "additionalItems",
    "additionalProperties",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_RANGE = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _subschemas(schema: Any) -> Any:
    """Every (sub)schema of `schema` with its place (``$.properties.a``): the nodes that are schemas, not
    data (an ``enum`` value or a property named ``not`` is no keyword)."""
    stack: list[tuple[Any, str]] = [(schema, "$")]
    while stack:
        node, where = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node, where
        for key in _SUBSCHEMA:
            if isinstance(node.get(key), dict):
                stack.append((node[key], f"{where}.{key}"))
        for key in _SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack += [(v, f"{where}.{key}[{i}]") for i, v in enumerate(node[key])]
        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack += [(v, f"{where}.{key}.{shown_name(k)}") for k, v in node[key].items()]


def has_lookahead(pattern: str) -> bool:
    """Whether regex `pattern` holds a lookahead ``(?=`` or ``(?!`` (outside escapes and character
    classes), which xgrammar ignores: ``(?!a)[ab]`` matched "a"."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _skip_class(pattern, i)
            continue
        if pattern.startswith(("(?=", "(?!"), i):
            return True
        i += 1
    return False


def _skip_class(pattern: str, i: int) -> int:
    """The index past the character class that opens at `pattern[i]` (``[``)."""
    j = i + 1 + (pattern[i + 1 : i + 2] == "^")
    j += pattern[j : j + 1] == "]"  # a leading ] is a literal
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


_GROUP_HEAD = re.compile(r"\?(?:[:=!]|<[=!]|P?<[A-Za-z_][A-Za-z0-9_]*>)")  # (?: (?= (?<= (?<name> ...
_QUANTIFIER_AT = re.compile(r"[*+?]|\{(\d+)(?:,(\d*))?\}")


def _anchor_tree(p: str, i: int) -> tuple[list[list[Any]], int]:
    """The alternatives of regex `p` from `i` to its closing ``)`` (or its end), each a list of items:
    ``("anchor", index, "^" or "$")``, ``("group", alternatives, repeated)`` (quantified to match twice or
    more) or ``None``, any other piece (one that can match characters); and the index of that ``)``."""
    alts: list[list[Any]] = [[]]
    while i < len(p) and p[i] != ")":
        c = p[i]
        if c == "|":
            alts.append([])
            i += 1
            continue
        if c in "^$":
            alts[-1].append(("anchor", i, c))
            i += 1
            continue
        inner = None
        if c == "(":
            head = _GROUP_HEAD.match(p, i + 1)
            inner, i = _anchor_tree(p, head.end() if head else i + 1)
            i += 1  # past ")"
        else:
            i = i + 2 if c == "\\" else _skip_class(p, i) if c == "[" else i + 1
        m = _QUANTIFIER_AT.match(p, i)
        repeated = False
        if m is not None:
            low, high = m.group(1), m.group(2)
            repeated = m.group() != "?" and (
                low is None or high == "" or max(_count(low), _count(high or "0")) > 1
            )
            i = m.end() + (p[m.end() : m.end() + 1] in ("?", "+"))  # (lazy or possessive)
        alts[-1].append(None if inner is None else ("group", inner, repeated))
    return alts, i


def misplaced_anchor(pattern: str) -> tuple[int, str] | None:
    """(index, character) of the first ``^`` or ``$`` of regex `pattern` (outside escapes and character
    classes) that is not at an end of it: a ``^`` after a piece that can match characters, a ``$`` before
    one, or either in a group repeated twice or more. xgrammar matches the pattern against the whole
    string and drops such an anchor (a warning on stderr): ``a^b``, which no string matches, let "ab"
    through. One at an end says only what the whole match already is (``^a$``, ``^a|^b``, ``(^a)``).
    Recursive in the pattern's groups, which :func:`check_schema` bounds first."""
    bad = []
    # (alternatives, at the pattern's start, at its end, inside a repeated group); an unbalanced ")" ends
    # the scan (no compiler takes the pattern)
    stack: list[tuple[list[list[Any]], bool, bool, bool]] = [(_anchor_tree(pattern, 0)[0], True, True, False)]
    while stack:
        alts, first, last, repeated = stack.pop()
        for seq in alts:
            empty = [x is not None and x[0] == "anchor" for x in seq]  # (an anchor matches no character)
            for k, item in enumerate(seq):
                before, after = first and all(empty[:k]), last and all(empty[k + 1 :])
                if empty[k] and (repeated or not (before if item[2] == "^" else after)):
                    bad.append(item[1:])
                elif item is not None and item[0] == "group":
                    stack.append((item[1], before, after, repeated or item[2]))
    return min(bad, default=None)


def _types(node: dict[str, Any]) -> set[str] | None:
    """The node's ``type`` as a set of names (None: no type given, any value)."""
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return None


def _unenforced(node: dict[str, Any], strings: _StringCheck) -> tuple[str, str] | None:
    """(what, the remedy) of the first constraint of schema `node` (not its subschemas) that xgrammar
    leaves out of the grammar without an error, so that the output could break it; None if none."""
    drop = "drop it (and check that constraint on the parsed output)"
    for key in ("anyOf", "oneOf", "type"):
        if node.get(key) == []:
            return f"an empty {shown(key)}, which no value matches", "give it at least one entry"
    required = node.get("required")
    if isinstance(required, list):
        props = node.get("properties")
        defined = props if isinstance(props, dict) else {}
        missing = [k for k in required if isinstance(k, str) and k not in defined]
        if missing:  # (xgrammar's objects hold their 'properties' only, a required one left out or not)
            return (
                f"'required' {shown(missing[0])} without defining it in the same schema's 'properties'",
                f"add {shown(missing[0])} to 'properties' beside 'required'",
            )
    if "not" in node:
        return "'not'", drop
    if "if" in node:
        return "'if'/'then'/'else'", "write the alternatives with anyOf, or drop them"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return f"'allOf' of {len(node['allOf'])} schemas", "merge them into one schema"
    if node.get("uniqueItems") is True:
        return "'uniqueItems'", drop
    for key in ("dependentRequired", "dependentSchemas", "dependencies"):
        if node.get(key):
            return f"{shown(key)}", "list the properties in 'required', or drop it"
    if "multipleOf" in node:
        types = _types(node)
        if types is None or "number" in types or "integer" not in types:
            return "'multipleOf' on a non-integer type", 'give it to a schema of "type": "integer" only'
        if any(k in node for k in _RANGE):
            return "'multipleOf' with a minimum or maximum", "use one of them, or an enum of the values"
    lengths = [k for k in ("minLength", "maxLength") if k in node]
    shaped = [k for k in ("pattern", "format") if k in node]
    if lengths and shaped:
        return (
            f"{shown(lengths[0])} with {shown(shaped[0])}",
            "put the length into the pattern (e.g. ^[a-z]{1,12}$), or drop one of them",
        )
    patterns = [node.get("pattern")]
    if isinstance(node.get("patternProperties"), dict):
        patterns += list(node["patternProperties"])
    for pat in patterns:
        if isinstance(pat, str) and has_lookahead(pat):
            return f"a lookahead ((?= or (?!) in the pattern {shown(pat)}", "write the pattern without it"
        anchor = misplaced_anchor(pat) if isinstance(pat, str) else None
        if anchor is not None:
            return (
                f"the anchor {shown(anchor[1])} at character {anchor[0]} of the pattern {shown(pat)}, not at "
                "its start or end",
                "put ^ only at the pattern's start and $ only at its end, or escape it (\\^, \\$) to match "
                "the character",
            )
    return _beside_values(node, strings)


_JSON_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})


def _json_type_of(value: Any, types: set[str]) -> bool:
    """Whether JSON `value` is of one of JSON Schema's `types` (an integer is a number; 2.0 an integer)."""
    if value is None:
        return "null" in types
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return bool(types & {"integer", "number"})
    if isinstance(value, float):
        return "number" in types or ("integer" in types and value.is_integer())
    kind = "string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"
    return kind in types


class _StringCheck:
    """Judges a const or enum string against its schema's ``pattern`` and ``format``, all of a schema's
    strings within :data:`VALUE_CHECK_S` seconds (those past it are not judged). `fits_format(format,
    value)`: whether xgrammar's grammar for strings of that format takes the value (None: not judged)."""

    def __init__(self, fits_format: Callable[[str, str], bool | None] | None = None) -> None:
        self.deadline = time.monotonic() + VALUE_CHECK_S
        self.fits_format = fits_format

    def rules_out(self, node: dict[str, Any], value: str) -> str | None:
        """The keyword of `node` (with its value, shown) that string `value` cannot satisfy, or None."""
        pattern, fmt = node.get("pattern"), node.get("format")
        if isinstance(pattern, str) and self._misses(pattern, value):
            return f"'pattern' {shown(pattern)}"
        judged = isinstance(fmt, str) and self.fits_format is not None and time.monotonic() < self.deadline
        if judged and self.fits_format(fmt, value) is False:  # type: ignore[misc]
            return f"'format' {shown(fmt)}"
        return None

    def _misses(self, pattern: str, value: str) -> bool:
        """Whether `value` holds no match of `pattern` (JSON Schema's: an ECMA-262 regex, matched anywhere
        in the string), as the ``regex`` module (the structured extra's) finds within the time
        left; False where it cannot tell: a syntax it lacks, or no answer in time."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            import regex
        except ImportError:
            return False
        try:  # (concurrent: the GIL is released while it matches, as a compile thread's work should)
            return regex.search(pattern, value, timeout=left, concurrent=True) is None
        except (regex.error, TimeoutError):
            return False


def _beside_values(node: dict[str, Any], strings: _StringCheck) -> tuple[str, str] | None:
    """(what, the remedy) for a ``const`` or ``enum`` value of schema `node` that breaks the node's own
    ``type``, lengths, range, ``pattern`` or ``format``: xgrammar serves the values and leaves the rest
    out, so that ``{"const": 3, "type": "string"}``, which no value matches, gave 3, and
    ``{"const": "abc", "pattern": "^[0-9]+$"}`` gave "abc"."""
    values = [("'const'", node["const"])] if "const" in node else []
    if isinstance(node.get("enum"), list):
        values += [(f"'enum' item [{i}]", v) for i, v in enumerate(node["enum"])]
    types = _types(node)
    for name, value in values:
        broken = None
        if types is not None and types <= _JSON_TYPES and not _json_type_of(value, types):
            broken = f"'type' {shown(node['type'])}"
        elif isinstance(value, str):
            low, high = node.get("minLength"), node.get("maxLength")
            if isinstance(low, int) and len(value) < low:
                broken = f"'minLength' {low}"
            elif isinstance(high, int) and len(value) > high:
                broken = f"'maxLength' {high}"
            else:
                broken = strings.rules_out(node, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            for key, ok in _RANGE_TESTS.items():
                bound = node.get(key)
                if isinstance(bound, (int, float)) and not isinstance(bound, bool) and not ok(value, bound):
                    broken = f"{shown(key)} {shown(bound)}"
                    break
        if broken is not None:
            said = shown(value) if isinstance(value, str) else clipped(json.dumps(value))
            return (
                f"{broken} beside {name} {said} (a value it rules out)",
                f"make them agree: drop or change the value, or the {broken.split()[0]}",
            )
    return None


_RANGE_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": lambda v, b: v >= b,
    "maximum": lambda v, b: v <= b,
    "exclusiveMinimum": lambda v, b: v > b,
    "exclusiveMaximum": lambda v, b: v < b,
}


def check_enforceable(schema: Any, fits_format: Callable[[str, str], bool | None] | None = None) -> None:
    """Refuse (GrammarError naming the place and the keyword) a JSON schema holding a constraint the
    grammar cannot enforce. xgrammar compiles these by leaving them out (a warning on stderr at most),
    so that "valid JSON against the schema" would not hold: an empty ``anyOf``/``oneOf``/``type``
    (output "" or any value), a ``required`` property its schema's own ``properties`` lack (output
    ``{}``), ``not`` (``{"not": {"type": "string"}}`` gave "a"), ``if``, an ``allOf`` of several
    schemas, ``uniqueItems``, ``dependentRequired``/``dependentSchemas``, ``multipleOf`` on numbers
    or beside a range (``{"type": "number", "multipleOf": 1}`` gave 0.5), ``minLength``/``maxLength``
    beside a ``pattern`` or ``format``, a pattern's lookahead or its ``^``/``$`` away from its ends
    (:func:`misplaced_anchor`), and a ``const`` or ``enum`` value outside its schema's own ``type``,
    lengths, range, ``pattern`` or ``format`` (``{"const": 3, "type": "string"}`` gave 3), a format
    judged by `fits_format` (:class:`_StringCheck`)."""
    strings = _StringCheck(fits_format)
    for node, where in _subschemas(schema):
        found = _unenforced(node, strings)
        if found is not None:
            what, fix = found
            raise GrammarError(
                f"response_format: the schema's {where} uses {what}, which the grammar cannot enforce "
                f"(structured output would ignore it and the JSON could break it); {fix}."
            )


class GrammarCompiler:
    """Compiles response formats for one tokenizer, makes a matcher per request.

    `vocab_size` is the model's (its logits' width), which may exceed the tokenizer's. Compiles run on
    :data:`COMPILE_WORKERS` threads (xgrammar releases the GIL), each waited for at most `timeout_s`;
    the grammars of the last :data:`CACHE_SIZE` schemas are kept. Thread-safe: a server compiles a
    request's schema (:meth:`compile`) before queuing it, off its event loop and the engine's lock.
    :meth:`close` (the engine's close calls it) cancels queued compiles and ends every wait at once. A
    compile already running cannot be stopped (xgrammar's C++ runs it) and the process's exit waits for
    it: its threads are not daemons, since one returning to Python while the interpreter finalizes
    aborts the process ("terminate called without an active exception", exit 134).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        xgr = _xgrammar()
        self.vocab_size = int(vocab_size)
        self.timeout_s = float(timeout_s)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)  # (our cache is bounded)
        self._xgr = xgr
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._held: Counter[str] = Counter()  # schemas :meth:`hold` keeps in the cache (never evicted)
        self._formats: dict[str, Any] = {}  # CHECKED_FORMATS' string grammars (:meth:`_fits_format`)
        self._pool = ThreadPoolExecutor(COMPILE_WORKERS, thread_name_prefix="grammar")
        self._closing: Future = Future()  # done once close() runs: ends every wait for a compile

    def _key(self, response_format: dict[str, Any]) -> tuple[str, Any]:
        """The cache key of `response_format` (its schema as sorted JSON) and the schema itself."""
        kind = response_format.get("type")
        if kind == "json_object":  # OpenAI's JSON mode: an object (xgrammar's builtin grammar is any value)
            schema = {"type": "object"}
            return json.dumps(schema), schema
        if kind == "json_schema":
            schema = response_format["json_schema"]["schema"]
            return json.dumps(schema, sort_keys=True), schema
        raise GrammarError(f"response_format type {kind!r} has no grammar (json_object or json_schema)")

    def _fits_format(self, fmt: str, value: str) -> bool | None:
        """Whether xgrammar's grammar for strings of JSON Schema format `fmt` takes `value` (None: a
        format whose strings it does not restrict), that grammar compiled once per format."""
        if fmt not in CHECKED_FORMATS:
            return None
        with self._lock:
            grammar = self._formats.get(fmt)
        if grammar is None:
            schema = json.dumps({"type": "string", "format": fmt})
            grammar = self._compiler.compile_json_schema(schema, any_whitespace=False)
            with self._lock:
                self._formats[fmt] = grammar
        matcher = self._xgr.GrammarMatcher(grammar)
        return bool(matcher.accept_string(json.dumps(value)) and matcher.is_completed())

    def _compile_now(self, key: str) -> Any:
        try:
            # compact JSON: free whitespace lets a model loop on blanks until max_tokens
            return self._compiler.compile_json_schema(key, any_whitespace=False)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError for a schema it cannot use
            why = clipped(xgrammar_reason(exc))
            msg = f"response_format: the JSON schema cannot be compiled to a grammar: {why}"
            raise GrammarError(msg) from exc

    def compile(self, response_format: dict[str, Any]) -> Any:
        """`response_format`'s compiled grammar (from the cache, or compiled now on a worker thread);
        GrammarError when the schema is refused, fails to compile, or takes over ``timeout_s``."""
        key, schema = self._key(response_format)
        with self._lock:
            self._check_open()
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
        if future is None:  # a schema not seen (or evicted): checked once, then compiled
            check_schema(schema, key)
            check_enforceable(schema, self._fits_format)
            with self._lock:
                self._check_open()
                future = self._cache.get(key)
                if future is None:
                    future = self._cache[key] = self._pool.submit(self._compile_now, key)
                    done = [k for k, f in self._cache.items() if f.done() and not self._held[k]]
                    for k in done[: max(0, len(self._cache) - CACHE_SIZE)]:
                        del self._cache[k]
        ready, _ = wait((future, self._closing), timeout=self.timeout_s, return_when=FIRST_COMPLETED)
        if future not in ready or future.cancelled():  # timed out or closed (or another waiter timed out)
            if not ready:
                with self._lock:
                    if future.cancel():  # still queued behind other compiles: it never runs
                        self._cache.pop(key, None)
            if self._closing.done():
                raise GrammarError("response_format: structured output shut down before this schema compiled")
            raise GrammarError(
                f"response_format: the JSON schema did not compile to a grammar within {self.timeout_s:g} s "
                "(the compiler was busy, or the schema is too large); simplify it or retry."
            )
        try:
            return future.result()
        except GrammarError as exc:
            raise GrammarError(str(exc)) from None  # a fresh error each time the cached failure is met

    def hold(self, response_format: dict[str, Any]) -> Callable[[], None]:
        """Compile `response_format` (:meth:`compile`) and keep its grammar in the cache until the
        returned function is called (once; later calls do nothing). A server holds a request's schema
        from its compile, off the engine's lock, to the request's submission: evicted between the two
        (by other clients' schemas), it was compiled again inside submission, under the engine's lock,
        which held every running request for up to the compile's time limit."""
        key, _ = self._key(response_format)
        with self._lock:
            self._held[key] += 1
        released = [False]

        def release() -> None:
            with self._lock:
                if not released[0]:
                    released[0] = True
                    self._held[key] -= 1
                    if self._held[key] <= 0:
                        del self._held[key]

        try:
            self.compile(response_format)
        except BaseException:
            release()
            raise
        return release

    def _check_open(self) -> None:
        if self._closing.done():
            raise GrammarError("response_format: structured output is shut down (the engine is closing)")

    def close(self) -> None:
        """Stop compiling: queued compiles are cancelled, whoever waits on a compile gets GrammarError at
        once, and later :meth:`compile` calls raise it. Returns without waiting for a running compile.
        Idempotent."""
        with self._lock:
            if self._closing.done():
                return
            self._closing.set_result(None)
            self._cache.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def matcher(self, response_format: dict[str, Any]) -> GrammarMatcher:
        """A fresh matcher at the start of `response_format`'s grammar."""
        return GrammarMatcher(self._xgr.GrammarMatcher(self.compile(response_format)), self.vocab_size)


def batch_bitmask(matchers: Sequence[GrammarMatcher | None], vocab_size: int) -> np.ndarray | None:
    """The int32 bitmask ``[rows, ceil(vocab/32)]`` of one step (None when no row has a grammar)."""
    if all(m is None for m in matchers):
        return None
    mask = np.full((len(matchers), (vocab_size + 31) // 32), -1, dtype=np.int32)
    for row, m in enumerate(matchers):
        if m is not None:
            m.fill(mask, row)
    return mask
