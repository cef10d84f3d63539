"""A torch step executor: runs a Hugging Face causal LM over paged KV pools (CPU or CUDA).

It drives the model's own modules (embedding, norms, projections, MLP, rotary table, LM head) through
its family adapter (:mod:`trtforge.llm.models`, the one the step-graph export uses, windows included)
and replaces only attention and the cache: each layer writes the step's new K/V into its pool at the
batch's slots, then attends through the block tables with a pluggable attention function. On CUDA
(FP16/BF16) the default is trtforge's Triton kernels (split-KV decode, chunked prefill; see
:mod:`trtforge.llm.executors.triton_attention`), and Llama-style layers run fused (RMSNorm, one QKV
GEMM, RoPE + K/V write in one kernel, residuals folded into GEMMs: :mod:`.fused_layers`). Sparse MoE
MLPs run the fused MoE kernels on CUDA wherever their blocks allow (:mod:`trtforge.kernels.moe`: no host
sync, so their steps are captured in CUDA graphs too), grouped elsewhere (:mod:`trtforge.llm.models.moe`).
Where the attention kernels do not run, the torch references (:mod:`trtforge.llm.executors.paged_attention`)
do; they are also the correctness oracle for the kernels.

Decode-only steps can run on *static* shapes: the batch is padded to a size bucket and the block
tables to a width bucket (padding rows write to and read from a scratch block), so each (batch,
width) bucket is one CUDA graph, captured on first use (or all up front:
:meth:`TorchExecutor.capture_decode_graphs`) and replayed after; this removes the per-kernel launch
cost that dominates small-batch decode. Speculative verification steps (every sequence brings 1 to 8
tokens, decodes and runs of k+1, and some run wants logits for more than its last token) take the
same path with each sequence padded to the step's longest run, q_len S: sequence b owns token rows
``[b*S, (b+1)*S)``, its tokens right-aligned and the rows before them padding (id 0, position 0, the
scratch slot), so the split-KV decode kernel attends the rows LOWER_RIGHT causally with query length
S; one graph per (batch, width, S) bucket, logits for every row, of which the step returns those
``logits_indices`` asks for. Other steps with prompt tokens are padded to a token-count bucket
and run as one graph per stretch of layers between attention calls, attention launched eagerly in
between (:mod:`trtforge.llm.executors.piecewise`). A decode step's inputs travel in one pinned host
buffer (two, used in turn, so that filling one never waits for the copy out of the other) and one
asynchronous copy.

``kv_cache_dtype="fp8"`` keeps the pools in FP8 E4M3 with one K and one V scale per layer
(:mod:`.kv_cache`): the kernels quantize as they write and dequantize in registers as they read; the
torch references attend in float32 over the dequantized values. The scales are calibrated at
construction (``calib_prompts``, else seeded random ids) unless ``kv_scales`` fixes them.

:meth:`TorchExecutor.step_async` serves asynchronous scheduling: nothing in a step waits for the
device (host inputs go through pinned memory), and the decode rows' input ids are gathered on the
device from the previous step's sampled tokens, after the inputs' copy and before the graph replay.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from trtforge.core.cuda_capture import gc_paused
from trtforge.errors import UserError, is_int
from trtforge.kernels.configs import MAX_Q_LEN
from trtforge.llm.contract import DEFAULT_BLOCK_SIZE
from trtforge.llm.executors.base import ExecutorFacts, StepBatch, TokenFeed
from trtforge.llm.executors.kv_cache import (
    KVScales,
    calibrate_kv_scales,
    kv_cache_dtype_name,
    resolve_kv_cache_dtype,
)
from trtforge.llm.executors.model_layers import ModelLayers
from trtforge.llm.executors.paged_attention import (
    AttentionFn,
    AttentionMetadata,
    DecodeAttentionFn,
    paged_attention_reference,
    paged_decode_reference,
)
from trtforge.llm.executors.piecewise import PiecewiseStep
from trtforge.llm.executors.triton_attention import (
    TritonDecodeAttention,
    TritonPagedAttention,
    _num_sms,
    triton_usable,
)
from trtforge.llm.host_to_device import to_device
from trtforge.llm.models.families import (
    LlamaStyle,
    adapter_for,
    eos_token_ids,
    refuse_unapplied_window,
)
from trtforge.llm.models.parallel import TensorParallel
from trtforge.llm.quant import model_lm_head_quantization, model_quantization

# decode graph batch sizes; the largest is max_decode_batch itself (from_pretrained: max_num_seqs)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
_WIDTH_BUCKETS = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
_USER = "the torch executor"
# The longest query a sequence brings to a static (decode-path) step: the split-KV decode kernel's
# (speculative verification of up to 7 proposals).
MAX_STATIC_Q_LEN = MAX_Q_LEN
# The longest chain of decode steps (TorchExecutor.decode_chain; a draft's k - 1 further steps, k <= 16).
MAX_CHAIN_STEPS = 16
# True: every graph of an executor warms up and is captured on one side stream, so that the allocator
# (which reuses a freed block only on its own stream) lets each piecewise bucket reuse the others'
# temporaries: session 34's 8B FP8 graphs at 8,192-token steps took 1.2 GB against 20.6. False (the
# default): each capture warms up on a fresh stream and decode graphs are captured on torch's own capture
# stream. Measured in one process each, alternated on the H200 (session 36, 1.1B bench_serving.py all at
# once), one stream read 0.75-0.91x the tok/s of fresh streams in all five comparisons (prompt-carrying
# steps 11.2-14.7 ms against 8.1-13.1): the 11% drop session 35 found against session 33's tree. Session 50
# (H100, benchmarks/probe_capture_stream.py): a step repeated alone is no slower either way, but steps of
# buckets taking turns cost 0.7-1.5 ms more host launch time when the buckets share a stream; the sizing
# measures whichever graphs the executor captures, so False costs KV pool (at large steps), not correctness.
ONE_CAPTURE_STREAM = False
# With ONE_CAPTURE_STREAM off: True warms up and captures the piecewise buckets on one stream of their own
# (they then share their temporaries, where the memory is at large steps), the decode graphs as above. An
# A/B setting: slower than fresh streams when buckets take turns (session 50), so off.
PIECEWISE_ONE_STREAM = False
# True: on CUDA the MoE layers run the fused Triton kernels (trtforge.kernels.moe: no host sync, so their
# steps are captured in CUDA graphs) wherever each layer's block allows. False: they run grouped (a host
# sync a layer) and the model's steps eagerly: the A/B of benchmarks/bench_moe.py.
MOE_FUSED = True


def _bucket(n: int, buckets: Any) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} is above the largest bucket {buckets[-1]}")


def _check_sizes(**sizes: int | None) -> list[int | None]:
    """The sizes as Python ints (None: not given), in order; UserError naming the first that is not a
    positive integer (:func:`~trtforge.errors.is_int`: NumPy integers too, not bools)."""
    for name, value in sizes.items():
        if value is not None and (not is_int(value) or value < 1):
            raise UserError(f"TorchExecutor {name} must be a positive integer, got {value!r}")
    return [None if v is None else int(v) for v in sizes.values()]


class TorchExecutor:
    """Runs :class:`StepBatch` batches through `model` with ``num_blocks`` blocks of ``block_size`` tokens.

    `model` is a transformers causal LM of a supported family (:data:`trtforge.llm.models.SUPPORTED`:
    Llama-style, GPT-2 and its relatives, OPT, Gemma, OLMo 2, Granite, ...). With `device`/`dtype` given it
    is moved there (in place). The pools take ``2 * layers * (num_blocks + 1) * block_size * Hkv * D``
    elements of `dtype`, or of FP8 E4M3 (1 byte) with ``kv_cache_dtype="fp8"``: per-layer K/V scales
    `kv_scales` (a :class:`KVScales`, or one float for every layer, e.g. vLLM's 1.0), by default calibrated on
    `calib_prompts` (token-id lists; None: seeded random ids) before anything else touches the model.
    ``kernels`` picks the attention kernels: "triton" (the default on CUDA for FP16/BF16 pools with a
    power-of-two block size; Llama-style layers then also run fused, repointing the projections'
    weights at concatenated tensors) or "torch" (the references; the default elsewhere). Explicit
    `attention` / `decode_attention` functions override either. Steps with prompt tokens of up to
    `max_graph_tokens` tokens run as piecewise graphs (:mod:`.piecewise`) where `mixed_graphs` is on
    (by default wherever `static_decode` is); larger ones run eagerly. Decode-only steps of up to
    `max_decode_batch` sequences run on static shapes (a CUDA graph per batch bucket, the largest bucket
    being `max_decode_batch`); larger ones run like steps with prompt tokens. Give it the scheduler's
    ``max_num_seqs`` (:func:`trtforge.llm.service.from_pretrained` does). A model quantized by
    :func:`trtforge.llm.quant.quantize_model` (on its device) runs its quantized projections, fused
    too; ``facts.quantization`` (and ``facts.lm_head_quantization``) says which.
    `tensor_parallel` makes it one rank of a tensor-parallel group (:mod:`trtforge.llm.models.parallel`,
    driven by :mod:`.tensor_parallel`): the model is sharded in place through its adapter, the pools hold
    this rank's KV heads, and every step (graphs included) runs the group's collectives, so all ranks
    must run the same steps.
    """

    # logits for any rows a step asks for (StepBatch.logits_indices): speculative verification runs here
    supports_speculation = True

    def __init__(
        self,
        model: Any,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        max_model_len: int | None = None,
        attention: AttentionFn | None = None,
        decode_attention: DecodeAttentionFn | None = None,
        static_decode: bool | None = None,
        max_decode_batch: int = 256,
        kernels: str | None = None,
        mixed_graphs: bool | None = None,
        max_graph_tokens: int = 4096,
        tensor_parallel: TensorParallel | None = None,
        kv_cache_dtype: str = "auto",
        kv_scales: KVScales | float | None = None,
        calib_prompts: Sequence[Sequence[int]] | None = None,
    ) -> None:
        adapter = adapter_for(model, _USER)
        self.tensor_parallel = tensor_parallel
        if tensor_parallel is not None:
            adapter.shard(tensor_parallel)  # this rank's heads and weights (once per model)
        num_blocks, block_size, max_graph_tokens, max_model_len, max_decode_batch = _check_sizes(
            num_blocks=num_blocks,
            block_size=block_size,
            max_graph_tokens=max_graph_tokens,
            max_model_len=max_model_len,
            max_decode_batch=max_decode_batch,
        )
        if device is not None or dtype is not None:
            model.to(device=device, dtype=dtype)
        self.model, self._adapter = model.eval(), adapter
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._num_blocks, self._block_size = num_blocks, block_size
        self._max_model_len = self._length_limit(max_model_len)
        self._kv_cache(kv_cache_dtype, kv_scales, calib_prompts)
        self._pick_kernels(kernels, attention, decode_attention)
        # one scratch block past the pool's end takes the writes and reads of static-shape padding rows
        shape = (num_blocks + 1, block_size, adapter.num_kv_heads, adapter.head_dim)
        self.k_pools = [torch.zeros(shape, device=self.device, dtype=self.kv_dtype) for _ in adapter.layers]
        self.v_pools = [torch.zeros(shape, device=self.device, dtype=self.kv_dtype) for _ in adapter.layers]
        self._plan_static_shapes(static_decode, max_decode_batch)
        self._layers = ModelLayers(adapter, self._fused, self.k_pools, self.v_pools, self.kv_scales)
        self._piecewise = self._make_piecewise(mixed_graphs, max_graph_tokens)
        self.facts = self._facts()

    def _length_limit(self, max_model_len: int | None) -> int:
        """The longest sequence: `max_model_len`, by default what the model's positions cover."""
        adapter, longest = self._adapter, self._adapter.max_length
        length = int(max_model_len or longest)
        refuse_unapplied_window(self.model, length, "max_model_len", _USER)
        limit = adapter.sequence_limit  # (the rule compile --generate's --max-seq follows too)
        if limit is None or length <= limit[0]:
            return length
        if adapter.bounded:
            table = {"learned": "learned positions", "alibi": "positions of the ALiBi bias table"}.get(
                adapter.spec.positions, "rows of the rotary table"
            )
            name = "max_seq_len" if adapter.spec.positions == "alibi" else "n_positions"
            raise UserError(
                f"TorchExecutor max_model_len {length} exceeds the {longest} {table} of this "
                f"{adapter.config.model_type} model ({name}); pass max_model_len <= {longest}."
            )
        raise UserError(
            f"max_model_len {length} exceeds the {limit[0]} positions this {adapter.config.model_type} "
            f"model is made for ({limit[1]}); past them it runs into positions it never saw. Pass "
            f"max_model_len <= {limit[0]}; to run longer anyway, raise max_position_embeddings in its "
            "config.json or give it a rotary scaling (rope_parameters) that extends it."
        )

    def _kv_cache(
        self,
        kv_cache_dtype: str,
        kv_scales: KVScales | float | None,
        calib_prompts: Sequence[Sequence[int]] | None,
    ) -> None:
        """The pools' dtype (`kv_dtype`), the FP8 scales (`kv_scales`, None for 16/32-bit pools) and the
        keyword arguments each layer's attention call gets (`_attn_kwargs`: the layer's scales, its
        attention logit soft-cap, its ALiBi slopes, its attention sinks and its attention chunk size where it
        has them: the adapter's ``softcaps``, ``alibi_slopes``, ``sinks`` and ``chunks``, the slopes as one
        float32 tensor on the device for the
        layers that share them, each layer's sinks as a float32 tensor on the device)."""
        self.kv_cache_dtype = kv_cache_dtype_name(kv_cache_dtype)
        self.kv_dtype = resolve_kv_cache_dtype(self.kv_cache_dtype, self.dtype, self.device)
        layers = self._adapter.num_layers
        self.kv_scales: KVScales | None = None
        caps = self._adapter.softcaps
        self._attn_kwargs: list[dict[str, Any]] = [{} if c is None else {"softcap": c} for c in caps]
        on_device: dict[int, torch.Tensor] = {}
        for kwargs, slopes in zip(self._attn_kwargs, self._adapter.alibi_slopes):
            if slopes is not None:
                if id(slopes) not in on_device:
                    on_device[id(slopes)] = slopes.to(self.device, torch.float32).contiguous()
                kwargs["alibi_slopes"] = on_device[id(slopes)]
        for kwargs, sinks in zip(self._attn_kwargs, self._adapter.sinks):
            if sinks is not None:
                kwargs["sinks"] = sinks.to(self.device, torch.float32).contiguous()
        for kwargs, chunk in zip(self._attn_kwargs, self._adapter.chunks):
            if chunk is not None:
                kwargs["chunk"] = int(chunk)
        if self.kv_cache_dtype == "auto":
            if kv_scales is not None:
                raise UserError(
                    "TorchExecutor kv_scales apply to kv_cache_dtype='fp8' only (this one is 'auto')."
                )
            return
        if isinstance(kv_scales, KVScales):
            if len(kv_scales.k) != layers or len(kv_scales.v) != layers:
                raise UserError(
                    f"TorchExecutor kv_scales has {len(kv_scales.k)} K and {len(kv_scales.v)} V scales; the "
                    f"model has {layers} layers."
                )
            scales = kv_scales
        elif kv_scales is not None:
            if isinstance(kv_scales, bool) or not isinstance(kv_scales, (int, float)):
                raise UserError(f"TorchExecutor kv_scales must be a KVScales or a number, got {kv_scales!r}.")
            scales = KVScales.fixed(kv_scales, layers)
        else:
            scales = calibrate_kv_scales(self.model, layers, calib_prompts, max_len=self._max_model_len)
        self.kv_scales = scales
        for kwargs, k, v in zip(self._attn_kwargs, scales.k, scales.v):
            kwargs |= {"k_scale": k, "v_scale": v}

    def _pick_kernels(
        self, kernels: str | None, attention: AttentionFn | None, decode_attention: DecodeAttentionFn | None
    ) -> None:
        """The attention functions (`kernels`, unless given explicitly), and the fused layers where the
        Triton kernels run a Llama-style model that fits them (else ``fused_refusal`` says why not)."""
        usable = triton_usable(
            self.device, self.dtype, self._block_size, self._adapter.head_dim, self.kv_dtype
        )
        if kernels is None:
            kernels = "triton" if usable and self.device.type == "cuda" else "torch"
        if kernels not in ("triton", "torch"):
            raise UserError(f"TorchExecutor kernels must be 'triton' or 'torch', got {kernels!r}")
        if kernels == "triton" and not usable:
            raise UserError(
                "TorchExecutor kernels='triton' needs a CUDA model in float16/bfloat16 (its KV cache in that "
                "dtype or FP8), a power-of-two block size and head dim <= 256, and Triton installed; got "
                f"{self.device.type}, {self.dtype}, block size {self._block_size}, head dim "
                f"{self._adapter.head_dim}"
            )
        self.kernels = kernels
        default_decode = TritonDecodeAttention() if kernels == "triton" else paged_decode_reference
        default_attention = TritonPagedAttention(default_decode) if kernels == "triton" else None
        self.attention: AttentionFn = attention or default_attention or paged_attention_reference
        self.decode_attention: DecodeAttentionFn = decode_attention or default_decode
        # The longest run of new tokens a sequence may bring to a static step: both default decode
        # functions take q_len (verification steps on the static path), a given one one query a row.
        # Set it to 1 to run verification steps piecewise (benchmarks compare the two).
        self.max_static_q_len = MAX_STATIC_Q_LEN if decode_attention is None else 1
        self._fused: Any = None
        self.fused_refusal: str | None = "kernels='torch'" if kernels == "torch" else "not Llama-style"
        if kernels == "triton" and self._adapter.has_moe:
            self.fused_refusal = "MoE MLPs (the fused layers run one dense Llama-style MLP a layer)"
        elif kernels == "triton" and isinstance(self._adapter, LlamaStyle):
            from trtforge.llm.executors.fused_layers import FusedLayers, fusable

            self.fused_refusal = fusable(self._adapter)
            if self.fused_refusal is None:
                self._fused = FusedLayers(self._adapter, self.tensor_parallel)

    def _plan_static_shapes(self, static_decode: bool | None, max_decode_batch: int) -> None:
        """Whether decode steps run on static (bucketed) shapes and CUDA graphs, and their buckets."""
        self.static_decode = self.device.type == "cuda" if static_decode is None else bool(static_decode)
        # dynamic rotary: a token's K depends on its prompt's length; steps run eagerly (no static shapes)
        self.static_decode = self.static_decode and not self._adapter.dynamic
        #: why this executor never captures CUDA graphs of its model (None: it does, on CUDA with static
        #: decode); facts.cuda_graphs_refusal reports it
        self.cuda_graphs_refusal: str | None = self._pick_moe()
        self.use_cuda_graphs = (
            self.static_decode and self.device.type == "cuda" and self.cuda_graphs_refusal is None
        )
        self._batch_buckets = (*tuple(b for b in _BATCH_BUCKETS if b < max_decode_batch), max_decode_batch)
        max_width = -(-self._max_model_len // self._block_size)
        self._width_buckets = (*(w for w in _WIDTH_BUCKETS if w < max_width), max_width)
        self._static: dict[str, torch.Tensor] = {}
        self._graphs: dict[tuple[int, ...], Any] = {}
        # decode_chain: an argmax chain of steps as one graph per (batch, width, steps) bucket
        self.chain_graphs = True
        self._chain_graphs: dict[tuple[int, ...], Any] = {}
        self._graph_pool: Any = None
        self._graph_stream: Any = None

    def _pick_moe(self) -> str | None:
        """MoE layers run ``fused`` on CUDA (:data:`MOE_FUSED`; blocks the fused kernels refuse still run
        grouped: :meth:`~trtforge.llm.models.moe.SparseMoe.fused_refusal`), ``grouped`` elsewhere. Returns
        why no CUDA graph can hold this model's steps (None: every MoE layer can run fused, or none is
        MoE)."""
        adapter = self._adapter
        if not adapter.has_moe:
            return None
        triton = importlib.util.find_spec("triton") is not None
        if self.device.type == "cuda" and MOE_FUSED and triton:
            adapter.moe_formulation = "fused"
        refusals = [(i, m.fused_refusal()) for i, m in enumerate(adapter.moe) if m is not None]
        why = next((f"layer {i}'s block: {r}" for i, r in refusals if r is not None), None)
        if why is None and not (MOE_FUSED and triton):
            why = "torch_exec.MOE_FUSED is off" if not MOE_FUSED else "Triton is not installed"
        if why is None:
            return None
        return (
            "MoE MLPs: each step routes its tokens to experts in groups whose sizes are data (one host sync "
            "per layer), which a captured graph would freeze; steps run eagerly (the fused MoE kernels, "
            f"which keep the groups on the device, cannot run: {why})"
        )

    def _make_piecewise(self, mixed_graphs: bool | None, max_graph_tokens: int) -> PiecewiseStep | None:
        """The piecewise runner of steps with prompt tokens, where on (never with dynamic rotary: its
        pieces see no sequence lengths)."""
        on = self.static_decode if mixed_graphs is None else bool(mixed_graphs)
        if not on or self._adapter.dynamic:
            return None
        adapter = self._adapter
        return PiecewiseStep(
            self._layers,
            max_tokens=max_graph_tokens,
            hidden=int(adapter.spec.hidden_size),
            num_heads=[adapter.heads(i) for i in range(adapter.num_layers)],
            head_dim=adapter.head_dim,
            dtype=self.dtype,
            device=self.device,
            scratch_slot=self._num_blocks * self._block_size,
            graphs=self.use_cuda_graphs,
            pool=self._pool,
            # None: the runner's own stream, one for all its buckets
            stream=None if PIECEWISE_ONE_STREAM and not ONE_CAPTURE_STREAM else self._stream,
        )

    def _facts(self) -> ExecutorFacts:
        a, pools = self._adapter, (*self.k_pools, *self.v_pools)
        return ExecutorFacts(
            num_blocks=self._num_blocks,
            block_size=self._block_size,
            vocab_size=a.output_vocab_size,
            input_vocab_size=int(self.model.config.vocab_size),
            max_model_len=self._max_model_len,
            eos_token_ids=tuple(eos_token_ids(self.model)),
            num_layers=a.num_layers,
            num_kv_heads=a.num_kv_heads,
            head_dim=a.head_dim,
            kv_dtype=str(self.kv_dtype).removeprefix("torch."),
            kv_element_bytes=self.k_pools[0].element_size(),
            kv_pool_bytes=sum(p.numel() * p.element_size() for p in pools),
            kv_depends_on_prompt_len=a.dynamic,
            tensor_parallel_size=1 if self.tensor_parallel is None else self.tensor_parallel.world,
            quantization=model_quantization(self.model),
            lm_head_quantization=model_lm_head_quantization(self.model),
            step_token_buckets=() if self._piecewise is None else tuple(self._piecewise.buckets),
            cuda_graphs_refusal=self.cuda_graphs_refusal,
        )

    @property
    def num_cuda_graphs(self) -> int:
        """Decode graphs captured so far (one per batch-size, table-width and query-length bucket used)."""
        return len(self._graphs)

    @property
    def decode_graph_buckets(self) -> list[tuple[int, int, int]]:
        """The (batch, width, q_len) buckets of the decode graphs captured so far (q_len > 1:
        verification steps)."""
        return sorted({key[:3] for key in self._graphs})

    @property
    def num_chain_graphs(self) -> int:
        """Whole argmax chains of decode steps captured so far (:meth:`decode_chain`)."""
        return len(self._chain_graphs)

    @property
    def chain_graph_buckets(self) -> list[tuple[int, int, int, int]]:
        """The (batch, width, steps, first q_len) buckets of the chain graphs captured so far (first
        q_len 0: no catch-up step)."""
        return sorted({key[:4] for key in self._chain_graphs})

    @property
    def num_piecewise_graphs(self) -> int:
        """Graphs of steps with prompt tokens captured so far (layers + 1 per token bucket used)."""
        return 0 if self._piecewise is None else self._piecewise.num_graphs

    def _pool(self) -> Any:
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        return self._graph_pool

    def _stream(self) -> Any:
        """The side stream a graph warms up (and with :data:`ONE_CAPTURE_STREAM`, is captured) on: a fresh
        one each time, or with that setting one for every graph of this executor."""
        if not ONE_CAPTURE_STREAM:
            return torch.cuda.Stream(self.device)
        if self._graph_stream is None:
            self._graph_stream = torch.cuda.Stream(self.device)
        return self._graph_stream

    def _metadata(self, batch: StepBatch) -> AttentionMetadata:
        """The attention metadata of `batch`'s sequences: query starts, context lengths and tables."""
        dev = self.device
        qsl, lens, tables = batch.query_start_loc, batch.context_lens, batch.block_tables
        return AttentionMetadata(
            query_start_loc=to_device(qsl, dev),
            context_lens=to_device(lens, dev),
            block_tables=to_device(tables, dev),
            query_start_loc_host=qsl,
            context_lens_host=lens,
            max_query_len=int(np.diff(qsl).max()),
            max_context_len=int(lens.max()),
            block_size=self._block_size,
        )

    def _forward(
        self, ids, positions, slots, attend, rows=None, rope_lens=None, float32: bool = True
    ) -> torch.Tensor:
        """Every layer over tokens `ids`; `attend(q, k_pool, v_pool, scale, window, **kw)` (kw: the layer's
        FP8 scales and soft-cap, where it has them); logits of `rows`.

        `rope_lens`: each token's dynamic-rotary length (dynamic rotary only); `float32` False leaves the
        logits in the model's dtype (a caller that copies them into a float32 buffer converts there)."""
        layers, a = self._layers, self._adapter
        h, extra = layers.embed(ids, positions, rope_lens)
        for i, (kp, vp) in enumerate(zip(self.k_pools, self.v_pools)):
            q = layers.layer_in(i, h, extra, slots)
            h = layers.layer_out(i, h, attend(q, kp, vp, a.scales[i], a.windows[i], **self._attn_kwargs[i]))
        if rows is not None:
            h = h.index_select(0, rows)
        return layers.head(h, float32)

    @torch.inference_mode()
    def step(self, batch: StepBatch) -> torch.Tensor:
        """Copy blocks, run every layer over the batch's new tokens, return float32 logits ``[N, vocab]``."""
        return self._step(batch, None, own=True)

    @torch.inference_mode()
    def step_async(self, batch: StepBatch, feed: TokenFeed | None) -> torch.Tensor:
        """:meth:`step` with the ids at ``feed.rows`` taken from ``feed.tokens`` on the device.

        :meth:`step` never waits for the device either; this is the asynchronous scheduler's entry. A
        decode step's logits here are a view of the executor's logits buffer, valid until the next step
        is launched (the sampler reads them first, in stream order): at 512 rows of a 128k vocabulary a
        copy would move half a gigabyte a step.
        """
        return self._step(batch, feed if feed is not None and len(feed) else None, own=False)

    def static_q_len(self, batch: StepBatch) -> int | None:
        """The query length S a step runs with on the static decode path (1: a decode step; 2..8: a
        verification step, every sequence padded to S rows), or None where it does not take that path:
        static decode off, a run of more than :attr:`max_static_q_len` tokens, more padded rows than
        the largest batch bucket, or several tokens of a sequence in a step that verifies nothing (no
        row but sequences' last wants logits: prompt chunks, which run piecewise)."""
        if not self.static_decode or batch.num_seqs > self._batch_buckets[-1]:
            return None
        s = 1 if batch.is_decode_only else int(batch.query_lens.max())
        if s > self.max_static_q_len or (s > 1 and len(batch.logits_indices) <= batch.num_seqs):
            return None
        if s > 1 and _bucket(batch.num_seqs, self._batch_buckets) * s > self._batch_buckets[-1]:
            return None  # the padded rows must fit the logits buffer (largest batch bucket rows)
        return s

    def path_of(self, batch: StepBatch) -> str:
        """How :meth:`step` runs `batch`: "decode" (static shapes, a CUDA graph where graphs are on; also
        verification steps, :meth:`static_q_len`), "piecewise" (bucket-padded pieces, graphs where on)
        or "eager"."""
        if self.static_q_len(batch) is not None:
            return "decode"
        if self._piecewise is not None and batch.num_tokens <= self._piecewise.max_tokens:
            return "piecewise"
        return "eager"

    def _step(self, batch: StepBatch, feed: TokenFeed | None, own: bool) -> torch.Tensor:
        dev = self.device
        if len(batch.block_copies):
            src, dst = to_device(np.ascontiguousarray(batch.block_copies.T), dev)
            for pool in (*self.k_pools, *self.v_pools):
                raw = pool.view(torch.uint8) if pool.element_size() == 1 else pool  # (FP8: copy the bytes)
                raw[dst] = raw[src]
        s = self.static_q_len(batch)  # (path_of's first question, asked once per step)
        if s is not None:
            logits = self._static_decode(batch, feed, s)
            return logits.clone() if own else logits
        meta = self._metadata(batch)
        if self.path_of(batch) == "piecewise":
            return self._piecewise.run(batch, feed, self._attend_into(meta))
        ids = to_device(batch.input_ids, dev)
        if feed is not None:
            if dev.type == "cpu":
                ids = ids.clone()  # from_numpy shares the batch's array, which stays as given
            rows, sources = to_device(np.stack([feed.rows, feed.sources]).astype(np.int64), dev)
            ids.index_copy_(0, rows, torch.as_tensor(feed.tokens, device=dev).index_select(0, sources))
        return self._forward(
            ids,
            to_device(batch.positions, dev),
            to_device(batch.slot_mapping, dev),
            lambda q, kp, vp, scale, window, **kv: self.attention(q, kp, vp, meta, scale, window, **kv),
            to_device(batch.logits_indices, dev),
            to_device(self._rope_lens(batch), dev) if self._adapter.dynamic else None,
        )

    @staticmethod
    def _rope_lens(batch: StepBatch) -> np.ndarray:
        """Each token's dynamic-rotary length, as transformers computes it for its sequence alone: a prompt
        token's is the prompt's length (one prefill call), a generated token's its position + 1 (one
        decode call each), whatever steps the scheduler cut them into. Without ``prompt_lens``, each
        sequence's tokens of this step count as its prompt so far."""
        prompt = batch.context_lens if batch.prompt_lens is None else batch.prompt_lens
        return np.maximum(np.repeat(prompt, batch.query_lens), batch.positions + 1)

    def _attend_into(self, meta: AttentionMetadata) -> Any:
        """The piecewise steps' attention: layer i's step attention of `q`, written into `out`."""
        a, attention = self._adapter, self.attention
        writes_out = isinstance(attention, TritonPagedAttention)

        def attend(i: int, q: torch.Tensor, out: torch.Tensor) -> None:
            kp, vp, scale, window, kv = (
                self.k_pools[i],
                self.v_pools[i],
                a.scales[i],
                a.windows[i],
                self._attn_kwargs[i],
            )
            if writes_out:
                attention(q, kp, vp, meta, scale, window, out=out, **kv)
            else:
                out.copy_(attention(q, kp, vp, meta, scale, window, **kv))

        return attend

    def _static_buffers(self) -> dict[str, Any]:
        """One int32 device buffer holds a static step's inputs; two pinned twins on the host stage them
        in turn, each with the event of its last copy. Sized for the largest batch bucket's rows: a
        verification step's padded tokens (batch bucket x q_len) are held to that many."""
        if not self._static:
            n, w, dev = self._batch_buckets[-1], self._width_buckets[-1], self.device
            size = 5 * n + n * w
            hosts = [torch.zeros(size, dtype=torch.int32, pin_memory=dev.type == "cuda") for _ in range(2)]
            self._static = {
                "inputs": torch.zeros(size, dtype=torch.int32, device=dev),
                "host": hosts,
                "host_np": [h.numpy() for h in hosts],
                "copied": [torch.cuda.Event() if dev.type == "cuda" else None for _ in hosts],
                "turn": 0,
                "logits": torch.zeros(n, self.facts.vocab_size, dtype=torch.float32, device=dev),
            }
        return self._static

    @staticmethod
    def _static_size(nb: int, wb: int, s: int) -> int:
        return 4 * nb * s + nb + nb * wb

    def _static_views(self, nb: int, wb: int, s: int = 1) -> tuple[torch.Tensor, ...]:
        """ids, positions, slots ``[nb * s]``, lengths ``[nb]``, id sources ``[nb * s]`` and the
        ``[nb, wb]`` table in the input buffer. Token row t's input id is element ``sources[t]`` of
        (previous step's tokens, then these ids)."""
        buf, t = self._static["inputs"], nb * s
        ids, pos, slots, sources = buf[: 4 * t].view(4, t).unbind(0)
        ctx = buf[4 * t : 4 * t + nb]
        return ids, pos, slots, ctx, sources, buf[4 * t + nb : self._static_size(nb, wb, s)].view(nb, wb)

    def _gemv_rows(self) -> int:
        """The fused layers' GEMV row limit (a captured graph holds whichever projections it chose)."""
        return 0 if self._fused is None else int(self._fused.gemv_max_tokens)

    def _static_body(self, nb: int, wb: int, s: int) -> None:
        ids, pos, slots, ctx, _, tables = self._static_views(nb, wb, s)
        decode = self.decode_attention

        def attend(q, kp, vp, scale, window, **kv):
            if s == 1:
                return decode(q, kp, vp, tables, ctx, scale, window, **kv)
            return decode(q, kp, vp, tables, ctx, scale, window, q_len=s, **kv)  # type: ignore[call-arg]

        # model-dtype logits converted by the copy itself: no float32 temporary of [rows, vocab]
        self._static["logits"][: nb * s].copy_(self._forward(ids, pos, slots, attend, float32=False))

    @staticmethod
    def _padded_rows(batch: StepBatch, s: int) -> np.ndarray:
        """Each of the batch's tokens' row in the static layout: sequence b's tokens are the last of
        its `s` rows ``[b*s, (b+1)*s)`` (LOWER_RIGHT: its last token is the last row)."""
        if s == 1:
            return np.arange(batch.num_tokens, dtype=np.int64)
        qlens, qsl = batch.query_lens.astype(np.int64), batch.query_start_loc.astype(np.int64)
        first = np.arange(batch.num_seqs, dtype=np.int64) * s + s - qlens
        return np.repeat(first - qsl[:-1], qlens) + np.arange(batch.num_tokens, dtype=np.int64)

    def _static_head(self, batch: StepBatch, nb: int, s: int, host: np.ndarray) -> np.ndarray:
        """Write the head of `batch`'s static inputs (bucket `nb`, q_len `s`) into int32 `host`: ids,
        positions and slots ``[nb * s]`` each (padding rows: id 0, position 0, the scratch slot), the id
        sources left as they are, then lengths ``[nb]`` (padding 1); return the tokens' rows."""
        b, t = batch.num_seqs, nb * s
        tokens = host[: 4 * t].reshape(4, t)
        at = self._padded_rows(batch, s)
        scratch = self._num_blocks * self._block_size
        if s == 1:
            tokens[0, :b], tokens[1, :b], tokens[2, :b] = batch.input_ids, batch.positions, batch.slot_mapping
            tokens[:3, b:] = np.array([[0], [0], [scratch]], dtype=np.int32)
        else:
            tokens[:3] = np.array([[0], [0], [scratch]], dtype=np.int32)
            tokens[0, at], tokens[1, at], tokens[2, at] = batch.input_ids, batch.positions, batch.slot_mapping
        ctx = host[4 * t : 4 * t + nb]
        ctx[:b], ctx[b:] = batch.context_lens, 1
        return at

    def _static_decode(self, batch: StepBatch, feed: TokenFeed | None, s: int = 1) -> torch.Tensor:
        """A step of decode rows (`s` 1) or verification rows (each sequence padded to `s` tokens) on
        bucketed static shapes: padding uses the scratch block; replays a CUDA graph."""
        st = self._static_buffers()
        b, width = batch.num_seqs, batch.block_tables.shape[1]
        nb, wb = _bucket(b, self._batch_buckets), _bucket(width, self._width_buckets)
        graph = self._decode_graph(nb, wb, s)  # before the inputs go in: capture resets them
        turn = st["turn"]
        st["turn"] = 1 - turn
        copied = st["copied"][turn]
        if copied is not None:
            copied.synchronize()  # the copy out of this buffer two steps ago is done (it long has)
        host, t = st["host_np"][turn], nb * s
        size = self._static_size(nb, wb, s)
        tokens = host[: 4 * t].reshape(4, t)
        at = self._static_head(batch, nb, s, host)
        table = host[4 * t + nb : size].reshape(nb, wb)
        table.fill(self._num_blocks)
        table[:b, :width] = batch.block_tables
        if feed is not None:
            tokens[3] = np.arange(len(feed.tokens), len(feed.tokens) + t, dtype=np.int32)
            tokens[3, at[feed.rows]] = feed.sources
        st["inputs"][:size].copy_(st["host"][turn][:size], non_blocking=True)
        if copied is not None:
            copied.record()
        if feed is not None:  # on the device, after the copy and before the graph reads the ids
            ids, *_, sources, _ = self._static_views(nb, wb, s)
            fed = torch.as_tensor(feed.tokens, device=self.device)
            ids.copy_(torch.cat((fed, ids)).index_select(0, sources))
        if graph is None:
            self._static_body(nb, wb, s)
        else:
            graph.replay()
        rows = at[batch.logits_indices]
        if np.array_equal(rows, np.arange(len(rows))):
            return st["logits"][: len(rows)]
        return st["logits"].index_select(0, to_device(rows, self.device))

    def _decode_graph(self, nb: int, wb: int, s: int) -> Any:
        """The decode graph of bucket (nb, wb, s), captured now on first use; None without graphs."""
        graph = self._graphs.get((nb, wb, s, self._gemv_rows()))
        if graph is None and self.use_cuda_graphs:
            graph = self._capture(nb, wb, s)
        return graph

    def can_chain(self, rows: int) -> bool:
        """Whether :meth:`decode_chain` runs `rows` sequences: the static decode path is on and they fit
        its largest batch bucket."""
        return self.static_decode and rows <= self._batch_buckets[-1]

    def chain_q_len(self, first: StepBatch) -> int | None:
        """The query length S at which :meth:`decode_chain` runs `first` as its first step (every row's
        logits computed, each sequence's last picked), or None where it cannot: `first` would not take
        the static decode path (runs of more than :attr:`max_static_q_len` tokens, too many padded rows)
        or copies blocks."""
        if len(first.block_copies) or not self.can_chain(first.num_seqs):
            return None
        every_row = replace(first, logits_indices=np.arange(first.num_tokens))
        return self.static_q_len(every_row)

    @torch.inference_mode()
    def decode_chain(
        self,
        tokens: torch.Tensor | None,
        positions: np.ndarray,
        slots: np.ndarray,
        context_lens: np.ndarray,
        block_tables: np.ndarray,
        pick: Any = None,
        first: StepBatch | None = None,
    ) -> list[torch.Tensor]:
        """``len(positions)`` single-token decode steps of the same rows back to back, each step's input
        ids the tokens picked from the step before: no host work between steps but launches, and no
        wait for the device (a draft model's k proposals; :meth:`can_chain` says where it runs).

        `tokens`: int64 ``[rows]`` on the device, the first step's ids. `positions`, `slots` (reserved
        by the caller; -1: write nowhere, the scratch slot, for a row whose result is dropped) and
        `context_lens`: ints ``[steps, rows]`` (at most :data:`MAX_CHAIN_STEPS`), one row per step.
        `block_tables`: int32 ``[rows, width]``, valid for every step. ``pick(logits, j)``: step j's next
        ids (int64 ``[rows]`` on the device) from its float32 logits ``[rows, vocab]`` (a view valid
        until the next step is launched); None: each row's argmax. Returns every step's tokens (with
        `pick` None, views valid until the next chain).

        With `first` (a catch-up step of the same rows, in the same order, with the same block tables:
        runs of 1..8 tokens, :meth:`chain_q_len` not None; `tokens` None) the chain begins with it: it
        runs on the static decode path at q_len S, each row's last token's logits give the ids of the
        single-token steps (``pick`` step 0), and its picks come first in the result. So a draft's
        catch-up and further steps are one host preparation, one copy and (argmax) one graph.

        All the steps' inputs travel in one copy; each step copies its slice into the static decode
        inputs (padding rows as in :meth:`step`), writes the previous tokens into the ids and runs the
        (rows, width) decode body. With CUDA graphs an argmax chain is one graph per (rows, width,
        steps, S) bucket (``chain_graphs`` False: one decode-graph replay per step), a chain with `pick`
        replays the decode graph per step.
        """
        steps, b = positions.shape
        if steps > MAX_CHAIN_STEPS:
            raise ValueError(f"decode_chain runs at most {MAX_CHAIN_STEPS} steps, got {steps}")
        s = 0
        if first is not None:
            s = self.chain_q_len(first) or 0
            if not s or first.num_seqs != b:
                raise ValueError("decode_chain's first step must be a static catch-up of the chain's rows")
        st = self._chain_buffers()
        width = block_tables.shape[1]
        nb, wb = _bucket(b, self._batch_buckets), _bucket(width, self._width_buckets)
        head = None
        if first is not None:
            head = np.zeros(4 * nb * s + nb, dtype=np.int32)
            self._static_head(first, nb, s, head)
        host = self._chain_inputs(nb, wb, positions, slots, context_lens, block_tables, head)
        whole = self._chain_graph(nb, wb, steps, s) if pick is None else None  # (capture resets inputs)
        step_graph = None if whole is not None else self._decode_graph(nb, wb, 1)
        st["chain"][: host.size].copy_(to_device(host, self.device))
        if first is None:
            st["chain_tokens"][0, :b].copy_(tokens)
        if whole is not None:
            whole.replay()
            return list(st["chain_tokens"][int(not s) : steps + 1, :b].unbind(0))
        first_graph = self._decode_graph(nb, wb, s) if s else None
        return self._chain_body(nb, wb, steps, b, pick, step_graph, s, first_graph)

    def _chain_buffers(self) -> dict[str, Any]:
        """The static buffers, and a chain's inputs (`chain`, laid out by :meth:`_chain_inputs`) and
        tokens (`chain_tokens` ``[steps + 1, rows]``: the first step's ids, then each step's picks)."""
        st = self._static_buffers()
        if "chain" not in st:
            n, w, dev = self._batch_buckets[-1], self._width_buckets[-1], self.device
            # (a first step's head, 4 * nb * S + nb, fits in 5 * n: nb * S <= n)
            st["chain"] = torch.zeros((MAX_CHAIN_STEPS + 1) * 5 * n + n * w, dtype=torch.int32, device=dev)
            st["chain_tokens"] = torch.zeros(MAX_CHAIN_STEPS + 1, n, dtype=torch.int64, device=dev)
        return st

    def _chain_inputs(
        self, nb: int, wb: int, positions, slots, context_lens, block_tables, first: np.ndarray | None = None
    ) -> np.ndarray:
        """int32: the `first` step's static head where given, then per step the ``5 * nb`` head of the
        static decode inputs (ids left 0, positions, slots, sources, lengths; rows past the given ones
        padding), then the ``[nb, wb]`` table."""
        steps, b = positions.shape
        head, scratch = 5 * nb, self._num_blocks * self._block_size
        off = 0 if first is None else first.size
        host = np.zeros(off + steps * head + nb * wb, dtype=np.int32)
        if first is not None:
            host[:off] = first
        per_step = host[off : off + steps * head].reshape(steps, 5, nb)
        per_step[:, 1, :b] = positions
        per_step[:, 2, :b] = np.where(slots < 0, scratch, slots)
        per_step[:, 2, b:] = scratch
        per_step[:, 4, :b] = context_lens
        per_step[:, 4, b:] = 1
        table = host[off + steps * head :].reshape(nb, wb)
        table.fill(self._num_blocks)
        table[:b, : block_tables.shape[1]] = block_tables
        return host

    def _chain_body(
        self,
        nb: int,
        wb: int,
        steps: int,
        b: int,
        pick: Any = None,
        graph: Any = None,
        s: int = 0,
        first_graph: Any = None,
    ) -> list[torch.Tensor]:
        """The chain on the inputs in the chain buffers: with `s`, first the catch-up step at q_len `s`
        (or `first_graph`, its captured replay) whose rows' last logits give the first ids; then per step
        its inputs, the previous tokens as ids, the decode body (or `graph`, its captured replay), the
        picks (argmax where `pick` is None)."""
        from trtforge.kernels.argmax import argmax_rows  # (Triton: imported where CUDA graphs run)

        st = self._static
        chain, toks, logits = st["chain"], st["chain_tokens"], st["logits"]
        head, size = 5 * nb, self._static_size(nb, wb, 1)
        inputs, ids = st["inputs"], self._static_views(nb, wb, 1)[0]
        off = 4 * nb * s + nb if s else 0
        table = chain[off + steps * head : off + steps * head + nb * wb]
        out = []
        if s:
            inputs[:off].copy_(chain[:off])
            inputs[off : self._static_size(nb, wb, s)].copy_(table)
            if first_graph is None:
                self._static_body(nb, wb, s)
            else:
                first_graph.replay()
            last = logits[: nb * s].view(nb, s, -1)[:, s - 1]  # each sequence's last row
            if pick is None:
                toks[0, :nb].copy_(argmax_rows(last))
                out.append(toks[0, :b])
            else:
                picked = pick(last[:b], 0)
                toks[0, :b].copy_(picked)
                out.append(picked)
        inputs[head:size].copy_(table)
        for j in range(steps):
            inputs[:head].copy_(chain[off + j * head : off + (j + 1) * head])
            ids.copy_(toks[j, :nb])
            if graph is None:
                self._static_body(nb, wb, 1)
            else:
                graph.replay()
            if pick is None:
                toks[j + 1, :b].copy_(argmax_rows(logits[:b]))
                out.append(toks[j + 1, :b])
            else:
                picked = pick(logits[:b], j + bool(s))
                toks[j + 1, :b].copy_(picked)
                out.append(picked)
        return out

    def _chain_graph(self, nb: int, wb: int, steps: int, s: int = 0) -> Any:
        """The graph of a whole argmax chain of bucket (nb, wb, steps), with a first step at q_len `s`
        where `s` > 0, captured now on first use (its warm-up and capture touch the scratch block only);
        None without graphs or ``chain_graphs``."""
        if not (self.use_cuda_graphs and self.chain_graphs):
            return None
        key = (nb, wb, steps, s, self._gemv_rows())
        graph = self._chain_graphs.get(key)
        if graph is not None:
            return graph
        for q in {1, s} - {0}:
            self._decode_graph(nb, wb, q)  # the bodies' lazy inits and autotuning, outside this capture
        empty = np.zeros((steps, 0), dtype=np.int64)
        head = None
        if s:  # padding rows only: ids 0, positions 0, the scratch slot, lengths 1
            head = np.zeros(4 * nb * s + nb, dtype=np.int32)
            head[2 * nb * s : 3 * nb * s] = self._num_blocks * self._block_size
            head[4 * nb * s :] = 1
        safe = self._chain_inputs(nb, wb, empty, empty, empty, np.zeros((0, 1), dtype=np.int32), head)
        st = self._static
        st["chain"][: safe.size].copy_(torch.from_numpy(safe))
        st["chain_tokens"].zero_()
        side = self._stream()
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._chain_body(nb, wb, steps, nb, s=s)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        capture_on = side if ONE_CAPTURE_STREAM else None  # (None: torch's own capture stream)
        with gc_paused(), torch.cuda.graph(graph, pool=self._pool(), stream=capture_on):
            self._chain_body(nb, wb, steps, nb, s=s)
        self._chain_graphs[key] = graph
        return graph

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The greedy pick of this executor's logits ``[N, V]`` (the loops' sampler calls it):
        :func:`trtforge.kernels.argmax.argmax_rows`, torch's argmax unless its FAST_ARGMAX is on."""
        from trtforge.kernels.argmax import argmax_rows

        return argmax_rows(logits)

    @torch.inference_mode()
    def capture_decode_graphs(self, max_batch: int | None = None, q_lens: Sequence[int] = (1,)) -> int:
        """Capture every (batch, width) decode bucket now rather than on first use, for each query
        length of `q_lens` (2..8: verification steps; buckets whose padded rows exceed the largest
        batch bucket are skipped, as those steps never take this path); return how many graphs there are.

        Only on CUDA with static decode on. The captured warm-up runs touch the scratch block only.
        Largest buckets first: the graphs share one memory pool, which the smaller ones then reuse.
        """
        bad = [s for s in q_lens if not 1 <= s <= self.max_static_q_len]
        if bad:
            raise UserError(
                f"TorchExecutor.capture_decode_graphs q_lens must lie in 1..{self.max_static_q_len} (the "
                f"longest run a static step takes); got {bad}"
            )
        if not self.use_cuda_graphs:
            return 0
        self._static_buffers()
        for nb in reversed(self._batch_buckets):
            if max_batch is not None and nb > max_batch:
                continue
            for s in sorted(q_lens, reverse=True):
                if s > 1 and nb * s > self._batch_buckets[-1]:
                    continue
                for wb in reversed(self._width_buckets):
                    if (nb, wb, s, self._gemv_rows()) not in self._graphs:
                        self._capture(nb, wb, s)
        return len(self._graphs)

    @torch.inference_mode()
    def capture_chain_graphs(
        self, steps: int, max_batch: int | None = None, first_q_lens: Sequence[int] = ()
    ) -> int:
        """Capture the whole argmax chain of `steps` decode steps (:meth:`decode_chain`) of every
        (batch, width) bucket up to `max_batch` now rather than on first use, and those beginning with a
        catch-up step of each query length of `first_q_lens` (1..8; buckets whose padded rows exceed the
        largest batch bucket are skipped; `steps` may then be 0); return how many chain graphs there are.
        Only on CUDA with static decode and ``chain_graphs`` on; largest buckets first, as
        :meth:`capture_decode_graphs` (the graphs share one memory pool)."""
        lo = 0 if first_q_lens else 1
        if not lo <= steps <= MAX_CHAIN_STEPS:
            raise UserError(
                f"TorchExecutor.capture_chain_graphs steps must lie in {lo}..{MAX_CHAIN_STEPS}; got {steps}"
            )
        bad = [s for s in first_q_lens if not 1 <= s <= self.max_static_q_len]
        if bad:
            raise UserError(
                f"TorchExecutor.capture_chain_graphs first_q_lens must lie in 1..{self.max_static_q_len} "
                f"(the longest run a static step takes); got {bad}"
            )
        if not (self.use_cuda_graphs and self.chain_graphs):
            return 0
        self._chain_buffers()
        for nb in reversed(self._batch_buckets):
            if max_batch is not None and nb > max_batch:
                continue
            for s in sorted(set(first_q_lens), reverse=True) + [0] * (steps > 0):
                if nb * s > self._batch_buckets[-1]:
                    continue
                for wb in reversed(self._width_buckets):
                    self._chain_graph(nb, wb, steps, s)
        return len(self._chain_graphs)

    @torch.inference_mode()
    def capture_mixed_graphs(self) -> int:
        """Capture the piecewise graphs of every token bucket (steps with prompt tokens) now rather
        than on first use, then compile their eager attention (:meth:`warm_up_mixed_attention`);
        return how many graphs. Only on CUDA with piecewise steps on; runs touch the scratch slot only."""
        if self._piecewise is None or not self.use_cuda_graphs:
            return 0
        n = self._piecewise.capture_all()
        self.warm_up_mixed_attention()
        return n

    def mixed_warm_up_batches(self) -> list[StepBatch]:
        """Steps with prompt tokens whose attention meets every kernel variant a served mixed step can
        launch, every token on the scratch slot and every table entry the scratch block.

        The split-KV decode kernel compiles a variant per query length (decode rows, rows of 2..8 new
        tokens), per split mode (one split or several, from the work: few keys or many rows give one)
        and per sliding window in force (a window shorter than the table's keys); the chunk kernel one
        per window mode and per tile config (both kernels one per soft-cap mode too: these steps run
        every layer, each with its own cap) (:data:`~trtforge.kernels.configs.CHUNK_PREFILL_CONFIGS`,
        chosen by the step's longest chunk). So: for key counts of one tile, of 1,024 and of each
        window + 1 (up to ``max_model_len``), and for each chunk length the tile table tells apart, a
        step with one sequence of each short length and a chunk, and the same with enough sequences of
        each length for a single split."""
        from trtforge.kernels.configs import CHUNK_PREFILL_CONFIGS

        bs, scratch, longest = self._block_size, self._num_blocks, self._max_model_len
        short = MAX_Q_LEN if getattr(self.attention, "short_queries", False) else self.max_static_q_len
        lengths = [q for q in range(1, short + 1) if q <= longest]
        chunk_lens = sorted(
            {min(max(first, short + 16), longest) for first, _ in CHUNK_PREFILL_CONFIGS} - set(lengths)
        )
        keys_set = {min(longest, max(lengths[-1], 64)), min(longest, 1024)}
        keys_set |= {min(longest, w + 1) for w in self._adapter.windows if w is not None and w < longest}
        keys_set |= {min(longest, c + 1) for c in self._adapter.chunks if c is not None and c < longest}
        hkv = int(self.k_pools[0].shape[2]) if self.k_pools else 1
        # B·Hkv past 4 programs an SM: one split (kernels.decode_attention.num_splits_for)
        many = min(256, -(-4 * _num_sms(self.device) // max(hkv, 1)) + 1)
        batches = []
        for keys in sorted(keys_set):
            for chunk in [c for c in chunk_lens if c <= keys] or [None]:
                for copies in (1, many):
                    q_lens = [q for q in lengths for _ in range(copies)] + ([chunk] if chunk else [])
                    # logits of the last sequence only (a decode-only step: every row's, as served)
                    want = [i == len(q_lens) - 1 or max(q_lens) == 1 for i in range(len(q_lens))]
                    batches.append(
                        StepBatch.from_flat(
                            seq_ids=tuple(range(len(q_lens))),
                            input_ids=[0] * sum(q_lens),
                            counts=q_lens,
                            starts=[keys - q for q in q_lens],
                            slot_mapping=[scratch * bs] * sum(q_lens),
                            want_logits=want,
                            block_tables=np.full((len(q_lens), -(-keys // bs)), scratch, dtype=np.int32),
                        )
                    )
        return batches

    @torch.inference_mode()
    def warm_up_mixed_attention(self) -> int:
        """Run :meth:`mixed_warm_up_batches` with the Triton kernels on CUDA, so that Triton compiles
        the mixed steps' attention variants now: met first inside a served step, each compilation
        stalled it for about a second (BENCHMARKS.md, session 15). Returns the steps run (0 elsewhere)."""
        if self.device.type != "cuda" or self.kernels != "triton" or self._adapter.dynamic:
            return 0
        batches = self.mixed_warm_up_batches()
        for batch in batches:
            self.step(batch)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # (its temporaries: not held as if the graphs took them, when sizing)
        return len(batches)

    def _capture(self, nb: int, wb: int, s: int = 1) -> Any:
        ids, pos, slots, ctx, _, tables = self._static_views(nb, wb, s)
        for t, value in ((ids, 0), (pos, 0), (slots, self._num_blocks * self._block_size), (ctx, 1)):
            t.fill_(value)
        tables.fill_(self._num_blocks)  # warm-up and capture touch only the scratch block
        side = self._stream()
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._static_body(nb, wb, s)  # warm-up outside capture: lazy inits, autotuning
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        capture_on = side if ONE_CAPTURE_STREAM else None  # (None: torch's own capture stream)
        with gc_paused(), torch.cuda.graph(graph, pool=self._pool(), stream=capture_on):
            self._static_body(nb, wb, s)
        self._graphs[(nb, wb, s, self._gemv_rows())] = graph
        return graph
