"""The Llama-style adapter: llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2, internlm3, seed_oss,
arcee, exaone, iquestcoder, cwm, jais2.

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

from torch import Tensor

from trtforge.llm.models.rope import RopeStyle


class LlamaStyle(RopeStyle):
    """Llama and its relatives (see the module docstring)."""

    family = "llama"

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v
