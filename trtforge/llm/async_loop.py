"""Asynchronous scheduling: the step loop with one step in flight.

Step n is scheduled as if every sequence sampled in step n-1 already had that token
(:meth:`Scheduler.defer`), launched with those tokens fed from the device (a :class:`TokenFeed`),
and only then are step n-1's tokens waited for and applied. The host's work for a step then
overlaps the device's for the previous one instead of following it. Outputs are identical to the
synchronous loop: every sequence samples the same tokens with the same draws of its generator; a
sequence found finished at n-1 merely has its step-n row discarded. Needs an executor with
``step_async`` (:class:`~trtforge.llm.executors.base.AsyncStepExecutor`).
"""

from __future__ import annotations

from typing import Any

from trtforge.llm.executors.base import AsyncStepExecutor, TokenFeed
from trtforge.llm.loop import StepHook, StepLoop
from trtforge.llm.sampling import SampledTokens, sample_async
from trtforge.llm.sched.plan import StepPlan
from trtforge.llm.sched.request import RequestOutput
from trtforge.llm.sched.scheduler import Scheduler


class AsyncStepLoop(StepLoop):
    """A :class:`StepLoop` whose step returns the outputs of the step before, applied once this one is
    launched; :meth:`flush` waits for the step in flight."""

    async_scheduling = True

    def __init__(
        self, executor: AsyncStepExecutor, scheduler: Scheduler, step_hook: StepHook | None = None
    ) -> None:
        super().__init__(executor, scheduler, step_hook)
        self.async_executor = executor
        self._inflight: tuple[StepPlan, SampledTokens] | None = None

    @property
    def in_flight(self) -> bool:
        """Whether a launched step's tokens are not applied yet."""
        return self._inflight is not None

    def has_unfinished(self) -> bool:
        return self._inflight is not None or self.scheduler.has_unfinished()

    def _execute(self, plan: StepPlan) -> Any:
        feed = None
        fed = plan.fed_rows()
        if fed is not None:
            assert self._inflight is not None, "a token is pending but no step is in flight"
            feed = TokenFeed(rows=fed[0], sources=fed[1], tokens=self._inflight[1].tokens)
        return self.async_executor.step_async(plan.batch, feed)

    def _sample_and_update(self, plan: StepPlan, logits: Any) -> list[RequestOutput]:
        # penalties and grammars read the tokens so far: the step in flight is applied first for them
        outputs = self._resolve() if plan.needs_history() else []
        histories, bitmask = plan.sampler_inputs(self.executor.facts.vocab_size)
        sampled = sample_async(logits, plan.sampling_params, plan.generators, histories, bitmask, self.argmax)
        outputs += self._resolve()
        self.scheduler.defer(plan)  # (after the step before cleared its own rows)
        self._inflight = (plan, sampled)
        return outputs

    def _resolve(self) -> list[RequestOutput]:
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return []
        plan, sampled = inflight
        try:
            tokens = sampled.result().tolist()
        except Exception as exc:  # a device fault surfacing at the wait ends that step's requests
            return self.scheduler.fail(plan, exc)
        return self.scheduler.update(plan, tokens, sampled.logprobs)
