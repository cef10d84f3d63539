"""The Llama-style adapter: llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2, internlm3, seed_oss,
arcee, exaone, iquestcoder, cwm, jais2; and Ministral 3 (:class:`Ministral3Style`: Mistral with
position-scaled queries, not Llama-style).

GQA, RoPE on q/k, pre-norm blocks whose norms and MLP are the model's own modules (RMSNorm + gated SiLU;
starcoder2's LayerNorm + GELU; arcee's and jais2's non-gated squared ReLU, jais2's LayerNorms), optional
projection biases (Seed-OSS: q/k/v and output biases set apart); EXAONE 3 / 3.5 (its checkpoints' names
renamed on load) and IQuest-Coder on transformers' Llama classes; CWM's per-layer windows (``layer_types``, 3
of 4 sliding); qwen3's per-head q/k RMSNorm before RoPE; phi3's fused qkv_proj / gate_up_proj and partial
rotary; the sliding windows of :func:`~trtforge.llm.models.base.sliding_windows`. The body, rotary and
pre-norm block are :class:`~trtforge.llm.models.rope.RopeStyle`'s (its tensor parallelism too:
:mod:`.rotary`); this adds the q/k head norms.
Only this class's models run the fused CUDA layers and quantization, which assume its exact math.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.rope import RopeStyle
from trtforge.llm.models.rotary import QueryScaling


class LlamaStyle(RopeStyle):
    """Llama and its relatives (see the module docstring)."""

    family = "llama"

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v


class Ministral3Style(RopeStyle):
    """Ministral 3 (``Ministral3ForCausalLM``, Ministral-3 3B / 8B / 14B text): Mistral's layers (one
    ``sliding_window`` on every layer, or none) with each rotated query times ``1 + llama_4_scaling_beta *
    log(1 + floor(position / original_max_position_embeddings))`` (both from ``rope_parameters``: the
    rotary's :attr:`~.rotary.RotaryDecoder.query_scaling`). Not :class:`LlamaStyle`: the fused CUDA layers
    and quantization take no query scaling and refuse it by name."""

    family = "ministral3"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user)
        params = dict(self.config.rope_parameters or {})
        beta, period = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
        number = isinstance(beta, (int, float)) and not isinstance(beta, bool)
        whole = isinstance(period, int) and not isinstance(period, bool) and period > 0
        if not (number and whole):
            raise UserError(
                f"{self.cannot_run()}: its rope_parameters set llama_4_scaling_beta={beta!r} and "
                f"original_max_position_embeddings={period!r}; Ministral 3's attention scales each query by "
                "both (a number, and an integer > 0), and transformers' own forward fails without them."
            )
        self.query_scaling = QueryScaling("llama4", float(beta), int(period))
