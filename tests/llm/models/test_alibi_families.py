"""ALiBi families (BLOOM, MPT, falcon-rw): the slopes as transformers computes them, the specs, and what is
refused by name (MPT options transformers' MPT does not build, a sequence past MPT's bias table, tensor
parallelism, the fused CUDA layers, weight quantization). Their logits and tokens against transformers run
in the shared family suites (tiny_models.FAMILIES: bloom, falcon_rw; test_config_variants: all three)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.base import alibi_bias, bloom_alibi_slopes, mpt_alibi_slopes
from trtforge.llm.models.families import adapter_for


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 14, 16, 32, 40, 71, 112])
def test_bloom_and_falcon_slopes_are_transformers(heads):
    """BLOOM's slopes for power-of-two head counts and the others (bloom-7b1: 32, bloom-176b: 112;
    falcon-rw-1b: 32; odd counts), exactly: transformers' BLOOM's own, and Falcon's alibi tensor at
    position 1 (its slopes in bfloat16)."""
    from transformers.models.bloom import modeling_bloom
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    ours = bloom_alibi_slopes(heads)
    if hasattr(modeling_bloom, "_get_alibi_slopes"):  # transformers 5.2x
        want = modeling_bloom._get_alibi_slopes(heads, torch.device("cpu"))
    else:  # 5.17: the slopes are the float32 alibi tensor at position 1
        mask = torch.ones(1, 2, dtype=torch.long)
        want = modeling_bloom.build_alibi_tensor(mask, heads, torch.float32)[:, 0, 1]
    assert ours.dtype == torch.float32 and torch.equal(ours, want)
    falcon = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)[:, 0, 1]
    assert torch.equal(ours.bfloat16().float(), falcon)


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 6, 8, 12, 24, 32, 48, 64])
@pytest.mark.parametrize("bias_max", [8, 4, 16])
def test_mpt_slopes_are_transformers(heads, bias_max):
    """MPT's slopes (mpt-7b: 32 heads, mpt-30b: 56; odd counts interleave), exactly: transformers' bias
    table at distance one."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    table = build_mpt_alibi_tensor(heads, 4, bias_max)  # [heads, 1, 4]: slope * (j - 3)
    assert torch.equal(mpt_alibi_slopes(heads, bias_max), -table[:, 0, 2])


def test_the_bias_is_slope_times_key_minus_query_position():
    slopes = torch.tensor([0.5, 0.25])
    relative = torch.tensor([[[-2.0, -1.0, 0.0, 1.0]]])  # one query at position 2, keys 0..3
    assert torch.equal(
        alibi_bias(slopes, relative)[0, :, 0], torch.tensor([[-1, -0.5, 0, 0.5], [-0.5, -0.25, 0, 0.25]])
    )


@pytest.mark.parametrize(
    ("family", "scale_slopes", "max_positions"),
    [("bloom", 1.0, None), ("mpt", 1.0, 256), ("falcon_rw", 16**-0.5, 256)],
)
def test_specs_carry_every_layers_slopes(family, scale_slopes, max_positions):
    """Positions 'alibi', no rotary, each layer's slopes in the spec (falcon-rw's in bfloat16 over
    sqrt(head_dim), as transformers' Falcon scales its bias); MPT's and Falcon's trained length as the
    positions' limit, none for BLOOM (its config records none)."""
    model = tiny_model(family)
    adapter = adapter_for(model)
    spec = adapter.spec
    heads = spec.num_heads
    want = (bloom_alibi_slopes(heads) if family != "mpt" else mpt_alibi_slopes(heads)).bfloat16().float()
    assert spec.positions == "alibi" and spec.rotary is None and spec.max_positions == max_positions
    assert spec.alibi_slopes == [[float(s) for s in want * scale_slopes]] * spec.num_layers
    assert adapter.rotary(torch.arange(3), torch.float32) is None
    assert adapter.bounded is (family == "mpt")


