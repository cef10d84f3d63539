"""The Granite adapter: IBM Granite 3.x dense models (``model_type`` "granite").

Llama's layers with four scalars from the config: ``embedding_multiplier`` on the embeddings,
``residual_multiplier`` on each branch before its residual add, ``attention_multiplier`` as the
softmax scale (the attention modules' own ``scaling``, read like every family's) and the logits
divided by ``logits_scaling``. No window.
"""

from __future__ import annotations

from torch import Tensor

from trtforge.llm.models.rope import RopeStyle


class GraniteStyle(RopeStyle):
    """Granite (``GraniteForCausalLM``): :class:`RopeStyle`'s pre-norm block with scaled branches."""

    family = "granite"

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.embed_tokens(input_ids) * self.body.embedding_multiplier

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        scale = layer.residual_multiplier
        x = x + layer.self_attn.o_proj(attn_out) * scale
        return x + layer.mlp(layer.post_attention_layernorm(x)) * scale

    def logits(self, x: Tensor) -> Tensor:
        return super().logits(x) / self.config.logits_scaling
