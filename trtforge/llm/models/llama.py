"""The Llama-style adapter: llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2.

GQA, RoPE on q/k, pre-norm blocks whose norms and MLP are the model's own modules (RMSNorm + gated
SiLU; starcoder2's LayerNorm + GELU), optional projection biases; qwen3's per-head q/k RMSNorm before
RoPE; phi3's fused qkv_proj / gate_up_proj and partial rotary; the sliding windows of
:func:`~trtforge.llm.models.base.sliding_windows`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models import parallel
from trtforge.llm.models.base import DecoderAdapter, DecoderSpec


class LlamaStyle(DecoderAdapter):
    """Llama and its relatives (see the module docstring); q/k/v come from :func:`project_qkv`."""

    family = "llama"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.model.layers), user)
        self.body = model.model
        c, attn = self.config, self.layers[0].self_attn
        self.num_heads = int(c.num_attention_heads)
        self.num_kv_heads = int(c.num_key_value_heads or c.num_attention_heads)
        done = parallel.sharded(model)
        if done is not None:  # one rank's shard already: this rank's heads
            self.num_heads //= done.world
            self.num_kv_heads //= done.world
        self.head_dim = int(attn.head_dim)
        self.scales = [float(layer.self_attn.scaling) for layer in self.layers]
        self.rope_type = str(getattr(self.body.rotary_emb, "rope_type", "default"))
        if self.rope_type == "longrope":
            raise UserError(
                f"{user} cannot run this {c.model_type} model {type(model).__name__}: rotary scaling "
                "'longrope' switches frequency tables with the longest position of the call, so neither a "
                "step graph's one table nor a batched step (which would rotate a short sequence's tokens "
                "by a long one's table) can match transformers. Supported rotary types: default, linear, "
                "llama3, yarn and other fixed tables (and 'dynamic' on the torch executor)."
            )
        # dynamic NTK: HF derives the frequencies from the longest position of the call; here each
        # sequence gets those of its own length, as if run alone (a host-side table: not capturable)
        self.dynamic = self.rope_type == "dynamic"
        self._rope_init: Any = None
        if self.dynamic:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            self._rope_init = ROPE_INIT_FUNCTIONS[self.rope_type]

    @property
    def spec(self) -> DecoderSpec:
        c, rope = self.config, self.body.rotary_emb
        params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        rotary = {
            "type": self.rope_type,
            "theta": float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
            "dim": int(rope.inv_freq.numel() * 2),
            "attention_scaling": float(getattr(rope, "attention_scaling", 1.0)),
            "interleaved": False,
        }
        return self._spec(
            positions="rotary",
            rotary=rotary,
            max_positions=getattr(c, "max_position_embeddings", None),
        )

    @property
    def max_length(self) -> int:
        trained = int(self.config.max_position_embeddings)
        if not self.dynamic:
            return trained
        # max_position_embeddings is the trained length dynamic scaling extends by `factor`
        c = self.config
        params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        return int(trained * max(float(params.get("factor", 1.0)), 1.0))

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.embed_tokens(input_ids)

    def rotary(
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """cos, sin as the HF rotary module computes them (float32, times its attention scaling, then
        `dtype`). Dynamic NTK rotary takes each token's frequencies from `rope_lens` (the length
        transformers derives them from for the token's sequence run alone), so a sequence's logits do
        not depend on what else is batched with it."""
        rope = self.body.rotary_emb
        inv_freq = rope.inv_freq.to(device=position_ids.device, dtype=torch.float)
        if self.dynamic:
            if rope_lens is None:
                raise ValueError("dynamic rotary needs each token's sequence length (rope_lens)")
            # HF clamps lengths up to max_position_embeddings (the original table); a 0-d int64 length
            lens = rope_lens.to(torch.int64).clamp(min=int(self.config.max_position_embeddings))
            unique, inverse = torch.unique(lens, return_inverse=True)
            tables = [
                self._rope_init(self.config, position_ids.device, seq_len=n)[0] for n in unique.unbind(0)
            ]
            inv_freq = torch.stack(tables).float().to(position_ids.device)[inverse]
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = float(getattr(rope, "attention_scaling", 1.0))
        return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        h = self.layers[i].input_layernorm(x)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in project_qkv(attn, h))
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.o_proj(attn_out)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.norm(x)

    def shard(self, tp: Any) -> None:
        """Rank ``tp.rank``'s share (:mod:`.parallel`): its query and KV heads of q/k/v, its rows of
        gate/up (c_fc), the matching columns of o_proj and down_proj (c_proj) made row-parallel, a
        vocab-parallel LM head. UserError when `tp.world` does not divide the heads, the KV heads or the
        MLP width. In place, once per model: the shard is marked on the model, and every adapter made
        of it later counts this rank's heads from that mark (sharding it again for `tp` does nothing)."""
        done = parallel.sharded(self.model)
        if done is not None:
            if (done.rank, done.world) != (tp.rank, tp.world):
                raise ValueError(f"model already sharded as rank {done.rank} of {done.world}")
            return
        self._shard_weights(tp)
        parallel.mark_sharded(self.model, tp)
        self.num_heads //= tp.world
        self.num_kv_heads //= tp.world

    def _shard_weights(self, tp: Any) -> None:
        c, world = self.config, tp.world
        if any(getattr(layer.self_attn, "qkv_proj", None) is not None for layer in self.layers) or any(
            getattr(layer.mlp, "gate_up_proj", None) is not None for layer in self.layers
        ):
            raise UserError(
                f"tensor parallelism does not split {c.model_type}'s fused qkv_proj / gate_up_proj "
                f"({type(self.model).__name__}); supported: llama, mistral, ministral, qwen2, qwen3, "
                "starcoder2. Use tensor_parallel_size=1."
            )
        mlp0 = self.layers[0].mlp
        up0 = getattr(mlp0, "up_proj", None) or mlp0.c_fc
        name = type(self.model).__name__
        parallel.check_divisible(
            f"{c.model_type} model {name}",
            {
                "attention heads (num_attention_heads)": self.num_heads,
                "KV heads (num_key_value_heads)": self.num_kv_heads,
                "MLP width (intermediate_size)": int(up0.weight.shape[0]),
            },
            world,
        )
        d = self.head_dim
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            q0, q1 = tp.share(self.num_heads)
            k0, k1 = tp.share(self.num_kv_heads)
            parallel.keep_rows(a.q_proj, q0 * d, q1 * d)
            parallel.keep_rows(a.k_proj, k0 * d, k1 * d)
            parallel.keep_rows(a.v_proj, k0 * d, k1 * d)
            a.o_proj = parallel.RowParallelLinear(a.o_proj, tp, q0 * d, q1 * d)
            if hasattr(m, "gate_proj"):
                i0, i1 = tp.share(int(m.up_proj.weight.shape[0]))
                parallel.keep_rows(m.gate_proj, i0, i1)
                parallel.keep_rows(m.up_proj, i0, i1)
                m.down_proj = parallel.RowParallelLinear(m.down_proj, tp, i0, i1)
            else:  # starcoder2: c_fc -> GELU -> c_proj
                i0, i1 = tp.share(int(m.c_fc.weight.shape[0]))
                parallel.keep_rows(m.c_fc, i0, i1)
                m.c_proj = parallel.RowParallelLinear(m.c_proj, tp, i0, i1)
        self.model.lm_head = parallel.VocabParallelHead(self.model.lm_head, tp)


def project_qkv(attn: nn.Module, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [..., heads * head_dim] of a Llama-style attention module: its three projections, or
    Phi-3's fused qkv_proj split by heads (q heads, then the key heads, then the value heads)."""
    fused = getattr(attn, "qkv_proj", None)
    if fused is None:
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    q_size = int(attn.config.num_attention_heads) * attn.head_dim
    kv_size = int(attn.config.num_key_value_heads or attn.config.num_attention_heads) * attn.head_dim
    return fused(h).split([q_size, kv_size, kv_size], dim=-1)
