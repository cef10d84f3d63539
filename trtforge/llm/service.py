"""`trtforge.llm.load` / `from_pretrained`: one object that generates, streams and reports memory.

Every model loads as a :class:`ServingLLM`, served by :class:`trtforge.llm.engine.LLMEngine` with
continuous batching: a paged step graph (ONNX Runtime), a paged step engine (TensorRT) or a
transformers model (torch) over a paged KV cache, and a slot-layout step graph (ONNX Runtime) over a
pool of its cache rows, one block of max_seq tokens per sequence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from trtforge.errors import UserError, checked_call, is_int, shown
from trtforge.llm import sizing
from trtforge.llm.contract import DEFAULT_BLOCK_SIZE
from trtforge.llm.engine import Completion, LLMEngine, RequestHandle
from trtforge.llm.executors.base import PoolAllocationError, StepExecutor
from trtforge.llm.prompts import check_calib_prompts
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.blocks import MemoryStats
from trtforge.llm.sched.scheduler import SchedulerConfig, SchedulerStats
from trtforge.llm.spec.config import DRAFT_REFUSAL, SpeculativeConfig
from trtforge.llm.spec.proposers import Proposer, check_draft_vocabulary

EXECUTORS = ("auto", "onnxruntime", "tensorrt", "torch")


class ServingLLM:
    """A model behind :class:`LLMEngine`: batched `generate`, token `stream`, `memory_stats`.

    Close it (or use it as a context manager) to stop the engine's background loop.
    """

    def __init__(
        self,
        executor: StepExecutor,
        config: SchedulerConfig | None = None,
        *,
        proposer: Proposer | None = None,
        speculative: SpeculativeConfig | None = None,
    ) -> None:
        self.executor = executor
        self.engine = LLMEngine(executor, config, proposer=proposer)
        # closed when dropped unclosed too: the engine's loop thread and heap freeze must not outlive it
        self._finalizer = weakref.finalize(self, _shut_down, self.engine, executor)
        # how the KV pool was sized, where it was (:func:`trtforge.llm.sizing.torch_pool`), else None
        self.pool_size: sizing.PoolSize | None = None
        # speculative decoding in force (None: off), as reported with the engine's configuration
        self.speculative = speculative

    @staticmethod
    def _params(
        params: SamplingParams | None, max_new_tokens: int | None, stop_at_eos: bool
    ) -> SamplingParams:
        if params is not None and not isinstance(params, SamplingParams):
            raise UserError(f"params must be a SamplingParams, got {type(params).__name__}.")
        if not isinstance(stop_at_eos, bool):  # (a string such as "no" is truthy: it would stop at EOS)
            raise UserError(f"stop_at_eos must be True or False, got {shown(stop_at_eos)}.")
        changes: dict[str, Any] = {}
        if max_new_tokens is not None:
            changes["max_tokens"] = max_new_tokens
        if not stop_at_eos:
            changes["ignore_eos"] = True
        if params is None:
            return SamplingParams(**changes)
        return dataclasses.replace(params, **changes) if changes else params

    @checked_call
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = None,
        stop_at_eos: bool = True,
    ) -> list[list[int]]:
        """New token ids of each prompt, all prompts batched together; greedy unless `params` samples.

        `max_new_tokens` (and `stop_at_eos=False`) override those fields of `params`. A request that
        fails raises its error (StepFailedError for an executor fault).
        """
        if hasattr(prompts, "tolist"):
            prompts = prompts.tolist()
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise UserError("prompts must be a non-empty list of token-id lists, e.g. [[1, 2, 3]].")
        p = self._params(params, max_new_tokens, stop_at_eos)
        return [list(c.token_ids) for c in self._raise_failed(self.engine.generate(prompts, p))]

    @checked_call
    def completions(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Like :meth:`generate` but returns each :class:`Completion` (finish reason, error) as is."""
        return self.engine.generate(prompts, params)

    @staticmethod
    def _raise_failed(completions: list[Completion]) -> list[Completion]:
        for c in completions:
            if c.error is not None:
                raise c.error
        return completions

    @checked_call
    def stream(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = None,
        stop_at_eos: bool = True,
    ) -> Iterator[int]:
        """Yield one prompt's new token ids as they are sampled; closing the iterator cancels it."""
        return self.engine.stream(prompt, self._params(params, max_new_tokens, stop_at_eos))

    @checked_call
    def astream(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = None,
        stop_at_eos: bool = True,
    ) -> AsyncIterator[int]:
        """Async twin of :meth:`stream`."""
        return self.engine.astream(prompt, self._params(params, max_new_tokens, stop_at_eos))

    @checked_call
    def submit(self, prompt: Sequence[int], params: SamplingParams | None = None) -> RequestHandle:
        """Queue one request; its handle iterates tokens, waits for the result or cancels."""
        return self.engine.submit(prompt, params)

    def memory_stats(self) -> MemoryStats:
        """KV pool occupancy (blocks used, free, cached, slots wasted), and the GPU memory the sizing set
        aside for the executor's CUDA graphs (``graph_bytes``)."""
        stats = self.engine.memory_stats()
        if self.pool_size is None or not self.pool_size.graph_bytes:
            return stats
        return dataclasses.replace(stats, graph_bytes=self.pool_size.graph_bytes)

    @property
    def stats(self) -> SchedulerStats:
        return self.engine.stats

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.executor.facts.eos_token_ids)

    def close(self) -> None:
        """Stop the engine, then the executor's own processes if it has any (tensor parallelism). A
        ServingLLM dropped without it is closed when it is garbage (and at interpreter exit)."""
        self._finalizer()

    def __enter__(self) -> ServingLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shut_down(engine: LLMEngine, executor: StepExecutor) -> None:
    """What :meth:`ServingLLM.close` does, once: the engine, then the executor's processes, if any."""
    try:
        engine.close()
    finally:
        close = getattr(executor, "close", None)
        if callable(close):
            close()


