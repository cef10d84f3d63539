"""Default sizes fitted to the machine: the arithmetic on the CPU, the measured path on a GPU."""

from __future__ import annotations

import gc
import traceback

import numpy as np
import pytest

from trtforge.errors import UserError
from trtforge.llm import sizing

GiB = 1 << 30


def test_block_bytes_of_a_llama3_8b_shape():
    # 32 layers, 8 KV heads of 128, BF16, 16 tokens: 2 MiB a block (128 KiB a token)
    assert sizing.kv_block_bytes(32, 8, 128, 16, 2) == 2 << 20


def test_gpu_pool_takes_the_utilization_of_what_is_left():
    p = sizing.gpu_pool(free_bytes=120 * GiB, activation_peak=4 * GiB, utilization=0.9, block_bytes=2 << 20)
    assert p.num_blocks == int(0.9 * 116 * GiB) // (2 << 20)
    assert p.num_blocks * 16 > 800_000, "an H200 holds ~850k tokens of an 8B model's KV"
    with pytest.raises(UserError, match="gpu-memory-utilization"):
        sizing.gpu_pool(1 * GiB, 1 * GiB, 0.9, 2 << 20)
    with pytest.raises(UserError, match="gpu-memory-utilization"):
        sizing.gpu_pool(10 * GiB, 0, 1.5, 2 << 20)
    assert sizing.gpu_pool(120 * GiB, 0, 0.9, 4096, max_blocks_needed=32768).num_blocks == 32768


def test_gpu_pool_reserves_the_cuda_graphs_before_the_utilization():
    # issue #29: 0.9 of (118.19 GiB - 0.52 GiB) left 11.8 GiB, and capturing every graph then ran out
    free, peak, graphs, block = 118 * GiB, GiB // 2, 3 * GiB, 2 << 20
    p = sizing.gpu_pool(free, peak, 0.9, block, graph_bytes=graphs)
    assert p.graph_bytes == graphs and p.budget_bytes == int(0.9 * (free - peak - graphs))
    assert p.num_blocks == p.budget_bytes // block
    assert free - p.num_blocks * block >= peak + graphs, "the pool leaves the step's peak and the graphs free"
    assert "3.00 GiB measured CUDA graphs" in p.how and "0.50 GiB measured activation peak" in p.how
    off = sizing.gpu_pool(free, peak, 0.9, block)
    assert (
        off.graph_bytes == 0 and off.num_blocks > p.num_blocks and "0.00 GiB measured CUDA graphs" in off.how
    )
    with pytest.raises(UserError, match=r"2\.98 GiB for its CUDA graphs: 9 KV blocks fit"):
        sizing.gpu_pool(3 * GiB, 0, 0.9, block, graph_bytes=3 * GiB - (20 << 20))


class _FakeExecutor:
    """What capture_graphs calls, each capture taking `cost` bytes of a fake device's free memory."""

    def __init__(self, device_free: list[int], cost: dict[str, int]) -> None:
        self.free, self.cost, self.calls, self.num_cuda_graphs = device_free, cost, [], 0

    def capture_mixed_graphs(self) -> int:
        self.calls.append(("mixed",))
        self.free[0] -= self.cost["mixed"]
        return 33

    def capture_decode_graphs(self, max_batch=None, q_lens=(1,)) -> int:
        self.calls.append(("decode", max_batch, tuple(q_lens)))
        self.free[0] -= self.cost["decode"]
        self.num_cuda_graphs = 143
        return self.num_cuda_graphs


def test_graphs_are_measured_by_what_capturing_them_takes():
    device_free = [100 * GiB]
    plan = sizing.GraphCapture(max_decode_batch=512, max_graph_tokens=2048, q_lens=(1, 2, 3))
    assert plan.executor_kwargs() == {"max_decode_batch": 512, "max_graph_tokens": 2048}
    probe = _FakeExecutor(device_free, {"mixed": 3 * GiB, "decode": GiB})
    assert sizing.measure_graphs(probe, plan, lambda: device_free[0]) == 4 * GiB
    # piecewise first (their largest bucket's temporaries are the largest), then decode, with the plan's sizes
    assert probe.calls == [("mixed",), ("decode", 512, (1, 2, 3))]
    assert sizing.capture_graphs(_FakeExecutor([0], {"mixed": 0, "decode": 0}), plan) == 33 + 143
    assert sizing.GraphCapture(max_decode_batch=256) == sizing.GraphCapture(256, 4096, (1,))


