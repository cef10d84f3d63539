"""What every family adapter shares: the decoder spec, the family checks, the one sliding-window rule,
rotary application, and the adapter base class both consumers drive.

An adapter's layer math is layout-agnostic: hidden states ``[..., H]`` in, heads ``[..., heads, D]``
out. The step-graph export (``llm.compile.step``) runs it on ``[B, S, H]`` and transposes the heads to
``[B, heads, S, D]``; the torch executor runs it on the flat tokens ``[T, H]`` of a ragged step.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

import torch
from torch import Tensor, nn

from trtforge.errors import UserError
from trtforge.llm.models import parallel
from trtforge.llm.models.gate import OutputGate
from trtforge.llm.models.moe import SparseMoe, refuse_moe

LLAMA_STYLE = (
    "llama",
    "mistral",
    "ministral",
    "qwen2",
    "qwen3",
    "phi3",
    "starcoder2",
    "internlm3",
    "seed_oss",
    "arcee",
    "exaone",
    "iquestcoder",
    "cwm",
    "jais2",
)
GPT2_STYLE = ("gpt2", "gpt-sw3", "gpt_neo", "gpt_bigcode")
# which models tensor parallelism splits (the start of every refusal's message)
TP_RULE = (
    "tensor parallelism splits the families whose attention projects q/k/v separately (q_proj/k_proj/v_proj),"
    " fused as [q | k | v] (Phi-3's qkv_proj, MPT's Wqkv, GPT-2's c_attn) or per head as [heads, 3, D] "
    "(GPT-NeoX's, Persimmon's, BLOOM's, Falcon's multi-head query_key_value, GPT-BigCode's multi-head c_attn)"
    " or by KV group (falcon-40b/180b's, whole groups a rank), with an output o_proj/dense/out_proj/c_proj, "
    "q/k norms per head (or OLMo 2's RMSNorm over the whole projection), rotary positions or ALiBi slopes, "
    "and a dense MLP (its module's, or OPT's on the layer) of gate/up/down, up/down, fc1/fc2, c_fc/c_proj, "
    "dense_h_to_4h/dense_4h_to_h or a fused gate_up_proj;"
)
# each adapter module's families and what sets them apart, as errors list them (families.ADAPTERS maps
# each family to its adapter class; a test holds the two to the same families)
STYLES: dict[tuple[str, ...], str] = {
    LLAMA_STYLE: "Llama-style: RoPE, pre-norm blocks, GQA",
    GPT2_STYLE: "learned positions, LayerNorm, GELU; GPT-SW3 is GPT-2's model under a model type of its own; "
    "GPT-Neo's local layers, GPT-BigCode's multi-query",
    ("openai-gpt",): "GPT-1 (OpenAIGPTLMHeadModel): GPT-2's Conv1D layers and learned positions in "
    "post-LayerNorm blocks (a LayerNorm after each residual add, none before the head)",
    ("modernbert-decoder",): "ModernBERT-Decoder (Ettin): a LayerNorm on the embeddings, pre-LayerNorm "
    "blocks with a Wi/Wo GeGLU MLP, sliding and full layers by layer_types with a RoPE table each, a "
    "prediction head (dense, activation, LayerNorm) before the decoder projection",
    ("opt",): "learned positions, LayerNorm before or after each sublayer, ReLU",
    ("biogpt", "xglm"): "BioGPT / XGLM: OPT's pre-LayerNorm block with scaled embeddings; BioGPT's learned "
    "positions, XGLM's sinusoidal ones",
    ("gpt_neox",): "Pythia: fused per-head QKV, partial RoPE, LayerNorm, parallel or serial residual",
    ("gpt_neox_japanese",): "GPT-NeoX-Japanese: GPT-NeoX's fused per-head QKV, partial RoPE and serial "
    "block, the last layer's attention output bias",
    ("phi",): "Phi-1/1.5/2: one LayerNorm feeding attention and MLP in parallel, partial RoPE",
    ("gemma",): "Gemma 1 / CodeGemma: scaled embeddings, RMSNorm by 1 + weight, GeGLU",
    ("gemma2",): "Gemma 2 (Gemma2ForCausalLM): Gemma's norms and GeGLU, norms after attention and MLP, "
    "sliding and full layers, soft-capped attention scores and final logits",
    ("vaultgemma",): "VaultGemma: Gemma 2 without its norms after attention and MLP (soft-capped attention "
    "scores and logits, sliding and full layers)",
    ("gemma3_text",): "Gemma 3 text (Gemma3ForCausalLM): Gemma's norms and GeGLU, per-head q/k norms, norms "
    "after attention and MLP, sliding and full layers with a RoPE base each, soft-capped final logits",
    ("ministral3",): "Ministral 3: Mistral with each query scaled by its position (1 + "
    "llama_4_scaling_beta * log(1 + floor(position / original_max_position_embeddings)))",
    ("olmo2",): "OLMo 2: RMSNorm after attention and MLP, whole-projection q/k norms",
    ("granite",): "Granite 3.x: Llama with embedding, residual, attention and logits multipliers",
    ("granite_swa", "granitemoe_swa"): "Granite SWA / GraniteMoeSWA: Granite's and GraniteMoeShared's layers "
    "with sliding and full layers by layer_types, attention sinks, a RoPE base per layer (layer_rope_theta; "
    "0: NoPE)",
    ("hyperclovax",): "HyperCLOVA X: Granite's multipliers, norms after attention and MLP (use_post_norm), "
    "logits multiplied by logits_scaling",
    ("stablelm",): "StableLM-2 / stable-code: LayerNorm, partial RoPE, optional per-head q/k LayerNorm "
    "and parallel residual",
    ("smollm3",): "SmolLM3: Llama with NoPE layers (no_rope_layers) and per-layer windows (layer_types)",
    ("gptj", "codegen"): "GPT-J / CodeGen: one LayerNorm feeding attention and MLP in parallel, interleaved "
    "(rotate-every-two) RoPE on the first rotary_dim channels from a fixed sinusoid table",
    ("olmo",): "OLMo 1: non-parametric LayerNorm, optional q/k/v clipping (clip_qkv), float32 RoPE",
    ("olmo3",): "OLMo 3: OLMo 2's layers with sliding and full layers, a RoPE table each",
    ("cohere",): "Command-R: one LayerNorm feeding attention and MLP in parallel, interleaved RoPE, optional "
    "per-head q/k LayerNorm, scaled logits",
    (
        "cohere2",
    ): "Command-R7B / Command A: Command-R's block, sliding layers with RoPE and full layers without",
    ("glm", "glm4"): "GLM-4 / GLM-4-0414: partial interleaved RoPE, fused gate_up MLP, q/k/v biases; glm4's "
    "norms after attention and MLP",
    ("nemotron",): "Nemotron-4 / Minitron: LayerNorm1P (1 + weight), squared-ReLU MLP, partial RoPE",
    ("persimmon",): "Persimmon: fused per-head QKV, per-head q/k LayerNorm, squared-ReLU MLP, partial RoPE",
    ("helium", "ernie4_5"): "Helium / ERNIE 4.5 dense: Llama with interleaved RoPE (ERNIE's in float32)",
    ("exaone4",): "EXAONE 4: OLMo 2's norms after attention and MLP, per-head q/k norms, sliding layers with "
    "RoPE and full layers without",
    ("hunyuan_v1_dense",): "HunYuan dense: Llama with per-head q/k norms after the RoPE",
    ("hunyuan_v1_moe",): "HunYuan-MoE: HunYuan's attention, sparse MoE MLPs (its gate's own router dtype, "
    "renormalized top-k) with an ungated shared MLP",
    ("ernie4_5_moe",): "ERNIE 4.5-MoE: ERNIE 4.5's attention, sparse MoE MLPs (float32 router, top-k chosen "
    "with e_score_correction_bias, renormalized) with an ungated shared MLP, dense layers by "
    "moe_layer_interval / start / end",
    ("apertus", "apertus1p5_text"): "Apertus / Apertus 1.5 text: Llama with per-head q/k norms and a "
    "non-gated (xIELU) MLP (Apertus 1.5's LM head whole or pruned to the text vocabulary)",
    ("nanochat",): "NanoChat: weightless RMSNorms (one on the embeddings), per-head q/k norms after a "
    "reversed RoPE, a non-gated fc1/fc2 MLP, soft-capped logits",
    ("mixtral",): "Mixtral: Mistral's attention, sparse mixture-of-experts MLPs (top-k routing, "
    "renormalized)",
    ("kolibri1",): "Kolibri-1: K-EXAONE's attention (per-head q/k norms, sliding layers with RoPE and full "
    "layers without) in GLM-4-0414's block (norms after attention and MLP), sparse MoE MLPs and a shared MLP "
    "routed by the top-k of the logits plus e_score_correction_bias, weighted by their sigmoid",
    ("minicpm5_moe",): "MiniCPM5-MoE: Llama's attention with each head's output gated by a sigmoid of its "
    "query projection's gate half (q_gate_proj), GLM-4.5's sparse MoE MLPs and shared MLP, dense layers by "
    "mlp_layer_types",
    ("minimax_m2",): "MiniMax-M2: Mixtral's layers without a window, RMSNorms over the whole q and k "
    "projections, partial RoPE, sparse MoE MLPs routed by sigmoid scores with e_score_correction_bias, "
    "renormalized",
    ("qwen2_moe",): "Qwen2-MoE: Qwen2's attention, sparse MoE MLPs with a sigmoid-gated shared expert, "
    "optional dense layers (mlp_only_layers, decoder_sparse_step)",
    ("qwen3_moe",): "Qwen3-MoE: Qwen3's attention with per-head q/k norms, sparse MoE MLPs, optional dense "
    "layers",
    ("olmoe",): "OLMoE: whole-projection q/k norms, clip_qkv, sparse MoE MLPs",
    ("glm4_moe",): "GLM-4.5: partial RoPE, q/k/v biases, optional per-head q/k norms, sparse MoE MLPs routed "
    "by sigmoid scores with e_score_correction_bias over expert groups (n_group, topk_group), scaled by "
    "routed_scaling_factor, an ungated shared MLP, dense first layers (first_k_dense_replace)",
    ("param2moe", "sarvam_moe"): "Param2-MoE / Sarvam-MoE: GLM-4.5's model (Glm4MoeForCausalLM) under "
    "configs of their own (the whole head rotated, q/k norms on by default)",
    ("solar_open",): "Solar Open: Llama's attention, GLM-4.5's sparse MoE MLPs and shared MLP on every layer",
    ("exaone_moe",): "K-EXAONE: EXAONE 4's attention (per-head q/k norms, sliding layers with RoPE and full "
    "layers without) in a pre-norm block, GLM-4.5's sparse MoE MLPs, dense layers by mlp_layer_types",
    ("flex_olmo",): "FlexOLMo: OLMo 2's layers (whole-projection q/k norms, norms after attention and MLP) "
    "with sparse MoE MLPs routed as OLMoE's",
    ("mellum",): "Mellum: Qwen3-MoE's attention and sparse MoE MLPs, windows by layer_types with a RoPE "
    "table each, dense layers by mlp_layer_types",
    ("dots1",): "dots.llm1: Qwen3's attention with per-head q/k norms and windows by layer_types, GLM-4.5's "
    "sparse MoE MLPs",
    ("hy_v3",): "HY V3: Apertus' attention (per-head q/k norms), GLM-4.5's sigmoid routing with a selection "
    "bias (no expert groups), renormalized, scaled by router_scaling_factor, an ungated shared MLP, dense "
    "layers by mlp_layer_types",
    ("flint",): "Flint: Qwen3-MoE's attention with attention sinks and windows by layer_types, sparse MoE "
    "MLPs routed by float32 sigmoid scores, an ungated shared expert, dense layers by mlp_only_layers",
    ("afmoe",): "AFMoE (Arcee Trinity): per-head q/k norms, a sigmoid gate on the attention output, norms "
    "before and after attention and MLP, windows by layer_types (NoPE full layers), muP's embedding scale, "
    "sparse MoE MLPs routed by sigmoid scores with the block's expert_bias, renormalized, scaled by "
    "route_scale, an ungated shared MLP, dense first layers",
    ("beam",): "Beam: per-head q/k norms, each head's attention output gated by a sigmoid of gate_proj plus "
    "a bias per head, windows by layer_types (sliding layers rotated, NoPE full layers whose queries are "
    "scaled by position), norms before and after attention and MLP with depth-scaled residual adds, "
    "GLM-4.5's sparse MoE MLPs (no shared MLP, a float32 SwiGLU), dense layers by mlp_layer_types, "
    "soft-capped logits",
    ("laguna",): "Laguna: per-head q/k norms, a rotary table per layer type (partial by its own factor), "
    "windows by layer_types, each layer's own query head count (num_attention_heads_per_layer) over one KV "
    "head count, each attention output gated by a float32 softplus of g_proj (per head or per channel), "
    "sparse MoE MLPs routed by sigmoid scores with e_score_correction_bias, renormalized, scaled on the "
    "experts' sum, an ungated shared MLP, dense layers by mlp_layer_types",
    ("llama4_text",): "Llama 4 text (Llama4ForCausalLM): chunked attention (attention_chunk_size) on the "
    "layers layer_types marks chunked_attention, NoPE layers (no_rope_layers) with position-scaled queries "
    "(attn_temperature_tuning), interleaved rotary then weightless q/k RMSNorms (use_qk_norm), sparse MoE "
    "MLPs whose experts' inputs are scaled by the sigmoid of the router's top-k logits, an ungated shared "
    "expert, dense layers intermediate_size_mlp wide",
    ("aria_text",): "Aria text: Llama's attention, every MLP sparse (a softmax over the top-k router logits "
    "in the model's dtype, experts stored transposed) with an ungated shared MLP",
    ("granitemoe", "granitemoeshared"): "GraniteMoE / GraniteMoeShared: Granite's multipliers, sparse MoE "
    "MLPs routed by a softmax over the top-k router logits; GraniteMoeShared's ungated shared MLP beside "
    "them",
    ("cohere2_moe",): "Cohere 2-MoE: Cohere 2's parallel block and windows, sparse MoE MLPs routed by a "
    "softmax or a sigmoid over the top-k router logits, shared experts added or averaged, dense layers by "
    "mlp_layer_types",
    ("gpt_oss",): "gpt-oss (dequantized from MXFP4 on load): attention sinks, sliding and full layers, YaRN "
    "rotary, q/k/v/o biases, sparse MoE MLPs (biased router, top-k then softmax, biased experts with a "
    "clamped SwiGLU)",
    ("falcon",): "Falcon: falcon-7b's multi-query, falcon-40b/180b's grouped KV (new decoder architecture), "
    "parallel or serial blocks with RoPE; falcon-rw's ALiBi position biases (alibi=True)",
    ("bloom",): "BLOOM / BLOOMZ: ALiBi position biases, LayerNorm after the embeddings, per-head fused QKV, "
    "GELU",
    ("mpt",): "MPT (mpt-7b, Replit code): ALiBi position biases (alibi_bias_max), bias-free LayerNorm and "
    "projections, optional clip_qkv",
}
SUPPORTED = tuple(t for types in STYLES for t in types)
# unsupported model types whose refusal says what to load instead (after the supported list)
UNSUPPORTED_HINTS: dict[str, str] = {
    "gemma3": "'gemma3' is Gemma 3's multimodal model (Gemma3ForConditionalGeneration: a vision tower and "
    "image tokens); only its text model is supported: load a text-only Gemma 3 checkpoint (gemma-3-270m, "
    "gemma-3-1b; model_type 'gemma3_text') with Gemma3ForCausalLM.",
    "llama4": "'llama4' is Llama 4's multimodal model (Llama4ForConditionalGeneration: a vision tower and "
    "image tokens); only its text model is supported: load it with Llama4ForCausalLM (model_type "
    "'llama4_text', the checkpoint's text_config).",
    # mixture-of-experts families beside the supported ones (mixtral, qwen2_moe, qwen3_moe, olmoe, granitemoe,
    # granitemoeshared, gpt_oss, hunyuan_v1_moe, ernie4_5_moe, glm4_moe, param2moe, sarvam_moe, solar_open,
    # dots1, flex_olmo, exaone_moe, mellum, cohere2_moe, granitemoe_swa), refused for what sets them apart
    "phimoe": "PhiMoE (Phi-3.5-MoE) routes by SparseMixer: in eval mode the top expert and then the second, "
    "each weighted by a softmax over only the logits within 2 x router_jitter_noise (relative) of it, which "
    "no SparseMoe routing computes yet; and Phi-3.5-MoE's rotary is LongRoPE, whose tables switch with the "
    "sequence length, which trtforge's rotary tables refuse.",
    "deepseek_v2": "DeepSeek-V2 attends through multi-head latent attention (compressed KV with a decoupled "
    "rotary part), which trtforge's KV cache and kernels do not hold, and routes by expert groups.",
    "deepseek_v3": "DeepSeek-V3 attends through multi-head latent attention (compressed KV with a decoupled "
    "rotary part), which trtforge's KV cache and kernels do not hold (its routing, sigmoid scores with a "
    "correction bias over expert groups, is GLM-4.5's, which is supported).",
    "dbrx": "DBRX's router normalizes its top-k weights by a p-norm (moe_normalize_expert_weights) and its "
    "fused Wqkv and experts have a layout of their own; not implemented.",
    "youtu": "Youtu-LLM attends through multi-head latent attention (DeepSeek-V3's: compressed KV with a "
    "decoupled rotary part), which trtforge's KV cache and kernels do not hold.",
    "jetmoe": "JetMoE routes its attention heads too (a mixture of attention experts), which trtforge's "
    "attention does not.",
    "longcat_flash": "LongCat-Flash attends through multi-head latent attention (compressed KV with a "
    "decoupled rotary part), which trtforge's KV cache and kernels do not hold, and runs two attention and "
    "MLP sublayers a layer beside a shortcut MoE with zero-computation experts.",
    "sarvam_mla": "Sarvam-MLA (DeepseekV3ForCausalLM under a config of its own) attends through multi-head "
    "latent attention (compressed KV with a decoupled rotary part), which trtforge's KV cache and kernels do "
    "not hold.",
    "mimo_v2_flash": "MiMo-V2-Flash's values are narrower than its queries and keys (v_head_dim under "
    "head_dim) and its sliding layers hold twice the KV heads of its full ones, with attention sinks, which "
    "trtforge's KV cache (one head size and KV head count for every layer) does not hold.",
    "kolibri1_1": "Kolibri-1.1 attends sparsely: a lightning indexer picks the top-k keys each query sees, "
    "and layers share their KV, which trtforge's attention and KV cache do not compute.",
    "zaya": "ZAYA attends through Compressed Convolutional Attention: q and k mixed by a causal convolution "
    "over time and v from a delayed recurrent state, which trtforge's KV cache does not hold.",
    "minimax_m3_vl_text": "MiniMax-M3's text model attends block-sparsely (a lightning indexer keeps the "
    "top-scoring key blocks of each query), which trtforge's attention does not compute; and it is the text "
    "half of a vision-language model.",
    # hybrid decoders whose other layers are recurrent (linear attention, state-space, convolutions): state a
    # paged KV cache does not hold
    "minimax": "MiniMax-Text-01 interleaves lightning attention layers (linear attention with a recurrent "
    "state) with softmax attention, which trtforge's KV cache and kernels do not hold.",
    "qwen3_next": "Qwen3-Next's layers are mostly Gated DeltaNet linear attention (a recurrent state and a "
    "causal convolution a layer), with output-gated softmax attention between them, which trtforge's KV "
    "cache and kernels do not hold.",
    "qwen3_5_text": "Qwen3.5's text model is mostly Gated DeltaNet linear attention layers (a recurrent "
    "state and a causal convolution a layer), which trtforge's KV cache and kernels do not hold.",
    "qwen3_5_moe_text": "Qwen3.5-MoE's text model is mostly Gated DeltaNet linear attention layers (a "
    "recurrent state and a causal convolution a layer), which trtforge's KV cache and kernels do not hold.",
    "qwen4_exp_text": "Qwen4-Exp's text model has Gated DeltaNet linear attention layers (a recurrent state "
    "and a causal convolution a layer) and a sparse-attention indexer, which trtforge's KV cache and kernels "
    "do not hold.",
    "lara_mini": "Lara-Mini has Gated DeltaNet linear attention layers (a recurrent state and a causal "
    "convolution a layer) beside its softmax attention, which trtforge's KV cache and kernels do not hold.",
    "olmo_hybrid": "OLMo Hybrid's layers are mostly Gated DeltaNet linear attention (a recurrent state and a "
    "causal convolution a layer), which trtforge's KV cache and kernels do not hold.",
    "kimi_linear": "Kimi Linear's layers are mostly Kimi Delta Attention (linear attention with a recurrent "
    "state), its others multi-head latent attention, neither of which trtforge's KV cache and kernels hold.",
    "nemotron_h": "Nemotron-H's layers are mostly Mamba-2 state-space mixers (hybrid_override_pattern), "
    "whose recurrent state and convolution trtforge's KV cache and kernels do not hold.",
    "lfm2": "LFM2's layers are mostly gated short convolutions (a rolling convolution state a layer, "
    "layer_types 'conv'), which trtforge's KV cache does not hold.",
    "lfm2_moe": "LFM2-MoE's layers are mostly gated short convolutions (a rolling convolution state a layer, "
    "layer_types 'conv'), which trtforge's KV cache does not hold.",
    "lfm3": "LFM3's layers are mostly gated short convolutions (a rolling convolution state a layer), which "
    "trtforge's KV cache does not hold.",
    "inkling_text": "Inkling's text model runs short causal convolutions over its keys, values and layer "
    "inputs (a rolling state a layer), which trtforge's KV cache does not hold; and it is the text half of "
    "a multimodal model.",
    "inkling2_text": "Inkling 2's text model runs dynamic short convolutions over its keys and values (a "
    "rolling state a layer) and a learned relative position bias, which trtforge's KV cache and attention "
    "do not hold.",
    "inkling2_loop_text": "Inkling 2 Loop's text model runs a span of its layers several passes (looped "
    "layers, gated), with Inkling 2's short convolutions and relative position bias, which trtforge's "
    "layer-by-layer KV cache and attention do not hold.",
    # dense decoders beside the supported ones, refused for what sets them apart
    "cpmant": "CPM-Ant adds a bucketed relative position bias (position_bias_num_buckets) to its attention "
    "scores and prepends prompt and segment embeddings, which trtforge's attention does not compute.",
    "ergo": "Ergo's experts are non-gated squared-ReLU MLPs each followed by an RMSNorm of its own "
    "(post_expert_norm, one weight row an expert), its shared expert normed too, which trtforge's MoE MLPs "
    "(gated experts, unnormed) do not compute.",
    "doge": "Doge attends through dynamic mask attention (a learned per-key bias from its values, dt_proj "
    "and A, keeping the keep_window_size best keys of each query) and routes its cross-domain MoE over "
    "product keys (two top-k over halves of the router logits, single-neuron experts), which trtforge's "
    "attention and MoE MLPs do not compute.",
    # multi-head latent attention and sparse-attention indexers (DeepSeek-V3 / V3.2 relatives)
    "axk1": "A.X-K1 is DeepSeek-V3 (with a norm after each MoE block): it attends through multi-head latent "
    "attention (compressed KV with a decoupled rotary part), which trtforge's KV cache and kernels do not "
    "hold.",
    "glm4_moe_lite": "GLM-4.7-Flash (glm4_moe_lite) attends through multi-head latent attention "
    "(DeepSeek-V3's compressed KV with a decoupled rotary part), which trtforge's KV cache and kernels do "
    "not hold (its routing is GLM-4.5's, which is supported).",
    "axk2": "A.X-K2 is DeepSeek-V3.2: multi-head latent attention (compressed KV with a decoupled rotary "
    "part) whose keys a lightning indexer sparsifies (each query attends to its top-k keys by the indexer's "
    "scores), neither of which trtforge's KV cache and kernels compute.",
    "glm_moe_dsa": "GLM-5 (glm_moe_dsa) attends through DeepSeek-V3.2's sparse attention: multi-head latent "
    "attention (compressed KV with a decoupled rotary part) over the top-k keys a lightning indexer picks "
    "for each query, neither of which trtforge's KV cache and kernels compute.",
    "dots3_note_text": "dots.3-note's text model attends through DeepSeek-V3.2's sparse attention: "
    "multi-head latent attention (compressed KV with a decoupled rotary part) over the top-k keys a "
    "lightning indexer picks for each query, neither of which trtforge's KV cache and kernels compute.",
    "hy_v4": "HY V4 attends through multi-head latent attention over the keys a lightning indexer picks "
    "(DeepSeek-V3.2's sparse attention) and mixes several residual streams by hyper-connections "
    "(DeepSeek-V4's), none of which trtforge's KV cache, kernels and blocks compute.",
    # hybrid state-space models: recurrent layers beside (or instead of) attention
    "falcon_h1": "Falcon-H1 runs a Mamba-2 state-space mixer in parallel with attention in every layer; "
    "trtforge's KV cache and kernels hold attention keys and values only (no recurrent SSM state).",
    "bamba": "Bamba interleaves Mamba-2 state-space layers with its attention layers; trtforge's KV cache "
    "and kernels hold attention keys and values only (no recurrent SSM state).",
    "granitemoehybrid": "Granite 4.0 (granitemoehybrid) interleaves Mamba-2 state-space layers with its "
    "attention layers (layer_types); trtforge's KV cache and kernels hold attention keys and values only (no "
    "recurrent SSM state).",
    # dense decoders beside the supported ones, refused for what sets them apart
    "cohere_compass_text": "CohereCompass's text model (North) is Cohere 2's parallel block inside "
    "Qwen3-VL's text model: multimodal RoPE tables per layer type (mrope_section; rotate-half, not Cohere's "
    "interleaved pairs; NoPE types by rope_parameters) and DeepStack visual features added to its first "
    "layers; not implemented.",
    "gemma4_unified_text": "Gemma 4 unified's text model norms its values (a weightless RMSNorm), attends "
    "with an unscaled softmax after its q/k norms, may reuse keys as values (attention_k_eq_v) or an earlier "
    "layer's keys and values (num_kv_shared_layers), and lets vision tokens attend bidirectionally; not "
    "implemented.",
    "ctrl": "CTRL (CTRLLMHeadModel) adds a sinusoidal position table to sqrt(d_model)-scaled embeddings "
    "ahead of pre-LayerNorm blocks of biased multi-head attention (Wq/Wk/Wv/dense) and a ReLU MLP; not "
    "implemented.",
    "gemma3n_text": "Gemma 3n's text model runs AltUp (several predicted hidden-state streams a layer), "
    "LAuReL residuals, per-layer input embeddings, layers that reuse an earlier layer's keys and values "
    "(num_kv_shared_layers) and activation sparsity, which trtforge's blocks and KV cache do not compute.",
    "gemma4_text": "Gemma 4's text model feeds every layer a per-layer input embedding "
    "(hidden_size_per_layer_input), lets later layers reuse an earlier layer's keys and values "
    "(num_kv_shared_layers), may reuse keys as values (attention_k_eq_v) and norms the values, which "
    "trtforge's blocks and KV cache do not compute.",
    "dory": "Dory is a looped normalized transformer (nGPT): hidden states kept on the unit sphere and moved "
    "by learned per-channel step sizes, its layers run in loops whose earlier passes read the cache without "
    "writing it, which trtforge's blocks and KV cache do not compute.",
    "hrm_text": "HRM-Text is a hierarchical recurrent model: its two transformer stacks (H and L) run in "
    "nested cycles (H_cycles x L_cycles, each pass its own cache slot) with instruction tokens attending "
    "bidirectionally (prefix_lm), which trtforge's one-pass causal decoder does not compute.",
    "blt": "BLT (Byte Latent Transformer) is not one decoder: a byte-level local encoder and decoder around "
    "a global transformer over entropy-based patches (an entropy model, cross-attention between bytes and "
    "patches, hash n-gram embeddings), which trtforge's decoder step does not compute.",
    "minicpm3": "MiniCPM3 attends through multi-head latent attention (low-rank compressed q and KV with a "
    "decoupled rotary part), which trtforge's KV cache and kernels do not hold.",
    "diffllama": "DiffLlama's differential attention subtracts a second softmax map (by a learned lambda) "
    "and norms each head group, which trtforge's attention does not compute.",
    "bitnet": "BitNet b1.58's checkpoints hold ternary weights (packed 2 bits a weight with a scale, or BF16 "
    "master weights that transformers' AutoBitLinear quantizes online) and quantize every projection's input "
    "to 8 bits per token (transformers' BitLinear), which trtforge's projections do not compute; its "
    "checkpoints run as trained only through those quantized layers.",
}
# families whose attention applies no sliding window or chunk, whatever the config says
UNWINDOWED = (
    "llama",
    "gpt2",
    "gpt-sw3",
    "gpt_bigcode",
    "openai-gpt",
    "opt",
    "gpt_neox",
    "gpt_neox_japanese",
    "phi",
    "gemma",
    "olmo2",
    "granite",
    "stablelm",
    "gptj",
    "codegen",
    "falcon",
    "olmoe",
    "granitemoe",
    "granitemoeshared",
    "olmo",
    "cohere",
    "glm",
    "glm4",
    "nemotron",
    "persimmon",
    "helium",
    "ernie4_5",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "ernie4_5_moe",
    "glm4_moe",
    "param2moe",
    "sarvam_moe",
    "solar_open",
    "flex_olmo",
    "minimax_m2",
    "minicpm5_moe",
    "apertus",
    "apertus1p5_text",
    "hy_v3",
    "aria_text",
    "internlm3",
    "seed_oss",
    "arcee",
    "exaone",
    "iquestcoder",
    "jais2",
    "hyperclovax",
    "nanochat",
    "bloom",
    "mpt",
    "biogpt",
    "xglm",
)
# families whose forward picks each layer's mask by config.layer_types (the others: one mask for all)
PER_LAYER_TYPES = (
    "ministral",
    "qwen2",
    "qwen3",
    "smollm3",
    "gemma2",
    "gemma3_text",
    "olmo3",
    "cohere2",
    "exaone4",
    "qwen2_moe",
    "gpt_oss",
    "cwm",
    "vaultgemma",
    "dots1",
    "exaone_moe",
    "mellum",
    "cohere2_moe",
    "kolibri1",
    "modernbert-decoder",
    "granite_swa",
    "granitemoe_swa",
    "flint",
    "afmoe",
    "beam",
    "laguna",
)
_LAYER_TYPES = ("full_attention", "sliding_attention")
# families whose forward attends in chunks on the layers config.layer_types marks "chunked_attention"
CHUNKED = ("llama4_text",)
_CHUNK_TYPES = ("full_attention", "chunked_attention")


@dataclass
class DecoderSpec:
    """What the step graph and the generation loop need to know about a model (the manifest section)."""

    family: str
    model_type: str
    #: the logits' width (the LM head's rows)
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    positions: str  # "rotary" | "learned"
    rotary: dict[str, Any] | None
    max_positions: int | None
    sliding_windows: list[int | None]
    #: each layer's attention logit soft-cap (None: off; Gemma 2's attn_logit_softcapping)
    attn_softcaps: list[float | None]
    #: each layer's ALiBi slopes, one per query head (None: no position bias; BLOOM, MPT, falcon-rw)
    alibi_slopes: list[list[float] | None]
    #: each layer's attention-sink logits, one per query head (None: no sinks; gpt-oss)
    attn_sinks: list[list[float] | None]
    bos_token_id: int | None
    eos_token_ids: list[int] = field(default_factory=list)
    #: each layer's MLP kind: "dense" (the model's own MLP) or "moe" (a sparse mixture of experts:
    #: :mod:`.moe`)
    mlp_kinds: list[str] = field(default_factory=list)
    #: the MoE layers' routing and sizes (:meth:`.moe.SparseMoe.describe` of the first), with ``by_layer``
    #: listing every layer's value (None for dense layers) of each field that differs between them (e.g.
    #: HunYuan's per-layer ``moe_topk``); None without MoE layers
    moe: dict[str, Any] | None = None
    #: the attention output gate (:meth:`.gate.OutputGate.describe`; None: ungated)
    output_gate: dict[str, Any] | None = None
    #: each layer's query head count where the layers' differ (Laguna's); None: num_heads on every layer
    num_heads_per_layer: list[int] | None = None
    #: the ids the embedding takes (config.vocab_size); wider than vocab_size where the LM head is pruned to
    #: a prefix of the vocabulary (Apertus 1.5's output_vocab_size); None: vocab_size
    input_vocab_size: int | None = None
    #: each layer's attention chunk size C (None: not chunked; :func:`attention_chunks`): a query at
    #: position p sees only the keys j <= p with j // C == p // C (Llama 4's chunked layers); empty: no layer
    #: is chunked
    attention_chunks: list[int | None] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _describe_moe(moe: list[SparseMoe | None]) -> dict[str, Any] | None:
    """:attr:`DecoderSpec.moe`: the first MoE layer's description, plus ``by_layer`` for the fields the
    layers do not share."""
    described = [None if m is None else m.describe() for m in moe]
    first = next((d for d in described if d is not None), None)
    if first is None:
        return None
    varies = [k for k in first if any(d is not None and d[k] != first[k] for d in described)]
    if varies:
        first["by_layer"] = {k: [None if d is None else d[k] for d in described] for k in varies}
    return first


def token_ids(value: Any, vocab: int, what: str) -> list[int]:
    """The ids in `value` (one id, a list of them or None) that lie in a vocabulary of `vocab` tokens;
    UserError naming `what` (the key) for one that is not an integer: transformers does not validate a
    generation_config.json, whose "eos_token_id": "x" failed int() as an internal error, and int() would
    read "5", 2.7 or true as ids."""
    ids = value if isinstance(value, (list, tuple)) else [value]
    if any(i is not None and (not isinstance(i, numbers.Integral) or isinstance(i, bool)) for i in ids):
        raise UserError(f"{what} must be a token id (an integer), a list of them or null; got {value!r}.")
    return [int(i) for i in ids if i is not None and 0 <= i < vocab]


def eos_token_ids(model: Any) -> list[int]:
    """Every end-of-sequence id of `model` its LM head can emit: its config's and its generation config's
    (transformers' generate() stops at the latter's; Llama 3 lists several there). An id at or past the
    logits' width (:func:`logits_width`: a head pruned to a prefix of the vocabulary) is never sampled, so
    it is dropped rather than kept as a stop id that cannot fire."""
    config, width = model.config, logits_width(model)
    ids = token_ids(config.eos_token_id, width, "the model config's eos_token_id (config.json)")
    generation = getattr(model, "generation_config", None)
    what = "the model's generation config eos_token_id (generation_config.json)"
    more = token_ids(getattr(generation, "eos_token_id", None), width, what)
    return ids + [i for i in dict.fromkeys(more) if i not in ids]


def output_head(model: Any) -> nn.Module | None:
    """The LM head of a HF causal LM: what its ``get_output_embeddings()`` returns (GPT-NeoX's ``embed_out``
    before transformers 5, ``lm_head`` elsewhere), else its ``lm_head`` attribute; None for a bare model."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if head is not None else getattr(model, "lm_head", None)


