"""Sparse mixture-of-experts MLPs, one concept every consumer reads: a layer's MLP kind is "dense" (the
model's own MLP module) or "moe" (:class:`SparseMoe`: a router picks ``top_k`` of ``num_experts`` gated
experts per token and sums their outputs by the routing weights; a shared expert beside them is added to their
sum: Qwen2-MoE's behind a sigmoid gate, GraniteMoeShared's, HunYuan-MoE's, ERNIE 4.5-MoE's, GLM-4.5's and
dots.llm1's ungated; Cohere 2-MoE's ungated and averaged with it where its config says "average"). The
adapters (:mod:`.mixtral`, :mod:`.granite`, :mod:`.hunyuan`, :mod:`.glm`, :mod:`.cohere`) find each layer's
kind and call :meth:`SparseMoe.forward`.

Routing, as transformers 5's ``*TopKRouter`` modules compute it (the block's router: ``gate``, or ``router``
in GraniteMoE; its weight the router's own, or its ``wg`` Linear in HunYuan-MoE), router logits in the router
weight's dtype (the model's, or HunYuan-MoE's float32 ``wg``; ``float32_logits``: from a float32 input and
weight whatever their dtype, as ERNIE 4.5-MoE and GLM-4.5 force), then one of four orders (`ROUTINGS`):

- ``softmax_topk`` (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, FlexOLMo, HunYuan-MoE, ERNIE 4.5-MoE): a float32
  softmax over the experts, top-k of the probabilities, renormalized to sum 1 over the k picked where the
  family does (Mixtral, HunYuan-MoE, ERNIE 4.5-MoE always; the others by ``norm_topk_prob``);
- ``topk_softmax`` (GraniteMoE, Cohere 2-MoE's "softmax"): top-k of the float32 logits, then a softmax over
  those k only (gpt-oss: of the logits in the model's dtype, its router's ``float32_router`` False);
- ``topk_sigmoid`` (Cohere 2-MoE's "sigmoid" ``expert_selection_fn``): top-k of the logits, then a sigmoid of
  each of those k, in the logits' dtype unless ``float32_router``, renormalized by ``norm_topk_prob``;
- ``sigmoid_topk`` (GLM-4.5, dots.llm1, K-EXAONE, MiniMax-M2): a sigmoid of each float32 logit (MiniMax-M2's
  logits in the model's dtype, then cast), top-k of the scores, renormalized by ``norm_topk_prob``
  (MiniMax-M2: always).

Three options of the choice and the weights (DeepSeek-V3-style routers; off for the others):
``selection_bias`` (ERNIE 4.5-MoE, GLM-4.5, dots.llm1, MiniMax-M2, HY V3, AFMoE): the router's
``e_score_correction_bias`` (ERNIE's under ``moe_statics``; MiniMax-M2's and HY V3's on the block, AFMoE's the
block's ``expert_bias``) is added to the scores for choosing the top k only, the weights being the unbiased
scores of the experts chosen; ``expert_groups`` (GLM-4.5's ``n_group`` / ``topk_group``): the experts in
``n_group`` equal groups, each group scored by the sum of its two best (biased) scores, and the top k chosen
among the experts of the ``topk_group`` best groups only; ``scale`` (GLM-4.5's ``routed_scaling_factor``): the
weights multiplied by it after any renormalization. The renormalizing division is by the sum of the k weights
as the family writes it: plus ``norm_eps`` (GLM-4.5's 1e-20), clamped below at ``norm_min`` (ERNIE's
``moe_norm_min``). ``choose_by_logits`` (Kolibri-1): the top k chosen by the float32 logits plus the
selection bias (the bias added before the sigmoid, not after it), weighted by the scores of those chosen.

Llama 4 (``scale_input``) scales each chosen expert's input by its weight (the product rounded to the
model's dtype) and sums the experts' outputs as they are, where the others weight the outputs.

The weights are then kept in float32 (Mixtral, GLM-4.5, dots.llm1) or cast to the logits' dtype (the others:
the model's, HunYuan-MoE's router's), or to the input's where the logits are forced float32 (ERNIE 4.5-MoE).
Router jitter is a training-time noise transformers applies only in training mode: never here.

The experts are transformers 5's fused 3-D parameters (``experts.gate_up_proj`` [E, 2 I, H], gate rows
first; ``experts.down_proj`` [E, H, I]); a checkpoint saved by transformers 4 (one Linear per expert) is
converted to them when transformers loads it. gpt-oss's experts (``GptOssExperts``: transformers marks
them ``is_transposed``, ``has_bias``, not ``is_concatenated``) are another layout read here, options of
the same block: the router a Linear with a bias; ``gate_up_proj`` [E, H, 2 I] with the gate and up
columns interleaved (gate = even columns, up = odd) and ``down_proj`` [E, I, H], applied as ``x @ W + b``
with their biases ``gate_up_proj_bias`` / ``down_proj_bias``; the clamped SwiGLU the module's ``alpha``
and ``limit`` set (gate clamped above at the limit, up to +-limit, ``(up + 1) * gate *
sigmoid(alpha * gate)``). Aria's (``AriaExperts``: ``is_transposed`` only) are the third: the plain
layout transposed, ``gate_up_proj`` [E, H, 2 I] (gate columns first), ``down_proj`` [E, I, H], applied as
``x @ W`` (Llama 4's too, :mod:`.llama4`). Three formulations of the same math:

- ``grouped`` (the torch executor on the CPU, and for blocks ``fused`` refuses): the (token, expert) pairs
  sorted by expert, each expert's GEMMs on its own tokens only, the outputs weighted and summed back per
  token (``index_add``). The segment sizes are data: one host sync per layer, and no CUDA graph can hold
  them (the executor runs such models without graphs and says so in its facts).
- ``dense`` (the step graph): every expert on every token (batched MatMuls over the expert axis), summed
  with routing weights that are zero off each token's top k. Plain ONNX ops (MatMul, Softmax, TopK,
  Equal, ReduceSum) with no data-dependent shape, exact as the grouped form, at ``num_experts / top_k``
  times the expert FLOPs.
- ``fused`` (the torch executor on CUDA): the grouped math in two Triton grouped GEMMs over the pairs
  sorted and padded by expert on the device (:mod:`trtforge.kernels.moe`): static shapes, no host sync,
  so CUDA graphs hold it. All three layouts, read in place (gpt-oss's biases added in FP32 before the one
  rounding of each GEMM's output, where grouped rounds ``x @ W`` and then adds the bias in the model's
  dtype as transformers does), and Llama 4's input scaling (each gathered row times its routing weight,
  rounded to the model's dtype as grouped rounds it, the outputs summed unweighted); a block
  :meth:`SparseMoe.fused_refusal` refuses runs ``grouped`` when asked for ``fused``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trtforge.errors import UserError

FORMULATIONS = ("grouped", "dense", "fused")
#: the routing orders (see the module docstring)
ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_topk", "topk_sigmoid")
#: the expert weight layouts: transformers 5's plain fused one, gpt-oss's, Aria's transposed plain one (see
#: the module docstring)
LAYOUTS = ("plain", "gpt_oss", "transposed")
#: on CUDA, routers whose math is all float32 and that limit no expert groups route in one Triton launch
#: (:func:`trtforge.kernels.moe.route_topk`) rather than ~6 torch ops; False: the torch ops everywhere
ROUTE_KERNEL = True


def router(block: nn.Module) -> nn.Module | None:
    """A sparse MoE block's router (``weight`` [E, H] or a ``wg`` Linear, ``top_k``): ``gate``, or
    ``router`` (GraniteMoE)."""
    gate = getattr(block, "gate", None)
    return gate if gate is not None else getattr(block, "router", None)


def router_linear(module: nn.Module) -> nn.Module:
    """The module holding a router's ``weight`` [E, H] (and ``bias`` where it has one): the router itself,
    or its ``wg`` Linear (HunYuan-MoE's gate), or its ``gate`` Linear (AFMoE's router)."""
    for name in ("wg", "gate"):
        inner = getattr(module, name, None)
        if isinstance(inner, nn.Linear):
            return inner
    return module


#: a selection bias, by the names the families give it: ``e_score_correction_bias`` (on the router: GLM-4.5,
#: dots.llm1; ERNIE 4.5-MoE's statics module; HY V3's block), ``expert_bias`` (AFMoE's block)
SELECTION_BIAS_NAMES = ("e_score_correction_bias", "expert_bias")
#: a block's shared expert beside its routed ones, by the names the families give it
SHARED_EXPERT_NAMES = ("shared_expert", "shared_experts", "shared_mlp")


def is_sparse_moe(mlp: nn.Module) -> bool:
    """Whether a layer's MLP module is a sparse MoE block (a router and ``experts``)."""
    return hasattr(mlp, "experts") and router(mlp) is not None


