"""A draft whose vocabulary is the target's tokenizer padded to a smaller size (Qwen2.5's 0.5B and 7B:
151,936 and 152,064 ids) drafts for it; a larger or a far smaller vocabulary is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.llm.spec.test_sampling_distribution import (
    CHI2_CRIT_DF7,
    PARAMS,
    PROMPT,
    VOCAB,
    _chi2s,
    _exact_marginals,
    _model,
)
from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.engine import LLMEngine
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig
from trtforge.llm.spec.proposers import DraftModelProposer


def _truncated(model: torch.nn.Module, vocab: int) -> torch.nn.Module:
    """`model` with its embeddings and head cut to the first `vocab` ids: the same tokens, padded less."""
    import transformers as tf

    config = tf.LlamaConfig(**{**model.config.to_dict(), "vocab_size": vocab})
    small = tf.LlamaForCausalLM(config).eval().to(next(model.parameters()).dtype)
    state = model.state_dict()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = state[name][:vocab]
    small.load_state_dict(state)
    small.generation_config.eos_token_id = None
    return small


def _executor(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> TorchExecutor:
    return TorchExecutor(model, num_blocks=256, block_size=4, dtype=dtype)


def test_a_draft_with_a_padded_smaller_vocabulary_drafts_and_greedy_output_is_the_targets():
    target_lm = tiny_model("llama", vocab_size=300)
    draft = DraftModelProposer(_executor(_truncated(target_lm, 297)), 4)
    target = _executor(target_lm)
    draft.check_target(target.facts)
    assert draft.target_vocab == 300
    # prompts holding ids past the draft's vocabulary (297..299): the draft reads them as id 0
    prompts = [[5, 298, 17, 299], [297, 3], [12, 40, 41, 42, 43]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, enable_prefix_caching=False)
    with LLMEngine(_executor(target_lm), config) as engine:
        alone = [c.token_ids for c in engine.generate(prompts, params)]
    with LLMEngine(target, config, proposer=draft) as engine:
        spec = [c.token_ids for c in engine.generate(prompts, params)]
    assert spec == alone
    # the same weights agree wherever the context holds no padding id (this output samples 297 once)
    target, draft = _executor(target_lm), DraftModelProposer(_executor(_truncated(target_lm, 297)), 4)
    draft.check_target(target.facts)
    with LLMEngine(target, config, proposer=draft) as engine:
        out = engine.generate([[5, 17, 12, 40]], params)[0].token_ids
        stats = engine.stats
    assert 297 in out or 298 in out or 299 in out
    assert stats.spec_draft_tokens > 0 and stats.spec_acceptance_rate > 0.7


def test_a_padded_draft_keeps_the_targets_sampling_distribution():
    """Rejection sampling with the draft's distributions widened by zeros to the target's vocabulary
    (target 8 ids, draft its first 7 with a perturbed head); the target still samples id 7, which the
    draft reads as 0. (8 and 7 are further apart than check_target allows: the exactness is the point
    here, so the target's size is set as check_target would set it.)"""
    exact = _exact_marginals(_model())
    assert exact[0][VOCAB - 1] > 0.01  # the id the draft lacks is sampled
    target = TorchExecutor(_model(), num_blocks=512, block_size=4, dtype=torch.float64)
    small = _truncated(_model(0.3), VOCAB - 1)
    draft = DraftModelProposer(TorchExecutor(small, num_blocks=512, block_size=4, dtype=torch.float64), 3)
    draft.target_vocab = VOCAB
    config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512, enable_prefix_caching=False)
    requests = 1200
    with LLMEngine(target, config, proposer=draft) as engine:
        params = [SamplingParams(**{**PARAMS.__dict__, "seed": s, "extra": {}}) for s in range(requests)]
        outs = [c.token_ids for c in engine.generate([PROMPT] * requests, params)]
        stats = engine.stats
    assert 0.2 < stats.spec_acceptance_rate < 0.95
    assert max(_chi2s(outs, exact)) < CHI2_CRIT_DF7
    assert any(VOCAB - 1 in o for o in outs)


