"""The Phi adapter (``PhiForCausalLM``: Phi-1, Phi-1.5, Phi-2): one ``input_layernorm`` per block whose
output feeds the attention and the MLP in parallel (``x + dense(attn(h)) + fc2(act(fc1(h)))``), q/k/v
projections with biases, an optional per-head q/k LayerNorm (``qk_layernorm``) before partial RoPE
(``partial_rotary_factor`` of each head), a final LayerNorm and an LM head with a bias; no window."""

from __future__ import annotations

from torch import Tensor

from trtforge.llm.models.rope import RopeStyle


class PhiStyle(RopeStyle):
    """Phi (``PhiForCausalLM``): :class:`~.rope.RopeStyle`'s body, heads and rotary tables with Phi's
    block (see the module docstring)."""

    family = "phi"

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(i, x)
        attn = self.layers[i].self_attn
        if getattr(attn, "qk_layernorm", False):
            q, k = attn.q_layernorm(q), attn.k_layernorm(k)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """The attention and the MLP both read the block's one LayerNorm of `x` (recomputed here: the
        torch executor runs the two halves of a block as separate pieces)."""
        layer = self.layers[i]
        return self.parallel_block(
            x,
            lambda: layer.self_attn.dense(attn_out),
            lambda: layer.mlp(layer.input_layernorm(x)),
            lambda attn, mlp: attn + mlp + x,
        )

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.final_layernorm(x)
