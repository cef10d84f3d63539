"""The supported decoder families and the adapter of each: :func:`adapter_for` is what the step-graph
export and the torch executor call, so both see one set of layer math and one sliding-window rule.

Supported: Llama-style (:mod:`.llama`: llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2), GPT-2 and
its relatives GPT-Neo and GPT-BigCode (:mod:`.gpt2`), OPT (:mod:`.opt`), GPT-NeoX (:mod:`.gpt_neox`), Phi
(:mod:`.phi`), Gemma 1 (:mod:`.gemma`), Gemma 2 (:mod:`.gemma2`), Gemma 3 text (:mod:`.gemma3`), OLMo 2
(:mod:`.olmo2`), Granite (:mod:`.granite`), StableLM (:mod:`.stablelm`) and SmolLM3 (:mod:`.smollm3`; Phi
and these share :mod:`.rope` with Llama-style), GPT-J and CodeGen (:mod:`.gptj`: interleaved rotary from a
fixed table), Falcon (:mod:`.falcon`: rotary, and falcon-rw's ALiBi), BLOOM (:mod:`.bloom`) and MPT
(:mod:`.mpt`), the last two with ALiBi position biases. The shared pieces (spec, family checks, windows,
attention soft-caps, ALiBi slopes) live in :mod:`.base`.
"""

from __future__ import annotations

from typing import Any

from trtforge.llm.models.base import (
    GPT2_STYLE,
    LLAMA_STYLE,
    SUPPORTED,
    DecoderAdapter,
    DecoderSpec,
    eos_token_ids,
    model_type_of,
    refuse_unapplied_window,
    sliding_windows,
)
from trtforge.llm.models.bloom import BloomStyle
from trtforge.llm.models.falcon import FalconStyle
from trtforge.llm.models.gemma import GemmaStyle
from trtforge.llm.models.gemma2 import Gemma2Style
from trtforge.llm.models.gemma3 import Gemma3Style
from trtforge.llm.models.gpt2 import Gpt2Style, GptBigCodeStyle, GptNeoStyle
from trtforge.llm.models.gpt_neox import GptNeoXStyle
from trtforge.llm.models.gptj import CodeGenStyle, GptJStyle
from trtforge.llm.models.granite import GraniteStyle
from trtforge.llm.models.llama import LlamaStyle
from trtforge.llm.models.mpt import MptStyle
from trtforge.llm.models.olmo2 import Olmo2Style
from trtforge.llm.models.opt import OptStyle
from trtforge.llm.models.phi import PhiStyle
from trtforge.llm.models.smollm3 import SmolLM3Style
from trtforge.llm.models.stablelm import StableLmStyle

# model_type -> its adapter class (every family of base.STYLES has one)
ADAPTERS: dict[str, type[DecoderAdapter]] = {
    **dict.fromkeys(LLAMA_STYLE, LlamaStyle),
    "gpt2": Gpt2Style,
    "gpt_neo": GptNeoStyle,
    "gpt_bigcode": GptBigCodeStyle,
    "opt": OptStyle,
    "gpt_neox": GptNeoXStyle,
    "phi": PhiStyle,
    "gemma": GemmaStyle,
    "gemma2": Gemma2Style,
    "gemma3_text": Gemma3Style,
    "olmo2": Olmo2Style,
    "granite": GraniteStyle,
    "stablelm": StableLmStyle,
    "smollm3": SmolLM3Style,
    "gptj": GptJStyle,
    "codegen": CodeGenStyle,
    "falcon": FalconStyle,
    "bloom": BloomStyle,
    "mpt": MptStyle,
}


def adapter_for(model: Any, user: str = "--generate") -> DecoderAdapter:
    """The adapter for `model`'s family (UserError listing the supported families otherwise); `user`
    names the consumer in errors."""
    return ADAPTERS[model_type_of(model, user)](model, user)


__all__ = [
    "ADAPTERS",
    "GPT2_STYLE",
    "LLAMA_STYLE",
    "SUPPORTED",
    "BloomStyle",
    "CodeGenStyle",
    "DecoderAdapter",
    "DecoderSpec",
    "FalconStyle",
    "Gemma2Style",
    "Gemma3Style",
    "GemmaStyle",
    "Gpt2Style",
    "GptBigCodeStyle",
    "GptJStyle",
    "GptNeoStyle",
    "GptNeoXStyle",
    "GraniteStyle",
    "LlamaStyle",
    "MptStyle",
    "Olmo2Style",
    "OptStyle",
    "PhiStyle",
    "SmolLM3Style",
    "StableLmStyle",
    "adapter_for",
    "eos_token_ids",
    "model_type_of",
    "refuse_unapplied_window",
    "sliding_windows",
]