def logits_width(model: Any) -> int:
    """The width of `model`'s logits: its LM head's rows (``out_features``; a vocab-parallel head's whole
    ``vocab``). Narrower than ``config.vocab_size`` where the head is pruned to a prefix of the vocabulary
    (Apertus 1.5's ``output_vocab_size``); ``config.vocab_size`` for a model without a readable head."""
    head = output_head(model)
    rows = getattr(head, "out_features", None)
    if rows is None:
        rows = getattr(head, "vocab", None)
    return int(rows) if rows is not None else int(model.config.vocab_size)


def model_type_of(model: Any, user: str = "--generate") -> str:
    """The HF `config.model_type` of `model`, or UserError naming what is supported (by `user`, the
    option or executor that asks)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model, nn.Module) or model_type is None:
        raise UserError(
            f"{user} needs a Hugging Face causal LM (a transformers PreTrainedModel with a config); got "
            f"{type(model).__name__}. Supported families: {', '.join(SUPPORTED)}."
        )
    if model_type not in SUPPORTED:
        styles = "; ".join(f"{', '.join(types)} ({what})" for types, what in STYLES.items())
        hint = UNSUPPORTED_HINTS.get(model_type)
        raise UserError(
            f"model family '{model_type}' ({type(model).__name__}) is not supported by {user}. Supported "
            f"families: {styles}." + (f" {hint}" if hint else "")
        )
    if output_head(model) is None:
        raise UserError(
            f"{type(model).__name__} has no lm_head: {user} needs the causal-LM class "
            f"(e.g. {'GPT2LMHeadModel' if model_type in ('gpt2', 'gpt-sw3') else 'AutoModelForCausalLM'}), "
            "not the bare model."
        )
    return model_type


def refuse_unapplied_window(model: nn.Module, length: int, limit: str, user: str = "--generate") -> None:
    """UserError when the config of an :data:`UNWINDOWED` family sets a sliding window (or attention chunk)
    shorter than `length` (the `limit` option's value): their attention applies none, yet transformers'
    generate() cache truncates the keys to it, so HF's forward and generate() disagree past it."""
    c = model.config
    if c.model_type not in UNWINDOWED:
        return
    for name in ("sliding_window", "attention_chunk_size"):
        window = getattr(c, name, None)
        _check_positive(f"{c.model_type} config", name, window)  # (else "pass <= -4" below)
        if isinstance(window, int) and not isinstance(window, bool) and window < length:
            raise UserError(
                f"{c.model_type} model {type(model).__name__}: its config sets {name}={window}, shorter "
                f"than {limit} {length}. {c.model_type}'s attention applies no window, but transformers' "
                f"generate() cache truncates the keys to it, so the two disagree past {window} tokens and "
                f"{user} cannot match transformers. Pass {limit} <= {window}, or set {name} to null in "
                "config.json."
            )


def sliding_windows(config: Any, num_layers: int) -> list[int | None]:
    """Each layer's sliding-attention window (None: full attention), as transformers' forward applies it
    (its masks: ``masking_utils.create_sliding_window_causal_mask`` reads ``config.sliding_window``).

    - the :data:`UNWINDOWED` families (llama, gpt2, gpt_neox, phi, ...): none (see
      :func:`refuse_unapplied_window` for a window their config sets anyway);
    - mistral, phi3, starcoder2, mixtral, qwen3_moe: ``config.sliding_window`` on every layer, or none
      when it is null (their forward ignores ``layer_types``);
    - ministral, qwen2, qwen3, smollm3, gemma2, gemma3_text, olmo3, cohere2, exaone4, qwen2_moe, gpt_oss,
      cwm, vaultgemma, dots1, exaone_moe, mellum, cohere2_moe, kolibri1, modernbert-decoder, granite_swa,
      granitemoe_swa, flint, afmoe, beam, laguna: the window on the layers ``config.layer_types`` marks
      "sliding_attention" (CWM's config marks 3 of 4 by default, VaultGemma's every other, Granite SWA's 3 of
      4; qwen's config builds those from ``use_sliding_window`` and ``max_window_layers``; with
      ``use_sliding_window`` false it nulls ``sliding_window``, Qwen2-MoE's sets it to 0, read as null.
      SmolLM3's marks its NoPE layers when ``use_sliding_window`` is set; its eager and SDPA masks then
      follow ``layer_types`` and ``sliding_window`` alone, as this rule does).
    UserError where transformers' forward would fail or attend to nothing: a sliding layer without a
    window, an unknown layer type, a window below 1.
    """
    model_type = config.model_type
    if model_type in UNWINDOWED:
        return [None] * num_layers
    if model_type == "gpt_neo":
        return _gpt_neo_windows(config, num_layers)
    window = getattr(config, "sliding_window", None)
    if model_type == "qwen2_moe" and window == 0:  # its config's "none" (use_sliding_window false)
        window = None
    where = f"{model_type} config"
    _check_positive(where, "sliding_window", window)
    if model_type not in PER_LAYER_TYPES:
        return [window] * num_layers
    types = _layer_types(config, num_layers, _LAYER_TYPES, where)
    if window is None and "sliding_attention" in types[:num_layers]:
        hint = (
            " (use_sliding_window is false)" if getattr(config, "use_sliding_window", True) is False else ""
        )
        raise UserError(
            f"{where}: layer_types marks sliding_attention layers but sliding_window is null{hint}; "
            "transformers' forward cannot build their mask. Set sliding_window, or mark them full_attention."
        )
    return [window if t == "sliding_attention" else None for t in types[:num_layers]]


#: the sizes a supported config has (under these names or its attribute_map's; null where a family leaves
#: one to its default) that no model can have below 1
_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
)

