"""The supported decoder families and the adapter of each: :func:`adapter_for` is what the step-graph
export and the torch executor call, so both see one set of layer math and one sliding-window rule.

Supported: Llama-style (:mod:`.llama`: llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2),
GPT-2 (:mod:`.gpt2`), GPT-NeoX (:mod:`.gpt_neox`) and Phi (:mod:`.phi`). The shared pieces (spec, family
checks, windows) live in :mod:`.base`.
"""

from __future__ import annotations

from typing import Any

from trtforge.llm.models.base import (
    GPT2_STYLE,
    GPT_NEOX_STYLE,
    LLAMA_STYLE,
    PHI_STYLE,
    SUPPORTED,
    DecoderAdapter,
    DecoderSpec,
    eos_token_ids,
    model_type_of,
    refuse_unapplied_window,
    sliding_windows,
)
from trtforge.llm.models.gpt2 import Gpt2Style
from trtforge.llm.models.gpt_neox import GptNeoXStyle
from trtforge.llm.models.llama import LlamaStyle
from trtforge.llm.models.phi import PhiStyle

# model_type -> its adapter class (every family of base.STYLES has one)
ADAPTERS: dict[str, type[DecoderAdapter]] = {
    **dict.fromkeys(LLAMA_STYLE, LlamaStyle),
    **dict.fromkeys(GPT2_STYLE, Gpt2Style),
    **dict.fromkeys(GPT_NEOX_STYLE, GptNeoXStyle),
    **dict.fromkeys(PHI_STYLE, PhiStyle),
}


def adapter_for(model: Any, user: str = "--generate") -> DecoderAdapter:
    """The adapter for `model`'s family (UserError listing the supported families otherwise); `user`
    names the consumer in errors."""
    return ADAPTERS[model_type_of(model, user)](model, user)


__all__ = [
    "ADAPTERS",
    "GPT2_STYLE",
    "GPT_NEOX_STYLE",
    "LLAMA_STYLE",
    "PHI_STYLE",
    "SUPPORTED",
    "DecoderAdapter",
    "DecoderSpec",
    "Gpt2Style",
    "GptNeoXStyle",
    "LlamaStyle",
    "PhiStyle",
    "adapter_for",
    "eos_token_ids",
    "model_type_of",
    "refuse_unapplied_window",
    "sliding_windows",
]
