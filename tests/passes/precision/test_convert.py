"""convert_precision on small hand-built graphs: islands, casts, weights, records, bad input."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from trtforge.errors import TrtforgeWarning, UserError
from trtforge.numerics.sessions import exact_session
from trtforge.passes.precision import PrecisionRecord, convert_precision
from trtforge.passes.precision.observe import generate_feeds
from trtforge.passes.precision.verify import emulate_in_fp32

RNG = np.random.default_rng(0)
LOW = {"fp16": TP.FLOAT16, "bf16": TP.BFLOAT16}


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def _x(name="x", shape=("batch", 16), elem=TP.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    """ONNX Runtime without graph fusions: every tensor is stored in the type the graph gives it."""
    return exact_session(model).run(None, feed)


def _mlp() -> onnx.ModelProto:
    w1 = RNG.standard_normal((16, 32)).astype(np.float32) * 0.2
    w2 = RNG.standard_normal((32, 8)).astype(np.float32) * 0.2
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("LayerNormalization", ["r", "g", "b"], ["n"], name="ln", axis=-1),
        helper.make_node("MatMul", ["n", "w2"], ["y"], name="mm2"),
    ]
    inits = [("w1", w1), ("w2", w2), ("g", np.ones(32, np.float32)), ("b", np.zeros(32, np.float32))]
    return _model(nodes, [_x()], [_x("y", ("batch", 8))], inits)


def _dtypes(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    vis = [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]
    out = {vi.name: vi.type.tensor_type.elem_type for vi in vis}
    out.update({i.name: i.data_type for i in model.graph.initializer})
    return out


def test_fp16_mlp_is_low_precision_inside_fp32_at_the_edges() -> None:
    model = _mlp()
    out, rec = convert_precision(model, "fp16")
    onnx.checker.check_model(out)
    types = _dtypes(out)
    assert types["x"] == TP.FLOAT and types["y"] == TP.FLOAT
    assert {i.data_type for i in out.graph.initializer} == {TP.FLOAT16}
    assert rec.status == "converted" and rec.fp32_nodes == 0 and rec.low_precision_nodes == 4
    assert [n.op_type for n in out.graph.node].count("Cast") == 2  # x -> fp16, fp16 -> y
    assert rec.casts_inserted == 2 and rec.initializers_converted == 4
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    (ref,) = _run(model, {"x": x})
    (got,) = _run(out, {"x": x})
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=1e-2)
    assert rec.verification[0].name == "y" and rec.verification[0].min_cosine > 0.9999
    json.dumps(rec.to_dict())  # JSON-ready
    assert model.graph.initializer[0].data_type == TP.FLOAT  # input model untouched


def test_low_precision_io_option() -> None:
    out, rec = convert_precision(_mlp(), "fp16", keep_io_types=False)
    types = _dtypes(out)
    assert types["x"] == TP.FLOAT16 and types["y"] == TP.FLOAT16
    assert "Cast" not in [n.op_type for n in out.graph.node] and rec.casts_inserted == 0
    assert rec.verification[0].finite and rec.verification[0].min_cosine > 0.9999


def _overflowing() -> onnx.ModelProto:
    """x @ W reaches ~1e5 (beyond FP16's 65504); dividing by 1000 brings it back to O(100)."""
    w = (RNG.standard_normal((16, 32)) * 8000).astype(np.float32)  # |w| < 65504: weights are fine
    w2 = RNG.standard_normal((32, 4)).astype(np.float32) * 0.02
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["big"], name="blowup"),
        helper.make_node("Div", ["big", "k"], ["small"], name="shrink"),
        helper.make_node("Relu", ["small"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="head"),
    ]
    inits = [("w", w), ("w2", w2), ("k", np.array(1000, np.float32))]
    return _model(nodes, [_x()], [_x("y", ("batch", 4))], inits)


def test_values_beyond_fp16_range_keep_that_node_fp32_and_output_finite() -> None:
    model = _overflowing()
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    (ref,) = _run(model, {"x": x})
    out, rec = convert_precision(model, "fp16", data=[{"x": x}])
    kept = {k.name: k.reasons for k in rec.kept_fp32}
    assert set(kept) == {"blowup", "shrink"}
    assert kept["blowup"][0].startswith("range: output big reaches")
    assert kept["shrink"][0].startswith("range: input big reaches")
    (got,) = _run(out, {"x": x})
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=1e-2)
    # Without the value rule the same graph overflows: the test can fail.
    naive, naive_rec = convert_precision(model, "fp16", data=[{"x": x}], data_max=float("inf"))
    assert naive_rec.fp32_nodes == 0
    stored_fp16 = emulate_in_fp32(naive, ir.DataType.FLOAT16)  # every tensor rounded as stored
    assert not np.isfinite(_run(stored_fp16, {"x": x})[0]).all()
    assert not naive_rec.verification[0].finite
    assert naive_rec.check_problems() == ["output 'y' is not finite where the FP32 model's is"]


