"""The Gemma 3 text adapter (``model_type`` "gemma3_text": ``Gemma3ForCausalLM``, gemma-3-270m / 1b).

Gemma 1's embeddings scaled by sqrt(hidden), (1 + weight) RMSNorms and GeGLU, with what Gemma 3 adds:
per-head q/k RMSNorms before RoPE, RMSNorms on the attention and MLP outputs before each residual add
(four norms a layer), the softmax scale ``query_pre_attn_scalar ** -0.5`` (the attention modules' own
``scaling``), sliding and full layers (``config.layer_types``, the windows of
:func:`~trtforge.llm.models.base.sliding_windows`) whose rotary tables each come from their type's
``config.rope_parameters`` entry, and logits soft-capped by ``final_logit_softcapping``. Attention
soft-capping (``attn_logit_softcapping``, Gemma 2's) and bidirectional attention are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.base import DecoderSpec
from trtforge.llm.models.gemma import GemmaStyle
from trtforge.llm.models.rotary import RotaryTables

Rope = dict[str, tuple[Tensor, Tensor]]


class Gemma3Style(GemmaStyle):
    """Gemma 3 text (see the module docstring): :meth:`rotary` returns one (cos, sin) pair per layer type,
    :meth:`rotate` picks layer i's."""

    family = "gemma3_text"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        c, name = model.config, type(model).__name__
        if getattr(c, "attn_logit_softcapping", None) is not None:
            raise UserError(
                f"{user} cannot run this gemma3_text model {name}: its config sets attn_logit_softcapping="
                f"{c.attn_logit_softcapping} (tanh soft-capping of the attention scores), which trtforge's "
                "attention kernels do not apply. Supported: Gemma 3 text models with attn_logit_softcapping "
                "null, as the released checkpoints have it."
            )
        if getattr(c, "use_bidirectional_attention", None):
            raise UserError(
                f"{user} cannot run this gemma3_text model {name}: its config sets "
                "use_bidirectional_attention (every token attending to later ones within its window), "
                "which causal generation cannot reproduce. Supported: causal Gemma 3 text models "
                "(use_bidirectional_attention null or false)."
            )
        super().__init__(model, user)
        #: each layer's type ("sliding_attention" or "full_attention"), which picks its rotary tables
        self.layer_types: list[str] = list(c.layer_types[: self.num_layers])

    def _use_rotary(self, rotary_emb: nn.Module) -> None:
        """One :class:`~.rotary.RotaryTables` per layer type of the model, from the module's tables of that
        type (each UserError for a type no step can match, e.g. longrope)."""
        types = sorted(set(self.config.layer_types[: self.num_layers]))
        self.ropes = {t: RotaryTables(self.model, rotary_emb, self.user, layer_type=t) for t in types}
        self.dynamic = any(r.dynamic for r in self.ropes.values())

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(
            positions="rotary",
            rotary={t: r.describe() for t, r in self.ropes.items()},
            max_positions=getattr(self.config, "max_position_embeddings", None),
        )

    @property
    def max_length(self) -> int:
        return max(r.max_length for r in self.ropes.values())

    def rotary(  # type: ignore[override]
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> Rope:
        """{layer type: (cos, sin)}, each as the HF rotary module computes that type's."""
        return {t: r(position_ids, dtype, rope_lens) for t, r in self.ropes.items()}

    def rotary_over_heads(self, rope: Any) -> Any:
        """Each layer type's pair with a heads axis at dim 1 (see the base method)."""
        if rope is None:
            return None
        return {t: super(Gemma3Style, self).rotary_over_heads(pair) for t, pair in rope.items()}

    def rotate(self, i: int, q: Tensor, k: Tensor, rope: Any) -> tuple[Tensor, Tensor]:
        """q and k rotated by the tables of layer i's type."""
        return super().rotate(i, q, k, None if rope is None else rope[self.layer_types[i]])

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Pre-norm projections, then the per-head q/k norms (before rotary, as transformers applies them)."""
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        return attn.q_norm(q), attn.k_norm(k), v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Sandwich norms: each branch normed before (input / pre-feedforward) and after (post-attention /
        post-feedforward), then added to the residual."""
        layer = self.layers[i]
        x = x + layer.post_attention_layernorm(layer.self_attn.o_proj(attn_out))
        return x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))

    def logits(self, x: Tensor) -> Tensor:
        """The LM head's logits, soft-capped to ``cap * tanh(logits / cap)`` when the config sets
        ``final_logit_softcapping`` (as ``Gemma3ForCausalLM.forward`` does)."""
        logits = super().logits(x)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap
