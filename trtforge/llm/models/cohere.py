"""The Cohere adapters: Command-R (``model_type`` "cohere": ``CohereForCausalLM``) and Command-R7B / Command
A (``model_type`` "cohere2": ``Cohere2ForCausalLM``).

Cohere: one LayerNorm without bias (``CohereLayerNorm``, in float32) per block feeding the attention and
the SiLU-gated MLP in parallel (``x + o(attn(h)) + mlp(h)``), interleaved RoPE (channel pairs (0, 1),
(2, 3), ...; q and k rotated in float32 and cast back), an optional per-head q/k LayerNorm before the
rotary (``use_qk_norm``: one weight row per head), tied embeddings and the logits multiplied by
``logit_scale``. No window.

Cohere 2: the same block without q/k norms, sliding and full layers by ``config.layer_types`` (the
windows of :func:`~trtforge.llm.models.base.sliding_windows`), and RoPE on the sliding layers only: its
full-attention layers are NoPE.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.rope import RopeStyle


class CohereStyle(RopeStyle):
    """Cohere (see the module docstring): :class:`~.rope.RopeStyle`'s body with Cohere's parallel block,
    q/k norms, interleaved float32 rotary and scaled logits."""

    family = "cohere"
    interleaved = float32_rotation = True

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        c = model.config
        scale = getattr(c, "logit_scale", None)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            raise UserError(
                f"{user} cannot run this {c.model_type} model {type(model).__name__}: its config sets "
                f"logit_scale={scale!r}; transformers multiplies the logits by it, so it must be a number "
                "(Command-R's is 0.0625)."
            )
        super().__init__(model, user)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        if getattr(attn, "use_qk_norm", False):
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """The attention and the MLP both read the block's one ``input_layernorm`` of `x` (recomputed here:
        the torch executor runs the two halves of a block as separate pieces); HF's sum order."""
        layer = self.layers[i]
        return self.parallel_block(
            x,
            lambda: layer.self_attn.o_proj(attn_out),
            lambda: layer.mlp(layer.input_layernorm(x)),
            lambda attn, mlp: x + attn + mlp,
        )

    def logits(self, x: Tensor) -> Tensor:
        return super().logits(x) * self.config.logit_scale


class Cohere2Style(CohereStyle):
    """Cohere 2 (see the module docstring): Cohere's block with windows, RoPE on the sliding layers only."""

    family = "cohere2"

    def rotates(self, i: int) -> bool:
        """Only a layer with a window rotates (transformers' Cohere 2 attention tests its
        ``sliding_window``, set on the sliding layers)."""
        return self.windows[i] is not None
