"""A torch step executor: runs a Hugging Face Llama-style causal LM over paged KV pools (CPU or CUDA).

It reuses the model's own modules (embedding, norms, projections, MLP, rotary table, LM head) and
replaces only attention and the cache: each layer writes the step's new K/V into its pool at the
batch's slots, then attends through the block tables with a pluggable attention function
(:func:`trtforge.llm.executors.paged_attention.paged_attention_reference` by default).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trtforge.errors import UserError
from trtforge.llm.executor import StepBatch
from trtforge.llm.executors.paged_attention import AttentionFn, AttentionMetadata, paged_attention_reference

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchExecutor:
    """Runs :class:`StepBatch` batches through `model` with ``num_blocks`` blocks of ``block_size`` tokens.

    `model` is a transformers ``LlamaForCausalLM``-style model (Llama, Mistral, Qwen2, Qwen3: GQA,
    RoPE, RMSNorm, gated MLP). With `device`/`dtype` given it is moved there (in place). The pools take
    ``2 * layers * num_blocks * block_size * Hkv * D`` elements of `dtype`.
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
    ) -> None:
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"TorchExecutor runs Llama-style causal LMs ({', '.join(SUPPORTED_MODEL_TYPES)}); "
                f"got {type(model).__name__} with model_type {model_type!r}"
            )
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"TorchExecutor {name} must be a positive integer, got {value!r}")
        if device is not None or dtype is not None:
            model.to(device=device, dtype=dtype)
        model.eval()
        self.model = model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._num_blocks, self._block_size = num_blocks, block_size
        inner = model.model
        self._layers = list(inner.layers)
        attn0 = self._layers[0].self_attn
        self.head_dim = int(attn0.head_dim)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.num_heads = int(config.num_attention_heads)
        self._windows = [self._sliding_window(config, i, layer) for i, layer in enumerate(self._layers)]
        self._max_model_len = int(max_model_len or config.max_position_embeddings)
        self._eos = self._first_eos(config)
        self.attention: AttentionFn = attention or paged_attention_reference
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        self.k_pools = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self._layers]
        self.v_pools = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self._layers]

    @staticmethod
    def _sliding_window(config: Any, index: int, layer: Any) -> int | None:
        if hasattr(layer.self_attn, "sliding_window"):
            return layer.self_attn.sliding_window
        if config.model_type == "mistral":
            return getattr(config, "sliding_window", None)
        return None

    @staticmethod
    def _first_eos(config: Any) -> int | None:
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            return int(eos[0]) if eos else None
        return None if eos is None else int(eos)

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

    def kv_bytes(self) -> int:
        """Bytes the K and V pools of every layer take."""
        return sum(p.numel() * p.element_size() for p in (*self.k_pools, *self.v_pools))

    def _metadata(self, batch: StepBatch) -> AttentionMetadata:
        dev = self.device
        qsl = batch.query_start_loc
        return AttentionMetadata(
            query_start_loc=torch.from_numpy(qsl).to(dev),
            context_lens=torch.from_numpy(batch.context_lens).to(dev),
            block_tables=torch.from_numpy(batch.block_tables).to(dev),
            query_start_loc_host=qsl,
            context_lens_host=batch.context_lens,
            max_query_len=int(np.diff(qsl).max()),
            max_context_len=int(batch.context_lens.max()),
            block_size=self._block_size,
        )

    @torch.inference_mode()
    def step(self, batch: StepBatch) -> torch.Tensor:
        """Copy blocks, run every layer over the batch's new tokens, return float32 logits ``[N, vocab]``."""
        dev = self.device
        if len(batch.block_copies):
            src = torch.from_numpy(batch.block_copies[:, 0]).to(dev)
            dst = torch.from_numpy(batch.block_copies[:, 1]).to(dev)
            for pool in (*self.k_pools, *self.v_pools):
                pool[dst] = pool[src]
        ids = torch.from_numpy(batch.input_ids).to(dev)
        positions = torch.from_numpy(batch.positions).to(dev)
        slots = torch.from_numpy(batch.slot_mapping).to(dev)
        meta = self._metadata(batch)
        inner = self.model.model
        t = ids.shape[0]
        d, hkv = self.head_dim, self.num_kv_heads
        h = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(h[None], positions[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        for layer, kp, vp, window in zip(self._layers, self.k_pools, self.v_pools, self._windows):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(t, -1, d)
            k = attn.k_proj(x).view(t, hkv, d)
            v = attn.v_proj(x).view(t, hkv, d)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kp.view(-1, hkv, d).index_copy_(0, slots, k)
            vp.view(-1, hkv, d).index_copy_(0, slots, v)
            o = self.attention(q, kp, vp, meta, attn.scaling, window)
            h = h + attn.o_proj(o.reshape(t, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        rows = torch.from_numpy(batch.logits_indices).to(dev)
        return self.model.lm_head(inner.norm(h.index_select(0, rows))).float()