def _config(config: SchedulerConfig | None, max_num_seqs: int | None) -> SchedulerConfig | None:
    if config is not None and not isinstance(config, SchedulerConfig):
        raise UserError(f"config must be a SchedulerConfig, got {type(config).__name__}.")
    if max_num_seqs is None:
        return config
    return dataclasses.replace(config or SchedulerConfig(), max_num_seqs=max_num_seqs)


@checked_call
def load(
    path: str | os.PathLike[str],
    executor: str = "auto",
    *,
    num_blocks: int | None = None,
    max_model_len: int | None = None,
    config: SchedulerConfig | None = None,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float = sizing.DEFAULT_GPU_MEMORY_UTILIZATION,
    speculative: dict[str, Any] | SpeculativeConfig | None = None,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    calib_prompts: Sequence[Sequence[int]] | None = None,
    lm_head_quantization: str | None = None,
    device: str | None = None,
    dtype: Any = None,
) -> ServingLLM:
    """Load a model for generation: always a :class:`ServingLLM`.

    - A paged step engine (``trtforge compile --generate --cache-layout paged -o m.engine``) ->
      :class:`ServingLLM` over TensorRT on the GPU (``executor`` "auto" or "tensorrt").
    - A paged step graph (``export_step(..., cache_layout="paged")``) -> :class:`ServingLLM` over
      exact ONNX Runtime with `num_blocks` blocks (default: max_batch full sequences).
    - A slot-layout step graph (``trtforge compile --generate --save-onnx``) -> :class:`ServingLLM`
      over exact ONNX Runtime with `num_blocks` cache rows (default: max_batch), one per sequence.
    - ``executor="torch"``: `path` is a save_pretrained directory or ``module:factory``; see
      :func:`from_pretrained` (and its `tensor_parallel_size`, for this executor only).

    Sizes not given default to the machine's (:mod:`trtforge.llm.sizing`). `speculative`,
    `kv_cache_dtype` "fp8", `device` and `dtype`: see :func:`from_pretrained` (the torch executor only);
    step graphs and engines keep their own cache dtype and precision.
    """
    from trtforge.llm.executors.kv_cache import kv_cache_dtype_name

    if executor not in EXECUTORS:
        raise UserError(f"executor {executor!r} is not available; choose one of {', '.join(EXECUTORS)}.")
    sizing.check_utilization(gpu_memory_utilization)  # (NaN was accepted where no pool is sized by it)
    if speculative is not None and executor != "torch":
        _refuse_speculation(path, executor)
    if executor == "torch":
        return from_pretrained(
            path,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            config=config,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization,
            speculative=speculative,
            tensor_parallel_size=tensor_parallel_size,
            kv_cache_dtype=kv_cache_dtype,
            quantization=quantization,
            calib_prompts=calib_prompts,
            lm_head_quantization=lm_head_quantization,
            device=device,
            dtype=dtype,
        )
    given = (
        ("quantization", quantization),
        ("lm_head_quantization", lm_head_quantization),
        ("device", device),
        ("dtype", dtype),
    )
    for name, value in given:
        if value is not None:
            raise UserError(
                f"{name}={shown(value)} applies to the torch executor (executor='torch' or "
                "trtforge.llm.from_pretrained); compiled step graphs and engines carry their own precision."
            )
    if not is_int(tensor_parallel_size) or tensor_parallel_size < 1:  # (was "0 needs the torch executor")
        raise UserError(
            "tensor_parallel_size must be an integer >= 1 (2 or more splits the model, on the torch "
            f"executor), got {shown(tensor_parallel_size)}."
        )
    if tensor_parallel_size != 1:
        raise UserError(
            f"tensor_parallel_size {tensor_parallel_size} needs the torch executor (a save_pretrained "
            f"directory or module:factory); executor {executor!r} runs one process. Use executor='torch'."
        )
    runs = "TensorRT" if executor == "tensorrt" or str(path).endswith(".engine") else "ONNX Runtime"
    if calib_prompts is not None and kv_cache_dtype_name(kv_cache_dtype) == "auto":
        raise UserError(
            f"calibration prompts (--calib-data) feed the torch executor's quantization and FP8 KV scales; "
            f"the {runs} executor runs a compiled step graph or engine, calibrated when it was compiled "
            "(trtforge compile --generate --calib-data). Drop --calib-data, or use --executor torch."
        )
    if kv_cache_dtype_name(kv_cache_dtype) != "auto" or calib_prompts is not None:
        raise UserError(
            f"kv_cache_dtype (--kv-cache-dtype) {kv_cache_dtype!r} and its calibration prompts "
            f"(--calib-data) are not supported by the {runs} executor yet: a step graph or engine keeps "
            "the KV cache in the dtype it was compiled with. FP8 KV caches run on the torch executor: "
            "trtforge.llm.from_pretrained(model_dir, kv_cache_dtype='fp8') or --executor torch."
        )
    from trtforge._fileio import as_path
    from trtforge.llm.executors.onnxruntime_exec import OrtPagedExecutor, read_generation
    from trtforge.llm.executors.onnxruntime_slot import OrtSlotPoolExecutor

    p = as_path(path, "the model to load")
    if not os.fspath(path):  # Path('') is '.', the current directory: not what was given
        raise UserError("the model to load is an empty path (''); expected a step graph (.onnx) or engine.")
    if executor == "auto":
        executor = "tensorrt" if p.suffix == ".engine" else "onnxruntime"
    if executor == "tensorrt":
        return _load_engine(p, num_blocks, max_model_len, config, max_num_seqs)
    if p.is_dir():
        raise UserError(
            f"'{p}' is a directory; the onnxruntime executor loads a step graph (.onnx). For a "
            "save_pretrained directory use executor='torch' (trtforge.llm.from_pretrained)."
        )
    if p.suffix == ".engine":
        raise UserError(
            f"'{p}' is a TensorRT engine; the onnxruntime executor runs the step graph. Load the engine "
            "with executor='tensorrt' (a paged step engine), or the ONNX written by `trtforge compile "
            "--generate --save-onnx step.onnx`."
        )
    generation = read_generation(p)  # (a missing file or a graph without the metadata: a UserError)
    if generation.get("cache", {}).get("layout") != "paged":
        slot = OrtSlotPoolExecutor(p, num_blocks, max_model_len=max_model_len, generation=generation)
        why = "a slot graph's step batch and prompt chunks stay within the sizes it was exported for"
        return ServingLLM(slot, _limited(config, max_num_seqs, generation, "step graph", why))
    ex = OrtPagedExecutor(p, num_blocks, max_model_len=max_model_len, generation=generation)
    return ServingLLM(ex, sizing.default_scheduler_config(config, max_num_seqs))


