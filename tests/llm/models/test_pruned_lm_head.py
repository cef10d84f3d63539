"""An LM head pruned to a prefix of the vocabulary (Apertus 1.5's ``output_vocab_size``): the logits are
as wide as the head's rows (the facts' and the spec's ``vocab_size``) while prompts may hold any id the
embedding takes (``input_vocab_size``). The torch executor and the step graph in ONNX Runtime give
transformers' greedy tokens; prompt ids, logit_bias ids, EOS ids and penalties each meet their own range."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch

import trtforge.llm
import trtforge.llm.api
from tests.llm.tiny_models import hf_greedy, prompts, tiny_model
from trtforge.errors import UserError
from trtforge.llm import service
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.base import eos_token_ids
from trtforge.llm.models.families import adapter_for
from trtforge.llm.penalties import RowHistory, apply_penalties
from trtforge.llm.sampling import SamplingParams

VOCAB, HEAD = 300, 200  # (tiny_models' vocabulary; the head keeps its first 200 rows)
NEW_TOKENS = 12


def _batch() -> list[list[int]]:
    """Prompts over the whole input vocabulary, one id past the head's rows in each for certain."""
    batch = prompts(VOCAB, lens=(7, 3, 12))
    for b, row in enumerate(batch):
        row[len(row) // 2] = HEAD + 17 * b
    return batch


def test_the_torch_executor_serves_a_pruned_head_as_transformers_generates():
    model = tiny_model("apertus1p5_text", output_vocab_size=HEAD)
    assert model.lm_head.out_features == HEAD and model.model.embed_tokens.num_embeddings == VOCAB
    spec = adapter_for(model, "the torch executor").spec
    assert (spec.vocab_size, spec.input_vocab_size) == (HEAD, VOCAB)
    ex = TorchExecutor(model, num_blocks=8, block_size=4)
    ids = [5, HEAD + 40, VOCAB - 1, 9]  # (ids past the head embed like any other)
    batch = StepBatch.build(["s"], [ids], [0], [[3, 1]], [[12, 13, 14, 15]], [True])
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].float()
    got = ex.step(batch)[0]
    assert got.shape == (HEAD,)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with service.from_pretrained(model, num_blocks=32, block_size=4, max_model_len=64) as served:
        facts = served.executor.facts
        assert (facts.vocab_size, facts.input_vocab_size) == (HEAD, VOCAB)
        batch = _batch()
        got_tokens = served.generate(batch, max_new_tokens=NEW_TOKENS, stop_at_eos=False)
        for b, prompt in enumerate(batch):
            want_tokens, want_logits = hf_greedy(model, prompt, NEW_TOKENS)
            assert want_logits.shape[1] == HEAD and len(set(want_tokens)) > 3, want_tokens
            assert got_tokens[b] == want_tokens, f"row {b}"


def test_prompt_ids_meet_the_input_vocabulary_and_bias_ids_the_logits_width():
    """An id in [HEAD, VOCAB) embeds; one at VOCAB is refused naming the vocabulary, a logit_bias id at
    HEAD naming the logits' width; a repetition penalty over a prompt id past the head runs."""
    model = tiny_model("apertus1p5_text", output_vocab_size=HEAD)
    with service.from_pretrained(model, num_blocks=16, block_size=4, max_model_len=32) as served:
        assert len(served.generate([[1, VOCAB - 1]], max_new_tokens=2)[0]) >= 1
        with pytest.raises(UserError, match=rf"token id {VOCAB} is outside the vocabulary \[0, {VOCAB}\)"):
            served.generate([[1, VOCAB]], max_new_tokens=2)
        biased = SamplingParams(max_tokens=2, ignore_eos=True, logit_bias={HEAD: 1.0})
        with pytest.raises(UserError, match=rf"logit_bias holds token id {HEAD}, outside the model's logits"):
            served.generate([[1, 2]], biased)
        ok = SamplingParams(max_tokens=3, ignore_eos=True, logit_bias={HEAD - 1: 100.0})
        assert served.generate([[1, 2]], ok) == [[HEAD - 1] * 3]
        penalized = SamplingParams(max_tokens=3, ignore_eos=True, repetition_penalty=1.5)
        assert len(served.generate([[HEAD + 5, 7]], penalized)[0]) == 3


def test_a_prompt_id_past_the_logits_width_has_no_logit_to_penalize():
    """Repetition penalties skip it instead of counting it into the next row's logits."""
    logits = np.ones((2, 4), np.float32)
    history = [RowHistory(prompt=[4, 5, 1], output=[]), RowHistory(prompt=[2], output=[])]
    out = apply_penalties(logits, [SamplingParams(repetition_penalty=2.0)] * 2, history)
    assert out.tolist() == [[1, 0.5, 1, 1], [1, 1, 0.5, 1]]  # (4 and 5 past the width: nothing of row 1)


