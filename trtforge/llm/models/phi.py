"""The Phi adapter (``PhiForCausalLM``: Phi-1, Phi-1.5, Phi-2): one ``input_layernorm`` per block whose
output feeds the attention and the MLP in parallel (``x + dense(attn(h)) + fc2(act(fc1(h)))``), q/k/v
projections with biases, an optional per-head q/k LayerNorm (``qk_layernorm``) before partial RoPE
(``partial_rotary_factor`` of each head), a final LayerNorm and an LM head with a bias; no window."""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.llm.models.rotary import RotaryDecoder


class PhiStyle(RotaryDecoder):
    """Phi (``PhiForCausalLM``, body ``model.model``; see the module docstring)."""

    family = "phi"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.model.layers), user)
        self.body = model.model
        c, attn = self.config, self.layers[0].self_attn
        self.num_heads = int(c.num_attention_heads)
        self.num_kv_heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
        self.head_dim = int(attn.head_dim)
        self.scales = [float(layer.self_attn.scaling) for layer in self.layers]
        self._use_rotary(self.body.rotary_emb)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.embed_tokens(input_ids)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        h = self.layers[i].input_layernorm(x)
        q, k, v = (p(h).unflatten(-1, (-1, self.head_dim)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        if getattr(attn, "qk_layernorm", False):
            q, k = attn.q_layernorm(q), attn.k_layernorm(k)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """The attention and the MLP both read the block's one LayerNorm of `x` (recomputed here: the
        torch executor runs the two halves of a block as separate pieces)."""
        layer = self.layers[i]
        return layer.self_attn.dense(attn_out) + layer.mlp(layer.input_layernorm(x)) + x

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.final_layernorm(x)