#: the keys the families' configs name their norms' epsilon by
_EPSILONS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon")


def refuse_bidirectional(model: Any, user: str) -> None:
    """UserError where `model`'s config asks for bidirectional attention (``is_causal`` false, null or
    0): transformers' mask functions then let every token attend to later ones (an encoder-style
    decoder, e.g. one turned into an embedding model), which causal generation and the KV cache cannot
    reproduce. Before, it ran causally: tokens other than transformers' without a word."""
    c = model.config
    if not getattr(c, "is_causal", True):
        raise UserError(
            f"{user} cannot run this {c.model_type} model {type(model).__name__}: its config sets "
            f"is_causal={c.is_causal!r} (bidirectional attention: every token attending to later ones), "
            "which causal generation cannot reproduce. Supported: causal models (is_causal unset or true)."
        )


def check_config_sizes(config: Any) -> None:
    """UserError naming the config.json key (as the family spells it: GPT-2's ``n_layer``) of a size below
    1 (no layers: transformers builds an empty model, which has no attention to read; an MLP of
    intermediate_size 0), of a norm's epsilon below 0, of a rotary setting no table can be built from
    (:func:`_check_rope`), or of a KV head count that does not divide the query heads (transformers'
    attention cannot share them out): checked before any weight is read, so the user hears of the key,
    not of a tensor shape deep in the model."""
    where = f"{config.model_type} config"
    for name in _SIZES:
        _check_positive(where, _stored_key(config, name), getattr(config, name, None))
    for name in _EPSILONS:  # (below 0 the norm takes the root of a negative: NaN logits, every token id 0)
        eps = getattr(config, name, None)
        if isinstance(eps, (int, float)) and not isinstance(eps, bool) and not eps >= 0:
            raise UserError(f"{where}: {name} must be a number >= 0, got {eps!r}.")
    _check_rope(config, where)
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise UserError(
            f"{where}: {_stored_key(config, 'num_key_value_heads')}={kv} does not divide "
            f"{_stored_key(config, 'num_attention_heads')}={heads}; each KV head must serve "
            "the same number of query heads."
        )


