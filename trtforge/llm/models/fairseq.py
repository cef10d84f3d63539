"""fairseq's pre-LayerNorm decoders, OPT's relatives: BioGPT (``model_type`` "biogpt":
``BioGptForCausalLM``, microsoft/biogpt, BioGPT-Large) and XGLM (``model_type`` "xglm":
``XGLMForCausalLM``, facebook/xglm-564M..7.5B).

Both: token embeddings scaled by sqrt(hidden) when ``scale_embedding`` is set (the embedding module scales
its rows itself), absolute positions offset by 2 added to them, multi-head attention with biased
q/k/v/out projections, a pre-LayerNorm block (``self_attn_layer_norm``, then ``final_layer_norm`` before
``fc1``/``fc2`` on the layer itself, as OPT's), a final LayerNorm (``layer_norm``). BioGPT's positions are
a learned table (OPT's) and its attention applies its ``scaling`` to the scores; XGLM's are a fixed
sinusoid table (its buffer ``weights``) and its query is multiplied by ``head_dim**-0.5`` as it is
projected, the scores left unscaled (OPT's order). No rotary, no window.

XGLM's module grows its sinusoid table past ``max_position_embeddings`` on demand; the executors index
the table it holds, so they serve at most ``max_position_embeddings`` positions (the length its config
states), a bound transformers does not enforce.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trtforge.llm.models.base import DecoderAdapter, DecoderSpec

_OFFSET = 2  # (fairseq's position ids start past the padding index)


class FairseqStyle(DecoderAdapter):
    """A fairseq pre-LN decoder over `body` (see the module docstring); subclasses name the position table
    and where the attention scale goes."""

    #: the query is scaled as it is projected (XGLM, OPT), and the attention runs at scale 1
    query_prescaled: bool = False

    def __init__(self, model: nn.Module, body: nn.Module, user: str) -> None:
        super().__init__(model, list(body.layers), user)
        self.body = body
        attn = self.layers[0].self_attn
        self.num_heads = self.num_kv_heads = int(attn.num_heads)
        self.head_dim = int(attn.head_dim)
        scales = [1.0 if self.query_prescaled else float(layer.self_attn.scaling) for layer in self.layers]
        self.scales = scales
        self._count_rank_heads()

    def _position_table(self) -> Tensor:
        """The ``[max positions + 2, H]`` table the positions index (after the offset)."""
        raise NotImplementedError

    def mlp_module(self, i: int) -> nn.Module:
        """The layer itself: fc1/fc2 sit on it, beside the attention (no MLP module, as OPT's)."""
        return self.layers[i]

    @property
    def spec(self) -> DecoderSpec:
        return self._spec(positions="learned", rotary=None, max_positions=self.max_length)

    @property
    def max_length(self) -> int:
        return int(self._position_table().shape[0] - _OFFSET)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.body.embed_tokens(input_ids)
        return x + nn.functional.embedding(position_ids + _OFFSET, self._position_table())

    def rotary(self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None) -> None:
        return None

    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = self.layers[i].self_attn
        h = self.layers[i].self_attn_layer_norm(x)
        q = attn.q_proj(h) * attn.scaling if self.query_prescaled else attn.q_proj(h)
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, attn.k_proj(h), attn.v_proj(h)))  # type: ignore[return-value]

    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        layer = self.layers[i]
        x = x + layer.self_attn.out_proj(attn_out)
        return x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))

    def final_norm(self, x: Tensor) -> Tensor:
        return self.body.layer_norm(x)


class BioGptStyle(FairseqStyle):
    """BioGPT (``BioGptForCausalLM``): learned positions, the scale on the scores."""

    family = "biogpt"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, model.biogpt, user)

    def _position_table(self) -> Tensor:
        return self.body.embed_positions.weight


class XglmStyle(FairseqStyle):
    """XGLM (``XGLMForCausalLM``): sinusoidal positions, the query scaled as it is projected."""

    family = "xglm"
    query_prescaled = True

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, model.model, user)

    def _position_table(self) -> Tensor:
        return self.body.embed_positions.weights
