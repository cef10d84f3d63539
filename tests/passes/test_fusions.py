"""Each fusion on tiny hand-built graphs: every variant fused (op types asserted), numerics equal."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.passes._graphs import GraphBuilder, feeds_for, op_counts, run_ort
from trtforge.passes.pipeline import optimize_model


def _fuse(model, **kw):
    out, ledger = optimize_model(model, **kw)
    feeds = feeds_for(model)
    for a, b in zip(run_ort(model, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    return out, ledger


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("div", ["div", "recip"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("eps_node", [True, False])
@pytest.mark.parametrize("scale_first", [True, False])
def test_layernorm_variants_fuse(square, div, bias, eps_node, scale_first):
    g = GraphBuilder()
    g.layernorm(square=square, div=div, bias=bias, eps_node=eps_node, scale_first=scale_first)
    out, ledger = _fuse(g.build(), passes=["cleanup", "layernorm"])
    ops = op_counts(out)
    assert ops.get("LayerNormalization") == 1
    assert not {"ReduceMean", "Sqrt", "Sub"} & set(ops)
    assert ledger.matches("layernorm") >= 1
    ln = next(n for n in out.graph.node if n.op_type == "LayerNormalization")
    assert len(ln.input) == (3 if bias else 2)


def test_layernorm_with_other_axis_is_left_alone():
    g = GraphBuilder()
    g.layernorm(complete=False)
    out, _ = _fuse(g.build(), passes=["cleanup", "layernorm"])
    assert "LayerNormalization" not in op_counts(out)


def test_layernorm_from_opset_14_raises_opset_and_fuses():
    g = GraphBuilder(opset=14)  # ReduceMean(axes=...) attribute form, as legacy exports at opset 14
    g.layernorm()
    out, ledger = _fuse(g.build(), passes=["layernorm"])
    assert op_counts(out).get("LayerNormalization") == 1
    assert ledger.opset_before == 14 and ledger.opset_after == 18
    assert ledger.to_dict()["opset_change"] == {"from": 14, "to": 18}


def test_rmsnorm_fuses_to_opset_23():
    g = GraphBuilder()
    x = g.x
    ms = g.op(
        "ReduceMean", g.op("Pow", x, g.const(2.0)), g.const([-1], "axes"), keepdims=1, noop_with_empty_axes=0
    )
    r = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.const(1e-6))))
    g.x = g.op("Mul", g.op("Mul", x, r), g.const(np.ones(16, np.float32) * 1.5, "w"))
    out, ledger = _fuse(g.build(), passes=["rmsnorm"])
    assert op_counts(out).get("RMSNormalization") == 1
    assert ledger.opset_after == 23


@pytest.mark.parametrize("form", ["erf", "tanh"])
@pytest.mark.parametrize("grouping", ["xh_g", "xg_h", "x_hg"])
@pytest.mark.parametrize("div", [True, False])
def test_gelu_variants_fuse(form, grouping, div):
    g = GraphBuilder()
    g.gelu(form=form, grouping=grouping, div=div)
    out, ledger = _fuse(g.build(), passes=["cleanup", "gelu"])
    gelus = [n for n in out.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == 1
    approx = {a.name: a.s for a in gelus[0].attribute}.get("approximate", b"none")
    assert approx == (b"none" if form == "erf" else b"tanh")
    assert not {"Erf", "Tanh"} & set(op_counts(out))
    assert ledger.opset_after == 20


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_gelu_with_wrong_constant_is_left_alone(form):
    g = GraphBuilder()
    g.gelu(form=form, complete=False)
    out, _ = _fuse(g.build(), passes=["cleanup", "gelu"])
    assert "Gelu" not in op_counts(out)


def test_silu_is_left_alone():
    g = GraphBuilder()
    g.x = g.op("Mul", g.x, g.op("Sigmoid", g.x))
    out, _ = _fuse(g.build())
    assert {"Sigmoid", "Mul"} <= set(op_counts(out))


@pytest.mark.parametrize("bias", [True, False])
def test_qkv_merge(bias):
    g = GraphBuilder()
    g.attention(bias=bias, complete=False)  # keeps the three projections, attention not fusable
    out, ledger = _fuse(g.build(), passes=["cleanup", "qkv"])
    ops = op_counts(out)
    assert ops["MatMul"] == 1 + 2  # merged projection + the two attention MatMuls
    assert ops["Split"] == 1
    assert ledger.matches("qkv") == 1
    split = next(n for n in out.graph.node if n.op_type == "Split")
    assert len(split.output) == 3


@pytest.mark.parametrize("as_weight", [True, False])
def test_qkv_merge_names_its_tensors_apart_from_the_models_own(as_weight):
    """A model optimized once holds 'trtforge_qkv_0_weight'; a later run's first merge used that stem again.
    Before: as an initializer, register_initializer raised (`optimize` exit 1, "internal error"); as a
    node output, two definitions of one name failed the pass's verification."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    taken = "trtforge_qkv_0_weight"
    inits = [numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), w) for w in ("Wq", "Wk")]
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="mm_q"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], name="mm_k"),
        helper.make_node("Add", ["q", "k"], ["s" if as_weight else taken], name="add"),
        helper.make_node(
            "Mul" if as_weight else "Relu", ["s", taken] if as_weight else [taken], ["y"], name="last"
        ),
    ]
    if as_weight:
        inits.append(numpy_helper.from_array(np.full(8, 2.0, np.float32), taken))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fused, ledger = optimize_model(model, passes=["qkv"])
    assert ledger.matches("qkv") == 1
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(fused, feeds)[0], run_ort(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_qkv_merge_leaves_if_branch_matmuls_and_adds_alone():
    """Before: a MatMul inside an If branch reading the main graph's `x` was taken for a sibling of the
    main graph's projections, and the merge's graph-order lookup raised KeyError (`optimize` exit 1,
    "internal error"); an Add in a branch was also taken for a main-graph MatMul's bias."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = {
        k: numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k)
        for k, s in [("Wa", (4, 8)), ("Wb", (4, 8)), ("Wt", (4, 8)), ("We", (4, 8)), ("bt", (8,))]
    }
    out = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8])  # noqa: E731
    then = helper.make_graph(
        [
            helper.make_node("Add", ["a", "bt"], ["ab"], name="then_bias"),
            helper.make_node("MatMul", ["x", "Wt"], ["t"], name="then_mm"),
            helper.make_node("Add", ["ab", "t"], ["to"], name="then_add"),
        ],
        "then",
        [],
        [out("to")],
    )
    other = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "We"], ["e"], name="else_mm"),
            helper.make_node("Add", ["b", "e"], ["eo"], name="else_add"),
        ],
        "else",
        [],
        [out("eo")],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "Wa"], ["a"], name="mm_a"),
            helper.make_node("MatMul", ["x", "Wb"], ["b"], name="mm_b"),
            helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [out("y")],
        list(w.values()),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fused, ledger = optimize_model(model, passes=["qkv"])
    for c in (True, False):
        feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32), "c": np.array(c)}
        np.testing.assert_allclose(run_ort(fused, feeds)[0], run_ort(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert ledger.matches("qkv") == 1  # mm_a and mm_b, the main graph's two
    assert op_counts(fused) == {"MatMul": 1, "Split": 1, "If": 1}
    branches = {a.name: a.g for a in next(n for n in fused.graph.node if n.op_type == "If").attribute}
    assert [n.name for n in branches["then_branch"].node] == ["then_bias", "then_mm", "then_add"]


@pytest.mark.parametrize("key", ["bhsd", "bshd"])
@pytest.mark.parametrize("scale", ["split", "qk_div", "qk_mul"])
@pytest.mark.parametrize("mask", ["none", "right", "left"])
def test_attention_variants_fuse(key, scale, mask):
    g = GraphBuilder()
    g.attention(key=key, scale=scale, mask=mask)
    out, ledger = _fuse(g.build())
    ops = op_counts(out)
    assert ops.get("Attention") == 1
    assert "Softmax" not in ops
    att = next(n for n in out.graph.node if n.op_type == "Attention")
    assert len(att.input) == (3 if mask == "none" else 4)
    scale_attr = next(a.f for a in att.attribute if a.name == "scale")
    assert scale_attr == pytest.approx(8**-0.5, rel=1e-6)
    assert ledger.opset_after == 23


@pytest.mark.parametrize("mask", ["right", "left"])
def test_attention_with_score_bias_and_mask_fuses_both_into_attn_mask(mask):
    # MPNet: scores / sqrt(d) + relative-position bias + padding mask (two Adds before Softmax).
    g = GraphBuilder()
    g.attention(mask=mask, score_bias=True)
    out, _ = _fuse(g.build())
    ops = op_counts(out)
    assert ops.get("Attention") == 1 and "Softmax" not in ops
    att = next(n for n in out.graph.node if n.op_type == "Attention")
    assert len(att.input) == 4
    assert "is_causal" not in {a.name for a in att.attribute}


def test_attention_with_score_bias_is_refused_by_the_plugin_strategy():
    pytest.importorskip("trtforge.plugins.attention.onnx_node")
    g = GraphBuilder()
    g.attention(mask="right", score_bias=True)
    out, _ = _fuse(g.build(), attention="plugin")
    assert "Softmax" in op_counts(out)


@pytest.mark.parametrize("window", [False, True])
def test_position_only_mask_is_causal_only_without_a_window(window):
    # Mistral's sliding window adds `k > q - window` to the causal `k <= q`: is_causal=1 would drop it
    # (verification at 7 positions caught a window of 3; a window longer than that would go unseen).
    g = GraphBuilder()
    g.attention(mask="causal_window" if window else "causal")
    out, _ = _fuse(g.build())
    att = next(n for n in out.graph.node if n.op_type == "Attention")
    causal = {a.name: a.i for a in att.attribute}.get("is_causal", 0)
    assert (causal, len(att.input)) == ((0, 4) if window else (1, 3))


def test_attention_softmax_on_other_axis_is_left_alone():
    g = GraphBuilder()
    g.attention(complete=False)
    out, _ = _fuse(g.build())
    assert "Attention" not in op_counts(out)


def test_attention_strategy_none_keeps_subgraph():
    g = GraphBuilder()
    g.attention(mask="right")
    out, ledger = _fuse(g.build(), attention="none")
    assert "Attention" not in op_counts(out)
    assert "Softmax" in op_counts(out)
    rec = next(r for r in ledger.passes if r.name == "attention")
    assert rec.matches == 0 and "none" in rec.notes[0]


def test_existing_attention_is_left_alone():
    g = GraphBuilder()
    g.attention()
    fused, _ = optimize_model(g.build())
    again, ledger = optimize_model(fused)
    assert op_counts(again)["Attention"] == 1
    rec = next(r for r in ledger.passes if r.name == "attention")
    assert rec.matches == 0 and "already contains Attention" in rec.notes[0]


def test_cleanup_folds_and_drops_identities():
    g = GraphBuilder()
    g.x = g.op("Identity", g.x)
    c = g.op("Add", g.const(1.0), g.const(2.0))  # foldable
    g.x = g.op("Mul", g.x, c)
    g.x = g.op("Cast", g.x, to=1)  # no-op cast
    out, ledger = _fuse(g.build(), passes=["cleanup"])
    ops = op_counts(out)
    assert ops == {"Mul": 1}  # the Mul now writes the graph output "y" itself
    assert ledger.matches("cleanup") == 4


def test_cleanup_folds_static_shape_subgraphs():
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i"], ["d"], axis=0),
        helper.make_node("Concat", ["d", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 80])],
        initializer=[
            helper.make_tensor("i", TensorProto.INT64, [1], [0]),
            helper.make_tensor("m1", TensorProto.INT64, [1], [-1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    out, _ = optimize_model(model, passes=["cleanup"])
    assert op_counts(out) == {"Reshape": 1}
    reshape = out.graph.node[0]
    shape = next(t for t in out.graph.initializer if t.name == reshape.input[1])
    assert onnx.numpy_helper.to_array(shape).tolist() == [2, -1]  # Shape->Gather->Concat folded


def _sdpa(v_head: int, *, folded: bool = False) -> onnx.ModelProto:
    """softmax(Q Kᵀ / sqrt(8)) V over graph inputs: Q, K of head size 8, V of `v_head`; [B, 2, S, D] per
    head, or the heads folded into the batch ([B*2, S, D], DeBERTa-style) with `folded`."""
    from onnx import TensorProto, helper

    lead = ["n"] if folded else ["batch", 2]
    perm = [0, 2, 1] if folded else [0, 1, 3, 2]

    def vi(name: str, d: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [*lead, "seq", d])

    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [8**-0.5])
    graph = helper.make_graph(
        nodes, "sdpa", [vi("q", 8), vi("k", 8), vi("v", v_head)], [vi("y", v_head)], [scale]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("folded", [False, True], ids=["per_head", "folded"])
def test_attention_with_values_wider_than_keys_is_left_alone(folded):
    """LeViT's values are 4x its keys' head size. Before: fused into ONNX Attention (ONNX Runtime runs it,
    so verification passed), then TensorRT's parser refused the graph: "Key and Value must have the same
    shape", and `compile --precision fp16` of LeViT failed."""

    def fuse(model: onnx.ModelProto):
        out, ledger = optimize_model(model)
        rng = np.random.default_rng(0)
        lead = (4,) if folded else (2, 2)
        feeds = {
            i.name: rng.standard_normal((*lead, 5, i.type.tensor_type.shape.dim[-1].dim_value))
            for i in model.graph.input
        }
        feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
        np.testing.assert_allclose(run_ort(out, feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-5)
        return out, ledger

    same, _ = fuse(_sdpa(8, folded=folded))
    assert op_counts(same).get("Attention") == 1  # the control: one head size fuses
    wide, ledger = fuse(_sdpa(32, folded=folded))
    assert "Attention" not in op_counts(wide) and "Softmax" in op_counts(wide)
    assert ledger.matches("attention") == 0
