"""gpt-oss (``gpt_oss``, ``GptOssForCausalLM``: gpt-oss-20b / 120b): a Llama-shaped RoPE decoder (RMSNorm,
GQA with q/k/v/o biases, head_dim 64, YaRN rotary with ``truncate`` and its attention factor, which the
rotary module's tables already hold) with what sets it apart:

- attention sinks on every layer (``self_attn.sinks``, one learned logit a query head that joins each query
  row's softmax as a column with no value): the adapter's ``sinks``
  (:func:`~trtforge.llm.models.base.attention_sinks`), which every attention consumer applies;
- sliding (``sliding_window``) and full layers by ``config.layer_types`` (alternating by default);
- sparse MoE MLPs (:class:`~trtforge.llm.models.moe.SparseMoe` with gpt-oss's layout): a router Linear
  with a bias, a softmax over the top-k router logits, experts with biases whose interleaved gate/up
  columns go through the clamped SwiGLU (``swiglu_alpha``, ``swiglu_limit``: the experts module's
  ``alpha`` and ``limit``).

Released checkpoints store the experts in MXFP4; transformers dequantizes them to BF16 on load where its
MXFP4 kernels are absent (as on a machine without them, or with ``Mxfp4Config(dequantize=True)``). This
adapter runs that dequantized model (what ``from_pretrained`` returns there): there is no MXFP4 path, and a
model whose experts are still MXFP4 modules is refused as experts in another layout.

Not Llama-style: the fused CUDA layers, quantization (MoE) and tensor parallelism (its MoE MLPs) refuse it by
name.
"""

from __future__ import annotations

from torch import nn

from trtforge.errors import UserError
from trtforge.llm.models.moe import gpt_oss_experts, is_sparse_moe, moe_layers
from trtforge.llm.models.rope import RopeStyle


class GptOssStyle(RopeStyle):
    """gpt-oss (see the module docstring)."""

    family = "gpt_oss"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        where = self.cannot_run()
        for i, layer in enumerate(self.layers):
            mlp = layer.mlp
            experts = getattr(mlp, "experts", None)
            if not (is_sparse_moe(mlp) and gpt_oss_experts(experts)):
                raise UserError(
                    f"{where}: layer {i}'s MLP ({type(mlp).__name__} with {type(experts).__name__}) is not "
                    "transformers' GptOssMLP over float experts (a biased router; gate_up_proj [experts, "
                    "hidden, 2 x intermediate] with interleaved gate/up columns, biases, the clamped "
                    "SwiGLU). MXFP4 experts are not run: load the checkpoint dequantized to BF16 "
                    "(transformers does so where its MXFP4 kernels are absent, or with "
                    "Mxfp4Config(dequantize=True))."
                )
        self.moe = moe_layers(
            self.layers,
            renormalize=False,
            float32_weights=False,
            where=where,
            routing="topk_softmax",
            float32_router=False,
        )
        self._read_sinks()
