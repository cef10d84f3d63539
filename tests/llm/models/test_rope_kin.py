"""The Llama relatives of the rotary knobs (OLMo 1 / 3, Cohere 1 / 2, GLM, Nemotron, Persimmon, Helium,
ERNIE 4.5, EXAONE 4, HunYuan, Apertus; Arcee, InternLM3 and Seed-OSS on the Llama-style adapter) beyond
the logits the step-graph and config-draw tests compare in float32 / float64: the rotated queries and keys
bit for bit against what transformers' attention receives in bfloat16 and float16 (float32 tables and
rotations, interleaved pairs, partial spans, NoPE layers, norms after the rotary), the specs, and what the
Llama-only paths refuse by name."""

from __future__ import annotations

import pytest
import torch

from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.executors.fused_layers import fusable
from trtforge.llm.models.families import LlamaStyle, adapter_for
from trtforge.llm.quant.apply import quantize_model

ROTARY_KIN = [
    "olmo",
    "olmo3",
    "cohere",
    "cohere2",
    "glm",
    "glm4",
    "nemotron",
    "persimmon",
    "helium",
    "ernie4_5",
    "exaone4",
    "hunyuan_v1_dense",
]


def eager_queries_and_keys(
    model: torch.nn.Module, ids: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's query and key ``[B, heads, S, D]`` as transformers hands them to its eager attention
    (test_gptj_falcon.py reads them too)."""
    module = __import__(type(model).__module__, fromlist=["eager_attention_forward"])
    real, seen = module.eager_attention_forward, []

    def recording(attn, query, key, value, *args, **kwargs):
        seen.append((query, key))
        return real(attn, query, key, value, *args, **kwargs)

    model.set_attn_implementation("eager")
    module.eager_attention_forward = recording
    try:
        with torch.no_grad():
            model(ids)
    finally:
        module.eager_attention_forward = real
    return seen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", ROTARY_KIN)
def test_rotated_queries_and_keys_are_transformers_bit_for_bit(family, dtype, tmp_path):
    """Both layers' q and k after the rotary (the torch executor's flat layout, each layer fed
    transformers' own input to it) equal what transformers' attention receives, bit for bit, on a
    checkpoint loaded in `dtype`: OLMo's and ERNIE's float32 tables, Cohere's and ERNIE's float32 rotation,
    the interleaved pairs, partial spans, Cohere 2's and EXAONE 4's NoPE full layers, HunYuan's norms
    after the rotary."""
    import transformers

    tiny_model(family).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()
    ids = torch.randint(0, 300, (1, 11), generator=torch.Generator().manual_seed(0))
    inputs: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_pre_hook(
            lambda _m, args, kw: inputs.append((args or (kw["hidden_states"],))[0]), with_kwargs=True
        )
        for layer in model.model.layers
    ]
    try:
        want = eager_queries_and_keys(model, ids)
    finally:
        for h in hooks:
            h.remove()
    adapter = adapter_for(model)
    positions = torch.arange(ids.shape[1])
    rope = adapter.rotary_over_heads(adapter.rotary(positions, dtype))
    for i, (want_q, want_k) in enumerate(want):
        with torch.no_grad():
            q, k, _ = adapter.qkv(i, inputs[i][0])
            q, k = adapter.rotate(i, q, k, rope)
        assert q.dtype == k.dtype == dtype
        assert torch.equal(q, want_q[0].transpose(0, 1)), f"layer {i} queries"
        assert torch.equal(k, want_k[0].transpose(0, 1)), f"layer {i} keys"


@pytest.mark.parametrize(
    ("family", "dim", "interleaved"),
    [
        ("glm", 8, True),
        ("cohere", 16, True),
        ("helium", 16, True),
        ("nemotron", 8, False),
        ("olmo", 16, False),
    ],
)
def test_specs_report_the_rotary(family, dim, interleaved):
    """The rotated channels (GLM's and Nemotron's partial half of 16) and their interleaving; OLMo 3 and
    Cohere 2 one table (per type) and their windows."""
    spec = adapter_for(tiny_model(family)).spec
    assert (spec.rotary["dim"], spec.rotary["interleaved"]) == (dim, interleaved)
    olmo3 = adapter_for(tiny_model("olmo3")).spec
    assert olmo3.rotary["sliding_attention"]["theta"] == 100.0 and olmo3.sliding_windows == [4, None]
    assert adapter_for(tiny_model("cohere2")).spec.sliding_windows == [4, None]


def test_config_values_transformers_cannot_run_are_refused_by_name():
    """Cohere's logit_scale null (transformers multiplies the logits by it), a Helium head_dim its hidden x
    hidden output projection cannot take, a Persimmon, Phi or StableLM rotary span of an odd number of
    channels or one its rotary table (sized by a head_dim key the attention ignores) does not cover:
    UserError, and transformers' own forward fails too."""
    ids = torch.tensor([[1, 2, 3]])
    cohere = tiny_model("cohere")
    cohere.config.logit_scale = None
    cohere.logit_scale = None
    with pytest.raises(UserError, match="cohere model CohereForCausalLM: its config sets logit_scale=None"):
        adapter_for(cohere)
    helium = tiny_model("helium", head_dim=8)
    with pytest.raises(UserError, match=r"helium model .*num_attention_heads \(4\) x head_dim \(8\)"):
        adapter_for(helium)
    persimmon = tiny_model("persimmon", partial_rotary_factor=0.3125)  # 5 of 16 channels
    with pytest.raises(UserError, match="persimmon model .* rotates 5 of each head's 16 channels"):
        adapter_for(persimmon)
    odd = {f: tiny_model(f, partial_rotary_factor=0.3125) for f in ("phi", "stablelm")}
    for family, model in odd.items():
        with pytest.raises(UserError, match=f"{family} model .* rotates 5 of each head's 16 channels"):
            adapter_for(model)
    # (a head_dim key StableLM's attention ignores sizes its rotary table: 2 channels for its span of 4)
    sized = tiny_model("stablelm", partial_rotary_factor=0.25, head_dim=8)
    message = r"rotates 4 of each head's 16 channels, but its rotary table covers 2 \(sized by the config's "
    message += "head_dim 8, which the attention does not use"
    with pytest.raises(UserError, match=message):
        adapter_for(sized)
    for model in (cohere, helium, persimmon, sized, *odd.values()):
        with pytest.raises((TypeError, RuntimeError)), torch.no_grad():
            model(ids)


def test_llama_style_kin_on_the_llama_only_paths():
    """Arcee, InternLM3 and Seed-OSS run the Llama-style adapter: InternLM3 (Llama's own classes) fits the
    fused layers; Arcee's squared-ReLU MLP and Seed-OSS's output bias are refused there by name, and
    Arcee's non-gated MLP by quantization; Jais 2's likewise. CWM's own RMSNorm class fits."""
    adapters = {f: adapter_for(tiny_model(f)) for f in ("arcee", "internlm3", "seed_oss")}
    assert all(isinstance(a, LlamaStyle) for a in adapters.values())
    assert fusable(adapters["internlm3"]) is None
    assert fusable(adapters["arcee"]) == "hidden_act 'relu2' (the fused MLP is SiLU-gated)"
    assert fusable(adapter_for(tiny_model("seed_oss", attention_out_bias=True))) == (
        "biased output or MLP projections"
    )
    with pytest.raises(UserError, match="arcee layer 0 has no gated MLP"):
        quantize_model(tiny_model("arcee"), "fp8")
    # Jais 2: Arcee's squared-ReLU non-gated MLP, refused alike; CWM: its own RMSNorm class computes Llama's
    assert fusable(adapter_for(tiny_model("jais2"))) == "hidden_act 'relu2' (the fused MLP is SiLU-gated)"
    with pytest.raises(UserError, match="jais2 layer 0 has no gated MLP"):
        quantize_model(tiny_model("jais2"), "fp8")
    assert fusable(adapter_for(tiny_model("cwm"))) is None


def test_the_fused_layers_take_a_norm_by_what_it_computes_not_its_name():
    """A norm class of another name with Llama's forward fits the fused layers; one named LlamaRMSNorm that
    computes anything else (here Gemma's 1 + weight) is refused, naming its class."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    model = tiny_model("llama")
    renamed = type("LlamaRMSNorm", (GemmaRMSNorm,), {"variance_epsilon": 1e-6})
    copied = type("MyRMSNorm", (torch.nn.Module,), {"forward": type(model.model.norm).forward})
    assert fusable(adapter_for(model)) is None
    for layer in model.model.layers:
        layer.post_attention_layernorm.__class__ = copied
    assert fusable(adapter_for(model)) is None
    model.model.layers[1].input_layernorm.__class__ = renamed
    assert fusable(adapter_for(model)) == "norm LlamaRMSNorm"
