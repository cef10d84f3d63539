"""The SmolLM3 adapter (``model_type`` "smollm3").

Llama's layers (RMSNorm, SwiGLU, GQA, tied embeddings) with NoPE layers: a layer whose
``config.no_rope_layers`` entry is 0 (every ``no_rope_layer_interval``-th layer by default, the 4th,
8th, ...) applies no rotary to its q and k (its attention module's ``use_rope``). Its sliding windows
are :func:`~trtforge.llm.models.base.sliding_windows`' per-layer rule (``config.layer_types``).
"""

from __future__ import annotations

from trtforge.llm.models.rope import RopeStyle


class SmolLM3Style(RopeStyle):
    """SmolLM3 (``SmolLM3ForCausalLM``): :class:`RopeStyle` whose NoPE layers skip the rotary."""

    family = "smollm3"

    def rotates(self, i: int) -> bool:
        """False on a NoPE layer (its attention's ``use_rope`` falsy, as transformers tests it)."""
        return bool(self.layers[i].self_attn.use_rope)
