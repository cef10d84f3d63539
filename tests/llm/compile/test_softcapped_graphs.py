"""Soft-capped attention (Gemma 2's attn_logit_softcapping) in the step graphs: each capped layer's
attention is exported as plain ops (MatMul, Tanh on the scaled scores, Where for the mask, Softmax;
ONNX Attention's softcap attribute is refused by TensorRT's parser), which neither the attention-fusion
pass nor the paged pass turns into a kernel without the cap: the optimized graphs still give
transformers' tokens and logits."""

from __future__ import annotations

import onnx
import pytest

from tests.llm.compile.test_decoder_paged import _assert_hf_greedy
from tests.llm.compile.unfused_attention import assert_slot_graph_matches_transformers, optimized_unfused
from tests.llm.tiny_models import tiny_model
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors import OrtPagedExecutor

NEW_TOKENS = 12


def _export(model, tmp_path, **kw):
    result = export_step(
        model, max_seq=64, max_batch=4, max_prefill=32, exporter="legacy", workdir=tmp_path, **kw
    )
    assert result.generation["attn_softcaps"] == [3.0] * result.generation["num_layers"]
    return result


def test_optimized_slot_graph_keeps_the_soft_cap_and_matches_transformers(tmp_path):
    model = tiny_model("gemma2")
    out, _ = optimized_unfused(_export(model, tmp_path), "native")
    assert_slot_graph_matches_transformers(model, out, tmp_path, NEW_TOKENS)


def test_optimized_paged_graph_keeps_the_soft_cap_and_matches_transformers(tmp_path):
    """`optimize --attention paged`: the paged pass rewrites ONNX Attention nodes only, so the capped
    layers keep their own write, gather and attention (the PagedAttention plugin has no cap)."""
    model = tiny_model("gemma2")
    out, ops = optimized_unfused(_export(model, tmp_path, cache_layout="paged", block_size=4), "paged")
    assert ops.count("ScatterND") == 2 * model.config.num_hidden_layers
    path = tmp_path / "optimized.onnx"
    onnx.save(out, str(path))
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, "gemma2")


@pytest.mark.parametrize("exporter", ["legacy", pytest.param("dynamo", marks=pytest.mark.slow)])
def test_the_cap_is_on_the_scores_before_the_mask_in_the_exported_graph(exporter, tmp_path):
    """Each capped layer's scores (MatMul, Mul by the scale) go Div, Tanh, Mul (by the cap) into the mask's
    Where, then Softmax: the cap before the mask, as transformers applies it (a cap after it would lift
    the masked scores to -cap)."""
    model = tiny_model("gemma2")
    result = export_step(model, max_seq=64, max_batch=4, max_prefill=32, exporter=exporter, workdir=tmp_path)
    graph = onnx.inline_local_functions(result.model).graph if result.model.functions else result.model.graph
    producer = {out: n for n in graph.node for out in n.output}
    softmaxes = [n for n in graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == model.config.num_hidden_layers
    for softmax in softmaxes:
        chain, value = [], softmax.input[0]
        while value in producer and len(chain) < 8:
            node = producer[value]
            chain.append(node.op_type)
            if node.op_type == "MatMul":
                break
            value = node.input[2] if node.op_type == "Where" else node.input[0]  # (Where: cond, fill, x)
        assert chain == ["Where", "Mul", "Tanh", "Div", "Mul", "MatMul"], chain