def test_exp_is_fp32_by_op_type_and_casts_surround_it() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Exp", ["r"], ["e"], name="exp"),
        helper.make_node("Neg", ["e"], ["y"], name="neg"),
    ]
    out, rec = convert_precision(_model(nodes, [_x()], [_x("y")]), "fp16")
    assert [(k.name, k.reasons[0].split(":")[0]) for k in rec.kept_fp32] == [("exp", "op type")]
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    # x->fp16 (relu), r->fp32 (exp), e->fp16 (neg), y->fp32 (output)
    assert len(casts) == 4


def test_user_keep_fp32_by_name_and_op_type_and_unknown_entry() -> None:
    _, by_name = convert_precision(_mlp(), "fp16", keep_fp32=["mm2"])
    assert [(k.name, k.reasons) for k in by_name.kept_fp32] == [("mm2", ["user: --keep-fp32 mm2"])]
    _, by_op = convert_precision(_mlp(), "fp16", keep_fp32=["MatMul"])
    assert sorted(k.name for k in by_op.kept_fp32) == ["mm1", "mm2"]
    with pytest.raises(UserError, match=r"--keep-fp32 'mm3'.*mm1"):
        convert_precision(_mlp(), "fp16", keep_fp32=["mm3"])


def test_weights_that_flush_to_zero_stay_fp32() -> None:
    tiny = np.full((16,), 3e-9, np.float32)  # below FP16's smallest subnormal (6e-8)
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["m"], name="scale"),
        helper.make_node("Add", ["m", "x"], ["y"], name="add"),
    ]
    out, rec = convert_precision(_model(nodes, [_x()], [_x("y")], [("s", tiny)]), "fp16")
    kept = {k.name: k.reasons[0] for k in rec.kept_fp32}
    assert list(kept) == ["scale"] and "16 of 16 values flush to zero" in kept["scale"]
    assert next(i for i in out.graph.initializer if i.name == "s").data_type == TP.FLOAT


def flushing_activation() -> onnx.ModelProto:
    """y = x * 1e-4 * 1e-4 * 1e4 * 1e4: every weight and activation magnitude FP16 holds except the middle
    activation's (|x| * 1e-8, below FP16's smallest subnormal 6e-8), which flushes to zero in FP16."""
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["a"], name="down1"),
        helper.make_node("Mul", ["a", "s"], ["b"], name="down2"),
        helper.make_node("Mul", ["b", "t"], ["c"], name="up1"),
        helper.make_node("Mul", ["c", "t"], ["y"], name="up2"),
    ]
    inits = [("s", np.array(1e-4, np.float32)), ("t", np.array(1e4, np.float32))]
    return _model(nodes, [_x()], [_x("y")], inits)


def test_an_output_the_conversion_loses_is_warned_about_and_kept_fp32_nodes_fix_it() -> None:
    """Before: the check against FP32 saw output y become all zeros (cosine 0) and only recorded it; the
    graph was written with no word said. Now a warning names the output, its cosine and what helps."""
    with pytest.warns(
        TrtforgeWarning,
        match=r"FP16 conversion: output 'y' agrees with the FP32 model's to a "
        r"cosine of only 0\.000 .*--keep-fp32",
    ):
        _, rec = convert_precision(flushing_activation(), "fp16")
    assert rec.verification[0].min_cosine < 0.5 and len(rec.check_problems()) == 1
    with warnings.catch_warnings():  # what --keep-fp32 of the op type gives, and a conversion that keeps
        warnings.simplefilter("error", TrtforgeWarning)  # its outputs, say nothing
        _, kept = convert_precision(flushing_activation(), "fp16", keep_fp32=["Mul"])
        _, mlp = convert_precision(_mlp(), "fp16")
    assert kept.check_problems() == [] and mlp.check_problems() == []


