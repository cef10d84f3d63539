"""Shared checks of the step graphs of layers whose attention no pass may fuse (ALiBi biases, logit soft-caps,
attention sinks): the optimized graph keeps each layer's own softmax, and still gives transformers' tokens."""

from __future__ import annotations

import numpy as np
import onnx

import trtforge.llm.api
from tests.llm.tiny_models import hf_greedy, prompts
from trtforge.passes.pipeline import optimize_model


def optimized_unfused(
    result, attention: str, extra_softmaxes: bool = False
) -> tuple[onnx.ModelProto, list[str]]:
    """The graph after every pass with `attention`: no pass fused an attention, each layer still softmaxes
    its own scores (`extra_softmaxes`: at least one a layer, e.g. beside a sink column), and every pass's
    ONNX Runtime check held."""
    out, ledger = optimize_model(result.model, attention=attention, debug=True)
    ops = [n.op_type for n in out.graph.node]
    layers = result.generation["num_layers"]
    assert not {"Attention", "PagedAttention", "FlashAttention"} & set(ops), ops
    assert ledger.matches("attention") == 0
    softmaxes = ops.count("Softmax")
    assert softmaxes >= layers if extra_softmaxes else softmaxes == layers, (softmaxes, layers)
    for record in ledger.to_dict()["passes"]:
        assert record["verification"]["max_abs_error"] <= 1e-4, record["name"]
    return out, ops


def assert_slot_graph_matches_transformers(
    model, graph: onnx.ModelProto, tmp_path, new_tokens: int, lens: tuple[int, ...] | None = None
) -> None:
    """`graph` (a slot-layout step graph of `model`), saved and loaded, generates transformers' greedy tokens
    and its logits to 1e-4 from prompts of `lens` (None: the default prompts), against a reference that is
    not degenerate."""
    path = tmp_path / "graph.onnx"
    onnx.save(graph, str(path))
    batch = prompts(model.config.vocab_size) if lens is None else prompts(model.config.vocab_size, lens=lens)
    got, logits = trtforge.llm.api.load(path).generate(
        batch, max_new_tokens=new_tokens, stop_at_eos=False, return_logits=True
    )
    for b, prompt in enumerate(batch):
        want, want_logits = hf_greedy(model, prompt, new_tokens)
        assert len(set(want)) > 3, f"degenerate reference output {want}"
        assert got[b] == want, f"row {b}"
        assert np.abs(logits[b] - want_logits.numpy()).max() <= 1e-4
