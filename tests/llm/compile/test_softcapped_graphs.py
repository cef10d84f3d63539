"""Soft-capped attention (Gemma 2's attn_logit_softcapping) in the step graphs: each capped layer's
attention is exported as plain ops (MatMul, Tanh on the scaled scores, Where for the mask, Softmax;
ONNX Attention's softcap attribute is refused by TensorRT's parser), which neither the attention-fusion
pass nor the paged pass turns into a kernel without the cap: the optimized graphs still give
transformers' tokens and logits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import trtforge.llm.api
from tests.llm.compile.test_decoder_paged import _assert_hf_greedy
from tests.llm.tiny_models import hf_greedy, prompts, tiny_model
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors import OrtPagedExecutor
from trtforge.passes.pipeline import optimize_model

NEW_TOKENS = 12


def _export(model, tmp_path, **kw):
    result = export_step(
        model, max_seq=64, max_batch=4, max_prefill=32, exporter="legacy", workdir=tmp_path, **kw
    )
    assert result.generation["attn_softcaps"] == [3.0] * result.generation["num_layers"]
    return result


def _optimized(result, attention: str) -> tuple[onnx.ModelProto, list[str]]:
    """The graph after every pass with `attention`: no pass fused a capped attention (nothing matched),
    each layer still softmaxes its capped scores, and every pass's ONNX Runtime check held."""
    out, ledger = optimize_model(result.model, attention=attention, debug=True)
    ops = [n.op_type for n in out.graph.node]
    layers = result.generation["num_layers"]
    assert not {"Attention", "PagedAttention", "FlashAttention"} & set(ops), ops
    assert ledger.matches("attention") == 0
    assert ops.count("Softmax") == layers
    for record in ledger.to_dict()["passes"]:
        assert record["verification"]["max_abs_error"] <= 1e-4, record["name"]
    return out, ops


def test_optimized_slot_graph_keeps_the_soft_cap_and_matches_transformers(tmp_path):
    model = tiny_model("gemma2")
    out, _ = _optimized(_export(model, tmp_path), "native")
    path = tmp_path / "optimized.onnx"
    onnx.save(out, str(path))
    batch = prompts(model.config.vocab_size)
    got, logits = trtforge.llm.api.load(path).generate(
        batch, max_new_tokens=NEW_TOKENS, stop_at_eos=False, return_logits=True
    )
    for b, prompt in enumerate(batch):
        want, want_logits = hf_greedy(model, prompt, NEW_TOKENS)
        assert got[b] == want, f"row {b}"
        assert np.abs(logits[b] - want_logits.numpy()).max() <= 1e-4


def test_optimized_paged_graph_keeps_the_soft_cap_and_matches_transformers(tmp_path):
    """`optimize --attention paged`: the paged pass rewrites ONNX Attention nodes only, so the capped
    layers keep their own write, gather and attention (the PagedAttention plugin has no cap)."""
    model = tiny_model("gemma2")
    out, ops = _optimized(_export(model, tmp_path, cache_layout="paged", block_size=4), "paged")
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
