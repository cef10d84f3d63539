"""One sliding-window rule: for every supported family, the windows the step graph applies, the windows
the torch executor applies, and the windows transformers' own forward applies are the same list; so are
the attention chunks (Llama 4's: ``("chunk", C)`` in those lists), the attention soft-caps (Gemma 2's) and
the layers with attention sinks (gpt-oss's) the three apply.

transformers is the oracle, read from the masks its eager attention receives and the soft-cap it passes
its attention function (no copy of its rules here); the step module (what the exporter traces) and the
torch executor are each run on the same prompt and must also reproduce transformers' logits, so a window
or cap that is reported but not applied (or applied but not reported) fails.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch

from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile import step as step_module
from trtforge.llm.compile.step import PagedDecoderStep
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.paged_attention import paged_attention_reference
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import SUPPORTED

PROMPT = 12  # tokens: longer than the short windows below, shorter than the long ones
BLOCK = 4
LAYERS = 3
SLIDING, FULL, CHUNKED = "sliding_attention", "full_attention", "chunked_attention"

CASES = [
    ("llama", {}),
    ("llama", {"set_sliding_window": 64}),  # set in the config, applied by no llama layer
    ("gpt2", {}),
    ("gpt2", {"set_sliding_window": 64}),
    ("openai-gpt", {"set_sliding_window": 64}),  # no GPT-1 layer applies one
    ("modernbert-decoder", {}),  # sliding, full, sliding; window 4 (local_attention 8); a RoPE table each
    ("modernbert-decoder", {"local_attention": 10, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("gpt-sw3", {"set_sliding_window": 64}),
    ("gpt_neox_japanese", {"set_sliding_window": 64}),
    ("mistral", {"sliding_window": 4}),
    ("mistral", {"sliding_window": None}),
    ("ministral3", {}),  # window 5 on every layer; each query scaled by its position
    ("ministral3", {"sliding_window": None}),
    ("mistral", {"sliding_window": 64}),  # window >= every length here
    ("mistral", {"sliding_window": 4, "layer_types": [SLIDING, FULL, FULL]}),  # mistral ignores them
    ("ministral", {"sliding_window": 4, "layer_types": [SLIDING, FULL, SLIDING]}),
    ("ministral", {"sliding_window": 5}),  # layer_types default: every layer sliding
    ("ministral", {"sliding_window": 4, "layer_types": [FULL, FULL, FULL]}),
    ("ministral", {"sliding_window": 64, "layer_types": [SLIDING, FULL, SLIDING]}),
    ("qwen2", {"sliding_window": 4, "use_sliding_window": False}),
    ("qwen2", {"sliding_window": 4, "use_sliding_window": True, "max_window_layers": 1}),
    ("qwen2", {"sliding_window": 4, "use_sliding_window": True, "layer_types": [SLIDING, FULL, SLIDING]}),
    ("qwen3", {"sliding_window": 4, "use_sliding_window": False}),
    ("qwen3", {"sliding_window": 5, "use_sliding_window": True, "max_window_layers": 2}),
    ("qwen3", {"sliding_window": 4, "use_sliding_window": True, "layer_types": [FULL, SLIDING, FULL]}),
    ("phi3", {"sliding_window": 4}),
    ("phi3", {"sliding_window": None}),
    ("starcoder2", {"sliding_window": 4}),
    ("starcoder2", {"sliding_window": None}),
    ("gpt_neox", {}),
    ("gpt_neox", {"set_sliding_window": 64}),  # no GPT-NeoX or Phi layer applies one
    ("phi", {}),
    ("phi", {"set_sliding_window": 64}),
    ("gemma", {}),
    ("gemma", {"set_sliding_window": 64}),  # no Gemma 1 layer applies one
    ("olmo2", {}),
    ("olmo2", {"set_sliding_window": 64}),
    ("granite", {}),
    ("granite", {"set_sliding_window": 64}),
    ("opt", {}),
    ("opt", {"set_sliding_window": 64}),
    ("gpt_bigcode", {}),
    ("gpt_bigcode", {"set_sliding_window": 64}),
    ("gpt_neo", {"window_size": 4, "attention_types": [[["local", "global", "local"], 1]]}),
    ("gpt_neo", {"window_size": 64, "attention_types": [[["global", "local"], 1], [["local"], 1]]}),
    ("gpt_neo", {"window_size": 5, "attention_types": [[["global"], 3]]}),
    ("gemma3_text", {}),  # sliding, full, sliding; window 4
    ("gemma3_text", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("gemma3_text", {"sliding_window": 64, "layer_types": [SLIDING, FULL, SLIDING]}),
    ("gemma3_text", {"sliding_window": 4, "layer_types": [FULL, FULL, FULL]}),
    ("gemma3_text", {"attn_logit_softcapping": 2.0}),  # kept by the config, passed on by no attention
    ("gemma2", {}),  # sliding, full, sliding; window 4; every layer's scores soft-capped at 3
    ("gemma2", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING], "attn_logit_softcapping": 2.0}),
    ("gemma2", {"sliding_window": 64, "attn_logit_softcapping": None}),
    ("stablelm", {}),
    ("stablelm", {"set_sliding_window": 64, "use_parallel_residual": True}),  # no StableLM layer applies one
    ("smollm3", {}),  # layer 1 NoPE, no window
    ("smollm3", {"sliding_window": 4, "use_sliding_window": True}),  # layer_types default: the NoPE layer
    ("smollm3", {"sliding_window": 4, "use_sliding_window": True, "layer_types": [SLIDING, FULL, SLIDING]}),
    ("smollm3", {"sliding_window": 4, "use_sliding_window": False}),  # layer_types default: all full
    # layer_types set: the eager/SDPA masks apply the window whatever use_sliding_window says
    ("smollm3", {"sliding_window": 4, "use_sliding_window": False, "layer_types": [SLIDING, FULL, FULL]}),
    ("gptj", {}),
    ("gptj", {"set_sliding_window": 64}),  # no GPT-J, CodeGen or Falcon layer applies one
    ("codegen", {}),
    ("falcon", {}),
    ("falcon", {"set_sliding_window": 64, "new_decoder_architecture": True, "num_kv_heads": 2}),
    ("mixtral", {"sliding_window": 4}),  # Mistral's rule: one window on every layer
    ("mixtral", {"sliding_window": None}),
    # Qwen2-MoE's config writes 0 for no window (use_sliding_window false); its layers by layer_types
    ("qwen2_moe", {"sliding_window": 4, "use_sliding_window": False}),
    ("qwen2_moe", {"sliding_window": 4, "use_sliding_window": True, "max_window_layers": 2}),
    ("qwen2_moe", {"sliding_window": 5, "use_sliding_window": True, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("qwen3_moe", {"sliding_window": 4, "use_sliding_window": True}),  # on every layer, not layer_types'
    ("qwen3_moe", {"sliding_window": 4, "use_sliding_window": False}),
    ("olmoe", {}),
    ("olmoe", {"set_sliding_window": 64}),  # no OLMoE layer applies one
    ("granitemoe", {}),
    ("granitemoeshared", {"set_sliding_window": 64}),  # no GraniteMoE layer applies one
    ("hunyuan_v1_moe", {}),
    ("ernie4_5_moe", {"set_sliding_window": 64}),  # no layer of these applies one
    ("glm4_moe", {"set_sliding_window": 64}),
    # dots.llm1: windows by layer_types (sliding, full, sliding by default), as its config builds them from
    # max_window_layers where it sets none
    ("flex_olmo", {"set_sliding_window": 64}),  # no FlexOLMo layer applies one
    # K-EXAONE: sliding (RoPE), full (NoPE), sliding; all full (NoPE: its config types the window an int)
    ("exaone_moe", {}),
    ("exaone_moe", {"layer_types": [FULL, FULL, FULL]}),
    ("dots1", {}),
    ("dots1", {"sliding_window": 5, "layer_types": None, "max_window_layers": 1}),
    ("param2moe", {"set_sliding_window": 64}),  # no layer of GLM-4.5's kin applies one
    ("sarvam_moe", {}),
    ("solar_open", {"set_sliding_window": 64}),
    ("mellum", {}),  # sliding, full, sliding; window 4; a RoPE table each
    ("hy_v3", {"set_sliding_window": 64}),  # no HY V3 layer applies one
    ("flint", {}),  # sliding, full, sliding; window 4; sinks on every layer
    ("flint", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("afmoe", {}),  # sliding (RoPE), full (NoPE), sliding; window 4
    ("beam", {}),  # sliding (RoPE), full (NoPE, queries scaled by position), sliding; window 4
    ("laguna", {}),  # sliding, full, sliding; window 4; a RoPE table each; 4, 8 and 2 query heads
    ("aria_text", {"set_sliding_window": 64}),  # no Aria layer applies one
    ("afmoe", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("mellum", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING]}),
    # Cohere 2-MoE: dense full layer 0 (RoPE: prefix pattern 1), sliding (RoPE), full (NoPE); then a dense
    # sliding layer 0 and NoPE full layer 1 (prefix pattern 2)
    # Granite SWA: full (RoPE 10000), sliding (NoPE), sliding (RoPE 100); window 4; sinks on every layer
    ("granite_swa", {}),
    ("granite_swa", {"sliding_window": 5, "layer_types": [SLIDING, FULL, SLIDING], "layer_rope_theta": None}),
    ("granitemoe_swa", {"layer_rope_theta": [0, 0, 0]}),  # every layer NoPE
    ("cohere2_moe", {}),
    ("cohere2_moe", {"sliding_window": 5, "layer_types": [SLIDING, FULL, SLIDING], "num_shared_experts": 0}),
    ("minimax_m2", {"set_sliding_window": 64}),  # no MiniMax-M2 or MiniCPM5-MoE layer applies one
    ("minicpm5_moe", {"set_sliding_window": 64}),
    ("kolibri1", {}),  # sliding (RoPE), full (NoPE), sliding; window 4
    ("kolibri1", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("olmo", {"set_sliding_window": 64}),  # no layer of these applies one
    ("cohere", {"set_sliding_window": 64}),
    ("glm", {}),
    ("glm4", {"set_sliding_window": 64}),
    ("nemotron", {}),
    ("persimmon", {"set_sliding_window": 64}),
    ("helium", {}),
    ("ernie4_5", {"set_sliding_window": 64}),
    ("hunyuan_v1_dense", {}),
    ("apertus", {"set_sliding_window": 64}),
    ("apertus1p5_text", {"set_sliding_window": 64}),
    ("arcee", {}),
    ("internlm3", {"set_sliding_window": 64}),
    ("seed_oss", {}),
    ("exaone", {"set_sliding_window": 64}),  # no EXAONE 3, IQuest-Coder, BioGPT or XGLM layer applies one
    ("iquestcoder", {}),
    ("biogpt", {"set_sliding_window": 64}),
    ("xglm", {"set_sliding_window": 64}),
    ("jais2", {}),
    ("nanochat", {"set_sliding_window": 64}),  # no NanoChat layer applies one
    ("hyperclovax", {"set_sliding_window": 64}),  # no Jais 2 or HyperCLOVA X layer applies one
    ("hyperclovax", {"use_post_norm": False}),
    ("cwm", {}),  # full, sliding, sliding (its default pattern); window 4
    ("cwm", {"sliding_window": 5, "layer_types": [SLIDING, FULL, SLIDING]}),
    ("cwm", {"sliding_window": 64}),
    ("vaultgemma", {}),  # sliding, full, sliding; window 4; every layer's scores soft-capped at 3
    ("vaultgemma", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING], "head_dim": 8}),
    ("olmo3", {}),  # sliding, full, sliding; window 4
    ("olmo3", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("cohere2", {}),  # sliding (RoPE), full (NoPE), sliding; window 4
    ("cohere2", {"sliding_window": 64, "layer_types": [FULL, SLIDING, FULL]}),
    ("exaone4", {}),  # sliding (RoPE), full (NoPE), sliding; window 4
    ("exaone4", {"sliding_window": None, "layer_types": [FULL, FULL, FULL]}),  # no window: all RoPE
    # ALiBi: no window either, whatever the config says (its biases ride in transformers' Falcon mask)
    ("falcon", {"alibi": True, "parallel_attn": False, "multi_query": False, "set_sliding_window": 64}),
    ("bloom", {}),
    ("bloom", {"set_sliding_window": 64, "n_head": 8}),
    ("mpt", {}),
    ("mpt", {"set_sliding_window": 64}),
    # gpt-oss: attention sinks on every layer, windows by layer_types (sliding, full, sliding by default)
    ("gpt_oss", {}),
    ("gpt_oss", {"sliding_window": 5, "layer_types": [FULL, SLIDING, SLIDING]}),
    ("gpt_oss", {"sliding_window": 64}),
    # Llama 4: chunked (8, RoPE), full (NoPE, queries scaled by position), chunked; a chunk as long as the
    # prompt; a chunked NoPE layer (layer_types set apart from no_rope_layers) of a chunk of 5
    ("llama4_text", {}),
    ("llama4_text", {"attention_chunk_size": 64}),
    ("llama4_text", {"attention_chunk_size": 5, "layer_types": [FULL, CHUNKED, CHUNKED]}),
]


def _model(family: str, overrides: dict) -> torch.nn.Module:
    overrides = dict(overrides)
    late = overrides.pop("set_sliding_window", None)
    layers = {"num_layers": LAYERS} if family in ("gpt_neo", "xglm") else {"num_hidden_layers": LAYERS}
    if family in ("gpt_bigcode", "openai-gpt"):
        layers = {"n_layer": LAYERS}
    model = tiny_model(family, **layers, **overrides)
    # (XGLM stays float32: its attention clamps the scores at a float32 tensor of the dtype's lowest value,
    # which float64's overflows)
    model = model if family == "xglm" else model.double()
    if late is not None:
        model.config.sliding_window = late
    return model


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    if model.config.model_type in ("gpt2", "gpt-sw3", "gpt_bigcode", "gptj", "codegen", "openai-gpt"):
        return [block.attn for block in model.transformer.h]
    if model.config.model_type in ("falcon", "bloom"):
        return [block.self_attention for block in model.transformer.h]
    if model.config.model_type == "mpt":
        return [block.attn for block in model.transformer.blocks]
    if model.config.model_type == "gpt_neo":
        return [block.attn.attention for block in model.transformer.h]
    if model.config.model_type == "opt":
        return [layer.self_attn for layer in model.model.decoder.layers]
    if model.config.model_type == "biogpt":
        return [layer.self_attn for layer in model.biogpt.layers]
    if model.config.model_type == "modernbert-decoder":
        return [layer.attn for layer in model.model.layers]
    if model.config.model_type == "gpt_neox":
        return [layer.attention for layer in model.gpt_neox.layers]
    if model.config.model_type == "gpt_neox_japanese":
        return [layer.attention for layer in model.gpt_neox_japanese.layers]
    return [layer.self_attn for layer in model.model.layers]


def _visible(rows: torch.Tensor) -> torch.Tensor:
    """How many keys each mask row shows (bool: visible; float: the dtype's lowest value hides, anything
    else shows: falcon-rw's carries its ALiBi biases)."""
    return rows.sum(-1) if rows.dtype == torch.bool else (rows > torch.finfo(rows.dtype).min / 2).sum(-1)


def _window_of(mask: torch.Tensor) -> int | tuple[str, int] | None:
    """The window a [B, 1, S, K] mask gives its last query of position PROMPT - 1: the number of keys it
    sees, None when that is all of them; ``("chunk", C)`` where its PROMPT queries see chunks of C
    positions (query p: its p % C + 1 last keys; C < PROMPT)."""
    seen = _visible(mask[0, 0, -PROMPT:]).long()
    positions = torch.arange(PROMPT)
    chunk = next((c for c in range(2, PROMPT) if torch.equal(seen, positions % c + 1)), None)
    if chunk is not None:
        return ("chunk", chunk)
    return None if int(seen[-1]) == PROMPT else int(seen[-1])


def _effective(windows: list[Any]) -> list[Any]:
    """What windows (and chunks) do to a PROMPT-token sequence: one at least that long is full attention."""
    return [None if w is None or (w[1] if isinstance(w, tuple) else w) >= PROMPT else w for w in windows]


def _bounds(spec: Any) -> list[Any]:
    """A spec's windows, with ``("chunk", C)`` on its chunked layers."""
    chunks = spec.attention_chunks or [None] * spec.num_layers
    return [w if c is None else ("chunk", c) for w, c in zip(spec.sliding_windows, chunks)]


def _prompt(model: torch.nn.Module) -> list[int]:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, model.config.vocab_size, (PROMPT,), generator=g).tolist()


