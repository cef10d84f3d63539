"""GPT-J, CodeGen and Falcon beyond the logits every family's tests compare: the interleaved rotary bit
for bit against transformers' own in every dtype, the layouts the specs report, and what is refused by
name (falcon-rw's ALiBi; configs transformers' own forward cannot run either; GPT-J past its table)."""

from __future__ import annotations

import pytest
import torch

from tests.llm.models.test_rope_kin import eager_queries_and_keys
from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile.export import export_step
from trtforge.llm.compile.step import PagedDecoderStep
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import adapter_for


def _hf_rotated(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's query and key ``[B, heads, S, D]`` as transformers hands them to its eager attention."""
    import transformers

    module = __import__(type(model).__module__, fromlist=["eager_attention_forward"])
    if not hasattr(module, "eager_attention_forward"):
        pytest.skip(f"transformers {transformers.__version__}: {module.__name__} has no eager hook")
    return eager_queries_and_keys(model, ids)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("family", "overrides"),
    [("gptj", {}), ("gptj", {"rotary_dim": 16}), ("codegen", {}), ("falcon_40b", {})],
)
def test_rotated_queries_and_keys_are_transformers_bit_for_bit(family, overrides, dtype, tmp_path):
    """The adapter's q and k after rotary (the torch executor's flat layout) equal what transformers'
    attention receives, bit for bit, on a checkpoint loaded in `dtype` (whose sinusoid table
    from_pretrained keeps in float32): GPT-J's table cast to the model's dtype before rotating, CodeGen's
    rotation in float32 cast back, interleaved channel pairs, the rotated span."""
    import transformers

    tiny_model(family, **overrides).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()
    ids = torch.randint(0, 300, (1, 11), generator=torch.Generator().manual_seed(0))
    want_q, want_k = _hf_rotated(model, ids)
    if family != "falcon_40b":
        assert model.transformer.rotary_emb.embed_positions.dtype == torch.float32
    adapter = adapter_for(model)
    positions = torch.arange(ids.shape[1])
    with torch.no_grad():
        h = adapter.embed(ids[0], positions)
        q, k, _ = adapter.qkv(0, h)
        rope = adapter.rotary_over_heads(adapter.rotary(positions, h.dtype))
        q, k = adapter.rotate(0, q, k, rope)
    assert q.dtype == k.dtype == dtype
    assert torch.equal(q, want_q[0].transpose(0, 1)) and torch.equal(k, want_k[0].transpose(0, 1))


@pytest.mark.parametrize(
    ("family", "kv_heads", "rotated"),
    [("gptj", 4, 8), ("codegen", 8, 4), ("falcon", 1, 16), ("falcon_40b", 2, 16), ("falcon_serial", 4, 16)],
)
def test_specs_report_the_layouts(family, kv_heads, rotated):
    """KV heads per form (falcon-7b's one, falcon-40b's groups, per-head MHA), the rotated channels and
    their interleaving, GPT-J's table length as its positions."""
    spec = adapter_for(tiny_model(family)).spec
    assert spec.num_kv_heads == kv_heads
    assert spec.rotary["dim"] == rotated
    assert spec.rotary["interleaved"] is (family in ("gptj", "codegen"))
    assert spec.max_positions == 256 and spec.sliding_windows == [None, None]


@pytest.mark.parametrize(
    ("family", "overrides", "message"),
    [
        (  # the new architecture reads ln_attn, which only its parallel layers make
            "falcon",
            {"new_decoder_architecture": True, "num_kv_heads": 2, "parallel_attn": False},
            "new_decoder_architecture=True, parallel_attn=False with num_ln_in_parallel_attn=2",
        ),
        (  # the old one makes ln_attn and ln_mlp for 2 norms, then reads input_layernorm
            "falcon",
            {"parallel_attn": True, "num_ln_in_parallel_attn": 2},
            "new_decoder_architecture=False, parallel_attn=True with num_ln_in_parallel_attn=2",
        ),
        (  # per-head q, k, v with fewer KV heads configured: its attention repeats them past the queries
            "falcon",
            {"multi_query": False, "num_kv_heads": 2},
            "num_kv_heads=2 with multi_query and new_decoder_architecture off",
        ),
        ("gptj", {"rotary_dim": 32}, "rotary_dim 32 makes a 32-channel rotary table for 16 channels"),
        ("gptj", {"rotary_dim": 7}, "rotary_dim 7 makes a 8-channel rotary table for 7 channels"),
    ],
)
def test_configs_transformers_cannot_run_are_refused(family, overrides, message):
    """Each is refused by both consumers, naming the options, and transformers' own forward fails too."""
    model = tiny_model(family, **overrides)
    with pytest.raises(UserError, match=message):
        PagedDecoderStep(model, 16, 4)
    with pytest.raises(UserError, match=message):
        TorchExecutor(model, num_blocks=4)
    with pytest.raises((AttributeError, RuntimeError, UnboundLocalError)), torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))


def test_gptj_runs_no_longer_than_its_table(tmp_path):
    """GPT-J's positions are the n_positions rows of its sinusoid table (transformers' forward indexes
    past them and fails): the step graph and the torch executor refuse longer sequences."""
    model = tiny_model("gptj", n_positions=32)
    with pytest.raises(UserError, match="--max-seq 64 exceeds the model's 32 positions"):
        export_step(model, max_seq=64, exporter="legacy", workdir=tmp_path)
    with pytest.raises(UserError, match="max_model_len 64 exceeds the 32 rows of the rotary table"):
        TorchExecutor(model, num_blocks=4, max_model_len=64)
    TorchExecutor(model, num_blocks=4, max_model_len=32)  # the whole table: runs