def _check_rope(config: Any, where: str) -> None:
    """UserError naming the key of a rotary setting no table can be built from: a base (``rope_theta``)
    not a finite number > 0 (transformers' inverse frequencies ``theta ** -(2i/d)`` turn NaN or grow without
    bound), a scaling ``factor`` not a finite number > 0 (the positions or frequencies are divided by it),
    or a ``partial_rotary_factor`` outside (0, 1] (no channel rotated, or more than the head has). Read
    from the config's attributes and its ``rope_parameters`` (``rope_scaling`` before transformers 5),
    whole or per layer type (Gemma 3's); null values, and a layer type's null entry (NoPE), mean default."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    entries: list[tuple[str, dict[str, Any]]] = [
        ("", {k: v for k, v in vars(config).items() if k in _ROPE_TOP})
    ]
    if isinstance(params, dict):
        if params and all(isinstance(v, dict) or v is None for v in params.values()):  # per layer type
            entries += [(f"rope_parameters.{t}.", dict(v)) for t, v in params.items() if v is not None]
        else:
            entries.append(("", dict(params)))
    known = _rope_types()
    for prefix, entry in entries:
        kind = entry.get("rope_type")
        if kind is not None and kind not in known:  # (transformers fails building the model on it: KeyError)
            where_key = prefix or "rope_parameters."
            raise UserError(f"{where}: {where_key}rope_type must be one of {sorted(known)}, got {kind!r}.")
        for key, (low, high, expected) in _ROPE_KEYS.items():
            value = entry.get(key)
            if value is None:
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and low < value <= high and math.isfinite(value)):
                name = _ROPE_STORED.get((config.model_type, key), key)
                prefix = prefix or ("rope_parameters." if key == "factor" else "")
                raise UserError(f"{where}: {prefix}{name} must be {expected}, got {value!r}.")


def _rope_types() -> set[str]:
    """The rotary types transformers builds a table for (its ROPE_INIT_FUNCTIONS, and "default")."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return {"default", *ROPE_INIT_FUNCTIONS}


