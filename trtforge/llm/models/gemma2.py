"""The Gemma 2 adapter (``model_type`` "gemma2": ``Gemma2ForCausalLM``, gemma-2-2b / 9b / 27b).

Gemma 1's embeddings scaled by sqrt(hidden), (1 + weight) RMSNorms and GeGLU, with what Gemma 2 adds:
RMSNorms on the attention and MLP outputs before each residual add (four norms a layer), the softmax
scale ``query_pre_attn_scalar ** -0.5`` (the attention modules' own ``scaling``), sliding and full layers
(``config.layer_types``, the windows of :func:`~trtforge.llm.models.base.sliding_windows`) under one
rotary table, attention scores soft-capped by ``attn_logit_softcapping`` (each score s = q . k * scale
becomes c * tanh(s / c) before the mask, on every layer: the adapter's ``softcaps``, which every
attention consumer applies) and logits soft-capped by ``final_logit_softcapping``. Gemma 3's text model
(:mod:`.gemma3`) is this with per-head q/k norms and a rotary table per layer type; VaultGemma
(:class:`VaultGemmaStyle`) is this without the norms on the attention and MLP outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.llm.models.base import attention_softcap
from trtforge.llm.models.gemma import GemmaStyle


class Gemma2Style(GemmaStyle):
    """Gemma 2 (see the module docstring): :class:`GemmaStyle` with sandwich norms, soft-capped attention
    scores and soft-capped logits."""

    family = "gemma2"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        cap = self._attention_softcap()
        self.softcaps = [cap] * self.num_layers

    def _attention_softcap(self) -> float | None:
        """The cap every layer's attention applies: ``config.attn_logit_softcapping`` (UserError unless it
        is null or a finite number > 0)."""
        return attention_softcap(self.config, self.user)

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Sandwich norms: each branch normed before (input / pre-feedforward) and after (post-attention /
        post-feedforward), then added to the residual."""
        layer = self.layers[i]
        x = x + layer.post_attention_layernorm(layer.self_attn.o_proj(attn_out))
        return x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))

    def logits(self, x: Tensor) -> Tensor:
        """The LM head's logits, soft-capped to ``cap * tanh(logits / cap)`` when the config sets
        ``final_logit_softcapping`` (as ``Gemma2ForCausalLM.forward`` and Gemma 3's do)."""
        logits = super().logits(x)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap


class VaultGemmaStyle(Gemma2Style):
    """VaultGemma (``VaultGemmaForCausalLM``, ``model_type`` "vaultgemma", google/vaultgemma-1b): Gemma 2's
    layers without the norms on the attention and MLP outputs (its layer keeps ``input_layernorm`` and
    ``pre_feedforward_layernorm``); the soft-caps, sliding and full layers and scaled embeddings are
    Gemma 2's."""

    family = "vaultgemma"

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.o_proj(attn_out)
        return x + layer.mlp(layer.pre_feedforward_layernorm(x))
