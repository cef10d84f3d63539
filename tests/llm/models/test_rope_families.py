"""Gemma 1, Gemma 2, Gemma 3 text, OLMo 2 and Granite: what they share with Llama (the RoPE body) and what
they must not (the fused layers, quantization, tensor parallelism, all written for Llama's exact math);
Gemma 2's attention soft-cap where each consumer reads it; Gemma 3's multimodal model refused by name.
Their logits against transformers: test_generate.py and test_torch_executor.py."""

from __future__ import annotations

import pytest
import torch

from tests.llm.tiny_models import MOE_FAMILIES, TP_REFUSED, tiny_model
from tests.llm.tiny_models import prompts as tiny_prompts
from trtforge.errors import UserError
from trtforge.llm.compile.step import PagedDecoderStep
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import LLAMA_STYLE, SUPPORTED, LlamaStyle, adapter_for
from trtforge.llm.models.rotary import QueryScaling
from trtforge.llm.quant import quantize_model

FAMILIES = ("gemma", "gemma2", "gemma3_text", "olmo2", "granite")
_SMALL = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}


def _gemma3_multimodal() -> torch.nn.Module:
    """A tiny Gemma 3 multimodal model (a one-layer vision tower beside the text model)."""
    import transformers as tf

    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"image_size": 28, "patch_size": 14}
    config = tf.Gemma3Config(text_config=_SMALL, vision_config=vision, mm_tokens_per_image=4)
    return tf.Gemma3ForConditionalGeneration(config).eval()


def test_gemma_3_multimodal_is_refused_saying_why():
    """Gemma 3's multimodal model (Gemma3ForConditionalGeneration) is refused pointing at its text model,
    Gemma3ForCausalLM."""
    model = _gemma3_multimodal()
    why = r"'gemma3' is Gemma 3's multimodal model .*load a text-only Gemma 3 checkpoint "
    assert model.config.model_type == "gemma3"
    with pytest.raises(UserError, match=f"family 'gemma3' .*not supported by --generate.*{why}"):
        PagedDecoderStep(model, 16, 4)
    with pytest.raises(UserError, match=f"'gemma3' .*not supported by the torch executor.*{why}"):
        TorchExecutor(model, num_blocks=4)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None]).logits[0].float()


def _set_attention_softcap(model: torch.nn.Module, cap: float | None) -> None:
    """Set `model`'s attention soft-cap in its config and in each attention module (which copied it)."""
    model.config.attn_logit_softcapping = cap
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = cap


def test_the_tiny_gemma_2_soft_cap_bites():
    """The test model's attention scores reach past its cap (3): transformers' logits without the cap are
    far from those with it, so every test over the tiny Gemma 2 (FAMILIES) fails if a consumer drops it."""
    model = tiny_model("gemma2")
    ids = torch.tensor(tiny_prompts(model.config.vocab_size, lens=(17,))[0])
    capped = _logits(model, ids)
    _set_attention_softcap(model, None)
    assert (capped - _logits(model, ids)).abs().max().item() > 1.0


def test_gemma_2_soft_caps_every_layer_in_the_spec_and_the_executor():
    """The cap is one per-layer list (the adapter's softcaps) in the spec (the step graph's metadata) and
    in the keywords of each layer's attention call; a config without one passes no keyword at all."""
    model = tiny_model("gemma2", num_hidden_layers=3)  # sliding, full, sliding
    spec = PagedDecoderStep(model, 16, 4).spec.to_dict()
    assert spec["attn_softcaps"] == [3.0, 3.0, 3.0] and spec["sliding_windows"] == [4, None, 4]
    assert TorchExecutor(model, num_blocks=4)._attn_kwargs == [{"softcap": 3.0}] * 3
    _set_attention_softcap(model, None)
    assert TorchExecutor(model, num_blocks=4)._attn_kwargs == [{}] * 3


@pytest.mark.parametrize("cap", [0.0, -1.0, float("inf")])
def test_a_gemma_2_cap_that_is_no_positive_number_is_refused(cap):
    model = tiny_model("gemma2")
    model.config.attn_logit_softcapping = cap
    with pytest.raises(UserError, match="gemma2 model: its config sets attn_logit_softcapping="):
        adapter_for(model)


