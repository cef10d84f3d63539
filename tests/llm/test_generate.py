"""Acceptance: batched greedy generation over the step graph equals HF generate token for token."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import trtforge.llm
import trtforge.llm.api
from tests.llm.tiny_models import (
    FAMILIES,
    HOSTILE_SHAPES,
    LIGHT_FAMILIES,
    hf_greedy,
    prompts,
    tiny_model,
)
from trtforge.llm.compile.export import export_step

NEW_TOKENS = 32
EXPORTERS = ["legacy", pytest.param("dynamo", marks=pytest.mark.slow)]


def _step_file(model, tmp_path, exporter: str, **kw):
    result = export_step(
        model, max_seq=64, max_batch=4, max_prefill=32, exporter=exporter, workdir=tmp_path, **kw
    )
    assert result.exporter == exporter and result.fallback_reason is None
    path = tmp_path / "step.onnx"
    onnx.save(result.model, str(path))
    return path, result


# every family on both exporters; the light ones (tiny_models.LIGHT_FAMILIES) on one: the legacy, but for
# Apertus (and Apertus 1.5's text model), whose xIELU activation (expm1) the legacy exporter has no ONNX
# symbolic for
LIGHT = [(f, "dynamo" if f.startswith("apertus") else "legacy") for f in LIGHT_FAMILIES]
CASES = [
    *(pytest.param(f, "legacy", id=f"{f}-legacy") for f in FAMILIES),
    *(pytest.param(f, "dynamo", id=f"{f}-dynamo", marks=pytest.mark.slow) for f in FAMILIES),
    *(pytest.param(f, e, id=f"{f}-{e}") for f, e in LIGHT),
]


@pytest.mark.parametrize(("family", "exporter"), CASES)
def test_batched_generate_matches_hf(family, exporter, tmp_path):
    model = tiny_model(family)
    path, result = _step_file(model, tmp_path, exporter)
    ops = {n.op_type for n in result.model.graph.node}
    g = result.generation
    layers_attn = zip(g["attn_softcaps"], g["alibi_slopes"], g["attn_sinks"])
    spelled = sum(c is not None or s is not None or k is not None for c, s, k in layers_attn)
    assert "TensorScatter" in ops
    # ONNX Attention for the layers without a soft-cap, ALiBi or sinks (those are spelled out:
    # ops.step_attention)
    assert ("Attention" in ops) == (spelled < g["num_layers"])
    llm = trtforge.llm.api.load(path)
    batch = prompts(model.config.vocab_size)
    got, got_logits = llm.generate(batch, max_new_tokens=NEW_TOKENS, stop_at_eos=False, return_logits=True)
    for b, prompt in enumerate(batch):
        want, want_logits = hf_greedy(model, prompt, NEW_TOKENS)
        assert len(set(want)) > 3, f"degenerate reference output {want}"
        assert got[b] == want, f"row {b} (prompt length {len(prompt)})"
        err = np.abs(got_logits[b] - want_logits.numpy()).max()
        assert err <= 1e-4, f"row {b}: logits max abs err {err}"
    with trtforge.llm.load(path) as served:  # the same graph behind the engine
        assert served.generate(batch, max_new_tokens=NEW_TOKENS, stop_at_eos=False) == got


def test_qwen2_has_qkv_bias_and_llama_gqa():
    """The configs above exercise what the families differ in: QKV bias (qwen2) and GQA (all llama-style)."""
    qwen = tiny_model("qwen2")
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None
    llama = tiny_model("llama")
    assert llama.config.num_key_value_heads < llama.config.num_attention_heads


def test_other_shapes_mha_and_odd_vocab(tmp_path):
    """Nothing depends on the test config's numbers: MHA, 3 layers, head_dim 8, odd vocab, eos stop."""
    model = tiny_model(
        "llama",
        seed=3,
        vocab_size=517,
        hidden_size=48,
        num_attention_heads=6,
        num_key_value_heads=6,
        num_hidden_layers=3,
        eos_token_id=None,
    )
    path, _ = _step_file(model, tmp_path, "legacy")
    batch = prompts(517, lens=(5, 2))
    with trtforge.llm.load(path) as llm:
        got = llm.generate(batch, max_new_tokens=12, stop_at_eos=False)
    for b, prompt in enumerate(batch):
        assert got[b] == hf_greedy(model, prompt, 12)[0]


