"""Generation over decoder LLMs: ``trtforge.llm.load(path)`` / ``from_pretrained(model)``.

``load("step.onnx")`` on a paged step graph and ``from_pretrained(model)`` give a :class:`ServingLLM`
(continuous batching over a paged KV cache, :class:`LLMEngine`): ``generate(prompts, SamplingParams(...))``
or ``generate(prompts, max_new_tokens=N)`` (greedy), ``stream(prompt)``, ``memory_stats()``. A
slot-layout step graph loads as :class:`LLM`, the batched greedy loop of issue #16.

The decoder wing: ``contract`` and ``models`` at its bottom, then ``sched`` and ``executors``, then the
engine and the front door. It may import the encoder wing; only ``llm.compile`` imports ``compiler``.
"""

from __future__ import annotations

from trtforge.llm.api import LLM
from trtforge.llm.engine import Completion, LLMEngine
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig
from trtforge.llm.service import ServingLLM, from_pretrained, load

__all__ = [
    "LLM",
    "Completion",
    "LLMEngine",
    "SamplingParams",
    "SchedulerConfig",
    "ServingLLM",
    "from_pretrained",
    "load",
]
