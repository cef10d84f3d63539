"""The OLMo 1 adapter (``model_type`` "olmo": ``OlmoForCausalLM``, OLMo-1B / 7B, OLMo-1.7).

Llama's pre-norm block and SwiGLU MLP with non-parametric LayerNorms (no weight, no bias, eps 1e-5, in
float32: the model's own ``OlmoLayerNorm`` modules), q, k and v each clamped to ``[-clip_qkv, clip_qkv]``
after their projection when the config sets ``clip_qkv``, and the rotary in float32 as OLMo 2's
(tables not cast to the model's dtype, q and k rotated in float32 and cast back). No window.
"""

from __future__ import annotations

from torch import Tensor

from trtforge.llm.models.rope import RopeStyle


class OlmoStyle(RopeStyle):
    """OLMo 1 (``OlmoForCausalLM``): :class:`~.rope.RopeStyle`'s pre-norm block with ``clip_qkv``."""

    family = "olmo"
    float32_tables = float32_rotation = True

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        clip = self.config.clip_qkv
        if clip is None:
            return q, k, v
        return q.clamp(-clip, clip), k.clamp(-clip, clip), v.clamp(-clip, clip)
