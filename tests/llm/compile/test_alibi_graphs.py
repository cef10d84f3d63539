"""ALiBi attention (BLOOM, MPT, falcon-rw) in the step graphs: each layer's position bias (its heads'
slopes times key minus query position, from the graph's position_ids) is added to the scaled scores as
plain ops before the mask, which neither the attention-fusion pass nor the paged pass turns into a
kernel without it (nor does the TensorRT plugin ever see such a layer): the optimized graphs still give
transformers' tokens and logits."""

from __future__ import annotations

import numpy as np
import onnx

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
    slopes = result.generation["alibi_slopes"]
    assert len(slopes) == result.generation["num_layers"] and all(s is not None for s in slopes)
    return result


def _optimized(result, attention: str) -> tuple[onnx.ModelProto, list[str]]:
    """The graph after every pass with `attention`: no pass fused an ALiBi attention, each layer still
    softmaxes its own biased scores, and every pass's ONNX Runtime check held."""
    out, ledger = optimize_model(result.model, attention=attention, debug=True)
    ops = [n.op_type for n in out.graph.node]
    assert not {"Attention", "PagedAttention", "FlashAttention"} & set(ops), ops
    assert ledger.matches("attention") == 0
    assert ops.count("Softmax") == result.generation["num_layers"]
    for record in ledger.to_dict()["passes"]:
        assert record["verification"]["max_abs_error"] <= 1e-4, record["name"]
    return out, ops


def test_optimized_slot_graph_keeps_the_biases_and_matches_transformers(tmp_path):
    model = tiny_model("bloom")
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


def test_optimized_paged_graph_keeps_the_biases_and_matches_transformers(tmp_path):
    """`optimize --attention paged`: the paged pass rewrites ONNX Attention nodes only, so the ALiBi layers
    keep their own write, gather and attention (the PagedAttention plugin applies no bias)."""
    model = tiny_model("mpt")
    out, ops = _optimized(_export(model, tmp_path, cache_layout="paged", block_size=4), "paged")
    assert ops.count("ScatterND") == 2 * model.config.n_layers
    path = tmp_path / "optimized.onnx"
    onnx.save(out, str(path))
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, "mpt")
