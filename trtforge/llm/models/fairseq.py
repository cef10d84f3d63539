"""fairseq's pre-LayerNorm decoders, OPT's relatives: BioGPT (``model_type`` "biogpt":
``BioGptForCausalLM``, microsoft/biogpt, BioGPT-Large) and XGLM (``model_type`` "xglm":
``XGLMForCausalLM``, facebook/xglm-564M..7.5B).

Both are :class:`~trtforge.llm.models.opt.OptStyle`'s pre-LN block (``self_attn_layer_norm``, then
``final_layer_norm`` before ``fc1``/``fc2`` on the layer itself) with token embeddings scaled by
sqrt(hidden) when ``scale_embedding`` is set (the embedding module scales its rows itself), absolute
positions offset by 2 (their modules' ``offset``), and a final LayerNorm named ``layer_norm``. BioGPT's
positions are a learned table and its attention applies its ``scaling`` to the scores; XGLM's are a fixed
sinusoid table (its buffer ``weights``) and its query is scaled as it is projected (OPT's order). No
rotary, no window.

XGLM's module grows its sinusoid table past ``max_position_embeddings`` on demand; the executors index
the table it holds, so they serve at most ``max_position_embeddings`` positions (the length its config
states), a bound transformers does not enforce.
"""

from __future__ import annotations

from torch import Tensor, nn

from trtforge.llm.models.opt import OptStyle


class BioGptStyle(OptStyle):
    """BioGPT (``BioGptForCausalLM``): learned positions, the scale on the scores."""

    family = "biogpt"
    query_prescaled = False

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user, body=model.biogpt)

    def _final_layer_norm(self) -> nn.Module:
        return self.body.layer_norm


class XglmStyle(OptStyle):
    """XGLM (``XGLMForCausalLM``): sinusoidal positions, the query scaled as it is projected."""

    family = "xglm"

    def __init__(self, model: nn.Module, user: str = "--generate") -> None:
        super().__init__(model, user, body=model.model)

    def _position_table(self) -> tuple[Tensor, int]:
        table = self.body.embed_positions
        return table.weights, int(table.offset)

    def _final_layer_norm(self) -> nn.Module:
        return self.body.layer_norm