@pytest.mark.parametrize(("family", "overrides"), HOSTILE_SHAPES)
def test_qwen3_and_phi3_hostile_shapes_match_hf(family, overrides, tmp_path):
    model = tiny_model(family, seed=5, **overrides)
    attn = model.model.layers[0].self_attn
    if "head_dim" in overrides:
        assert attn.head_dim == overrides["head_dim"] and attn.head_dim * 4 != model.config.hidden_size
    if overrides.get("tie_word_embeddings"):
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    path, result = _step_file(model, tmp_path, "legacy")
    assert result.generation["head_dim"] == attn.head_dim
    assert result.generation["num_kv_heads"] == overrides["num_key_value_heads"]
    llm = trtforge.llm.api.load(path)
    batch = prompts(300, lens=(7, 2, 12))
    got, got_logits = llm.generate(batch, max_new_tokens=10, stop_at_eos=False, return_logits=True)
    for b, prompt in enumerate(batch):
        want, want_logits = hf_greedy(model, prompt, 10)
        assert got[b] == want, f"row {b}"
        assert np.abs(got_logits[b] - want_logits.numpy()).max() <= 1e-4


def test_longrope_runs_by_its_short_factors_up_to_its_original_length(tmp_path):
    """Phi-3's longrope (Phi-3.5 / Phi-4-mini): transformers rotates every position by the short factors
    while the call's longest position is within original_max_position_embeddings, and switches them all to
    the long factors past it (which keys cached under the short ones cannot follow). The step graph and the
    torch executor run it as transformers does up to that length (its attention scaling included) and
    refuse a longer --max-seq / max_model_len naming it. Before, every longrope model was refused."""
    from trtforge.errors import UserError
    from trtforge.llm.executors.torch_exec import TorchExecutor

    short = [1.0, 1.5, 2.0, 3.0, 5.0, 8.0]
    rope = {"rope_type": "longrope", "short_factor": short, "long_factor": [16.0] * 6, "rope_theta": 1e4}
    model = tiny_model(
        "phi3", rope_parameters=rope | {"partial_rotary_factor": 0.75}, original_max_position_embeddings=64
    )
    assert model.model.rotary_emb.rope_type == "longrope" and model.model.rotary_emb.attention_scaling > 1
    batch = prompts(model.config.vocab_size, lens=(5, 23))
    want = [hf_greedy(model, p, 8)[0] for p in batch]
    result = export_step(model, max_seq=32, max_batch=2, max_prefill=24, exporter="legacy", workdir=tmp_path)
    onnx.save(result.model, str(tmp_path / "step.onnx"))
    got = trtforge.llm.api.load(tmp_path / "step.onnx").generate(batch, max_new_tokens=8, stop_at_eos=False)
    assert got == want
    with trtforge.llm.from_pretrained(model, num_blocks=32, block_size=4) as served:
        assert served.generate(batch, max_new_tokens=8, stop_at_eos=False) == want
    limit = r"exceeds the model's 64 positions, .*\(original_max_position_embeddings of its longrope"
    with pytest.raises(UserError, match=limit):
        export_step(model, max_seq=65, exporter="legacy", workdir=tmp_path)
    with pytest.raises(UserError, match=r"max_model_len 65 exceeds the 64 positions .*longrope rotary"):
        TorchExecutor(model, num_blocks=8, block_size=4, max_model_len=65)


def test_generate_stops_row_at_eos(tmp_path):
    model = tiny_model("gpt2")
    path, _ = _step_file(model, tmp_path, "legacy")
    llm = trtforge.llm.api.load(path)
    batch = prompts(300, lens=(4, 7))
    free = llm.generate(batch, max_new_tokens=10, stop_at_eos=False)
    stop = free[0][2]
    llm.generation["eos_token_ids"] = [stop]
    stopped = llm.generate(batch, max_new_tokens=10)
    assert stopped[0] == free[0][: free[0].index(stop) + 1]
    assert stopped[1] == (free[1][: free[1].index(stop) + 1] if stop in free[1] else free[1])


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "phi3"])
def test_sliding_window_layers_match_hf(family, tmp_path):
    """A window shorter than the context: mistral and phi3 (every layer), qwen2/qwen3 (layer_types mix)."""
    extra = {"use_sliding_window": True, "max_window_layers": 1} if family.startswith("qwen") else {}
    model = tiny_model(family, sliding_window=4, **extra)
    path, result = _step_file(model, tmp_path, "legacy")
    assert 4 in result.generation["sliding_windows"]
    batch = prompts(300, lens=(9, 3))
    with trtforge.llm.load(path) as llm:
        got = llm.generate(batch, max_new_tokens=8, stop_at_eos=False)
    for b, prompt in enumerate(batch):
        assert got[b] == hf_greedy(model, prompt, 8)[0]