def _transformers(model: torch.nn.Module, prompt: list[int]) -> tuple[list[int | None], Any, torch.Tensor]:
    """The windows of the masks transformers' eager attention gets, the soft-cap each layer passes its
    attention function with whether it passes sinks (gpt-oss's ``s_aux``; None where its modeling module
    has no eager attention function: GPT-Neo), and its last-token logits."""
    masks: list[torch.Tensor] = []
    caps: list[tuple[float | None, bool]] = []

    def record(module: torch.nn.Module, _args: tuple, kw: dict) -> None:
        mask = kw["attention_mask"]
        local = getattr(module, "bias", None)  # GPT-Neo: its window is a buffer the mask is combined with
        if type(module).__module__.endswith("modeling_openai"):  # GPT-1: its causal mask a 0/1 float buffer
            local = None if local is None else local > 0
        if isinstance(local, torch.Tensor) and local.dtype == torch.bool and local.dim() == 4:
            visible = local[:, :, :PROMPT, :PROMPT]
            mask = visible if mask is None else visible & ((mask == 0) if mask.dtype != torch.bool else mask)
        if type(module).__name__ == "MptAttention":  # its bool mask marks the hidden keys
            mask = ~mask
        masks.append(mask)

    def attend(module, query, key, value, attention_mask, **kwargs):  # the eager function, cap recorded
        caps.append((kwargs.get("softcap"), kwargs.get("s_aux") is not None))
        return eager(module, query, key, value, attention_mask, **kwargs)

    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in _attention_modules(model)]
    model.set_attn_implementation("eager")
    modeling = sys.modules[type(_attention_modules(model)[0]).__module__]
    eager = getattr(modeling, "eager_attention_forward", None)
    if eager is not None:
        modeling.eager_attention_forward = attend
    try:
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1]
    finally:
        if eager is not None:
            modeling.eager_attention_forward = eager
        for h in hooks:
            h.remove()
    return [_window_of(m) for m in masks], caps if eager is not None else None, logits