def test_gemma_3_text_is_served_with_an_attention_cap_as_transformers_runs_it():
    """Gemma 3's config keeps attn_logit_softcapping, but transformers' Gemma 3 attention never applies it
    (the logits with and without it are the same): accepted, and served uncapped as transformers runs it
    (test_config_variants draws it too). Bidirectional attention is refused."""
    model = tiny_model("gemma3_text", attn_logit_softcapping=2.0)
    ids = torch.tensor(tiny_prompts(model.config.vocab_size, lens=(17,))[0])
    want = _logits(model, ids)
    _set_attention_softcap(model, None)
    torch.testing.assert_close(_logits(model, ids), want, rtol=0, atol=0)
    _set_attention_softcap(model, 2.0)
    adapter = adapter_for(model)
    assert adapter.family == "gemma3_text" and adapter.softcaps == [None, None]
    step = PagedDecoderStep(model, 32, 4)
    assert step.spec.attn_softcaps == [None, None]
    ex = TorchExecutor(model, num_blocks=8, block_size=4)
    batch = StepBatch.build(["s"], [ids.tolist()], [0], [[0, 1, 2, 3, 4]], [list(range(17))], [True])
    torch.testing.assert_close(ex.step(batch)[0], want[-1], rtol=1e-4, atol=1e-4)
    with pytest.raises(UserError, match="gemma3_text model Gemma3ForCausalLM: its config sets use_bid"):
        TorchExecutor(tiny_model("gemma3_text", use_bidirectional_attention=True), num_blocks=4)


def test_persimmon_is_multi_head_whatever_num_key_value_heads_its_config_holds():
    """transformers' Persimmon ignores a num_key_value_heads key in its config (its fused projection holds
    as many KV heads as query heads): so does the adapter, and the executor reproduces transformers'
    logits. Before, the adapter read the key: a KV cache of 1 head and the step failed on a shape
    mismatch (an internal error)."""
    model = tiny_model("persimmon", num_key_value_heads=1)
    assert adapter_for(model).num_kv_heads == model.config.num_attention_heads
    ids = torch.tensor(tiny_prompts(model.config.vocab_size, lens=(9,))[0])
    ex = TorchExecutor(model, num_blocks=8, block_size=4)
    batch = StepBatch.build(["s"], [ids.tolist()], [0], [[0, 1, 2]], [list(range(9))], [True])
    torch.testing.assert_close(ex.step(batch)[0], _logits(model, ids)[-1], rtol=1e-4, atol=1e-4)


def test_the_fused_layers_refuse_an_attention_soft_cap():
    """The fused Llama-style layers are Llama's exactly: an adapter with a soft-cap (none of the
    Llama-style families has one) is refused, never run without it."""
    from trtforge.llm.executors.fused_layers import fusable

    adapter = adapter_for(tiny_model("llama"))
    assert fusable(adapter) is None
    adapter.softcaps = [None, 30.0]
    assert "soft-capping" in fusable(adapter)


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
    on it: test_triton_executor checks the executor's refusal); quantization refuses by the family's name
    (the MoE families: naming their MoE MLPs), and so does tensor parallelism where it does not split the
    family's layers (:data:`TP_REFUSED`); the others pass its check."""
    model = tiny_model(family)
    adapter = adapter_for(model, "the torch executor")
    assert not isinstance(adapter, LlamaStyle)
    no_quant = f"the {family} family .* has no quantized path yet"
    no_tp = f"tensor parallelism is not supported for (this )?{family} model"  # (Granite SWA: its sinks)
    if family in MOE_FAMILIES:
        no_quant = f"the {family} model .* sparse mixture-of-experts MLPs .* no such path yet"
        no_tp = f"tensor parallelism .*: the {family} model .* sparse mixture-of-experts MLPs"
    with pytest.raises(UserError, match=no_quant):
        quantize_model(model, "fp8")
    with pytest.raises(UserError, match=no_quant):
        quantize_model(model, None, lm_head_quantization="fp8")
    if family not in TP_REFUSED:
        adapter.check_shard(2)
        return
    with pytest.raises(UserError, match=no_tp):
        adapter.check_shard(2)


