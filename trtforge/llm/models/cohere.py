"""The Cohere adapters: Command-R (``model_type`` "cohere": ``CohereForCausalLM``), Command-R7B / Command
A (``model_type`` "cohere2": ``Cohere2ForCausalLM``) and Cohere 2-MoE (``model_type`` "cohere2_moe":
``Cohere2MoeForCausalLM``).

Cohere: one LayerNorm without bias (``CohereLayerNorm``, in float32) per block feeding the attention and
the SiLU-gated MLP in parallel (``x + o(attn(h)) + mlp(h)``), interleaved RoPE (channel pairs (0, 1),
(2, 3), ...; q and k rotated in float32 and cast back), an optional per-head q/k LayerNorm before the
rotary (``use_qk_norm``: one weight row per head), tied embeddings and the logits multiplied by
``logit_scale``. No window.

Cohere 2: the same block without q/k norms, sliding and full layers by ``config.layer_types`` (the
windows of :func:`~trtforge.llm.models.base.sliding_windows`), and RoPE on the sliding layers only: its
full-attention layers are NoPE.

Cohere 2-MoE: Cohere 2's parallel block (its one norm an RMSNorm where ``rms_norm_eps`` is set, else
Cohere's LayerNorm; the final norm likewise) around sparse MoE MLPs (:class:`~.moe.SparseMoe`), dense layers
where ``mlp_layer_types`` says (``prefix_dense_intermediate_size`` wide; with
``prefix_dense_sliding_window_pattern`` 1 they rotate whatever their window: the attention's
``force_rope``). Its router takes the top k of the logits in the model's dtype, then by
``expert_selection_fn`` a float32 softmax over those k (``topk_softmax``) or a sigmoid of each in the
model's dtype (``topk_sigmoid``), renormalized by ``norm_topk_prob``; the weights cast to the model's dtype.
Its shared experts (``num_shared_experts`` x ``intermediate_size`` wide; none at 0) are added to the
experts' sum or averaged with it (``shared_expert_combination_strategy`` "sum" / "average").
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.moe import moe_layers
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
            lambda: self.mlp(i, layer.input_layernorm(x)),
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


class Cohere2MoeStyle(Cohere2Style):
    """Cohere 2-MoE (see the module docstring): Cohere 2's block around sparse MoE MLPs."""

    family = "cohere2_moe"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        c, where = self.config, self.cannot_run()
        selection, combination = c.expert_selection_fn, c.shared_expert_combination_strategy
        if selection not in ("softmax", "sigmoid") or combination not in ("sum", "average"):
            raise UserError(
                f"{where}: its config sets expert_selection_fn={selection!r} and "
                f"shared_expert_combination_strategy={combination!r}; transformers runs 'softmax' or "
                "'sigmoid' and 'sum' or 'average' only."
            )
        sigmoid = selection == "sigmoid"
        self.moe = moe_layers(
            self.layers,
            renormalize=sigmoid and bool(c.norm_topk_prob),
            float32_weights=False,
            where=where,
            routing="topk_sigmoid" if sigmoid else "topk_softmax",
            float32_router=not sigmoid,
            shared_average=combination == "average",
        )

    def rotates(self, i: int) -> bool:
        """A sliding layer rotates, and so does a dense one where ``prefix_dense_sliding_window_pattern``
        is 1 (transformers' ``Cohere2MoeAttention.force_rope``)."""
        return super().rotates(i) or bool(getattr(self.layers[i].self_attn, "force_rope", False))