def test_infinity_sentinel_mask_saturates_and_stays_low_precision() -> None:
    """HF attention masks use finfo(float32).min: out of FP16 range, but it only means -inf."""
    neg = np.array(np.finfo(np.float32).min, np.float32)
    nodes = [
        helper.make_node("Cast", ["mask"], ["keep"], name="to_bool", to=TP.BOOL),
        helper.make_node("Where", ["keep", "zero", "neg"], ["bias"], name="where"),
        helper.make_node("Add", ["x", "bias"], ["s"], name="add"),
        helper.make_node("Softmax", ["s"], ["y"], name="softmax", axis=-1),
    ]
    inits = [("zero", np.array(0, np.float32)), ("neg", neg)]
    model = _model(nodes, [_x(), _x("mask", ("batch", 16), TP.INT64)], [_x("y")], inits)
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    mask = np.ones((2, 16), np.int64)
    mask[1, 5:] = 0
    out, rec = convert_precision(model, "fp16", data=[{"x": x, "mask": mask}])
    assert rec.fp32_nodes == 0 and rec.initializers_saturated == ["neg"]
    (got,) = _run(out, {"x": x, "mask": mask})
    (ref,) = _run(model, {"x": x, "mask": mask})
    assert np.isfinite(got).all() and np.abs(got - ref).max() < 1e-3
    assert (got[1, 5:] == 0).all()


