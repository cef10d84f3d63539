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

from typing import Any

import torch
from torch import Tensor, nn

from trtforge.llm.models.base import DecoderSpec
from trtforge.llm.models.gemma2 import Gemma2Style
from trtforge.llm.models.rotary import RotaryTables

Rope = dict[str, tuple[Tensor, Tensor]]


class Gemma3Style(Gemma2Style):
    """Gemma 3 text (see the module docstring): :meth:`rotary` returns one (cos, sin) pair per layer type,
    :meth:`rotate` picks layer i's."""

    family = "gemma3_text"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        #: each layer's type ("sliding_attention" or "full_attention"), which picks its rotary tables
        self.layer_types: list[str] = list(model.config.layer_types[: self.num_layers])

    def _attention_softcap(self) -> None:
        """None whatever the config says: transformers' Gemma 3 attention applies no soft-cap."""
        return None

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