class SparseMoe:
    """One layer's sparse MoE block `block` (transformers' ``*SparseMoeBlock``) as the math above reads
    it; the weights stay the block's own parameters (read at each call, so moving the model moves them).

    `renormalize`: the top-k probabilities divided by their sum; `float32_weights`: the routing weights
    stay float32 (Mixtral) rather than the model's dtype; `routing`: one of `ROUTINGS`; `shared`: an
    ungated shared expert beside the block (GraniteMoeShared's ``shared_mlp``; a block's own
    ``shared_expert`` / ``shared_experts`` / ``shared_mlp`` is found by itself); `shared_average`: the
    experts' sum and the shared expert's output averaged, not added (Cohere 2-MoE's "average"
    ``shared_expert_combination_strategy``); `float32_sum`: the two added in float32 and cast back (HY V3's
    ``enable_moe_fp32_combine``); `float32_router` False: ``topk_softmax`` / ``topk_sigmoid`` in
    the logits' dtype (gpt-oss's router, Cohere 2-MoE's sigmoid). `float32_logits`, `selection_bias`,
    `expert_groups` (``(n_group, topk_group)``), `scale`, `norm_eps`, `norm_min`, `choose_by_logits`: the
    module docstring's options; `float32_glu`: the experts' gated activation in float32, `scale_output`:
    `scale` on the experts' sum, not the weights (both Beam's); `scale_input`: each expert's input times
    its routing weight, its output summed unweighted (Llama 4's); `transposed`: the experts read in the
    transposed layout whatever flags they carry (Llama 4's ``Llama4TextExperts``: ``gate_up_proj``
    [E, H, 2 I], ``down_proj`` [E, I, H], no ``is_transposed`` flag). `where` names the model in errors."""

    def __init__(
        self,
        block: nn.Module,
        *,
        renormalize: bool,
        float32_weights: bool,
        where: str,
        routing: str = "softmax_topk",
        shared: nn.Module | None = None,
        shared_average: bool = False,
        float32_sum: bool = False,
        float32_router: bool = True,
        float32_logits: bool = False,
        selection_bias: bool = False,
        expert_groups: tuple[int, int] | None = None,
        scale: float = 1.0,
        norm_eps: float = 0.0,
        norm_min: float | None = None,
        choose_by_logits: bool = False,
        float32_glu: bool = False,
        scale_output: bool = False,
        scale_input: bool = False,
        transposed: bool = False,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: expected one of {ROUTINGS}")
        self.block, self.renormalize, self.float32_weights = block, bool(renormalize), bool(float32_weights)
        self.routing, self.router, self.float32_router = routing, router(block), bool(float32_router)
        self.float32_logits, self.scale = bool(float32_logits), float(scale)
        self.norm_eps, self.norm_min = float(norm_eps), None if norm_min is None else float(norm_min)
        #: the top k chosen by the float32 logits (plus any selection bias), not by the scores: Kolibri-1
        self.choose_by_logits = bool(choose_by_logits)
        #: the experts' ``act(gate) * up`` in float32, cast back (Beam's), not in the model's dtype
        self.float32_glu = bool(float32_glu)
        #: `scale` multiplies the experts' weighted sum (Beam's ``routed_scaling_factor``), not the weights
        self.scale_output = bool(scale_output)
        #: each expert's input times its routing weight and its output summed as it is (Llama 4's
        #: ``routed_in = hidden * router_scores``), not its output weighted
        self.scale_input = bool(scale_input)
        #: the module holding the router's weight (and bias): the router, or HunYuan-MoE's ``wg``
        self.router_linear = router_linear(self.router)
        #: the module holding the selection bias (read at each call), None without one; its attribute name
        self.bias_owner: nn.Module | None = None
        self.bias_name = SELECTION_BIAS_NAMES[0]
        if selection_bias:
            # the router's, ERNIE 4.5-MoE's statics module's, or the block's (MiniMax-M2's, HY V3's, AFMoE's)
            owners = (getattr(self.router, "moe_statics", self.router), block)
            names = SELECTION_BIAS_NAMES
            found = [(o, n) for o in owners for n in names if isinstance(getattr(o, n, None), Tensor)]
            if not found:
                name, wanted = type(self.router).__name__, " or ".join(names)
                raise UserError(f"{where}: neither its router ({name}) nor its block has {wanted}")
            self.bias_owner, self.bias_name = found[0]
        experts = block.experts
        gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
        flags = ("is_transposed", "has_bias", "has_post_expert_norm")
        concatenated = getattr(experts, "is_concatenated", True)
        plain = concatenated and not any(getattr(experts, f, False) for f in flags)
        fused = isinstance(gate_up, Tensor) and isinstance(down, Tensor) and gate_up.ndim == down.ndim == 3
        #: "plain", "gpt_oss" or "transposed" (:data:`LAYOUTS`): which layout, biases and activation the
        #: experts have
        self.layout = "plain"
        forced = bool(transposed) and not any(getattr(experts, f, False) for f in flags[1:])
        transposed = concatenated and getattr(experts, "is_transposed", False)
        transposed = transposed and not any(getattr(experts, f, False) for f in flags[1:])
        if fused and not plain and gpt_oss_experts(experts):
            self.layout = "gpt_oss"
        elif fused and (transposed or forced):
            self.layout = "transposed"
        elif hasattr(experts, "fc1") and hasattr(experts, "fc2") and not fused:
            raise UserError(
                f"{where}: its experts ({type(experts).__name__}) are grouped GEMMs (fc1 / fc2), not fused "
                "3-D parameters; this is an older transformers' layout (Aria's before 5.25, whose experts "
                "are the fused, transposed parameters trtforge reads): upgrade transformers."
            )
        elif not (fused and plain):
            raise UserError(
                f"{where}: its experts ({type(experts).__name__}) are not transformers 5's fused 3-D "
                "parameters (gate_up_proj [experts, 2 x intermediate, hidden] with gate rows first, "
                "down_proj [experts, hidden, intermediate], no biases, not transposed). Load the checkpoint "
                "with transformers >= 5, which converts per-expert weights to that layout."
            )
        self.num_experts, self.top_k = int(gate_up.shape[0]), int(self.router.top_k)
        self.expert_groups: tuple[int, int] | None = None
        if expert_groups is not None and int(expert_groups[1]) < int(expert_groups[0]):  # (else: no limit)
            groups, keep = int(expert_groups[0]), int(expert_groups[1])
            if self.num_experts % groups or self.num_experts // groups < 2 or keep < 1:
                raise UserError(
                    f"{where}: {self.num_experts} experts cannot form n_group={groups} groups of 2 or more "
                    f"(each group scored by its two best experts) with topk_group={keep} of them kept"
                )
            self.expert_groups = (groups, keep)
        self.expert_size = int(down.shape[-1] if self.layout == "plain" else down.shape[1])
        # the shared expert's gated MLP: down_proj (Qwen2-MoE) or output_linear (GraniteMoeShared)
        own = next((m for n in SHARED_EXPERT_NAMES if (m := getattr(block, n, None)) is not None), None)
        self.shared = own if shared is None else shared
        self.shared_gate = getattr(block, "shared_expert_gate", None) if shared is None else None
        self.shared_size: int | None = None
        self.shared_average = bool(shared_average) and self.shared is not None
        #: the experts' sum and the ungated shared expert's output added in float32, then cast back (HY V3's
        #: enable_moe_fp32_combine: what FP16 / BF16 additions round to anyway; a float64 model's sum rounds)
        self.float32_sum = bool(float32_sum)
        if self.shared is not None:
            down_proj = getattr(self.shared, "down_proj", None)
            down_proj = self.shared.output_linear if down_proj is None else down_proj
            self.shared_size = int(down_proj.weight.shape[-1])

    def describe(self) -> dict[str, Any]:
        """The spec's ``moe`` entry for this layer's block."""
        return {
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "expert_size": self.expert_size,
            "renormalize": self.renormalize,
            "float32_weights": self.float32_weights,
            "routing": self.routing,
            "shared_expert_size": self.shared_size,
            "shared_average": self.shared_average,
            "layout": self.layout,
            "selection_bias": self.bias_owner is not None,
            "expert_groups": None if self.expert_groups is None else list(self.expert_groups),
            "scale": self.scale,
            "choose_by_logits": self.choose_by_logits,
            "float32_glu": self.float32_glu,
            "scale_output": self.scale_output,
            "scale_input": self.scale_input,
        }

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Each token's top-k routing weights and expert ids ``[N, k]`` for flat tokens `x` ``[N, H]``."""
        lin = self.router_linear
        weight, bias = lin.weight, getattr(lin, "bias", None)
        if self.float32_logits:
            logits = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        else:
            logits = F.linear(x.to(weight.dtype), weight, bias)
        out_dtype = logits.dtype if not self.float32_logits else x.dtype
        out_dtype = torch.float32 if self.float32_weights else out_dtype
        if logits.is_cuda and self._route_kernel_fits():
            from trtforge.kernels.moe import route_topk

            owner = self.bias_owner
            return route_topk(
                logits,
                self.top_k,
                self.routing,
                renormalize=self.renormalize,
                out_dtype=out_dtype,
                bias=None if owner is None else getattr(owner, self.bias_name).reshape(-1),
                norm_eps=self.norm_eps,
                norm_min=self.norm_min,
                scale=self._weight_scale,
            )
        if self.routing in ("topk_softmax", "topk_sigmoid"):
            top, experts = torch.topk(logits.float() if self.float32_router else logits, self.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1) if self.routing == "topk_softmax" else torch.sigmoid(top)
        else:
            if self.routing == "sigmoid_topk":
                scores = torch.sigmoid(logits.float())
            else:
                scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
            if self.bias_owner is None and self.expert_groups is None and not self.choose_by_logits:
                weights, experts = torch.topk(scores, self.top_k, dim=-1)
            else:
                chosen_by = logits.float() if self.choose_by_logits else scores
                experts = torch.topk(self._choice(chosen_by), self.top_k, dim=-1).indices
                weights = scores.gather(-1, experts)
        if self.renormalize:
            total = weights.sum(dim=-1, keepdim=True)
            total = total + self.norm_eps if self.norm_eps else total
            total = total.clamp(min=self.norm_min) if self.norm_min is not None else total
            weights = weights / total
        if self._weight_scale != 1.0:
            weights = weights * self._weight_scale
        return weights.to(out_dtype), experts

    @property
    def _weight_scale(self) -> float:
        """The factor on the routing weights: :attr:`scale`, unless it scales the experts' sum."""
        return 1.0 if self.scale_output else self.scale

    def _route_kernel_fits(self) -> bool:
        """Whether :func:`trtforge.kernels.moe.route_topk` computes this router's math: every score in
        float32 (softmax or sigmoid first; top-k first only from float32 logits), no expert groups."""
        from trtforge.kernels.moe import ROUTE_KERNEL_MAX_EXPERTS

        float32 = self.routing in ("softmax_topk", "sigmoid_topk") or self.float32_router
        return (
            ROUTE_KERNEL
            and not self.choose_by_logits
            and float32
            and self.expert_groups is None
            and self.num_experts <= ROUTE_KERNEL_MAX_EXPERTS
        )

    def _choice(self, scores: Tensor) -> Tensor:
        """The float32 scores [N, E] the top k are chosen by: plus the selection bias, and -inf off the
        ``topk_group`` best expert groups (each scored by its two best experts) where groups limit it."""
        if self.bias_owner is not None:
            scores = scores + getattr(self.bias_owner, self.bias_name).reshape(-1).float()
        if self.expert_groups is None:
            return scores
        groups, keep = self.expert_groups
        per = self.num_experts // groups
        grouped = scores.reshape(-1, groups, per)
        group_scores = torch.topk(grouped, 2, dim=-1).values.sum(dim=-1)  # [N, groups]
        best = torch.topk(group_scores, keep, dim=-1).indices  # [N, keep]
        kept = (best[..., None] == torch.arange(groups, device=scores.device)).any(dim=-2)  # [N, groups]
        return grouped.masked_fill(~kept[..., None], float("-inf")).reshape(-1, self.num_experts)

    def forward(self, x: Tensor, formulation: str = "grouped") -> Tensor:
        """The block's output for hidden states `x` ``[..., H]`` (`formulation`: see the module
        docstring), plus the shared expert (gated where the block gates it) where there is one."""
        flat = x.reshape(-1, x.shape[-1])
        weights, experts = self.route(flat)
        if formulation == "dense":
            out = self._dense(flat, weights, experts)
        elif formulation == "fused" and self.fused_refusal() is None:
            from trtforge.kernels.moe import fused_moe

            ex = self.block.experts
            opts: dict[str, Any] = {"scale_input": self.scale_input}
            if self.layout == "gpt_oss":  # read in place: transposed, interleaved, biased, clamped SwiGLU
                opts |= {"transposed": True, "interleaved": True, "activation": "gpt_oss_swiglu"}
                opts |= {"gate_up_bias": ex.gate_up_proj_bias, "down_bias": ex.down_proj_bias}
                opts |= {"alpha": float(ex.alpha), "limit": float(ex.limit)}
            elif self.layout == "transposed":  # Aria's, Llama 4's: x @ W, read in place
                opts["transposed"] = True
            out = fused_moe(flat.contiguous(), ex.gate_up_proj, ex.down_proj, weights, experts, **opts)
        else:
            out = self._grouped(flat, weights, experts)
        if self.scale_output:
            out = out * self.scale
        if self.shared_gate is not None:
            out = out + torch.sigmoid(self.shared_gate(flat)) * self.shared(flat)
        elif self.shared_average:
            out = (out + self.shared(flat)) / 2
        elif self.shared is not None and self.float32_sum:
            out = (out.float() + self.shared(flat).float()).to(out.dtype)
        elif self.shared is not None:
            out = out + self.shared(flat)
        return out.reshape(x.shape)

    def fused_refusal(self) -> str | None:
        """Why the ``fused`` formulation cannot run this block (None: it can): it needs experts of exactly
        their weights (plain, transposed: no biases, no scales; gpt_oss: and their two biases) in one of the
        three layouts (plain and transposed: gate first and a SiLU gate; gpt_oss: as :func:`gpt_oss_experts`
        reads them) and FP16 / BF16 / FP32 weights and biases (the dtype read now: moving the model may
        change it). Llama 4's input scaling (:attr:`scale_input`) is an option of the kernels."""
        ex = self.block.experts
        names = sorted(name for name, _ in ex.named_parameters())
        gpt_oss = self.layout == "gpt_oss"
        want = ["down_proj", "gate_up_proj"] + (["down_proj_bias", "gate_up_proj_bias"] if gpt_oss else [])
        if names != sorted(want):
            return f"experts with parameters {names} (the fused kernels take {', '.join(sorted(want))} only)"
        gate_up = ex.gate_up_proj
        if gpt_oss:
            if not gpt_oss_experts(ex):
                return "experts no longer in the gpt_oss layout"
            e, h, two_i = gate_up.shape
            shapes = {"down_proj": (e, two_i // 2, h), "gate_up_proj_bias": (e, two_i)}
            shapes["down_proj_bias"] = (e, h)
        else:
            transposed = self.layout == "transposed"
            flags = ("has_bias", "has_post_expert_norm") + (() if transposed else ("is_transposed",))
            if not getattr(ex, "is_concatenated", True) or any(getattr(ex, f, False) for f in flags):
                if transposed:
                    return "experts no longer in the transposed layout (concatenated gate columns first)"
                return "experts not in the plain layout (concatenated gate rows first, not transposed)"
            act = getattr(ex, "act_fn", None)
            if type(act).__name__ not in ("SiLU", "SiLUActivation"):
                return f"a {type(act).__name__} gate (the fused kernels apply SiLU)"
            if transposed:
                e, h, two_i = gate_up.shape
                shapes = {"down_proj": (e, two_i // 2, h)}
            else:
                e, two_i, h = gate_up.shape
                shapes = {"down_proj": (e, h, two_i // 2)}
        params = {name: getattr(ex, name) for name in want}
        if two_i % 2 or any(tuple(params[name].shape) != shape for name, shape in shapes.items()):
            return f"expert shapes {[tuple(t.shape) for t in params.values()]}"
        if any(params[name].stride(-1) != 1 for name in ("gate_up_proj", "down_proj")):
            return "expert weights without unit stride along their last axis (the fused kernels read rows)"
        if gate_up.dtype not in (torch.float16, torch.bfloat16, torch.float32) or any(
            t.dtype != gate_up.dtype for t in params.values()
        ):
            return f"{gate_up.dtype} experts (the fused kernels take FP16, BF16 or FP32)"
        return None

    def _expert(self, e: int, rows: Tensor) -> Tensor:
        """Expert e's gated MLP on `rows` [n, H]."""
        ex = self.block.experts
        if self.layout == "gpt_oss":  # x @ W + b as transformers' GptOssExperts computes it
            gated = _clamped_swiglu(ex, rows @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e])
            return gated @ ex.down_proj[e] + ex.down_proj_bias[e]
        if self.layout == "transposed":  # x @ W, as transformers' AriaExperts computes it
            gate, up = (rows @ ex.gate_up_proj[e]).chunk(2, dim=-1)
            return self._glu(gate, up) @ ex.down_proj[e]
        gate, up = F.linear(rows, ex.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(self._glu(gate, up), ex.down_proj[e])

    def _glu(self, gate: Tensor, up: Tensor) -> Tensor:
        """The plain experts' gated activation ``act(gate) * up`` (in float32 where :attr:`float32_glu`)."""
        act = self.block.experts.act_fn
        if self.float32_glu:
            return (act(gate.float()) * up.float()).to(gate.dtype)
        return act(gate) * up

    def _grouped(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """Each expert on its own tokens: pairs sorted by expert, one GEMM pair per expert hit."""
        k = self.top_k
        order = torch.argsort(experts.reshape(-1), stable=True)
        counts = torch.bincount(experts.reshape(-1), minlength=self.num_experts).tolist()
        token = order // k
        rows = x[token]
        pair_weights = weights.reshape(-1)[order, None]
        if self.scale_input:
            rows = (rows * pair_weights).to(x.dtype)
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                outs.append(self._expert(e, rows[start : start + n]))
                start += n
        y = torch.cat(outs)
        y = y.to(x.dtype) if self.scale_input else (y * pair_weights).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token, y)

    def _dense(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """Every expert on every token, weighted by [N, E] routing weights zero off the top k."""
        ex = self.block.experts
        ids = torch.arange(self.num_experts, device=x.device)
        picked = (experts[..., None] == ids).to(weights.dtype)  # [N, k, E]
        full = (picked * weights[..., None]).sum(dim=-2)  # [N, E]
        # scale_input: each expert's input scaled by its weight (zero off the top k), its output unweighted
        xs = (x[None] * full.transpose(0, 1)[..., None]).to(x.dtype) if self.scale_input else x[None]
        if self.layout == "gpt_oss":
            gate_up = torch.matmul(xs, ex.gate_up_proj) + ex.gate_up_proj_bias[:, None]  # [E, N, 2I]
            y = torch.matmul(_clamped_swiglu(ex, gate_up), ex.down_proj) + ex.down_proj_bias[:, None]
        elif self.layout == "transposed":
            gate, up = torch.matmul(xs, ex.gate_up_proj).chunk(2, dim=-1)  # [E, N, I]
            y = torch.matmul(self._glu(gate, up), ex.down_proj)  # [E, N, H]
        else:
            gate, up = torch.matmul(xs, ex.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)  # [E, N, I]
            y = torch.matmul(self._glu(gate, up), ex.down_proj.transpose(1, 2))  # [E, N, H]
        if self.scale_input:
            return y.to(x.dtype).sum(dim=0)
        return (y * full.transpose(0, 1)[..., None]).to(x.dtype).sum(dim=0)


def gpt_oss_experts(experts: nn.Module) -> bool:
    """Whether `experts` are gpt-oss's in a float dtype (3-D ``gate_up_proj`` / ``down_proj``, transposed,
    interleaved gate/up columns, biases, the clamped SwiGLU's ``alpha`` and ``limit``: the module
    docstring), which :class:`SparseMoe` reads too."""
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not (isinstance(gate_up, Tensor) and isinstance(down, Tensor) and gate_up.ndim == down.ndim == 3):
        return False
    flags = getattr(experts, "is_transposed", False) and getattr(experts, "has_bias", False)
    interleaved = getattr(experts, "is_concatenated", True) is False
    names = ("gate_up_proj_bias", "down_proj_bias")
    biases = all(isinstance(getattr(experts, n, None), Tensor) for n in names)
    swiglu = all(isinstance(getattr(experts, n, None), (int, float)) for n in ("alpha", "limit"))
    return flags and interleaved and biases and swiglu and not getattr(experts, "has_post_expert_norm", False)


def _clamped_swiglu(experts: nn.Module, gate_up: Tensor) -> Tensor:
    """gpt-oss's activation of interleaved gate/up columns ``[..., 2I]`` -> ``[..., I]``: the gate (even
    columns) clamped above at the module's ``limit``, up (odd columns) to +-limit, then ``(up + 1) * gate
    * sigmoid(gate * alpha)`` (transformers' ``GptOssExperts._apply_gate``)."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=experts.limit)
    up = up.clamp(min=-experts.limit, max=experts.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * experts.alpha))


def moe_layers(
    layers: list[nn.Module],
    *,
    renormalize: bool,
    float32_weights: bool,
    where: str,
    routing: str = "softmax_topk",
    block: str = "mlp",
    shared: str | None = None,
    float32_router: bool = True,
    **options: Any,
) -> list[SparseMoe | None]:
    """Each layer's :class:`SparseMoe` (None: a dense MLP, as Qwen-MoE's ``mlp_only_layers`` and
    ``decoder_sparse_step`` make some): the layer's attribute `block` (``mlp``; GraniteMoE's
    ``block_sparse_moe``), with the layer's attribute `shared` as an ungated shared expert where set and
    not None (GraniteMoeShared's ``shared_mlp``); `float32_router` and `options` (the routing options:
    ``float32_logits``, ``selection_bias``, ``expert_groups``, ``scale``, ``norm_eps``, ``norm_min``,
    ``shared_average``, ``float32_sum``, ``float32_glu``, ``scale_output``, ``scale_input``, ``transposed``):
    :class:`SparseMoe`'s."""
    return [
        SparseMoe(
            getattr(layer, block),
            renormalize=renormalize,
            float32_weights=float32_weights,
            where=where,
            routing=routing,
            shared=getattr(layer, shared, None) if shared else None,
            float32_router=float32_router,
            **options,
        )
        if is_sparse_moe(getattr(layer, block))
        else None
        for layer in layers
    ]


def refuse_moe(model: nn.Module, what: str, covers: str) -> None:
    """UserError when `model` has sparse MoE MLPs, for `what` (the option or path asked for), which
    covers `covers` only (a phrase: "dense MLPs", ...)."""
    if not any(is_sparse_moe(m) for m in model.modules()):
        return
    raise UserError(
        f"{what}: the {model.config.model_type} model {type(model).__name__} has sparse mixture-of-experts "
        f"MLPs (a router sends each token to its top-k experts), and this path covers {covers} only: MoE "
        "MLPs have no such path yet. Serve or compile it without this option (the torch executor and the "
        "FP16 / BF16 / FP32 step graphs run MoE models)."
    )
