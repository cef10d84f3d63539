"""ALiBi attention (BLOOM, MPT, falcon-rw) in the step graphs: each layer's position bias (its heads'
slopes times key minus query position, from the graph's position_ids) is added to the scaled scores as
plain ops before the mask, which neither the attention-fusion pass nor the paged pass turns into a
kernel without it (nor does the TensorRT plugin ever see such a layer): the optimized graphs still give
transformers' tokens and logits."""

from __future__ import annotations

import onnx

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
    slopes = result.generation["alibi_slopes"]
    assert len(slopes) == result.generation["num_layers"] and all(s is not None for s in slopes)
    return result


def test_optimized_slot_graph_keeps_the_biases_and_matches_transformers(tmp_path):
    model = tiny_model("bloom")
    out, _ = optimized_unfused(_export(model, tmp_path), "native")
    assert_slot_graph_matches_transformers(model, out, tmp_path, NEW_TOKENS)


def test_optimized_paged_graph_keeps_the_biases_and_matches_transformers(tmp_path):
    """`optimize --attention paged`: the paged pass rewrites ONNX Attention nodes only, so the ALiBi layers
    keep their own write, gather and attention (the PagedAttention plugin applies no bias)."""
    model = tiny_model("mpt")
    out, ops = optimized_unfused(_export(model, tmp_path, cache_layout="paged", block_size=4), "paged")
    assert ops.count("ScatterND") == 2 * model.config.n_layers
    path = tmp_path / "optimized.onnx"
    onnx.save(out, str(path))
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, "mpt")
