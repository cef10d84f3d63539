"""The Gemma adapter: Gemma 1 and CodeGemma (``model_type`` "gemma").

Llama's block shape with Gemma's own modules: embeddings scaled by sqrt(hidden) in the embedding
dtype, RMSNorm by (1 + weight) in float32, a GeGLU MLP (gelu_pytorch_tanh), a head dim of its own (256
by default, not hidden / heads), tied embeddings, RoPE, no window. Gemma 2 (:mod:`.gemma2`) and Gemma
3's text model (:mod:`.gemma3`) build on it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.rope import RopeStyle


class GemmaStyle(RopeStyle):
    """Gemma 1 (``GemmaForCausalLM``): :class:`RopeStyle`'s pre-norm block over Gemma's own norms and
    MLP; the embedding scale is the one difference in the math around them."""

    family = "gemma"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        c = model.config
        if getattr(c, "use_bidirectional_attention", None):
            raise UserError(
                f"{user} cannot run this {c.model_type} model {type(model).__name__}: its config sets "
                "use_bidirectional_attention (an encoder-style Gemma, every token attending to later ones), "
                f"which causal generation cannot reproduce. Supported: causal {c.model_type} models "
                "(use_bidirectional_attention null or false)."
            )
        super().__init__(model, user)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        table = self.body.embed_tokens
        if hasattr(table, "embed_scale"):  # transformers 5: the embedding module scales its rows itself
            return table(input_ids)
        # transformers 4: the model scales them by sqrt(hidden) rounded to their dtype (55.5 in bf16)
        h = table(input_ids)
        return h * torch.tensor(self.config.hidden_size**0.5, dtype=h.dtype)