def _refuse_speculation(path: Any, executor: str) -> None:
    """UserError: `speculative` asked of `executor`, which is not the torch one. A save_pretrained
    directory or module:factory under executor "auto" (which loads step graphs and engines) is told to
    pass executor='torch'; the message said it "runs on executor 'auto'" and to "serve the model's
    directory", which it was."""
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    torch_source = os.path.isdir(text) or (":" in text and not os.path.exists(text))
    if torch_source:
        raise UserError(
            f"speculative decoding runs on the torch executor: '{text}' is a save_pretrained directory or "
            f"module:factory, which it serves; pass executor='torch' (executor {executor!r} loads step "
            "graphs and engines, which cannot speculate)."
        )
    raise UserError(
        f"speculative decoding runs on the torch executor only; '{text}' runs on executor {executor!r} (a "
        "step graph or engine, which cannot speculate). Drop the speculative option, or load the model's "
        "save_pretrained directory (or module:factory) with executor='torch'."
    )


def engine_config(
    config: SchedulerConfig | None,
    limits: dict[str, int],
    what: str = "step engine",
    why: str = "TensorRT profiles bound every step's shapes",
) -> SchedulerConfig:
    """`config` within a step engine's (or graph's) limits (SchedulerConfig field -> largest value).

    Fields left at their defaults are lowered to the limits; values set above them are refused.
    """
    config = config or SchedulerConfig()
    defaults = SchedulerConfig()
    over = {k: getattr(config, k) for k, v in limits.items() if getattr(config, k) > v}
    refused = {k: v for k, v in over.items() if v != getattr(defaults, k)}
    if refused:
        raise UserError(
            f"SchedulerConfig {refused} exceeds the {what}'s limits {limits} (its --max-batch and "
            f"--max-prefill: {why}). Lower them, or rebuild the {what} with larger limits."
        )
    return dataclasses.replace(config, **{k: limits[k] for k in over})


