"""Random-weight tiny decoders of every supported family (no downloads), and an HF greedy reference."""

from __future__ import annotations

import functools

import pytest
import torch

from trtforge.llm.models.base import LLAMA_STYLE, SUPPORTED

# Llama relatives the cheap suites cover (the step graph vs HF generate on the legacy exporter, the config
# draws, the window oracle, test_rope_kin's rotary bit for bit): their differences are adapter-level pieces
# (rotary knobs, norms and MLPs of their own modules) which cohere2, in FAMILIES, takes through every
# consumer; the FP16 graphs, kernels and engine builds would run nothing new for them (so too VaultGemma,
# Gemma 2's soft-caps less its post-norms, and BioGPT / XGLM, OPT's learned-position MHA block)
LIGHT_FAMILIES = (
    "olmo",
    "olmo3",
    "cohere",
    "glm",
    "glm4",
    "nemotron",
    "persimmon",
    "helium",
    "ernie4_5",
    "exaone4",
    "hunyuan_v1_dense",
    "apertus",
    "apertus1p5_text",
    "arcee",
    "internlm3",
    "seed_oss",
    "exaone",
    "iquestcoder",
    "cwm",
    "vaultgemma",
    "biogpt",
    "xglm",
    "jais2",
    "hyperclovax",
    "nanochat",
    "granite_swa",
    "ministral3",
    "openai-gpt",
    "modernbert-decoder",
    "gpt-sw3",
    "gpt_neox_japanese",
)
FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gpt2",
    "opt",
    "gemma",
    "olmo2",
    "granite",
    "gpt_neox",
    "phi",
    "gpt_neo",
    "gpt_bigcode",
    "gemma3_text",
    "gemma2",
    "stablelm",
    "smollm3",
    "gptj",
    "codegen",
    "falcon",
    "falcon_40b",
    "falcon_serial",
    "mixtral",
    "cohere2",
    "falcon_rw",
    "bloom",
)
# the sparse mixture-of-experts families (llm.models.mixtral) and their transformers classes
MOE_CLASSES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM"),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM"),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM"),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM"),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
    "dots1": ("Dots1Config", "Dots1ForCausalLM"),
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM"),
    "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM"),
    # (Param2-MoE's and Sarvam-MoE's configs run GLM-4.5's classes, as transformers' auto classes map them)
    "param2moe": ("Param2MoeConfig", "Glm4MoeForCausalLM"),
    "sarvam_moe": ("SarvamMoEConfig", "Glm4MoeForCausalLM"),
    "solar_open": ("SolarOpenConfig", "SolarOpenForCausalLM"),
    "mellum": ("MellumConfig", "MellumForCausalLM"),
    "cohere2_moe": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM"),
    "granitemoe_swa": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM"),
    "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM"),
    "minicpm5_moe": ("MiniCPM5MoeConfig", "MiniCPM5MoeForCausalLM"),
    "kolibri1": ("Kolibri1Config", "Kolibri1ForCausalLM"),
    "hy_v3": ("HYV3Config", "HYV3ForCausalLM"),
    "flint": ("FlintConfig", "FlintForCausalLM"),
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM"),
    "beam": ("BeamConfig", "BeamForCausalLM"),
    "laguna": ("LagunaConfig", "LagunaForCausalLM"),
    "aria_text": ("AriaTextConfig", "AriaTextForCausalLM"),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM"),
}
MOE_FAMILIES = tuple(MOE_CLASSES)
# the families whose layers tensor parallelism does not split (refused by name; tests/llm/models/
# test_rope_families.py checks the refusal, tests/llm/test_tensor_parallel.py splits every other one);
# "falcon" is falcon-7b's multi-query form (one KV head), Falcon's other FORMS split; "gpt_bigcode" its
# multi-query form too (its multi-head one splits)
# (Granite SWA: its attention sinks; gpt-oss's are refused with its MoE MLPs; GPT-1: its post-norm blocks;
# GPT-NeoX-Japanese: its last layer's attention output bias)
TP_REFUSED = (
    *("gpt_bigcode", "gptj", "codegen", "falcon", "granite_swa", "openai-gpt", "modernbert-decoder"),
    "gpt_neox_japanese",
    *MOE_FAMILIES,
)
# forms of one family that tiny_model builds under names of their own: Falcon's other two layer
# architectures ("falcon" itself is falcon-7b's: multi-query, parallel, one input_layernorm)
FORMS: dict[str, tuple[str, dict]] = {
    # falcon-40b/180b: the new decoder architecture, 2 KV groups of the grouped fused QKV, ln_attn + ln_mlp
    "falcon_40b": ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    # the serial block (post_attention_layernorm) with per-head fused QKV (MHA) and biases
    "falcon_serial": ("falcon", {"parallel_attn": False, "multi_query": False, "bias": True}),
    # falcon-rw-1b / 7b: ALiBi position biases (BLOOM's slopes, in bfloat16, over sqrt(head_dim)), the
    # serial block with per-head fused QKV and biases
    "falcon_rw": ("falcon", {"alibi": True, "parallel_attn": False, "multi_query": False, "bias": True}),
}
# families whose attention takes the kernels' path of another in KERNEL_FAMILIES: ALiBi's slopes, which
# BLOOM runs there (their layer math runs on the torch reference: FAMILIES, test_config_variants)
SAME_KERNEL_PATH = ("mpt", "falcon_rw")
# the forms the Triton-executor and CUDA-graph tests run: the fused layers' Llama-style variants (plain,
# Qwen3's head norms, Phi-3's fused projections and partial rotary), every family with another adapter
# but the LIGHT_FAMILIES and SAME_KERNEL_PATH, and the family forms above
# (of the MoE families Mixtral, whose MoE MLPs are one torch path, the attention around it Llama's, and
# gpt-oss for its attention sinks, which the kernels take, and Llama 4 for its attention chunks, likewise;
# tests/llm/models/test_moe_fused.py runs the others' graph-captured decode)
KERNEL_FAMILIES = tuple(
    f
    for f in ("llama", "qwen3", "phi3", *(f for f in SUPPORTED if f not in LLAMA_STYLE), *FORMS)
    if f not in SAME_KERNEL_PATH
    and (f not in MOE_FAMILIES[1:] or f in ("gpt_oss", "llama4_text"))
    and f not in LIGHT_FAMILIES
)
PROMPT_LENS = (1, 3, 9, 17)
# qwen3/phi3 shapes the default configs do not have: a head_dim other than hidden / heads (the
# projections are wider or narrower than hidden), MHA (GQA ratio 1), GQA ratio 4, tied embeddings
HOSTILE_SHAPES = [
    ("qwen3", {"head_dim": 24, "num_key_value_heads": 4, "tie_word_embeddings": True}),
    ("qwen3", {"head_dim": 12, "num_attention_heads": 8, "num_key_value_heads": 2}),
    ("phi3", {"head_dim": 24, "num_key_value_heads": 4, "tie_word_embeddings": True}),
    ("phi3", {"num_attention_heads": 8, "num_key_value_heads": 2, "partial_rotary_factor": 1.0}),
]


