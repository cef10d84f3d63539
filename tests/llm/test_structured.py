"""Structured output: the trained code model, constrained by a JSON schema's grammar, writes valid JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trtforge.errors import UserError
from trtforge.llm.sampling import SamplingParams, sample

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

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(MODEL)


def _generate(model, tok, prompts, params, max_new=120):
    """A plain batched decode loop (full recompute per step) through the batched sampler with grammars."""
    from trtforge.llm.penalties import RowHistory
    from trtforge.llm.structured import GrammarCompiler, batch_bitmask

    vocab = model.config.vocab_size
    compiler = GrammarCompiler(tok, vocab)
    matchers = [compiler.matcher(p.response_format) if p.response_format else None for p in params]
    gens = [p.make_generator(0) for p in params]
    prompt_ids = [tok(t)["input_ids"] for t in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_new):
        live = [i for i in range(len(prompts)) if not done[i]]
        if not live:
            break
        logits = []
        with torch.no_grad():
            for i in live:
                ids = torch.tensor([prompt_ids[i] + outs[i]])
                logits.append(model(ids).logits[0, -1])
        batch = torch.stack(logits)
        mask = batch_bitmask([matchers[i] for i in live], vocab)
        hist = [RowHistory(prompt_ids[i], outs[i]) for i in live]
        tokens = sample(batch, [params[i] for i in live], [gens[i] for i in live], hist, mask)
        for i, t in zip(live, tokens.tolist()):
            if matchers[i] is not None:
                matchers[i].accept(t)
            if t == tok.eos_token_id or (matchers[i] is not None and matchers[i].is_terminated):
                done[i] = True
            else:
                outs[i].append(t)
    return [tok.decode(o, skip_special_tokens=True) for o in outs], done


def test_schema_constrained_output_validates(model_and_tokenizer):
    model, tok = model_and_tokenizer
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
    params = [
        SamplingParams(response_format=fmt),
        SamplingParams(response_format=fmt, temperature=0.9, seed=4, presence_penalty=0.5),
        SamplingParams(response_format={"type": "json_object"}, temperature=0.7, seed=1),
        SamplingParams(),  # an unconstrained neighbour in the same batch
    ]
    texts, done = _generate(model, tok, ["def f(x):\n    return"] * 3 + ["import os\n"], params)
    for text, finished in zip(texts[:2], done[:2]):
        assert finished, f"the grammar did not complete within the budget: {text!r}"
        jsonschema.validate(json.loads(text), SCHEMA)
    assert done[2] and isinstance(json.loads(texts[2]), dict)
    with pytest.raises(json.JSONDecodeError):
        json.loads(texts[3])  # the unconstrained code model writes code, not JSON


def test_a_schema_the_grammar_cannot_compile_is_a_user_error(model_and_tokenizer):
    from trtforge.llm.structured import GrammarCompiler

    _, tok = model_and_tokenizer
    compiler = GrammarCompiler(tok, len(tok))
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}}
    with pytest.raises(UserError, match="response_format"):
        compiler.matcher(bad)


def test_bitmask_rows_without_a_grammar_allow_everything(model_and_tokenizer):
    from trtforge.llm.structured import GrammarCompiler, batch_bitmask

    _, tok = model_and_tokenizer
    m = GrammarCompiler(tok, 4096).matcher({"type": "json_object"})
    mask = batch_bitmask([None, m], 4096)
    assert (mask[0] == -1).all()
    allowed = np.unpackbits(mask[1].view(np.uint8), bitorder="little")[:4096].astype(bool)
    assert 0 < allowed.sum() < 4096
    assert batch_bitmask([None, None], 4096) is None
