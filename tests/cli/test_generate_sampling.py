"""`trtforge generate` sampling options: --n, --logprobs, the penalties, --min-p, --logit-bias,
--json-schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_generate_cmd import _graph
from trtforge.cli.main import main

MODEL = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "code-llama-21m"
BASE = ["--prompt-ids", "9 8 7", "--prompt-ids", "4 5", "--max-tokens", "10", "--ignore-eos"]


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    return _graph(tmp_path_factory.mktemp("gen"), cache_layout="paged", block_size=8)


def _run(capsys, *argv):
    assert main(["generate", *argv]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return out.out.splitlines()


def _ids(lines):
    return [[int(t) for t in line.split()] for line in lines]


def test_n_prints_n_reproducible_samples_per_prompt(paged, capsys):
    sampling = ["--temperature", "1.0", "--seed", "3"]
    two = _ids(_run(capsys, paged, *BASE, *sampling, "--n", "2"))
    assert len(two) == 4 and two[0] != two[1] and two[2] != two[3]
    assert _ids(_run(capsys, paged, *BASE, *sampling, "--n", "2")) == two
    one = _ids(_run(capsys, paged, *BASE, *sampling))
    assert one == [two[0], two[2]]  # sample 0 is the n=1 request


def test_penalties_change_greedy_output_alike_on_numpy_and_torch_logits(paged, capsys):
    plain = _ids(_run(capsys, paged, *BASE))
    opts = ["--repetition-penalty", "3.0", "--frequency-penalty", "1.0", "--presence-penalty", "0.5"]
    onnx = _ids(_run(capsys, paged, *BASE, *opts))
    torch_out = _ids(_run(capsys, "tests.llm.tiny_models:llama_factory", *BASE, *opts, "--num-blocks", "16"))
    assert onnx == torch_out != plain
    assert all(len(set(row)) >= len(set(p)) for row, p in zip(onnx, plain))


def test_logprobs_lines_follow_each_output(paged, capsys):
    lines = _run(
        capsys, paged, *BASE, "--logprobs", "3", "--min-p", "0.1", "--temperature", "0.8", "--seed", "1"
    )
    assert len(lines) == 4
    for tokens, js in zip(_ids(lines[0::2]), lines[1::2]):
        rows = json.loads(js)["logprobs"]
        assert [r["token"] for r in rows] == tokens
        for r in rows:
            tops = [lp for _, lp in r["top"]]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True) and r["logprob"] <= 0
            assert r["logprob"] <= tops[0] + 1e-9 and r["rank"] >= 1


def test_logit_bias_bans_and_forces_alike_on_numpy_and_torch_logits(paged, capsys):
    plain = _ids(_run(capsys, paged, *BASE))
    ban = [f"--logit-bias={plain[0][0]}=-100", "--logit-bias", f"{plain[1][0]}=-100"]
    banned = _ids(_run(capsys, paged, *BASE, *ban))
    assert banned[0][0] != plain[0][0] and banned[1][0] != plain[1][0]
    assert plain[0][0] not in banned[0] and plain[1][0] not in banned[1]
    torch_out = _ids(_run(capsys, "tests.llm.tiny_models:llama_factory", *BASE, *ban, "--num-blocks", "16"))
    assert torch_out == banned
    forced = _ids(_run(capsys, paged, *BASE, "--logit-bias", "123=100", "--temperature", "1", "--seed", "2"))
    assert forced == [[123] * 10, [123] * 10]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--logit-bias", "13"], "Invalid value for '--logit-bias': '13': expected ID=BIAS"),
        (["--logit-bias", "x=1"], "'x=1': expected ID=BIAS, a token id >= 0 and a number in [-100, 100]"),
        (["--logit-bias", "-1=1"], "'-1=1': expected ID=BIAS"),
        (["--logit-bias", "13=abc"], "'13=abc': expected ID=BIAS"),
        (["--logit-bias", "13=101"], "'13=101': expected ID=BIAS"),
        (["--logit-bias", "13=nan"], "'13=nan': expected ID=BIAS"),
        (["--logit-bias", "13=1", "--logit-bias", "13=2"], "token 13 is biased twice"),
        (["--logit-bias", "300=1"], "--logit-bias: token id 300 is outside the model's vocabulary of 300"),
        (["--min-p", "2"], "--min-p must be a number in [0, 1]"),
        (["--n", "0"], "--n 0: expected 1 to 65,536 samples per prompt"),
        (["--logprobs", "50"], "--logprobs must be an integer in [0, 20]"),  # (not "None or": a flag)
        (["--seed", str(2**63)], "--seed must be an integer in [-9,223,372,036,854,775,808, 9,223,372"),
        (["--repetition-penalty", "0"], "--repetition-penalty must be a finite number > 0"),
        (["--presence-penalty", "3"], "--presence-penalty must be a number in [-2, 2]"),
        (["--json-schema", "/nonexistent/s.json"], "--json-schema"),
    ],
)
def test_bad_sampling_options_exit_2_naming_them(paged, capsys, argv, message):
    assert main(["generate", paged, "--prompt-ids", "1 2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_json_schema_needs_a_tokenizer_and_a_json_file(paged, tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object"}')
    assert main(["generate", paged, "--prompt-ids", "1 2", "--json-schema", str(schema)]) == 2
    assert "tokenizer" in capsys.readouterr().err
    schema.write_text("{not json")
    assert main(["generate", paged, "--prompt-ids", "1 2", "--json-schema", str(schema)]) == 2
    assert "not a JSON file" in capsys.readouterr().err


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_json_schema_output_validates_with_the_trained_model(tmp_path, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar", reason="--json-schema needs the `structured` extra (xgrammar)")
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["id", "ok"],
        "additionalProperties": False,
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    m = str(MODEL)
    argv = ["generate", m, "--prompt", "x = ", "--tokenizer", m, "--json-schema", str(path), "--max-tokens"]
    assert main([*argv, "60"]) == 0
    out = capsys.readouterr()
    jsonschema.validate(json.loads(out.out.splitlines()[0]), schema)
    assert "incomplete JSON" not in out.err
    assert main([*argv, "3"]) == 0
    out = capsys.readouterr()
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.out.splitlines()[0])  # three tokens of the object: cut mid-value
    assert "note: output 1 is incomplete JSON: --max-tokens 3 ran out before the schema's value" in out.err


def test_a_negative_seed_is_an_int64_seed_as_the_server_takes_it(paged, capsys):
    """--seed takes any int64, as the server's "seed" (OpenAI's, vLLM's) does; before, -1 was refused here
    and served there. Every int64 is its own stream: -1 is not 2**63 - 1."""
    sampling = ["--temperature", "1.0", "--n", "2"]
    minus = _ids(_run(capsys, paged, *BASE, *sampling, "--seed", "-1"))
    assert _ids(_run(capsys, paged, *BASE, *sampling, "--seed", "-1")) == minus
    assert _ids(_run(capsys, paged, *BASE, *sampling, "--seed", str(2**63 - 1))) != minus
    assert main(["generate", paged, *BASE, "--seed", str(-(2**63) - 1)]) == 2
    assert "--seed must be an integer in [-9,223,372,036,854,775,808" in capsys.readouterr().err


def test_the_server_samples_choices_with_the_seeds_generate_n_gives_its_samples():
    """One rule for sample i's seed: a request's n choices draw what ``generate --n`` draws for the same
    seed (before: the server used seed + i, generate child_seed(seed, i))."""
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.server.protocol import CompletionRequest, parse, sampling_params

    for seed in (-1, 0, 7, 2**63 - 1, -(2**63)):
        body = {"model": "m", "prompt": "x", "n": 3, "temperature": 1, "seed": seed}
        req = parse(CompletionRequest, json.dumps(body).encode())
        served = [sampling_params(req, 4, None, j).seed for j in range(3)]
        cli = [p.seed for p in SamplingParams(max_tokens=4, temperature=1, seed=seed, n=3).expand()]
        assert served == cli, seed
