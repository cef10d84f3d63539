"""A torch step executor: runs a Hugging Face Llama-style causal LM over paged KV pools (CPU or CUDA).

It reuses the model's own modules (embedding, norms, projections, MLP, rotary table, LM head) and
replaces only attention and the cache: each layer writes the step's new K/V into its pool at the
batch's slots, then attends through the block tables with a pluggable attention function. On CUDA
(FP16/BF16) the default is trtforge's Triton kernels (split-KV decode, chunked prefill; see
:mod:`trtforge.llm.executors.triton_attention`), and Llama-style layers run fused (RMSNorm, one QKV
GEMM, RoPE + K/V write in one kernel, residuals folded into GEMMs: :mod:`.fused_llama`). Elsewhere
the torch references (:mod:`trtforge.llm.executors.paged_attention`) run; they are also the
correctness oracle for the kernels.

Decode-only steps can run on *static* shapes: the batch is padded to a size bucket and the block
tables to a width bucket (padding rows write to and read from a scratch block), so each (batch,
width) bucket is one CUDA graph, captured on first use (or all up front:
:meth:`TorchExecutor.capture_decode_graphs`) and replayed after; this removes the per-kernel launch
cost that dominates small-batch decode. Steps with prompt tokens are padded to a token-count bucket
and run as one graph per stretch of layers between attention calls, attention launched eagerly in
between (:mod:`trtforge.llm.executors.piecewise`). A decode step's inputs travel in one pinned host
buffer (two, used in turn, so that filling one never waits for the copy out of the other) and one
asynchronous copy.

:meth:`TorchExecutor.step_async` serves asynchronous scheduling: nothing in a step waits for the
device (host inputs go through pinned memory), and the decode rows' input ids are gathered on the
device from the previous step's sampled tokens, after the inputs' copy and before the graph replay.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trtforge.errors import UserError
from trtforge.llm.executors.base import StepBatch, TokenFeed
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
    triton_usable,
)
from trtforge.llm.host_to_device import to_device
from trtforge.llm.models.families import (
    GPT2_STYLE,
    LLAMA_STYLE,
    eos_token_ids,
    model_type_of,
    project_qkv,
    refuse_unapplied_window,
)

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_WIDTH_BUCKETS = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def _bucket(n: int, buckets: Any) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} is above the largest bucket {buckets[-1]}")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the first ``cos.shape[-1]`` channels of `x` (all of them unless the model's
    rotary is partial, as Phi-4-mini's); the rest pass through."""
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot = x[..., :dim]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, x[..., dim:]), dim=-1)


