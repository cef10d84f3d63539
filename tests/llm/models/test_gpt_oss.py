"""gpt-oss (llm.models.gpt_oss): what its tiny model exercises (sinks that bite, windows crossed, the SwiGLU
clamp and every bias in play), the optimized step graphs (no pass fuses a sink layer's plain-op attention;
they still give transformers' tokens and logits), the dynamo exporter, the refusals (quantization, tensor
parallelism, the fused layers, experts in another layout), and transformers' BF16 forward against the torch
executor. The family also runs in the MoE suites (test_moe: step graph vs generate, both formulations vs
transformers' block, a ragged torch-executor batch), the config draws, the window oracle, the chunked
paged steps and the Triton-executor lockstep (tiny_models.KERNEL_FAMILIES); its kernels' sinks in
tests/kernels/test_attention_options.py."""

from __future__ import annotations

import onnx
import pytest
import torch

from tests.llm.compile.test_decoder_paged import _assert_hf_greedy
from tests.llm.compile.unfused_attention import assert_slot_graph_matches_transformers, optimized_unfused
from tests.llm.tiny_models import prompts, tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors import OrtPagedExecutor
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import adapter_for

NEW_TOKENS = 12


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_the_tiny_model_exercises_what_gpt_oss_adds():
    """The sinks, the SwiGLU clamp and the expert / router biases each move transformers' logits (so a
    consumer that drops one fails the suites), and the prompts cross the window."""
    model = tiny_model("gpt_oss")
    ids = prompts(model.config.vocab_size, lens=(17,))[0]
    assert model.config.sliding_window < len(ids)
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    base = _logits(model, ids)
    experts = model.model.layers[0].mlp.experts

    def moved(change) -> float:
        m = tiny_model("gpt_oss")
        change(m)
        return (_logits(m, ids) - base).abs().max().item()

    def no_sinks(m):
        for layer in m.model.layers:
            layer.self_attn.sinks.data.fill_(float("-inf"))

    def unclamped(m):
        for layer in m.model.layers:
            layer.mlp.experts.limit = float("inf")

    def no_biases(m):
        for layer in m.model.layers:
            layer.mlp.experts.gate_up_proj_bias.data.zero_()
            layer.mlp.router.bias.data.zero_()

    assert moved(no_sinks) > 0.05
    assert moved(unclamped) > 0.05
    assert moved(no_biases) > 0.05
    assert experts.limit == 1.0 and (model.model.layers[0].self_attn.sinks.abs() > 0.1).any()


def _export(model, tmp_path, **kw):
    result = export_step(
        model, max_seq=64, max_batch=4, max_prefill=32, exporter="legacy", workdir=tmp_path, **kw
    )
    sinks = result.generation["attn_sinks"]
    assert len(sinks) == result.generation["num_layers"] and all(s is not None for s in sinks)
    return result


def test_optimized_slot_graph_keeps_the_sinks_and_matches_transformers(tmp_path):
    model = tiny_model("gpt_oss")
    out, _ = optimized_unfused(_export(model, tmp_path), "native", extra_softmaxes=True)
    assert_slot_graph_matches_transformers(model, out, tmp_path, NEW_TOKENS)


def test_optimized_paged_graph_keeps_the_sinks_and_matches_transformers(tmp_path):
    """`optimize --attention paged`: the paged pass rewrites ONNX Attention nodes only, so the sink layers
    keep their own write, gather and attention (the PagedAttention plugin has no sinks)."""
    model = tiny_model("gpt_oss")
    result = _export(model, tmp_path, cache_layout="paged", block_size=4)
    out, ops = optimized_unfused(result, "paged", extra_softmaxes=True)
    assert ops.count("ScatterND") == 2 * model.config.num_hidden_layers
    path = tmp_path / "optimized.onnx"
    onnx.save(out, str(path))
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, "gpt_oss")


@pytest.mark.slow
def test_dynamo_step_graph_matches_hf_generate(tmp_path):
    """The dynamo exporter's step graph (Concat / Softmax / Slice around each sink column, the dense
    experts' strided gate/up slices) in exact ONNX Runtime gives transformers' tokens and logits."""
    model = tiny_model("gpt_oss")
    result = export_step(model, max_seq=48, max_batch=4, max_prefill=24, exporter="dynamo", workdir=tmp_path)
    assert_slot_graph_matches_transformers(model, result.model, tmp_path, NEW_TOKENS, lens=(1, 5, 17))


