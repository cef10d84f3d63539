"""The ModernBERT-Decoder adapter (``ModernBertDecoderForCausalLM``, ``model_type`` "modernbert-decoder": the
Ettin decoders): ModernBERT's encoder layout trained causally.

A LayerNorm on the token embeddings (no positions added: RoPE), pre-norm blocks of LayerNorms (layer 0's
attention norm an identity) around multi-head attention (``q_proj`` / ``k_proj`` / ``v_proj``, output ``Wo``)
and a GeGLU-style MLP (``Wi`` gives [input | gate], ``Wo(act(input) * gate)``), sliding and full layers by
``layer_types`` (every third full by default; the window ``local_attention // 2``) with a RoPE table each
(:class:`~.rotary.PerTypeRotary`, Gemma 3's layout of the rotary module), a final LayerNorm, then the
prediction head (``lm_head``: dense, activation, LayerNorm) before the ``decoder`` projection to the
vocabulary.
Tensor parallelism is refused (:attr:`ModernBertDecoderStyle.tp_refusal`).
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.llm.models.rotary import PerTypeRotary


class ModernBertDecoderStyle(PerTypeRotary):
    """ModernBERT-Decoder (see the module docstring)."""

    family = "modernbert-decoder"
    tp_refusal = (
        "layers (Wi / Wo projections) and its prediction head before the decoder projection have no split "
        "yet."
    )

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.model.layers), user)
        self.body = model.model
        attn = self.layers[0].attn
        self.num_heads = self.num_kv_heads = int(attn.num_heads)
        self.head_dim = int(attn.head_dim)
        self.scales = [float(layer.attn.scaling) for layer in self.layers]
        self._use_rotary(self.body.rotary_emb)
        self._count_rank_heads()

    def attention(self, i: int) -> nn.Module:
        return self.layers[i].attn

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        embeddings = self.body.embeddings
        return embeddings.norm(embeddings.tok_embeddings(input_ids))

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        layer = self.layers[i]
        h = layer.attn_norm(x)
        attn = layer.attn
        return tuple(p(h).unflatten(-1, (-1, self.head_dim)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))  # type: ignore[return-value]

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.attn.Wo(attn_out)
        return x + layer.mlp(layer.mlp_norm(x))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.final_norm(x)

    def logits(self, x: Tensor) -> Tensor:
        """The prediction head (dense, activation, LayerNorm), then the decoder projection."""
        return self.model.decoder(self.model.lm_head(self.final_norm(x)))
