"""The Nemotron (``model_type`` "nemotron": ``NemotronForCausalLM``, Nemotron-4 / Minitron) and Persimmon
(``model_type`` "persimmon": ``PersimmonForCausalLM``, Persimmon-8B) adapters: Llama-shaped pre-norm
blocks with LayerNorms, a non-gated squared-ReLU MLP (``relu2``: up, relu(x)**2, down) and partial RoPE
(``partial_rotary_factor`` of each head; the rest pass through). The norms and the MLP are the models' own
modules (Nemotron's ``NemotronLayerNorm1P`` scales by 1 + weight), so the adapters read them as they are.

Nemotron: q/k/v/o projections, GQA, optional biases. Persimmon: multi-head attention from one fused
``query_key_value`` projection laid out per head (``[heads, 3, D]``, GPT-NeoX's), an optional LayerNorm of
each query and key head (``qk_layernorm``, one shared over the heads, before the rotary), biases, and a
``final_layernorm``. No window.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.llm.models.rope import RopeStyle


class NemotronStyle(RopeStyle):
    """Nemotron (``NemotronForCausalLM``): :class:`~.rope.RopeStyle` as it is, over Nemotron's modules."""

    family = "nemotron"


class PersimmonStyle(RopeStyle):
    """Persimmon (``PersimmonForCausalLM``): fused per-head QKV, q/k LayerNorms, the pre-norm block."""

    family = "persimmon"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        # (multi-head by construction: transformers' Persimmon ignores a config's num_key_value_heads,
        # which RopeStyle would read, and splits its fused projection into as many KV heads as query heads)
        self.num_kv_heads = self.num_heads

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection viewed as ``[..., heads, 3, D]`` and cut along the 3, as HF does; then the
        q/k LayerNorms."""
        layer = self.layers[i]
        attn = layer.self_attn
        fused = attn.query_key_value(layer.input_layernorm(x)).unflatten(
            -1, (self.num_heads, 3, self.head_dim)
        )
        q, k, v = fused.unbind(-2)
        if attn.qk_layernorm:
            q, k = attn.q_layernorm(q), attn.k_layernorm(k)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.dense(attn_out)
        return layer.mlp(layer.post_attention_layernorm(x)) + x

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.final_layernorm(x)
