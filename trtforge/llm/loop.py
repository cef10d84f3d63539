"""The step loop: schedule -> execute + sample -> update, one step at a time.

:class:`StepLoop` joins a :class:`~trtforge.llm.sched.scheduler.Scheduler` (which plans and applies,
never running a model) to a :class:`~trtforge.llm.executors.base.StepExecutor`: it runs each plan's
batch, samples the plan's rows with their requests' params and generators, and hands the tokens back
to the scheduler. An executor failure fails only that step's requests. Its asynchronous twin, one
step in flight, is :class:`trtforge.llm.async_loop.AsyncStepLoop`; :func:`trtforge.llm.engine.
make_step_loop` picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from trtforge.llm.executors.base import ExecutorLostError, StepBatch, StepExecutor
from trtforge.llm.sampling import SamplingParams, sample_with_logprobs
from trtforge.llm.sched.blocks import MemoryStats
from trtforge.llm.sched.plan import StepPlan
from trtforge.llm.sched.request import RequestOutput, SchedulerStats, StepFailedError
from trtforge.llm.sched.scheduler import Scheduler

StepHook = Callable[[Scheduler, StepBatch], None]


class StepLoop:
    """Runs the scheduler's plans on `executor`, synchronously: each step's tokens are applied before
    the next step is planned.

    `step_hook(scheduler, batch)` runs after a batch is planned and before the executor runs it (tests
    use it to check invariants, or to abort requests mid-step).
    """

    async_scheduling = False

    def __init__(
        self, executor: StepExecutor, scheduler: Scheduler, step_hook: StepHook | None = None
    ) -> None:
        self.executor = executor
        self.scheduler = scheduler
        self.step_hook = step_hook
        self.argmax = getattr(executor, "argmax", None)  # the sampler's greedy pick (None: torch's)

    # ---- the scheduler's front, for callers that hold only the loop --------------------------
    def add_request(
        self, request_id: Hashable, prompt: Sequence[int], params: SamplingParams | None = None
    ) -> None:
        """Queue a request (:meth:`Scheduler.add_request`)."""
        self.scheduler.add_request(request_id, prompt, params)

    def abort(self, request_id: Hashable) -> bool:
        """Cancel a request (:meth:`Scheduler.abort`)."""
        return self.scheduler.abort(request_id)

    @property
    def stats(self) -> SchedulerStats:
        return self.scheduler.stats

    def memory_stats(self) -> MemoryStats:
        return self.scheduler.memory_stats()

    def has_unfinished(self) -> bool:
        """Whether a :meth:`step` has work: requests, outputs not returned yet, or a step in flight."""
        return self.scheduler.has_unfinished()

    # ---- one iteration -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run and sample one batch; return the outputs of every request that changed."""
        sched = self.scheduler
        outputs = sched.take_outputs()
        plan = sched.schedule()
        if not plan:
            outputs += self._resolve()
            return outputs
        assert plan.batch is not None
        if self.step_hook is not None:
            self.step_hook(sched, plan.batch)
        try:
            logits = self._execute(plan)
            expected = (len(plan.batch.logits_indices), self.executor.facts.vocab_size)
            if tuple(logits.shape) != expected:
                raise StepFailedError(
                    f"executor returned logits of shape {tuple(logits.shape)}, expected {expected}"
                )
        except ExecutorLostError:  # no further step can run: the engine fails every request and stops
            raise
        except Exception as exc:  # an executor fault ends this step's requests, not the engine
            outputs += self._resolve()  # a step in flight completes first, as it does without asynchrony
            outputs += sched.fail(plan, exc)
            return outputs
        sched.computed(plan)
        outputs += self._sample_and_update(plan, logits)
        return outputs

    def flush(self) -> list[RequestOutput]:
        """The outputs not returned yet (and, asynchronously, those of the step in flight)."""
        outputs = self.scheduler.take_outputs()
        outputs += self._resolve()
        return outputs

    # ---- the parts the asynchronous loop replaces ----------------------------------------------
    def _execute(self, plan: StepPlan) -> Any:
        """Run the plan's batch; the logits of its sampled rows."""
        return self.executor.step(plan.batch)

    def _sample_and_update(self, plan: StepPlan, logits: Any) -> list[RequestOutput]:
        """Sample the plan's rows and apply the tokens."""
        histories, bitmask = plan.sampler_inputs(self.executor.facts.vocab_size)
        tokens, logprobs = sample_with_logprobs(
            logits,
            plan.sampling_params,
            plan.generators,
            histories,
            bitmask,
            self.argmax,
        )
        return self.scheduler.update(plan, tokens.tolist(), logprobs)

    def _resolve(self) -> list[RequestOutput]:
        """Apply the step in flight, if any (none: every step is applied at once here)."""
        return []