@pytest.mark.parametrize(
    ("draft_vocab", "message"),
    [
        (301, r"vocabulary of 301 tokens but the target's has 300: it could propose ids the target has no"),
        (290, r"vocabulary of 290 tokens but the target's has 300: sizes that far apart \(more than 1%\)"),
    ],
)
def test_a_larger_or_a_far_smaller_draft_vocabulary_is_refused(draft_vocab, message):
    target = _executor(tiny_model("llama", vocab_size=300))
    draft = DraftModelProposer(_executor(tiny_model("llama", vocab_size=draft_vocab)), 4)
    with pytest.raises(UserError, match=message):
        draft.check_target(target.facts)


def test_from_pretrained_refuses_a_draft_of_another_vocabulary_before_the_targets_executor(monkeypatch):
    """Before: the refusal came from the proposer, after the target's pool was allocated and its
    executor built (graphs captured, on CUDA); it names the option and the draft, and comes first."""
    from trtforge.llm import from_pretrained
    from trtforge.llm.executors import torch_exec

    def built(*args, **kwargs):
        raise AssertionError("the target's executor was built before the draft was checked")

    monkeypatch.setattr(torch_exec, "TorchExecutor", built)
    draft = tiny_model("llama", vocab_size=301)
    with pytest.raises(UserError) as info:
        from_pretrained(tiny_model("llama"), num_blocks=8, speculative={"method": "draft", "model": draft})
    assert str(info.value).startswith(
        "speculative 'model' (the draft model): the LlamaForCausalLM has a vocabulary of 301 tokens but "
        "the target's has 300: it could propose ids the target has no logits for."
    ), info.value


def test_widened_distributions_sum_to_one_and_keep_the_drafts_values():
    draft = DraftModelProposer(_executor(tiny_model("llama", vocab_size=297)), 2)
    draft.target_vocab = 300
    q = np.full((2, 297), 1 / 297)
    wide = draft._widened(q)
    assert wide.shape == (2, 300)
    np.testing.assert_array_equal(wide[:, :297], q)
    assert not wide[:, 297:].any()
    assert draft._draft_ids([1, 296, 297, 299]) == [1, 296, 0, 0]


def test_a_draft_of_a_shorter_context_is_warned_of_and_output_stays_the_targets():
    """A draft whose context is shorter than the target's sequences stops proposing past it (its own
    positions end there): nothing said so, and long sequences ran unspeculated with the cost of a draft."""
    import warnings

    import transformers as tf

    from trtforge.llm.spec.proposers import DraftContextWarning

    target_lm = tiny_model("llama", vocab_size=300)
    short = tf.LlamaForCausalLM(
        tf.LlamaConfig(**{**target_lm.config.to_dict(), "max_position_embeddings": 16})
    )
    short.load_state_dict(target_lm.state_dict())
    short.eval().generation_config.eos_token_id = None
    target, draft = _executor(target_lm), DraftModelProposer(_executor(short), 4)
    assert draft.executor.facts.max_model_len == 16 < target.facts.max_model_len
    with pytest.warns(DraftContextWarning, match=r"up to 16 tokens \(its context\), the target up to \d+"):
        draft.check_target(target.facts)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, enable_prefix_caching=False)
    with LLMEngine(_executor(target_lm), sched) as engine:
        alone = engine.generate([[5, 17, 12, 40]], params)[0].token_ids
    with LLMEngine(target, sched, proposer=draft) as engine:
        assert engine.generate([[5, 17, 12, 40]], params)[0].token_ids == alone
        assert engine.stats.spec_draft_tokens > 0
    same = DraftModelProposer(_executor(target_lm), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.check_target(_executor(target_lm).facts)  # the target's own context: no warning