#: the rotary settings :func:`_check_rope` bounds: key -> (exclusive low, inclusive high, what is expected)
_ROPE_KEYS = {
    "rope_theta": (0.0, math.inf, "a finite number > 0 (the RoPE base)"),
    "factor": (0.0, math.inf, "a finite number > 0 (the rotary scaling factor)"),
    "partial_rotary_factor": (0.0, 1.0, "a number in (0, 1] (the fraction of each head rotated)"),
}

# the rotary keys a config may also hold as attributes of its own (beside rope_parameters)
_ROPE_TOP = ("rope_theta", "partial_rotary_factor")

# rotary keys a family's config.json spells otherwise (transformers moves them into rope_parameters)
_ROPE_STORED = {("gpt_neox", "partial_rotary_factor"): "rotary_pct"}


# config.json keys that configs read through a property of the standard name (Falcon's num_kv_heads)
_STORED_AS = {"num_key_value_heads": ("num_kv_heads", "n_head_kv", "multi_query_group_num")}


def _stored_key(config: Any, name: str) -> str:
    """The config.json key that holds the standard attribute `name`, as the family spells it: through its
    ``attribute_map`` (GPT-2's ``n_layer``), or its own key where it has one (Falcon's ``num_kv_heads``,
    which its hub checkpoints hold alone; transformers 5 writes the standard name beside it)."""
    mapped = (getattr(config, "attribute_map", {}) or {}).get(name)
    if mapped:
        return mapped
    stored = vars(config)
    return next((alt for alt in _STORED_AS.get(name, ()) if alt in stored), name)


