"""Held-back configs: for every supported family, seeded random variations of the options its config
takes (projection biases, GQA ratios, head dims, activations, rotary scaling, norms, tied heads, residual
forms) run on the torch executor and reproduce transformers' logits on chunked paged steps (every drawn
value is one the family supports: a refusal fails). The test configs elsewhere pin one form per family;
checkpoints in the wild set the other options, and an adapter that reads a module it should not (or
ignores an option) shows here as wrong logits or an exception.
"""

from __future__ import annotations

import copy
import zlib

import numpy as np
import pytest
import torch

from tests.llm.tiny_models import neox_japanese_partial_rotary_runs as partial_ok
from tests.llm.tiny_models import tiny_model
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import SUPPORTED

ROPE = [
    None,
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128},
    {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
]
ACTS = ["silu", "gelu", "gelu_pytorch_tanh", "relu"]
LLAMA_LIKE = {
    "num_key_value_heads": [1, 2, 4],
    "tie_word_embeddings": [False, True],
    "rope_scaling": ROPE,
    "rms_norm_eps": [1e-6, 1e-5],
    "rope_theta": [10000.0, 500000.0],
}
# Falcon's layer forms, each drawn as one "_form" (its options do not combine freely: transformers' own
# forward runs no other): falcon-7b's multi-query, serial or parallel; per-head MHA, serial or parallel;
# falcon-40b/180b's new architecture with ln_attn and ln_mlp; Falcon2-11B's with one norm
FALCON_FORMS = [
    {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True},
    {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": False},
    {"new_decoder_architecture": False, "multi_query": False, "parallel_attn": True, "num_kv_heads": None},
    {"new_decoder_architecture": False, "multi_query": False, "parallel_attn": False, "num_kv_heads": None},
    {"new_decoder_architecture": True, "parallel_attn": True},
    {"new_decoder_architecture": True, "parallel_attn": True, "num_ln_in_parallel_attn": 1},
    # falcon-rw's ALiBi: its serial per-head MHA, and (transformers runs it too) falcon-7b's multi-query
    {"new_decoder_architecture": False, "multi_query": False, "parallel_attn": False, "num_kv_heads": None}
    | {"alibi": True},
    {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True, "alibi": True},
]
# each family's options and the values drawn for them (all accepted by transformers' config and model; a
# "_form" draw sets each of its options)
OPTIONS: dict[str, dict[str, list]] = {
    "llama": LLAMA_LIKE
    | {
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "hidden_act": ACTS,
        "head_dim": [8, 16, 24],
    },
    "mistral": LLAMA_LIKE | {"hidden_act": ACTS, "head_dim": [8, 16, 24], "sliding_window": [None, 5, 64]},
    "ministral": LLAMA_LIKE | {"sliding_window": [5, 64], "head_dim": [8, 16]},
    # Ministral 3: the query scaling's beta and period (its YaRN's original length too), a window or none
    "ministral3": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rms_norm_eps": [1e-6, 1e-5],
        "rope_parameters": [
            {"rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.5}
            | {"original_max_position_embeddings": 4},
            {"rope_type": "default", "rope_theta": 500000.0, "llama_4_scaling_beta": 0.1}
            | {"original_max_position_embeddings": 7},
            {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 32.0, "llama_4_scaling_beta": 1.0}
            | {"original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0}
            | {"mscale": 1.0, "mscale_all_dim": 1.0},
        ],
        "sliding_window": [None, 5, 64],
        "head_dim": [8, 16, 24],
    },
    "qwen2": LLAMA_LIKE | {"hidden_act": ACTS, "use_sliding_window": [False]},
    "qwen3": LLAMA_LIKE | {"attention_bias": [False, True], "head_dim": [8, 16, 24]},
    "phi3": {  # (its config takes no rope scaling but longrope: test_generate.py)
        "num_key_value_heads": [1, 2, 4],
        "partial_rotary_factor": [0.5, 0.75, 1.0],
        "tie_word_embeddings": [False, True],
        "sliding_window": [None, 5],
    },
    "starcoder2": {
        "num_key_value_heads": [1, 2, 4],
        "use_bias": [False, True],
        "sliding_window": [None, 5],
        "hidden_act": ["gelu_pytorch_tanh", "gelu"],
        "rope_scaling": ROPE[:2],
    },
    "gpt2": {
        "activation_function": ["gelu_new", "relu", "gelu"],
        "scale_attn_by_inverse_layer_idx": [False, True],
        "scale_attn_weights": [True, False],
        "n_inner": [None, 96],
        "layer_norm_epsilon": [1e-5, 1e-3],
    },
    "gpt-sw3": {  # (GPT-2's model: "gpt2" draws its options)
        "activation_function": ["gelu", "gelu_new"],
        "scale_attn_weights": [True, False],
        "tie_word_embeddings": [False, True],
    },
    "gpt_neox_japanese": {  # partial rotary, rope scaling, the MLP's width and activation, eps, tied head
        "rotary_pct": [0.25, 0.5, 1.0],
        "rope_scaling": ROPE[:2],
        "intermediate_multiple_size": [2, 4],
        "hidden_act": ["gelu", "relu", "silu"],
        "layer_norm_eps": [1e-5, 1e-3],
        "tie_word_embeddings": [False, True],
    },
    "gpt_neo": {
        "activation_function": ["gelu_new", "relu"],
        "window_size": [3, 256],
        "attention_types": [[[["global", "local"], 1]], [[["local"], 2]], [[["global"], 2]]],
        "intermediate_size": [None, 96],
    },
    "gpt_bigcode": {
        "multi_query": [True, False],
        "scale_attn_weights": [True, False],
        "activation_function": ["gelu_pytorch_tanh", "relu"],
        "n_inner": [None, 96],
    },
    # ModernBERT-Decoder: biases, activations, windows, its norms' epsilon and bias, the head's activation
    "modernbert-decoder": {
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "norm_bias": [False, True],
        "norm_eps": [1e-5, 1e-3],
        "hidden_activation": ["gelu", "silu", "relu"],
        "classifier_activation": ["gelu", "silu"],
        "classifier_bias": [False, True],
        "decoder_bias": [False, True],
        "local_attention": [6, 10, 128],
        "tie_word_embeddings": [True, False],
    },
    # GPT-1: its activation, head count, LayerNorm eps and tied or untied head
    "openai-gpt": {
        "afn": ["gelu", "relu", "silu"],
        "n_head": [2, 4, 8],
        "layer_norm_epsilon": [1e-5, 1e-3],
        "tie_word_embeddings": [True, False],
    },
    "opt": {
        "enable_bias": [True, False],
        "layer_norm_elementwise_affine": [True, False],
        "activation_function": ["relu", "gelu"],
        "do_layer_norm_before": [True, False],
        "word_embed_proj_dim": [64, 48],
    },
    "gpt_neox": {
        "rotary_pct": [0.25, 0.5, 1.0],
        "use_parallel_residual": [True, False],
        "attention_bias": [True, False],
        "hidden_act": ["gelu", "gelu_new", "relu"],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE[:3],
    },
    "phi": {
        "qk_layernorm": [False, True],
        "partial_rotary_factor": [0.4, 0.5, 1.0],
        "num_key_value_heads": [1, 2, 4],
        "hidden_act": ["gelu_new", "relu"],
        "rope_scaling": ROPE[:3],
    },
    "gemma": LLAMA_LIKE | {"head_dim": [8, 16, 24], "hidden_activation": ["gelu_pytorch_tanh", "gelu"]},
    "gemma3_text": {  # rope_scaling: on the full-attention layers' table (Gemma 3 4B+: linear, factor 8)
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "head_dim": [8, 16, 24],
        "sliding_window": [3, 5, 64],
        "query_pre_attn_scalar": [16, 256],
        "final_logit_softcapping": [None, 8.0, 30.0],
        "attention_bias": [False, True],
        "hidden_activation": ["gelu_pytorch_tanh", "gelu"],
        "rms_norm_eps": [1e-6, 1e-5],
        "attn_logit_softcapping": [None, 2.0],  # kept by its config, applied by no Gemma 3 attention
    },
    "gemma2": {  # attention soft-caps that bite (2), Gemma 2's own (50, barely) or none
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "head_dim": [8, 16, 24],
        "sliding_window": [3, 5, 64],
        "query_pre_attn_scalar": [16, 256],
        "attn_logit_softcapping": [None, 2.0, 50.0],
        "final_logit_softcapping": [None, 8.0, 30.0],
        "attention_bias": [False, True],
        "hidden_activation": ["gelu_pytorch_tanh", "gelu"],
        "rms_norm_eps": [1e-6, 1e-5],
    },
    "olmo2": LLAMA_LIKE | {"attention_bias": [False, True]},
    "granite": LLAMA_LIKE
    | {
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "embedding_multiplier": [1.0, 12.0],
        "residual_multiplier": [1.0, 0.22],
        "attention_multiplier": [0.015625, 0.5],
        "logits_scaling": [1.0, 8.0],
    },
    "stablelm": {
        "num_key_value_heads": [1, 2, 4],
        "partial_rotary_factor": [0.25, 0.5, 1.0],
        "use_qkv_bias": [False, True],
        "qk_layernorm": [False, True],
        "use_parallel_residual": [False, True],
        "tie_word_embeddings": [False, True],
        "hidden_act": ["silu", "gelu"],
        "layer_norm_eps": [1e-5, 1e-3],
        "rope_scaling": ROPE[:3],
    },
    "smollm3": LLAMA_LIKE
    | {  # no_rope_layers: each of its 2 layers NoPE (0) or not; a window lands on the NoPE ones
        "no_rope_layers": [[1, 0], [0, 1], [1, 1], [0, 0]],
        "use_sliding_window": [False, True],
        "sliding_window": [None, 5, 64],
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "hidden_act": ACTS,
    },
    "gptj": {  # rotary_dim: a quarter (GPT-J 6B), a half or all of a 16-channel head (of 32 with 2 heads)
        "rotary_dim": [4, 8, 16],
        "n_head": [2, 4],
        "activation_function": ["gelu_new", "gelu", "relu"],
        "n_inner": [None, 96],
        "layer_norm_epsilon": [1e-5, 1e-3],
        "tie_word_embeddings": [False, True],
    },
    "codegen": {  # (its fused projection's 4 shards: 1 or 2 heads each)
        "rotary_dim": [2, 4, 8],
        "n_head": [4, 8],
        "activation_function": ["gelu_new", "gelu"],
        "n_inner": [None, 96],
        "tie_word_embeddings": [False, True],
    },
    "falcon": {
        "_form": FALCON_FORMS,
        "num_kv_heads": [1, 2, 4],  # (the new architecture's groups; multi-query has 1, per-head MHA all)
        "num_attention_heads": [4, 8],
        "bias": [False, True],
        "activation": ["gelu", "relu"],
        "tie_word_embeddings": [True, False],
        "rope_scaling": ROPE[:3],
    },
    # sparse MoE MLPs: expert counts, top-k (1 to 3), renormalized or not, dense layers among sparse ones;
    # router jitter set (transformers applies it in training only)
    "mixtral": LLAMA_LIKE
    | {
        "num_local_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "hidden_act": ACTS,
        "head_dim": [8, 16, 24],
        "sliding_window": [None, 5, 64],
        "router_jitter_noise": [0.0, 0.1],
    },
    # Kolibri-1: its routing (renormalized or not, top 1-3 of 4 or 8), windows and NoPE full layers
    "kolibri1": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "num_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "sliding_window": [3, 5, 64],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "sliding_attention", "sliding_attention"],
        ],
        "head_dim": [8, 16],
    },
    # MiniCPM5-MoE: GLM-4.5's routing options around the gated attention, dense first layers or none
    "minicpm5_moe": LLAMA_LIKE
    | {
        "_form": [
            {"n_routed_experts": 4, "n_group": 1, "topk_group": 1},
            {"n_routed_experts": 8, "n_group": 2, "topk_group": 1},
        ],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "routed_scaling_factor": [1.0, 2.5],
        "mlp_layer_types": [["dense", "sparse", "sparse"], ["sparse", "sparse", "sparse"]],
        "attention_bias": [False, True],
        "head_dim": [8, 16, 24],
    },
    # MiniMax-M2: sigmoid routing with its block's selection bias, whole-projection q/k norms, partial RoPE
    "minimax_m2": LLAMA_LIKE
    | {
        "num_local_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "head_dim": [8, 16, 24],
        "partial_rotary_factor": [0.5, 1.0],
        "hidden_act": ACTS,
    },
    "qwen2_moe": LLAMA_LIKE
    | {
        "num_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "decoder_sparse_step": [1, 2],
        "mlp_only_layers": [[], [0], [1, 2]],
        "shared_expert_intermediate_size": [32, 96],
        "qkv_bias": [True, False],
        "hidden_act": ACTS,
    },
    "qwen3_moe": LLAMA_LIKE
    | {
        "num_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "decoder_sparse_step": [1, 2],
        "mlp_only_layers": [[], [1]],
        "attention_bias": [False, True],
        "head_dim": [8, 16, 24],
        "use_sliding_window": [False, True],
        "sliding_window": [5],
    },
    "olmoe": LLAMA_LIKE
    | {
        "num_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "clip_qkv": [None, 0.5, 2.0],
        "attention_bias": [False, True],
    },
    # Granite's multipliers around top-k-then-softmax routing; GraniteMoeShared's shared MLP, or none at 0
    "granitemoe": LLAMA_LIKE
    | {
        "num_local_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "hidden_act": ACTS,
        "attention_bias": [False, True],
        "embedding_multiplier": [1.0, 12.0],
        "residual_multiplier": [1.0, 0.22],
        "attention_multiplier": [0.015625, 0.5],
        "logits_scaling": [1.0, 6.0],
    },
    "granitemoeshared": LLAMA_LIKE
    | {
        "num_local_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "shared_intermediate_size": [0, 32, 96],
        "attention_bias": [False, True],
        "residual_multiplier": [1.0, 0.22],
        "logits_scaling": [1.0, 6.0],
    },
    # gpt-oss: YaRN forms (truncate, an explicit attention_factor) and plain tables, windows by layer_types,
    # expert counts and top-k, biases on or off; the sinks and the clamped SwiGLU as tiny_model sets them
    "gpt_oss": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rms_norm_eps": [1e-6, 1e-5],
        "rope_parameters": [
            {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0}
            | {"truncate": False, "original_max_position_embeddings": 64},
            {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "truncate": True}
            | {"original_max_position_embeddings": 32},
            {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 2.0, "attention_factor": 1.3}
            | {"original_max_position_embeddings": 128},
            {"rope_type": "default", "rope_theta": 10000.0},
        ],
        "num_local_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "head_dim": [8, 16, 24],
        "attention_bias": [False, True],
        "sliding_window": [3, 5, 64],
        "layer_types": [
            ["sliding_attention", "full_attention"],
            ["full_attention", "sliding_attention"],
            ["sliding_attention", "sliding_attention"],
        ],
    },
    # HunYuan-MoE: its top-k (moe_topk, one for all layers or one a layer), the shared MLP as wide as the
    # experts; HunYuan's q/k norms after the rotary
    "hunyuan_v1_moe": LLAMA_LIKE
    | {
        "num_experts": [4, 8],
        "moe_topk": [1, 2, 3, [3, 1]],
        "intermediate_size": [32, 64],
        "attention_bias": [False, True],
        "head_dim": [8, 16, 24],
        "hidden_act": ACTS,
    },
    # ERNIE 4.5-MoE: the selection bias (off zero: tiny_model), shared experts or none, which layers are
    # sparse (interval, start, end)
    "ernie4_5_moe": LLAMA_LIKE
    | {
        "num_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "moe_num_shared_experts": [0, 1, 2],
        "moe_layer_interval": [1, 2],
        "moe_layer_start_index": [0, 1],
        "moe_layer_end_index": [-1, 1],
        "use_bias": [True, False],
        "head_dim": [8, 16, 24],
        "hidden_act": ACTS,
    },
    # GLM-4.5: expert groups (none, or 2 / 4 of which 1 / 2 kept), top-k, renormalized or not, the routed
    # scale, dense first layers, q/k norms and biases on or off, shared experts' width
    "glm4_moe": LLAMA_LIKE
    | {
        "_form": [
            {"n_routed_experts": 4, "n_group": 1, "topk_group": 1},
            {"n_routed_experts": 8, "n_group": 1, "topk_group": 1},
            {"n_routed_experts": 8, "n_group": 2, "topk_group": 1},
            {"n_routed_experts": 8, "n_group": 4, "topk_group": 2},
        ],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "routed_scaling_factor": [1.0, 2.5],
        "first_k_dense_replace": [0, 1],
        "use_qk_norm": [False, True],
        "attention_bias": [False, True],
        "n_shared_experts": [1, 2],
        "head_dim": [8, 16, 24],
    },
    # FlexOLMo: OLMoE's routing around OLMo 2's layers
    "flex_olmo": LLAMA_LIKE
    | {
        "num_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "attention_bias": [False, True],
        "hidden_act": ACTS,
    },
    # K-EXAONE: GLM-4.5's routing options around EXAONE 4's attention (NoPE full layers where a window is set)
    "exaone_moe": LLAMA_LIKE
    | {
        "_form": [
            {"num_experts": 4, "n_group": 1, "topk_group": 1},
            {"num_experts": 8, "n_group": 2, "topk_group": 1},
        ],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "routed_scaling_factor": [1.0, 2.5],
        "first_k_dense_replace": [0, 1],
        "num_shared_experts": [1, 2],
        "sliding_window": [3, 5, 64],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "sliding_attention", "sliding_attention"],
        ],
    },
    # dots.llm1: GLM-4.5's routing options (expert groups among them) around Qwen3's attention and windows
    "dots1": LLAMA_LIKE
    | {
        "_form": [
            {"n_routed_experts": 4, "n_group": 1, "topk_group": 1},
            {"n_routed_experts": 8, "n_group": 2, "topk_group": 1},
        ],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "routed_scaling_factor": [1.0, 2.5],
        "first_k_dense_replace": [0, 1],
        "attention_bias": [False, True],
        "sliding_window": [3, 5, 64],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "sliding_attention", "sliding_attention"],
        ],
    },
    # Param2-MoE / Sarvam-MoE: GLM-4.5's model under their own configs (the whole head rotated, q/k norms on)
    "param2moe": LLAMA_LIKE
    | {
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "first_k_dense_replace": [0, 1],
        "use_qk_norm": [False, True],
        "attention_bias": [False, True],
    },
    "sarvam_moe": LLAMA_LIKE
    | {
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "first_k_dense_replace": [0, 1],
        "attention_bias": [False, True],
    },
    # Solar Open: GLM-4.5's routing options (expert groups among them) on every layer, Llama's attention
    "solar_open": LLAMA_LIKE
    | {
        "_form": [
            {"n_routed_experts": 4, "n_group": 1, "topk_group": 1},
            {"n_routed_experts": 8, "n_group": 2, "topk_group": 1},
        ],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "routed_scaling_factor": [1.0, 2.5],
        "n_shared_experts": [1, 2],
        "attention_bias": [False, True],
        "head_dim": [8, 16, 24],
    },
    # Mellum: Qwen3-MoE's routing around windows by layer_types, a RoPE table each, dense layers by
    # mlp_layer_types
    "mellum": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "sliding_window": [3, 5],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "sliding_attention", "sliding_attention"],
        ],
        "mlp_layer_types": [["dense", "sparse", "sparse"], ["sparse", "dense", "sparse"]],
        "attention_bias": [False, True],
    },
    # Cohere 2-MoE: the softmax or sigmoid router (renormalized or not), shared experts (none, added or
    # averaged), dense first layers rotating or not, RMSNorm or Cohere's LayerNorm, windows
    "cohere2_moe": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [True, False],
        "rope_scaling": ROPE,
        "_form": [
            {"expert_selection_fn": "softmax", "shared_expert_combination_strategy": "sum"},
            {"expert_selection_fn": "sigmoid", "shared_expert_combination_strategy": "average"},
            {"expert_selection_fn": "sigmoid", "shared_expert_combination_strategy": "sum"},
            {"expert_selection_fn": "softmax", "shared_expert_combination_strategy": "average"},
        ],
        "norm_topk_prob": [False, True],
        "num_experts_per_tok": [1, 2, 3],
        "num_shared_experts": [0, 1, 2],
        "prefix_dense_sliding_window_pattern": [1, 2],
        "rms_norm_eps": [None, 1e-6],
        "sliding_window": [3, 5, 64],
        "logit_scale": [0.0625, 1.0],
    },
    # Granite SWA / GraniteMoeSWA: Granite's options with windows by layer_types and a RoPE base per layer
    # (0: NoPE); GraniteMoeSWA's routing is GraniteMoE's, with or without the shared MLP
    "granite_swa": LLAMA_LIKE
    | {
        "sliding_window": [3, 5, 64],
        "layer_types": [None, ["sliding_attention", "full_attention"], ["full_attention", "full_attention"]],
        "layer_rope_theta": [None, [0, 10000.0], [500.0, 0], [100.0, 10000.0]],
        "attention_bias": [False, True],
        "head_dim": [8, 16, 24],
        "hidden_act": ACTS,
    },
    "granitemoe_swa": LLAMA_LIKE
    | {
        "num_local_experts": [4, 8],
        "num_experts_per_tok": [1, 2, 3],
        "shared_intermediate_size": [0, 96],
        "sliding_window": [3, 5, 64],
        "layer_rope_theta": [None, [0, 10000.0], [500.0, 0]],
    },
    # HY V3: GLM-4.5's routing without groups (renormalized always) around Apertus' attention, dense layers
    # by mlp_layer_types, the shared expert's width, the float32 combine on or off
    "hy_v3": LLAMA_LIKE
    | {
        "num_experts_per_tok": [1, 2, 3],
        "router_scaling_factor": [1.0, 2.5],
        "num_shared_experts": [1, 2],
        "enable_moe_fp32_combine": [True, False],
        "mlp_layer_types": [["dense", "sparse", "sparse"], ["sparse", "dense", "sparse"]],
        "attention_bias": [False, True],
        "head_dim": [8, 16, 24],
    },
    # Flint: the sigmoid router (renormalized or not) with its shared expert, sinks, windows by layer_types,
    # dense layers by mlp_only_layers
    "flint": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "num_experts_per_tok": [1, 2, 3],
        "norm_topk_prob": [False, True],
        "sliding_window": [3, 5],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "sliding_attention", "sliding_attention"],
        ],
        "mlp_only_layers": [[0], [1], []],
        "attention_bias": [False, True],
    },
    # AFMoE: its routing (top-k, route_scale), shared experts, dense layers, windows, muP on or off
    "afmoe": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "num_experts_per_tok": [1, 2, 3],
        "route_scale": [1.0, 2.5],
        "num_shared_experts": [0, 1, 2],
        "num_dense_layers": [0, 1],
        "mup_enabled": [False, True],
        "sliding_window": [3, 5],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "sliding_attention", "sliding_attention"],
        ],
        "attention_bias": [False, True],
    },
    # Beam: GLM-4.5's routing options (less the shared expert), the experts' scale, windows and NoPE layers,
    # dense layers, its rotary's base and scaling (its sliding layers' rope_parameters), the logits' cap
    "beam": {
        "_form": [
            {"num_experts": 4, "n_group": 1, "topk_group": 1},
            {"num_experts": 8, "n_group": 2, "topk_group": 1},
        ],
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_parameters": [
            {"sliding_attention": {"rope_type": "default", "rope_theta": t}, "full_attention": None}
            for t in (10000.0, 500000.0)
        ]
        + [
            {
                "sliding_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
                "full_attention": None,
            }
        ],
        "num_experts_per_tok": [1, 2],
        "norm_topk_prob": [False, True],
        "routed_scaling_factor": [1.0, 2.5],
        "sliding_window": [3, 5],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "sliding_attention", "sliding_attention"],
        ],
        "mlp_layer_types": [["dense", "sparse", "sparse"], ["sparse", "dense", "sparse"]],
        "attention_bias": [False, True],
        "final_logit_softcapping": [None, 8.0],
        "head_dim": [8, 16],
    },
    # Laguna: per-layer query head counts, the gate per head or per channel, its routing's top-k and scale,
    # the shared MLP's width, windows and dense layers, its rotary tables' bases and partial factors
    "laguna": {
        "num_key_value_heads": [1, 2],
        "num_attention_heads_per_layer": [[4, 8, 2], [4, 4, 4], [2, 6, 8]],
        "gating": [True, "per-element"],
        "tie_word_embeddings": [False, True],
        "rope_parameters": [
            {
                "full_attention": {
                    "rope_type": "default",
                    "rope_theta": 500000.0,
                    "partial_rotary_factor": f,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": t, "partial_rotary_factor": 1.0},
            }
            for f, t in ((0.5, 10000.0), (1.0, 100.0))
        ],
        "num_experts_per_tok": [1, 2, 3],
        "moe_routed_scaling_factor": [1.0, 2.5],
        "shared_expert_intermediate_size": [32, 64],
        "sliding_window": [3, 5],
        "layer_types": [
            ["sliding_attention", "full_attention", "sliding_attention"],
            ["full_attention", "full_attention", "sliding_attention"],
        ],
        "mlp_layer_types": [["dense", "sparse", "sparse"], ["sparse", "dense", "sparse"]],
        "attention_bias": [False, True],
    },
    # Aria text: its top-k, the shared expert's width, Llama's attention options
    "aria_text": LLAMA_LIKE
    | {
        "moe_topk": [1, 2, 3],
        "moe_num_shared_experts": [1, 2],
        "attention_bias": [False, True],
        "head_dim": [8, 16, 24],
    },
    "olmo": LLAMA_LIKE | {"clip_qkv": [None, 0.5, 8.0], "attention_bias": [False, True], "hidden_act": ACTS},
    "olmo3": {  # rope_scaling: on the full-attention layers' table, as OLMo 3's config puts it
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "sliding_window": [3, 5, 64],
        "attention_bias": [False, True],
        "rms_norm_eps": [1e-6, 1e-5],
    },
    "cohere": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [True, False],
        "rope_scaling": ROPE,
        "use_qk_norm": [False, True],
        "logit_scale": [0.0625, 1.0],
        "attention_bias": [False, True],
        "layer_norm_eps": [1e-5, 1e-3],
        "hidden_act": ACTS,
    },
    "cohere2": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [True, False],
        "rope_scaling": ROPE,
        "sliding_window": [3, 5, 64],
        "logit_scale": [0.0625, 1.0],
        "attention_bias": [False, True],
        "layer_norm_eps": [1e-5, 1e-3],
    },
    # (partial factors from 0.5: at head_dim 8 a quarter rotates 2 channels, where transformers' dynamic
    # RoPE divides by the rotary width - 2 and cannot build the model; Nemotron and others draw 0.25)
    "glm": LLAMA_LIKE
    | {"partial_rotary_factor": [0.5, 1.0], "attention_bias": [True, False], "head_dim": [8, 16, 32]},
    "glm4": LLAMA_LIKE
    | {"partial_rotary_factor": [0.5, 1.0], "attention_bias": [True, False], "head_dim": [8, 16, 32]},
    "nemotron": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE[:3],
        "partial_rotary_factor": [0.25, 0.5, 1.0],
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "hidden_act": ["relu2", "gelu"],
        "norm_eps": [1e-5, 1e-3],
    },
    "persimmon": {
        "qk_layernorm": [True, False],
        "partial_rotary_factor": [0.25, 0.5, 1.0],
        "hidden_act": ["relu2", "gelu"],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE[:3],
        "layer_norm_eps": [1e-5, 1e-3],
    },
    "helium": LLAMA_LIKE  # (its o_proj is hidden x hidden: head_dim stays hidden / heads)
    | {"attention_bias": [True, False], "mlp_bias": [False, True], "hidden_act": ACTS},
    "ernie4_5": LLAMA_LIKE | {"use_bias": [True, False], "head_dim": [8, 16, 24], "hidden_act": ACTS},
    "exaone4": {  # (a window of 64 leaves every layer full attention within the prompt, RoPE on the sliding)
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "sliding_window": [3, 5, 64],
        "head_dim": [8, 16, 24],
        "rms_norm_eps": [1e-6, 1e-5],
        "hidden_act": ACTS,
    },
    "hunyuan_v1_dense": LLAMA_LIKE  # NTK-alpha: "dynamic" with an alpha is a fixed table
    | {
        "rope_scaling": [*ROPE, {"rope_type": "dynamic", "alpha": 4.0, "factor": 1.0}],
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "head_dim": [8, 16, 24],
    },
    "apertus": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "attention_bias": [False, True],
        "hidden_act": ["xielu", "relu2", "silu"],
        "rms_norm_eps": [1e-6, 1e-5],
    },
    # Apertus 1.5 text: Apertus' options (its model is Apertus'); its pruned LM head: test_pruned_lm_head
    "apertus1p5_text": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "attention_bias": [False, True],
        "hidden_act": ["xielu", "relu2", "silu"],
    },
    "arcee": LLAMA_LIKE
    | {
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "hidden_act": ["relu2", "silu", "gelu"],
        "head_dim": [8, 16, 24],
    },
    "internlm3": LLAMA_LIKE  # (its config refuses q/k/v biases without the others, and the reverse)
    | {"_form": [{"qkv_bias": False, "bias": False}, {"qkv_bias": True, "bias": True}], "head_dim": [8, 16]},
    "seed_oss": LLAMA_LIKE
    | {
        "attention_bias": [True, False],
        "attention_out_bias": [False, True],
        "mlp_bias": [False, True],
        "head_dim": [8, 16, 24],
    },
    "exaone": LLAMA_LIKE | {"attention_bias": [False, True], "mlp_bias": [False, True], "hidden_act": ACTS},
    "iquestcoder": LLAMA_LIKE | {"head_dim": [8, 16, 24], "attention_bias": [False, True]},
    "cwm": LLAMA_LIKE  # (rope_scaling None: its config's own llama3 table)
    | {
        "sliding_window": [3, 5, 64],
        "layer_types": [None, ["sliding_attention", "full_attention"], ["full_attention"] * 2],
        "head_dim": [8, 16],
    },
    "jais2": {  # (LayerNorm: layer_norm_eps, no rms_norm_eps)
        **{k: v for k, v in LLAMA_LIKE.items() if k != "rms_norm_eps"},
        "attention_bias": [True, False],
        "mlp_bias": [True, False],
        "hidden_act": ["relu2", "gelu", "silu"],
        "layer_norm_eps": [1e-5, 1e-3],
    },
    "hyperclovax": LLAMA_LIKE
    | {
        "attention_bias": [False, True],
        "mlp_bias": [False, True],
        "embedding_multiplier": [1.0, 12.0],
        "residual_multiplier": [1.0, 0.22],
        "attention_multiplier": [None, 0.5],  # (None: head_dim ** -0.5)
        "logits_scaling": [1.0, 0.125],
        "use_post_norm": [True, False],
    },
    "nanochat": LLAMA_LIKE
    | {
        "final_logit_softcapping": [None, 8.0, 15.0],
        "hidden_act": ["relu2", "gelu", "silu"],
        "attention_bias": [False, True],
    },
    "vaultgemma": {  # Gemma 2's draws (its config is Gemma 2's)
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "rope_scaling": ROPE,
        "head_dim": [8, 16, 24],
        "sliding_window": [3, 5, 64],
        "query_pre_attn_scalar": [16, 256],
        "attn_logit_softcapping": [None, 2.0, 50.0],
        "final_logit_softcapping": [None, 8.0, 30.0],
        "attention_bias": [False, True],
        "hidden_activation": ["gelu_pytorch_tanh", "gelu"],
        "rms_norm_eps": [1e-6, 1e-5],
    },
    "biogpt": {
        "num_attention_heads": [2, 4, 8],
        "hidden_act": ["gelu", "relu", "gelu_new"],
        "scale_embedding": [True, False],
        "tie_word_embeddings": [False, True],
        "layer_norm_eps": [1e-12, 1e-5],
    },
    "xglm": {
        "attention_heads": [2, 4, 8],
        "activation_function": ["gelu", "relu"],
        "scale_embedding": [True, False],
        "tie_word_embeddings": [False, True],
    },
    "bloom": {  # head counts (hidden 64 or 48): BLOOM's slopes for powers of two and the others
        "_form": [
            {"hidden_size": 64, "n_head": 8},
            {"hidden_size": 48, "n_head": 6},
            {"hidden_size": 48, "n_head": 3},
            {"hidden_size": 64, "n_head": 2},
        ],
        "apply_residual_connection_post_layernorm": [False, True],
        "pretraining_tp": [1, 2],
        "slow_but_exact": [False, True],  # (with pretraining_tp 2: sliced projections without biases)
        "layer_norm_epsilon": [1e-5, 1e-3],
        "tie_word_embeddings": [True, False],
    },
    # Llama 4 text: its chunk size (64: longer than the prompt) and which layers chunk (the RoPE ones of
    # no_rope_layers), its NoPE layers' temperature tuning, q/k norms, top-k and dense layers, its rotary's
    # base and llama3 scaling (Scout's kind), GQA, biases, tied heads
    "llama4_text": {
        "num_key_value_heads": [1, 2, 4],
        "tie_word_embeddings": [False, True],
        "attention_chunk_size": [4, 7, 64],
        "no_rope_layers": [[1, 0, 1], [0, 1, 1], [1, 1, 1]],
        "attn_temperature_tuning": [True, False],
        "floor_scale": [2, 5],
        "attn_scale": [0.1, 0.5],
        "use_qk_norm": [True, False],
        "num_experts_per_tok": [1, 2],
        "moe_layers": [[1, 2], [0, 2], None],  # (None: every interleave_moe_layer_step-th layer)
        "interleave_moe_layer_step": [1, 2],
        "rope_parameters": [{"rope_type": "default", "rope_theta": t} for t in (10000.0, 500000.0)]
        + [
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ],
        "rms_norm_eps": [1e-6, 1e-5],
        "attention_bias": [False, True],
        "head_dim": [8, 16],
    },
    "mpt": {  # head counts (d_model 64 or 48; MPT's slopes interleave for 6), clip_qkv, softmax_scale
        "_form": [
            {"d_model": 64, "n_heads": 4},
            {"d_model": 48, "n_heads": 6},
            {"d_model": 64, "n_heads": 8},
        ],
        "attn_config": [
            {"clip_qkv": None},
            {"clip_qkv": 0.6},
            {"clip_qkv": None, "softmax_scale": 0.2},
            {"clip_qkv": 0.3, "softmax_scale": 0.5},
        ],
        "layer_norm_epsilon": [1e-5, 1e-3],
        "tie_word_embeddings": [True, False],
    },
}
SEEDS = range(5)
# families whose routing another family's draws vary already (dots.llm1's, K-EXAONE's, Solar Open's and
# MiniCPM5-MoE's is GLM-4.5's, FlexOLMo's OLMoE's, Mellum's Qwen3-MoE's, GraniteMoeSWA's GraniteMoE's):
# fewer draws, for what they add around it (their attention, windows, dense layers); Param2-MoE and
# Sarvam-MoE run GLM-4.5's classes: one draw each
FEWER_SEEDS = {
    "dots1": range(2),
    "exaone_moe": range(2),
    "flex_olmo": range(2),
    "solar_open": range(2),
    "mellum": range(2),
    "granitemoe_swa": range(2),
    "param2moe": range(1),
    "sarvam_moe": range(1),
    "minicpm5_moe": range(3),
    "apertus1p5_text": range(2),  # (Apertus' model: "apertus" draws its options)
    "hy_v3": range(3),  # (GLM-4.5's routing, less its groups)
    "beam": range(2),  # (GLM-4.5's routing; its logits' cap: the tiny model's, in test_moe)
    "llama4_text": range(3),  # (its routing is one form; its attention options vary)
    "laguna": range(3),  # (per-channel and per-head gates, per-layer head counts, partial rotary among them)
    "gpt-sw3": range(2),
}
PROMPT = 19
BLOCK = 4