ARIA_OLD_LAYOUT = (
    "transformers {version}'s Aria experts are grouped GEMMs (fc1 / fc2), not the fused is_transposed "
    "parameters trtforge reads (transformers 5.25 has them): the family is refused by name there"
)


@functools.cache
def aria_runs_here() -> bool:
    """Whether this transformers has Aria's text model with the fused experts trtforge reads."""
    import transformers as tf

    if not hasattr(tf, "AriaTextConfig"):
        return False
    cfg = tf.AriaTextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, moe_num_experts=4, moe_topk=2,
    )  # fmt: skip
    return aria_experts_fused(tf.AriaTextForCausalLM(cfg))


def aria_experts_fused(model: torch.nn.Module) -> bool:
    """Whether this transformers builds Aria's experts as fused, transposed 3-D parameters (5.25 does; 5.17's
    are fc1 / fc2 grouped GEMMs, which trtforge refuses)."""
    return bool(getattr(model.model.layers[0].mlp.experts, "is_transposed", False))


@functools.cache
def neox_japanese_partial_rotary_runs() -> bool:
    """Whether this transformers' GPT-NeoX-Japanese runs a partial rotary (rotary_pct < 1) itself: 5.17's
    rotary tables span the whole head and its forward fails there, so there is nothing to compare with."""
    import transformers as tf

    cfg = tf.GPTNeoXJapaneseConfig(
        vocab_size=16, hidden_size=32, num_attention_heads=2, num_hidden_layers=1, rotary_pct=0.5
    )
    try:
        with torch.no_grad():
            tf.GPTNeoXJapaneseForCausalLM(cfg).eval()(torch.zeros(1, 3, dtype=torch.long))
    except RuntimeError:
        return False
    return True