def test_bf16_prefill_on_the_torch_executor_matches_transformers():
    """A BF16 model (what from_pretrained gives after transformers dequantizes MXFP4 experts): the torch
    executor's prefill logits against transformers' BF16 forward, within a few BF16 steps (transformers
    softmaxes its sink column in BF16, the executor in float32)."""
    model = tiny_model("gpt_oss").to(torch.bfloat16)
    ids = prompts(model.config.vocab_size, lens=(17,))[0]
    want = _logits(model, ids).float()
    ex = TorchExecutor(model, num_blocks=8, block_size=4)
    batch = StepBatch.build(["s"], [ids], [0], [[0, 1, 2, 3, 4]], [list(range(len(ids)))], [True])
    got = ex.step(batch)[0]
    assert got.argmax() == want.argmax()
    assert (got - want).abs().max().item() < 0.1 * want.abs().max().item()


def test_quantization_tensor_parallelism_and_fused_layers_refuse_gpt_oss(tmp_path):
    from trtforge.llm import from_pretrained
    from trtforge.llm.compile.compile import compile_generate
    from trtforge.llm.executors.fused_layers import fusable
    from trtforge.llm.models.parallel import TensorParallel
    from trtforge.llm.quant import quantize_model

    model = tiny_model("gpt_oss")
    moe = "gpt_oss model GptOssForCausalLM has sparse mixture-of-experts MLPs"
    with pytest.raises(UserError, match=f"{moe}.*MoE MLPs have no such path yet"):
        quantize_model(model, "fp8")
    with pytest.raises(UserError, match=f"quantization='int4-rtn'.*{moe}"):
        from_pretrained(model, quantization="int4-rtn", num_blocks=4)
    with pytest.raises(UserError, match=f"tensor parallelism .*{moe}"):
        adapter_for(model).shard(TensorParallel(0, 2))
    with pytest.raises(UserError, match=f"--generate --precision int4: the {moe}"):
        compile_generate(model, None, precision="int4", build=False, save_onnx=tmp_path / "s")
    # the fused layers take Llama-style adapters only; were one to carry sinks, it would be refused too
    assert fusable(adapter_for(model)) == "attention sinks (Llama-style layers have none)"
    # the fused MoE kernels take its experts' layout (FP32 here): CUDA graphs may hold its steps; in
    # float64, which the kernels do not take, the torch executor steps eagerly and says why
    assert all(m.fused_refusal() is None for m in adapter_for(model.float()).moe if m is not None)
    assert TorchExecutor(model.float(), num_blocks=8, block_size=16).cuda_graphs_refusal is None
    refusal = TorchExecutor(model.double(), num_blocks=8, block_size=16).cuda_graphs_refusal
    assert "layer 0's block: torch.float64 experts (the fused kernels take FP16, BF16 or FP32)" in refusal


def test_experts_in_another_layout_are_refused_naming_gpt_oss():
    """MXFP4 experts (transformers' Mxfp4GptOssExperts: blocks and scales, no 3-D float gate_up_proj) or any
    other layout are refused by name: only the dequantized model runs."""
    model = tiny_model("gpt_oss")
    experts = model.model.layers[1].mlp.experts
    experts.is_concatenated = True  # (as if its gate/up columns were halves: not gpt-oss's layout)
    want = "gpt_oss model GptOssForCausalLM: layer 1's MLP .* not transformers' GptOssMLP.*MXFP4 experts"
    with pytest.raises(UserError, match=want):
        adapter_for(model)
    model = tiny_model("gpt_oss")
    blocks = model.model.layers[0].mlp.experts
    blocks.gate_up_proj_blocks = blocks.gate_up_proj.detach().to(torch.uint8)  # as MXFP4 holds its codes
    del blocks.gate_up_proj
    with pytest.raises(UserError, match="layer 0's MLP .*load the checkpoint dequantized to BF16"):
        adapter_for(model)