def _check_positive(where: str, name: str, value: Any) -> None:
    """UserError unless a config's key-bounding size `name` is null or an integer >= 1."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise UserError(f"{where}: {name} must be null or an integer >= 1, got {value!r}.")


def _layer_types(config: Any, num_layers: int, allowed: tuple[str, ...], where: str) -> list[str]:
    """The config's ``layer_types`` (all "full_attention" without one); UserError unless it names one of
    `allowed` for each of the `num_layers` layers."""
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * num_layers)
    if len(types) < num_layers or any(t not in allowed for t in types):
        raise UserError(
            f"{where}: layer_types must name one of {list(allowed)} for each of its {num_layers} "
            f"layers, got {types!r}."
        )
    return types


def attention_chunks(config: Any, num_layers: int) -> list[int | None]:
    """Each layer's attention chunk size (None: not chunked), as transformers' forward applies it (its
    masks: ``masking_utils.create_chunked_causal_mask`` reads ``config.attention_chunk_size``): a query at
    position p sees only the keys j <= p of its own chunk, ``j // C == p // C`` (not a sliding window: the
    first query of a chunk sees itself alone). The :data:`CHUNKED` families (Llama 4's text model) chunk the
    layers ``config.layer_types`` marks "chunked_attention" (its config marks the RoPE layers of
    ``no_rope_layers`` while ``attention_chunk_size`` is set); every other family: none.
    UserError where transformers' forward would fail: an unknown layer type, a chunked layer without a
    chunk size, a chunk size below 1."""
    if config.model_type not in CHUNKED:
        return [None] * num_layers
    where = f"{config.model_type} config"
    chunk = getattr(config, "attention_chunk_size", None)
    _check_positive(where, "attention_chunk_size", chunk)
    types = _layer_types(config, num_layers, _CHUNK_TYPES, where)
    if chunk is None and "chunked_attention" in types[:num_layers]:
        raise UserError(
            f"{where}: layer_types marks chunked_attention layers but attention_chunk_size is null; "
            "transformers' forward cannot build their mask. Set attention_chunk_size, or mark them "
            "full_attention."
        )
    return [chunk if t == "chunked_attention" else None for t in types[:num_layers]]


def softmax_scale(attention: nn.Module, head_dim: int) -> float:
    """The attention module's softmax scale: its ``scaling`` where transformers keeps one, else
    1/sqrt(head_dim), which the versions without it (GPT-J, CodeGen, Falcon in 5.17) divide the scores by."""
    scaling = getattr(attention, "scaling", None)
    return float(scaling) if scaling is not None else float(head_dim) ** -0.5


def attention_softcap(config: Any, user: str = "--generate") -> float | None:
    """The attention logit soft-cap a config sets (``attn_logit_softcapping``; None: off), UserError
    naming `user` unless it is a finite number > 0 (transformers would divide the scores by it)."""
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap is None:
        return None
    ok = isinstance(cap, (int, float)) and not isinstance(cap, bool) and 0 < cap < float("inf")
    if not ok:
        raise UserError(
            f"{user} cannot run this {config.model_type} model: its config sets attn_logit_softcapping="
            f"{cap!r}; it must be a finite number > 0, or null for none."
        )
    return float(cap)


def bloom_alibi_slopes(num_heads: int) -> Tensor:
    """BLOOM's ALiBi slopes (float32 ``[num_heads]``), computed as transformers' ``build_alibi_tensor``
    computes them (Falcon's too): the geometric series ``2 ** (-8 k / n)``, k = 1..n, for the largest
    power of two n <= num_heads, then for the heads past it every other term of the series of 2n."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        rest = min(closest, num_heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * rest, 2, dtype=torch.int32))])
    return slopes


def mpt_alibi_slopes(num_heads: int, alibi_bias_max: float = 8) -> Tensor:
    """MPT's ALiBi slopes (float32 ``[num_heads]``), as transformers' ``build_mpt_alibi_tensor`` computes
    them: ``2 ** -(k * alibi_bias_max / n)``, k = 1..n, for n the power of two >= num_heads; where n >
    num_heads, the odd terms then the even ones, cut to num_heads."""
    n = 2 ** math.ceil(math.log2(num_heads))
    base = torch.arange(1, n + 1, dtype=torch.int64).float() * (alibi_bias_max / n)
    slopes = 1.0 / torch.pow(2, base)
    if n != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def visible_keys(
    keys: Tensor,
    query_pos: Tensor,
    window: int | None = None,
    chunk: int | None = None,
    end: Tensor | None = None,
) -> Tensor:
    """bool: whether the query at position `query_pos` sees the key at position `keys` (the two broadcast
    against each other): at or before it (causal), before `end` where given (the sequence's length), within
    a sliding `window` W (key > query - W) and within its attention `chunk` C (Llama 4's chunked layers: key
    >= query - query % C). The one rule of the step graphs' masks and of the executors' torch references;
    plain out-of-place ops, in this order (the step graph exports them as they are)."""
    mask = keys <= query_pos
    if end is not None:
        mask = mask & (keys < end)
    if window is not None:
        mask = mask & (keys > query_pos - window)
    if chunk is not None:
        mask = mask & (keys >= query_pos - query_pos % chunk)
    return mask


def alibi_bias(slopes: Tensor, relative: Tensor) -> Tensor:
    """ALiBi's position bias ``[..., H, S, L]``: each head's slope (`slopes` ``[H]``) times each key's
    position minus its query's (`relative` ``[..., S, L]``), in float32. transformers adds ``slope * j``
    (BLOOM, falcon-rw) or ``slope * (j - last)`` (MPT): a constant a query row from this, which its
    softmax cancels; this form is bounded by the distance and is <= 0 on every key the query sees."""
    return slopes.float()[:, None, None] * relative.float()[..., None, :, :]


def attention_sinks(scores: Tensor, sinks: Tensor) -> Tensor:
    """The softmax of the (scaled, masked) `scores` ``[..., H, S, L]`` with each head's sink logit (`sinks`
    ``[H]``) as one more column, that column dropped: transformers' eager gpt-oss attention (the logits with
    the sink appended, minus their row max, softmaxed in the scores' dtype). Plain ops (the step graph
    exports them as they are)."""
    sink = torch.zeros_like(scores[..., :1]) + sinks.to(scores.dtype)[:, None, None]
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)
    return torch.softmax(combined, dim=-1)[..., :-1]


def _gpt_neo_windows(config: Any, num_layers: int) -> list[int | None]:
    """GPT-Neo's windows: ``window_size`` on the layers ``config.attention_layers`` marks "local" (its
    attention masks all but the last ``window_size`` keys there), none on "global" ones."""
    types = list(getattr(config, "attention_layers", None) or [])
    window = getattr(config, "window_size", None)
    if len(types) < num_layers or any(t not in ("global", "local") for t in types):
        raise UserError(
            f"gpt_neo config: attention_layers must name 'global' or 'local' for each of its {num_layers} "
            f"layers, got {types!r}."
        )
    bad = not isinstance(window, int) or isinstance(window, bool) or window < 1
    if "local" in types[:num_layers] and bad:
        raise UserError(
            f"gpt_neo config: window_size must be an integer >= 1 for its local layers, got {window!r}."
        )
    return [window if t == "local" else None for t in types[:num_layers]]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's non-interleaved rotary embedding: ``x*cos + rotate_half(x)*sin`` over the first
    ``cos.shape[-1]`` channels of `x` (all of them unless the rotary is partial, as Phi-4-mini's); the
    rest pass through. `cos`/`sin` broadcast against `x`."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    out = rot * cos + rotated * sin
    return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


def apply_rotary_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's interleaved rotary embedding (GPT-J, CodeGen: ``rotate_every_two``): ``x*cos +
    rotate_every_two(x)*sin`` over the first ``cos.shape[-1]`` channels of `x`, whose pairs (0, 1),
    (2, 3), ... rotate together; the rest pass through. `cos`/`sin` repeat each frequency twice
    (``c0, c0, c1, c1, ...``) and broadcast against `x`."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    rotated = torch.stack((-rot[..., 1::2], rot[..., ::2]), dim=-1).flatten(-2)
    out = rot * cos + rotated * sin
    return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


class DecoderAdapter(ABC):
    """One family's view of a HF causal LM: its spec, per-layer attention scales, windows, soft-caps, ALiBi
    slopes and attention sinks, and the layer math around the attention (embed, project q/k/v, finish the
    block, logits), read by the step-graph export and the torch executor alike.

    `user` names the consumer in errors ("--generate", "TorchExecutor").
    """

    family: str = ""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    #: the rotary tables depend on each sequence's length (dynamic NTK): so do its keys
    dynamic: bool = False

    def __init__(self, model: nn.Module, layers: list[nn.Module], user: str) -> None:
        check_config_sizes(model.config)  # (before a subclass reads layers[0])
        refuse_bidirectional(model, user)
        self.model, self.config, self.layers, self.user = model, model.config, layers, user
        self.windows: list[int | None] = sliding_windows(self.config, len(layers))
        #: each layer's attention chunk size (:func:`attention_chunks`; None: not chunked): every attention
        #: consumer applies it or refuses the model by name
        self.chunks: list[int | None] = attention_chunks(self.config, len(layers))
        #: each layer's softmax scale (the attention module's own ``scaling``)
        self.scales: list[float] = []
        #: each layer's attention logit soft-cap c (None: off): every score s = q . k * scale becomes
        #: c * tanh(s / c) before the mask (Gemma 2); every attention consumer applies it
        self.softcaps: list[float | None] = [None] * len(layers)
        #: each layer's sparse MoE MLP (:class:`.moe.SparseMoe`; None: the layer's own dense MLP module)
        self.moe: list[SparseMoe | None] = [None] * len(layers)
        #: how :meth:`mlp` computes MoE layers: "grouped" (each expert on its own tokens: the torch
        #: executor) or "dense" (every expert on every token, fixed shapes: the step graph sets it)
        self.moe_formulation = "grouped"
        #: each layer's ALiBi slopes (float32 ``[num_heads]``, one a query head; None: no position bias):
        #: the score of a query at position p and a key at position j gets ``slope * (j - p)`` added after
        #: the scale (and any cap), before the mask (:func:`alibi_bias`); every attention consumer applies
        #: them (BLOOM, MPT, falcon-rw). Layers with equal slopes share one tensor.
        self.alibi_slopes: list[Tensor | None] = [None] * len(layers)
        #: each layer's attention sinks (float32 ``[num_heads]``, one learned logit a query head; None:
        #: none): head h's sink joins each of its query rows' softmax as one more column, which takes
        #: probability mass and gives no value (:func:`attention_sinks`; gpt-oss); every attention consumer
        #: applies them
        self.sinks: list[Tensor | None] = [None] * len(layers)

    #: the attention output gate (:class:`.gate.OutputGate`; None: ungated): every attention consumer
    #: multiplies the attention output by it (:meth:`gated`) before :meth:`finish_block`
    output_gate: OutputGate | None = None
    #: each layer's query head count where the layers' differ (Laguna's ``num_attention_heads_per_layer``:
    #: one KV head count and head size for all, so one KV pool shape); None: :attr:`num_heads` on every
    #: layer. The attention consumers take the count from q's shape; buffers of q sized by :meth:`heads`
    heads_per_layer: list[int] | None = None

    def heads(self, i: int) -> int:
        """Layer i's query head count."""
        return self.num_heads if self.heads_per_layer is None else self.heads_per_layer[i]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def bounded(self) -> bool:
        """Whether no position past :attr:`max_length` exists (a learned table; GPT-J's fixed sinusoid
        table): transformers cannot run a longer sequence at all, so neither may the executors."""
        return self.spec.positions == "learned"

    @property
    def position_reach(self) -> tuple[int, str] | None:
        """The longest sequence an unbounded model's positions are meant for (a rotary's trained length,
        or the length its scaling extends it to) and where that comes from, for the executors to refuse a
        longer max_model_len: transformers runs past it, but into positions the model never saw. None:
        nothing bounds them (ALiBi, a bias by distance made to extrapolate) or :attr:`bounded` already
        does."""
        return None

    @property
    def sequence_limit(self) -> tuple[int, str] | None:
        """The longest sequence this model may be compiled (``--max-seq``) or served (``max_model_len``)
        for, and where that comes from: the whole table where no position past it exists
        (:attr:`bounded`), else :attr:`position_reach` (a rotary's trained length, or the length its
        static scaling extends it to). None: nothing bounds it (ALiBi, a dynamic rotary). The one rule
        the step export and the executors share."""
        if self.bounded:
            table = {
                "learned": "the rows of its learned position table (n_positions / max_position_embeddings)",
                "alibi": "the positions of its ALiBi bias table (max_seq_len)",
            }.get(self.spec.positions, "the rows of its rotary table (n_positions)")
            return self.max_length, table
        return self.position_reach

    def require_fixed_rotary(self) -> None:
        """UserError for a rotary whose table changes with the sequence length (the step graph holds one)."""
        if self.dynamic:
            raise UserError(
                f"{self.config.model_type} model {type(self.model).__name__}: rotary scaling 'dynamic' "
                "changes the frequencies with the sequence length; the step graph needs a fixed table. "
                "Supported: default, linear, llama3, yarn and other static types. The torch executor "
                "(trtforge.llm.from_pretrained) serves 'dynamic' rotary."
            )

    @property
    def output_vocab_size(self) -> int:
        """The logits' width: the LM head's rows (:func:`logits_width`), which the spec's and the
        executors' ``vocab_size`` name; ``config.vocab_size`` (the ids the embedding takes) may be wider."""
        return logits_width(self.model)

    @property
    @abstractmethod
    def spec(self) -> DecoderSpec:
        """The manifest's description of the model."""

    @property
    @abstractmethod
    def max_length(self) -> int:
        """The longest sequence the model's positions cover (a learned table, or RoPE's trained length
        scaled by a dynamic rotary's factor)."""

    @abstractmethod
    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        """Hidden states ``[..., H]`` of the tokens at their positions."""

    @abstractmethod
    def rotary(
        self, position_ids: Tensor, dtype: torch.dtype, rope_lens: Tensor | None = None
    ) -> tuple[Tensor, Tensor] | None:
        """cos, sin ``[..., R]`` of each position in `dtype` (None: no rotary); `rope_lens` only
        matters to a dynamic rotary. A family whose layers rotate by different tables returns them all
        (Gemma 3: one pair per layer type) and picks layer i's in :meth:`rotate`."""

    def rotary_over_heads(self, rope: Any) -> Any:
        """What :meth:`rotary` returned with a heads axis inserted at dim 1, so that its tables broadcast
        against q/k of both consumers: ``[T, heads, D]`` (torch executor), ``[B, heads, S, D]`` (step
        graph). A family whose :meth:`rotary` returns more than one (cos, sin) pair overrides this."""
        if rope is None:
            return None
        cos, sin = rope
        return cos[:, None], sin[:, None]

    @abstractmethod
    def qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Layer i's q, k, v ``[..., heads, D]`` from the block input `x` ``[..., H]``, before rotary."""

    def rotate(
        self, i: int, q: Tensor, k: Tensor, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """Layer i's q and k rotated by `rope` (tables shaped to broadcast against them), or as they are.
        A family whose layers rotate by different tables returns what picks them from :meth:`rotary`
        and overrides this."""
        if rope is None:
            return q, k
        cos, sin = rope
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    @abstractmethod
    def finish_block(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Layer i's output from its input `x` and the attention output ``[..., heads * D]`` (gated:
        :meth:`gated`)."""

    def attention_input(self, i: int, x: Tensor) -> Tensor:
        """What layer i's attention projects, from the block input `x`: the pre-norm block's
        ``input_layernorm(x)`` (the only form a gated family has yet)."""
        return self.layers[i].input_layernorm(x)

    def gated(self, i: int, x: Tensor, attn_out: Tensor) -> Tensor:
        """Layer i's attention output ``[..., heads * D]`` times its :attr:`output_gate` of the attention
        input (:meth:`attention_input` of the block input `x`), or as it is without one. Every attention
        consumer calls it between the attention and :meth:`finish_block`."""
        gate = self.output_gate
        if gate is None:
            return attn_out
        return gate.apply(self.attention(i), self.attention_input(i, x), attn_out, self.head_dim)

    def _read_sinks(self) -> None:
        """Each layer's attention sinks (:attr:`sinks`) from its attention module's ``sinks`` parameter,
        float32 (the parameter's values; BF16 ones exactly): gpt-oss's, and Granite SWA's, whose eager
        attention scales each output row by ``sigmoid(logsumexp(scores) - sink)``, the share the sink
        column leaves the keys."""
        self.sinks = [self.attention(i).sinks.detach().float().contiguous() for i in range(self.num_layers)]

    def cannot_run(self) -> str:
        """The start of a refusal of this model: who cannot run which model (``"--generate cannot run this
        mixtral model MixtralForCausalLM"``)."""
        return f"{self.user} cannot run this {self.config.model_type} model {type(self.model).__name__}"

    def parallel_block(
        self,
        x: Tensor,
        attn: Callable[[], Tensor],
        mlp: Callable[[], Tensor],
        whole: Callable[[Tensor, Tensor], Tensor],
    ) -> Tensor:
        """A parallel-residual block's output (``x + attn + mlp`` from one input `x`): ``whole(attn(),
        mlp())``, the family's own sum order, on a whole model. Sharded, both branches' row-parallel
        products stay partial (:func:`.parallel.partial_sums`) and one all-reduce sums them before `x` is
        added: one collective a layer where reducing each projection takes two."""
        tp = parallel.sharded(self.model)
        if tp is None:
            return whole(attn(), mlp())
        with parallel.partial_sums():
            part = attn() + mlp()
        return tp.all_reduce(part) + x

    def mlp(self, i: int, h: Tensor) -> Tensor:
        """Layer i's MLP on its normed input `h`: its sparse MoE block (:attr:`moe`, by
        :attr:`moe_formulation`) or its own MLP module."""
        moe = self.moe[i]
        if moe is None:
            return self.layers[i].mlp(h)
        return moe.forward(h, self.moe_formulation)

    @property
    def has_moe(self) -> bool:
        """Whether any layer's MLP is a sparse mixture of experts."""
        return any(m is not None for m in self.moe)

    @abstractmethod
    def final_norm(self, x: Tensor) -> Tensor:
        """The norm before the LM head."""

    def logits(self, x: Tensor) -> Tensor:
        """LM-head logits of hidden states `x` (in the model's dtype; callers cast)."""
        return output_head(self.model)(self.final_norm(x))

    def shard(self, tp: Any) -> None:
        """Keep only rank ``tp.rank``'s share of the weights (:mod:`.parallel`) and count this rank's heads,
        after :meth:`check_shard` (UserError naming what cannot be split). In place, once per model: the
        shard is marked on the model, and every adapter made of it later counts this rank's heads from
        that mark (:meth:`_count_rank_heads`; sharding it again for `tp` does nothing)."""
        done = parallel.sharded(self.model)
        if done is not None:
            if (done.rank, done.world) != (tp.rank, tp.world):
                raise ValueError(f"model already sharded as rank {done.rank} of {done.world}")
            return
        self.check_shard(tp.world)
        self._shard_weights(tp)
        parallel.mark_sharded(self.model, tp)
        self._keep_rank_heads(tp)

    #: why tensor parallelism does not split this family's layers (None: it does, :meth:`check_shard`)
    tp_refusal: str | None = None

    def attention(self, i: int) -> nn.Module:
        """Layer i's attention module (``self_attn``; the families that name it otherwise override this)."""
        return self.layers[i].self_attn

    def mlp_module(self, i: int) -> nn.Module:
        """Layer i's dense MLP module (``mlp``; MPT: ``ffn``)."""
        return self.layers[i].mlp

    def attention_layout(self, i: int) -> str | None:
        """How layer i's attention lays out q/k/v for :func:`~.parallel.shard_attention` (by default what its
        module names tell, :func:`~.parallel.attention_layout`; Falcon's config tells it apart)."""
        return parallel.attention_layout(self.attention(i))

    def check_shard(self, world: int) -> None:
        """UserError naming what `world` ranks cannot split (nothing changes; the tensor-parallel executor
        asks before any worker starts; see :data:`TP_RULE`): a family whose layers are not split
        (:attr:`tp_refusal`), sparse MoE MLPs, an attention output gate (:attr:`output_gate`), attention
        sinks, chunked attention layers, query head counts that differ by layer, a q/k/v or MLP layout
        :func:`~.parallel.shard_attention` / :func:`~.parallel.shard_mlp` do not know, a q/k norm over the
        whole projection other than OLMo 2's RMSNorm, or heads, KV heads or an MLP width that `world` does
        not divide."""
        c, name = self.config, type(self.model).__name__
        if self.tp_refusal is not None:
            raise UserError(
                f"tensor parallelism is not supported for {c.model_type} models ({name}): {TP_RULE} "
                f"{c.model_type}'s {self.tp_refusal} Use tensor_parallel_size=1."
            )
        what = f"{c.model_type} model {name}"
        refuse_moe(self.model, "tensor parallelism (tensor_parallel_size > 1)", "dense MLPs")
        if self.output_gate is not None:
            raise UserError(
                f"tensor parallelism is not supported for {c.model_type} models ({name}): {TP_RULE} "
                f"{c.model_type}'s attention output gate ({self.output_gate.phrase()}) has no split yet. Use "
                "tensor_parallel_size=1."
            )

        def refuse(why: str) -> NoReturn:
            raise UserError(
                f"tensor parallelism is not supported for this {what}: {why}. {TP_RULE} Use "
                "tensor_parallel_size=1."
            )

        if any(s is not None for s in self.sinks):
            refuse("its attention sinks (one logit a query head) are not split over the ranks")
        if any(c is not None for c in self.chunks):
            refuse(
                f"its chunked attention layers (attention_chunk_size={self.config.attention_chunk_size}) "
                "have no split yet"
            )
        if self.heads_per_layer is not None:
            refuse(f"its layers' query head counts differ ({self.heads_per_layer}); the split takes one")
        widths: dict[int, None] = {}
        for i in range(self.num_layers):
            attn, mlp = self.attention(i), self.mlp_module(i)
            if self.attention_layout(i) is None:
                refuse(f"layer {i}'s attention {type(attn).__name__} has none of the q/k/v layouts above")
            why = parallel.head_norm_refusal(attn, self.num_heads, self.num_kv_heads, self.head_dim)
            if why is not None:
                refuse(f"layer {i}'s {why}")
            width = parallel.mlp_width(mlp)
            if width is None:
                refuse(f"layer {i}'s MLP {type(mlp).__name__} has none of the MLP layouts above")
            widths[int(width)] = None
        counts = {
            "attention heads (num_attention_heads)": self.num_heads,
            "KV heads (num_key_value_heads)": self.num_kv_heads,
        }
        for w in widths:  # (layers of different widths: each named by its width)
            label = f"intermediate_size {w}" if len(widths) > 1 else "intermediate_size"
            counts[f"MLP width ({label})"] = w
        parallel.check_divisible(what, counts, world)

    def _shard_weights(self, tp: Any) -> None:
        """Every layer's attention and MLP split by :mod:`.parallel`, the LM head vocab-parallel."""
        for i in range(self.num_layers):
            layout = self.attention_layout(i)
            parallel.shard_attention(
                self.attention(i), tp, self.num_heads, self.num_kv_heads, self.head_dim, layout=layout
            )
            parallel.shard_mlp(self.mlp_module(i), tp)
        self.model.set_output_embeddings(parallel.VocabParallelHead(output_head(self.model), tp))

    def _count_rank_heads(self) -> None:
        """On a model already sharded (:func:`.parallel.sharded`), count this rank's heads and keep its
        ALiBi slopes: the subclass calls it once its heads (and slopes) are set."""
        done = parallel.sharded(self.model)
        if done is not None:
            self._keep_rank_heads(done)

    def _keep_rank_heads(self, tp: Any) -> None:
        """This rank's share of the head counts and of each layer's ALiBi slopes (one a query head)."""
        h0, h1 = tp.share(self.num_heads)
        cut: dict[int, Tensor] = {}  # (layers that shared one tensor share its slice)
        slopes = self.alibi_slopes
        self.alibi_slopes = [None if s is None else cut.setdefault(id(s), s[h0:h1]) for s in slopes]
        self.num_heads //= tp.world
        self.num_kv_heads //= tp.world

    def _spec(self, **family: Any) -> DecoderSpec:
        """The spec's family-independent fields, completed with `family`'s."""
        c = self.config
        return DecoderSpec(
            family=self.family,
            model_type=c.model_type,
            vocab_size=self.output_vocab_size,
            input_vocab_size=int(c.vocab_size),
            num_layers=self.num_layers,
            hidden_size=int(c.hidden_size),
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            sliding_windows=list(self.windows),
            attn_softcaps=list(self.softcaps),
            alibi_slopes=[None if s is None else [float(x) for x in s.tolist()] for s in self.alibi_slopes],
            attn_sinks=[None if s is None else [float(x) for x in s.tolist()] for s in self.sinks],
            bos_token_id=next(
                iter(
                    token_ids(c.bos_token_id, c.vocab_size, "the model config's bos_token_id (config.json)")
                ),
                None,
            ),
            eos_token_ids=eos_token_ids(self.model),
            mlp_kinds=["dense" if m is None else "moe" for m in self.moe],
            moe=_describe_moe(self.moe),
            output_gate=None if self.output_gate is None else self.output_gate.describe(),
            num_heads_per_layer=None if self.heads_per_layer is None else list(self.heads_per_layer),
            attention_chunks=list(self.chunks) if any(c is not None for c in self.chunks) else [],
            **family,
        )
