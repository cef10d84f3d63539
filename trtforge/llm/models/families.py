"""The supported decoder families and the adapter of each: :func:`adapter_for` is what the step-graph export
and the torch executor call, so both see one set of layer math and one sliding-window rule.

Supported: Llama-style (:mod:`.llama`: llama, mistral, ministral, qwen2, qwen3, phi3, starcoder2, internlm3,
seed_oss, arcee, exaone, iquestcoder, cwm, jais2; and Ministral 3's position-scaled queries), GPT-2 (and
GPT-SW3) and its relatives GPT-Neo, GPT-BigCode and GPT-1 (:mod:`.gpt2`), OPT (:mod:`.opt`) and its fairseq
relatives BioGPT and XGLM (:mod:`.fairseq`), GPT-NeoX and GPT-NeoX-Japanese (:mod:`.gpt_neox`), Phi
(:mod:`.phi`), Gemma 1 (:mod:`.gemma`), Gemma 2 and VaultGemma (:mod:`.gemma2`), Gemma 3 text
(:mod:`.gemma3`), ModernBERT-Decoder (:mod:`.modernbert`), OLMo 2 (:mod:`.olmo2`, with OLMo 3 and EXAONE 4),
OLMo 1 (:mod:`.olmo`), Granite, Granite SWA and HyperCLOVA X (:mod:`.granite`), StableLM (:mod:`.stablelm`),
SmolLM3 (:mod:`.smollm3`), Cohere 1 / 2 (:mod:`.cohere`), GLM, GLM-4-0414, Helium and ERNIE 4.5 (:mod:`.glm`),
Nemotron and Persimmon (:mod:`.nemotron`), HunYuan dense, Apertus, Apertus 1.5 text and NanoChat
(:mod:`.hunyuan`) (Phi and these share :mod:`.rope` with Llama-style, which also runs InternLM3, Seed-OSS,
Arcee, EXAONE 3 / 3.5, IQuest-Coder, CWM and Jais 2), GPT-J and CodeGen (:mod:`.gptj`: interleaved rotary from
a fixed table), Falcon (:mod:`.falcon`: rotary, and falcon-rw's ALiBi), BLOOM (:mod:`.bloom`) and MPT
(:mod:`.mpt`), the last two with ALiBi position biases, and the sparse mixture-of-experts families Mixtral,
Qwen2-MoE, Qwen3-MoE, Mellum, OLMoE, GLM-4.5 (and Param2-MoE, Sarvam-MoE and Solar Open on its MoE MLPs),
dots.llm1, K-EXAONE, Kolibri-1, MiniMax-M2, MiniCPM5-MoE, HY V3, Flint, AFMoE, Beam, Laguna and Aria text
(:mod:`.mixtral`), Llama 4 text (:mod:`.llama4`: attention chunks besides its MoE MLPs), FlexOLMo
(:mod:`.olmo2`), GraniteMoE, GraniteMoeShared and GraniteMoeSWA (:mod:`.granite`), HunYuan-MoE
(:mod:`.hunyuan`), ERNIE 4.5-MoE (:mod:`.glm`), Cohere 2-MoE (:mod:`.cohere`), and gpt-oss (:mod:`.gpt_oss`:
attention sinks besides its MoE MLPs) (their MoE MLPs: :mod:`.moe`). The shared pieces (spec, family checks,
windows, attention chunks, attention soft-caps, ALiBi slopes, attention sinks) live in :mod:`.base`, the
attention output gate in :mod:`.gate`, the rotary variants (interleaved, float32, NoPE layers, a table per
layer type or RoPE base, position-scaled queries) in :mod:`.rotary`.
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
from trtforge.llm.models.cohere import Cohere2MoeStyle, Cohere2Style, CohereStyle
from trtforge.llm.models.fairseq import BioGptStyle, XglmStyle
from trtforge.llm.models.falcon import FalconStyle
from trtforge.llm.models.gemma import GemmaStyle
from trtforge.llm.models.gemma2 import Gemma2Style, VaultGemmaStyle
from trtforge.llm.models.gemma3 import Gemma3Style
from trtforge.llm.models.glm import Ernie45MoeStyle, Ernie45Style, Glm4Style, GlmStyle, HeliumStyle
from trtforge.llm.models.gpt2 import Gpt2Style, GptBigCodeStyle, GptNeoStyle, GptSw3Style, OpenAIGptStyle
from trtforge.llm.models.gpt_neox import GptNeoXJapaneseStyle, GptNeoXStyle
from trtforge.llm.models.gpt_oss import GptOssStyle
from trtforge.llm.models.gptj import CodeGenStyle, GptJStyle
from trtforge.llm.models.granite import (
    GraniteMoeSharedStyle,
    GraniteMoeStyle,
    GraniteMoeSwaStyle,
    GraniteStyle,
    GraniteSwaStyle,
    HyperClovaXStyle,
)
from trtforge.llm.models.hunyuan import (
    Apertus1p5TextStyle,
    ApertusStyle,
    HunYuanDenseStyle,
    HunYuanMoeStyle,
    NanoChatStyle,
)
from trtforge.llm.models.llama import LlamaStyle, Ministral3Style
from trtforge.llm.models.llama4 import Llama4TextStyle
from trtforge.llm.models.mixtral import (
    AfmoeStyle,
    AriaTextStyle,
    BeamStyle,
    Dots1Style,
    ExaoneMoeStyle,
    FlintStyle,
    Glm4MoeStyle,
    HyV3Style,
    Kolibri1Style,
    LagunaStyle,
    MellumStyle,
    MiniCPM5MoeStyle,
    MiniMaxM2Style,
    MixtralStyle,
    OlmoeStyle,
    Param2MoeStyle,
    Qwen2MoeStyle,
    Qwen3MoeStyle,
    SarvamMoeStyle,
    SolarOpenStyle,
)
from trtforge.llm.models.modernbert import ModernBertDecoderStyle
from trtforge.llm.models.mpt import MptStyle
from trtforge.llm.models.nemotron import NemotronStyle, PersimmonStyle
from trtforge.llm.models.olmo import OlmoStyle
from trtforge.llm.models.olmo2 import Exaone4Style, FlexOlmoStyle, Olmo2Style, Olmo3Style
from trtforge.llm.models.opt import OptStyle
from trtforge.llm.models.phi import PhiStyle
from trtforge.llm.models.smollm3 import SmolLM3Style
from trtforge.llm.models.stablelm import StableLmStyle

# model_type -> its adapter class (every family of base.STYLES has one)
ADAPTERS: dict[str, type[DecoderAdapter]] = {
    **dict.fromkeys(LLAMA_STYLE, LlamaStyle),
    "ministral3": Ministral3Style,
    "gpt2": Gpt2Style,
    "gpt-sw3": GptSw3Style,
    "gpt_neo": GptNeoStyle,
    "gpt_bigcode": GptBigCodeStyle,
    "openai-gpt": OpenAIGptStyle,
    "modernbert-decoder": ModernBertDecoderStyle,
    "opt": OptStyle,
    "biogpt": BioGptStyle,
    "xglm": XglmStyle,
    "gpt_neox": GptNeoXStyle,
    "gpt_neox_japanese": GptNeoXJapaneseStyle,
    "phi": PhiStyle,
    "gemma": GemmaStyle,
    "gemma2": Gemma2Style,
    "vaultgemma": VaultGemmaStyle,
    "gemma3_text": Gemma3Style,
    "olmo2": Olmo2Style,
    "granite": GraniteStyle,
    "granite_swa": GraniteSwaStyle,
    "hyperclovax": HyperClovaXStyle,
    "stablelm": StableLmStyle,
    "smollm3": SmolLM3Style,
    "gptj": GptJStyle,
    "codegen": CodeGenStyle,
    "falcon": FalconStyle,
    "olmo": OlmoStyle,
    "olmo3": Olmo3Style,
    "cohere": CohereStyle,
    "cohere2": Cohere2Style,
    "glm": GlmStyle,
    "glm4": Glm4Style,
    "nemotron": NemotronStyle,
    "persimmon": PersimmonStyle,
    "helium": HeliumStyle,
    "ernie4_5": Ernie45Style,
    "exaone4": Exaone4Style,
    "hunyuan_v1_dense": HunYuanDenseStyle,
    "apertus": ApertusStyle,
    "apertus1p5_text": Apertus1p5TextStyle,
    "nanochat": NanoChatStyle,
    "mixtral": MixtralStyle,
    "qwen2_moe": Qwen2MoeStyle,
    "qwen3_moe": Qwen3MoeStyle,
    "olmoe": OlmoeStyle,
    "granitemoe": GraniteMoeStyle,
    "granitemoeshared": GraniteMoeSharedStyle,
    "granitemoe_swa": GraniteMoeSwaStyle,
    "gpt_oss": GptOssStyle,
    "hunyuan_v1_moe": HunYuanMoeStyle,
    "ernie4_5_moe": Ernie45MoeStyle,
    "glm4_moe": Glm4MoeStyle,
    "param2moe": Param2MoeStyle,
    "sarvam_moe": SarvamMoeStyle,
    "solar_open": SolarOpenStyle,
    "dots1": Dots1Style,
    "flex_olmo": FlexOlmoStyle,
    "exaone_moe": ExaoneMoeStyle,
    "mellum": MellumStyle,
    "hy_v3": HyV3Style,
    "flint": FlintStyle,
    "afmoe": AfmoeStyle,
    "beam": BeamStyle,
    "laguna": LagunaStyle,
    "llama4_text": Llama4TextStyle,
    "aria_text": AriaTextStyle,
    "cohere2_moe": Cohere2MoeStyle,
    "minimax_m2": MiniMaxM2Style,
    "minicpm5_moe": MiniCPM5MoeStyle,
    "kolibri1": Kolibri1Style,
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
    "AfmoeStyle",
    "Apertus1p5TextStyle",
    "ApertusStyle",
    "AriaTextStyle",
    "BeamStyle",
    "BioGptStyle",
    "BloomStyle",
    "CodeGenStyle",
    "Cohere2MoeStyle",
    "Cohere2Style",
    "CohereStyle",
    "DecoderAdapter",
    "DecoderSpec",
    "Dots1Style",
    "Ernie45MoeStyle",
    "Ernie45Style",
    "Exaone4Style",
    "ExaoneMoeStyle",
    "FalconStyle",
    "FlexOlmoStyle",
    "FlintStyle",
    "Gemma2Style",
    "Gemma3Style",
    "GemmaStyle",
    "Glm4MoeStyle",
    "Glm4Style",
    "GlmStyle",
    "Gpt2Style",
    "GptBigCodeStyle",
    "GptJStyle",
    "GptNeoStyle",
    "GptNeoXJapaneseStyle",
    "GptNeoXStyle",
    "GptOssStyle",
    "GptSw3Style",
    "GraniteMoeSharedStyle",
    "GraniteMoeStyle",
    "GraniteMoeSwaStyle",
    "GraniteStyle",
    "GraniteSwaStyle",
    "HeliumStyle",
    "HunYuanDenseStyle",
    "HunYuanMoeStyle",
    "HyV3Style",
    "HyperClovaXStyle",
    "Kolibri1Style",
    "LagunaStyle",
    "Llama4TextStyle",
    "LlamaStyle",
    "MellumStyle",
    "MiniCPM5MoeStyle",
    "MiniMaxM2Style",
    "Ministral3Style",
    "MixtralStyle",
    "ModernBertDecoderStyle",
    "MptStyle",
    "NanoChatStyle",
    "NemotronStyle",
    "Olmo2Style",
    "Olmo3Style",
    "OlmoStyle",
    "OlmoeStyle",
    "OpenAIGptStyle",
    "OptStyle",
    "Param2MoeStyle",
    "PersimmonStyle",
    "PhiStyle",
    "Qwen2MoeStyle",
    "Qwen3MoeStyle",
    "SarvamMoeStyle",
    "SmolLM3Style",
    "SolarOpenStyle",
    "StableLmStyle",
    "VaultGemmaStyle",
    "XglmStyle",
    "adapter_for",
    "eos_token_ids",
    "model_type_of",
    "refuse_unapplied_window",
    "sliding_windows",
]