def _limited(
    config: SchedulerConfig | None,
    max_num_seqs: int | None,
    generation: dict[str, Any],
    what: str,
    why: str,
) -> SchedulerConfig:
    """`config` and `max_num_seqs` within the max batch and max prefill of a step engine or graph."""
    config = _config(config, None)  # (refuses what is not a SchedulerConfig)
    if max_num_seqs is not None and max_num_seqs > generation["max_batch"]:
        raise UserError(
            f"max_num_seqs {max_num_seqs} exceeds the {what}'s max batch {generation['max_batch']} "
            "(--max-batch)."
        )
    limits = {"max_num_seqs": generation["max_batch"], "max_prefill_chunk": generation["max_prefill"]}
    config = engine_config(config, limits, what, why)
    return config if max_num_seqs is None else dataclasses.replace(config, max_num_seqs=max_num_seqs)


def _load_engine(
    path: Path,
    num_blocks: int | None,
    max_model_len: int | None,
    config: SchedulerConfig | None,
    max_num_seqs: int | None,
) -> ServingLLM:
    """A paged step engine behind the TensorRT executor; manifest and limits are checked before the GPU."""
    from trtforge.llm.executors.tensorrt_exec import TrtPagedExecutor, read_step_engine

    if path.suffix != ".engine":
        raise UserError(
            f"'{path}': the tensorrt executor runs a step engine (.engine with its .engine.json manifest) "
            "from `trtforge compile MODEL --generate --cache-layout paged`; step graphs (.onnx) run on "
            "executor='onnxruntime'."
        )
    spec = read_step_engine(path)  # the one read of the manifest: the executor and runtime get it
    why = "TensorRT profiles bound every step's shapes"
    config = _limited(config, max_num_seqs, spec.generation, "step engine", why)
    return ServingLLM(TrtPagedExecutor(path, num_blocks, max_model_len=max_model_len, spec=spec), config)


