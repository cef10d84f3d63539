"""Speculative decoding end to end on the trained 21M target (3M draft): exact greedy output with
continuous batching and preemption, an exact pool after rollback, reproducible seeds, the option's errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtforge.errors import UserError
from trtforge.llm.engine import LLMEngine
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig
from trtforge.llm.service import from_pretrained, make_proposer
from trtforge.llm.spec.config import SpeculativeConfig

MODELS = Path(__file__).resolve().parents[3] / ".." / "shared" / "models"
TARGET, DRAFT = MODELS / "code-llama-21m", MODELS / "code-llama-3m"
needs_models = pytest.mark.skipif(
    not (TARGET.is_dir() and DRAFT.is_dir()), reason=f"the trained models in {MODELS} are absent"
)
CONFIG = SchedulerConfig(max_num_seqs=4, max_prefill_chunk=64, async_scheduling=False)
NUM_BLOCKS = 20  # 320 slots for 4 sequences of up to 150 tokens: preemption is certain


def _executor(static_decode: bool | None = None):
    import torch

    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.loader import load_causal_lm

    return TorchExecutor(
        load_causal_lm(str(TARGET)), num_blocks=NUM_BLOCKS, dtype=torch.float32, static_decode=static_decode
    )


@pytest.fixture(scope="module")
def workload():
    """Seven prompts cut from the held-out code, with their params, and the plain engine's completions.
    Prompt 2 asks for logprobs (it decodes plainly beside the speculating rows), prompt 4 stops at
    ")" (a stop inside accepted proposals drops the rest), prompt 5 samples (not compared: its draws
    differ with speculation, but it shares the steps)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    text = (MODELS / "eval_stdlib.txt").read_text(encoding="utf-8")[:120_000]
    ids = tok(text)["input_ids"]
    prompts = [ids[3000 * i : 3000 * i + 40 + 12 * i] for i in range(7)]
    params = [SamplingParams(max_tokens=24 + 4 * i, ignore_eos=True) for i in range(7)]
    params[2] = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=0)
    params[4] = SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=[tok.encode(")")[0]])
    params[5] = SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.8, seed=5)
    with LLMEngine(_executor(), CONFIG) as engine:
        done = engine.generate(prompts, params)
        assert engine.stats.preemptions > 0
    assert done[4].finish_reason == "stop" and len(done[4].token_ids) < 40
    return prompts, params, [c.token_ids for c in done]


@needs_models
@pytest.mark.parametrize(
    "spec",
    [{"method": "ngram", "num_tokens": 4}, {"method": "draft", "model": str(DRAFT), "num_tokens": 3}],
    ids=["ngram", "draft"],
)
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_greedy_speculation_is_token_identical_with_batching_and_preemption(workload, spec, static):
    """`static`: verification steps run on the static decode path (padded to their longest run, the
    decode attention with that query length), as on CUDA, and the draft's steps too."""
    prompts, params, plain = workload
    seen = {"mixed": False, "static_verify": 0}

    def hook(sched, batch):
        sched.block_manager.check_invariants()
        multi = len(batch.logits_indices) > batch.num_seqs  # some sequence verifies proposals
        if multi and (batch.query_lens == 1).any():
            seen["mixed"] = True  # ... in the same step as a plain decode
        if multi and executor.path_of(batch) == "decode":
            seen["static_verify"] += 1

    executor = _executor(static)
    proposer = make_proposer(SpeculativeConfig.of(spec), executor)
    with LLMEngine(executor, CONFIG, step_hook=hook, proposer=proposer) as engine:
        got = [c.token_ids for c in engine.generate(prompts, params)]
        stats = engine.stats
        mem = engine.memory_stats()
    assert got[:5] + got[6:] == plain[:5] + plain[6:]
    assert len(got[5]) == 30
    assert stats.preemptions > 0 and seen["mixed"]
    assert (seen["static_verify"] > 0) == static
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    assert stats.spec_mean_accepted_length > 1.0
    assert mem.free_blocks == mem.total_blocks  # every rolled-back and finished block is back
    if spec["method"] == "draft":
        # on the static path the draft's further steps ran chained (DraftModelProposer.chain)
        assert (proposer.chain_steps > 0) == static
        assert proposer.blocks.num_free_blocks == proposer.blocks.num_blocks
        proposer.blocks.check_invariants()


@needs_models
def test_a_cancelled_speculating_request_returns_every_block(workload):
    executor = _executor()
    spec = SpeculativeConfig.of({"method": "draft", "model": str(DRAFT), "num_tokens": 4})
    proposer = make_proposer(spec, executor)
    with LLMEngine(executor, CONFIG, proposer=proposer) as engine:
        other = engine.submit(workload[0][1], SamplingParams(max_tokens=12, ignore_eos=True))
        handle = engine.submit(workload[0][0], SamplingParams(max_tokens=100, ignore_eos=True))
        for i, _ in enumerate(handle):
            if i == 10:
                handle.cancel()
        assert handle.completion().finish_reason == "abort"
        assert len(other.result().token_ids) == 12
        assert engine.wait_idle(30)
        mem = engine.memory_stats()
        assert engine.stats.spec_draft_tokens > 0
    assert mem.free_blocks == mem.total_blocks
    assert proposer.blocks.num_free_blocks == proposer.blocks.num_blocks


