"""The HunYuan dense (``model_type`` "hunyuan_v1_dense": ``HunYuanDenseV1ForCausalLM``, Hunyuan-0.5B..7B),
HunYuan-MoE (``model_type`` "hunyuan_v1_moe": ``HunYuanMoEV1ForCausalLM``, Hunyuan-A13B) and Apertus
(``model_type`` "apertus": ``ApertusForCausalLM``, swiss-ai Apertus-8B / 70B) adapters: Llama relatives
whose per-head q/k RMSNorms sit where Llama has none.

HunYuan: Llama's block with the q/k norms (``query_layernorm``, ``key_layernorm``) *after* the rotary, so
the cached keys are normed rotated keys; its rotary module's fixed NTK-alpha tables (``rope_type``
"dynamic" with an ``alpha``) are read like any fixed table. HunYuan-MoE: the same attention, every MLP a
sparse MoE block (:class:`~.moe.SparseMoe`): its gate's ``wg`` Linear (float32 as transformers builds it;
the logits in its dtype), a float32 softmax, top-k (``moe_topk``, per layer where it is a list),
renormalized always, the weights cast to the logits' dtype, and an ungated shared MLP (``shared_mlp``)
added to the experts' sum. Apertus: q/k norms before the rotary (Qwen 3's
place), its block's norms named ``attention_layernorm`` and ``feedforward_layernorm``, a non-gated MLP (xIELU
by default: the model's own module). No window. Apertus 1.5's text model (``model_type`` "apertus1p5_text":
:class:`Apertus1p5TextStyle`) is Apertus' model over a larger vocabulary. NanoChat (``model_type`` "nanochat":
:class:`NanoChatStyle`): weightless q/k norms after the rotary, as HunYuan's, with its own embedding norm,
rotary direction and soft-capped logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trtforge.llm.models.moe import moe_layers
from trtforge.llm.models.rope import RopeStyle, project_qkv


class HunYuanDenseStyle(RopeStyle):
    """HunYuan dense (see the module docstring): q/k RMSNorms after the rotary."""

    family = "hunyuan_v1_dense"

    def rotate(self, i: int, q: Tensor, k: Tensor, rope: Any) -> tuple[Tensor, Tensor]:
        q, k = super().rotate(i, q, k, rope)
        attn = self.layers[i].self_attn
        return attn.query_layernorm(q), attn.key_layernorm(k)


class HunYuanMoeStyle(HunYuanDenseStyle):
    """HunYuan-MoE (see the module docstring): HunYuan's attention, sparse MoE MLPs with a shared MLP."""

    family = "hunyuan_v1_moe"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        where = self.cannot_run()
        self.moe = moe_layers(self.layers, renormalize=True, float32_weights=False, where=where)


class ApertusStyle(RopeStyle):
    """Apertus (see the module docstring): q/k RMSNorms before the rotary, its own norm names."""

    family = "apertus"

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        h = self.layers[i].attention_layernorm(x)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in project_qkv(attn, h))
        return attn.q_norm(q), attn.k_norm(k), v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.o_proj(attn_out)
        return x + layer.mlp(layer.feedforward_layernorm(x))


class Apertus1p5TextStyle(ApertusStyle):
    """Apertus 1.5's text model (``Apertus1p5TextForCausalLM``, ``model_type`` "apertus1p5_text"):
    Apertus' layers (transformers' ``Apertus1p5TextModel`` is ``ApertusModel``) over a vocabulary with
    image and audio tokens. Its LM head may be pruned to the text-only prefix (``output_vocab_size``): the
    logits are then narrower than the input vocabulary, which the spec and the executors' facts tell apart
    (``vocab_size``: the logits' width, the head's rows; ``input_vocab_size``: the ids a prompt may hold)."""

    family = "apertus1p5_text"


class NanoChatStyle(RopeStyle):
    """NanoChat (``NanoChatForCausalLM``, ``model_type`` "nanochat", karpathy/nanochat-d32): Llama's block
    over weightless RMSNorms, with what sets it apart: the final norm module also norms the embeddings
    before the first layer, its rotary turns the other way (``rotate_half`` is ``[x2, -x1]``: the sine
    negated), weightless per-head q/k norms after the rotary (HunYuan's place), a non-gated ``fc1``/``fc2``
    MLP (squared ReLU by default: the model's own module) and soft-capped logits
    (``final_logit_softcapping``, as Gemma 2's). No window."""

    family = "nanochat"

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.norm(self.body.embed_tokens(input_ids))

    def rotary(
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The rotary module's cos and the negated sin: its ``rotate_half`` turns the pairs the other way."""
        cos, sin = super().rotary(position_ids, dtype, rope_lens)
        return cos, -sin

    def rotate(self, i: int, q: Tensor, k: Tensor, rope: Any) -> tuple[Tensor, Tensor]:
        q, k = super().rotate(i, q, k, rope)
        attn = self.layers[i].self_attn
        return attn.q_norm(q), attn.k_norm(k)

    def logits(self, x: Tensor) -> Tensor:
        logits = super().logits(x)
        cap = getattr(self.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap
