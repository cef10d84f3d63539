"""The sparse mixture-of-experts families (Mixtral and its relatives): Llama-shaped RoPE decoders whose
MLPs are :class:`~trtforge.llm.models.moe.SparseMoe` blocks (:mod:`.moe`: routing, the grouped and dense
formulations).

- ``mixtral`` (``MixtralForCausalLM``): Mistral's attention (GQA, one ``sliding_window`` on every layer or
  none), every MLP sparse, the top-k routing weights always renormalized and kept in float32.
- ``qwen2_moe`` (``Qwen2MoeForCausalLM``, Qwen1.5-MoE / Qwen2-57B-A14B): Qwen2's attention (q/k/v biases
  by ``qkv_bias``, windows by ``layer_types``), a shared expert behind a sigmoid gate added to the routed
  ones, ``norm_topk_prob``, and dense layers where ``mlp_only_layers`` / ``decoder_sparse_step`` say.
- ``qwen3_moe`` (``Qwen3MoeForCausalLM``, Qwen3-30B-A3B / 235B-A22B): Qwen3's per-head q/k RMSNorms before
  RoPE, one window on every layer when ``use_sliding_window``, ``norm_topk_prob``, dense layers as
  Qwen2-MoE.
- ``olmoe`` (``OlmoeForCausalLM``): RMSNorms over the whole q and k projections, then ``clip_qkv``
  clamping q, k and v, no window, ``norm_topk_prob``.
- ``glm4_moe`` (``Glm4MoeForCausalLM``, GLM-4.5 / GLM-4.5-Air / GLM-4.6): Llama's attention with q/k/v
  biases (``attention_bias``), per-head q/k RMSNorms before RoPE where ``use_qk_norm``, a partial
  (``partial_rotary_factor``) rotate-half RoPE; the first ``first_k_dense_replace`` layers dense, the rest
  sparse, routed DeepSeek-V3's way (the ``sigmoid_topk`` routing of :mod:`.moe`): float32 logits, a
  sigmoid score per expert, the top k chosen by the scores plus ``e_score_correction_bias`` among the
  ``topk_group`` best of ``n_group`` expert groups, weighted by the unbiased scores, renormalized by
  ``norm_topk_prob`` (the sum plus 1e-20), times ``routed_scaling_factor``, kept in float32; an ungated
  shared MLP (``shared_experts``, ``n_shared_experts`` experts wide) added to the experts' sum. No window.
- ``param2moe`` (Param2-17B-A2.4B) and ``sarvam_moe`` (Sarvam-30B): GLM-4.5's classes (transformers maps
  both to ``Glm4MoeForCausalLM``) under configs of their own, whose defaults rotate the whole head and turn
  the q/k norms on: GLM-4.5's adapter as it is.
- ``solar_open`` (``SolarOpenForCausalLM``, Solar-Open-100B): Llama's attention (no q/k norms; q/k/v biases
  by ``attention_bias``, none on o_proj; rotary over ``partial_rotary_factor`` of the head, the whole head
  by default) with GLM-4.5's router and shared experts on every layer (no dense layers). No window.
- ``dots1`` (``Dots1ForCausalLM``, rednote's dots.llm1): Qwen3's attention (per-head q/k RMSNorms before a
  whole-head RoPE, q/k/v/o biases by ``attention_bias``), windows by ``layer_types`` (its config builds
  them from ``sliding_window`` and ``max_window_layers``), GLM-4.5's routing, shared experts and dense
  first layers (the same router, transformers' ``Dots1TopkRouter``).
- ``exaone_moe`` (``ExaoneMoeForCausalLM``, K-EXAONE): Llama's pre-norm block with EXAONE 4's attention
  (per-head q/k RMSNorms before RoPE; sliding and full layers by ``layer_types``, and with a
  ``sliding_window`` set only the sliding layers rotate, the full ones are NoPE), GLM-4.5's routing and
  shared experts, dense layers by ``mlp_layer_types`` (``first_k_dense_replace`` builds it).
- ``mellum`` (``MellumForCausalLM``, JetBrains' Mellum 2): Qwen3-MoE's attention (per-head q/k RMSNorms
  before RoPE), routing and MoE blocks in Laguna's pre-norm layer: windows by ``layer_types``, a rotary
  table per layer type (each from its type's ``config.rope_parameters`` entry, with its own
  ``partial_rotary_factor``), dense layers by ``mlp_layer_types``.
- ``kolibri1`` (``Kolibri1ForCausalLM``, Aleph Alpha's Kolibri-1): K-EXAONE's attention (per-head q/k
  RMSNorms before RoPE, sliding and full layers by ``layer_types``, 4 of 5 sliding by default, the full ones
  NoPE while a ``sliding_window`` is set) in GLM-4-0414's block (RMSNorms on the attention and MLP outputs
  too), every MLP sparse with a shared MLP beside it, routed by the top k of the float32 logits plus
  ``e_score_correction_bias`` (the bias added before the sigmoid), weighted by the sigmoid of the chosen
  logits, renormalized by ``norm_topk_prob``, kept in float32.
- ``minicpm5_moe`` (``MiniCPM5MoeForCausalLM``, MiniCPM5-15B-A2.5B): Llama's attention whose
  ``q_gate_proj`` gives each head its queries and an output gate ([query | gate] per head), the attention
  output times the sigmoid of the gate before ``o_proj``; GLM-4.5's router and shared experts, dense layers
  by ``mlp_layer_types``, a pre-norm block. No window.
- ``minimax_m2`` (``MiniMaxM2ForCausalLM``, MiniMax-M2 / M2.1): Mixtral's layers without a window, RMSNorms
  over the whole q and k projections before a partial (``partial_rotary_factor``; its checkpoints'
  ``rotary_dim``) rotate-half RoPE, every MLP sparse, routed by a sigmoid of each logit (the logits in the
  model's dtype) with the block's ``e_score_correction_bias`` choosing the top k, the unbiased scores
  always renormalized and kept in float32.
- ``hy_v3`` (``HYV3ForCausalLM``, Tencent's Hunyuan 3): Apertus' attention (per-head q/k RMSNorms before
  RoPE) in Llama's pre-norm block, dense layers by ``mlp_layer_types``, GLM-4.5's routing without expert
  groups (float32 sigmoid scores, the top k chosen with the block's ``e_score_correction_bias``,
  renormalized always, times ``router_scaling_factor``) and an ungated shared MLP, added to the experts'
  sum in float32 where ``enable_moe_fp32_combine``. No window.
- ``flint`` (``FlintForCausalLM``): Qwen3-MoE's attention with attention sinks (gpt-oss's, one logit a query
  head) and windows by ``layer_types``, the sliding layers with RoPE and the full ones without (and its
  ``attention_bias`` on o_proj too); a float32 router whose sigmoid scores pick the top k (renormalized
  by ``norm_topk_prob``, kept in float32), an ungated shared expert, dense layers by ``mlp_only_layers``.
- ``afmoe`` (``AfmoeForCausalLM``, Arcee's Trinity): per-head q/k RMSNorms before RoPE, the attention
  output gated by ``sigmoid(gate_proj(h))`` before ``o_proj``, RMSNorms before and after both attention and
  MLP, windows by ``layer_types`` with the sliding layers rotated and the full ones NoPE, muP's embedding
  scale (``mup_enabled``: times sqrt(hidden_size)); dense first layers (``num_dense_layers``), then sparse
  MLPs routed by the block's router (its ``gate`` Linear in the model's dtype, float32 sigmoid scores, the
  top k chosen with the block's ``expert_bias``, renormalized, times ``route_scale``, kept float32) with an
  ungated shared MLP.
- ``beam`` (``BeamForCausalLM``, Reflection AI's Beam): per-head q/k RMSNorms, each attention output gated
  by ``sigmoid(gate_proj(h) + gate_bias)`` (one bias a head) before ``o_proj``; windows by ``layer_types``
  with the sliding layers rotated (against float32 tables) and the full ones NoPE, their queries scaled
  in float32 by ``(1 + (position + 1) / 2048) ** 0.1`` (scalable softmax: :class:`~.rotary.QueryScaling`);
  RMSNorms before and after both attention and MLP, each branch added to the residual by depth
  (``x * sqrt((n - 1) / n) + branch / sqrt(n)``, n = 2 (i + 1) for layer i's attention, one more for its
  MLP); dense layers by ``mlp_layer_types``, the others GLM-4.5's routing (a float32 router, no shared
  expert) with the SwiGLU in float32 (as its dense MLPs) and ``routed_scaling_factor`` on the experts' sum
  (GLM-4.5's scales the weights); float32 logits soft-capped by ``final_logit_softcapping``.
- ``laguna`` (``LagunaForCausalLM``, poolside's Laguna): per-head q/k RMSNorms before a rotary table per layer
  type (each from its type's ``rope_parameters`` entry, with its own ``partial_rotary_factor``), windows by
  ``layer_types``, each layer's own query head count (``num_attention_heads_per_layer``: one KV head count
  and head size for all, so one KV pool shape), each attention output gated by ``softplus(g_proj(h))`` in
  float32 (one gate a head where ``gating`` is true or "per-head", else one a channel) before ``o_proj``;
  Llama's pre-norm block, dense layers by ``mlp_layer_types``, the others routed by float32 sigmoid scores of
  the model-dtype logits (the top k chosen with the router's ``e_score_correction_bias``), renormalized, in
  the model's dtype, ``moe_routed_scaling_factor`` on the experts' sum, an ungated shared MLP added after it.
  A router logit soft-cap (``moe_router_logit_softcapping`` > 0) is refused by name.
- ``aria_text`` (``AriaTextForCausalLM``, the text model of rhymes-ai's Aria): Llama's attention and block,
  every MLP sparse: the router's top-k logits softmaxed over those k in the model's dtype (its
  ``moe_topk`` of ``moe_num_experts``), experts stored transposed (``AriaExperts``: ``x @ W``, the
  grouped and dense formulations), an ungated shared MLP (``moe_num_shared_experts`` experts wide). No
  window.

Not Llama-style (:class:`~trtforge.llm.models.llama.LlamaStyle`): the fused CUDA layers and quantization
refuse these models by name; tensor parallelism refuses their MoE MLPs (the experts have no split yet).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.gate import OutputGate
from trtforge.llm.models.moe import moe_layers
from trtforge.llm.models.rope import RopeStyle, project_qkv
from trtforge.llm.models.rotary import PerTypeRotary, QueryScaling


class MixtralStyle(RopeStyle):
    """Mixtral (see the module docstring); the base of its relatives, which route by
    ``config.norm_topk_prob`` and cast the routing weights to the model's dtype."""

    family = "mixtral"
    #: the top-k routing weights divided by their sum: always (True), or by config.norm_topk_prob (None)
    renormalize: bool | None = True
    #: the routing weights stay float32 (Mixtral's router) rather than the model's dtype
    float32_weights = True

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        c = self.config
        renormalize = bool(c.norm_topk_prob) if self.renormalize is None else self.renormalize
        where = self.cannot_run()
        self.moe = moe_layers(
            self.layers, renormalize=renormalize, float32_weights=self.float32_weights, where=where
        )


class Qwen2MoeStyle(MixtralStyle):
    """Qwen2-MoE: Mixtral's layers with Qwen's routing options, its shared expert and dense layers."""

    family = "qwen2_moe"
    renormalize = None
    float32_weights = False


class Qwen3MoeStyle(Qwen2MoeStyle):
    """Qwen3-MoE: Qwen2-MoE's routing (no shared expert) with per-head q/k RMSNorms before RoPE."""

    family = "qwen3_moe"

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        return attn.q_norm(q), attn.k_norm(k), v


class MellumStyle(PerTypeRotary, Qwen3MoeStyle):
    """Mellum (see the module docstring): Qwen3-MoE's layers under :class:`~.rotary.PerTypeRotary`'s
    tables, one pair per layer type."""

    family = "mellum"


class OlmoeStyle(Qwen2MoeStyle):
    """OLMoE: q and k normed over their whole projections, then q, k and v clamped to ``clip_qkv``."""

    family = "olmoe"

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        q, k, v = project_qkv(attn, self.layers[i].input_layernorm(x))
        q, k = attn.q_norm(q), attn.k_norm(k)
        clip = self.config.clip_qkv
        if clip is not None:
            q, k, v = (t.clamp(min=-clip, max=clip) for t in (q, k, v))
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))  # type: ignore[return-value]


#: the routing GLM-4.5 and its relatives share: float32 sigmoid scores of float32 logits, a selection bias
#: choosing the top k, the weights kept in float32 (each family's :meth:`Glm4MoeStyle._routing` adds its own)
SIGMOID_BIASED: dict[str, Any] = {
    "float32_weights": True,
    "routing": "sigmoid_topk",
    "float32_logits": True,
    "selection_bias": True,
}


class Glm4MoeStyle(RopeStyle):
    """GLM-4.5 (see the module docstring): optional per-head q/k norms before RoPE, DeepSeek-V3-style
    routing (sigmoid scores, a selection bias, expert groups, a routed scale) and a shared MLP."""

    family = "glm4_moe"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        self.moe = moe_layers(self.layers, where=self.cannot_run(), **self._routing())

    def _routing(self) -> dict[str, Any]:
        """The routing options of :func:`~.moe.moe_layers` (GLM-4.5's; a relative routing otherwise sets its
        own)."""
        c = self.config
        return {
            **SIGMOID_BIASED,
            "renormalize": bool(c.norm_topk_prob),
            "expert_groups": (int(c.n_group), int(c.topk_group)),
            "scale": float(c.routed_scaling_factor),
            "norm_eps": 1e-20,
        }

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        if getattr(attn, "q_norm", None) is not None:  # (GLM-4.5's by use_qk_norm; dots.llm1's always)
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v


class Dots1Style(Glm4MoeStyle):
    """dots.llm1 (see the module docstring): Qwen3's attention around GLM-4.5's MoE MLPs."""

    family = "dots1"


class ExaoneMoeStyle(Glm4MoeStyle):
    """K-EXAONE (see the module docstring): EXAONE 4's attention in a pre-norm block around GLM-4.5's MoE
    MLPs."""

    family = "exaone_moe"

    def rotates(self, i: int) -> bool:
        """transformers' ``ExaoneMoeAttention``: every layer without a window, else the sliding ones only."""
        return self.config.sliding_window is None or self.windows[i] is not None


class Kolibri1Style(ExaoneMoeStyle):
    """Kolibri-1 (see the module docstring): EXAONE 4's attention in GLM-4-0414's block, sparse MoE MLPs
    routed by the logits plus a selection bias."""

    family = "kolibri1"

    def _routing(self) -> dict[str, Any]:
        return {**SIGMOID_BIASED, "renormalize": bool(self.config.norm_topk_prob), "choose_by_logits": True}

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """GLM-4-0414's block (:class:`~.glm.Glm4Style`): norms on the attention and MLP outputs too."""
        layer = self.layers[i]
        x = x + layer.post_self_attn_layernorm(layer.self_attn.o_proj(attn_out))
        return x + layer.post_mlp_layernorm(self.mlp(i, layer.post_attention_layernorm(x)))


class SolarOpenStyle(Glm4MoeStyle):
    """Solar Open (see the module docstring): Llama's attention around GLM-4.5's MoE MLPs."""

    family = "solar_open"


class Param2MoeStyle(Glm4MoeStyle):
    """Param2-MoE (see the module docstring): GLM-4.5's model under a config of its own."""

    family = "param2moe"


class SarvamMoeStyle(Glm4MoeStyle):
    """Sarvam-MoE (see the module docstring): GLM-4.5's model under a config of its own."""

    family = "sarvam_moe"


class MiniMaxM2Style(RopeStyle):
    """MiniMax-M2 (see the module docstring): whole-projection q/k norms, Mixtral's blocks routed by sigmoid
    scores with a selection bias."""

    family = "minimax_m2"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        self.moe = moe_layers(
            self.layers,
            renormalize=True,
            float32_weights=True,
            where=self.cannot_run(),
            routing="sigmoid_topk",
            selection_bias=True,
        )

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        q, k, v = project_qkv(attn, self.layers[i].input_layernorm(x))
        q, k = attn.q_norm(q), attn.k_norm(k)
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))  # type: ignore[return-value]


class MiniCPM5MoeStyle(Glm4MoeStyle):
    """MiniCPM5-MoE (see the module docstring): Llama's attention with each output gated by a sigmoid of its
    query projection's gate half, around GLM-4.5's MoE MLPs."""

    family = "minicpm5_moe"

    #: ``q_gate_proj`` lays each head's rows out as [query | gate]
    output_gate = OutputGate("q_gate_proj", with_query=True)
    #: (layer, block input, its ``q_gate_proj`` output) of the last :meth:`qkv`, for :meth:`gated`
    _projected: tuple[int, Tensor, Tensor] | None = None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each head's queries (the first half of its ``q_gate_proj`` rows), keys and values. The whole
        projection is kept for :meth:`gated`, whose gate is the other half: one GEMM makes both."""
        attn = self.layers[i].self_attn
        h = self.layers[i].input_layernorm(x)
        projected = attn.q_gate_proj(h)
        self._projected = (i, x, projected)
        q = projected.unflatten(-1, (-1, 2 * self.head_dim)).chunk(2, dim=-1)[0]
        k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in (attn.k_proj(h), attn.v_proj(h)))
        return q, k, v

    def gated(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Layer i's attention output times its gates, from the projection :meth:`qkv` made of this very
        block input (every consumer calls the two in turn on one tensor); projected again otherwise. Before,
        the gate always projected ``q_gate_proj`` again: a second GEMM of it per layer and step."""
        held, self._projected = self._projected, None  # (released: it holds a step's activations)
        if held is None or held[0] != i or held[1] is not x:
            return super().gated(i, x, attn_out)
        return self.output_gate.apply(self.attention(i), None, attn_out, self.head_dim, projected=held[2])


class HyV3Style(Glm4MoeStyle):
    """HY V3 (see the module docstring): Apertus' attention around GLM-4.5's routing, renormalized always,
    without expert groups, its selection bias on the block."""

    family = "hy_v3"

    def _routing(self) -> dict[str, Any]:
        c = self.config
        fp32 = bool(getattr(c, "enable_moe_fp32_combine", False))
        return {
            **SIGMOID_BIASED,
            "renormalize": True,
            "scale": float(c.router_scaling_factor),
            "norm_eps": 1e-20,
            "float32_sum": fp32,
        }


class FlintStyle(Qwen3MoeStyle):
    """Flint (see the module docstring): Qwen3-MoE's layers with attention sinks, windows by
    ``layer_types`` (NoPE full layers), a sigmoid router and an ungated shared expert."""

    family = "flint"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        self.moe = moe_layers(
            self.layers,
            renormalize=bool(self.config.norm_topk_prob),
            float32_weights=True,
            where=self.cannot_run(),
            routing="sigmoid_topk",
            float32_logits=True,
        )
        self._read_sinks()

    def rotates(self, i: int) -> bool:
        """transformers' ``FlintAttention``: the sliding layers rotate, the full ones are NoPE."""
        return self.windows[i] is not None


class AfmoeStyle(RopeStyle):
    """AFMoE (see the module docstring): gated attention output, norms before and after both sublayers,
    NoPE full layers, and GLM-4.5-style routing by the block's router and ``expert_bias``."""

    family = "afmoe"
    output_gate = OutputGate("gate_proj")

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        c = self.config
        self.moe = moe_layers(
            self.layers,
            renormalize=True,
            float32_weights=True,
            where=self.cannot_run(),
            routing="sigmoid_topk",
            selection_bias=True,
            scale=float(c.route_scale),
            norm_eps=1e-20,
        )
        #: muP's input scale (``mup_enabled``: the embeddings times sqrt(hidden_size))
        self.embed_scale = float(c.hidden_size) ** 0.5 if c.mup_enabled else None

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.body.embed_tokens(input_ids)
        return x if self.embed_scale is None else x * self.embed_scale

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        return attn.q_norm(q), attn.k_norm(k), v

    def rotates(self, i: int) -> bool:
        """transformers' ``AfmoeAttention``: the sliding layers rotate, the full ones are NoPE."""
        return self.windows[i] is not None

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.post_attention_layernorm(layer.self_attn.o_proj(attn_out))
        return x + layer.post_mlp_layernorm(self.mlp(i, layer.pre_mlp_layernorm(x)))


class BeamStyle(PerTypeRotary, Glm4MoeStyle):
    """Beam (see the module docstring): gated attention with per-head q/k norms, sliding layers rotated
    and NoPE full layers with position-scaled queries, depth-scaled residuals around sandwich norms, and
    GLM-4.5's routing over experts with a float32 SwiGLU."""

    family = "beam"
    #: one bias a head on the gate's projection, before the sigmoid
    output_gate = OutputGate("gate_proj", bias="gate_bias")
    #: BeamRotaryEmbedding keeps its tables float32: q and k are rotated in the dtype they promote to
    float32_tables = True
    #: ``compute_attention_scaling``: the NoPE layers' queries, in float32
    query_scaling = QueryScaling("ssmax", 0.1, 2048, nope_only=True, float32=True)

    def _routing(self) -> dict[str, Any]:
        return {**super()._routing(), "float32_glu": True, "scale_output": True}

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Each branch normed after as well as before, and added to the residual by its depth (the layer's
        ``attn_residual_add_idx`` / ``mlp_residual_add_idx``: transformers' ``depth_scaled_residual_add``)."""
        layer = self.layers[i]
        branch = layer.post_attention_layernorm(layer.self_attn.o_proj(attn_out))
        x = _depth_scaled(branch, x, layer.attn_residual_add_idx)
        branch = layer.post_feedforward_layernorm(self.mlp(i, layer.pre_feedforward_layernorm(x)))
        return _depth_scaled(branch, x, layer.mlp_residual_add_idx)

    def logits(self, x: Tensor) -> Tensor:
        """The LM head's logits, soft-capped in float32 to ``cap * tanh(logits / cap)`` where the config sets
        ``final_logit_softcapping`` (as ``BeamForCausalLM.forward``)."""
        logits = super().logits(x)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits.float() / cap) * cap


def _depth_scaled(branch: Tensor, residual: Tensor, n: int) -> Tensor:
    """Beam's residual add of the n-th branch: ``branch / sqrt(n) + residual * sqrt((n - 1) / n)``."""
    return branch * (1.0 / math.sqrt(n)) + residual * math.sqrt((n - 1) / n)


class LagunaStyle(PerTypeRotary, RopeStyle):
    """Laguna (see the module docstring): per-layer query head counts, a softplus gate on the attention
    output, q/k norms, a rotary table per layer type, and sigmoid routing with a selection bias, its scale on
    the experts' sum and a shared MLP."""

    family = "laguna"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        c = self.config
        heads = [int(h) for h in c.num_attention_heads_per_layer[: self.num_layers]]
        self.num_heads = max(heads)
        self.heads_per_layer = heads if len(set(heads)) > 1 else None
        per_head = c.gating is True or c.gating == "per-head"
        self.output_gate = OutputGate("g_proj", activation="softplus", per_head=per_head, float32=True)
        cap = getattr(c, "moe_router_logit_softcapping", 0.0) or 0.0
        if cap > 0:
            raise UserError(
                f"{self.cannot_run()}: its config sets moe_router_logit_softcapping={cap} (the router's "
                "logits soft-capped before the sigmoid), which trtforge's MoE routing does not compute. "
                "Supported: 0 (no cap, Laguna's default)."
            )
        self.moe = moe_layers(
            self.layers,
            renormalize=True,
            float32_weights=False,
            where=self.cannot_run(),
            routing="sigmoid_topk",
            selection_bias=True,
            scale=float(c.moe_routed_scaling_factor),
            scale_output=True,
        )

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        return attn.q_norm(q), attn.k_norm(k), v


class AriaTextStyle(RopeStyle):
    """Aria's text model (see the module docstring): Llama's layers around sparse MoE MLPs with transposed
    experts, routed by a softmax over the top-k logits in the model's dtype, and an ungated shared MLP."""

    family = "aria_text"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        self.moe = moe_layers(
            self.layers,
            renormalize=False,
            float32_weights=False,
            where=self.cannot_run(),
            routing="topk_softmax",
            float32_router=False,
        )