class _LlamaLike:
    """Llama, Mistral, Ministral, Qwen2, Qwen3, Phi-3, Starcoder2: rotary positions, GQA projections, the
    model's own norms and MLP (Qwen3's per-head q/k norms; Phi-3's fused qkv_proj and gate_up_proj,
    partial rotary)."""

    def __init__(self, model: Any) -> None:
        config, inner = model.config, model.model
        self.model, self.inner = model, inner
        self.layers = list(inner.layers)
        self.head_dim = int(self.layers[0].self_attn.head_dim)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads or config.num_attention_heads)
        self.max_positions = int(config.max_position_embeddings)
        self.scales = [float(layer.self_attn.scaling) for layer in self.layers]
        self.windows = [self._window(config, layer) for layer in self.layers]
        rope_type = str(getattr(inner.rotary_emb, "rope_type", "default"))
        self.config = config
        # dynamic NTK: HF derives the frequencies from the longest position of the call; here each
        # sequence gets those of its own length, as if run alone (not capturable: host-side table)
        self.dynamic = "dynamic" in rope_type
        if "longrope" in rope_type:
            raise UserError(
                f"TorchExecutor cannot run this {config.model_type} model ({type(model).__name__}): its "
                "'longrope' rotary switches frequency tables with the longest position of the batch, so a "
                "batched step would rotate a short sequence's tokens by a long one's table. Supported "
                "rotary types: default, linear, llama3, yarn and other fixed tables."
            )
        self.graphable = not self.dynamic
        self._rope_init = None
        if self.dynamic:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            self._rope_init = ROPE_INIT_FUNCTIONS[rope_type]
            # max_position_embeddings is the trained length dynamic scaling extends by `factor`
            params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
            self.max_positions = int(self.max_positions * max(float(params.get("factor", 1.0)), 1.0))

    @staticmethod
    def _window(config: Any, layer: Any) -> int | None:
        if hasattr(layer.self_attn, "sliding_window"):
            return layer.self_attn.sliding_window
        if config.model_type in ("mistral", "phi3", "starcoder2"):  # one window (or none) for every layer
            return getattr(config, "sliding_window", None)
        return None

    def rope_tables(
        self, h: torch.Tensor, positions: torch.Tensor, rope_lens: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, rotary dim]`` of each token, in `h`'s dtype, as HF's rotary module makes them.

        Dynamic NTK rotary takes each token's frequencies from `rope_lens` (the length transformers
        derives them from for the token's sequence run alone: :meth:`TorchExecutor._rope_lens`), so a
        sequence's logits do not depend on what else is batched with it.
        """
        if not self.dynamic:
            cos, sin = self.inner.rotary_emb(h[None], positions[None])
            return cos[0], sin[0]
        if rope_lens is None:
            raise ValueError("dynamic rotary needs each token's sequence length (rope_lens)")
        # HF clamps lengths up to max_position_embeddings (the original table) and takes a 0-d int64 length
        lens = rope_lens.to(torch.int64).clamp(min=int(self.config.max_position_embeddings))
        unique, inverse = torch.unique(lens, return_inverse=True)
        inv_freq = torch.stack(
            [self._rope_init(self.config, h.device, seq_len=n)[0].float() for n in unique.unbind(0)]
        )[inverse]
        freqs = positions.float()[:, None] * inv_freq.to(h.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(h.dtype), emb.sin().to(h.dtype)

    def embed(
        self, ids: torch.Tensor, positions: torch.Tensor, rope_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Any]:
        h = self.inner.embed_tokens(ids)
        cos, sin = self.rope_tables(h, positions, rope_lens)
        return h, (cos[:, None, :], sin[:, None, :])

    def qkv(self, i: int, h: torch.Tensor, rope: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn, t, d = self.layers[i].self_attn, h.shape[0], self.head_dim
        q, k, v = project_qkv(attn, self.layers[i].input_layernorm(h))
        q, k, v = q.view(t, -1, d), k.view(t, self.num_kv_heads, d), v.view(t, self.num_kv_heads, d)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = rope
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def finish(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        layer = self.layers[i]
        h = h + layer.self_attn.o_proj(o.reshape(h.shape[0], -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.inner.norm(h))


class _Gpt2:
    """GPT-2: learned positions, LayerNorm, fused QKV projection (Conv1D), multi-head attention."""

    def __init__(self, model: Any) -> None:
        config, inner = model.config, model.transformer
        self.model, self.inner = model, inner
        self.layers = list(inner.h)
        self.num_heads = self.num_kv_heads = int(config.n_head)
        self.head_dim = int(config.n_embd) // self.num_heads
        self.max_positions = int(config.n_positions)
        self.scales = []
        for i in range(len(self.layers)):
            scale = self.head_dim**-0.5 if config.scale_attn_weights else 1.0
            self.scales.append(scale / (i + 1) if config.scale_attn_by_inverse_layer_idx else scale)
        self.windows: list[int | None] = [None] * len(self.layers)
        self.graphable = True

    def embed(
        self, ids: torch.Tensor, positions: torch.Tensor, rope_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Any]:
        return self.inner.wte(ids) + self.inner.wpe(positions), None

    def qkv(self, i: int, h: torch.Tensor, _: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        block, t = self.layers[i], h.shape[0]
        q, k, v = block.attn.c_attn(block.ln_1(h)).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        return q, k, v

    def finish(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        block = self.layers[i]
        h = h + block.attn.c_proj(o.reshape(h.shape[0], -1))
        return h + block.mlp(block.ln_2(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.inner.ln_f(h))


_ARCHS = dict.fromkeys(LLAMA_STYLE, _LlamaLike) | dict.fromkeys(GPT2_STYLE, _Gpt2)


class _Layers:
    """The model split at its attention calls (:class:`~.piecewise.StepLayers`), fused where it can be."""

    def __init__(self, arch: Any, fused: Any, k_pools: list, v_pools: list) -> None:
        self.arch, self.fused, self.k_pools, self.v_pools = arch, fused, k_pools, v_pools
        self.num_layers = len(k_pools)
        self.hkv, self.d = arch.num_kv_heads, arch.head_dim
        self.top = fused if fused is not None else arch

    def embed(
        self, ids: torch.Tensor, positions: torch.Tensor, rope_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, Any]:
        """Hidden states and rotary tables; `rope_lens` (each token's dynamic-rotary length) only
        matters to dynamic rotary."""
        if self.fused is not None:
            h = self.fused.inner.embed_tokens(ids)
            return h, self.arch.rope_tables(h, positions, rope_lens)
        return self.arch.embed(ids.long(), positions.long(), rope_lens)

    def layer_in(self, i: int, h: torch.Tensor, extra: Any, slots: torch.Tensor) -> torch.Tensor:
        kp, vp = self.k_pools[i], self.v_pools[i]
        if self.fused is not None:
            return self.fused.attention_input(i, h, extra, slots, kp, vp)
        q, k, v = self.arch.qkv(i, h, extra)
        slots = slots.long()
        kp.view(-1, self.hkv, self.d).index_copy_(0, slots, k)
        vp.view(-1, self.hkv, self.d).index_copy_(0, slots, v)
        return q

    def layer_out(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return self.top.finish(i, h, o)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.top.logits(h).float()


class TorchExecutor:
    """Runs :class:`StepBatch` batches through `model` with ``num_blocks`` blocks of ``block_size`` tokens.

    `model` is a transformers causal LM of a supported family: Llama-style (Llama, Mistral, Ministral, Qwen2,
    Qwen3, Phi-3: GQA, RoPE, RMSNorm, gated MLP) or GPT-2. With `device`/`dtype` given it is moved there (in
    place). The pools take ``2 * layers * (num_blocks + 1) * block_size * Hkv * D`` elements of `dtype`.
    ``kernels`` picks the attention kernels: "triton" (the default on CUDA for FP16/BF16 pools with a
    power-of-two block size; Llama-style layers then also run fused, repointing the projections'
    weights at concatenated tensors) or "torch" (the references; the default elsewhere). Explicit
    `attention` / `decode_attention` functions override either. Steps with prompt tokens of up to
    `max_graph_tokens` tokens run as piecewise graphs (:mod:`.piecewise`) where `mixed_graphs` is on
    (by default wherever `static_decode` is); larger ones run eagerly.
    """

    def __init__(
        self,
        model: Any,
        num_blocks: int,
        block_size: int = 16,
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
    ) -> None:
        model_type = model_type_of(model, "the torch executor")
        config = model.config
        sizes = {"num_blocks": num_blocks, "block_size": block_size, "max_graph_tokens": max_graph_tokens}
        if max_model_len is not None:
            sizes["max_model_len"] = max_model_len
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"TorchExecutor {name} must be a positive integer, got {value!r}")
        if device is not None or dtype is not None:
            model.to(device=device, dtype=dtype)
        model.eval()
        self.model = model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._num_blocks, self._block_size = num_blocks, block_size
        arch = _ARCHS[model_type](model)
        self._arch = arch
        self.head_dim, self.num_heads, self.num_kv_heads = arch.head_dim, arch.num_heads, arch.num_kv_heads
        self._max_model_len = int(max_model_len or arch.max_positions)
        refuse_unapplied_window(model, self._max_model_len, "max_model_len", "the torch executor")
        if isinstance(arch, _Gpt2) and self._max_model_len > arch.max_positions:
            raise UserError(
                f"TorchExecutor max_model_len {self._max_model_len} exceeds the {arch.max_positions} "
                f"learned positions of this {model_type} model (n_positions); pass max_model_len <= "
                f"{arch.max_positions}."
            )
        self._eos_ids = tuple(eos_token_ids(model))
        self._eos = self._eos_ids[0] if self._eos_ids else None
        usable = triton_usable(self.device, self.dtype, block_size, self.head_dim)
        if kernels is None:
            kernels = "triton" if usable and self.device.type == "cuda" else "torch"
        if kernels not in ("triton", "torch"):
            raise UserError(f"TorchExecutor kernels must be 'triton' or 'torch', got {kernels!r}")
        if kernels == "triton" and not usable:
            raise UserError(
                "TorchExecutor kernels='triton' needs a CUDA model in float16/bfloat16, a power-of-two "
                f"block size and head dim <= 256, and Triton installed; got {self.device.type}, "
                f"{self.dtype}, block size {block_size}, head dim {self.head_dim}"
            )
        self.kernels = kernels
        default_decode = TritonDecodeAttention() if kernels == "triton" else paged_decode_reference
        default_attention = TritonPagedAttention(default_decode) if kernels == "triton" else None
        self.attention: AttentionFn = attention or default_attention or paged_attention_reference
        self.decode_attention: DecodeAttentionFn = decode_attention or default_decode
        self._fused: Any = None
        self.fused_refusal: str | None = "kernels='torch'" if kernels == "torch" else "not Llama-style"
        if kernels == "triton" and isinstance(arch, _LlamaLike):
            from trtforge.kernels.fused_layer import FusedLayers, fusable

            self.fused_refusal = fusable(model)
            if self.fused_refusal is None:
                self._fused = FusedLayers(model)
        # one scratch block past the pool's end takes the writes and reads of static-shape padding rows
        shape = (num_blocks + 1, block_size, self.num_kv_heads, self.head_dim)
        self.k_pools = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in arch.layers]
        self.v_pools = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in arch.layers]
        self.static_decode = self.device.type == "cuda" if static_decode is None else bool(static_decode)
        #: dynamic rotary: a token's K depends on its prompt's length; steps run eagerly (no static shapes)
        self.kv_depends_on_prompt_len = bool(getattr(arch, "dynamic", False))
        self.static_decode = self.static_decode and not self.kv_depends_on_prompt_len
        self.use_cuda_graphs = self.static_decode and self.device.type == "cuda" and arch.graphable
        self._batch_buckets = (*tuple(b for b in _BATCH_BUCKETS if b < max_decode_batch), max_decode_batch)
        max_width = -(-self._max_model_len // block_size)
        widths = [w for w in _WIDTH_BUCKETS if w < max_width]
        self._width_buckets = (*widths, max_width)
        self._static: dict[str, torch.Tensor] = {}
        self._graphs: dict[tuple[int, int], Any] = {}
        self._graph_pool: Any = None
        self._layers = _Layers(arch, self._fused, self.k_pools, self.v_pools)
        self._piecewise: PiecewiseStep | None = None
        piecewise = self.static_decode if mixed_graphs is None else bool(mixed_graphs)
        if piecewise and not self.kv_depends_on_prompt_len:  # its pieces see no sequence lengths
            self._piecewise = PiecewiseStep(
                self._layers,
                max_tokens=max_graph_tokens,
                hidden=int(getattr(config, "hidden_size", None) or config.n_embd),
                num_heads=self.num_heads,
                head_dim=self.head_dim,
                dtype=self.dtype,
                device=self.device,
                scratch_slot=num_blocks * block_size,
                graphs=self.use_cuda_graphs,
                pool=self._pool,
            )

    # ---- the StepExecutor protocol -------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    def kv_bytes(self) -> int:
        """Bytes the K and V pools of every layer take (the scratch block included)."""
        return sum(p.numel() * p.element_size() for p in (*self.k_pools, *self.v_pools))

    @property
    def num_cuda_graphs(self) -> int:
        """Decode graphs captured so far (one per batch-size and table-width bucket used)."""
        return len(self._graphs)

    @property
    def num_piecewise_graphs(self) -> int:
        """Graphs of steps with prompt tokens captured so far (layers + 1 per token bucket used)."""
        return 0 if self._piecewise is None else self._piecewise.num_graphs

    def _pool(self) -> Any:
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        return self._graph_pool

    def _metadata(self, batch: StepBatch) -> AttentionMetadata:
        dev = self.device
        qsl = batch.query_start_loc
        return AttentionMetadata(
            query_start_loc=to_device(qsl, dev),
            context_lens=to_device(batch.context_lens, dev),
            block_tables=to_device(batch.block_tables, dev),
            query_start_loc_host=qsl,
            context_lens_host=batch.context_lens,
            max_query_len=int(np.diff(qsl).max()),
            max_context_len=int(batch.context_lens.max()),
            block_size=self._block_size,
        )

    def _forward(self, ids, positions, slots, attend, rows=None, rope_lens=None) -> torch.Tensor:
        """Every layer over tokens `ids`; `attend(q, k_pool, v_pool, scale, window)`; logits of `rows`.

        `rope_lens`: each token's dynamic-rotary length (dynamic rotary only)."""
        layers, arch = self._layers, self._arch
        h, extra = layers.embed(ids, positions, rope_lens)
        for i, (kp, vp) in enumerate(zip(self.k_pools, self.v_pools)):
            q = layers.layer_in(i, h, extra, slots)
            h = layers.layer_out(i, h, attend(q, kp, vp, arch.scales[i], arch.windows[i]))
        if rows is not None:
            h = h.index_select(0, rows)
        return layers.head(h)

    @torch.inference_mode()
    def step(self, batch: StepBatch) -> torch.Tensor:
        """Copy blocks, run every layer over the batch's new tokens, return float32 logits ``[N, vocab]``."""
        return self._step(batch, None)

    @torch.inference_mode()
    def step_async(self, batch: StepBatch, feed: TokenFeed | None) -> torch.Tensor:
        """:meth:`step` with the ids at ``feed.rows`` taken from ``feed.tokens`` on the device.

        :meth:`step` never waits for the device either; this is the asynchronous scheduler's entry.
        """
        return self._step(batch, feed if feed is not None and len(feed) else None)

    def path_of(self, batch: StepBatch) -> str:
        """How :meth:`step` runs `batch`: "decode" (static shapes, a CUDA graph where graphs are on),
        "piecewise" (bucket-padded pieces, graphs where on) or "eager"."""
        if (
            self.static_decode
            and batch.is_decode_only
            and len(batch.logits_indices) == batch.num_seqs
            and batch.num_seqs <= self._batch_buckets[-1]
        ):
            return "decode"
        if self._piecewise is not None and batch.num_tokens <= self._piecewise.max_tokens:
            return "piecewise"
        return "eager"

    def _step(self, batch: StepBatch, feed: TokenFeed | None) -> torch.Tensor:
        dev = self.device
        if len(batch.block_copies):
            src, dst = to_device(np.ascontiguousarray(batch.block_copies.T), dev)
            for pool in (*self.k_pools, *self.v_pools):
                pool[dst] = pool[src]
        path = self.path_of(batch)
        if path == "decode":
            return self._static_decode(batch, feed)
        meta = self._metadata(batch)
        if path == "piecewise":
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
            lambda q, kp, vp, scale, window: self.attention(q, kp, vp, meta, scale, window),
            to_device(batch.logits_indices, dev),
            to_device(self._rope_lens(batch), dev) if self.kv_depends_on_prompt_len else None,
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
        arch, attention = self._arch, self.attention
        writes_out = isinstance(attention, TritonPagedAttention)

        def attend(i: int, q: torch.Tensor, out: torch.Tensor) -> None:
            kp, vp, scale, window = self.k_pools[i], self.v_pools[i], arch.scales[i], arch.windows[i]
            if writes_out:
                attention(q, kp, vp, meta, scale, window, out=out)
            else:
                out.copy_(attention(q, kp, vp, meta, scale, window))

        return attend

    def _static_buffers(self) -> dict[str, Any]:
        """One int32 device buffer holds a decode step's inputs; two pinned twins on the host stage them in
        turn, each with the event of its last copy."""
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
                "logits": torch.zeros(n, self.vocab_size, dtype=torch.float32, device=dev),
            }
        return self._static

    def _static_views(self, nb: int, wb: int) -> tuple[torch.Tensor, ...]:
        """ids, positions, slots, lengths, id sources ``[nb]`` and the ``[nb, wb]`` table in the input buffer.

        Row b's input id is element ``sources[b]`` of (previous step's tokens, then these ids).
        """
        buf = self._static["inputs"]
        ids, pos, slots, ctx, sources = buf[: 5 * nb].view(5, nb).unbind(0)
        return ids, pos, slots, ctx, sources, buf[5 * nb : 5 * nb + nb * wb].view(nb, wb)

    def _static_body(self, nb: int, wb: int) -> None:
        ids, pos, slots, ctx, _, tables = self._static_views(nb, wb)

        def attend(q, kp, vp, scale, window):
            return self.decode_attention(q, kp, vp, tables, ctx, scale, window)

        self._static["logits"][:nb].copy_(self._forward(ids, pos, slots, attend))

    def _static_decode(self, batch: StepBatch, feed: TokenFeed | None) -> torch.Tensor:
        """Decode on bucketed static shapes: padding rows use the scratch block; replays a CUDA graph."""
        st = self._static_buffers()
        b, width = batch.num_seqs, batch.block_tables.shape[1]
        nb, wb = _bucket(b, self._batch_buckets), _bucket(width, self._width_buckets)
        graph = self._graphs.get((nb, wb))
        if graph is None and self.use_cuda_graphs:
            graph = self._capture(nb, wb)  # before the inputs go in: capture resets them
        turn = st["turn"]
        st["turn"] = 1 - turn
        copied = st["copied"][turn]
        if copied is not None:
            copied.synchronize()  # the copy out of this buffer two steps ago is done (it long has)
        host = st["host_np"][turn]
        rows = host[: 5 * nb].reshape(5, nb)
        rows[0, :b], rows[1, :b], rows[2, :b] = batch.input_ids, batch.positions, batch.slot_mapping
        rows[3, :b] = batch.context_lens
        rows[:4, b:] = np.array([[0], [0], [self._num_blocks * self._block_size], [1]], dtype=np.int32)
        table = host[5 * nb : 5 * nb + nb * wb].reshape(nb, wb)
        table.fill(self._num_blocks)
        table[:b, :width] = batch.block_tables
        size = 5 * nb + nb * wb
        if feed is not None:
            rows[4] = np.arange(len(feed.tokens), len(feed.tokens) + nb, dtype=np.int32)
            rows[4, feed.rows] = feed.sources
        st["inputs"][:size].copy_(st["host"][turn][:size], non_blocking=True)
        if copied is not None:
            copied.record()
        if feed is not None:  # on the device, after the copy and before the graph reads the ids
            ids, *_, sources, _ = self._static_views(nb, wb)
            tokens = torch.as_tensor(feed.tokens, device=self.device)
            ids.copy_(torch.cat((tokens, ids)).index_select(0, sources))
        if graph is None:
            self._static_body(nb, wb)
        else:
            graph.replay()
        return st["logits"][:b].clone()

    @torch.inference_mode()
    def capture_decode_graphs(self, max_batch: int | None = None) -> int:
        """Capture every (batch, width) decode bucket now rather than on first use; return how many.

        Only on CUDA with static decode on. The captured warm-up runs touch the scratch block only.
        """
        if not self.use_cuda_graphs:
            return 0
        self._static_buffers()
        for nb in self._batch_buckets:
            if max_batch is not None and nb > max_batch:
                break
            for wb in self._width_buckets:
                if (nb, wb) not in self._graphs:
                    self._capture(nb, wb)
        return len(self._graphs)

    @torch.inference_mode()
    def capture_mixed_graphs(self) -> int:
        """Capture the piecewise graphs of every token bucket (steps with prompt tokens) now rather
        than on first use; return how many. Only on CUDA with piecewise steps on; runs touch the
        scratch slot only."""
        if self._piecewise is None or not self.use_cuda_graphs:
            return 0
        return self._piecewise.capture_all()

    def _capture(self, nb: int, wb: int) -> Any:
        ids, pos, slots, ctx, _, tables = self._static_views(nb, wb)
        for t, value in ((ids, 0), (pos, 0), (slots, self._num_blocks * self._block_size), (ctx, 1)):
            t.fill_(value)
        tables.fill_(self._num_blocks)  # warm-up and capture touch only the scratch block
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._static_body(nb, wb)  # warm-up outside capture: lazy inits, autotuning
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool()):
            self._static_body(nb, wb)
        self._graphs[(nb, wb)] = graph
        return graph
