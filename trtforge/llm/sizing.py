"""Default sizes of a served model, fitted to the machine it runs on (issue #27).

A user who names no sizes should get the machine's worth: on a GPU the KV pool takes
``gpu_memory_utilization`` of the memory left once the weights are loaded, one step of the largest size
has run (its activation peak is measured, not guessed) and the executor's CUDA graphs are set aside:
every decode and piecewise graph the served executor captures is captured once against a one-block pool
and the free memory it took (graph pools, static buffers, the driver's graph objects) is reserved
(:class:`GraphCapture`; vLLM profiles its graphs the same way, rather than extrapolating from a few); the
served executor then captures the same graphs, in the same order (largest first), at load
(:func:`capture_graphs`). The scheduler admits as many sequences
and batches as many tokens as fill an H200: 256 sequences, 4096 tokens a step in prompt chunks of up to
1024 (measured on the H200: a step of more tokens than the torch executor's piecewise CUDA graphs cover,
4096, runs eagerly; 8192 / 512 gave 0.72x the throughput of 4096 / 1024 on the 8B burst). On the CPU the
pool takes a bounded share of the available RAM. Neither pool holds more than ``max_num_seqs``
full-length sequences. Blocks are counted in the cache's real bytes per token: with
``kv_cache_dtype="fp8"`` (1-byte E4M3 elements) the same bytes hold twice the BF16 blocks.
``from_pretrained``, ``load``, ``trtforge generate`` and ``trtforge serve`` all size through here.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtforge.errors import UserError
from trtforge.llm.executors.base import kv_block_bytes
from trtforge.llm.sched.scheduler import SchedulerConfig

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 4096
DEFAULT_MAX_PREFILL_CHUNK = 1024
# the CPU pool: this share of the RAM available when the model is loaded, and never more than CPU_KV_CAP
CPU_KV_FRACTION = 0.1
CPU_KV_CAP = 2 << 30
MIN_BLOCKS = 16


@dataclass(frozen=True)
class PoolSize:
    """A KV pool size and how it was reached (for logs and the server's startup line)."""

    num_blocks: int
    block_bytes: int
    budget_bytes: int
    activation_peak_bytes: int
    how: str
    # free GPU memory the served executor's CUDA graphs take, measured and set aside (0: none captured)
    graph_bytes: int = 0


@dataclass(frozen=True)
class GraphCapture:
    """The CUDA graphs a served torch executor captures at load: decode graphs up to `max_decode_batch`
    sequences for each query length of `q_lens` (2..8: speculative verification), piecewise graphs of
    steps with prompt tokens up to `max_graph_tokens`. The sizing measures what they take and reserves
    it; :func:`capture_graphs` captures them."""

    max_decode_batch: int
    max_graph_tokens: int = 4096
    q_lens: tuple[int, ...] = (1,)

    def executor_kwargs(self) -> dict[str, int]:
        """The TorchExecutor arguments that fix these graphs' buckets."""
        return {"max_decode_batch": self.max_decode_batch, "max_graph_tokens": self.max_graph_tokens}


def capture_graphs(executor: Any, graphs: GraphCapture) -> int:
    """Capture `graphs` on a torch `executor` (built with ``graphs.executor_kwargs()``): the piecewise
    buckets, then the decode buckets, each largest first; the order the sizing measured. Returns the
    graphs captured (0 where the executor runs without CUDA graphs)."""
    n = executor.capture_mixed_graphs()
    executor.capture_decode_graphs(max_batch=graphs.max_decode_batch, q_lens=graphs.q_lens)
    return n + executor.num_cuda_graphs


def default_scheduler_config(
    config: SchedulerConfig | None, max_num_seqs: int | None = None
) -> SchedulerConfig:
    """`config` as given, else the machine-filling defaults (256 sequences, 4096 tokens a step, prompt
    chunks of 1024); `max_num_seqs` overrides either."""
    if config is not None and not isinstance(config, SchedulerConfig):
        raise UserError(f"config must be a SchedulerConfig, got {type(config).__name__}.")
    if config is None:
        config = SchedulerConfig(
            max_num_seqs=DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_prefill_chunk=DEFAULT_MAX_PREFILL_CHUNK,
        )
    if max_num_seqs is not None:
        import dataclasses

        config = dataclasses.replace(config, max_num_seqs=max_num_seqs)
    config.validate()
    return config


def check_utilization(value: float) -> float:
    """`value` if it is a fraction in (0, 1], else a UserError naming --gpu-memory-utilization."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UserError(f"--gpu-memory-utilization must be a fraction in (0, 1], got {value!r}.")
    return float(value)


def gpu_pool(
    free_bytes: int,
    activation_peak: int,
    utilization: float,
    block_bytes: int,
    max_blocks_needed: int | None = None,
    graph_bytes: int = 0,
) -> PoolSize:
    """The GPU pool: `utilization` of what is free after the weights, the activation peak and the CUDA
    graphs' `graph_bytes`, and no more blocks than `max_blocks_needed` (what max_num_seqs full
    sequences hold: a tiny model would otherwise get tens of millions of blocks it can never fill).
    What stays free beyond the pool is therefore at least the activation peak plus the graphs."""
    utilization = check_utilization(utilization)
    budget = int(utilization * (free_bytes - activation_peak - graph_bytes))
    blocks = budget // block_bytes
    if max_blocks_needed is not None:
        blocks = min(blocks, max_blocks_needed)
    if blocks < MIN_BLOCKS:
        raise UserError(
            f"the GPU has {free_bytes / 2**30:.2f} GiB free after the weights and needs "
            f"{activation_peak / 2**30:.2f} GiB for a step's activations and {graph_bytes / 2**30:.2f} GiB "
            f"for its CUDA graphs: {max(blocks, 0)} KV blocks fit at "
            f"--gpu-memory-utilization {utilization} (at least {MIN_BLOCKS} needed). Free GPU memory, raise "
            "--gpu-memory-utilization, or lower --max-num-batched-tokens / --max-model-len."
        )
    how = (
        f"{utilization:g} x ({free_bytes / 2**30:.2f} GiB free after the weights - "
        f"{activation_peak / 2**30:.2f} GiB measured activation peak - "
        f"{graph_bytes / 2**30:.2f} GiB measured CUDA graphs)"
    )
    return PoolSize(blocks, block_bytes, budget, activation_peak, how, graph_bytes)


def cpu_pool(available_bytes: int, block_bytes: int, max_blocks_needed: int) -> PoolSize:
    """The CPU pool: CPU_KV_FRACTION of the available RAM, at most CPU_KV_CAP and `max_blocks_needed`."""
    budget = min(int(CPU_KV_FRACTION * available_bytes), CPU_KV_CAP)
    blocks = min(budget // block_bytes, max_blocks_needed)
    if blocks < MIN_BLOCKS:
        raise UserError(
            f"{available_bytes / 2**30:.2f} GiB of RAM available: {blocks} KV blocks of "
            f"{block_bytes / 2**20:.2f} MiB fit in the CPU's share ({CPU_KV_FRACTION:g}); give num_blocks "
            "(--num-blocks) explicitly."
        )
    how = (
        f"min({CPU_KV_FRACTION:g} x {available_bytes / 2**30:.2f} GiB available RAM, "
        f"{CPU_KV_CAP / 2**30:g} GiB, max_num_seqs full sequences)"
    )
    return PoolSize(blocks, block_bytes, budget, 0, how)


def available_ram() -> int:
    """Bytes of RAM available to new allocations (MemAvailable on Linux, else free pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def blocks_for_sequences(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """Blocks that `max_num_seqs` sequences of `max_model_len` tokens hold at most."""
    return max_num_seqs * -(-max_model_len // block_size)


def profile_step(num_tokens: int, chunk: int, block_size: int) -> Any:
    """The largest prefill step the scheduler forms: `num_tokens` fresh prompt tokens in chunks of at
    most `chunk`, laid out in blocks 0.. (a pool of ``ceil(num_tokens / block_size) + 1`` blocks holds it)."""
    import numpy as np

    from trtforge.llm.executors.base import StepBatch

    lens = [min(chunk, num_tokens - s) for s in range(0, num_tokens, chunk)]
    tables, slots, block = [], [], 0
    for n in lens:
        width = -(-n // block_size)
        tables.append(list(range(block, block + width)))
        slots.append([(block + i // block_size) * block_size + i % block_size for i in range(n)])
        block += width
    return StepBatch.build(
        [f"profile-{i}" for i in range(len(lens))],
        [np.ones(n, dtype=np.int64).tolist() for n in lens],
        [0] * len(lens),
        tables,
        slots,
        [True] * len(lens),
    )


def model_kv_block_bytes(lm: Any, block_size: int, itemsize: int) -> int:
    """One KV block of causal LM `lm` over all its layers (the geometry its family adapter reads, as
    the executor's pools do), at `itemsize` bytes an element; of one rank's shard, that rank's share
    of the KV heads."""
    from trtforge.llm.models.families import adapter_for

    a = adapter_for(lm, "the torch executor")  # (whose pool this sizes)
    return kv_block_bytes(a.num_layers, a.num_kv_heads, a.head_dim, block_size, itemsize)


def measure_graphs(probe: Any, graphs: GraphCapture, free: Callable[[], int]) -> int:
    """Bytes of free memory (`free()`: the device's, settled) that capturing `graphs` on `probe` (an
    executor over a one-block pool, built with ``graphs.executor_kwargs()``) takes: graph pools, static
    buffers, the driver's graph objects, and the kernels and workspaces first loaded for them."""
    before = free()
    capture_graphs(probe, graphs)
    return max(0, before - free())


def _settled_free(dev: Any) -> int:
    """Free bytes on `dev` once queued work is done, garbage is collected and the cache is emptied."""
    import torch

    torch.cuda.synchronize(dev)
    gc.collect()
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info(dev)[0])


def torch_pool(
    lm: Any,
    *,
    block_size: int,
    device: Any,
    dtype: Any,
    max_model_len: int | None,
    config: SchedulerConfig,
    gpu_memory_utilization: float,
    executor_kwargs: dict[str, Any] | None = None,
    tensor_parallel: Any = None,
    kv_cache_dtype: str = "auto",
    graphs: GraphCapture | bool = True,
) -> PoolSize:
    """Size the torch executor's pool for `lm` (moved to `device`/`dtype` here), in blocks of the real
    bytes of `kv_cache_dtype` ("auto": the model's dtype; "fp8": 1 byte an element).

    On CUDA: load the weights, run one step of ``config.max_num_batched_tokens`` prompt tokens through
    an executor with a pool just large enough for it, and take the measured peak above the weights;
    then, unless `graphs` is False, capture the served executor's CUDA graphs (`graphs`, or with True
    the defaults for `config`: decode graphs to ``max_num_seqs``, piecewise graphs to 4096 tokens)
    against a one-block pool and reserve the free memory they took. The caller captures the same
    graphs at load (:func:`capture_graphs`); graphs captured later, on first use, are not covered.
    `tensor_parallel`: `lm` is one rank's shard (:mod:`trtforge.llm.models.parallel`); its blocks hold
    its share of the KV heads, and the probe step runs with the other ranks (each sizes at once).
    """
    import torch

    from trtforge.llm.executors.kv_cache import kv_element_bytes
    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.families import adapter_for

    check_utilization(gpu_memory_utilization)
    if graphs is True:
        graphs = GraphCapture(max_decode_batch=config.max_num_seqs)
    if device is not None or dtype is not None:
        lm.to(device=device, dtype=dtype)
    param = next(lm.parameters())
    # the executor's own default length: the family adapter's (a dynamic rotary's scaled length, MPT's
    # max_seq_len), not the config's max_position_embeddings (a fixed 2048 where a config has none)
    longest = adapter_for(lm, "the torch executor").max_length
    need = blocks_for_sequences(config.max_num_seqs, int(max_model_len or longest), block_size)
    world = 1 if tensor_parallel is None else int(tensor_parallel.world)
    itemsize = kv_element_bytes(kv_cache_dtype, param.dtype)
    block_bytes = model_kv_block_bytes(lm, block_size, itemsize)
    if param.device.type != "cuda":  # (ranks on one host share its RAM: each takes its share)
        return cpu_pool(available_ram() // world, block_bytes, need)
    tokens = config.max_num_batched_tokens
    dev = param.device
    common = {
        "block_size": block_size,
        "max_model_len": max_model_len,
        "tensor_parallel": tensor_parallel,
        # the probes' pools are the served ones' dtype; their scales do not matter to memory
        "kv_cache_dtype": kv_cache_dtype,
        "kv_scales": None if kv_cache_dtype == "auto" else 1.0,
    }
    probe = TorchExecutor(
        lm,
        num_blocks=-(-tokens // block_size) + 1,
        static_decode=False,
        mixed_graphs=False,
        **common,
        **(executor_kwargs or {}),
    )
    batch = profile_step(tokens, config.max_prefill_chunk, block_size)
    _settled_free(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    with torch.inference_mode():
        probe.step(batch)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - base
    del probe
    graph_bytes = 0
    if graphs is not False:
        kwargs = {**graphs.executor_kwargs(), **(executor_kwargs or {})}
        probe = TorchExecutor(lm, num_blocks=1, **common, **kwargs)
        graph_bytes = measure_graphs(probe, graphs, lambda: _settled_free(dev))
        del probe
    free = _settled_free(dev)
    return gpu_pool(free, peak, gpu_memory_utilization, block_bytes, need, graph_bytes)