MPT_REFUSED = [
    ({"attn_config": {"alibi": False}}, r"attn_config.alibi=False \(learned positions instead of ALiBi\)"),
    ({"attn_config": {"attn_type": "multiquery_attention"}}, "attn_config.attn_type='multiquery_attention'"),
    ({"attn_config": {"qk_ln": True}}, r"attn_config.qk_ln=True \(per-head q/k LayerNorms\)"),
    ({"attn_config": {"prefix_lm": True}}, r"attn_config.prefix_lm=True \(prefix-LM attention\)"),
    ({"attn_config": {"alibi_bias_max": 16}}, "attn_config.alibi_bias_max=16"),
    ({"no_bias": False}, r"no_bias=False \(projection and norm biases\)"),
    ({"logit_scale": 0.5}, r"logit_scale=0.5 \(scaled logits\)"),
    ({"expansion_ratio": 2}, "expansion_ratio=2"),
    ({"norm_type": "rmsnorm"}, "norm_type='rmsnorm'"),
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    MPT_REFUSED,
    ids=[m[0] and next(iter(m[0])) + str(i) for i, m in enumerate(MPT_REFUSED)],
)
def test_mpt_options_transformers_does_not_build_are_refused_by_name(overrides, message, tmp_path):
    """transformers' MPT ignores these options (its modules and forward are the same with or without
    them), so neither it nor trtforge would run such a checkpoint as trained: the adapter, the step graph
    and the torch executor refuse each by name, writing nothing."""
    model = tiny_model("mpt", **overrides)
    full = f"mpt model MptForCausalLM: its config sets {message}"
    with pytest.raises(UserError, match=full):
        adapter_for(model)
    with pytest.raises(UserError, match=full):
        export_step(model, max_seq=32, exporter="legacy", workdir=tmp_path)
    with pytest.raises(UserError, match="the torch executor cannot run this mpt model"):
        TorchExecutor(model, num_blocks=4)
    assert list(tmp_path.iterdir()) == []


def test_mpt_sequences_stop_at_its_bias_table(tmp_path):
    """transformers' MPT builds its bias for max_seq_len positions (its forward fails past them): a
    longer cache is refused by the executor and the step graph."""
    model = tiny_model("mpt", max_seq_len=32)
    with pytest.raises(
        UserError, match=r"max_model_len 64 exceeds the 32 positions of the ALiBi bias table .*max_seq_len"
    ):
        TorchExecutor(model, num_blocks=4, max_model_len=64)
    with pytest.raises(UserError, match="--max-seq 64 exceeds the model's 32 positions"):
        export_step(model, max_seq=64, exporter="legacy", workdir=tmp_path)
    assert TorchExecutor(model, num_blocks=4).facts is not None  # its own length is fine


@pytest.mark.parametrize("family", ["bloom", "mpt", "falcon_rw"])
def test_quantization_refuses_alibi_families_by_name_and_tensor_parallelism_slices_the_slopes(family):
    """These families' weights have no quantized layout here: quantization refuses (FP8 and INT4 weights
    alike), naming the family. Tensor parallelism gives each rank its heads' slopes (their splits run in
    tests/llm/test_tensor_parallel.py), falcon-rw's as BLOOM's and MPT's."""
    from trtforge.llm.models.parallel import TensorParallel
    from trtforge.llm.quant.apply import quantize_model

    model = tiny_model(family)
    model_type = model.config.model_type
    for method in ("fp8", "int4-awq", "int4-rtn"):
        with pytest.raises(UserError, match=f"the {model_type} family .* has no quantized path"):
            quantize_model(model, method)
    adapter = adapter_for(model)
    slopes = adapter.alibi_slopes[0]
    adapter.shard(TensorParallel(1, 2))
    half = adapter.num_heads
    assert half * 2 == len(slopes) and torch.equal(adapter.alibi_slopes[0], slopes[half:])


def test_fused_layers_refuse_alibi_slopes():
    """The fused CUDA layers are Llama's exactly: a layer with ALiBi slopes is refused (said why)."""
    from trtforge.llm.executors.fused_layers import fusable

    adapter = adapter_for(tiny_model("llama"))
    assert fusable(adapter) is None
    adapter.alibi_slopes = [bloom_alibi_slopes(adapter.num_heads)] * adapter.num_layers
    assert fusable(adapter) == "ALiBi position biases (Llama-style layers have none)"


def test_falcon_rw_bias_is_transformers_scaled_bias():
    """transformers' falcon-rw adds bf16(slope) * j / sqrt(head_dim) to its scores (through the mask): the
    adapter's slopes are that bias per unit distance."""
    model = tiny_model("falcon_rw")
    adapter = adapter_for(model)
    head_dim = adapter.head_dim
    want = bloom_alibi_slopes(adapter.num_heads).bfloat16().float() / math.sqrt(head_dim)
    assert all(torch.equal(s, want) for s in adapter.alibi_slopes)