@needs_models
def test_seeded_sampling_with_speculation_is_reproducible(workload):
    prompts = workload[0][:3]
    params = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=11, ignore_eos=True)
    spec = {"method": "draft", "model": str(DRAFT), "num_tokens": 3}
    runs = []
    for _ in range(2):
        with from_pretrained(str(TARGET), num_blocks=64, config=CONFIG, speculative=spec) as llm:
            runs.append(llm.generate(prompts, params))
            assert llm.stats.spec_draft_tokens > 0
            assert llm.speculative.describe()["method"] == "draft"
    assert runs[0] == runs[1]
    assert all(len(r) == 20 for r in runs[0])


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"method": "medusa"}, "'method' must be one of"),
        ({"num_tokens": 4}, "needs a 'method'"),
        ({"method": "ngram", "num_token": 4}, "unknown keys"),
        ({"method": "draft"}, "needs a 'model'"),
        ({"method": "ngram", "num_tokens": 0}, "'num_tokens' must be an integer"),
        ({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "exceeds"),
        ("ngram", "must be None or a dict"),
        (
            {"method": "ngram", "num_blocks": 64},
            "'num_blocks' sizes the draft model's KV pool: method 'ngram'",
        ),
        (
            {"method": "draft", "model": "d", "prompt_lookup_max": 8},
            "'prompt_lookup_max' is an n-gram length",
        ),
        (
            {"method": "draft", "model": "d", "prompt_lookup_min": 3},
            "'prompt_lookup_min' is an n-gram length",
        ),
        (SpeculativeConfig("draft", model="d", prompt_lookup_min=2), "method 'draft' does not use it"),
    ],
)
def test_bad_speculative_options_are_refused_clearly(value, match):
    with pytest.raises(UserError, match=match):
        SpeculativeConfig.of(value)


def test_speculative_sizes_take_numpy_integers_as_every_integer_option_does():
    """errors.is_int: SpeculativeConfig refused {"num_tokens": np.int64(4)} ("must be an integer in
    [1, 16], got np.int64(4)") where from_pretrained's own sizes take it; kept as Python ints."""
    import numpy as np

    spec = SpeculativeConfig.of(
        {"method": "draft", "model": "d", "num_tokens": np.int64(4), "num_blocks": np.int32(8)}
    )
    assert (spec.num_tokens, spec.num_blocks) == (4, 8)
    assert type(spec.num_tokens) is int and type(spec.num_blocks) is int


@pytest.mark.parametrize("executor", ["auto", "onnxruntime"])
def test_speculation_asked_of_a_torch_model_under_another_executor_says_pass_torch(tmp_path, executor):
    """llm.load(DIR, speculative=...) (executor "auto") was told DIR "runs on executor 'auto'" and to "serve
    the model's directory", which it was; it is told to pass executor='torch'."""
    from trtforge.llm.service import load

    (tmp_path / "config.json").write_text("{}")
    for model in (str(tmp_path), "tests.llm.tiny_models:llama_factory"):
        with pytest.raises(UserError) as info:
            load(model, executor, speculative={"method": "ngram"})
        text = str(info.value)
        assert f"'{model}' is a save_pretrained directory or module:factory" in text
        assert "pass executor='torch'" in text and "serve the model's directory" not in text
    graph = tmp_path / "step.onnx"
    graph.write_bytes(b"")
    with pytest.raises(UserError, match=r"runs on executor '(auto|onnxruntime)' \(a step graph or engine"):
        load(str(graph), executor, speculative={"method": "ngram"})


def test_a_draft_that_cannot_load_is_named_and_refused_before_the_target_loads(tmp_path, monkeypatch):
    """The loader's refusal ("'DIR' is a directory without config.json") did not say that DIR was the
    draft model, and came after the target's weights had loaded (minutes for a large target)."""
    from trtforge.llm.models import loader

    seen: list = []
    real = loader.load_causal_lm
    monkeypatch.setattr(loader, "load_causal_lm", lambda source: (seen.append(source), real(source))[1])
    draft = tmp_path / "draft"
    draft.mkdir()
    with pytest.raises(
        UserError, match=r"speculative 'model' \(the draft model\): '.*draft' is a directory without config"
    ):
        from_pretrained(
            "tests.llm.tiny_models:llama_factory",
            num_blocks=8,
            speculative={"method": "draft", "model": str(draft)},
        )
    assert seen == [str(draft)]  # (the target was never loaded)


@needs_models
def test_speculation_refuses_asynchronous_scheduling():
    config = SchedulerConfig(async_scheduling=True)
    with pytest.raises(UserError, match="async_scheduling=True cannot run with speculative"):
        from_pretrained(str(TARGET), num_blocks=8, config=config, speculative={"method": "ngram"})


def test_speculation_refuses_an_executor_without_verification_logits():
    """An executor that returns one logits row per sequence (the ONNX Runtime and TensorRT step graphs)
    is refused by name before anything runs, not at a logits-shape check mid-step."""
    from trtforge.llm.engine import make_step_loop
    from trtforge.llm.spec.proposers import NgramProposer

    class OneRowPerSequence:  # stands in for OrtPagedExecutor / TrtPagedExecutor: no supports_speculation
        pass

    with pytest.raises(UserError, match="OneRowPerSequence returns one row of logits per sequence"):
        make_step_loop(OneRowPerSequence(), proposer=NgramProposer(4, 1, 4))  # type: ignore[arg-type]
