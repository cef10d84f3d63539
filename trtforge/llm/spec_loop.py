"""The step loop with speculative decoding: propose, then verify every proposal in one target step.

Before each step the proposer (:mod:`trtforge.llm.spec`) drafts up to k tokens for every running
sequence that decodes and may speculate; the scheduler plans each such sequence as a run of k+1
tokens (its last token, then the proposals) beside the plain decodes and prompt chunks of the same
step, reserving their slots, and the executor returns logits for all k+1 positions. The loop then
accepts per sequence (:mod:`trtforge.llm.spec.verify`: greedy longest matching prefix, or rejection
sampling) and :meth:`Scheduler.update_speculative` rolls the rejected proposals' slots back.

Synchronous only: a step's accepted tokens decide the next step's inputs and proposals, so there is
no step in flight (asynchronous scheduling is off with speculation). Rows that do not speculate:
a request with a grammar (``response_format``), logprobs, penalties or a logit bias (the proposals
and their verification read the model's own distribution), a sequence still prefilling,
one within a token of its length limit, or one the proposer found nothing for. Those decode plainly
in the same step, sampled exactly as without speculation.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from trtforge.llm.executors.base import StepExecutor
from trtforge.llm.loop import StepHook, StepLoop
from trtforge.llm.penalties import biased, penalized
from trtforge.llm.sampling import probabilities, sample_with_logprobs
from trtforge.llm.sched.plan import StepPlan
from trtforge.llm.sched.request import RequestOutput, Sequence_
from trtforge.llm.sched.scheduler import Scheduler
from trtforge.llm.spec.proposers import Proposer
from trtforge.llm.spec.verify import rejection_sample, verify_greedy


class SpeculativeStepLoop(StepLoop):
    """A synchronous :class:`StepLoop` whose decoding sequences bring `proposer`'s drafts to verify."""

    def __init__(
        self,
        executor: StepExecutor,
        scheduler: Scheduler,
        proposer: Proposer,
        step_hook: StepHook | None = None,
    ) -> None:
        super().__init__(executor, scheduler, step_hook)
        self.proposer = proposer
        self.num_tokens = proposer.num_tokens
        self._q: dict[Hashable, np.ndarray] = {}

    def abort(self, request_id: Hashable) -> bool:
        """Cancel a request (:meth:`Scheduler.abort`) and drop the proposer's state of it now, not when a
        step returns the abort's output: :meth:`flush` may take that output, and the id may be queued
        again for another prompt before any step, whose proposals would then come from the old tokens."""
        aborted = super().abort(request_id)
        if aborted:
            self.proposer.forget([request_id])
        return aborted

    def step(self) -> list[RequestOutput]:
        self._propose()
        outputs = super().step()
        done = [o.request_id for o in outputs if o.finished]
        if done:
            self.proposer.forget(done)
        return outputs

    def _budget(self, seq: Sequence_) -> int:
        """How many tokens `seq` may speculate this step (0: it decodes plainly)."""
        if (
            seq.num_computed != len(seq.tokens) - 1
            or seq.num_computed < seq.prompt_len
            or seq.matcher is not None
            or seq.logprobs is not None
            or penalized(seq.params)
            or biased(seq.params)
        ):
            return 0
        return min(self.num_tokens, seq.length_limit - len(seq.tokens) - 1)

    def _propose(self) -> None:
        self._q = {}
        seqs, ks = [], []
        for seq in self.scheduler.running_sequences():
            seq.draft = []
            k = self._budget(seq)
            if k > 0:
                seqs.append(seq)
                ks.append(k)
        if not seqs:
            return
        for seq, k, proposal in zip(seqs, ks, self.proposer.propose(seqs, ks)):
            seq.draft = [int(t) for t in proposal.tokens[:k]]
            if seq.draft and proposal.probs is not None:
                self._q[seq.request_id] = proposal.probs

    def _sample_and_update(self, plan: StepPlan, logits: Any) -> list[RequestOutput]:
        if not plan.speculative:
            return super()._sample_and_update(plan, logits)
        samplers = plan.samplers
        ks = np.array([len(s.draft) for s in samplers], dtype=np.int64)
        last = np.cumsum(ks + 1) - 1  # each sampler's last logits row
        new: list[list[int]] = [[] for _ in samplers]
        lps: list[Any] | None = None
        plain = np.flatnonzero(ks == 0)
        if len(plain):  # plain rows: the plain sampler, on their rows alone
            histories, bitmask = plan.sampler_inputs(self.executor.facts.vocab_size)
            rows = _take(logits, last[plain])
            tokens, got = sample_with_logprobs(
                rows,
                [samplers[i].params for i in plain],
                [samplers[i].sampling_generator for i in plain],
                None if histories is None else [histories[i] for i in plain],
                None if bitmask is None else bitmask[plain],
                self.argmax,
            )
            for j, i in enumerate(plain):
                new[i] = [int(tokens[j])]
            if got is not None:
                lps = [None] * len(samplers)
                for j, i in enumerate(plain):
                    lps[i] = got[j]
        spec = np.flatnonzero(ks > 0)
        greedy = [i for i in spec if samplers[i].params.greedy]
        if greedy:
            argmax = _argmax(logits)
            for i in greedy:
                first = last[i] - ks[i]
                new[i] = verify_greedy(samplers[i].draft, argmax[first : last[i] + 1])
        sampled = [i for i in spec if not samplers[i].params.greedy]
        if sampled:
            rows = np.concatenate([np.arange(last[i] - ks[i], last[i] + 1) for i in sampled])
            host = _host_float64(_take(logits, rows))
            p = probabilities(host, [samplers[i].params for i in sampled for _ in range(ks[i] + 1)])
            at = 0
            for i in sampled:
                seq, k = samplers[i], int(ks[i])
                q = self._q.get(seq.request_id)
                q = None if q is None else q[:k]
                new[i] = rejection_sample(p[at : at + k + 1], seq.draft, q, seq.generator)
                at += k + 1
        return self.scheduler.update_speculative(plan, new, lps)


def _take(logits: Any, rows: np.ndarray) -> Any:
    """Rows `rows` of `logits` (numpy or torch, on its device)."""
    if isinstance(logits, np.ndarray):
        return logits[rows]
    import torch

    return logits.index_select(0, torch.as_tensor(rows, device=logits.device))


def _argmax(logits: Any) -> list[int]:
    """Each row's first maximum (numpy or torch: one copy to the host)."""
    return logits.argmax(-1).tolist()


def _host_float64(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return x.double().cpu().numpy()
