"""Decoder fusions (RMSNorm, rotary, SwiGLU, GQA QKV): hand-built patterns and look-alikes, then real
random-weight Llama / Mistral / Qwen2 exports from both torch exporters through the default pipeline."""

from __future__ import annotations

import collections
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.passes._graphs import E, GraphBuilder, H, feeds_for, op_counts, run_ort
from trtforge.passes.pipeline import optimize_model
from trtforge.passes.verify import make_inputs

D = E // H
INT_MAX = np.iinfo(np.int64).max


def _fuse(model: onnx.ModelProto, **kw):
    out, ledger = optimize_model(model, **kw)
    assert all(r.verification is not None for r in ledger.passes)
    feeds = feeds_for(model)
    for a, b in zip(run_ort(model, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    return out, ledger


def _w(g: GraphBuilder, shape, stem: str) -> str:
    return g.const((g.rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32), stem)


# --- RMSNorm ------------------------------------------------------------------------------------
def _rmsnorm(
    g: GraphBuilder,
    square="pow",
    inv="recip",
    swap_norm=False,
    swap_scale=False,
    cast=False,
    axis=-1,
    scale=None,
    eps=1e-6,
):
    x = g.x
    xc = g.op("Cast", x, to=TensorProto.FLOAT) if cast else x
    sq = g.op("Pow", xc, g.const(2.0)) if square == "pow" else g.op("Mul", xc, xc)
    ms = g.op("ReduceMean", sq, g.const([axis], "axes"), keepdims=1)
    root = g.op("Sqrt", g.op("Add", g.const(eps, "eps"), ms) if swap_norm else g.op("Add", ms, g.const(eps)))
    if inv == "div":
        y = g.op("Div", xc, root)
    else:
        r = g.op("Reciprocal", root) if inv == "recip" else g.op("Div", g.const(1.0), root)
        y = g.op("Mul", r, xc) if swap_norm else g.op("Mul", xc, r)
    if cast:
        y = g.op("Cast", y, to=TensorProto.FLOAT)
    s = scale if scale is not None else g.const(g.rng.standard_normal(E).astype(np.float32), "gamma")
    g.x = g.op("Mul", s, y) if swap_scale else g.op("Mul", y, s)


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("inv", ["recip", "div1", "div"])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("cast", [False, True])
def test_rmsnorm_variants_fuse(square, inv, swap, cast):
    g = GraphBuilder()
    _rmsnorm(g, square=square, inv=inv, swap_norm=swap, swap_scale=swap, cast=cast)
    out, ledger = _fuse(g.build(), passes=["rmsnorm"])
    ops = op_counts(out)
    assert ops.get("RMSNormalization") == 1
    assert not {"ReduceMean", "Sqrt", "Pow"} & set(ops)
    node = next(n for n in out.graph.node if n.op_type == "RMSNormalization")
    attrs = {a.name: a for a in node.attribute}
    assert attrs["epsilon"].f == pytest.approx(1e-6) and attrs["axis"].i == -1
    assert ledger.opset_after == 23 and ledger.matches("rmsnorm") == 1


def test_rmsnorm_legacy_opset17_form_fuses():
    g = GraphBuilder(opset=17)
    x = g.x
    ms = g.op("ReduceMean", g.op("Pow", x, g.const(2.0)), axes=[-1], keepdims=1)
    r = g.op("Div", g.const(1.0), g.op("Sqrt", g.op("Add", ms, g.const(1e-5))))
    g.x = g.op("Mul", g.op("Mul", x, r), g.const(np.full(E, 0.5, np.float32), "w"))
    out, ledger = _fuse(g.build())
    assert op_counts(out).get("RMSNormalization") == 1
    assert ledger.opset_before == 17 and ledger.opset_after == 23


def test_rmsnorm_over_another_axis_is_left_alone():
    g = GraphBuilder()
    _rmsnorm(g, axis=1)  # mean over the sequence axis: not an RMSNorm of the features
    out, ledger = _fuse(g.build(), passes=["rmsnorm"])
    assert "RMSNormalization" not in op_counts(out) and ledger.matches("rmsnorm") == 0


def test_rmsnorm_with_per_token_multiplier_is_left_alone():
    g = GraphBuilder()
    per_token = g.op("ReduceMax", g.x, g.const([-1], "axes"), keepdims=1)  # [B, S, 1], not a scale
    _rmsnorm(g, scale=per_token)
    out, _ = _fuse(g.build(), passes=["rmsnorm"], debug=True)
    assert "RMSNormalization" not in op_counts(out)


def test_rmsnorm_with_vector_epsilon_is_left_alone():
    g = GraphBuilder()
    x = g.x
    ms = g.op("ReduceMean", g.op("Mul", x, x), g.const([-1], "axes"), keepdims=1)
    eps = g.const(np.full((2, 1, 1), 1e-6, np.float32), "eps")  # one epsilon per batch row
    r = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, eps)))
    g.x = g.op("Mul", g.op("Mul", x, r), g.const(np.ones(E, np.float32), "w"))
    model = g.build()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    out, _ = _fuse(model, passes=["rmsnorm"])
    assert "RMSNormalization" not in op_counts(out)


