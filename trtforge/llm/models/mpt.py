"""The MPT adapter (``model_type`` "mpt": ``MptForCausalLM``, mpt-7b / mpt-30b and their kin, Replit's
code models).

ALiBi positions (:func:`~trtforge.llm.models.base.mpt_alibi_slopes` with ``alibi_bias_max`` 8 on every
layer, which every attention consumer applies), pre-norm blocks with bias-free LayerNorms and
projections, the fused ``Wqkv`` (all queries, then keys, then values; clamped to ``±clip_qkv`` when set),
the softmax scale ``attn_config.softmax_scale`` (the attention modules' own), an exact-GELU MLP, an LM
head tied by default; no window. Positions stop at ``max_seq_len``: transformers' bias table has no more
(its forward fails past it), so the executors refuse a longer sequence.

Refused by name: what the config asks for but transformers' MPT does not build (it ignores these options,
so no model it runs matches such a checkpoint): positions other than ALiBi (``attn_config.alibi``
false), multi-query or grouped attention (``attn_type``), per-head q/k LayerNorms (``qk_ln``), prefix-LM
attention (``prefix_lm``), slopes of another ``attn_config.alibi_bias_max`` than 8 (transformers' forward
builds its bias with the default 8 whatever the config says), biases (``no_bias`` false), a logit scale
(``logit_scale``), an MLP ratio other than 4 (``expansion_ratio``) and norms other than LayerNorm
(``norm_type``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.base import DecoderAdapter, DecoderSpec, mpt_alibi_slopes

_LAYER_NORMS = ("low_precision_layernorm", "layernorm")
# the alibi_bias_max transformers' MptModel.forward builds its slopes with (it passes none of the config's)
ALIBI_BIAS_MAX = 8


def _refusal(config: Any) -> str | None:
    """What the config sets that transformers' MPT does not implement (None: nothing)."""
    attn = config.attn_config
    if not getattr(attn, "alibi", True):
        return "attn_config.alibi=False (learned positions instead of ALiBi)"
    if getattr(attn, "attn_type", "multihead_attention") != "multihead_attention":
        return f"attn_config.attn_type={attn.attn_type!r} (only multihead_attention)"
    for name, what in (("qk_ln", "per-head q/k LayerNorms"), ("prefix_lm", "prefix-LM attention")):
        if getattr(attn, name, False):
            return f"attn_config.{name}=True ({what})"
    if getattr(attn, "alibi_bias_max", ALIBI_BIAS_MAX) != ALIBI_BIAS_MAX:
        return (
            f"attn_config.alibi_bias_max={attn.alibi_bias_max} (its forward builds the ALiBi slopes with "
            f"{ALIBI_BIAS_MAX})"
        )
    if not getattr(config, "no_bias", True):
        return "no_bias=False (projection and norm biases)"
    if getattr(config, "logit_scale", None) is not None:
        return f"logit_scale={config.logit_scale!r} (scaled logits)"
    if getattr(config, "expansion_ratio", 4) != 4:
        return f"expansion_ratio={config.expansion_ratio} (its MLP is 4 x d_model wide)"
    if getattr(config, "norm_type", "low_precision_layernorm") not in _LAYER_NORMS:
        return f"norm_type={config.norm_type!r} (LayerNorm only)"
    return None


class MptStyle(DecoderAdapter):
    """MPT (``MptForCausalLM``, body ``model.transformer``; see the module docstring)."""

    family = "mpt"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        c = model.config
        refused = _refusal(c)
        if refused:
            raise UserError(
                f"{user} cannot run this mpt model {type(model).__name__}: its config sets {refused}, which "
                "transformers' MPT does not implement (it builds ALiBi multi-head attention with bias-free "
                "LayerNorms and a 4x MLP whatever the config says), so neither it nor trtforge would run "
                "this checkpoint as trained. Supported: mpt-7b-style configs (attn_config.alibi true, "
                "attn_type multihead_attention, alibi_bias_max 8, no qk_ln / prefix_lm, no_bias true, no "
                "logit_scale)."
            )
        super().__init__(model, list(model.transformer.blocks), user)
        self.body = model.transformer
        attn = self.layers[0].attn
        self.num_heads = self.num_kv_heads = int(attn.n_heads)
        self.head_dim = int(attn.head_dim)
        self.scales = [float(layer.attn.softmax_scale) for layer in self.layers]
        slopes = mpt_alibi_slopes(self.num_heads, ALIBI_BIAS_MAX)
        self.alibi_slopes = [slopes] * self.num_layers
        self._count_rank_heads()

    def attention(self, i: int) -> nn.Module:
        return self.layers[i].attn

    def mlp_module(self, i: int) -> nn.Module:
        return self.layers[i].ffn

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(positions="alibi", rotary=None, max_positions=self.max_length)

    @property
    def max_length(self) -> int:
        return int(self.config.max_seq_len)

    @property
    def bounded(self) -> bool:
        """transformers' MPT builds its bias for ``max_seq_len`` positions and cannot run past them."""
        return True

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.wte(input_ids)

    def rotary(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> None:
        return None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``Wqkv`` of the normed input, clamped to ``±clip_qkv`` when set, cut into queries, keys, values."""
        layer = self.layers[i]
        attn = layer.attn
        mixed = attn.Wqkv(layer.norm_1(x))
        if attn.clip_qkv:
            mixed = mixed.clamp(min=-attn.clip_qkv, max=attn.clip_qkv)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in mixed.chunk(3, dim=-1))
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """``h = out_proj(attn) + x``, then ``down_proj(gelu(up_proj(norm_2(h)))) + h`` (HF's sum order)."""
        layer = self.layers[i]
        h = layer.attn.out_proj(attn_out) + x
        ffn = layer.ffn
        return ffn.down_proj(ffn.act(ffn.up_proj(layer.norm_2(h)))) + h

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.norm_f(x)