def test_afmoe_of_dense_layers_only_is_refused_by_tensor_parallelism_naming_its_attention_gate():
    """AFMoE's sigmoid gate on the attention output has no split: with every layer dense (no MoE MLP to
    refuse it first) tensor parallelism refuses it by that gate."""
    adapter = adapter_for(tiny_model("afmoe", num_dense_layers=3))
    assert not adapter.has_moe
    with pytest.raises(UserError, match="not supported for afmoe models .*attention output gate"):
        adapter.check_shard(2)


# the model types refused by name (base.UNSUPPORTED_HINTS) whose tiny model builds from their config with
# the small sizes below and these extras; None: a stand-in carrying their config (BLT's sub-configs default
# to a large model; CohereCompass's text model wants rope_parameters per layer type)
REFUSED_BY_CONFIG: dict[str, dict | None] = {
    "ergo": {},
    "doge": {},
    "axk1": {},
    "glm4_moe_lite": {},
    "axk2": {},
    "glm_moe_dsa": {},
    "dots3_note_text": {"num_key_value_heads": 4, "pad_token_id": 0},
    "hy_v4": {"pad_token_id": 0},
    "falcon_h1": {},
    "bamba": {},
    "granitemoehybrid": {},
    "gemma3n_text": {"num_kv_shared_layers": 0, "num_hidden_layers": 4},
    "gemma4_text": {},
    "gemma4_unified_text": {},
    "dory": {},
    "hrm_text": {},
    "ctrl": {},
    "blt": None,
    "cohere_compass_text": None,
}