# --- rotary -------------------------------------------------------------------------------------
def _heads(g: GraphBuilder, x: str) -> str:
    """[B, S, E] -> [B, H, S, D]."""
    return g.op("Transpose", g.op("Reshape", x, g.const(np.array([0, 0, H, D]), "shape")), perm=[0, 2, 1, 3])


def _merge_heads(g: GraphBuilder, x: str) -> str:
    return g.op("Reshape", g.op("Transpose", x, perm=[0, 2, 1, 3]), g.const(np.array([0, 0, E]), "shape"))


def _freqs(g: GraphBuilder) -> str:
    """[1, S, D/2] angles position * inv_freq, positions from the input's sequence length."""
    seq = g.op("Squeeze", g.op("Shape", "x", start=1, end=2))
    pos = g.op("Cast", g.op("Range", g.const(0), seq, g.const(1)), to=TensorProto.FLOAT)
    pos = g.op("Unsqueeze", pos, g.const(np.array([0, 2]), "axes"))  # [1, S, 1]
    inv_freq = (1.0 / 10000 ** (np.arange(0, D, 2) / D)).astype(np.float32)
    return g.op("Mul", pos, g.const(inv_freq, "inv_freq"))


def _rotary(
    g: GraphBuilder,
    x4: str,
    form="dynamo",
    order=(False, False, False),
    cache="cos_concat",
    split=D // 2,
    scaling=None,
) -> str:
    f = _freqs(g) if cache != "const" else None
    caches = []
    for fn in ("Cos", "Sin"):
        if cache == "cos_concat":
            c = g.op(fn, g.op("Concat", f, f, axis=-1))
        elif cache == "concat_cos":
            h = g.op(fn, f)
            c = g.op("Concat", h, h, axis=-1)
        elif cache == "unequal":
            c = g.op(fn, g.op("Concat", f, g.op("Mul", f, g.const(2.0)), axis=-1))
        else:  # a constant [1, 5, D] table with equal halves
            half = getattr(np, fn.lower())(np.arange(5 * D // 2).reshape(1, 5, D // 2) * 0.1)
            c = g.const(np.concatenate([half, half], -1).astype(np.float32), fn.lower())
        if scaling is not None:
            c = g.op("Mul", c, g.const(scaling))
        caches.append(g.op("Unsqueeze", c, g.const(np.array([1]), "axes")))
    cos, sin = caches
    if form == "dynamo":
        lo_end, hi_start = g.const(np.array([split])), g.const(np.array([split]))
    else:  # legacy: the half point computed as Shape(x)[3] // 2
        dim = g.op("Gather", g.op("Shape", x4), g.const(3), axis=0)
        lo_end = hi_start = g.op("Unsqueeze", g.op("Div", dim, g.const(2)), g.const(np.array([0]), "axes"))
    axes, steps = g.const(np.array([3]), "axes"), g.const(np.array([1]), "steps")
    low = g.op("Slice", x4, g.const(np.array([0])), lo_end, axes, steps)
    high = g.op("Slice", x4, hi_start, g.const(np.array([INT_MAX])), axes, steps)
    rotated = g.op("Concat", g.op("Neg", high), low, axis=-1)
    a = g.op("Mul", cos, x4) if order[0] else g.op("Mul", x4, cos)
    b = g.op("Mul", sin, rotated) if order[1] else g.op("Mul", rotated, sin)
    return g.op("Add", b, a) if order[2] else g.op("Add", a, b)


def _rotary_model(static_seq: int | None = None, **kw) -> onnx.ModelProto:
    """Rotary on the heads of x. The legacy form carries ONNX-inferred shapes (as legacy exports do)
    and runs without cleanup, which would fold its `Shape(x)[3] // 2` into a constant."""
    g = GraphBuilder()
    g.x = _merge_heads(g, _rotary(g, _heads(g, g.x), **kw))
    model = g.build()
    if static_seq is not None:
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = static_seq
    if kw.get("form") == "legacy":
        model = onnx.shape_inference.infer_shapes(model)
    return model


@pytest.mark.parametrize("form", ["dynamo", "legacy"])
@pytest.mark.parametrize("order", [(False, False, False), (True, True, True), (True, False, True)])
@pytest.mark.parametrize("cache", ["cos_concat", "concat_cos"])
def test_rotary_variants_fuse(form, order, cache):
    passes = ["rotary"] if form == "legacy" else ["cleanup", "rotary"]
    out, ledger = _fuse(_rotary_model(form=form, order=order, cache=cache), passes=passes)
    ops = op_counts(out)
    assert ops.get("RotaryEmbedding") == 1
    assert "Neg" not in ops and "Slice" not in ops and ledger.matches("rotary") == 1
    node = next(n for n in out.graph.node if n.op_type == "RotaryEmbedding")
    assert len(node.input) == 3 and {a.name: a.i for a in node.attribute}.get("interleaved", 0) == 0
    assert ledger.opset_after == 23


def test_rotary_with_scaled_constant_cache_fuses():
    model = _rotary_model(static_seq=5, cache="const", scaling=0.8)
    out, _ = _fuse(model, passes=["cleanup", "rotary"])
    assert op_counts(out).get("RotaryEmbedding") == 1


def test_rotary_with_unequal_cache_halves_is_left_alone():
    out, ledger = _fuse(_rotary_model(cache="unequal"), passes=["cleanup", "rotary"], debug=True)
    assert "RotaryEmbedding" not in op_counts(out)
    assert any("repeats its first half" in r for r in ledger.passes[-1].rejected)


def test_rotary_split_off_centre_is_left_alone():
    out, _ = _fuse(_rotary_model(split=D // 2 - 1), passes=["cleanup", "rotary"])
    assert "RotaryEmbedding" not in op_counts(out)


# --- SwiGLU and GQA QKV -------------------------------------------------------------------------
def _swiglu(g: GraphBuilder, inter=24, swap=False, bias=False, gate_of=None, up_from=None) -> None:
    x = g.x
    gate = g.op("MatMul", x, _w(g, (E, inter), "wg"))
    if bias:
        gate = g.op("Add", gate, g.const(g.rng.standard_normal(inter).astype(np.float32), "bg"))
    sig = g.op("Sigmoid", gate_of if gate_of is not None else gate)
    silu = g.op("Mul", sig, gate) if swap else g.op("Mul", gate, sig)
    up = g.op("MatMul", up_from if up_from is not None else x, _w(g, (E, inter), "wu"))
    h = g.op("Mul", up, silu) if swap else g.op("Mul", silu, up)
    g.x = g.op("MatMul", h, _w(g, (inter, E), "wd"))


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_gate_and_up_merge(swap, bias):
    g = GraphBuilder()
    _swiglu(g, swap=swap, bias=bias)
    out, ledger = _fuse(g.build(), passes=["cleanup", "swiglu"])
    ops = op_counts(out)
    assert ops["MatMul"] == 2 and ops["Split"] == 1  # merged gate/up + down projection
    assert ops.get("Add", 0) == int(bias)  # the gate bias is folded into one bias Add (zeros for up)
    assert ledger.matches("swiglu") == 1
    rec = next(r for r in ledger.passes if r.name == "swiglu")
    assert rec.per_rule == {"SwiGLU gate/up -> MatMul+Split": 1}


def test_swiglu_sigmoid_of_another_tensor_is_not_a_gate():
    g = GraphBuilder()
    other = g.op("MatMul", g.x, _w(g, (E, 24), "wo"))
    _swiglu(g, gate_of=other)  # g * Sigmoid(h) with h != g
    out, ledger = _fuse(g.build(), passes=["cleanup", "swiglu"])
    assert ledger.matches("swiglu") == 0 and "Split" not in op_counts(out)


def test_swiglu_up_projection_of_another_input_is_left_alone():
    g = GraphBuilder()
    other = g.op("Tanh", g.x)
    _swiglu(g, up_from=other)
    out, ledger = _fuse(g.build(), passes=["cleanup", "swiglu", "qkv"])
    assert ledger.matches("swiglu") == 0 and "Split" not in op_counts(out)


@pytest.mark.parametrize("biases", ["all", "q_only", "none"])
def test_gqa_qkv_merge(biases):
    g = GraphBuilder()
    x = g.x
    outs = []
    for stem, width in (("q", E), ("k", E // 2), ("v", E // 2)):
        y = g.op("MatMul", x, _w(g, (E, width), f"w{stem}"))
        if biases == "all" or (biases == "q_only" and stem == "q"):
            y = g.op("Add", y, g.const(g.rng.standard_normal(width).astype(np.float32), f"b{stem}"))
        outs.append(y)
    kv = g.op("Add", outs[1], outs[2])
    g.x = g.op("Add", outs[0], g.op("Concat", kv, kv, axis=-1))
    out, ledger = _fuse(g.build(), passes=["cleanup", "qkv"])
    ops = op_counts(out)
    assert ops["MatMul"] == 1 and ops["Split"] == 1
    assert ops["Add"] == 2 + (biases != "none")
    split = next(n for n in out.graph.node if n.op_type == "Split")
    sizes = next(t for t in out.graph.initializer if t.name == split.input[1])
    assert onnx.numpy_helper.to_array(sizes).tolist() == [E, E // 2, E // 2]
    rec = next(r for r in ledger.passes if r.name == "qkv")
    assert rec.per_rule == {"Q/K/V (GQA, q:kv width 2:1) -> MatMul+Split": 1}


def test_qkv_takes_the_merged_gate_up_of_a_parallel_block():
    """StableLM-2 12B's parallel block: q/k/v and a SwiGLU's gate/up all read one LayerNorm. swiglu merges
    gate/up first (an untyped output), then qkv merges it with q/k/v; the graph must still serialize."""
    g = GraphBuilder()
    x = g.x
    q, k, v = (g.op("MatMul", x, _w(g, (E, E), f"w{stem}")) for stem in "qkv")
    attn = g.op("Add", g.op("Add", q, k), v)
    _swiglu(g)
    g.x = g.op("Add", g.x, attn)
    out, ledger = _fuse(g.build(), passes=["cleanup", "swiglu", "qkv"])
    assert ledger.matches("swiglu") == 1 and ledger.matches("qkv") == 1
    assert op_counts(out)["MatMul"] == 2  # q/k/v/gate-up, then down


# --- real exports -------------------------------------------------------------------------------
LAYERS = 2
DECODERS = ["llama", "mistral", "qwen2"]
EXPORTERS = ["dynamo", "legacy"]


def _decoder(kind: str):
    import torch
    import transformers as T

    torch.manual_seed(0)
    spec = {
        "hidden_size": 64,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 100,
        "max_position_embeddings": 64,
        "use_cache": False,
    }
    config_cls, model_cls = {
        "llama": (T.LlamaConfig, T.LlamaForCausalLM),
        "mistral": (T.MistralConfig, T.MistralForCausalLM),
        "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
    }[kind]
    model = model_cls(config_cls(**spec)).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    return Logits()


@pytest.fixture(scope="session")
def decoder_export(tmp_path_factory):
    """decoder_export(kind, exporter) -> (onnx.ModelProto, exporter used), exported once per session."""
    from trtforge.compiler.export import export_module

    cache: dict[tuple[str, str], tuple[onnx.ModelProto, str]] = {}

    def get(kind: str, exporter: str):
        import torch

        if (kind, exporter) not in cache:
            ids = torch.randint(0, 100, (2, 8))
            mask = torch.ones(2, 8, dtype=torch.long)
            art = export_module(
                _decoder(kind),
                {"input_ids": ids, "attention_mask": mask},
                tmp_path_factory.mktemp(f"{kind}_{exporter}"),
                dynamic="batch,seq",
                output_names=["logits"],
                exporter=exporter,
            )
            cache[(kind, exporter)] = (onnx.load(str(art.path)), art.record.exporter)
        proto, used = cache[(kind, exporter)]
        out = onnx.ModelProto()
        out.CopyFrom(proto)
        return out, used

    return get


def _max_rel_err(a: onnx.ModelProto, b: onnx.ModelProto) -> float:
    import onnx_ir as ir

    feeds = make_inputs(ir.serde.deserialize_model(a), seed=5)
    ref = run_ort(a, feeds)[0].astype(np.float64)
    return float(np.abs(run_ort(b, feeds)[0] - ref).max() / np.abs(ref).max())


@pytest.mark.slow
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("kind", DECODERS)
def test_every_decoder_layer_fused(decoder_export, kind, exporter):
    original, used = decoder_export(kind, exporter)
    assert used == exporter
    fused, ledger = optimize_model(original)
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    assert ops["RMSNormalization"] == 2 * LAYERS + 1  # input + post-attention norms, and the final one
    assert ops["RotaryEmbedding"] == 2 * LAYERS  # Q and K
    assert ledger.matches("swiglu") == LAYERS
    qkv = next(r for r in ledger.passes if r.name == "qkv")
    assert qkv.per_rule == {"Q/K/V (GQA, q:kv width 2:1) -> MatMul+Split": LAYERS}
    assert ops["Attention"] == LAYERS and ledger.matches("gqa") == LAYERS
    producers = {o: n.op_type for n in fused.graph.node for o in n.output}
    for att in (n for n in fused.graph.node if n.op_type == "Attention"):
        assert producers[att.input[1]] == "RotaryEmbedding"  # K without the repeat_kv copies
        assert producers[att.input[2]] == "Transpose"
    nodes = {o: n for n in fused.graph.node for o in n.output}
    repeats = [  # Expand(Unsqueeze(K or V heads)): repeat_kv (the causal mask has Expand(Unsqueeze) too)
        n
        for n in fused.graph.node
        if n.op_type == "Expand"
        and producers.get(n.input[0]) == "Unsqueeze"
        and producers.get(nodes[n.input[0]].input[0]) in ("RotaryEmbedding", "Transpose")
    ]
    assert not repeats, "repeat_kv left alive after the GQA fold"
    assert ops["MatMul"] == 4 * LAYERS + 1  # QKV, o_proj, gate/up, down per layer + lm_head
    assert not {"Neg", "Sqrt", "ReduceMean", "Softmax"} & set(ops)
    assert ledger.opset_after == 23
    assert all(p.verification is not None for p in ledger.passes)
    assert _max_rel_err(original, fused) < 1e-4


# --- GQA attention fold -------------------------------------------------------------------------
HQ, HKV, DH = 4, 2, E // 4


def _gqa_attention(g: GraphBuilder, form="dynamo", unsqueeze_axis=2, reshape_heads=None, mask=False) -> None:
    """Decomposed attention whose K/V go through HF's repeat_kv (Unsqueeze-Expand-Reshape)."""
    x = g.x

    def heads(w_cols: int, n_heads: int, stem: str) -> str:
        y = g.op("MatMul", x, _w(g, (E, w_cols), stem))
        y = g.op("Reshape", y, g.const(np.array([0, 0, n_heads, DH]), "shape"))
        return g.op("Transpose", y, perm=[0, 2, 1, 3])

    q, k, v = heads(E, HQ, "wq"), heads(HKV * DH, HKV, "wk"), heads(HKV * DH, HKV, "wv")
    n = HQ // HKV

    def dim(t: str, axis: int) -> str:
        if form == "dynamo":  # the size read from the graph input, as dynamo exports do
            return g.op("Shape", "x", start=axis, end=axis + 1)
        return g.op(
            "Unsqueeze", g.op("Gather", g.op("Shape", t), g.const(axis), axis=0), g.const([0], "axes")
        )

    def repeat(t: str) -> str:
        b, s = dim(t, 0), dim(t, 2 if form == "legacy" else 1)
        if unsqueeze_axis == 2:
            shape5 = g.op("Concat", b, g.const([HKV]), g.const([n]), s, g.const([DH]), axis=0)
        else:
            shape5 = g.op("Concat", b, g.const([n]), g.const([HKV]), s, g.const([DH]), axis=0)
        if form == "legacy":  # the exporter's Where(shape == -1, 1, shape) guard
            ones = g.const(np.ones(5, np.int64), "ones")
            shape5 = g.op("Where", g.op("Equal", shape5, g.const(-np.ones(5, np.int64), "m1")), ones, shape5)
        heads_piece = g.const([reshape_heads if reshape_heads is not None else HQ])
        shape4 = g.op("Concat", b, heads_piece, s, g.const([DH]), axis=0)
        t5 = g.op("Expand", g.op("Unsqueeze", t, g.const([unsqueeze_axis], "axes")), shape5)
        return g.op("Reshape", t5, shape4)

    kt = g.op("Transpose", repeat(k), perm=[0, 1, 3, 2])
    scores = g.op("Mul", g.op("MatMul", q, kt), g.const(DH**-0.5))
    if mask:  # [B, 1, 1, S] padding mask: the attention pass expands it to Shape(key)[2]
        m = g.op("Cast", g.mask_input(), to=TensorProto.FLOAT)
        m = g.op("Mul", g.op("Sub", g.const(1.0), m), g.const(-10000.0))
        scores = g.op("Add", scores, g.op("Unsqueeze", m, g.const(np.array([1, 2]), "axes")))
    o = g.op("MatMul", g.op("Softmax", scores, axis=-1), repeat(v))
    o = g.op("Transpose", o, perm=[0, 2, 1, 3])
    g.x = g.op("Reshape", o, g.const(np.array([0, 0, E]), "shape"))


def _gqa_model(**kw) -> onnx.ModelProto:
    g = GraphBuilder()
    _gqa_attention(g, **kw)
    model = g.build()
    return onnx.shape_inference.infer_shapes(model) if kw.get("form") == "legacy" else model


@pytest.mark.parametrize("form", ["dynamo", "legacy"])
@pytest.mark.parametrize("mask", [False, True])
def test_gqa_repeat_kv_folds_into_attention(form, mask):
    passes = (
        ["attention", "gqa", "cleanup"] if form == "legacy" else ["cleanup", "attention", "gqa", "cleanup"]
    )
    out, ledger = _fuse(_gqa_model(form=form, mask=mask), passes=passes)
    assert ledger.matches("attention") == 1 and ledger.matches("gqa") == 1
    ops = op_counts(out)
    assert ops["Attention"] == 1 and ops.get("Expand", 0) == int(mask)  # only the mask's, no repeat left
    att = next(n for n in out.graph.node if n.op_type == "Attention")
    producers = {o: n for n in out.graph.node for o in n.output}
    for name in att.input[1:3]:  # K and V now come straight from their head transposes
        assert producers[name].op_type == "Transpose"
    attrs = {a.name: a.i for a in att.attribute if a.type == onnx.AttributeProto.INT}
    assert attrs.get("kv_num_heads", HKV) == HKV and attrs.get("q_num_heads", HQ) == HQ


def test_gqa_repeat_with_other_head_order_is_left_alone():
    # Unsqueeze at axis 1: query head h reads K/V head h % Hkv, not h // n as Attention would.
    out, ledger = _fuse(_gqa_model(unsqueeze_axis=1), passes=["cleanup", "attention", "gqa"])
    assert ledger.matches("attention") == 1 and ledger.matches("gqa") == 0
    assert "Expand" in op_counts(out)


def test_gqa_unprovable_head_count_is_left_alone():
    _, ledger = _fuse(_gqa_model(reshape_heads=-1), passes=["cleanup", "attention", "gqa"])
    assert ledger.matches("attention") == 1 and ledger.matches("gqa") == 0


def _trt_network(model: onnx.ModelProto):
    """Parse `model` with TensorRT(-RTX): (backend, builder, network, layer-type counts)."""
    from trtforge.core.backend import get_backend

    backend = get_backend()
    builder = backend.create_builder()
    network = backend.create_network(builder)
    parser = backend.create_parser(network)
    assert parser.parse(model.SerializeToString()), [
        parser.get_error(i).desc() for i in range(parser.num_errors)
    ]
    types = collections.Counter(network.get_layer(i).type for i in range(network.num_layers))
    return backend, builder, network, types


def _build(backend, builder, network) -> bool:
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        profile.set_shape(network.get_input(i).name, (1, 1), (2, 16), (4, 64))
    config.add_optimization_profile(profile)
    backend.set_build_targets(config, None)
    plan = builder.build_serialized_network(network, config)
    return plan is not None and plan.nbytes > 0


@pytest.mark.slow
@pytest.mark.trt_build
def test_fused_llama_builds_fp16_with_rotary_and_gqa_attention(decoder_export):
    from tests.passes._fp16 import cast_model_fp16

    fused, _ = optimize_model(decoder_export("llama", "dynamo")[0])
    backend, builder, network, types = _trt_network(cast_model_fp16(fused))
    trt = backend.trt
    assert types[trt.LayerType.ROTARY_EMBEDDING] == 2 * LAYERS
    assert types[trt.LayerType.ATTENTION_OUTPUT] == LAYERS
    assert _build(backend, builder, network)


@pytest.mark.slow
@pytest.mark.trt_build
def test_fused_llama_builds_fp32_rmsnorm_and_rotary(decoder_export):
    # FP32 IAttention has no kernel on this build target (measured), so attention stays decomposed.
    fused, _ = optimize_model(decoder_export("llama", "legacy")[0], attention="none")
    assert collections.Counter(n.op_type for n in fused.graph.node)["RMSNormalization"] == 2 * LAYERS + 1
    backend, builder, network, types = _trt_network(fused)
    assert types[backend.trt.LayerType.ROTARY_EMBEDDING] == 2 * LAYERS
    assert _build(backend, builder, network)
