"""`trtforge serve --speculative-method draft`: plain greedy's text, acceptance in /metrics and /v1/models."""

from __future__ import annotations

import pytest

from tests.llm.server.harness import MODEL, Server, need_model

PROMPT = "def read_json(path):\n    with open(path) as f:\n        return json.load(f)\n\n\ndef read_"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = need_model()
    tmp = tmp_path_factory.mktemp("serve-spec")
    args = ["--num-blocks", "256", "--device", "cpu", "--dtype", "float32", "--num-speculative-tokens", "3"]
    args += ["--speculative-method", "draft", "--speculative-model", str(MODEL.parent / "code-llama-3m")]
    s = Server(str(model), args, tmp / "spec.log")
    yield s
    assert s.stop() == 0, s.log()
    assert "Traceback" not in s.log(), s.log()


def _plain_greedy(max_tokens: int) -> str:
    import torch
    from transformers import AutoTokenizer

    from trtforge.llm import SamplingParams, from_pretrained

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    with from_pretrained(str(MODEL), num_blocks=64, device="cpu", dtype=torch.float32) as llm:
        out = llm.generate([tok(PROMPT)["input_ids"]], params)[0]
    return tok.decode(out, skip_special_tokens=True)


def test_speculative_server_matches_plain_greedy_and_reports_acceptance(server):
    import httpx

    body = {
        "model": "code-llama-21m",
        "prompt": PROMPT,
        "max_tokens": 32,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert r["choices"][0]["text"] == _plain_greedy(32)
    model = httpx.get(server.url + "/v1/models").json()["data"][0]
    draft = str(MODEL.parent / "code-llama-3m")
    assert model["speculative"] == {"method": "draft", "num_tokens": 3, "model": draft}
    m = server.wait_blocks_free()
    drafted = m["trtforge_spec_decode_num_draft_tokens_total"]
    assert 0 < m["trtforge_spec_decode_num_accepted_tokens_total"] <= drafted
    assert 0 < m["trtforge_spec_decode_acceptance_rate"] <= 1
    accepted = m["trtforge_spec_decode_num_accepted_tokens_total"]
    assert m["trtforge_spec_decode_acceptance_rate"] == pytest.approx(accepted / drafted)


def test_a_stop_string_counts_the_tokens_up_to_it_as_plain_decoding_does(server):
    """A verify step accepts several tokens at once and may run past a stop string; before, usage
    counted them all (a request reported one or more tokens more with a draft than without, and its
    logprobs ran past the stop). Now both count the tokens up to the one completing the stop."""
    import httpx
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    text = _plain_greedy(40)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for stop in {text[a : a + 3] for a in range(5, len(text) - 3, 7)}:
        cut = text[: text.index(stop)]
        need = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
        body = {"model": "code-llama-21m", "prompt": PROMPT, "max_tokens": 40, "temperature": 0}
        body |= {"ignore_eos": True, "stop": stop, "logprobs": 0}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        choice = r["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (cut, "stop"), stop
        assert r["usage"]["completion_tokens"] == need == len(choice["logprobs"]["tokens"]), stop
    server.wait_blocks_free()
