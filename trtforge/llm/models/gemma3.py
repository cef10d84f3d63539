"""The Gemma 3 text adapter (``model_type`` "gemma3_text": ``Gemma3ForCausalLM``, gemma-3-270m / 1b).

Gemma 2's layers (:mod:`.gemma2`: four norms a layer, the softmax scale ``query_pre_attn_scalar ** -0.5``,
sliding and full layers by ``config.layer_types``, logits soft-capped by ``final_logit_softcapping``) with
what Gemma 3 changes: per-head q/k RMSNorms before RoPE, and a rotary table per layer type (each from
its type's ``config.rope_parameters`` entry). Its attention applies no soft-cap: transformers' Gemma 3
attention never passes ``attn_logit_softcapping`` on (the config keeps the field; Gemma 3 bounds its
scores by the q/k norms instead), so a config that sets it is served as transformers runs it, uncapped.
Bidirectional attention is refused (:class:`~.gemma.GemmaStyle`).
"""

from __future__ import annotations

from torch import Tensor

from trtforge.llm.models.gemma2 import Gemma2Style
from trtforge.llm.models.rotary import PerTypeRotary


class Gemma3Style(PerTypeRotary, Gemma2Style):
    """Gemma 3 text (see the module docstring): Gemma 2's layers with per-head q/k norms under
    :class:`~.rotary.PerTypeRotary`'s tables, one pair per layer type."""

    family = "gemma3_text"

    def _attention_softcap(self) -> None:
        """None whatever the config says: transformers' Gemma 3 attention applies no soft-cap."""
        return None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Pre-norm projections, then the per-head q/k norms (before rotary, as transformers applies them)."""
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        return attn.q_norm(q), attn.k_norm(k), v
