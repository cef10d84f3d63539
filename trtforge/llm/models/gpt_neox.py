"""The GPT-NeoX adapter (``GPTNeoXForCausalLM``: Pythia, GPT-NeoX-20B): one fused ``query_key_value``
projection laid out per head (``[heads, 3, D]``: each head's q, k, v side by side), partial RoPE on the
first ``rotary_pct`` of each head, LayerNorm with bias, GELU MLP, multi-head attention, and the block
either parallel (``use_parallel_residual``: ``x + attn(ln1(x)) + mlp(ln2(x))``) or sequential
(``h = x + attn(ln1(x)); h + mlp(ln2(h))``), per layer as transformers runs it; no window."""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.llm.models.base import softmax_scale
from trtforge.llm.models.rotary import RotaryDecoder


class GptNeoXStyle(RotaryDecoder):
    """GPT-NeoX (``GPTNeoXForCausalLM``, body ``model.gpt_neox``; see the module docstring)."""

    family = "gpt_neox"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.gpt_neox.layers), user)
        self.body = model.gpt_neox
        attn = self.layers[0].attention
        self.num_heads = self.num_kv_heads = int(self.config.num_attention_heads)
        self.head_dim = int(attn.head_size)
        self.scales = [float(layer.attention.scaling) for layer in self.layers]
        self._use_rotary(self.body.rotary_emb)
        self._count_rank_heads()

    def attention(self, i: int) -> nn.Module:
        return self.layers[i].attention

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.embed_in(input_ids)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection viewed as ``[..., heads, 3 * D]`` and cut in three along D, as HF does."""
        layer = self.layers[i]
        fused = layer.attention.query_key_value(layer.input_layernorm(x))
        q, k, v = fused.unflatten(-1, (-1, 3 * self.head_dim)).chunk(3, dim=-1)
        return q, k, v

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        if layer.use_parallel_residual:
            return self.parallel_block(
                x,
                lambda: layer.attention.dense(attn_out),
                lambda: layer.mlp(layer.post_attention_layernorm(x)),
                lambda attn, mlp: mlp + attn + x,
            )
        h = layer.attention.dense(attn_out) + x
        return layer.mlp(layer.post_attention_layernorm(h)) + h

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.final_layer_norm(x)


class GptNeoXJapaneseStyle(GptNeoXStyle):
    """GPT-NeoX-Japanese (see the module docstring): GPT-NeoX's sequential block with the last layer's
    attention output bias."""

    family = "gpt_neox_japanese"
    tp_refusal = "last layer adds an attention output bias (dense_bias) beside its bias-free dense output."

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        RotaryDecoder.__init__(self, model, list(model.gpt_neox_japanese.layers), user)
        self.body = model.gpt_neox_japanese
        self.num_heads = self.num_kv_heads = int(self.config.num_attention_heads)
        self.head_dim = int(self.layers[0].attention.head_size)
        # (its attention keeps no scaling: the scores are divided by sqrt(head size), its norm_factor)
        self.scales = [softmax_scale(layer.attention, self.head_dim) for layer in self.layers]
        self._use_rotary(self.body.rotary_emb)
        self._count_rank_heads()

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        bias = layer.attention.dense_bias
        h = layer.attention.dense(attn_out)
        h = (h if bias is None else h + bias) + x
        return layer.mlp(layer.post_attention_layernorm(h)) + h
