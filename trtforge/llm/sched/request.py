"""A request's state inside the scheduler, what a step reports for it, and the batching limits.

:class:`Sequence_` is one request (prompt and output tokens, how many have K/V in the pool, its
generator); :class:`RequestOutput` is what one step produced for it; :class:`SchedulerConfig` and
:class:`SchedulerStats` are the scheduler's limits and counters.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from trtforge.errors import TrtforgeError, UserError, is_int
from trtforge.llm.sampling import SamplingParams


class StepFailedError(TrtforgeError):
    """The executor failed the step a request was part of; the request ends with this error."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Sequence_:
    """One request's state: its tokens (prompt then output) and how many have K/V in the pool."""

    request_id: Hashable
    tokens: list[int]
    prompt_len: int
    params: SamplingParams
    eos_token_id: int | None
    seed: int  # of the request's own random stream (generator)
    arrival: int
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None
    error: BaseException | None = None
    # a sampled token can only stop the sequence if it is in stop_ids or the length reaches length_limit
    # (or the params have stop sequences): the per-token check short of the full one
    stop_ids: frozenset[int] = frozenset()
    length_limit: int = 0
    # asynchronous scheduling: the row of this sequence's token in the step in flight's samples while
    # that token is not known on the host yet (-1: none in flight)
    pending_row: int = -1
    # structured output: the request's grammar position (a trtforge.llm.structured.GrammarMatcher)
    matcher: Any = None
    # the sampled tokens' TokenLogprobs when the params ask for logprobs (else None)
    logprobs: list[Any] | None = None
    # speculative decoding: the proposed tokens the next step verifies after this sequence's last
    # token (set by the speculative loop before planning; cleared once applied or when preempted)
    draft: list[int] = field(default_factory=list)
    _generator: np.random.Generator | None = None

    @property
    def generator(self) -> np.random.Generator:
        """The request's own random stream, made from `seed` on first use: a greedy request never draws,
        and making a numpy Generator costs ~13 us, which a batch of 1,000 submitted at once waited for."""
        if self._generator is None:
            self._generator = np.random.default_rng(self.seed)
        return self._generator

    @property
    def sampling_generator(self) -> np.random.Generator | None:
        """:attr:`generator` where the request samples; None where it is greedy (its rows draw nothing)."""
        return None if self.params.greedy else self.generator

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


class RequestOutput(NamedTuple):
    """What a step produced for one request: its new tokens, and how it ended if it did.

    A named tuple rather than a frozen dataclass: one is made per running request per step, and a
    tuple is built several times faster.
    """

    request_id: Hashable
    new_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]  # every generated token, filled once the request has finished
    finished: bool
    finish_reason: str | None = None
    error: BaseException | None = None
    # TokenLogprobs of new_token_ids / of every output token once finished (None: not asked for)
    logprobs: tuple[Any, ...] | None = None
    output_logprobs: tuple[Any, ...] | None = None


# Upper bounds of a step's size. The torch executor sizes static buffers and CUDA graphs by them (decode
# graphs up to max_num_seqs rows, piecewise graphs up to max_num_batched_tokens), so a typo such as
# 10**23 must be refused by name rather than fail inside an allocator; both are far past what any model
# fills (an 8B model on an H200 holds ~1,000 sequences of 1,000 tokens in FP8).
MAX_NUM_SEQS = 2**16
MAX_BATCHED_TOKENS = 2**20


@dataclass
class SchedulerConfig:
    """Batching limits. ``max_model_len=None`` takes the executor's, capped at what the pool holds.

    ``async_scheduling``: keep one step in flight (:mod:`trtforge.llm.async_loop`). None, the default,
    turns it on for an executor with ``step_async`` (the torch executor) and off for the others (ONNX
    Runtime, TensorRT); False forces synchronous steps; True requires an executor with ``step_async``.

    ``reserve_max_tokens``: admit a request only while the pool can hold every running sequence and it
    grown to its whole length (prompt + ``max_tokens``), so that running sequences are never preempted
    (TensorRT-LLM's "guaranteed no evict"); off, requests are admitted on their prompts and the newest
    is preempted (recomputed later) when the pool runs out, which admits more of them at once.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_prefill_chunk: int = 512
    # prompt tokens per step while some sequence decodes in it: bounds how long a prefill stalls them
    max_prefill_tokens_with_decodes: int = 1024
    watermark: float = 0.01
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    seed: int = 0
    async_scheduling: bool | None = None
    reserve_max_tokens: bool = False
    fill_step_buckets: bool = True

    def validate(self) -> None:
        for name, most in (
            ("max_num_seqs", MAX_NUM_SEQS),
            ("max_num_batched_tokens", MAX_BATCHED_TOKENS),
            ("max_prefill_chunk", MAX_BATCHED_TOKENS),
            ("max_prefill_tokens_with_decodes", MAX_BATCHED_TOKENS),
        ):
            value = getattr(self, name)
            if not is_int(value) or not 1 <= value <= most:
                raise UserError(f"SchedulerConfig.{name} must be an integer in [1, {most:,}], got {value!r}")
            setattr(self, name, int(value))
        if not isinstance(self.watermark, (int, float)) or not 0 <= self.watermark < 1:
            raise UserError(f"SchedulerConfig.watermark must be a fraction in [0, 1), got {self.watermark!r}")
        length = self.max_model_len
        if length is not None:
            if not is_int(length) or length < 2:
                raise UserError(f"SchedulerConfig.max_model_len must be None or >= 2, got {length!r}")
            self.max_model_len = int(length)
        for name in ("reserve_max_tokens", "fill_step_buckets"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"SchedulerConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.async_scheduling not in (None, True, False):
            raise UserError(
                f"SchedulerConfig.async_scheduling must be None, True or False, got {self.async_scheduling!r}"
            )


@dataclass
class SchedulerStats:
    """Counters since creation."""

    steps: int = 0
    failed_steps: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefix_hit_tokens: int = 0
    generated_tokens: int = 0
    max_running: int = 0
    # speculative decoding: tokens proposed and verified, the proposals accepted, and the rows verified
    # (each verified row emits its accepted proposals plus one token of the target's)
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verify_rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / proposed tokens (0 before any proposal)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens emitted per verified row: accepted proposals + the target's one (0 before any)."""
        rows = self.spec_verify_rows
        return (self.spec_accepted_tokens + rows) / rows if rows else 0.0
