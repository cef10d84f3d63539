"""The OLMo 2 adapter (``model_type`` "olmo2").

Llama's projections and SwiGLU MLP with the norms moved: RMSNorm over the whole q and k projections
(all heads at once, before the split into heads and RoPE), no norm before attention or the MLP, and
RMSNorms on their outputs before each residual add. RoPE tables stay float32 and q/k are rotated in
float32, then cast back, as transformers does for this family. No biases, no window.
"""

from __future__ import annotations

from torch import Tensor

from trtforge.llm.models.rope import RopeStyle, project_qkv


class Olmo2Style(RopeStyle):
    """OLMo 2 (``Olmo2ForCausalLM``): post-norm residual branches and whole-projection q/k norms, rotary in
    float32 (:attr:`~.rotary.RotaryDecoder.float32_tables`)."""

    family = "olmo2"
    float32_tables = float32_rotation = True

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        q, k, v = project_qkv(attn, x)
        q, k = attn.q_norm(q), attn.k_norm(k)
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))  # type: ignore[return-value]

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.post_attention_layernorm(layer.self_attn.o_proj(attn_out))
        return x + layer.post_feedforward_layernorm(layer.mlp(x))