def _variant(family: str, seed: int) -> dict:
    # keyed by the family's name, so that a family added to OPTIONS leaves every other family's draws as
    # they were
    rng = np.random.default_rng([seed, zlib.crc32(family.encode())])
    # copies: transformers' config standardizes a rope dict in place (it would carry one model's theta
    # into the next that draws it)
    drawn = {
        name: copy.deepcopy(values[int(rng.integers(len(values)))])
        for name, values in OPTIONS[family].items()
    }
    form = drawn.pop("_form", {})
    return drawn | form


def _cases() -> list:
    return [
        pytest.param(family, seed, id=f"{family}-{seed}")
        for family in sorted(OPTIONS)
        if family in SUPPORTED
        for seed in FEWER_SEEDS.get(family, SEEDS)
    ]


def test_every_family_with_options_is_varied():
    """The families the config draws cover every supported family that has options of its own."""
    missing = sorted(set(SUPPORTED) - set(OPTIONS))
    assert not missing, missing


def _chunked_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a few positions, from prompt chunks then decode-sized steps over scattered blocks."""
    ex = TorchExecutor(model, num_blocks=16, block_size=BLOCK)
    blocks = [11, 3, 7, 0, 14]
    got = []
    for lo, hi in ((0, 6), (6, 15), (15, 16), (16, 17), (17, 19)):
        slots = [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(lo, hi)]
        batch = StepBatch.build(["s"], [ids[lo:hi].tolist()], [lo], [blocks], [slots], [True])
        got.append(ex.step(batch)[0])
    return torch.stack(got)


@pytest.mark.parametrize(("family", "seed"), _cases())
def test_config_variant_matches_transformers_or_is_refused(family, seed):
    options = _variant(family, seed)
    if family == "gpt_neox_japanese" and options.get("rotary_pct", 1.0) < 1 and not partial_ok():
        pytest.skip("this transformers' GPT-NeoX-Japanese fails on a partial rotary itself: no reference")
    # (XGLM in float32: its attention clamps the scores at a float32 tensor of the dtype's lowest value,
    # which float64's overflows)
    model = tiny_model(family, seed=seed, **options).to(torch.float32 if family == "xglm" else torch.float64)
    ids = torch.randint(0, model.config.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = model(ids[None]).logits[0, [5, 14, 15, 16, 18]].float()
    got = _chunked_logits(model, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{options}: {m}")