class _StandIn(torch.nn.Module):
    """A module that carries a config (and an LM head), for the refusal by model type alone."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.lm_head = torch.nn.Linear(1, 1)


@pytest.mark.parametrize("model_type", sorted(REFUSED_BY_CONFIG))
def test_families_apart_are_refused_by_name_with_what_sets_them_apart(model_type):
    """Each causal-LM family trtforge does not run (MLA, sparse-attention indexers, state-space layers,
    recurrent or looped stacks, per-layer embeddings, normed experts) is refused naming its hint."""
    import re

    import transformers as tf
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from trtforge.llm.models.base import UNSUPPORTED_HINTS

    if model_type not in CONFIG_MAPPING_NAMES:  # (new in transformers 5.2x; test-floor runs 5.17)
        pytest.skip(f"transformers {tf.__version__} has no {model_type} config")
    extra = REFUSED_BY_CONFIG[model_type]
    if extra is None:
        model = _StandIn(tf.AutoConfig.for_model(model_type))
    else:
        small = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
        small |= {"num_attention_heads": 4, "num_key_value_heads": 2}
        config = tf.AutoConfig.for_model(model_type, **(small | extra))
        model = tf.AutoModelForCausalLM.from_config(config).eval()
    assert model.config.model_type == model_type
    hint = re.escape(UNSUPPORTED_HINTS[model_type])
    with pytest.raises(UserError, match=f"family '{model_type}' .*not supported by --generate.*{hint}"):
        adapter_for(model)


def _refused_dense(model_type: str) -> torch.nn.Module:
    """A one-layer model of a dense family refused by name (base.UNSUPPORTED_HINTS)."""
    import transformers as tf

    small = {k: v for k, v in _SMALL.items() if k != "head_dim"} | {"num_hidden_layers": 1}
    mla = {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8}
    if model_type == "minicpm3":
        return tf.MiniCPM3ForCausalLM(tf.MiniCPM3Config(**small, **mla, v_head_dim=8)).eval()
    if model_type == "bitnet":
        return tf.BitNetForCausalLM(tf.BitNetConfig(**small)).eval()
    if model_type == "youtu":
        config = tf.YoutuConfig(**small, **mla, v_head_dim=8, eos_token_id=2)
        return tf.YoutuForCausalLM(config).eval()
    return tf.DiffLlamaForCausalLM(tf.DiffLlamaConfig(**(small | {"num_key_value_heads": 2}))).eval()


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        ("minicpm3", "MiniCPM3 attends through multi-head latent attention"),
        ("youtu", "Youtu-LLM attends through multi-head latent attention"),
        ("diffllama", "DiffLlama's differential attention subtracts a second softmax map"),
        ("bitnet", "BitNet b1.58's checkpoints hold ternary weights"),
    ],
)
def test_dense_families_apart_are_refused_saying_why(model_type, why):
    """Dense decoders whose attention trtforge does not compute are refused naming what sets them apart."""
    model = _refused_dense(model_type)
    assert model.config.model_type == model_type
    with pytest.raises(UserError, match=f"family '{model_type}' .*not supported by --generate.*{why}"):
        adapter_for(model)


def test_ministral3_scales_its_queries_and_needs_both_settings():
    """Ministral 3's query scaling (beta, period) is read from rope_parameters and named in the spec; a
    config without llama_4_scaling_beta (transformers' forward fails on it) is refused naming both."""
    model = tiny_model("ministral3")
    adapter = adapter_for(model)
    assert not isinstance(adapter, LlamaStyle)
    assert adapter.query_scaling == QueryScaling("llama4", 0.5, 4)
    scaling = adapter.spec.rotary["query_scaling"]
    assert scaling == {
        "form": "llama4",
        "beta": 0.5,
        "period": 4,
        "nope_only": False,
        "float32": False,
        "promoted": False,
        "from_one": False,
    }
    del model.config.rope_parameters["llama_4_scaling_beta"]
    with pytest.raises(UserError, match="llama_4_scaling_beta=None and original_max_position_embeddings=4"):
        adapter_for(model)


class _ConfigOnly(torch.nn.Module):
    """A module with only the default config of `model_type` (what the refusal reads): the families below
    need no weights to be refused, and several have no CPU path in transformers (Mamba, DeltaNet kernels)."""

    def __init__(self, model_type: str) -> None:
        import transformers as tf
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        super().__init__()
        if model_type not in CONFIG_MAPPING_NAMES:  # (several are new in 5.2x; test-floor runs 5.17)
            pytest.skip(f"transformers {tf.__version__} has no config class for model_type {model_type!r}")
        self.config = tf.AutoConfig.for_model(model_type)


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        ("llama4", "only its text model is supported: load it with Llama4ForCausalLM"),
        ("longcat_flash", "multi-head latent attention"),
        ("sarvam_mla", "multi-head latent attention"),
        ("mimo_v2_flash", "values are narrower than its queries and keys"),
        ("kolibri1_1", "a lightning indexer picks the top-k keys"),
        ("zaya", "Compressed Convolutional Attention"),
        ("minimax_m3_vl_text", "block-sparsely"),
        ("minimax", "lightning attention layers"),
        ("qwen3_next", "Gated DeltaNet linear attention"),
        ("qwen3_5_text", "Gated DeltaNet linear attention"),
        ("qwen3_5_moe_text", "Gated DeltaNet linear attention"),
        ("qwen4_exp_text", "Gated DeltaNet linear attention"),
        ("lara_mini", "Gated DeltaNet linear attention"),
        ("olmo_hybrid", "Gated DeltaNet linear attention"),
        ("kimi_linear", "Kimi Delta Attention"),
        ("nemotron_h", "Mamba-2 state-space mixers"),
        ("lfm2", "gated short convolutions"),
        ("lfm2_moe", "gated short convolutions"),
        ("lfm3", "gated short convolutions"),
        ("inkling_text", "short causal convolutions"),
        ("inkling2_text", "dynamic short convolutions"),
        ("inkling2_loop_text", "looped layers"),
        ("cpmant", "bucketed relative position bias"),
        ("phimoe", "SparseMixer"),
    ],
)
def test_families_apart_are_refused_by_their_config_saying_why(model_type, why, tmp_path):
    """Causal LMs of transformers' mapping whose layers trtforge does not compute (recurrent or convolution
    state, latent or sparse attention, gated or chunked attention, routings of their own) are refused naming
    what sets them apart: a model by its adapter, a save_pretrained directory by its config.json before any
    weight is read (load_causal_lm: what from_pretrained, serve and compile load through)."""
    from trtforge.llm.models.loader import load_causal_lm

    model = _ConfigOnly(model_type)
    assert model.config.model_type == model_type
    with pytest.raises(UserError, match=f"family '{model_type}' .*not supported by --generate.*{why}"):
        adapter_for(model)
    model.config.save_pretrained(tmp_path)  # (config.json only: no weight file)
    with pytest.raises(UserError, match=f"holds a '{model_type}' model; supported causal LMs: .*{why}"):
        load_causal_lm(tmp_path)
