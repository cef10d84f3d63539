"""Llama relatives with interleaved RoPE (channel pairs (0, 1), (2, 3), ... rotate together): GLM-4
(``model_type`` "glm": ``GlmForCausalLM``, glm-4-9b), GLM-4-0414 (``model_type`` "glm4":
``Glm4ForCausalLM``), Helium (``model_type`` "helium": ``HeliumForCausalLM``, Kyutai's helium-1), ERNIE
4.5 (``model_type`` "ernie4_5": ``Ernie4_5ForCausalLM``, the dense 0.3B) and ERNIE 4.5-MoE (``model_type``
"ernie4_5_moe": ``Ernie4_5_MoeForCausalLM``, ERNIE-4.5-21B-A3B / 300B-A47B).

GLM:
Llama's pre-norm block with Phi-3's fused ``gate_up_proj`` MLP, q/k/v biases (``attention_bias``, on by
default), no output bias, and a partial (``partial_rotary_factor``, 1/2 by default) interleaved RoPE:
channel pairs (0, 1), (2, 3), ... of the first half of each head rotate, the rest pass through. GLM-4-0414
adds RMSNorms on the attention and MLP outputs before each residual add (``post_self_attn_layernorm``,
``post_mlp_layernorm``). No window.

Helium: Llama's block (its RMSNorm multiplies in float32) with q/k/v biases (``attention_bias``) and the
interleaved RoPE over whole heads. ERNIE 4.5: Llama's block with every projection biased or none
(``use_bias``), the interleaved rotary's tables kept float32 and q and k rotated in float32, then cast back.
No window. ERNIE 4.5-MoE: the same attention, sparse MoE MLPs (:class:`~.moe.SparseMoe`) on the layers
``moe_layer_interval`` / ``moe_layer_start_index`` / ``moe_layer_end_index`` pick (the others dense):
float32 router logits, a float32 softmax, the top k chosen by the probabilities plus the router's
``e_score_correction_bias`` and weighted by the unbiased ones, renormalized always (the sum clamped below
at ``moe_norm_min``), cast to the model's dtype; an ungated shared MLP (``shared_experts``,
``moe_num_shared_experts`` experts wide; none at 0) added to the experts' sum.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.moe import moe_layers
from trtforge.llm.models.rope import RopeStyle


class GlmStyle(RopeStyle):
    """GLM (``GlmForCausalLM``): :class:`~.rope.RopeStyle` with interleaved tables."""

    family = "glm"
    interleaved = True


class Glm4Style(GlmStyle):
    """GLM-4-0414 (``Glm4ForCausalLM``): GLM with norms after attention and MLP."""

    family = "glm4"

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.post_self_attn_layernorm(layer.self_attn.o_proj(attn_out))
        return x + layer.post_mlp_layernorm(layer.mlp(layer.post_attention_layernorm(x)))


class HeliumStyle(RopeStyle):
    """Helium (``HeliumForCausalLM``): :class:`~.rope.RopeStyle` with interleaved tables."""

    family = "helium"
    interleaved = True

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        c = model.config
        if int(c.num_attention_heads) * int(c.head_dim) != int(c.hidden_size):
            raise UserError(
                f"{user} cannot run this helium model {type(model).__name__}: its config's "
                f"num_attention_heads ({c.num_attention_heads}) x head_dim ({c.head_dim}) is not its "
                f"hidden_size ({c.hidden_size}), which Helium's output projection (hidden_size x "
                "hidden_size) needs; transformers' own forward fails on it too. Set head_dim to "
                "hidden_size / num_attention_heads."
            )
        super().__init__(model, user)


class Ernie45Style(RopeStyle):
    """ERNIE 4.5 dense (``Ernie4_5ForCausalLM``): interleaved tables in float32, q/k rotated in float32."""

    family = "ernie4_5"
    interleaved = float32_tables = float32_rotation = True


class Ernie45MoeStyle(Ernie45Style):
    """ERNIE 4.5-MoE (``Ernie4_5_MoeForCausalLM``): ERNIE 4.5's attention, sparse MoE MLPs (see the module
    docstring)."""

    family = "ernie4_5_moe"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        c = self.config
        where = self.cannot_run()
        self.moe = moe_layers(
            self.layers,
            renormalize=True,
            float32_weights=False,
            where=where,
            float32_logits=True,
            selection_bias=True,
            norm_min=float(c.moe_norm_min),
        )
