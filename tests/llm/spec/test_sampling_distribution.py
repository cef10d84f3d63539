"""End to end through the engine: speculative sampling with a draft model keeps the target's distribution.

A vocabulary of 8 makes the exact distribution of each generated token computable (summing over the
tokens before it); a chi-square over many seeded requests compares the engine's tokens with it."""

from __future__ import annotations

import numpy as np
import torch

from tests.llm.tiny_models import tiny_model
from trtforge.llm.engine import LLMEngine
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig
from trtforge.llm.spec.proposers import DraftModelProposer

VOCAB, PROMPT, REQUESTS = 8, [1, 2, 3], 1500
PARAMS = SamplingParams(max_tokens=6, temperature=0.9, top_k=6, ignore_eos=True)
CHI2_CRIT_DF7 = 24.32  # 7 degrees of freedom at significance 1e-3


def _model(noise: float = 0.0):
    """The target; with `noise`, a draft: the target with its head perturbed (q near p, not equal)."""
    model = tiny_model("llama", vocab_size=VOCAB)
    if noise:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            model.lm_head.weight.add_(noise * torch.randn(model.lm_head.weight.shape, generator=g))
    return model


def _next_dist(model, prefix: list[int]) -> np.ndarray:
    """The target's sampling distribution after `prefix`: temperature 0.9, then the top 6."""
    with torch.no_grad():
        logits = model(torch.tensor([prefix])).logits[0, -1].double() / PARAMS.temperature
    keep = torch.topk(logits, PARAMS.top_k).indices
    p = torch.zeros_like(logits)
    p[keep] = torch.softmax(logits[keep], dim=-1)
    return p.numpy()


def _exact_marginals(model) -> list[np.ndarray]:
    """P(token 1), P(token 2), P(token 3) of a sample, each summed over the tokens before it."""
    model = model.double()
    first = _next_dist(model, PROMPT)
    second = np.zeros(VOCAB)
    third = np.zeros(VOCAB)
    for a in range(VOCAB):
        if first[a] == 0:
            continue
        pa = _next_dist(model, [*PROMPT, a])
        second += first[a] * pa
        for b in range(VOCAB):
            if pa[b]:
                third += first[a] * pa[b] * _next_dist(model, [*PROMPT, a, b])
    return [first, second, third]


def _sample(requests: int) -> tuple[list[tuple[int, ...]], float]:
    """`requests` seeded samples of PROMPT through a speculating engine, and its acceptance rate."""
    target = TorchExecutor(_model(), num_blocks=512, block_size=4, dtype=torch.float64)
    draft = DraftModelProposer(
        TorchExecutor(_model(0.3), num_blocks=512, block_size=4, dtype=torch.float64), 3
    )
    config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512, enable_prefix_caching=False)
    with LLMEngine(target, config, proposer=draft) as engine:
        params = [SamplingParams(**{**PARAMS.__dict__, "seed": s, "extra": {}}) for s in range(requests)]
        outs = [c.token_ids for c in engine.generate([PROMPT] * requests, params)]
        stats = engine.stats
    assert stats.spec_draft_tokens > 2 * requests
    return outs, stats.spec_acceptance_rate


def _chi2s(outs: list[tuple[int, ...]], exact: list[np.ndarray]) -> list[float]:
    """Per position: the chi-square of the samples' tokens against the exact distribution."""
    out = []
    for position, p in enumerate(exact):
        counts = np.bincount([o[position] for o in outs], minlength=VOCAB)
        keep = p > 0
        assert counts[~keep].sum() == 0  # never a token the target's top-k excludes
        expected = p[keep] * len(outs)
        out.append(float(((counts[keep] - expected) ** 2 / expected).sum()))
    return out


def test_speculative_sampling_matches_the_targets_distribution(monkeypatch):
    from trtforge.llm.spec import verify

    exact = _exact_marginals(_model())
    outs, rate = _sample(1500)
    assert 0.2 < rate < 0.95  # proposals are accepted and rejected: both paths of the rule run
    assert max(_chi2s(outs, exact)) < CHI2_CRIT_DF7
    assert len(set(outs)) > 20  # the samples vary
    # mutation: resample from p instead of the residual max(0, p - q) after a rejection
    monkeypatch.setattr(verify, "_residual", lambda p, q: p)
    outs, _ = _sample(800)
    assert max(_chi2s(outs, exact)) > 2 * CHI2_CRIT_DF7
