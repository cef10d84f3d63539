"""The StableLM adapter: StableLM-2, StableLM-3B-4E1T, stable-code (``model_type`` "stablelm").

Llama's body with LayerNorm (with bias) instead of RMSNorm, partial RoPE (``partial_rotary_factor`` of
each head, 1/4 by default), optional q/k/v biases (``use_qkv_bias``), an optional per-head q/k LayerNorm
before RoPE (``qk_layernorm``: one LayerNorm of its own for each query and each key head, as StableLM-2
12B has), a SiLU-gated MLP, and the block either sequential or parallel (``use_parallel_residual``: one
``input_layernorm`` feeding attention and MLP, ``x + attn(h) + mlp(h)``). No window.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.llm.models.rope import RopeStyle


class StableLmStyle(RopeStyle):
    """StableLM (``StableLmForCausalLM``): :class:`RopeStyle`'s body with per-head q/k norms and the
    parallel block (see the module docstring)."""

    family = "stablelm"

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        if getattr(attn, "qk_layernorm", False):
            q, k = per_head_norm(attn.q_layernorm, q), per_head_norm(attn.k_layernorm, k)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Sequential: ``h = x + o(attn)``, then ``h + mlp(post_attention_layernorm(h))``; parallel: the MLP
        reads the block's one ``input_layernorm`` of `x` (recomputed: the torch executor runs the two
        halves of a block as separate pieces)."""
        layer = self.layers[i]
        if layer.use_parallel_residual:
            return self.parallel_block(
                x,
                lambda: layer.self_attn.o_proj(attn_out),
                lambda: layer.mlp(layer.input_layernorm(x)),
                lambda attn, mlp: x + attn + mlp,
            )
        h = x + layer.self_attn.o_proj(attn_out)
        return h + layer.mlp(layer.post_attention_layernorm(h))


def per_head_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """StableLM's ``StableLmLayerNormPerHead`` on heads laid out ``[..., heads, D]``: head j through its
    own LayerNorm ``norm.norms[j]`` (HF splits its ``[B, heads, S, D]`` along the heads the same way)."""
    heads = x.unbind(-2)
    return torch.stack([n(h) for n, h in zip(norm.norms, heads, strict=True)], dim=-2)
