"""Generation over decoder LLMs: ``trtforge.llm.load(path)`` / ``from_pretrained(model)``.

``load(path)`` (a step graph of either cache layout, a paged step engine) and ``from_pretrained(model)``
always give a :class:`ServingLLM` (continuous batching, :class:`LLMEngine`):
``generate(prompts, SamplingParams(...))`` or ``generate(prompts, max_new_tokens=N)`` (greedy),
``stream(prompt)``, ``memory_stats()``. (``trtforge.llm.api`` keeps a slot graph's raw greedy loop for
its per-step logits: a numerics tool.)

The decoder wing: ``contract`` and ``models`` at its bottom, then ``sched`` and ``executors``, then the
engine and the front door. It may import the encoder wing; only ``llm.compile`` (and ``llm.report``, the
LLM comparison report at the top of both wings) imports ``compiler``.
"""

from __future__ import annotations

from trtforge.llm.engine import Completion, LLMEngine
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig
from trtforge.llm.service import ServingLLM, from_pretrained, load

__all__ = [
    "Completion",
    "LLMEngine",
    "SamplingParams",
    "SchedulerConfig",
    "ServingLLM",
    "from_pretrained",
    "load",
]
