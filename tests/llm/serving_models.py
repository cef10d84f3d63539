"""Tiny random-weight Llama (no downloads) and helpers shared by the scheduler and serving tests."""

from __future__ import annotations

import functools

import torch

from trtforge.llm.engine import LLMEngine, make_step_loop
from trtforge.llm.executors.base import ExecutorFacts
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.loop import StepLoop
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig

VOCAB = 300
MAX_POS = 512


@functools.lru_cache(maxsize=1)
def tiny_llama():
    """2 layers, hidden 64, 4 query / 2 KV heads, vocab 300, float64 so batching never flips a greedy tie."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)  # the tiny matmuls only lose from threads on a shared 2-core machine
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config).to(torch.float64).eval()


def model_free_facts(
    num_blocks: int, block_size: int, vocab_size: int, max_model_len: int, eos_token_ids=()
) -> ExecutorFacts:
    """The facts of a test executor without a model: pools of the given geometry, no K/V bytes."""
    return ExecutorFacts(
        num_blocks=num_blocks,
        block_size=block_size,
        vocab_size=vocab_size,
        max_model_len=max_model_len,
        eos_token_ids=tuple(eos_token_ids),
        num_layers=0,
        num_kv_heads=0,
        head_dim=0,
        kv_dtype="float32",
        kv_element_bytes=4,
        kv_pool_bytes=0,
    )


def make_executor(num_blocks: int = 256, block_size: int = 8) -> TorchExecutor:
    return TorchExecutor(tiny_llama(), num_blocks=num_blocks, block_size=block_size)


def small_engine(async_scheduling: bool) -> LLMEngine:
    """An engine over the tiny model with 128 blocks, 16 sequences and 16-token prefill chunks (small enough
    that a few prompts exercise chunking, preemption-free), on either loop."""
    config = SchedulerConfig(max_num_seqs=16, max_prefill_chunk=16, async_scheduling=async_scheduling)
    return LLMEngine(make_executor(num_blocks=128), config)


def run_to_completion(loop: StepLoop) -> dict:
    """Step until idle; return request id -> finished RequestOutput."""
    done = {}
    while loop.has_unfinished():
        for out in loop.step():
            if out.finished:
                done[out.request_id] = out
    return done


def solo_output(prompt: list[int], params: SamplingParams, executor: TorchExecutor | None = None) -> tuple:
    """The request's output when it runs alone (no batch mates, no prefix cache, synchronous scheduling)."""
    config = SchedulerConfig(enable_prefix_caching=False, async_scheduling=False)
    sched = make_step_loop(executor or make_executor(), config)
    sched.add_request("solo", prompt, params)
    return run_to_completion(sched)["solo"].output_token_ids


def hf_greedy(prompt: list[int], max_tokens: int) -> list[int]:
    """transformers generate(do_sample=False): the reference a greedy request must match."""
    model = tiny_llama()
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=max_tokens,
        pad_token_id=0,
        attention_mask=None,
    )
    return out[0, len(prompt) :].tolist()
