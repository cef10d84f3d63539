"""The Granite adapters: IBM Granite 3.x dense models (``model_type`` "granite") and their sparse
mixture-of-experts kin.

Llama's layers with four scalars from the config: ``embedding_multiplier`` on the embeddings,
``residual_multiplier`` on each branch before its residual add, ``attention_multiplier`` as the
softmax scale (the attention modules' own ``scaling``, read like every family's) and the logits
divided by ``logits_scaling``. No window. HyperCLOVA X (``model_type`` "hyperclovax":
:class:`HyperClovaXStyle`) adds norms on the attention and MLP outputs and multiplies the logits instead.

- ``granitemoe`` (``GraniteMoeForCausalLM``: granite-3.0-1b-a400m / 3b-a800m, PowerMoE): the same
  multipliers, every MLP a sparse MoE block (``block_sparse_moe``: :class:`~.moe.SparseMoe`) routed by
  top-k of the router logits, then a softmax over those k (the ``topk_softmax`` routing of :mod:`.moe`),
  the weights cast to the model's dtype.
- ``granitemoeshared`` (``GraniteMoeSharedForCausalLM``): GraniteMoE with an ungated shared MLP
  (``shared_mlp``, ``shared_intermediate_size`` wide; none at 0) on the same input, added to the experts'
  sum before the residual multiplier.

- ``granite_swa`` (``GraniteSWAForCausalLM``, granite-swash) and ``granitemoe_swa``
  (``GraniteMoeSWAForCausalLM``): Granite's and GraniteMoeShared's layers with sliding and full layers by
  ``layer_types`` (every 4th full by default), a learned sink logit per head on every layer (transformers'
  eager attention scales each output row by ``sigmoid(logsumexp(scores) - sink)``: the adapter's
  ``sinks``, as gpt-oss's), and each layer's RoPE base from ``layer_rope_theta`` (a rotary module per
  base in the body's ``rotary_embs``; 0: a NoPE layer).

Not Llama-style: the fused CUDA layers and quantization refuse the MoE models by name; tensor parallelism
splits dense Granite (:mod:`.rotary`) and refuses the MoE MLPs (the experts have no split yet) and the
attention sinks.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.llm.models.moe import moe_layers
from trtforge.llm.models.rope import RopeStyle
from trtforge.llm.models.rotary import PerTypeRotary, RotaryTables


class GraniteStyle(RopeStyle):
    """Granite (``GraniteForCausalLM``): :class:`RopeStyle`'s pre-norm block with scaled branches."""

    family = "granite"

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.embed_tokens(input_ids) * self.body.embedding_multiplier

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        scale = layer.residual_multiplier
        x = x + layer.self_attn.o_proj(attn_out) * scale
        return x + self.mlp(i, layer.post_attention_layernorm(x)) * scale

    def logits(self, x: Tensor) -> Tensor:
        return super().logits(x) / self.config.logits_scaling


class GraniteMoeStyle(GraniteStyle):
    """GraniteMoE and GraniteMoeShared (see the module docstring): Granite's scaled branches around
    sparse MoE MLPs, with the layer's ``shared_mlp`` beside the experts where it has one."""

    family = "granitemoe"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        where = self.cannot_run()
        self.moe = moe_layers(
            self.layers,
            renormalize=False,
            float32_weights=False,
            where=where,
            routing="topk_softmax",
            block="block_sparse_moe",
            shared="shared_mlp",
        )


class GraniteMoeSharedStyle(GraniteMoeStyle):
    """GraniteMoeShared: GraniteMoE's layers with the ungated ``shared_mlp`` beside the experts."""

    family = "granitemoeshared"


class GraniteSwaStyle(PerTypeRotary, GraniteStyle):
    """Granite SWA (see the module docstring): Granite's scaled branches with windows, attention sinks and a
    rotary table per RoPE base (:class:`~.rotary.PerTypeRotary` keyed by ``layer_rope_theta``)."""

    family = "granite_swa"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        self._read_sinks()

    def _use_rotary(self, rotary_emb: nn.Module) -> None:
        """Each layer's tables from the body's rotary module of its ``layer_rope_theta`` (transformers builds
        one per nonzero base, each from a config copy with that ``rope_theta``; the body's ``rotary_emb`` is
        unused); a layer of base 0 is NoPE."""
        modules = {float(m.config.rope_parameters["rope_theta"]): m for m in self.body.rotary_embs}
        thetas = [float(t) for t in self.config.layer_rope_theta[: self.num_layers]]
        self.layer_types = [f"rope_theta={t}" if t else None for t in thetas]
        self._use_tables(
            {
                f"rope_theta={t}": RotaryTables(self.model, modules[t], self.user, config=modules[t].config)
                for t in sorted(set(thetas))
                if t
            }
        )


class GraniteMoeSwaStyle(GraniteSwaStyle, GraniteMoeStyle):
    """GraniteMoeSWA: Granite SWA's attention around GraniteMoeShared's MoE MLPs."""

    family = "granitemoe_swa"


class HyperClovaXStyle(GraniteStyle):
    """HyperCLOVA X (``HyperCLOVAXForCausalLM``, ``model_type`` "hyperclovax", HyperCLOVAX-SEED): Granite's
    multipliers with RMSNorms on the attention and MLP outputs before the residual multiplier
    (``post_norm1`` / ``post_norm2``, identities when ``use_post_norm`` is off: Peri-LN), and the logits
    *multiplied* by ``logits_scaling`` (MuP), not divided."""

    family = "hyperclovax"

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        scale = layer.residual_multiplier
        x = x + layer.post_norm1(layer.self_attn.o_proj(attn_out)) * scale
        return x + layer.post_norm2(self.mlp(i, layer.post_attention_layernorm(x))) * scale

    def logits(self, x: Tensor) -> Tensor:
        return RopeStyle.logits(self, x) * self.config.logits_scaling