def test_the_server_checks_prompt_ids_against_the_input_vocabulary_and_bias_ids_against_the_logits():
    pytest.importorskip("fastapi", reason="the server needs the `serve` extra")
    from trtforge.llm.server.app import _check_request, _check_vocab
    from trtforge.llm.server.protocol import ApiError, CompletionRequest, parse

    state = SimpleNamespace(max_model_len=64, vocab_size=HEAD, input_vocab_size=VOCAB, structured_error=None)
    _check_vocab(state, [1, VOCAB - 1], "prompt")
    with pytest.raises(ApiError, match=rf"prompt: token id {VOCAB} is outside the vocabulary \[0, {VOCAB}\)"):
        _check_vocab(state, [1, VOCAB], "prompt")
    body = {"model": "m", "prompt": [[1, 2]], "max_tokens": 2, "logit_bias": {str(HEAD): 1.0}}
    with pytest.raises(
        ApiError, match=rf"logit_bias: token id {HEAD} is outside the model's vocabulary \[0, {HEAD}\)"
    ):
        _check_request(state, parse(CompletionRequest, json.dumps(body).encode()), None)


def test_an_eos_id_past_the_head_is_dropped_from_the_stop_ids():
    """The head can never emit it, so it is no stop id (one kept would never fire); those below stay."""
    model = tiny_model("apertus1p5_text", output_vocab_size=HEAD, eos_token_id=[2, HEAD + 1])
    model.generation_config.eos_token_id = [HEAD + 2, 3]
    assert eos_token_ids(model) == [2, 3]
    assert adapter_for(model).spec.eos_token_ids == [2, 3]
    with service.from_pretrained(model, num_blocks=8, block_size=4, max_model_len=32) as served:
        assert served.eos_token_ids == [2, 3]


def test_the_step_graph_of_a_pruned_head_gives_transformers_greedy_tokens(tmp_path):
    """The legacy exporter (a squared-ReLU MLP: the legacy exporter has no symbolic for xIELU's expm1)."""
    model = tiny_model("apertus1p5_text", output_vocab_size=HEAD, hidden_act="relu2")
    result = export_step(model, max_seq=48, max_batch=4, max_prefill=24, exporter="legacy", workdir=tmp_path)
    g = result.generation
    assert (g["vocab_size"], g["input_vocab_size"]) == (HEAD, VOCAB)
    path = tmp_path / "step.onnx"
    onnx.save(result.model, str(path))
    llm = trtforge.llm.api.load(path)
    batch = _batch()
    got, got_logits = llm.generate(batch, max_new_tokens=NEW_TOKENS, stop_at_eos=False, return_logits=True)
    for b, prompt in enumerate(batch):
        want, want_logits = hf_greedy(model, prompt, NEW_TOKENS)
        assert len(set(want)) > 3, f"degenerate reference output {want}"
        assert got[b] == want, f"row {b}"
        assert got_logits[b].shape[-1] == HEAD
        assert np.abs(got_logits[b] - want_logits.numpy()).max() <= 1e-4
    with pytest.raises(UserError, match=rf"prompt 0 holds token ids \[{VOCAB}\] outside the vocabulary"):
        llm.generate([[1, VOCAB]], max_new_tokens=2)
    with trtforge.llm.load(path) as served:  # the same graph behind the engine (ONNX Runtime executor)
        assert (served.executor.facts.vocab_size, served.executor.facts.input_vocab_size) == (HEAD, VOCAB)
        assert served.generate(batch, max_new_tokens=NEW_TOKENS, stop_at_eos=False) == got


@pytest.mark.gpu
def test_gpu_a_pruned_head_decodes_in_cuda_graphs_as_eager_steps():
    """On CUDA the narrower logits run through captured decode graphs (static logits buffers as wide as
    the head) and give the eager steps' tokens and transformers' greedy tokens."""
    from tests.llm.serving_models import run_to_completion
    from trtforge.llm.engine import make_step_loop

    model = tiny_model("apertus1p5_text", output_vocab_size=HEAD).double()
    batch = _batch()
    wants = [hf_greedy(model, prompt, NEW_TOKENS)[0] for prompt in batch]  # (on the CPU, before the move)
    model = model.to("cuda")
    outs, graphs = [], 0
    for static in (False, True):
        ex = TorchExecutor(model, num_blocks=64, block_size=16, static_decode=static)
        assert ex.facts.vocab_size == HEAD and ex.facts.input_vocab_size == VOCAB
        sched = make_step_loop(ex)
        for i, prompt in enumerate(batch):
            sched.add_request(i, prompt, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
        outs.append({k: v.output_token_ids for k, v in run_to_completion(sched).items()})
        graphs = ex.num_cuda_graphs
    assert outs[0] == outs[1] and graphs > 0
    assert [list(outs[1][i]) for i in range(len(batch))] == wants


def test_step_graph_metadata_names_a_narrower_input_vocabulary_than_its_logits():
    """A graph's input vocabulary falls back to its logits' width when the key is absent (graphs written
    before it) and a tampered one below that width is refused by name, not left to fail in a kernel."""
    from trtforge.llm import contract

    assert contract.input_vocab_size({"vocab_size": HEAD}) == HEAD
    assert contract.input_vocab_size({"vocab_size": HEAD, "input_vocab_size": VOCAB}) == VOCAB
    with pytest.raises(UserError, match=rf"input_vocab_size {HEAD - 1} below its vocab_size {HEAD}"):
        contract.input_vocab_size({"vocab_size": HEAD, "input_vocab_size": HEAD - 1})
