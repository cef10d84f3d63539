"""Llama 4's text model (``llama4_text``: ``Llama4ForCausalLM`` / ``Llama4TextConfig``, the language model of
Llama 4 Scout and Maverick), as transformers' ``modeling_llama4`` computes it:

- chunked attention: the layers ``config.layer_types`` marks "chunked_attention" (its config marks the RoPE
  layers while ``attention_chunk_size`` is set) attend only within their chunk of positions (a query at p
  sees the keys j <= p with ``j // C == p // C``: :func:`~.base.attention_chunks`, the adapter's
  ``chunks``, which every attention consumer applies or refuses by name);
- NoPE layers: those whose ``no_rope_layers`` entry is 0 (every 4th by default) do not rotate; with
  ``attn_temperature_tuning`` their queries are scaled by ``1 + attn_scale * log1p(floor((p + 1) /
  floor_scale))`` (a float32 factor, multiplied in the dtype it promotes the queries to:
  :class:`~.rotary.QueryScaling`);
- the rotary pairs channels (0, 1), (2, 3), ... (its complex ``freqs_cis``), q and k rotated in float32
  and cast back; with ``use_qk_norm`` the RoPE layers' q and k then go through a weightless RMSNorm over
  each head (``rms_norm_eps``; transformers' ``Llama4TextWeightlessRMSNorm``, once ``Llama4TextL2Norm``);
- MoE layers (``moe_layers``, from ``interleave_moe_layer_step``): a router picks the top
  ``num_experts_per_tok`` logits, each weighted by their sigmoid (in the model's dtype), and each chosen
  expert's INPUT is scaled by its weight (its output summed as it is); the experts are fused 3-D parameters
  in the transposed layout (``gate_up_proj`` [E, H, 2 I], ``down_proj`` [E, I, H]); an ungated shared
  expert is added. The other layers' dense MLP is ``intermediate_size_mlp`` wide. Both are the layer's
  ``feed_forward``.

Not Llama-style: the fused CUDA layers do not run it; tensor parallelism refuses it by name. On CUDA the torch
executor runs its MoE blocks in the fused MoE kernels (:mod:`trtforge.kernels.moe`: the transposed experts
read in place, their inputs scaled in the gate_up GEMM, the router's top-k and sigmoid in one launch), so
its steps are captured in CUDA graphs.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.base import TP_RULE
from trtforge.llm.models.moe import moe_layers
from trtforge.llm.models.rope import RopeStyle
from trtforge.llm.models.rotary import QueryScaling


class Llama4TextStyle(RopeStyle):
    """Llama 4's text model (see the module docstring)."""

    family = "llama4_text"
    #: ``apply_rotary_emb``: q and k as complex pairs (0, 1), (2, 3), ... rotated by float32 ``freqs_cis``
    interleaved = True
    float32_tables = True
    float32_rotation = True

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        c = self.config
        if c.attn_temperature_tuning:
            self.query_scaling = QueryScaling(
                "llama4",
                float(c.attn_scale),
                int(c.floor_scale),
                nope_only=True,
                promoted=True,
                from_one=True,
            )
        self.moe = moe_layers(
            self.layers,
            renormalize=False,
            float32_weights=False,
            where=self.cannot_run(),
            routing="topk_sigmoid",
            block="feed_forward",
            scale_input=True,
            transposed=True,
        )

    def rotates(self, i: int) -> bool:
        """``Llama4TextAttention.use_rope``: the layer's ``no_rope_layers`` entry (0: a NoPE layer)."""
        return bool(self.config.no_rope_layers[i])

    def _rotate_tables(self, i: int, q: Tensor, k: Tensor, tables: Any) -> tuple[Tensor, Tensor]:
        """q and k rotated, then (the RoPE layers, with ``use_qk_norm``) normed by the layer's weightless
        RMSNorm (``qk_norm``), as ``Llama4TextAttention`` orders them."""
        q, k = super()._rotate_tables(i, q, k, tables)
        norm = getattr(self.attention(i), "qk_norm", None)
        if norm is None:
            return q, k
        return norm(q), norm(k)

    def check_shard(self, world: int) -> None:
        """UserError: its MoE MLPs and chunked layers are refused by the base check first (by name), then the
        rest of the family, whose q/k RMSNorms after the rotary and position-scaled NoPE queries no tensor-
        parallel run has been checked against transformers."""
        super().check_shard(world)
        c = self.config
        raise UserError(
            f"tensor parallelism is not supported for {c.model_type} models ({type(self.model).__name__}): "
            f"{TP_RULE} {c.model_type}'s weightless q/k RMSNorms after the rotary (use_qk_norm) and its NoPE "
            "layers' position-scaled queries (attn_temperature_tuning) have no split yet. Use "
            "tensor_parallel_size=1."
        )

    def mlp_module(self, i: int) -> nn.Module:
        """Layer i's ``feed_forward`` (its dense MLP, or its MoE block)."""
        return self.layers[i].feed_forward

    def mlp(self, i: int, h: Tensor) -> Tensor:
        """Layer i's ``feed_forward``: the MoE block (:attr:`moe`) or the dense MLP."""
        moe = self.moe[i]
        if moe is None:
            return self.layers[i].feed_forward(h)
        return moe.forward(h, self.moe_formulation)
