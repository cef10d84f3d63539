"""Gemma 1, Gemma 3 text, OLMo 2 and Granite: what they share with Llama (the RoPE body) and what they must
not (the fused layers, quantization, tensor parallelism, all written for Llama's exact math); Gemma 2 and
Gemma 3's multimodal model refused by name. Their logits against transformers: test_generate.py and
test_torch_executor.py."""

from __future__ import annotations

import pytest
import torch

from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile.step import PagedDecoderStep
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import LLAMA_STYLE, SUPPORTED, LlamaStyle, adapter_for
from trtforge.llm.quant import quantize_model

FAMILIES = ("gemma", "gemma3_text", "olmo2", "granite")
_SMALL = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}


def _gemma(version: int) -> torch.nn.Module:
    """A tiny Gemma 2, or Gemma 3's multimodal model (a one-layer vision tower beside the text model)."""
    import transformers as tf

    if version == 2:
        return tf.Gemma2ForCausalLM(tf.Gemma2Config(**_SMALL)).eval()
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"image_size": 28, "patch_size": 14}
    config = tf.Gemma3Config(text_config=_SMALL, vision_config=vision, mm_tokens_per_image=4)
    return tf.Gemma3ForConditionalGeneration(config).eval()


@pytest.mark.parametrize(
    ("version", "model_type", "why"),
    [
        (2, "gemma2", r"gemma \(Gemma 1 / CodeGemma.*not Gemma 2, whose attention logit soft-capping"),
        (3, "gemma3", r"'gemma3' is Gemma 3's multimodal model .*load a text-only Gemma 3 checkpoint "),
    ],
)
def test_gemma_2_and_gemma_3_multimodal_are_refused_saying_why(version, model_type, why):
    """Gemma 2 soft-caps its attention scores (no kernel here does); Gemma 3's multimodal model
    (Gemma3ForConditionalGeneration) is refused pointing at its text model, Gemma3ForCausalLM."""
    model = _gemma(version)
    assert model.config.model_type == model_type
    with pytest.raises(UserError, match=f"family '{model_type}' .*not supported by --generate.*{why}"):
        PagedDecoderStep(model, 16, 4)
    with pytest.raises(UserError, match=f"'{model_type}' .*not supported by the torch executor.*{why}"):
        TorchExecutor(model, num_blocks=4)


def test_gemma_3_text_is_served_and_its_unsupported_options_refused():
    """Gemma3ForCausalLM runs (its logits: test_generate.py, test_torch_executor.py); attention
    soft-capping and bidirectional attention, which no causal step here reproduces, are refused."""
    assert adapter_for(tiny_model("gemma3_text")).family == "gemma3_text"
    with pytest.raises(UserError, match="Gemma3ForCausalLM: its config sets attn_logit_softcapping=50.0"):
        adapter_for(tiny_model("gemma3_text", attn_logit_softcapping=50.0))
    with pytest.raises(UserError, match="gemma3_text model Gemma3ForCausalLM: its config sets use_bid"):
        TorchExecutor(tiny_model("gemma3_text", use_bidirectional_attention=True), num_blocks=4)


def test_an_encoder_style_gemma_is_refused():
    """use_bidirectional_attention lets every token see later ones: no causal step reproduces that."""
    model = tiny_model("gemma", use_bidirectional_attention=True)
    with pytest.raises(UserError, match="gemma model GemmaForCausalLM: its config sets use_bidirectional"):
        adapter_for(model)


def test_gemma_scales_a_plain_embedding_as_transformers_4_did():
    """transformers 5's embedding module scales itself; before, the model multiplied by sqrt(hidden) in
    the embedding dtype (55.5, not 55.43, in bfloat16): a plain nn.Embedding gets that same scale."""
    model = tiny_model("gemma", hidden_size=3072, intermediate_size=64, num_hidden_layers=1).bfloat16()
    ids, pos = torch.tensor([[3, 7, 11]]), torch.arange(3)[None]
    scaled = adapter_for(model).embed(ids, pos)
    plain = torch.nn.Embedding.from_pretrained(model.model.embed_tokens.weight)
    model.model.embed_tokens = plain
    assert torch.equal(adapter_for(model).embed(ids, pos), scaled)
    assert torch.equal(scaled, plain(ids) * 55.5)


@pytest.mark.parametrize("family", [f for f in SUPPORTED if f not in LLAMA_STYLE])
def test_they_are_kept_off_the_llama_only_paths(family):
    """Every family but the Llama-style ones: not LlamaStyle (the fused CUDA layers and quantization gate
    on it: test_triton_executor checks the executor's refusal); quantization and tensor parallelism refuse
    by the family's name."""
    model = tiny_model(family)
    adapter = adapter_for(model, "the torch executor")
    assert not isinstance(adapter, LlamaStyle)
    with pytest.raises(UserError, match=f"the {family} family .* has no quantized path yet"):
        quantize_model(model, "fp8")
    with pytest.raises(UserError, match=f"the {family} family .* has no quantized path yet"):
        quantize_model(model, None, lm_head_quantization="fp8")
    with pytest.raises(UserError, match=f"tensor parallelism is not supported for {family} models"):
        adapter.shard(None)
