"""The OLMo 2 adapter (``model_type`` "olmo2").

Llama's projections and SwiGLU MLP with the norms moved: RMSNorm over the whole q and k projections
(all heads at once, before the split into heads and RoPE), no norm before attention or the MLP, and
RMSNorms on their outputs before each residual add. RoPE tables stay float32 and q/k are rotated in
float32, then cast back, as transformers does for this family. No biases, no window. OLMo 3
(:class:`Olmo3Style`) adds sliding and full layers with a rotary table per layer type; EXAONE 4
(:class:`Exaone4Style`) has the same block with per-head q/k norms and NoPE full-attention layers.
FlexOLMo (:class:`FlexOlmoStyle`, ``model_type`` "flex_olmo": ``FlexOlmoForCausalLM``) has OLMo 2's block
around sparse MoE MLPs (:class:`~.moe.SparseMoe`) routed as OLMoE's: a float32 softmax, top-k, renormalized
by ``norm_topk_prob``, the weights cast to the model's dtype; no shared expert, no window.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.llm.models.moe import moe_layers
from trtforge.llm.models.rope import RopeStyle, project_qkv
from trtforge.llm.models.rotary import PerTypeRotary


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
        return x + layer.post_feedforward_layernorm(self.mlp(i, x))


class Olmo3Style(PerTypeRotary, Olmo2Style):
    """OLMo 3 (``Olmo3ForCausalLM``, ``model_type`` "olmo3"): OLMo 2's layers with sliding and full
    layers by ``config.layer_types`` (3 of 4 sliding by default: the windows of
    :func:`~trtforge.llm.models.base.sliding_windows`) and a float32 rotary table per layer type
    (:class:`~.rotary.PerTypeRotary`: rope scaling applies to the full-attention layers' only)."""

    family = "olmo3"


class Exaone4Style(Olmo2Style):
    """EXAONE 4 (``Exaone4ForCausalLM``, ``model_type`` "exaone4"): OLMo 2's post-norm block with per-head
    q/k RMSNorms (before the rotary), the tables and rotation in the model's dtype, sliding and full layers
    by ``config.layer_types``; with a ``sliding_window`` set only the sliding layers rotate (the full ones
    are NoPE), without one every layer does (transformers' ``Exaone4Attention``)."""

    family = "exaone4"
    float32_tables = float32_rotation = False

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in project_qkv(attn, x))
        return attn.q_norm(q), attn.k_norm(k), v

    def rotates(self, i: int) -> bool:
        return self.config.sliding_window is None or self.windows[i] is not None


class FlexOlmoStyle(Olmo2Style):
    """FlexOLMo (``FlexOlmoForCausalLM``, ``model_type`` "flex_olmo"): OLMo 2's layers with sparse MoE MLPs
    routed as OLMoE's (see the module docstring)."""

    family = "flex_olmo"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        c = self.config
        where = self.cannot_run()
        self.moe = moe_layers(
            self.layers, renormalize=bool(c.norm_topk_prob), float32_weights=False, where=where
        )