def test_all_logits_graph_matches_hf_forward(tmp_path):
    """all_logits=True: logits of every new position of a ragged prefill, and generation still works."""
    import torch

    model = tiny_model("llama")
    path, _ = _step_file(model, tmp_path, "legacy", all_logits=True)
    llm = trtforge.llm.api.load(path)
    batch = prompts(300, lens=(6, 2))
    feeds = {
        "input_ids": np.array([batch[0], batch[1] + [0] * 4], np.int64),
        "position_ids": np.array([list(range(6)), [0, 1, 1, 1, 1, 1]], np.int64),
        "past_lens": np.zeros(2, np.int64),
        "new_lens": np.array([6, 2], np.int64),
        **llm.executor.new_cache(2),
    }
    logits = llm.executor.run(feeds)["logits"]
    assert logits.shape == (2, 6, 300)
    with torch.no_grad():
        for b, prompt in enumerate(batch):
            want = model(torch.tensor([prompt])).logits[0].numpy()
            assert np.abs(logits[b, : len(prompt)] - want).max() <= 1e-4
    want = [hf_greedy(model, p, 6)[0] for p in batch]
    assert llm.generate(batch, 6, stop_at_eos=False) == want
    with trtforge.llm.load(path) as served:  # the engine asks an all-positions graph for last tokens
        assert served.generate(batch, max_new_tokens=6, stop_at_eos=False) == want


def test_dynamic_rotary_is_refused_by_the_step_graph_pointing_at_the_torch_executor(tmp_path):
    """A step graph holds one rotary table; dynamic NTK rotary runs on the torch executor instead."""
    from trtforge.errors import UserError

    model = tiny_model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert model.model.rotary_emb.rope_type == "dynamic"
    with pytest.raises(UserError, match="rotary scaling 'dynamic'.*torch executor"):
        export_step(model, max_seq=32, exporter="legacy", workdir=tmp_path)


@pytest.mark.parametrize(
    "family", ["llama", "gpt2", "opt", "gpt_neox", "phi", "stablelm", "gptj", "falcon", "bloom", "mpt"]
)
def test_a_window_the_attention_does_not_apply_is_refused_when_it_would_bite(family, tmp_path):
    """Llama and GPT-2 attention apply no window, yet HF generate()'s cache truncates to a configured
    sliding_window: shorter than the cache it is refused by name on every path; at least as long it is
    harmless, ignored, and generation matches HF."""
    from trtforge.errors import UserError
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model = tiny_model(family)
    model.config.sliding_window = 4
    with pytest.raises(UserError, match=f"{family} model .*sliding_window=4, shorter than --max-seq 32"):
        export_step(model, max_seq=32, exporter="legacy", workdir=tmp_path)
    with pytest.raises(UserError, match="sliding_window=4, shorter than max_model_len 32.*torch executor"):
        TorchExecutor(model, num_blocks=8, block_size=4, max_model_len=32)
    model.config.sliding_window = 64
    path, result = _step_file(model, tmp_path, "legacy")
    assert result.generation["sliding_windows"] == [None, None]
    batch = prompts(300, lens=(9, 3))
    with trtforge.llm.load(path) as llm:
        got = llm.generate(batch, max_new_tokens=8, stop_at_eos=False)
    assert got == [hf_greedy(model, p, 8)[0] for p in batch]


def test_every_end_of_sequence_id_of_the_generation_config_stops_a_row(tmp_path):
    """Llama 3 lists several EOS ids in generation_config; HF generate stops at any of them, and so do the
    step graph's loop and the torch executor's serving (they stopped only at config.eos_token_id)."""
    import torch

    from trtforge.llm import service

    model = tiny_model("llama", seed=2)
    prompt = prompts(300, lens=(6,))[0]
    free, _ = hf_greedy(model, prompt, 12)
    stop = next(t for t in free[2:] if t not in free[:2] and t != model.config.eos_token_id)
    model.generation_config.eos_token_id = [299, stop] if stop != 299 else [298, stop]
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :]
    want = free[: free.index(stop) + 1]
    assert ref.tolist() == want, "transformers did not stop at the generation config's EOS"
    served = service.from_pretrained(model, num_blocks=16, block_size=4, max_model_len=64)
    assert stop in served.eos_token_ids
    assert served.generate([prompt], max_new_tokens=12) == [want]
    path, result = _step_file(model, tmp_path, "legacy")
    assert stop in result.generation["eos_token_ids"]
    with trtforge.llm.load(path) as llm:
        assert llm.generate([prompt], max_new_tokens=12) == [want]


