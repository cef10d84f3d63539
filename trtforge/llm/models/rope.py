"""What the RoPE decoders with a Llama-shaped body share (Llama-style, Gemma, OLMo 1-3, Granite, StableLM,
SmolLM3, Phi, Cohere, GLM, Nemotron, Persimmon, Helium, ERNIE 4.5, EXAONE 4, HunYuan, Apertus): the body
``model.model`` (``embed_tokens``, ``layers`` of ``self_attn`` + ``mlp``, ``norm``, ``rotary_emb``), its
rotary tables computed as the HF rotary module does, the spec, and the pre-norm block whose norms and MLP are
the model's own modules. Each family's adapter adds what sets it apart. The spec and rotary tables are
:class:`~trtforge.llm.models.rotary.RotaryDecoder`'s, as GPT-NeoX's.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.rotary import RotaryDecoder


class RopeStyle(RotaryDecoder):
    """A RoPE decoder over ``model.model`` (see the module docstring): heads, head dim and each layer's
    softmax scale read from its attention modules, the rotary tables of its ``rotary_emb`` (default,
    linear, llama3, yarn, ...; dynamic NTK per sequence; longrope up to its original length), a pre-norm
    block: ``x + o(attn)``, then ``x + mlp(norm(x))``."""

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.model.layers), user)
        self.body = model.model
        c, attn = self.config, self.layers[0].self_attn
        self.num_heads = int(c.num_attention_heads)
        self.num_kv_heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
        self.head_dim = int(attn.head_dim)
        self.scales = [float(layer.self_attn.scaling) for layer in self.layers]
        self._use_rotary(self.body.rotary_emb)
        self._count_rank_heads()
        # Phi, StableLM, Persimmon slice q and k at the attention's rotary_ndims and rotate that slice by
        # tables of an even width from the rotary module: an odd span has no table, and a head_dim key the
        # attention does not read (StableLM's head size is hidden / heads) sizes the table apart from it;
        # transformers' own forward fails on either
        rotated = getattr(attn, "rotary_ndims", None)
        table = None if rotated is None else int(self.rope.describe()["dim"])
        if rotated is not None and int(rotated) != table:
            why = (
                "an odd number no table of cos/sin pairs covers"
                if int(rotated) % 2
                else f"but its rotary table covers {table} (sized by the config's head_dim "
                f"{getattr(c, 'head_dim', None)!r}, which the attention does not use)"
            )
            raise UserError(
                f"{user} cannot run this {c.model_type} model {type(model).__name__}: its "
                f"partial_rotary_factor rotates {int(rotated)} of each head's {self.head_dim} channels, "
                f"{why}; transformers' own forward fails on it too. Choose a partial_rotary_factor that "
                "rotates an even number of channels, and a head_dim of hidden_size / num_attention_heads "
                "or none."
            )

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.embed_tokens(input_ids)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Pre-norm projections: ``input_layernorm``, then q/k/v (:func:`project_qkv`) split into heads."""
        h = self.layers[i].input_layernorm(x)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in project_qkv(self.layers[i].self_attn, h))
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.o_proj(attn_out)
        return x + self.mlp(i, layer.post_attention_layernorm(x))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.norm(x)


def project_qkv(attn: nn.Module, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [..., heads * head_dim] of a Llama-style attention module: its three projections, or
    Phi-3's fused qkv_proj split by heads (q heads, then the key heads, then the value heads; by the
    config's ratio of heads to KV heads over the projection's width, which a tensor-parallel rank's
    share keeps)."""
    fused = getattr(attn, "qkv_proj", None)
    if fused is None:
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    heads = int(attn.config.num_attention_heads)
    kv_heads = int(attn.config.num_key_value_heads or heads)
    width = int(fused.weight.shape[0])
    q_size = width * heads // (heads + 2 * kv_heads)
    kv_size = (width - q_size) // 2
    return fused(h).split([q_size, kv_size, kv_size], dim=-1)