def tiny_model(family: str, *, seed: int = 0, **overrides) -> torch.nn.Module:
    """A 2-layer random decoder; initializer_range 0.2 so greedy outputs vary from step to step."""
    import transformers as tf

    family, form = FORMS.get(family, (family, {}))
    overrides = form | overrides
    torch.manual_seed(seed)
    llama_like = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "initializer_range": 0.2,
    }
    if family == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=300,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            initializer_range=0.2,
            bos_token_id=0,
            eos_token_id=0,
        )
        cls = tf.GPT2LMHeadModel
    elif family == "gpt-sw3":  # GPT-2's config and model under GPT-SW3's model type (as from_pretrained
        # keeps a checkpoint's "gpt-sw3"), GELU MLP, a 3x MLP and untied head for a change
        sw3 = {"vocab_size": 300, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "n_inner": 192}
        sw3 |= {"initializer_range": 0.2, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}
        sw3 |= {"activation_function": "gelu"}
        cfg = tf.GPT2Config(**(sw3 | overrides))
        cfg.model_type = "gpt-sw3"
        cls = tf.GPT2LMHeadModel
    elif family == "llama":
        cfg, cls = tf.LlamaConfig(**(llama_like | overrides)), tf.LlamaForCausalLM
    elif family == "mistral":
        cfg, cls = tf.MistralConfig(**(llama_like | overrides)), tf.MistralForCausalLM
    elif family == "qwen2":
        cfg, cls = tf.Qwen2Config(**(llama_like | overrides)), tf.Qwen2ForCausalLM
    elif family == "qwen3":  # per-head q/k norms; head_dim is its own setting (the default is 128)
        cfg, cls = tf.Qwen3Config(**(llama_like | {"head_dim": 16} | overrides)), tf.Qwen3ForCausalLM
    elif family == "phi3":  # fused qkv_proj / gate_up_proj; Phi-4-mini's partial rotary (3/4 of head_dim)
        phi3 = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "partial_rotary_factor": 0.75}
        cfg, cls = tf.Phi3Config(**(llama_like | phi3 | overrides)), tf.Phi3ForCausalLM
    elif family == "ministral":  # per-layer sliding windows (layer_types); its config needs a head_dim
        cfg = tf.MinistralConfig(**(llama_like | {"head_dim": 16} | overrides))
        cls = tf.MinistralForCausalLM
    elif family == "ministral3":  # each query scaled by 1 + 0.5 log(1 + floor(position / 4)) (Ministral
        # 3's period of 16384 would leave every tiny prompt unscaled); window 5 on every layer
        scaling = {"rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.5}
        scaling["original_max_position_embeddings"] = 4
        m3 = {"head_dim": 16, "sliding_window": 5, "rope_parameters": scaling}
        m3 |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if not hasattr(tf, "Ministral3Config"):  # (test-floor runs 5.17)
            pytest.skip(f"transformers {tf.__version__} has no Ministral3Config")
        cfg, cls = tf.Ministral3Config(**(llama_like | m3 | overrides)), tf.Ministral3ForCausalLM
    elif family == "gpt_neo":  # unscaled scores, a local layer whose window is shorter than the prompts
        neo = {"vocab_size": 300, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "window_size": 5}
        neo |= {"attention_types": [[["global", "local"], 1]], "max_position_embeddings": 256}
        neo |= {"initializer_range": 0.2, "bos_token_id": 0, "eos_token_id": 0}
        cfg, cls = tf.GPTNeoConfig(**(neo | overrides)), tf.GPTNeoForCausalLM
    elif family == "modernbert-decoder":  # sliding (window 4 = local_attention 8 // 2) and full layers by
        # turns, a RoPE base each; GeGLU MLP; the prediction head before the decoder projection
        n = overrides.get("num_hidden_layers", llama_like["num_hidden_layers"])
        mb = {k: v for k, v in llama_like.items() if k != "num_key_value_heads"}
        mb |= {"local_attention": 8, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        mb |= {"cls_token_id": 3, "sep_token_id": 4}
        mb["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        mb["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        }
        if not hasattr(tf, "ModernBertDecoderConfig"):
            pytest.skip(f"transformers {tf.__version__} has no ModernBertDecoderConfig")
        cfg, cls = tf.ModernBertDecoderConfig(**(mb | overrides)), tf.ModernBertDecoderForCausalLM
    elif family == "openai-gpt":  # GPT-1: post-norm blocks, learned positions (no bos/eos in its config);
        # an untied head (tied, the tiny model's greedy output repeats one token whatever its init)
        gpt1 = {"vocab_size": 300, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}
        gpt1 |= {"initializer_range": 0.2, "tie_word_embeddings": False}
        cfg, cls = tf.OpenAIGPTConfig(**(gpt1 | overrides)), tf.OpenAIGPTLMHeadModel
    elif family == "gpt_bigcode":  # multi-query c_attn (one key/value head)
        bigcode = {"vocab_size": 300, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}
        bigcode |= {"initializer_range": 0.2, "bos_token_id": 0, "eos_token_id": 0}
        cfg, cls = tf.GPTBigCodeConfig(**(bigcode | overrides)), tf.GPTBigCodeForCausalLM
    elif family == "opt":  # learned positions offset by 2, ReLU; OPT-350m's post-norm and projections
        opt = {"vocab_size": 300, "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2}
        opt |= {"num_attention_heads": 4, "max_position_embeddings": 256, "init_std": 0.2}
        opt |= {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}
        cfg, cls = tf.OPTConfig(**(opt | overrides)), tf.OPTForCausalLM
    elif family == "gemma":  # a head_dim other than hidden / heads, GeGLU, tied and scaled embeddings
        # (a Gemma-wide MLP: with the default width the tied head kept repeating the prompt's last token)
        gemma = {"head_dim": 24, "intermediate_size": 256}
        cfg, cls = tf.GemmaConfig(**(llama_like | gemma | overrides)), tf.GemmaForCausalLM
    elif family == "gemma3_text":  # sliding (window 4, shorter than the prompts) and full layers by turns,
        # a RoPE base each, softmax scale and logit soft-cap far from their no-op values
        n = overrides.get("num_hidden_layers", llama_like["num_hidden_layers"])
        gemma3 = {"head_dim": 16, "intermediate_size": 256, "sliding_window": 4}
        gemma3["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        gemma3["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        }
        gemma3 |= {"query_pre_attn_scalar": 64, "final_logit_softcapping": 8.0, "tie_word_embeddings": False}
        cfg, cls = tf.Gemma3TextConfig(**(llama_like | gemma3 | overrides)), tf.Gemma3ForCausalLM
    elif family == "gemma2":  # Gemma 3's layer shape without q/k norms, one RoPE table, and the attention
        # scores soft-capped: a cap of 3 where the scores reach 6 and more (the scale 16 ** -0.5, not 64's)
        n = overrides.get("num_hidden_layers", llama_like["num_hidden_layers"])
        gemma2 = {"head_dim": 16, "intermediate_size": 256, "sliding_window": 4}
        gemma2["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        gemma2 |= {"query_pre_attn_scalar": 16, "attn_logit_softcapping": 3.0, "final_logit_softcapping": 8.0}
        # (eager: transformers 5.17's default SDPA path drops the cap without a word; 5.2x runs eager)
        gemma2 |= {"tie_word_embeddings": False, "attn_implementation": "eager"}
        cfg, cls = tf.Gemma2Config(**(llama_like | gemma2 | overrides)), tf.Gemma2ForCausalLM
    elif family == "olmo2":  # norms after attention and MLP, q/k norms over the whole projection
        olmo2 = {"pad_token_id": 1, "eos_token_id": 2}  # (its default eos id lies outside the tiny vocab)
        cfg, cls = tf.Olmo2Config(**(llama_like | olmo2 | overrides)), tf.Olmo2ForCausalLM
    elif family == "granite":  # multipliers far from 1, so that one left out changes the tokens
        granite = {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.1}
        granite["logits_scaling"] = 2.0
        cfg, cls = tf.GraniteConfig(**(llama_like | granite | overrides)), tf.GraniteForCausalLM
    elif family == "granite_swa":  # Granite's multipliers (as "granite"), windows, sinks, RoPE bases; a 4x
        # MLP (at 2x, seed 0 repeats one token on the 9-token prompt)
        granite = {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.1}
        granite |= {"logits_scaling": 2.0, "intermediate_size": 256}
        granite |= _granite_swa(overrides.get("num_hidden_layers", llama_like["num_hidden_layers"]))
        cfg, cls = tf.GraniteSWAConfig(**(llama_like | granite | overrides)), tf.GraniteSWAForCausalLM
    elif family == "gpt_neox":  # fused per-head QKV, MHA, Pythia's partial rotary (1/4), parallel residual
        neox = {k: v for k, v in llama_like.items() if k != "num_key_value_heads"} | {"rotary_pct": 0.25}
        cfg, cls = tf.GPTNeoXConfig(**(neox | overrides)), tf.GPTNeoXForCausalLM
    elif family == "gpt_neox_japanese":  # GPT-NeoX's fused per-head QKV (MHA), partial rotary (1/2), the
        # sequential block, a 2x non-gated MLP, the last layer's attention output bias (off zero below)
        neoxj = {k: v for k, v in llama_like.items() if k not in ("num_key_value_heads", "intermediate_size")}
        # (full rotary where this transformers cannot run a partial one: neox_japanese_partial_rotary_runs)
        pct = 0.5 if neox_japanese_partial_rotary_runs() else 1.0
        neoxj |= {"intermediate_multiple_size": 2, "rotary_pct": pct, "bos_token_id": 1, "eos_token_id": 2}
        neoxj |= {"tie_word_embeddings": False}
        cfg = tf.GPTNeoXJapaneseConfig(**(neoxj | overrides))
        cls = tf.GPTNeoXJapaneseForCausalLM
    elif family == "phi":  # one LayerNorm for attention and MLP, Phi-2's partial rotary (0.4) and 4x MLP
        phi = {"partial_rotary_factor": 0.4, "intermediate_size": 256}  # (at 2x, seed 0 repeats one token)
        cfg, cls = tf.PhiConfig(**(llama_like | phi | overrides)), tf.PhiForCausalLM
    elif family == "stablelm":  # LayerNorm, q/k/v biases, per-head q/k LayerNorm, partial rotary (1/4)
        stablelm = {"use_qkv_bias": True, "qk_layernorm": True, "bos_token_id": 0, "eos_token_id": 0}
        cfg, cls = tf.StableLmConfig(**(llama_like | stablelm | overrides)), tf.StableLmForCausalLM
    elif family == "smollm3":  # every 2nd layer NoPE (the default interval, 4, leaves 2 layers all RoPE)
        smol = {"no_rope_layer_interval": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.SmolLM3Config(**(llama_like | smol | overrides)), tf.SmolLM3ForCausalLM
    elif family in ("gptj", "codegen"):  # interleaved rotary on half of each head, parallel block
        # (CodeGen: 2 heads on each of its 4 fused-projection shards, so that its layout shows)
        gptj = {"vocab_size": 300, "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8}
        gptj |= {"n_positions": 256, "initializer_range": 0.2, "bos_token_id": 0, "eos_token_id": 0}
        if family == "codegen":
            gptj |= {"n_head": 8, "rotary_dim": 4}
            cfg, cls = tf.CodeGenConfig(**(gptj | overrides)), tf.CodeGenForCausalLM
        else:
            cfg, cls = tf.GPTJConfig(**(gptj | overrides)), tf.GPTJForCausalLM
    elif family == "falcon":  # falcon-7b: multi-query fused QKV, parallel block, one LayerNorm, tied head
        mlp_kv = ("num_key_value_heads", "intermediate_size")  # (Falcon: num_kv_heads, a 4x MLP)
        falcon = {k: v for k, v in llama_like.items() if k not in mlp_kv}
        falcon |= {"bos_token_id": 0, "eos_token_id": 0}
        cfg, cls = tf.FalconConfig(**(falcon | overrides)), tf.FalconForCausalLM
    elif family in MOE_FAMILIES:  # 4 experts, top-2, a 64-wide expert MLP; router weights at the model's
        # init (0.2) so that routing margins are wide and every expert is hit
        # (num_local_experts and intermediate_size: Mixtral's and GraniteMoE's names)
        local = family in (
            "mixtral",
            "granitemoe",
            "granitemoeshared",
            "granitemoe_swa",
            "gpt_oss",
            "minimax_m2",
            "llama4_text",
        )
        moe = {"num_local_experts" if local else "num_experts": 4, "num_experts_per_tok": 2}
        wide = local or family in ("olmoe", "hunyuan_v1_moe", "flex_olmo", "cohere2_moe")
        moe |= {"intermediate_size": 64} if wide else {"moe_intermediate_size": 64}
        if family in ("granitemoe", "granitemoeshared", "granitemoe_swa"):  # Granite's multipliers far
            # from 1 (as "granite")
            moe |= {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.1}
            moe |= {"logits_scaling": 2.0}
        if family in ("granitemoeshared", "granitemoe_swa"):  # the ungated shared MLP, 96 wide
            moe |= {"shared_intermediate_size": 96}
        if family == "granitemoe_swa":  # Granite SWA's windows, sinks and RoPE bases (as "granite_swa")
            moe |= _granite_swa(overrides.get("num_hidden_layers", llama_like["num_hidden_layers"]))
        if family == "kolibri1":  # K-EXAONE's attention (sliding with RoPE, full NoPE; window 4), every layer
            # sparse with a 64-wide shared MLP, the router's selection bias set below, renormalized
            llama_like = {k: v for k, v in llama_like.items() if k != "intermediate_size"}  # (none: no dense)
            moe |= {"shared_expert_intermediate_size": 64, "norm_topk_prob": True, "head_dim": 16}
            moe |= {"sliding_window": 4, "num_hidden_layers": 3}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        if family == "minicpm5_moe":  # GLM-4.5's routing with 2 expert groups (1 kept), renormalized, scaled
            # by 2.5, one shared expert; layer 0 of 3 dense; the gated attention's q_gate_proj
            moe = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
            moe |= {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True}
            moe |= {"n_group": 2, "topk_group": 1, "num_hidden_layers": 3, "head_dim": 16}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["mlp_layer_types"] = ["dense" if i == 0 else "sparse" for i in range(n)]
        if family == "minimax_m2":  # whole-projection q/k norms (off their init below), half the head rotated
            # (its checkpoints' rotary_dim 64 of 128); the block's selection bias set below
            moe |= {"head_dim": 16, "partial_rotary_factor": 0.5}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if family == "qwen2_moe":  # the shared expert, layer 1 of 3 dense (Qwen2-MoE's own MLP, 128 wide)
            moe |= {"shared_expert_intermediate_size": 96, "num_hidden_layers": 3, "mlp_only_layers": [1]}
        if family == "qwen3_moe":  # every 2nd layer sparse (decoder_sparse_step), the top-2 renormalized
            moe |= {"head_dim": 16, "decoder_sparse_step": 2, "norm_topk_prob": True, "num_hidden_layers": 3}
        if family == "olmoe":  # the top-2 not renormalized (its default), q/k/v clamped
            moe |= {"clip_qkv": 1.5, "pad_token_id": 1, "eos_token_id": 2}
        if family == "gpt_oss":  # sliding (window 4, shorter than the prompts) and full layers by turns,
            # YaRN (factor 4 over 64 trained positions, as gpt-oss's 32 over 4,096), head_dim 16, the
            # SwiGLU clamp at 1 (where the tiny experts' gate/up reach past it; gpt-oss's 7 bounds trained
            # activations), sinks, router and every bias off their init below
            moe |= {"head_dim": 16, "sliding_window": 4, "pad_token_id": 0, "eos_token_id": 2}
            moe["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0}
            moe["rope_parameters"] |= {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
            moe["rope_parameters"]["original_max_position_embeddings"] = 64
            if "swiglu_limit" in getattr(tf.GptOssConfig, "__dataclass_fields__", {}):  # (5.2x: config)
                moe["swiglu_limit"] = 1.0
        if family == "hunyuan_v1_moe":  # moe_topk (its top-k's name), the shared MLP as wide as an expert,
            # HunYuan's q/k norms after the rotary (off their init below)
            moe = {"num_experts": 4, "moe_topk": 2, "intermediate_size": 64, "head_dim": 16}
        if family == "ernie4_5_moe":  # layer 0 of 3 dense (moe_layer_start_index), a shared MLP of 2
            # experts' width, every projection biased; the router and its selection bias off their init below
            moe |= {"num_hidden_layers": 3, "moe_layer_start_index": 1, "moe_num_shared_experts": 2}
            moe |= {"use_bias": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if family == "glm4_moe":  # GLM-4.5: n_routed_experts (its count's name), 2 groups of 2 experts of
            # which the best 1 is kept (so the group limit decides), layer 0 of 3 dense, q/k norms, q/k/v
            # biases, partial rotary (1/2, its default), a routed scale far from 1, one shared expert
            moe = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
            moe |= {"n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "num_hidden_layers": 3}
            moe |= {"use_qk_norm": True, "attention_bias": True, "routed_scaling_factor": 2.5, "head_dim": 16}
            moe |= {"n_shared_experts": 1, "norm_topk_prob": True, "pad_token_id": 0, "eos_token_id": 2}
        if family == "flex_olmo":  # OLMo 2's norms (off their init below), the top-2 renormalized
            moe |= {"norm_topk_prob": True, "pad_token_id": 1, "eos_token_id": 2}
        if family == "exaone_moe":  # K-EXAONE: GLM-4.5's routing without groups, renormalized, scaled by
            # 2.5; per-head q/k norms (off their init below); sliding (window 4, RoPE), full (NoPE), sliding;
            # layer 0 dense
            moe |= {"moe_intermediate_size": 64, "first_k_dense_replace": 1, "num_hidden_layers": 3}
            moe |= {"num_shared_experts": 1, "head_dim": 16, "routed_scaling_factor": 2.5}
            moe["sliding_window"] = 4
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        if family == "dots1":  # dots.llm1: GLM-4.5's routing without groups (its n_group 1), not
            # renormalized (its default), scaled by 2.5; Qwen3's q/k norms (off their init below) and q/k/v/o
            # biases; sliding (window 4, shorter than the prompts), full, sliding; layer 0 dense
            moe = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
            moe |= {"first_k_dense_replace": 1, "num_hidden_layers": 3, "n_shared_experts": 1, "head_dim": 16}
            moe |= {"routed_scaling_factor": 2.5, "attention_bias": True, "sliding_window": 4}
            moe |= {"pad_token_id": 0, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        if family in ("param2moe", "sarvam_moe", "solar_open"):  # GLM-4.5's routing without groups,
            # renormalized, scaled by 2.5, one shared expert; Param2-MoE and Sarvam-MoE: their defaults'
            # whole-head rotary and q/k norms, layer 0 of 3 dense; Solar Open: Llama's attention with q/k/v
            # biases, every layer sparse (whole-head rotary: its Llama attention rotates no partial one)
            moe = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
            moe |= {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True}
            moe |= {"num_hidden_layers": 3, "head_dim": 16, "pad_token_id": 0, "eos_token_id": 2}
            if family == "solar_open":  # (its config has no intermediate_size: no dense MLP)
                llama_like = {k: v for k, v in llama_like.items() if k != "intermediate_size"}
                moe["attention_bias"] = True
            else:
                moe["first_k_dense_replace"] = 1
        if family == "mellum":  # Mellum: Qwen3-MoE's routing (renormalized) and q/k norms (off their init
            # below); sliding (window 4) and full layers by turns, a RoPE base each; layer 0 of 3 dense
            # (whole-head tables: transformers' Mellum attention passes no unrotated channels through)
            moe |= {"head_dim": 16, "sliding_window": 4, "num_hidden_layers": 3}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
            moe["mlp_layer_types"] = ["dense" if i == 0 else "sparse" for i in range(n)]
            moe["rope_parameters"] = {
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            }
        if family == "cohere2_moe":  # Cohere 2's block (its LayerNorm off init below), logits scaled by 1/4;
            # the sigmoid router renormalized; one shared expert averaged with the experts' sum; layer 0 dense
            # (128 wide) and full, rotated all the same (prefix_dense_sliding_window_pattern 1), then sliding
            # (window 4, RoPE) and full (NoPE)
            moe |= {"logit_scale": 0.25, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            moe |= {"num_hidden_layers": 3, "first_k_dense_replace": 1, "prefix_dense_intermediate_size": 128}
            moe |= {"expert_selection_fn": "sigmoid", "num_shared_experts": 1, "sliding_window": 4}
            moe["layer_types"] = ["full_attention", "sliding_attention", "full_attention"]
        if family == "hy_v3":  # HY V3: Apertus' q/k norms (off their init below); GLM-4.5's routing without
            # groups, renormalized, scaled by 2.5, the selection bias on the block (off zero below); one
            # shared expert; layer 0 of 3 dense (its default mlp_layer_types)
            moe |= {"num_shared_experts": 1, "router_scaling_factor": 2.5, "head_dim": 16}
            moe |= {"num_hidden_layers": 3, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if family == "flint":  # Flint: Qwen3-MoE's q/k norms and sinks (off their init below); sliding
            # (window 4, RoPE), full (NoPE), sliding; the sigmoid router renormalized, a 96-wide shared
            # expert, layer 0 of 3 dense
            moe |= {"head_dim": 16, "sliding_window": 4, "num_hidden_layers": 3, "mlp_only_layers": [0]}
            moe |= {"shared_expert_intermediate_size": 96, "norm_topk_prob": True}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        if family == "aria_text":  # Aria text: its own names (moe_num_experts, moe_topk; intermediate_size
            # the expert width), one shared expert as wide, experts stored transposed
            moe = {"moe_num_experts": 4, "moe_topk": 2, "intermediate_size": 64, "moe_num_shared_experts": 1}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if family == "afmoe":  # AFMoE: q/k norms and the four layer norms (off their init below), the
            # attention gate; sliding (window 4, RoPE), full (NoPE), sliding; muP's embedding scale; the
            # routing renormalized, scaled by 2.5, the block's expert_bias (off zero below); one shared
            # expert; layer 0 of 3 dense
            moe |= {"head_dim": 16, "sliding_window": 4, "num_hidden_layers": 3, "num_dense_layers": 1}
            moe |= {"num_shared_experts": 1, "route_scale": 2.5, "mup_enabled": True}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        if family == "beam":  # Beam: the attention gate (its per-head bias off zero below), q/k norms and the
            # four layer norms (off their init below); sliding (window 4, RoPE), full (NoPE, queries scaled by
            # position), sliding; GLM-4.5's routing with 2 expert groups (1 kept), renormalized, scaled by
            # 2.5; layer 0 of 3 dense; logits capped at 8
            moe |= {"head_dim": 16, "sliding_window": 4, "num_hidden_layers": 3}
            moe |= {
                "n_group": 2,
                "topk_group": 1,
                "routed_scaling_factor": 2.5,
                "norm_topk_prob": True,
                "final_logit_softcapping": 8.0,
            }
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
            moe["mlp_layer_types"] = ["dense" if i == 0 else "sparse" for i in range(n)]
        if family == "laguna":  # Laguna: 4, 8 and 2 query heads over 2 KV heads; the per-head softplus
            # gate; q/k norms (off their init below); sliding (window 4, the whole head rotated), full (half
            # the head rotated, its default), sliding; the router's selection bias (off zero below), 2.5 on
            # the experts' sum, a 64-wide shared MLP; layer 0 of 3 dense
            moe |= {
                "head_dim": 16,
                "sliding_window": 4,
                "num_hidden_layers": 3,
                "moe_routed_scaling_factor": 2.5,
            }
            moe |= {
                "shared_expert_intermediate_size": 64,
                "pad_token_id": 0,
                "bos_token_id": 1,
                "eos_token_id": 2,
            }
            n = overrides.get("num_hidden_layers", 3)
            moe["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
            moe["mlp_layer_types"] = ["dense" if i == 0 else "sparse" for i in range(n)]
            moe["num_attention_heads_per_layer"] = [(4, 8, 2)[i % 3] for i in range(n)]
        if family == "llama4_text":  # Llama 4: chunks of 8 positions on the RoPE layers (the prompts and the
            # generations cross several), NoPE every other layer with its queries scaled by 1 + 0.5 log1p(
            # floor((p + 1) / 4)) (Llama 4's floor_scale of 8192 would leave every tiny prompt unscaled),
            # interleaved rotary then weightless q/k RMSNorms; layer 0 dense (128 wide), the others sparse;
            # the experts' inputs scaled by the sigmoid of the top-2 router logits, a 64-wide shared expert
            n = overrides.get("num_hidden_layers", 3)
            moe |= {"head_dim": 16, "num_hidden_layers": 3, "intermediate_size_mlp": 128}
            moe |= {"attention_chunk_size": 8, "no_rope_layer_interval": 2, "moe_layers": list(range(1, n))}
            moe |= {"floor_scale": 4, "attn_scale": 0.5}
            moe["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
            moe |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        # transformers' eager experts (its default, grouped_mm, takes no float64 and, on the CPU, no odd
        # strides): the per-expert loop of its modeling files
        moe["experts_implementation"] = "eager"
        cfg_cls, cls = MOE_CLASSES[family]
        if not hasattr(tf, cfg_cls):  # (Param2-MoE's, Sarvam-MoE's, ...: new in 5.2x; test-floor runs 5.17)
            pytest.skip(f"transformers {tf.__version__} has no {cfg_cls}")
        cfg = getattr(tf, cfg_cls)(**(llama_like | moe | overrides))
        cls = getattr(tf, cls)
    elif family == "olmo":  # non-parametric LayerNorms, q/k/v clipped at 1 (the projections reach ~4)
        olmo = {"clip_qkv": 1.0, "pad_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.OlmoConfig(**(llama_like | olmo | overrides)), tf.OlmoForCausalLM
    elif family == "olmo3":  # OLMo 2's layers, sliding (window 4) and full by turns, a RoPE base each
        n = overrides.get("num_hidden_layers", llama_like["num_hidden_layers"])
        olmo3 = {"pad_token_id": 1, "eos_token_id": 2, "sliding_window": 4}
        olmo3["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        olmo3["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        }
        cfg, cls = tf.Olmo3Config(**(llama_like | olmo3 | overrides)), tf.Olmo3ForCausalLM
    elif family in ("cohere", "cohere2"):  # parallel block, interleaved RoPE, logits scaled by 1/4 (not
        # Command-R's 1/16: the tiny model's logits would sit within a tie); Command-R+'s q/k norms; Cohere 2:
        # sliding (window 4, RoPE) and full (NoPE) layers by turns
        cohere = {"logit_scale": 0.25, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if family == "cohere":
            cfg = tf.CohereConfig(**(llama_like | cohere | {"use_qk_norm": True} | overrides))
            cls = tf.CohereForCausalLM
        else:
            n = overrides.get("num_hidden_layers", llama_like["num_hidden_layers"])
            cohere["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
            cohere["sliding_window"] = 4
            cfg, cls = tf.Cohere2Config(**(llama_like | cohere | overrides)), tf.Cohere2ForCausalLM
    elif family in ("glm", "glm4"):  # partial (1/2) interleaved RoPE, q/k/v biases, fused gate_up
        glm = {"head_dim": 16, "pad_token_id": 0, "eos_token_id": 2}
        if family == "glm":
            cfg, cls = tf.GlmConfig(**(llama_like | glm | overrides)), tf.GlmForCausalLM
        else:  # (a 4x MLP: at 2x, seed 0 repeats one token on the 1-token prompt)
            glm["intermediate_size"] = 256
            cfg, cls = tf.Glm4Config(**(llama_like | glm | overrides)), tf.Glm4ForCausalLM
    elif family == "nemotron":  # LayerNorm1P, squared-ReLU MLP, partial RoPE (1/2)
        nemotron = {"bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.NemotronConfig(**(llama_like | nemotron | overrides)), tf.NemotronForCausalLM
    elif family == "persimmon":  # fused per-head QKV, q/k LayerNorms, squared-ReLU MLP, partial RoPE (1/2)
        persimmon = {k: v for k, v in llama_like.items() if k != "num_key_value_heads"}
        persimmon |= {"bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.PersimmonConfig(**(persimmon | overrides)), tf.PersimmonForCausalLM
    elif family == "helium":  # interleaved RoPE, q/k/v biases
        helium = {"head_dim": 16, "attention_bias": True, "pad_token_id": 0, "bos_token_id": 1}
        helium["eos_token_id"] = 2
        cfg, cls = tf.HeliumConfig(**(llama_like | helium | overrides)), tf.HeliumForCausalLM
    elif family == "ernie4_5":  # interleaved RoPE in float32, every projection biased
        ernie = {"head_dim": 16, "use_bias": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.Ernie4_5Config(**(llama_like | ernie | overrides)), tf.Ernie4_5ForCausalLM
    elif family == "exaone4":  # OLMo 2's post-norms, per-head q/k norms, sliding (window 4, RoPE) and full
        # (NoPE) layers by turns
        n = overrides.get("num_hidden_layers", llama_like["num_hidden_layers"])
        exaone = {"head_dim": 16, "sliding_window": 4, "bos_token_id": 1, "eos_token_id": 2}
        exaone["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        cfg, cls = tf.Exaone4Config(**(llama_like | exaone | overrides)), tf.Exaone4ForCausalLM
    elif family == "hunyuan_v1_dense":  # per-head q/k norms after the rotary
        hunyuan = {"head_dim": 16, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.HunYuanDenseV1Config(**(llama_like | hunyuan | overrides)), tf.HunYuanDenseV1ForCausalLM
    elif family == "apertus":  # per-head q/k norms, xIELU non-gated MLP, llama3 rotary (its default kind)
        apertus = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        apertus["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0}
        apertus["rope_parameters"] |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
        apertus["rope_parameters"]["original_max_position_embeddings"] = 64
        cfg, cls = tf.ApertusConfig(**(llama_like | apertus | overrides)), tf.ApertusForCausalLM
    elif family == "apertus1p5_text":  # Apertus' layers (as "apertus") under Apertus 1.5's text config
        if not hasattr(tf, "Apertus1p5TextConfig"):  # (new in transformers 5.2x; test-floor runs 5.17)
            pytest.skip(f"transformers {tf.__version__} has no Apertus1p5TextConfig")
        apertus = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        apertus["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0}
        apertus["rope_parameters"] |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
        apertus["rope_parameters"]["original_max_position_embeddings"] = 64
        cfg = tf.Apertus1p5TextConfig(**(llama_like | apertus | overrides))
        cls = tf.Apertus1p5TextForCausalLM
    elif family == "arcee":  # Llama with a squared-ReLU non-gated MLP
        arcee = {"bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.ArceeConfig(**(llama_like | arcee | overrides)), tf.ArceeForCausalLM
    elif family == "internlm3":  # Llama's own classes under model_type "internlm3"
        if not hasattr(tf, "InternLM3Config"):  # (new in transformers 5.2x; test-floor runs 5.17)
            pytest.skip(f"transformers {tf.__version__} has no InternLM3Config")
        cfg = tf.InternLM3Config(**(llama_like | {"head_dim": 16} | overrides))
        cls = tf.LlamaForCausalLM
    elif family == "seed_oss":  # q/k/v biases (its default) without an output bias, head_dim its own
        seed = {"head_dim": 24, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.SeedOssConfig(**(llama_like | seed | overrides)), tf.SeedOssForCausalLM
    elif family == "bloom":  # ALiBi with 4 heads (slopes 1/4 .. 1/256), the embeddings' LayerNorm,
        # per-head fused QKV, the normed input as the residual (with 8 heads, or without it, seed 0 repeats
        # one token; at eps 1e-5 one FP16 pick of 48 sits within FP16's noise and flips)
        bloom = {"vocab_size": 300, "hidden_size": 64, "n_layer": 2, "n_head": 4, "initializer_range": 0.2}
        bloom |= {"apply_residual_connection_post_layernorm": True, "layer_norm_epsilon": 1e-3}
        bloom |= {"bos_token_id": 0, "eos_token_id": 0}
        cfg, cls = tf.BloomConfig(**(bloom | overrides)), tf.BloomForCausalLM
    elif family == "mpt":  # ALiBi (alibi_bias_max 8), bias-free LayerNorms and projections, clip_qkv
        mpt = {"vocab_size": 300, "d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 256}
        mpt |= {"initializer_range": 0.2, "bos_token_id": 0, "eos_token_id": 0}
        mpt["attn_config"] = {"clip_qkv": 0.6} | overrides.pop("attn_config", {})
        cfg, cls = tf.MptConfig(**(mpt | overrides)), tf.MptForCausalLM
    elif family in ("exaone", "iquestcoder"):  # Llama's own classes under model_types of their own
        name = {"exaone": "ExaoneConfig", "iquestcoder": "IQuestCoderConfig"}[family]
        if not hasattr(tf, name):  # (new in transformers 5.2x; test-floor runs 5.17)
            pytest.skip(f"transformers {tf.__version__} has no {name}")
        ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        head = {"head_dim": 24} if family == "iquestcoder" else {}  # (IQuest-Coder's head_dim is its own)
        cfg, cls = getattr(tf, name)(**(llama_like | ids | head | overrides)), tf.LlamaForCausalLM
    elif family == "cwm":  # Llama with windows by layer_types (full, then sliding at window 4: its default
        # pattern, 1 full layer of 4) under a llama3 rotary (its default kind)
        cwm = {"head_dim": 16, "sliding_window": 4, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cwm["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0}
        cwm["rope_parameters"] |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
        cwm["rope_parameters"]["original_max_position_embeddings"] = 64
        cfg, cls = tf.CwmConfig(**(llama_like | cwm | overrides)), tf.CwmForCausalLM
    elif family == "jais2":  # Llama with LayerNorms and a non-gated squared-ReLU MLP (biases: its default)
        jais2 = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.Jais2Config(**(llama_like | jais2 | overrides)), tf.Jais2ForCausalLM
    elif family == "hyperclovax":  # Granite's multipliers far from 1 (as "granite"), post-norms, the logits
        # multiplied by logits_scaling
        hcx = {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.1}
        hcx |= {"logits_scaling": 0.5, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.HyperCLOVAXConfig(**(llama_like | hcx | overrides)), tf.HyperCLOVAXForCausalLM
    elif family == "nanochat":  # weightless norms (the embeddings' too), q/k norms after a reversed rotary,
        # squared-ReLU fc1/fc2 MLP, logits capped at 8 (nanochat's 15 would not bite the tiny logits)
        nano = {"final_logit_softcapping": 8.0, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        cfg, cls = tf.NanoChatConfig(**(llama_like | nano | overrides)), tf.NanoChatForCausalLM
    elif family == "vaultgemma":  # Gemma 2's tiny model without its post-norms: sliding (window 4) and
        # full layers by turns, attention scores capped at 3, logits at 8 (eager: as gemma2)
        n = overrides.get("num_hidden_layers", llama_like["num_hidden_layers"])
        vault = {"head_dim": 16, "intermediate_size": 256, "sliding_window": 4}
        vault["layer_types"] = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
        vault |= {"query_pre_attn_scalar": 16, "attn_logit_softcapping": 3.0, "final_logit_softcapping": 8.0}
        vault |= {"tie_word_embeddings": False, "attn_implementation": "eager"}
        cfg, cls = tf.VaultGemmaConfig(**(llama_like | vault | overrides)), tf.VaultGemmaForCausalLM
    elif family == "biogpt":  # learned positions offset by 2, scaled embeddings, pre-LayerNorm, GELU
        biogpt = {k: v for k, v in llama_like.items() if k != "num_key_value_heads"}
        biogpt |= {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": False}
        cfg, cls = tf.BioGptConfig(**(biogpt | overrides)), tf.BioGptForCausalLM
    elif family == "xglm":  # sinusoidal positions offset by 2, scaled embeddings, the query pre-scaled
        xglm = {"vocab_size": 300, "d_model": 64, "ffn_dim": 128, "num_layers": 2, "attention_heads": 4}
        xglm |= {"max_position_embeddings": 256, "init_std": 0.2, "pad_token_id": 1, "bos_token_id": 0}
        xglm |= {"eos_token_id": 2, "tie_word_embeddings": False}
        cfg, cls = tf.XGLMConfig(**(xglm | overrides)), tf.XGLMForCausalLM
    elif family == "starcoder2":  # LayerNorm, GELU MLP with biases, one window for every layer
        cfg, cls = tf.Starcoder2Config(**(llama_like | overrides)), tf.Starcoder2ForCausalLM
    else:
        raise ValueError(family)
    model = cls(cfg).eval()
    if family == "aria_text" and not aria_experts_fused(model):
        pytest.skip(ARIA_OLD_LAYOUT.format(version=tf.__version__))
    if family == "hy_v3":  # the routers at the initializer range, the block's selection bias off zero
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer.mlp, "e_score_correction_bias"):
                    layer.mlp.gate.weight.normal_(0.0, 0.2)
                    bias = layer.mlp.e_score_correction_bias
                    bias.copy_(torch.randn_like(bias) * 0.2)
    if family == "afmoe":  # the routers at the initializer range, the blocks' expert_bias off zero
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer.mlp, "expert_bias"):
                    layer.mlp.router.gate.weight.normal_(0.0, 0.2)
                    layer.mlp.expert_bias.copy_(torch.randn_like(layer.mlp.expert_bias) * 0.2)
    if family == "beam":  # the attention gates' per-head biases (initialized at zero) off zero
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.gate_bias.normal_(0.0, 1.0)
    if family == "flint":  # the routers at the initializer range
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer.mlp, "gate"):
                    layer.mlp.gate.weight.normal_(0.0, 0.2)
    if family in ("granite_swa", "granitemoe_swa", "flint"):  # sinks (initialized at zero) off their init
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.randn_like(layer.self_attn.sinks) * 1.5 + 1.0)
    if family == "gpt_oss":  # sinks of the size trained ones reach (transformers initializes them at the
        # initializer range), biases off zero; the clamp at 1 where transformers 5.17 fixes it at 7
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.randn_like(layer.self_attn.sinks) * 1.5 + 1.0)
                layer.mlp.experts.limit = 1.0
            for name, param in model.named_parameters():
                if name.endswith("bias"):
                    param.add_(torch.randn_like(param) * 0.2)
    # routers (initialized at zero) at the initializer range, the selection biases (zero) as wide as the
    # scores' spread, so that they change picks
    if family in (
        *("ernie4_5_moe", "glm4_moe", "dots1", "exaone_moe", "param2moe", "sarvam_moe", "solar_open"),
        *("minicpm5_moe", "kolibri1", "beam", "laguna"),
    ):
        with torch.no_grad():
            for layer in model.model.layers:
                gate = getattr(layer.mlp, "gate", None)
                if gate is not None:
                    gate.weight.normal_(0.0, 0.2)
                    owner = getattr(gate, "moe_statics", gate)
                    bias = owner.e_score_correction_bias
                    bias.copy_(torch.randn_like(bias) * (0.1 if family == "ernie4_5_moe" else 0.2))
    if family == "minimax_m2":  # (its selection bias on the block, its router at the model's init already)
        with torch.no_grad():
            for layer in model.model.layers:
                bias = layer.mlp.e_score_correction_bias
                bias.copy_(torch.randn_like(bias) * 0.2)
    if family in (  # norm weights off their init
        *("hunyuan_v1_moe", "glm4_moe", "dots1", "flex_olmo", "exaone_moe"),
        *("param2moe", "sarvam_moe", "solar_open", "mellum", "cohere2_moe", "minimax_m2"),
        *("minicpm5_moe", "kolibri1", "hy_v3", "flint", "afmoe", "beam", "laguna", "llama4_text"),
    ):
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.add_(torch.randn_like(param) * 0.2)
    if family == "openai-gpt":  # its LayerNorms (ln_1, ln_2) off their init
        with torch.no_grad():
            for name, param in model.named_parameters():
                if ".ln_" in name:
                    param.add_(torch.randn_like(param) * 0.2)
    if family in ("gemma", "olmo2", "gemma3_text", "gemma2"):  # norm weights off their init: (1 + w) != w
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.add_(torch.randn_like(param) * 0.2)
    if family in (
        *("olmo3", "glm4", "cohere", "cohere2", "nemotron", "exaone4", "hunyuan_v1_dense", "apertus"),
        *("jais2", "hyperclovax", "apertus1p5_text"),
    ):
        # norm weights off their init (a swapped, skipped or misplaced norm shows)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.add_(torch.randn_like(param) * 0.2)
    if family == "gpt_neox_japanese":  # the last layer's attention output bias (zero at init) off zero
        with torch.no_grad():
            for layer in model.gpt_neox_japanese.layers:
                if layer.attention.dense_bias is not None:
                    layer.attention.dense_bias.normal_(0.0, 0.2)
    if family in ("gpt_neox", "gpt_neox_japanese", "phi", "stablelm", "persimmon"):  # LayerNorm weights and
        # biases off their init (a swapped norm shows; StableLM's per-head q/k norms each their own)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.add_(torch.randn_like(param) * 0.2)
    if family in ("gptj", "codegen", "falcon", "bloom", "mpt", "biogpt", "xglm", "gpt-sw3"):  # LayerNorm
        # weights and biases off 1 / 0 (a swapped or skipped norm, or a bias left out, shows: GPT-J's LM-head
        # bias, Falcon's ln_attn against ln_mlp)
        with torch.no_grad():
            for module in model.modules():
                for name, param in module.named_parameters(recurse=False):
                    if isinstance(module, torch.nn.LayerNorm) or name == "bias":
                        param.add_(torch.randn_like(param) * 0.2)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _granite_swa(layers: int) -> dict:
    """Granite SWA's options for `layers` layers: window 4 (shorter than the prompts) on its default layer
    types (every 4th layer full), RoPE bases 10000, 0 (NoPE) and 100 by turns."""
    swa = {"sliding_window": 4, "layer_rope_theta": [(10000.0, 0, 100.0)[i % 3] for i in range(layers)]}
    return swa | {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def prompts(vocab: int, lens=PROMPT_LENS, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def hf_greedy(model, prompt: list[int], new: int) -> tuple[list[int], torch.Tensor]:
    """HF generate(do_sample=False) on one unpadded prompt: new tokens and raw logits [new, V]."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits).float()


def llama_factory():
    """`module:factory` form for the CLI: (model, example_inputs); --generate ignores the inputs."""
    return tiny_model("llama"), None


def marking_llama_factory():
    """llama_factory that first creates the file $TRTFORGE_TEST_LOADED names: a test sees whether (and in
    which process) the model was loaded."""
    import os

    open(os.environ["TRTFORGE_TEST_LOADED"] + f".{os.getpid()}", "x").close()
    return llama_factory()


def gpt2_factory():
    return tiny_model("gpt2"), None


def qwen3_factory():
    return tiny_model("qwen3"), None


def phi3_factory():
    return tiny_model("phi3"), None


def gpt_neox_factory():
    return tiny_model("gpt_neox", use_parallel_residual=False), None


def phi_factory():
    return tiny_model("phi", qk_layernorm=True), None


def gemma_factory():
    return tiny_model("gemma"), None


def gemma3_text_factory():
    return tiny_model("gemma3_text"), None


def gemma2_factory():
    return tiny_model("gemma2"), None


def olmo2_factory():
    return tiny_model("olmo2"), None


def granite_factory():
    return tiny_model("granite"), None


def opt_factory():
    return tiny_model("opt", do_layer_norm_before=False, word_embed_proj_dim=48), None


def gpt_neo_factory():
    return tiny_model("gpt_neo"), None


def gpt_bigcode_factory():
    return tiny_model("gpt_bigcode"), None


def stablelm_factory():
    return tiny_model("stablelm", use_parallel_residual=True), None


def smollm3_factory():
    return tiny_model("smollm3"), None


def gptj_factory():
    return tiny_model("gptj"), None


def codegen_factory():
    return tiny_model("codegen"), None


def falcon_factory():
    return tiny_model("falcon"), None


def falcon_40b_factory():
    return tiny_model("falcon_40b"), None


def falcon_serial_factory():
    return tiny_model("falcon_serial"), None


def falcon_rw_factory():
    return tiny_model("falcon_rw"), None


def mixtral_factory():
    return tiny_model("mixtral"), None


def llama4_factory():
    """Llama 4 text: chunked attention on its RoPE layers (chunks of 8), input-scaled MoE experts."""
    return tiny_model("llama4_text"), None


def gpt_oss_factory():
    return tiny_model("gpt_oss"), None


def qwen2_moe_factory():
    return tiny_model("qwen2_moe"), None


def glm4_moe_factory():
    return tiny_model("glm4_moe"), None


def cohere2_factory():
    return tiny_model("cohere2"), None


def olmo3_factory():
    return tiny_model("olmo3"), None


def starcoder2_factory():
    return tiny_model("starcoder2", sliding_window=6), None


def ministral_factory():
    return tiny_model(
        "ministral", sliding_window=6, layer_types=["sliding_attention", "full_attention"]
    ), None


def bloom_factory():
    return tiny_model("bloom"), None


def mpt_factory():
    return tiny_model("mpt"), None


def mpt_no_alibi_factory():
    """MPT asking for learned positions (attn_config.alibi false), which transformers' MPT ignores."""
    return tiny_model("mpt", attn_config={"alibi": False}), None


def unsupported_factory():
    """An unsupported family (DiffLlama: no adapter, its differential attention) for the error path."""
    import transformers as tf

    cfg = tf.DiffLlamaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    return tf.DiffLlamaForCausalLM(cfg).eval(), None
