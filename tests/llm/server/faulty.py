"""`module:factory` for the server tests: the trained 21M model whose embedding fails on token 4095.

A prompt holding that id makes the executor's step raise: an executor fault the server must confine
to the requests of that step. Token 4094 makes it raise ExecutorLostError, as a tensor-parallel worker's
death does: no further step can run, and the engine stops.
"""

from __future__ import annotations

import time

import torch

from tests.llm.server.harness import MODEL

POISON = 4095
LOST = 4094


class _FaultyEmbedding(torch.nn.Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if bool((ids == LOST).any()):
            from trtforge.llm.executors.base import ExecutorLostError

            raise ExecutorLostError("injected loss of the executor (token 4094)")
        if bool((ids == POISON).any()):
            raise RuntimeError("injected executor fault (token 4095)")
        return super().forward(ids)


def make():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    old = model.model.embed_tokens
    new = _FaultyEmbedding(old.num_embeddings, old.embedding_dim, old.padding_idx)
    new.weight = old.weight
    model.model.embed_tokens = new
    return model, None


def tiny():
    """The tests' tiny random Llama (vocab 300, 512 positions): fast enough to outrun a short timeout."""
    from tests.llm.serving_models import tiny_llama

    return tiny_llama(), None


class _SlowEmbedding(torch.nn.Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        time.sleep(SLOW_STEP)
        return super().forward(ids)


SLOW_STEP = 0.01  # seconds each step of :func:`slow_long` sleeps (its embedding runs once a step)


def slow_long():
    """The tiny random Llama with 4,096 positions, each step at least :data:`SLOW_STEP` long: 4,000 tokens
    take 40 s or more, however fast the machine."""
    from tests.llm.serving_models import tiny_llama

    model = tiny_llama()
    model.config.max_position_embeddings = 4096
    old = model.model.embed_tokens
    new = _SlowEmbedding(old.num_embeddings, old.embedding_dim, old.padding_idx, dtype=old.weight.dtype)
    new.weight = old.weight
    model.model.embed_tokens = new
    return model, None
