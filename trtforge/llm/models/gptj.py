"""The GPT-J adapter (``GPTJForCausalLM``) and CodeGen (``CodeGenForCausalLM``), the same math with a
fused projection.

One LayerNorm ``ln_1`` per block feeds the attention and the MLP in parallel (``x + out_proj(attn) +
fc_out(gelu_new(fc_in(h)))``), q/k/v and out projections without bias, multi-head attention at scale
1/sqrt(head_dim), an LM head with a bias, no window. Positions are rotary, *interleaved*
(``rotate_every_two``: channel pairs (0, 1), (2, 3), ... of the first ``rotary_dim`` channels of each
head), read from the fixed sinusoid table transformers keeps in ``transformer.rotary_emb.embed_positions``
(each attention's ``embed_positions`` before 5.2x; sin half, then cos half; ``n_positions`` rows, no
scaling): no position past it exists.

GPT-J casts the table rows to the hidden states' dtype before rotating; CodeGen rotates by the table as
it is (float32 unless the model was cast) and casts q and k back to the model's dtype. CodeGen's fused
``qkv_proj`` is laid out per model-parallel shard (``mp_num``, 4): each shard's queries, values, keys.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models.base import DecoderAdapter, DecoderSpec, apply_rotary_interleaved, softmax_scale


class GptJStyle(DecoderAdapter):
    """GPT-J (``GPTJForCausalLM``, body ``model.transformer``; see the module docstring)."""

    family = "gptj"
    tp_refusal = (
        "layers (a fixed rotary table; CodeGen's qkv_proj laid out in mp_num shards) have no split yet."
    )
    #: rotate by the table in its own dtype, then cast q and k to theirs (CodeGen); else cast it first
    table_dtype_rotary = False

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, list(model.transformer.h), user)
        self.body = model.transformer
        c, attn, name = self.config, self.layers[0].attn, type(model).__name__
        self.num_heads = self.num_kv_heads = int(c.num_attention_heads)
        self.head_dim = int(attn.head_dim)
        self.scales = [softmax_scale(layer.attn, self.head_dim) for layer in self.layers]
        table = self._table
        if not isinstance(table, Tensor):
            raise UserError(
                f"{user} cannot run this {c.model_type} model {name}: its transformers version keeps no "
                "sinusoid table (transformer.rotary_emb.embed_positions, or each attention's "
                "embed_positions), which trtforge reads its rotary positions from. Use transformers 5.x."
            )
        rotated = self.head_dim if attn.rotary_dim is None else min(int(attn.rotary_dim), self.head_dim)
        if table.shape[-1] != rotated:
            raise UserError(
                f"{user} cannot run this {c.model_type} model {name}: its config's rotary_dim "
                f"{attn.rotary_dim} makes a {table.shape[-1]}-channel rotary table for {rotated} channels "
                f"of each {self.head_dim}-channel head, which transformers' own forward cannot apply "
                "either. Set rotary_dim to an even number of channels <= the head dim."
            )

    @property
    def _table(self) -> Tensor | None:
        """``[n_positions, R]``: each position's sines, then its cosines (HF's ``embed_positions``: one
        model-level table in transformers 5.2x, the same table in every attention module before)."""
        table = getattr(getattr(self.body, "rotary_emb", None), "embed_positions", None)
        return table if table is not None else getattr(self.layers[0].attn, "embed_positions", None)

    @property
    def spec(self) -> DecoderSpec:
        rotary = {
            "type": "default",
            "theta": 10000.0,
            "dim": int(self._table.shape[-1]),
            "attention_scaling": 1.0,
            "interleaved": True,
        }
        return self._spec(positions="rotary", rotary=rotary, max_positions=self.max_length)

    @property
    def max_length(self) -> int:
        return int(self._table.shape[0])

    @property
    def bounded(self) -> bool:
        return True

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.body.wte(input_ids)

    def rotary(
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """cos, sin ``[..., R]``: the table's rows at `position_ids` (in `dtype` for GPT-J, as HF casts
        them to the hidden states'), each frequency repeated twice as HF's ``repeat_interleave`` does."""
        sincos = self._table[position_ids]
        if not self.table_dtype_rotary:
            sincos = sincos.to(dtype)
        sin, cos = sincos.chunk(2, dim=-1)
        return _twice(cos), _twice(sin)

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].attn
        h = self.layers[i].ln_1(x)
        q, k, v = (p(h).unflatten(-1, (-1, self.head_dim)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        return q, k, v

    def rotate(
        self, i: int, q: Tensor, k: Tensor, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """Interleaved rotary on the first R channels of each head, in q and k's dtype."""
        if rope is None:
            return q, k
        cos, sin = rope
        return (
            apply_rotary_interleaved(q, cos, sin).to(q.dtype),
            apply_rotary_interleaved(k, cos, sin).to(k.dtype),
        )

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """The attention and the MLP both read the block's one ``ln_1`` of `x` (recomputed here: the torch
        executor runs the two halves of a block as separate pieces); HF's sum order."""
        layer = self.layers[i]
        return layer.attn.out_proj(attn_out) + layer.mlp(layer.ln_1(x)) + x

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.ln_f(x)


class CodeGenStyle(GptJStyle):
    """CodeGen (``CodeGenForCausalLM``): GPT-J's block and table with the rotation in the table's dtype and
    the per-shard fused ``qkv_proj`` (see the module docstring)."""

    family = "codegen"
    table_dtype_rotary = True

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection viewed as ``[..., mp_num, 3 * H / mp_num]``, each shard cut into its
        queries, values and keys, and each of the three read as heads, as HF does."""
        attn = self.layers[i].attn
        shards = int(getattr(attn, "mp_num", 4))  # an attribute from transformers 5.2x, 4 in its code before
        local = int(self.config.hidden_size) // shards
        fused = attn.qkv_proj(self.layers[i].ln_1(x)).unflatten(-1, (shards, 3 * local))
        q, v, k = (t.flatten(-2).unflatten(-1, (-1, self.head_dim)) for t in fused.split(local, dim=-1))
        return q, k, v


def _twice(t: Tensor) -> Tensor:
    """`t` with each channel repeated twice in place (``repeat_interleave(t, 2, -1)``)."""
    return torch.stack((t, t), dim=-1).flatten(-2)