def test_shape_arithmetic_stays_fp32_and_integer_nodes_untouched() -> None:
    """y = x / sqrt(float(shape(x)[-1])): the float math on the shape stays FP32, Div is FP16."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape", start=-1),
        helper.make_node("Cast", ["shp"], ["dim"], name="dim_float", to=TP.FLOAT),
        helper.make_node("Sqrt", ["dim"], ["root"], name="sqrt"),
        helper.make_node("Div", ["x", "root"], ["y"], name="div"),
    ]
    model = _model(nodes, [_x()], [_x("y")])
    out, rec = convert_precision(model, "fp16")
    kept = {k.name: k.reasons[0] for k in rec.kept_fp32}
    assert set(kept) == {"dim_float", "sqrt"} and all(r.startswith("shape arithmetic") for r in kept.values())
    assert rec.float_nodes == 3  # Shape is not a float node: it only reads x's shape
    shape_node = next(n for n in out.graph.node if n.op_type == "Shape")
    assert shape_node.input[0] == "x"
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"x": x})[0], x / 4.0, rtol=1e-3, atol=1e-3)


def test_long_reduction_stays_fp32() -> None:
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum", keepdims=1)]
    model = _model(nodes, [_x(shape=(2, 4096))], [_x("y", (2, 1))], [("axes", np.array([1], np.int64))])
    _, rec = convert_precision(model, "fp16")
    assert [k.reasons[0] for k in rec.kept_fp32] == ["long reduction: 4096 terms > 2048"]


def test_redundant_casts_are_folded() -> None:
    """An original identity Cast(float->float) goes away; fp16->fp32->fp16 chains collapse."""
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], name="identity_cast", to=TP.FLOAT),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["r32"], name="to_fp32", to=TP.FLOAT),
        helper.make_node("Neg", ["r32"], ["y"], name="neg"),
    ]
    out, rec = convert_precision(_model(nodes, [_x()], [_x("y")]), "fp16")
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("Cast") == 2, ops  # input and output boundary only
    names = [n.name for n in out.graph.node]
    assert "identity_cast" in names  # became the x -> fp16 boundary Cast
    assert "to_fp32" not in names and rec.casts_removed == 1  # now fp16 -> fp16: dropped
    for node in out.graph.node:
        if node.op_type == "Cast":
            prev = next((p for p in out.graph.node if node.input[0] in p.output), None)
            assert prev is None or prev.op_type != "Cast"


def test_already_fp16_is_reported_not_doubled() -> None:
    once, _ = convert_precision(_mlp(), "fp16")
    twice, rec = convert_precision(once, "fp16")
    assert twice is once and rec.status == "already-low-precision" and "FP16" in rec.message
    assert rec.casts_inserted == 0 and rec.fp32_nodes == 0
    with pytest.raises(UserError, match="already in FP16"):
        convert_precision(once, "bf16")


def test_fp32_is_a_noop_and_bad_precision_is_a_user_error() -> None:
    model = _mlp()
    same, rec = convert_precision(model, "fp32")
    assert same is model and rec.status == "noop-fp32"
    assert isinstance(rec, PrecisionRecord)
    with pytest.raises(UserError, match="int8"):
        convert_precision(model, "int8")


def test_bf16_raises_opset_to_22_and_checks_by_emulation() -> None:
    out, rec = convert_precision(_mlp(), "bf16")
    assert rec.opset_before == 17 and rec.opset_after == 22 and "opset raised 17 -> 22" in rec.notes[0]
    assert next(o.version for o in out.opset_import if o.domain == "") == 22
    assert {i.data_type for i in out.graph.initializer} == {TP.BFLOAT16}
    assert "emulated" in rec.verification_mode
    assert rec.verification[0].finite and rec.verification[0].min_cosine > 0.999


def test_generated_feeds_use_vocab_and_masks() -> None:
    table = RNG.standard_normal((50, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"], name="embed"),
        helper.make_node("Cast", ["attention_mask"], ["m"], name="m", to=TP.FLOAT),
        helper.make_node("Unsqueeze", ["m", "ax"], ["m3"], name="unsq"),
        helper.make_node("Mul", ["e", "m3"], ["y"], name="mul"),
    ]
    inputs = [_x("input_ids", ("b", "s"), TP.INT64), _x("attention_mask", ("b", "s"), TP.INT64)]
    inits = [("emb", table), ("ax", np.array([-1], np.int64))]
    model = _model(nodes, inputs, [_x("y", ("b", "s", 8))], inits)
    feeds = list(generate_feeds(model))
    assert len(feeds) >= 2
    for f in feeds:
        assert f["input_ids"].shape == f["attention_mask"].shape
        assert f["input_ids"].min() >= 0 and f["input_ids"].max() < 50
        assert set(np.unique(f["attention_mask"])) <= {0, 1} and (f["attention_mask"][:, 0] == 1).all()
    out, rec = convert_precision(model, "fp16")
    assert rec.data_source == "generated from input specs" and rec.sample_batches == len(feeds)
    mask_cast = next(n for n in out.graph.node if n.name == "m")
    assert helper.get_attribute_value(mask_cast.attribute[0]) == TP.FLOAT16  # int -> fp16 directly


def test_bad_sample_data_names_the_missing_input() -> None:
    with pytest.raises(UserError, match=r"lacks model input\(s\) \['x'\]"):
        convert_precision(_mlp(), "fp16", data=[{"z": np.zeros((1, 16), np.float32)}])
    with pytest.raises(UserError, match="empty"):
        convert_precision(_mlp(), "fp16", data=[])


def qdq_matmul(opset: int = 17, weight_scale: float = 0.003) -> onnx.ModelProto:
    """INT8 explicit quantization as the calibration stage writes it: Q/DQ on x, DQ on per-channel W."""
    w = RNG.integers(-127, 127, (16, 8)).astype(np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], name="dq_w", axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"], name="mm"),
    ]
    inits = [
        ("sx", np.array(0.02, np.float32)),
        ("zx", np.array(0, np.int8)),
        ("w", w),
        ("sw", np.linspace(weight_scale, 3 * weight_scale, 8, dtype=np.float32)),
        ("zw", np.zeros(8, np.int8)),
    ]
    return _model(nodes, [_x()], [_x("y", ("batch", 8))], inits, opset=opset)


def test_qdq_graph_gets_low_precision_scales_and_no_cast_before_the_matmul() -> None:
    out, rec = convert_precision(qdq_matmul(), "fp16")
    assert rec.opset_after == 19 and "Q/DQ" in rec.notes[0] and rec.fp32_nodes == 0
    producers = {o: n for n in out.graph.node for o in n.output}
    mm = next(n for n in out.graph.node if n.op_type == "MatMul")
    assert [producers[i].op_type for i in mm.input] == ["DequantizeLinear", "DequantizeLinear"]
    scales = {i.name: i.data_type for i in out.graph.initializer if i.name.startswith("s")}
    assert set(scales.values()) == {TP.FLOAT16}
    assert rec.verification[0].min_cosine > 0.9999


def test_values_read_inside_subgraphs_stay_fp32() -> None:
    """An If branch reads `r` from the outer scope; its producer and the If stay FP32."""
    then_g = helper.make_graph([helper.make_node("Identity", ["r"], ["t"])], "then", [], [_x("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["r"], ["e"])], "else", [], [_x("e")])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("If", ["cond"], ["b"], name="branch", then_branch=then_g, else_branch=else_g),
        helper.make_node("Sigmoid", ["b"], ["y"], name="sig"),
    ]
    cond = helper.make_tensor_value_info("cond", TP.BOOL, [])
    model = _model(nodes, [_x(), cond], [_x("y")])
    out, rec = convert_precision(
        model, "fp16", data=[{"x": np.ones((2, 16), np.float32), "cond": np.array(True)}]
    )
    kept = {k.name: k.reasons[0] for k in rec.kept_fp32}
    assert set(kept) == {"relu", "branch"} and all(r.startswith("control flow") for r in kept.values())
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    for c in (True, False):
        (got,) = _run(out, {"x": x, "cond": np.array(c)})
        np.testing.assert_allclose(got, _run(model, {"x": x, "cond": np.array(c)})[0], atol=1e-3)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_low_precision_io_with_an_input_returned_and_an_input_read_in_a_subgraph(precision: str) -> None:
    """keep_io_types=False (--low-precision-io) on graphs whose float input is (a) also a graph output,
    (b) read inside an If branch. Before: (a) the check's emulation renamed the input and ONNX Runtime
    asked for 'x__emu_raw' (ValueError); (b) the branch's MatMul read the now FP16 input with its FP32
    weight, a graph ONNX Runtime refuses (type error). Both were tracebacks (exit 1 in `optimize`)."""
    returned = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_x()], [_x("y"), _x()])
    w = RNG.standard_normal((16, 16)).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [], [_x("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_x("e")])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    branch = _model(nodes, [_x(), helper.make_tensor_value_info("cond", TP.BOOL, [])], [_x("y")], [("w", w)])
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    for model, feeds in (
        (returned, [{"x": x}]),
        (branch, [{"x": x, "cond": np.array(c)} for c in (True, False)]),
    ):
        out, rec = convert_precision(model, precision, keep_io_types=False, data=feeds)
        assert _dtypes(out)["x"] == LOW[precision] and not rec.check_problems()
        onnx.checker.check_model(out, full_check=True)  # (types inside the branch too)
        if precision == "fp16":  # (ONNX Runtime's CPU provider has almost no BF16 kernels)
            for feed in feeds:
                got = _run(out, {k: v.astype(np.float16) if k == "x" else v for k, v in feed.items()})
                for g, ref in zip(got, _run(model, feed)):
                    np.testing.assert_allclose(g.astype(np.float32), ref, atol=2e-2, rtol=1e-2)


def test_generated_feeds_stay_within_the_position_table() -> None:
    """A CLIP-like text model with 16 positions: generated sample data used to hold 40 tokens and
    ONNX Runtime failed in the position Add; now every batch fits and the conversion runs."""
    from tests.compiler._shape_models import position_table_model

    model = position_table_model(rows=16)
    feeds = list(generate_feeds(model))
    assert len(feeds) >= 2 and max(f["input_ids"].shape[1] for f in feeds) == 16
    out, rec = convert_precision(model, "fp16")
    assert rec.data_source == "generated from input specs" and rec.sample_batches == len(feeds)
    exact_session(out).run(None, feeds[0])


def test_subnormal_weight_scales_still_convert_so_both_matmul_scales_match() -> None:
    """SmoothQuant can leave weight scales near 1e-5, subnormal in FP16 (relative error ~3e-3, below
    INT8's own 1/254): kept FP32, the MatMul's two operand scales differed and TensorRT refused it."""
    out, rec = convert_precision(qdq_matmul(weight_scale=1e-5), "fp16")
    assert rec.fp32_nodes == 0, rec.kept_fp32
    scales = {i.name: i.data_type for i in out.graph.initializer if i.name.startswith("s")}
    assert set(scales.values()) == {TP.FLOAT16} and len(scales) == 2
    assert rec.verification[0].min_cosine > 0.999


def test_scales_that_flush_to_zero_stay_fp32() -> None:
    _, rec = convert_precision(qdq_matmul(weight_scale=1e-9), "fp16")
    kept = {k.name: k.reasons for k in rec.kept_fp32}
    assert "Q/DQ scale" in kept["dq_w"][0] and "flush to zero" in kept["dq_w"][0]
    # the activation's Q/DQ follow, so the MatMul's operand scales keep one type (TensorRT needs it)
    assert sorted(kept) == ["dq_w", "dq_x", "q"] and "quantized operand" in kept["dq_x"][0]