def test_cpu_pool_is_a_bounded_share_of_ram():
    block = 1 << 20
    p = sizing.cpu_pool(available_bytes=20 * GiB, block_bytes=block, max_blocks_needed=10**9)
    assert p.num_blocks == int(sizing.CPU_KV_FRACTION * 20 * GiB) // block
    capped = sizing.cpu_pool(available_bytes=1000 * GiB, block_bytes=block, max_blocks_needed=10**9)
    assert capped.num_blocks == sizing.CPU_KV_CAP // block
    assert sizing.cpu_pool(20 * GiB, block, max_blocks_needed=100).num_blocks == 100


def test_scheduler_defaults_fill_an_h200_and_explicit_values_win():
    c = sizing.default_scheduler_config(None)
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.max_prefill_chunk) == (256, 4096, 1024)
    assert sizing.default_scheduler_config(None, 8).max_num_seqs == 8
    mine = sizing.default_scheduler_config(None, None)
    assert sizing.default_scheduler_config(mine) is mine


def test_profile_step_is_the_largest_prefill():
    b = sizing.profile_step(8192, 512, 16)
    assert b.num_tokens == 8192 and b.num_seqs == 16 and len(set(b.slot_mapping.tolist())) == 8192
    assert int(b.slot_mapping.max()) < (8192 // 16) * 16


def test_from_pretrained_defaults_on_the_cpu():
    from tests.llm.serving_models import tiny_llama
    from trtforge.llm import from_pretrained

    with from_pretrained(tiny_llama()) as llm:
        assert llm.engine._scheduler.config.max_num_seqs == 256
        assert llm.executor.facts.num_blocks >= sizing.MIN_BLOCKS
        assert llm.generate([[1, 2, 3]], max_new_tokens=3)
        # the sizing is kept for the startup line; the CPU captures no graphs and reserves nothing for them
        assert (
            llm.pool_size.num_blocks == llm.executor.facts.num_blocks and "available RAM" in llm.pool_size.how
        )
        assert llm.pool_size.graph_bytes == 0 and llm.memory_stats().graph_bytes == 0
        # the sizing's block is the executor's (one geometry: the family adapter's)
        facts = llm.executor.facts
        assert llm.pool_size.block_bytes == facts.kv_bytes_per_token * facts.block_size
        assert llm.executor.num_cuda_graphs == 0 and llm.executor.num_piecewise_graphs == 0
    with from_pretrained(tiny_llama(), num_blocks=16) as given:
        assert given.pool_size is None and given.memory_stats().graph_bytes == 0


def _pool_at_090(lm, config, graphs):
    """The pool `sizing.torch_pool` sizes for `lm` on its device at --gpu-memory-utilization 0.9 (16-token
    blocks, the model's dtype and length), with `graphs` (False: no CUDA graphs to reserve)."""
    return sizing.torch_pool(
        lm,
        block_size=16,
        device=None,
        dtype=None,
        max_model_len=None,
        config=config,
        gpu_memory_utilization=0.9,
        graphs=graphs,
    )


@pytest.mark.gpu
@pytest.mark.whole_gpu  # (its 2% bound is on the device's free memory, which other processes change)
def test_gpu_pool_is_measured_on_the_device():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.llm.serving_models import tiny_llama
    from trtforge.llm import from_pretrained
    from trtforge.llm.sched.scheduler import SchedulerConfig

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    shape = {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 8}
    cfg = LlamaConfig(vocab_size=32000, num_hidden_layers=8, num_key_value_heads=8, **shape)
    with torch.device("cuda"):
        lm = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    free_after_weights = torch.cuda.mem_get_info()[0]
    config = SchedulerConfig(max_num_seqs=4096, max_num_batched_tokens=8192)  # the memory binds, not the cap
    pool = _pool_at_090(lm, config, graphs=False)  # an executor capturing no graphs: nothing reserved
    assert 0 < pool.activation_peak_bytes < 8 * GiB, pool
    assert pool.graph_bytes == 0, pool
    expected = 0.9 * (free_after_weights - pool.activation_peak_bytes) / pool.block_bytes
    assert abs(pool.num_blocks - expected) / expected < 0.02, (pool, expected)
    del lm
    torch.cuda.empty_cache()
    # a fresh model (tiny_llama() is cached, and moving it would move every later test's): capped by sequences
    with from_pretrained(tiny_llama.__wrapped__(), device="cuda", dtype=torch.bfloat16) as llm:
        facts, ex = llm.executor.facts, llm.executor
        assert facts.num_blocks == sizing.blocks_for_sequences(256, facts.max_model_len, 16)
        # the sized pool reserved the graphs, which were captured at load, before any step
        decode, pieces = ex.num_cuda_graphs, ex.num_piecewise_graphs
        assert decode > 0 and pieces > 0 and llm.pool_size.graph_bytes > 0, llm.pool_size
        assert llm.memory_stats().graph_bytes == llm.pool_size.graph_bytes
        assert llm.generate([[1, 2, 3]] * 4, max_new_tokens=4)
        assert (ex.num_cuda_graphs, ex.num_piecewise_graphs) == (decode, pieces), "a graph was captured late"


@pytest.mark.gpu
@pytest.mark.whole_gpu  # (it takes 0.9 of the free memory: any other test on the GPU then runs out)
def test_a_pool_sized_at_090_leaves_room_for_every_graph_on_cuda():
    """Issue #29's OOM, small: at --gpu-memory-utilization 0.9 with the memory binding (not the sequence
    cap), the sized pool leaves what capturing every decode and piecewise graph takes; the served capture
    takes no more than the sizing reserved, memory stays free beyond the step's peak, and steps run."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trtforge.llm.executors.torch_exec import TorchExecutor

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    # 1 MiB blocks (8 layers x 16 KV heads x 128 x 16 tokens x K,V x 2 bytes): 1024 x 4096 tokens = 256 GiB
    shape = {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16}
    cfg = LlamaConfig(
        vocab_size=32000, num_hidden_layers=8, num_key_value_heads=16, max_position_embeddings=4096, **shape
    )
    with torch.device("cuda"):
        lm = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    config = sizing.default_scheduler_config(None, 1024)
    plan = sizing.GraphCapture(max_decode_batch=config.max_num_seqs)

    def settled_free() -> int:
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info()[0]

    pool = _pool_at_090(lm, config, graphs=plan)
    need = sizing.blocks_for_sequences(config.max_num_seqs, 4096, 16)
    assert pool.num_blocks < need, f"the memory must bind for this test: {pool}"
    assert 0 < pool.graph_bytes < 16 * GiB and "measured CUDA graphs" in pool.how, pool
    ex = TorchExecutor(lm, num_blocks=pool.num_blocks, block_size=16, **plan.executor_kwargs())
    try:
        _check_the_served_capture(ex, pool, plan, config, settled_free)
    except BaseException as e:  # a failure's traceback must not keep the ~100 GiB pool for later tests
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        ex = lm = None
        settled_free()


def _check_the_served_capture(ex, pool, plan, config, settled_free) -> None:
    """The rest of the test above: the served executor's capture against what the sizing reserved,
    then steps of the largest sizes."""
    import torch

    from trtforge.llm.service import ServingLLM

    before = settled_free()
    captured = sizing.capture_graphs(ex, plan)
    after = settled_free()
    took = before - after
    print(
        f"pool {pool.num_blocks} blocks; {captured} graphs took {took / GiB:.2f} GiB, reserved "
        f"{pool.graph_bytes / GiB:.2f} GiB; {after / GiB:.2f} GiB free after the capture"
    )
    assert captured == ex.num_cuda_graphs + ex.num_piecewise_graphs > 0
    assert ex._batch_buckets[-1] == 1024 and any(key[0] == 1024 for key in ex._graphs)
    assert took <= pool.graph_bytes + (64 << 20), (took, pool.graph_bytes)
    assert after >= pool.activation_peak_bytes + GiB, (after, pool)
    # the largest prefill step (4096 tokens, piecewise) and a decode batch run without running out
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 32000, size=1024).tolist() for _ in range(4)]
    prompts += [rng.integers(3, 32000, size=8).tolist() for _ in range(60)]
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    with ServingLLM(ex, config) as llm:
        outs = llm.generate(prompts, max_new_tokens=4, stop_at_eos=False)
    grew = torch.cuda.max_memory_reserved() - base
    print(
        f"the steps reserved up to {grew / GiB:.2f} GiB more "
        f"(measured peak {pool.activation_peak_bytes / GiB:.2f} GiB)"
    )
    assert [len(o) for o in outs] == [4] * len(prompts)
    assert captured == ex.num_cuda_graphs + ex.num_piecewise_graphs, (
        "a step captured a graph the sizing missed"
    )


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        # a dynamic rotary serves twice max_position_embeddings: the pool was capped at half the sequences
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
        # MPT names its length max_seq_len: the cap read 2048 positions, 8x the 256 it serves
        ("mpt", {}),
    ],
)
def test_the_cpu_pool_holds_max_num_seqs_sequences_of_the_executors_own_length(family, overrides):
    """The sizing caps a pool at max_num_seqs full-length sequences; "full length" is the executor's
    max_model_len (the family adapter's length), which the sizing read again from the config itself."""
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm import from_pretrained

    with from_pretrained(tiny_model(family, **overrides), max_num_seqs=2) as llm:
        facts = llm.executor.facts
        assert facts.num_blocks == 2 * -(-facts.max_model_len // facts.block_size), (facts, llm.pool_size)
