"""Attention with heads folded into the batch ([B*H, S, D] bmm): real legacy exports, hand-built graphs.

DeBERTa-v2/v3 (a per-head Reshape view, relative-position bias, masked_fill of a [B, 1, S, S] mask
whose padding query rows are fully filled) and nn.MultiheadAttention with need_weights (additive
key-padding mask, key from [S, N, D]). Every pipeline run verifies each pass in ONNX Runtime on
feeds with padded tails, so padded rows are compared too.
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtforge.passes.pipeline import optimize_model

LAYERS = 2


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _attention(ledger):
    return next(p for p in ledger.passes if p.name == "attention")


def _assert_fused(model: onnx.ModelProto, count: int) -> None:
    fused, ledger = optimize_model(model)
    ops = _ops(fused)
    assert ops["Attention"] == count
    assert "Softmax" not in ops
    att = _attention(ledger)
    assert att.matches == count and att.verification is not None
    assert list(att.per_rule.values()) == [count] and next(iter(att.per_rule)).endswith("-> Attention")
    assert all(p.verification is not None for p in ledger.passes)


def _export(module, inputs: dict, tmp_path, dynamic) -> onnx.ModelProto:
    from trtforge.compiler.export import export_module

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        art = export_module(module, inputs, tmp_path, dynamic=dynamic, exporter="legacy")
    return onnx.load(str(art.path))


def _deberta(tmp_path, **config) -> onnx.ModelProto:
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.DebertaV2Config(
        vocab_size=80,
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        **config,
    )

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = T.DebertaV2Model(cfg).eval()

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(0, 80, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    return _export(Hidden().eval(), inputs, tmp_path, "batch,seq")


@pytest.mark.slow
def test_deberta_v2_fused(tmp_path):
    # DeBERTa-v2 defaults: no relative attention, so the masked_fill is the only term.
    _assert_fused(_deberta(tmp_path), LAYERS)


@pytest.mark.slow
def test_deberta_v3_like_fused(tmp_path):
    # v3: relative attention with log buckets, shared position keys, c2p + p2c bias, runtime scale.
    model = _deberta(
        tmp_path,
        relative_attention=True,
        position_buckets=16,
        max_relative_positions=32,
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        norm_rel_ebd="layer_norm",
    )
    _assert_fused(model, LAYERS)


@pytest.mark.slow
@pytest.mark.parametrize("padding", [True, False], ids=["key_padding_mask", "no_mask"])
def test_legacy_multihead_attention_fused(tmp_path, padding):
    # need_weights=True (the default) takes the bmm path: heads folded, key [S, N, D], additive mask.
    import torch

    torch.manual_seed(0)

    class MHA(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x, mask):
            return self.a(x, x, x, key_padding_mask=(mask == 0) if padding else None)[0] + mask.sum()

    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    # Static shapes: the legacy trace of nn.MultiheadAttention bakes the sequence length in.
    model = _export(MHA().eval(), {"x": torch.randn(2, 8, 16), "mask": mask}, tmp_path, None)
    _assert_fused(model, 1)


# --- hand-built: Where(cond, fill, scores) on [N, S, S] scores -----------------------------------------
N, S, D = 4, 6, 8


def _masked_fill_graph(fill: float | None, fill_first: bool = True) -> onnx.ModelProto:
    """q/k/v [N, S, D]; scores masked_fill'ed where query or key is padding (padding query rows are
    fully filled); `fill` None: the fill is a graph input (not a constant)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), f"w{i}") for i in range(3)
    ]
    inits += [
        numpy_helper.from_array(np.array(D**-0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([2], np.int64), "ax2"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, S, D]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [N, S]),
    ]
    if fill is None:
        inputs.append(helper.make_tensor_value_info("fill", TensorProto.FLOAT, []))
    else:
        inits.append(numpy_helper.from_array(np.array(fill, np.float32), "fill"))
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [name]) for i, name in enumerate("qkv")]
    where_inputs = ["cond", "fill", "scaled"] if fill_first else ["keep", "scaled", "fill"]
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Unsqueeze", ["attention_mask", "ax2"], ["mq"]),
        helper.make_node("Unsqueeze", ["attention_mask", "ax1"], ["mk"]),
        helper.make_node("Mul", ["mq", "mk"], ["both"]),
        helper.make_node("Equal", ["both", "zero"], ["cond"]),
        helper.make_node("Not", ["cond"], ["keep"]),
        helper.make_node("Where", where_inputs, ["filled"]),
        helper.make_node("Softmax", ["filled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [N, S, D])
    graph = helper.make_graph(nodes, "masked_fill", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("fill_first", [True, False], ids=["Where(pad, fill, S)", "Where(keep, S, fill)"])
@pytest.mark.parametrize("fill", [float(np.finfo(np.float32).min), -1e30])
def test_masked_fill_fused_with_padded_rows_exact(fill, fill_first):
    _assert_fused(_masked_fill_graph(fill, fill_first), 1)


@pytest.mark.parametrize(
    "fill", [None, 0.0, -1e4, -1e9, -np.inf], ids=["runtime", "zero", "-1e4", "-1e9", "-inf"]
)
def test_masked_fill_not_absorbing_is_left_alone(fill):
    fused, ledger = optimize_model(_masked_fill_graph(fill), debug=True)
    ops = _ops(fused)
    assert ops["Softmax"] == 1 and "Attention" not in ops
    att = _attention(ledger)
    assert att.matches == 0
    assert any("masked_fill value" in r for r in att.rejected), att.rejected


@pytest.mark.parametrize("strategy", ["none", "plugin"])
def test_other_strategies_leave_folded_attention_alone(strategy):
    # plugin needs a head count and a [B, S] padding input, neither of which a folded batch has.
    if strategy == "plugin":
        pytest.importorskip("trtforge.plugins.attention.onnx_node", reason="attention plugin module absent")
    graph = _masked_fill_graph(float(np.finfo(np.float32).min))
    fused, ledger = optimize_model(graph, attention=strategy, debug=True)
    att = _attention(ledger)
    assert _ops(fused)["Softmax"] == 1 and att.matches == 0
    if strategy == "plugin":
        assert any("fused for native only" in r for r in att.rejected), att.rejected


# --- hand-built: Where(cond, fill, scores) on per-head [B, H, S, S] scores (XLM, FlauBERT) -------------
B, H, HD = 2, 2, 4


def _masked_fill_4d_graph(fill: float, bias: bool = False) -> onnx.ModelProto:
    """x [B, S, H*HD] -> q/k/v [B, H, S, HD]; scores masked_fill'ed where the key is padding
    (attention_mask == 0 viewed [B, 1, 1, S]), as XLM's `scores.masked_fill_(mask, finfo.min)`;
    `bias`: a [H, S, S] position bias added before the fill, as an ALiBi step graph does."""
    rng = np.random.default_rng(0)
    e = H * HD
    inits = [
        numpy_helper.from_array(rng.standard_normal((e, e)).astype(np.float32), f"w{i}") for i in range(3)
    ]
    inits += [
        numpy_helper.from_array(np.array([B, S, H, HD], np.int64), "heads"),
        numpy_helper.from_array(np.array([B, 1, 1, S], np.int64), "mask_view"),
        numpy_helper.from_array(np.array(HD**-0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(fill, np.float32), "fill"),
        numpy_helper.from_array(rng.standard_normal((H, S, S)).astype(np.float32), "bias"),
    ]
    nodes = []
    for i, name in enumerate("qkv"):
        nodes += [
            helper.make_node("MatMul", ["x", f"w{i}"], [f"{name}_flat"]),
            helper.make_node("Reshape", [f"{name}_flat", "heads"], [f"{name}_bshd"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["q_bshd"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["v_bshd"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k_bshd"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Equal", ["attention_mask", "zero"], ["pad"]),
        helper.make_node("Reshape", ["pad", "mask_view"], ["cond"]),
        helper.make_node("Add", ["scaled", "bias"], ["biased"]),
        helper.make_node("Where", ["cond", "fill", "biased" if bias else "scaled"], ["filled"]),
        helper.make_node("Softmax", ["filled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_fill_4d",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, e]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [B, S]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, H, S, HD])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_per_head_masked_fill_fuses_exactly_with_fully_masked_rows():
    # XLM's attention was left decomposed: the per-head matcher took only additive masks
    import onnxruntime as ort

    model = _masked_fill_4d_graph(float(np.finfo(np.float32).min))
    fused, ledger = optimize_model(model)
    assert _ops(fused)["Attention"] == 1 and "Softmax" not in _ops(fused)
    assert _attention(ledger).verification is not None
    x = np.random.default_rng(1).standard_normal((B, S, H * HD)).astype(np.float32)
    mask = np.ones((B, S), np.int64)
    mask[0, 3:] = 0
    mask[1, :] = 0  # every key masked: torch's softmax is uniform there, so must the fused graph's be
    outs = [
        ort.InferenceSession(m.SerializeToString()).run(None, {"x": x, "attention_mask": mask})[0]
        for m in (model, fused)
    ]
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5)


@pytest.mark.parametrize("fill", [-1e4, -np.inf], ids=["-1e4", "-inf"])
def test_per_head_masked_fill_not_absorbing_is_left_alone(fill):
    fused, ledger = optimize_model(_masked_fill_4d_graph(fill), debug=True)
    assert _ops(fused)["Softmax"] == 1 and "Attention" not in _ops(fused)
    assert any("masked_fill value" in r for r in _attention(ledger).rejected), _attention(ledger).rejected


def test_per_head_masked_fill_of_biased_scores_is_left_alone():
    # masked_fill(S + bias): the ALiBi step graphs' layers, which no pass may fuse (test_alibi_graphs)
    fill = float(np.finfo(np.float32).min)
    fused, ledger = optimize_model(_masked_fill_4d_graph(fill, bias=True), debug=True)
    assert _ops(fused)["Softmax"] == 1 and "Attention" not in _ops(fused)
    assert any("additive term" in r for r in _attention(ledger).rejected), _attention(ledger).rejected