def _step_graph(model: torch.nn.Module, prompt: list[int], monkeypatch) -> tuple[list, list, list, Any]:
    """The step module the exporter traces: its spec's windows, the windows of the masks its attention
    gets, the soft-caps it gets (each with whether an ALiBi bias and attention sinks came too), and its
    last-token logits (the paged module run eagerly on one block table)."""
    step = PagedDecoderStep(model, max_seq=16, block_size=BLOCK)
    masks: list[torch.Tensor] = []
    caps: list[float | None] = []
    real = step_module.step_attention

    def recording(q, k, v, mask, scale, softcap=None, bias=None, sinks=None):
        masks.append(mask)
        caps.append((softcap, bias is not None, sinks is not None))
        return real(q, k, v, mask, scale, softcap, bias, sinks)

    monkeypatch.setattr(step_module, "step_attention", recording)
    spec = step.spec
    pool = (PROMPT // BLOCK, BLOCK, spec.num_kv_heads, spec.head_dim)
    dtype = next(model.parameters()).dtype  # (float64 but for XGLM: _model)
    pools = [torch.zeros(pool, dtype=dtype) for _ in range(2 * spec.num_layers)]
    with torch.no_grad():
        out = step(
            torch.tensor([prompt]),
            torch.arange(PROMPT)[None],
            torch.tensor([0]),
            torch.tensor([PROMPT]),
            torch.arange(PROMPT // BLOCK, dtype=torch.int32)[None],
            torch.arange(PROMPT)[None],
            *pools,
        )
    return _bounds(spec), [_window_of(m) for m in masks], caps, out[0][0]


def _torch_executor(model: torch.nn.Module, prompt: list[int]) -> tuple[list, list, torch.Tensor]:
    """The windows and soft-caps (each with whether ALiBi slopes and attention sinks came too) the torch
    executor hands its attention, layer by layer, and its last-token logits."""
    seen: list[int | None] = []
    caps: list[float | None] = []

    def attention(q, k_pool, v_pool, meta, scale, window=None, **kw):
        seen.append(window if kw.get("chunk") is None else ("chunk", kw["chunk"]))
        caps.append((kw.get("softcap"), kw.get("alibi_slopes") is not None, kw.get("sinks") is not None))
        return paged_attention_reference(q, k_pool, v_pool, meta, scale, window, **kw)

    ex = TorchExecutor(
        model, num_blocks=PROMPT // BLOCK, block_size=BLOCK, max_model_len=16, attention=attention
    )
    blocks = list(range(PROMPT // BLOCK))
    batch = StepBatch.build(["s"], [prompt], [0], [blocks], [list(range(PROMPT))], [True])
    return seen, caps, ex.step(batch)[0]


def _spec(model: torch.nn.Module):
    return PagedDecoderStep(model, max_seq=16, block_size=BLOCK).spec


def test_the_cases_cover_every_supported_family():
    assert {family for family, _ in CASES} == set(SUPPORTED)


@pytest.mark.parametrize(("family", "overrides"), CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_step_graph_torch_executor_and_transformers_apply_the_same_windows(family, overrides, monkeypatch):
    model = _model(family, overrides)
    prompt = _prompt(model)
    hf_windows, hf_caps, hf_logits = _transformers(model, prompt)
    spec_windows, graph_windows, graph_caps, graph_logits = _step_graph(model, prompt, monkeypatch)
    executor_windows, executor_caps, executor_logits = _torch_executor(model, prompt)
    assert len(hf_windows) == model.config.num_hidden_layers
    spec = _spec(model)
    if hf_caps is not None:
        got = [(c, k) for c, _, k in graph_caps]
        assert got == [(c, k) for c, _, k in executor_caps] == hf_caps, "other soft-caps or sinks"
    layers = zip(spec.attn_softcaps, spec.alibi_slopes, spec.attn_sinks)
    assert graph_caps == executor_caps == [(c, s is not None, k is not None) for c, s, k in layers]
    assert spec_windows == executor_windows, "the step graph and the torch executor disagree"
    assert graph_windows == _effective(spec_windows), "the step graph applies windows its spec does not name"
    assert _effective(executor_windows) == hf_windows, "transformers applies other windows"
    np.testing.assert_allclose(graph_logits.numpy(), hf_logits.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(executor_logits.numpy(), hf_logits.float().numpy(), rtol=1e-5, atol=1e-5)


def test_windows_are_in_the_manifest_spec_as_applied():
    """The windows the step graph's generation metadata records are the adapter's list, per layer."""
    model = _model("ministral", {"sliding_window": 4, "layer_types": [SLIDING, FULL, SLIDING]})
    assert PagedDecoderStep(model, 16, BLOCK).spec.to_dict()["sliding_windows"] == [4, None, 4]


@pytest.mark.parametrize(
    ("family", "overrides", "message"),
    [
        # qwen's config nulls the window without use_sliding_window; transformers' forward then fails
        (
            "qwen2",
            {"sliding_window": 4, "use_sliding_window": False, "layer_types": [SLIDING] * LAYERS},
            "qwen2 config: layer_types marks sliding_attention layers but sliding_window is null "
            r"\(use_sliding_window is false\)",
        ),
        (
            "qwen2_moe",
            {"sliding_window": 4, "use_sliding_window": False, "layer_types": [SLIDING] * LAYERS},
            "qwen2_moe config: layer_types marks sliding_attention layers but sliding_window is null "
            r"\(use_sliding_window is false\)",
        ),
        (
            "ministral",
            {"sliding_window": 4, "set_layer_types": ["chunked_attention"] * LAYERS},
            "layer_types",
        ),
        ("mistral", {"set_sliding_window": 0}, "sliding_window must be null or an integer >= 1, got 0"),
        (
            "llama4_text",
            {"attention_chunk_size": None, "layer_types": [CHUNKED, FULL, CHUNKED]},
            "llama4_text config: layer_types marks chunked_attention layers but attention_chunk_size is null",
        ),
        (
            "smollm3",
            {"layer_types": [SLIDING, FULL, FULL]},
            "smollm3 config: layer_types marks sliding_attention layers but sliding_window is null",
        ),
    ],
)
def test_windows_transformers_cannot_apply_are_refused_by_both_consumers(family, overrides, message):
    overrides = dict(overrides)
    layer_types = overrides.pop("set_layer_types", None)
    model = _model(family, overrides)
    if layer_types is not None:
        model.config.layer_types = layer_types
    with pytest.raises(UserError, match=message):
        PagedDecoderStep(model, 16, BLOCK)
    with pytest.raises(UserError, match=message):
        TorchExecutor(model, num_blocks=4, block_size=BLOCK)
    try:  # and transformers' own forward fails, or attends to nothing
        _, logits = _transformers(model, _prompt(model))
    except (AttributeError, KeyError, RuntimeError, TypeError, ValueError):
        return
    assert not torch.isfinite(logits).all()


def test_every_supported_family_has_an_adapter():
    """base.STYLES (what errors list) and families.ADAPTERS (what runs) name the same families."""
    from trtforge.llm.models import base, families

    assert set(families.ADAPTERS) == set(base.SUPPORTED)
    assert len(base.SUPPORTED) == len(set(base.SUPPORTED)), "a family listed under two styles"


@pytest.mark.parametrize(("window", "chunk"), [(None, None), (3, None), (None, 4), (3, 4)])
def test_visible_keys_is_causal_window_and_chunk_by_position(window, chunk):
    """base.visible_keys (the step graph's masks and the executors' references) against the rule written
    out one (query, key) pair at a time, negative query positions (rows that see no key) included."""
    from trtforge.llm.models.base import visible_keys

    keys, queries, end = torch.arange(12), torch.arange(-2, 12), 9
    got = visible_keys(keys[None, :], queries[:, None], window, chunk, torch.tensor(end))
    for p in queries.tolist():
        for j in keys.tolist():
            want = j <= p and j < end
            want = want and (window is None or j > p - window) and (chunk is None or j >= p - p % chunk)
            assert bool(got[p + 2, j]) == want, (p, j)
    assert torch.equal(visible_keys(keys[None, :], queries[:, None]), keys[None, :] <= queries[:, None])