@checked_call
def from_pretrained(
    model: Any,
    *,
    num_blocks: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    device: str | None = None,
    dtype: Any = None,
    max_model_len: int | None = None,
    config: SchedulerConfig | None = None,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float = sizing.DEFAULT_GPU_MEMORY_UTILIZATION,
    speculative: dict[str, Any] | SpeculativeConfig | None = None,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    calib_prompts: Sequence[Sequence[int]] | None = None,
    lm_head_quantization: str | None = None,
) -> ServingLLM:
    """Serve a transformers causal LM (an nn.Module, a save_pretrained directory or ``module:factory``)
    with the torch paged executor (:class:`trtforge.llm.executors.torch_exec.TorchExecutor`).

    `num_blocks` None sizes the pool to the machine (:func:`trtforge.llm.sizing.torch_pool`: on a GPU
    `gpu_memory_utilization` of the memory left after the weights and a measured step, in the cache's
    real bytes per token); `config` None takes :func:`trtforge.llm.sizing.default_scheduler_config`.

    `quantization` ("fp8", "int4-awq", "int4-rtn"; :mod:`trtforge.llm.quant`) quantizes the Llama-style
    projections once the model is on its device, before the pool is sized (so the freed weight bytes
    go to the KV cache); "int4-awq" searches its scales on `calib_prompts` (lists of token ids). The
    executor's ``facts.quantization`` records it.

    `lm_head_quantization` "fp8" quantizes the LM head too (with any `quantization`, or none): E4M3
    weights with per-row scales, the fp8 projections' format and kernels (weight-only at one token,
    W8A8 above). It halves the bytes of a BF16 head, which every decoded token reads (1.05 GB at
    Llama-3-8B), and costs some perplexity (BENCHMARKS.md, session 14); an input embedding tied to the
    head stays exact (the FP8 head is then an extra copy). ``facts.lm_head_quantization`` records it.

    `kv_cache_dtype`: "auto" (the model's dtype) or "fp8" (E4M3 pools, half the bytes of BF16, with one
    K and one V scale per layer calibrated on `calib_prompts`, token-id lists as ``--calib-data``
    gives them; None: seeded random ids). FP8 needs a GPU of compute capability 8.9+ (or the CPU).

    `speculative`: speculative decoding (:class:`~trtforge.llm.spec.config.SpeculativeConfig`), e.g.
    ``{"method": "draft", "model": DIR, "num_tokens": 4}`` or ``{"method": "ngram", "num_tokens": 4}``.
    Greedy output is token for token the same; sampled output has the same distribution. Steps run
    synchronously then; requests with a grammar, logprobs, penalties or a logit_bias decode without
    speculating.

    `tensor_parallel_size` N > 1 splits the model over N worker processes (Megatron-style: heads, KV
    heads and MLP width divided, :mod:`trtforge.llm.executors.tensor_parallel`): gloo on the CPU, one
    GPU per rank with NCCL on CUDA. Each worker loads `model` itself (a directory or factory; an
    nn.Module is pickled to it), so the weights never gather in this process."""
    from trtforge.llm.executors.kv_cache import kv_cache_dtype_name
    from trtforge.llm.executors.torch_exec import MAX_STATIC_Q_LEN, TorchExecutor
    from trtforge.llm.models.base import logits_width
    from trtforge.llm.models.loader import load_causal_lm, refuse_empty_path
    from trtforge.llm.quant import quantize_model
    from trtforge.llm.quant.apply import check_lm_head_quantization, check_quantization
    from trtforge.llm.text import check_draft_directories

    refuse_empty_path(model)  # (before tensor-parallel workers start, each to fail on it)
    dtype = check_torch_options(
        device=device,
        dtype=dtype,
        block_size=block_size,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        calib_prompts=calib_prompts,
    )
    block_size, tensor_parallel_size = int(block_size), int(tensor_parallel_size)  # (NumPy integers too)
    num_blocks = None if num_blocks is None else int(num_blocks)
    max_model_len = None if max_model_len is None else int(max_model_len)
    spec = SpeculativeConfig.of(speculative)
    check_quantization(quantization)
    check_lm_head_quantization(lm_head_quantization)
    kv_cache_dtype = kv_cache_dtype_name(kv_cache_dtype)  # refused before the model loads
    if calib_prompts is not None and kv_cache_dtype == "auto" and quantization != "int4-awq":
        raise UserError(
            "calib_prompts (--calib-data) calibrate int4-awq's scales and the FP8 KV cache's; with "
            f"{'no quantization' if quantization is None else f'quantization={quantization!r}'} and "
            "kv_cache_dtype='auto' there is nothing to calibrate. Pass "
            "quantization='int4-awq' or kv_cache_dtype='fp8' (--kv-cache-dtype fp8), or drop them."
        )
    quantized = quantization is not None or lm_head_quantization is not None
    # (each as name='value', listed as "a, b and c": the CLI words each as its flag, `--kv-cache-dtype fp8`)
    given = [
        f"{name}={value!r}"
        for name, value in (
            ("kv_cache_dtype", None if kv_cache_dtype == "auto" else kv_cache_dtype),
            ("quantization", quantization),
            ("lm_head_quantization", lm_head_quantization),
        )
        if value is not None
    ]
    if tensor_parallel_size != 1 and given:
        one = len(given) == 1
        listed = given[0] if one else f"{', '.join(given[:-1])} and {given[-1]}"
        raise UserError(
            f"{listed} {'does' if one else 'do'} not run with tensor_parallel_size > 1 yet; "
            f"pass tensor_parallel_size=1 or drop {'it' if one else 'them'}."
        )
    config = sizing.default_scheduler_config(config, max_num_seqs)
    if tensor_parallel_size != 1:
        if spec is not None:
            raise UserError(
                "speculative decoding does not run with tensor_parallel_size > 1 yet; pass one of them."
            )
        return _tensor_parallel(
            model,
            tensor_parallel_size,
            num_blocks=num_blocks,
            block_size=block_size,
            device=device,
            dtype=dtype,
            max_model_len=max_model_len,
            config=config,
            gpu_memory_utilization=gpu_memory_utilization,
        )
    if spec is not None and config.async_scheduling is None:
        config = dataclasses.replace(config, async_scheduling=False)
    draft_lm = None
    if spec is not None and spec.method == "draft":  # before the target's weights: a bad draft fails at once
        check_draft_directories(model, spec.model)
        draft_lm = _load_draft(spec.model)
    lm = load_causal_lm(model)
    if draft_lm is not None:  # before the pool and the executors (graph captures, on CUDA) are made
        with _draft_refusal():
            check_draft_vocabulary(logits_width(draft_lm), logits_width(lm), _draft_name(spec.model))
    if quantized:
        if device is not None or dtype is not None:
            lm.to(device=device, dtype=dtype)
        quantize_model(
            lm, quantization, calib_prompts, user="from_pretrained", lm_head_quantization=lm_head_quantization
        )
    if draft_lm is not None and (device is not None or dtype is not None):  # before sizing: its weights count
        draft_lm.to(device=device, dtype=dtype)
    pool = None
    # the CUDA graphs a sized pool reserves memory for, captured at load (with speculation: the
    # verification steps' widths too)
    graphs = sizing.GraphCapture(
        max_decode_batch=config.max_num_seqs,
        q_lens=(1,) if spec is None else tuple(range(1, min(spec.num_tokens + 1, MAX_STATIC_Q_LEN) + 1)),
    )
    if num_blocks is None:
        pool = sizing.torch_pool(
            lm,
            block_size=block_size,
            device=device,
            dtype=dtype,
            max_model_len=max_model_len,
            config=config,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_dtype=kv_cache_dtype,
            graphs=graphs,
        )
        num_blocks = pool.num_blocks
        if draft_lm is not None and spec.num_blocks is None:  # both pools, as many blocks, in one budget
            draft_block = sizing.model_kv_block_bytes(
                draft_lm, block_size, next(draft_lm.parameters()).element_size()
            )
            num_blocks = max(1, num_blocks * pool.block_bytes // (pool.block_bytes + draft_block))
            how = f"{pool.how}, shared with the draft model's pool ({num_blocks} blocks each)"
            pool = dataclasses.replace(pool, num_blocks=num_blocks, how=how)
    try:
        ex = TorchExecutor(
            lm,
            num_blocks=num_blocks,
            block_size=block_size,
            device=device,
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_dtype=kv_cache_dtype,
            calib_prompts=calib_prompts,
            **graphs.executor_kwargs(),  # decode graphs cover the whole running batch
        )
    except (MemoryError, RuntimeError, TypeError, OverflowError) as exc:
        if pool is not None or not allocation_failure(exc):  # (a pool sized here fits by construction)
            raise
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise PoolAllocationError(num_blocks, detail) from exc
    if pool is not None:  # what the sizing measured and reserved, captured now rather than on first use
        sizing.capture_graphs(ex, graphs)
    proposer = None if spec is None else make_proposer(spec, ex, draft_lm)
    served = ServingLLM(ex, config, proposer=proposer, speculative=spec)
    served.pool_size = pool
    return served


# how torch (CPU and CUDA) and numpy word a size they cannot allocate or represent
_ALLOCATION_FAILURES = ("can't allocate memory", "out of memory", "overflow", "too large to convert")


def allocation_failure(exc: BaseException) -> bool:
    """Whether `exc` is an allocator's refusal of a size: out of memory, or a size past int64."""
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return any(s in text for s in _ALLOCATION_FAILURES)


def check_torch_options(
    *,
    device: Any,
    dtype: Any,
    block_size: Any,
    num_blocks: Any,
    max_model_len: Any,
    tensor_parallel_size: Any,
    calib_prompts: Any,
) -> Any:
    """UserError naming the first :func:`from_pretrained` option of the wrong kind or range, before the
    model loads (torch's own errors named none: a ZeroDivisionError for block_size 0, an internal
    RuntimeError for device 'bogus' or a float calibration prompt, to()'s signature dump for a dtype
    given as a string). Returns `dtype` as a torch.dtype (a name such as "bfloat16" is accepted)."""
    for name, value, low in (("block_size", block_size, 1), ("num_blocks", num_blocks, 1)):
        if value is not None and (not is_int(value) or value < low):
            raise UserError(f"{name} must be an integer >= {low}, got {shown(value)}.")
    if max_model_len is not None and (not is_int(max_model_len) or max_model_len < 2):
        raise UserError(
            f"max_model_len must be None or an integer >= 2 (a prompt token and a new one), got "
            f"{shown(max_model_len)}."
        )
    if not is_int(tensor_parallel_size) or tensor_parallel_size < 1:
        raise UserError(
            f"tensor_parallel_size must be an integer >= 1 (2 or more splits the model), got "
            f"{shown(tensor_parallel_size)}."
        )
    check_device(device)
    check_calib_prompts(calib_prompts)
    return _torch_dtype(dtype)


def check_device(device: Any, what: str = "device") -> None:
    """UserError naming `what` (the argument or flag) unless `device` is None, cpu, or a CUDA device this
    machine has: torch's own errors say neither which argument nor what would do."""
    from trtforge.core.devices import resolve_device

    if device is not None:
        resolve_device(
            device,
            what,
            kinds=("cpu", "cuda"),
            runs_on="the torch executor runs on cpu or cuda",
            expected="expected 'cpu', 'cuda' or 'cuda:N' (or none: cuda if present, else cpu)",
        )


def default_device(device: Any, what: str = "device") -> str:
    """The device a command runs the torch executor (or the LLM report's variants) on: `device` checked
    (:func:`check_device`), or, for None, cuda where this machine has a GPU and cpu otherwise."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device, what)
    return str(device)


def placement(device: Any, dtype: str | None, what: str = "device") -> tuple[str, Any]:
    """The torch executor's (device, torch dtype) of the commands: :func:`default_device`, and for dtype
    None or "auto" bfloat16 on a GPU, float32 on the CPU (where bfloat16 GEMMs are slow or emulated)."""
    import torch

    where = default_device(device, what)
    if dtype is None or dtype == "auto":
        dtype = "bfloat16" if torch.device(where).type == "cuda" else "float32"
    return where, getattr(torch, dtype)


def _torch_dtype(dtype: Any) -> Any:
    """`dtype` as a floating torch.dtype (None stays None: the model's own, BF16 on a GPU)."""
    import torch

    if dtype is None:
        return None
    value = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise UserError(
            f"dtype must be None or a floating torch.dtype (torch.bfloat16, torch.float16, torch.float32) "
            f"or its name, got {shown(dtype)}."
        )
    return value


@contextlib.contextmanager
def _draft_refusal() -> Iterator[None]:
    """A UserError raised within, about the draft model, reworded to name the option (a command words
    it as its flag, --speculative-model): the loader's message ("'/x' is not a model file nor ...") did
    not say which of the two models it meant."""
    try:
        yield
    except UserError as exc:
        raise UserError(f"{DRAFT_REFUSAL}{exc}") from exc


def _draft_name(model: Any) -> str:
    """How a refusal names the draft model: its path, else its class."""
    named = isinstance(model, (str, os.PathLike))
    return f"'{os.fspath(model)}'" if named else f"the {type(model).__name__}"


def _load_draft(source: Any) -> Any:
    """The speculative draft model of `source` (:func:`load_causal_lm`), its refusal naming the option."""
    from trtforge.llm.models.loader import load_causal_lm

    with _draft_refusal():
        return load_causal_lm(source)


def make_proposer(spec: SpeculativeConfig, target: Any, draft_lm: Any = None) -> Proposer:
    """The proposer of `spec` for a torch executor `target`. A draft model (`draft_lm` if already
    loaded, else ``spec.model``) runs on the target's device and dtype, over a pool of
    ``spec.num_blocks`` blocks (default: as many as the target's)."""
    from trtforge.llm.spec.proposers import DraftModelProposer, NgramProposer

    if spec.method == "ngram":
        return NgramProposer(spec.num_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    from trtforge.llm.executors.torch_exec import TorchExecutor

    facts = target.facts
    draft = TorchExecutor(
        draft_lm if draft_lm is not None else _load_draft(spec.model),
        num_blocks=spec.num_blocks or facts.num_blocks,
        block_size=facts.block_size,
        device=str(target.device),
        dtype=target.dtype,
        static_decode=getattr(target, "static_decode", None),  # its steps take the target's path
    )
    draft.warm_up_mixed_attention()  # its prompt steps' attention compiled now, not mid-serve (CUDA)
    proposer = DraftModelProposer(draft, spec.num_tokens)
    with _draft_refusal():
        proposer.check_target(facts, _draft_name(spec.model))
    return proposer


def _tensor_parallel(
    model: Any,
    world: int,
    *,
    num_blocks: int | None,
    block_size: int,
    device: str | None,
    dtype: Any,
    max_model_len: int | None,
    config: SchedulerConfig,
    gpu_memory_utilization: float,
) -> ServingLLM:
    """`model` over `world` tensor-parallel workers (see :func:`from_pretrained`)."""
    import functools

    from trtforge.llm.executors.tensor_parallel import TensorParallelExecutor

    sizing.check_utilization(gpu_memory_utilization)
    size_pool = functools.partial(
        sizing.torch_pool,
        block_size=block_size,
        device=None,
        dtype=None,
        max_model_len=max_model_len,
        config=config,
        gpu_memory_utilization=gpu_memory_utilization,
        # the ranks capture their graphs on first use, with collectives in them: not measured here yet
        graphs=False,
    )
    ex = TensorParallelExecutor(
        model,
        world,
        num_blocks=num_blocks,
        block_size=block_size,
        device=device,
        dtype=dtype,
        max_model_len=max_model_len,
        size_pool=size_pool,
    )
    try:
        return ServingLLM(ex, config)
    except BaseException:
        ex.close()
        raise