@pytest.mark.parametrize(
    ("family", "overrides", "windows"),
    [
        # Ministral's per-layer windows; Starcoder2's LayerNorm, GELU MLP, biases, one window every layer
        (
            "ministral",
            {"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]},
            [5, None],
        ),
        ("starcoder2", {"sliding_window": 5}, [5, 5]),
        ("starcoder2", {"use_bias": False, "sliding_window": None, "norm_epsilon": 1e-2}, [None, None]),
        # GPT-NeoX sequential (parallel by default) with partial and linearly scaled rotary
        ("gpt_neox", {"use_parallel_residual": False, "rotary_pct": 0.5}, [None, None]),
        (
            "gpt_neox",
            {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25}},
            [None, None],
        ),
        # Phi's q/k LayerNorm with partial rotary, GQA by default and MHA here
        ("phi", {"qk_layernorm": True, "partial_rotary_factor": 0.75}, [None, None]),
        ("phi", {"qk_layernorm": True, "num_key_value_heads": 4, "partial_rotary_factor": 0.5}, [None, None]),
        # StableLM parallel with per-head q/k norms and half of each head rotated, or sequential and plain
        ("stablelm", {"use_parallel_residual": True, "partial_rotary_factor": 0.5}, [None, None]),
        ("stablelm", {"qk_layernorm": False, "use_qkv_bias": False}, [None, None]),
        # SmolLM3's NoPE layer first; then the window on its NoPE layer (use_sliding_window's layer_types)
        ("smollm3", {"num_hidden_layers": 3, "no_rope_layers": [0, 1, 1]}, [None] * 3),
        (
            "smollm3",
            {"num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 5},
            [None, 5, None],
        ),
    ],
)
def test_family_forms_match_hf_on_the_step_graph_and_the_torch_executor(family, overrides, windows, tmp_path):
    """Forms of a family the tiny default config does not take, windows shorter than the prompts: the
    slot and paged step graphs and the torch executor, batched, give HF's greedy tokens run alone."""
    from trtforge.llm import service

    model = tiny_model(family, seed=4, **overrides)
    if family == "gpt_neox":  # (GPTNeoXConfig ignores some spellings of its options: they took effect)
        layer = model.gpt_neox.layers[0]
        assert layer.use_parallel_residual is overrides.get("use_parallel_residual", True)
        assert model.gpt_neox.rotary_emb.inv_freq.numel() * 2 < layer.attention.head_size  # partial
    if family == "phi":
        assert model.model.layers[0].self_attn.qk_layernorm
    batch = prompts(300, lens=(9, 2, 14))
    want = [hf_greedy(model, p, 10)[0] for p in batch]
    assert len({t for w in want for t in w}) > 6, f"degenerate reference output {want}"
    for layout in ("slot", "paged"):
        path, result = _step_file(model, tmp_path / layout, "legacy", cache_layout=layout)
        assert result.generation["sliding_windows"] == windows
        with trtforge.llm.load(path, num_blocks=64 if layout == "paged" else None) as llm:
            assert llm.generate(batch, max_new_tokens=10, stop_at_eos=False) == want, layout
    served = service.from_pretrained(model, num_blocks=64, block_size=4, max_model_len=64)
    assert served.generate(batch, max_new_tokens=10, stop_at_eos=False) == want


def test_minicpm5_projects_q_gate_once_a_layer_and_matches_hf(tmp_path):
    """MiniCPM5-MoE's q_gate_proj makes each head's queries and its attention output gate. Before, the gate
    projected it again after the attention: two GEMMs of it per layer and step (as many calls as k_proj's,
    twice), on the torch executor and in the step graph. Now one, and greedy tokens still equal HF's."""
    from trtforge.llm import service

    model = tiny_model("minicpm5_moe")
    batch = prompts(model.config.vocab_size, lens=(7, 2, 12))
    want = [hf_greedy(model, p, 8)[0] for p in batch]
    calls = {"q_gate_proj": 0, "k_proj": 0}

    def counter(name):
        def hook(*_):
            calls[name] += 1

        return hook

    hooks = [
        getattr(layer.self_attn, name).register_forward_hook(counter(name))
        for layer in model.model.layers
        for name in calls
    ]
    try:
        with service.from_pretrained(model, num_blocks=32, block_size=4, max_model_len=64) as served:
            assert served.generate(batch, max_new_tokens=8, stop_at_eos=False) == want
        assert calls["k_proj"] > 0 and calls["q_gate_proj"] == calls["k_proj"], calls
        calls.update(q_gate_proj=0, k_proj=0)
        path, _ = _step_file(model, tmp_path, "legacy")
        assert calls["k_proj"] > 0 and calls["q_gate_proj"] == calls["k_proj"], calls
    finally:
        for h in hooks:
            h.remove()
    got = trtforge.llm.api.load(path).generate(batch, max_new_tokens=8, stop_at_eos=False)
    assert got == want
