"""Structured output: the trained code model, constrained by a JSON schema's grammar, writes valid JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trtforge.errors import UserError
from trtforge.llm.sampling import SamplingParams

xgrammar = pytest.importorskip("xgrammar", reason="structured output needs the `structured` extra (xgrammar)")
jsonschema = pytest.importorskip("jsonschema")

MODEL = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "code-llama-21m"
pytestmark = pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "count", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(MODEL)


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def engine(request, model_and_tokenizer):
    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sched.scheduler import SchedulerConfig

    model, tok = model_and_tokenizer
    config = SchedulerConfig(max_num_seqs=8, async_scheduling=request.param)
    eng = LLMEngine(TorchExecutor(model, num_blocks=128, block_size=16), config)
    eng.enable_structured_output(tok)
    yield eng, tok
    eng.close()


def test_schema_constrained_output_validates(engine):
    eng, tok = engine
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
    params = [
        SamplingParams(response_format=fmt, max_tokens=120),
        SamplingParams(response_format=fmt, max_tokens=120, temperature=0.9, seed=4, presence_penalty=0.5),
        SamplingParams(response_format={"type": "json_object"}, max_tokens=120, temperature=0.7, seed=1),
        SamplingParams(max_tokens=30),  # an unconstrained neighbour in the same batch
    ]
    prompts = [tok("def f(x):\n    return")["input_ids"]] * 3 + [tok("import os\n")["input_ids"]]
    done = eng.generate(prompts, params)
    texts = [tok.decode(c.token_ids, skip_special_tokens=True) for c in done]
    for c, text in zip(done[:2], texts):
        assert c.finish_reason == "stop", f"the grammar did not complete within the budget: {text!r}"
        jsonschema.validate(json.loads(text), SCHEMA)
    assert done[2].finish_reason == "stop" and isinstance(json.loads(texts[2]), dict)
    with pytest.raises(json.JSONDecodeError):
        json.loads(texts[3])  # the unconstrained code model writes code, not JSON


def test_a_schema_the_grammar_cannot_compile_is_a_user_error(model_and_tokenizer):
    from trtforge.llm.structured import GrammarCompiler

    _, tok = model_and_tokenizer
    compiler = GrammarCompiler(tok, len(tok))
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}}
    with pytest.raises(UserError, match="response_format"):
        compiler.matcher(bad)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"enum": []}, "enum array must not be empty"),
        ({"type": "integer", "minimum": 5, "maximum": 3}, "Invalid range: minimum greater than maximum"),
        ({"type": "string", "pattern": "(a)\\1"}, "Backreference is not supported yet"),
    ],
)
def test_a_compile_failure_says_why_without_xgrammar_log_noise(model_and_tokenizer, schema, reason):
    """xgrammar's exception texts start with its C++ log head ("[08:40:19] /project/cpp/x.cc:5082: ") and
    end with a newline: the message keeps the reason only."""
    from trtforge.llm.structured import GrammarCompiler

    compiler = GrammarCompiler(model_and_tokenizer[1], 4096)
    with pytest.raises(UserError) as info:
        compiler.compile({"type": "json_schema", "json_schema": {"schema": schema}})
    text = str(info.value)
    assert text.startswith("response_format: the JSON schema cannot be compiled to a grammar: ")
    assert reason in text and text == text.strip()
    assert ".cc:" not in text and "/project/" not in text


def test_bitmask_rows_without_a_grammar_allow_everything(model_and_tokenizer):
    from trtforge.llm.structured import GrammarCompiler, batch_bitmask

    _, tok = model_and_tokenizer
    m = GrammarCompiler(tok, 4096).matcher({"type": "json_object"})
    mask = batch_bitmask([None, m], 4096)
    assert (mask[0] == -1).all()
    allowed = np.unpackbits(mask[1].view(np.uint8), bitorder="little")[:4096].astype(bool)
    assert 0 < allowed.sum() < 4096
    assert batch_bitmask([None, None], 4096) is None


@pytest.mark.parametrize(
    ("pattern", "repeat"),
    [
        ("[a-z]{1,20000}", 20000),
        ("(a{1,50}){1,40}", 2000),
        ("((a{1,100}){1,100}){1,100}", 1_000_000),
        ("(?:x{10}|y){10}", 100),
        ("a*b+c?d{5,}", 5),
        (r"\{1,99999\}[{1,9999}]", 1),  # escaped braces and a class hold no quantifier
        ("[]{1,9}]{1,7}", 7),  # a leading ] is a literal inside a class
        ("a)b{1,9999}", 9999),  # an unbalanced ) does not end the scan
    ],
)
def test_pattern_repeat_multiplies_nested_bounded_repetitions(pattern, repeat):
    from trtforge.llm.structured import pattern_repeat

    assert pattern_repeat(pattern) == repeat


def test_schemas_too_costly_to_compile_are_refused_naming_the_place(model_and_tokenizer):
    from trtforge.llm.structured import MAX_SCHEMA_BYTES, GrammarCompiler, check_schema

    g = GrammarCompiler(model_and_tokenizer[1], 4096)

    def fmt(schema):
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    deep = {"type": "object", "properties": {"a": {"type": "string", "pattern": "[a-z]{1,20000}"}}}
    with pytest.raises(UserError, match=r"\$\.properties\.a\.pattern repeats a piece up to 20,000 times"):
        g.compile(fmt(deep))
    keys = {"type": "object", "patternProperties": {"^(x{1,100}){1,100}$": {"type": "integer"}}}
    with pytest.raises(UserError, match=r"patternProperties\['\^\(x\{1,100\}\)\{1,100\}\$'\] repeats"):
        g.compile(fmt(keys))
    wide = {
        "type": "object",
        "properties": {f"f{i}": {"type": "integer"} for i in range(MAX_SCHEMA_BYTES // 20)},
    }
    with pytest.raises(UserError, match="at most 131,072 compile"):
        g.compile(fmt(wide))
    many = _slow(9)["json_schema"]["schema"]  # each pattern alone is legal; 36,000 repeats in all are not
    with pytest.raises(
        UserError, match=r"repeat pieces 36,000 times in all \(up to \$\.properties\.\d\.pattern"
    ):
        g.compile(fmt(many))
    check_schema(_slow(8)["json_schema"]["schema"], "{}")  # 32,000: within the bound (seconds to compile)
    assert g.compile(fmt({"type": "string", "pattern": "[a-z]{1,40}"})) is not None


def test_a_pattern_nested_too_deep_or_counting_past_int_is_refused_not_a_crash(model_and_tokenizer):
    """The pattern scans recurse on groups and read a quantifier's digits with int(): "(" * 5,000 was a
    RecursionError and a count of 5,000 digits a ValueError (each a 500 from the server, not the 400 a
    schema it cannot take gets). Both are GrammarErrors naming the place."""
    from trtforge.llm.structured import GrammarCompiler, GrammarError

    g = GrammarCompiler(model_and_tokenizer[1], 4096)
    deep = "(" * 5000 + "a" + ")" * 5000
    for pattern, said in [
        (deep, r"\$\.properties\.a\.pattern nests groups 5,000 deep; at most 64"),
        ("a{" + "9" * 5000 + "}", r"\$\.properties\.a\.pattern repeats a piece up to 1,000,000,000 times"),
        ("(^a){1," + "9" * 5000 + "}", r"\$\.properties\.a\.pattern repeats a piece up to 1,000,000,000"),
    ]:
        schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}
        with pytest.raises(GrammarError, match=said):
            g.compile({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    nested = "(" * 64 + "a" + ")" * 64  # (within the bound)
    assert g.compile(
        {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": nested}}}
    )


def test_a_schema_nested_too_deep_is_refused_before_it_compiles(model_and_tokenizer):
    """xgrammar's compile time grows faster than a schema's depth: an array of arrays 900 deep ran past
    the 30 s timeout, holding one of the two compile threads on (the process's exit waits for it). Past
    MAX_SCHEMA_DEPTH objects and arrays it is refused at once, naming the place."""
    import time

    from trtforge.llm.structured import MAX_SCHEMA_DEPTH, GrammarCompiler, GrammarError

    def nested(depth: int) -> dict:
        schema: dict = {"type": "integer"}
        for _ in range(depth - 1):
            schema = {"type": "array", "items": schema}
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    g = GrammarCompiler(model_and_tokenizer[1], 4096)
    start = time.monotonic()
    with pytest.raises(GrammarError, match=rf"more than {MAX_SCHEMA_DEPTH} deep \(at \$\.items\.items"):
        g.compile(nested(900))
    assert time.monotonic() - start < 1
    assert g.compile(nested(32)) is not None


UNENFORCEABLE = [  # (schema, its place and keyword in the refusal, JSON the grammar let through)
    ({"type": "number", "multipleOf": 0.5}, r"\$ uses 'multipleOf' on a non-integer type", "0.3"),
    ({"type": "integer", "multipleOf": 3, "minimum": 1}, r"\$ uses 'multipleOf' with a minimum", "4"),
    (
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "a+", "maxLength": 2}}},
        r"\$\.properties\.s uses 'maxLength' with 'pattern'",
        '{"s": "aaaaa"}',
    ),
    (
        {"type": "string", "pattern": "(?!a)[ab]"},
        r"\$ uses a lookahead \(\(\?= or \(\?!\) in the pattern",
        '"a"',
    ),
    ({"not": {"type": "string"}}, r"\$ uses 'not'", '"a"'),
    ({"if": {"type": "string"}, "then": {"maxLength": 1}}, r"\$ uses 'if'/'then'/'else'", '"abc"'),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, r"\$ uses 'allOf' of 2 schemas", "0.5"),
    (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        r"\$ uses 'uniqueItems'",
        "[1, 1]",
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}},
        r"\$ uses 'dependentRequired'",
        '{"a": 1}',
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
        r"\$ uses 'required' 'b' without defining it in the same schema's 'properties'",
        '{"a": 1}',
    ),
    (
        {"type": "object", "properties": {"o": {"type": "object", "required": ["a"]}}, "required": ["o"]},
        r"\$\.properties\.o uses 'required' 'a'",
        '{"o": {}}',
    ),
    (
        {"$defs": {"n": {"type": "number", "multipleOf": 2}}, "$ref": "#/$defs/n"},
        r"\$\.\$defs\.n uses 'multipleOf'",
        "3",
    ),
    (
        {"type": "string", "pattern": "a^b"},
        r"\$ uses the anchor '\^' at character 1 of the pattern 'a\^b'",
        '"ab"',
    ),
    (
        {"type": "object", "properties": {"k": {"type": "string", "pattern": "(a$|b)c"}}},
        r"\$\.properties\.k uses the anchor '\$' at character 2 of the pattern '\(a\$\|b\)c', not at",
        '{"k": "ac"}',
    ),
    (
        {"const": 3, "type": "string"},
        r"\$ uses 'type' 'string' beside 'const' 3 \(a value it rules out\)",
        "3",
    ),
    (
        {"type": "array", "items": {"enum": ["a", 1], "type": "string"}},
        r"\$\.items uses 'type' 'string' beside 'enum' item \[1\] 1",
        "[1]",
    ),
    (
        {"enum": ["a", "abc"], "maxLength": 2},
        r"\$ uses 'maxLength' 2 beside 'enum' item \[1\] 'abc'",
        '"abc"',
    ),
    ({"const": 5, "type": "integer", "maximum": 4}, r"\$ uses 'maximum' 4 beside 'const' 5", "5"),
    (
        {"type": "object", "properties": {"code": {"const": "abc", "type": "string", "pattern": "^[0-9]+$"}}},
        r"\$\.properties\.code uses 'pattern' '\^\[0-9\]\+\$' beside 'const' 'abc' \(a value it rules out\)",
        '{"code": "abc"}',
    ),
    (
        {"enum": ["a1", "b2", "cc"], "pattern": "[0-9]"},
        r"\$ uses 'pattern' '\[0-9\]' beside 'enum' item \[2\] 'cc'",
        '"cc"',
    ),
]


@pytest.mark.parametrize(("schema", "said", "breaks_it"), UNENFORCEABLE)
def test_a_constraint_the_grammar_would_ignore_is_refused_naming_it(
    model_and_tokenizer, schema, said, breaks_it
):
    """xgrammar compiles these constraints by leaving them out (a warning on stderr at most): the JSON it
    allows breaks the schema, which "structured output" promises not to. Refused, naming the place."""
    from xgrammar.testing import _is_grammar_accept_string

    from trtforge.llm.structured import GrammarCompiler, GrammarError

    with pytest.raises(jsonschema.ValidationError):  # (the JSON the grammar let through is invalid)
        jsonschema.validate(json.loads(breaks_it), schema)
    raw = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    assert _is_grammar_accept_string(raw, breaks_it)  # (what serving it unchecked would allow)
    g = GrammarCompiler(model_and_tokenizer[1], 4096)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(GrammarError, match=rf"the schema's {said}.*cannot enforce"):
        g.compile(fmt)


def test_a_const_outside_its_own_format_is_refused_naming_it(model_and_tokenizer):
    """xgrammar serves a const or enum value as it is, leaving its schema's format out: a date field whose
    enum holds "soon" gave "soon". Judged by xgrammar's own grammar for the format's strings."""
    from xgrammar.testing import _is_grammar_accept_string

    from trtforge.llm.structured import GrammarCompiler, GrammarError

    schema = {"type": "object", "properties": {"d": {"enum": ["2024-01-02", "soon"], "format": "date"}}}
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    assert not checker.is_valid({"d": "soon"}) and checker.is_valid({"d": "2024-01-02"})
    raw = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    assert _is_grammar_accept_string(raw, '{"d": "soon"}')  # (what serving it unchecked would allow)
    g = GrammarCompiler(model_and_tokenizer[1], 4096)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(
        GrammarError,
        match=r"the schema's \$\.properties\.d uses 'format' 'date' beside 'enum' item \[1\] 'soon'",
    ):
        g.compile(fmt)


def test_a_pattern_that_backtracks_for_long_on_a_const_is_left_unjudged_in_time(monkeypatch):
    """A const is matched against its schema's pattern, which is the client's: one that backtracks on it
    for ever (nested repeats: 2^60 steps) is given up on at the check's budget, not held on (the compile's
    own bounds then apply), and the value served as it is."""
    import time

    from trtforge.llm import structured
    from trtforge.llm.structured import _StringCheck

    monkeypatch.setattr(structured, "VALUE_CHECK_S", 0.2)
    check = _StringCheck()
    start = time.monotonic()
    assert check.rules_out({"pattern": "^(a|aa)+$"}, "a" * 60 + "b") is None
    # (the module checks its clock every so many steps: a few times past its timeout on a busy machine)
    assert time.monotonic() - start < 10
    assert check.rules_out({"pattern": "^[0-9]+$"}, "abc") is None  # (the budget is spent: not judged)
    assert _StringCheck().rules_out({"pattern": "^[0-9]+$"}, "abc") == "'pattern' '^[0-9]+$'"


@pytest.mark.parametrize(
    ("schema", "said", "served"),
    [
        ({"anyOf": []}, r"\$ uses an empty 'anyOf', which no value matches", ""),
        ({"oneOf": []}, r"\$ uses an empty 'oneOf'", ""),
        ({"properties": {"a": {"type": []}}}, r"\$\.properties\.a uses an empty 'type'", '{"a": 0.5}'),
    ],
)
def test_a_schema_part_no_value_matches_is_refused(model_and_tokenizer, schema, said, served):
    """xgrammar served an empty anyOf as the empty output (no JSON at all, finish_reason "stop") and an
    empty type list as any value."""
    from xgrammar.testing import _is_grammar_accept_string

    from trtforge.llm.structured import GrammarCompiler, GrammarError

    raw = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    assert _is_grammar_accept_string(raw, served)
    g = GrammarCompiler(model_and_tokenizer[1], 4096)
    with pytest.raises(GrammarError, match=rf"the schema's {said}"):
        g.compile({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_keywords_as_data_or_enforceable_constraints_still_compile(model_and_tokenizer):
    from trtforge.llm.structured import GrammarCompiler

    g = GrammarCompiler(model_and_tokenizer[1], 4096)
    for schema in (
        {"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}}},
        {"enum": [{"not": 1}, {"allOf": [1, 2]}]},
        {"type": "integer", "multipleOf": 3},
        {"type": "string", "maxLength": 4},
        {"allOf": [{"type": "integer"}]},
        {"type": "array", "uniqueItems": False},
        {"type": "string", "pattern": r"[(?=]a\(?!"},  # in a class, escaped: no lookahead
        {"type": "string", "pattern": r"^a$|^b$|(^c|d$)|[$^]\^?"},  # anchors at an end, or literal
        {"const": 2.0, "type": "integer"},  # (2.0 is an integer)
        {"enum": ["a", None], "type": ["string", "null"], "maxLength": 1},
        {"const": "abc", "pattern": "b"},  # (JSON Schema's pattern matches anywhere in the string)
        {"enum": ["x1", 5], "pattern": "^x"},  # (a pattern says nothing of a number)
        {"const": "2024-02-29", "format": "date"},
        {"const": "anything", "format": "idn-email"},  # (a format xgrammar does not restrict: not judged)
    ):
        assert g.compile({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}) is not None


@pytest.mark.parametrize(
    ("pattern", "found"),
    [
        ("^ab$", None),
        ("^a|^b", None),
        ("(^a)?b", None),
        ("^(?:a|b)+$", None),
        ("(^a|^b)(c$|d$)", None),
        (r"[$^]\^\$", None),
        ("a^b", (1, "^")),
        ("a$b", (1, "$")),
        ("$a", (0, "$")),
        ("x(a|^b)", (4, "^")),
        ("a?^b", (2, "^")),
        ("(^a)*", (1, "^")),
        ("(a$){1,3}", (2, "$")),
    ],
)
def test_an_anchor_is_misplaced_unless_at_an_end_of_the_pattern(pattern, found):
    """xgrammar matches a pattern against the whole string and drops its anchors: one that only an end of
    the match can satisfy changes nothing; any other one (``a^b`` matches no string) it leaves out."""
    from trtforge.llm.structured import misplaced_anchor

    assert misplaced_anchor(pattern) == found


def test_a_slow_compile_times_out_and_the_cache_stays_bounded(model_and_tokenizer, monkeypatch):
    from trtforge.llm import structured

    monkeypatch.setattr(structured, "CACHE_SIZE", 2)
    g = structured.GrammarCompiler(model_and_tokenizer[1], 4096, timeout_s=0.001)
    slow = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a{1,4000}"}},
    }
    with pytest.raises(UserError, match="did not compile to a grammar within 0.001 s"):
        g.compile(slow)
    g.timeout_s = 60.0
    assert g.compile(slow) is not None  # the compile went on: the next request finds it
    for n in range(4):
        g.compile(
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": n + 1}},
            }
        )
    assert len(g._cache) <= 2


def _slow(n_patterns: int, tag: str = "") -> dict:
    """A legal schema of `n_patterns` 4,000-repeat patterns: about a second each to compile here."""
    props = {f"{tag}{i}": {"type": "string", "pattern": "[a-z]{1,4000}"} for i in range(n_patterns)}
    schema = {"type": "object", "properties": props}
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_a_process_ending_while_a_compile_runs_exits_with_its_code(tmp_path):
    """The compile threads are not daemons: one returning to Python while the interpreter finalizes
    aborts the process (exit 134, "terminate called without an active exception"), so the exit waits
    for a compile already running, after close() has cancelled the queued ones."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "exit.py"
    script.write_text(
        "import threading, time\n"
        "from transformers import AutoTokenizer\n"
        "from tests.llm.test_structured import _slow\n"
        "from trtforge.llm.structured import GrammarCompiler, GrammarError\n"
        f"g = GrammarCompiler(AutoTokenizer.from_pretrained({str(MODEL)!r}), 4096)\n"
        "def wait():\n"
        "    try:\n"
        "        g.compile(_slow(1))\n"
        "    except GrammarError as e:\n"
        "        print(e, flush=True)\n"
        "t = threading.Thread(target=wait)\n"
        "t.start()\n"
        "time.sleep(0.3)\n"
        "g.close()\n"
        "t.join()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, str(script)], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "shut down before this schema compiled" in r.stdout, r.stdout


def test_close_ends_every_wait_cancels_the_queued_and_refuses_later_compiles(model_and_tokenizer):
    """Two compiles run (two worker threads) and two are queued: close() ends all four waits at once,
    the queued two never run, and a later compile is refused."""
    import threading
    import time

    from trtforge.llm.structured import COMPILE_WORKERS, GrammarCompiler, GrammarError

    g = GrammarCompiler(model_and_tokenizer[1], 4096, timeout_s=120)
    ran: list[str] = []
    compile_now = g._compile_now

    def counting(key: str):
        ran.append(key)
        return compile_now(key)

    g._compile_now = counting
    errors: list[BaseException] = []

    def wait(fmt: dict) -> None:
        try:
            g.compile(fmt)
        except BaseException as exc:
            errors.append(exc)

    waiters = [threading.Thread(target=wait, args=(_slow(2, tag),)) for tag in "abcd"]
    for t in waiters:
        t.start()
    time.sleep(0.5)
    start = time.monotonic()
    g.close()
    for t in waiters:
        t.join(10)
    assert time.monotonic() - start < 1.0 and not any(t.is_alive() for t in waiters)
    assert len(errors) == 4 and all(isinstance(e, GrammarError) for e in errors), errors
    assert all("shut down" in str(e) for e in errors), errors
    with pytest.raises(GrammarError, match="shut down"):
        g.compile({"type": "json_object"})
    g.close()  # idempotent
    g._pool.shutdown(wait=True)  # the running compiles end on their own
    assert len(ran) == COMPILE_WORKERS, ran


def test_closing_the_engine_ends_a_compile_wait(model_and_tokenizer):
    """A server thread waiting on hold_response_format is released when the engine closes."""
    import threading
    import time

    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model, tok = model_and_tokenizer
    eng = LLMEngine(TorchExecutor(model, num_blocks=16, block_size=16))
    eng.enable_structured_output(tok)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            eng.hold_response_format(_slow(4, "e"))
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    start = time.monotonic()
    eng.close()
    waiter.join(10)
    assert time.monotonic() - start < 1.0 and len(errors) == 1, errors
    assert isinstance(errors[0], UserError) and "shut down" in str(errors[0])


def _string_schema(n: int) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": n}}}


def test_a_held_schema_stays_cached_past_evictions_until_let_go(model_and_tokenizer, monkeypatch):
    """A server holds a request's schema from its compile to its submission: other clients' schemas
    evicting it between made the submission compile it again under the engine's lock."""
    from trtforge.llm import structured

    monkeypatch.setattr(structured, "CACHE_SIZE", 1)
    g = structured.GrammarCompiler(model_and_tokenizer[1], 4096)
    compiles: list[str] = []
    compile_now = g._compile_now
    monkeypatch.setattr(g, "_compile_now", lambda key: compiles.append(key) or compile_now(key))
    held = _string_schema(1)
    release = g.hold(held)
    for n in range(2, 6):  # four other schemas through a cache of one
        g.compile(_string_schema(n))
    before = len(compiles)
    assert g.matcher(held) is not None and len(compiles) == before, "the held grammar was compiled again"
    release()
    release()  # a second call lets go of nothing more
    assert not g._held
    g.compile(_string_schema(7))
    g.compile(_string_schema(8))
    g.matcher(held)
    assert len(compiles) == before + 3, "let go, it is evicted as any other"


def test_a_schema_that_fails_to_compile_is_not_held(model_and_tokenizer):
    from trtforge.llm import structured

    g = structured.GrammarCompiler(model_and_tokenizer[1], 4096)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    with pytest.raises(UserError, match="response_format"):
        g.hold(bad)
    assert not g._held


def test_a_request_cancelled_during_its_compile_lets_the_grammar_go():
    """The server's hold is let go when its request is cancelled (the client left) mid-compile."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from trtforge.llm.server import app

    started, finish, released = threading.Event(), threading.Event(), threading.Event()

    def hold(fmt):
        started.set()
        finish.wait(10)
        return released.set

    pool = ThreadPoolExecutor(1)
    state = SimpleNamespace(compile_pool=pool, engine=SimpleNamespace(hold_response_format=hold))

    async def main() -> None:
        task = asyncio.ensure_future(app._hold_grammar(state, {"type": "json_object"}))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not released.is_set()
    finish.set()
    assert released.wait(10), "the hold taken for a cancelled request was never let go"
    pool.shutdown()


def _word_level_tokenizer():
    """A word-level tokenizer of 18 tokens with no ``{``: no output of it is JSON."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["the", "a", "def", "class", "x", "y", "z", "=", "(", ")", ":", "if", "for", "in", "return"]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_grammar_the_vocabulary_cannot_spell_fails_its_request_only(async_scheduling, temperature):
    """A json_object grammar over a vocabulary without ``{`` allows no first token: the request ends with
    a GrammarError saying so, the others of its step finish, and the engine serves on. Before, the
    matcher's refusal of the token drawn from an all-masked row stopped the engine's loop (a server's
    every request then got 503 "shutting down")."""
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.engine import LLMEngine
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.sched.scheduler import SchedulerConfig
    from trtforge.llm.structured import GrammarError

    config = SchedulerConfig(max_num_seqs=4, async_scheduling=async_scheduling)
    eng = LLMEngine(TorchExecutor(tiny_model("llama"), num_blocks=16, block_size=16), config)
    try:
        eng.enable_structured_output(_word_level_tokenizer())
        json_object = {"type": "json_object"}
        params = [
            SamplingParams(response_format=json_object, max_tokens=5, temperature=temperature, seed=1),
            SamplingParams(max_tokens=5, ignore_eos=True),
        ]
        bad, good = eng.generate([[1, 5, 6], [1, 5, 6]], params)
        assert bad.finish_reason == "error" and isinstance(bad.error, GrammarError), bad
        assert "cannot spell" in str(bad.error) and str(bad.error).startswith("response_format: ")
        assert good.error is None and len(good.token_ids) == 5
        again = eng.generate([[7, 8]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
        assert again.error is None and len(again.token_ids) == 3
        assert eng.memory_stats().used_blocks == 0
    finally:
        eng.close()
