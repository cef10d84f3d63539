"""cleanup's lowering of a dynamically shaped EyeLike (XLNet's `torch.eye(seq)` under the legacy
exporter): TensorRT's ONNX parser refused it ("Eyelike does not work for dynamically shaped tensors"),
so `compile` of XLNet failed after every pass had verified."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtforge.passes.pipeline import optimize_model


def _eye_model(k: int, dtype: int | None) -> onnx.ModelProto:
    """x[B, S] -> y = x + EyeLike(ConstantOfShape([S, S]), k, dtype) broadcast over the batch."""
    attrs = {"k": k} if k else {}
    if dtype is not None:
        attrs["dtype"] = dtype
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["s", "zero_axes"], ["s1"]),
        helper.make_node("Concat", ["s1", "s1"], ["ss"], axis=0),
        helper.make_node(
            "ConstantOfShape", ["ss"], ["square"], value=helper.make_tensor("v", TensorProto.INT64, [1], [0])
        ),
        helper.make_node("EyeLike", ["square"], ["eye"], **attrs),
        helper.make_node("Cast", ["eye"], ["eye_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["x", "last_axes"], ["x3"]),
        helper.make_node("Add", ["x3", "eye_f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "eye",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", "seq"])],
        [
            helper.make_tensor("one", TensorProto.INT64, [], [1]),
            helper.make_tensor("zero_axes", TensorProto.INT64, [1], [0]),
            helper.make_tensor("last_axes", TensorProto.INT64, [1], [2]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize(("k", "dtype"), [(0, None), (1, TensorProto.FLOAT), (-2, TensorProto.INT32)])
def test_dynamic_eyelike_is_lowered_with_the_same_values(k, dtype) -> None:
    proto = _eye_model(k, dtype)
    out, ledger = optimize_model(proto, feed_shapes={"x": [2, 5]})
    assert "EyeLike" not in {n.op_type for n in out.graph.node}
    assert any(p.per_rule.get("eyelike_lowered") for p in ledger.passes if p.name == "cleanup")
    for shape in ([1, 1], [2, 5], [3, 7]):  # other sizes than the verification's
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(_run(out, x), _run(proto, x))


@pytest.mark.trt_build
def test_dynamic_eyelike_model_compiles(tmp_path) -> None:
    """Before: TensorRT's parser rejected node EyeLike after every pass verified."""
    import trtforge

    src = tmp_path / "eye.onnx"
    onnx.save(_eye_model(1, None), str(src))
    result = trtforge.compile(src, output=tmp_path / "eye.engine", shapes=["x:1x1:2x8:4x16"], progress=False)
    assert result.engine_path.is_file() and result.engine_path.stat().st_size > 0


def test_cleanup_does_not_log_the_multi_output_nodes_it_leaves(caplog) -> None:
    """Before: every Split over constants printed onnxscript's "Skipping constant folding for op Split
    with multiple outputs." on stderr, in the middle of optimize/compile/report output (WavLM: 5 lines)."""
    import logging

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], list(range(8)))
    graph = helper.make_graph(
        [
            helper.make_node("Split", ["w"], ["w0", "w1"], axis=1, num_outputs=2),
            helper.make_node("MatMul", ["x", "w0"], ["a"]),
            helper.make_node("MatMul", ["x", "w1"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [w],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with caplog.at_level(logging.WARNING):
        optimize_model(proto, passes=["cleanup"], feed_shapes={"x": [2, 4]})
    assert not [r for r in caplog.records if "Skipping constant folding" in r.getMessage()]


@pytest.mark.trt_build
def test_compile_without_passes_says_the_passes_lower_a_dynamic_eyelike(tmp_path, capsys) -> None:
    """Before: --no-passes gave TensorRT's "Eyelike does not work for dynamically shaped tensors" alone."""
    from trtforge.cli.main import main

    src = tmp_path / "eye.onnx"
    onnx.save(_eye_model(0, None), str(src))
    rc = main(
        ["compile", str(src), "-o", str(tmp_path / "e.engine"), "--no-passes", "--shape", "x:1x1:2x8:4x16"]
    )
    cap = capsys.readouterr()
    text = " ".join((cap.out + cap.err).split())
    assert rc == 2
    assert "the cleanup pass rewrites it as Range/Equal" in text and "not --no-passes" in text


def test_a_scan_body_returning_its_state_twice_keeps_two_outputs() -> None:
    """A Scan body `s_out = Add(s_in, e); o = Identity(s_out)` returns the new state and the scan output.
    Before: Identity elimination left one value at both body outputs, ONNX Runtime then computed another
    scan output, and cleanup failed its own verification (optimize and compile of a valid model exit 2,
    "Run without this pass and report the model")."""
    from onnx import numpy_helper

    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [4])  # noqa: E731
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "e"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["o"])],
        "body",
        [vi("s_in"), vi("e")],
        [vi("s_out"), vi("o")],
    )
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "x"], ["sf", "y"], body=body, num_scan_inputs=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.zeros(4, np.float32), "s0")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out, _ = optimize_model(model, passes=["cleanup"])
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), np.cumsum(x, axis=0), rtol=1e-6)


def test_cleanup_does_not_log_weights_that_are_also_graph_inputs(caplog) -> None:
    """Before: a weight listed as a graph input too (old exporters) or returned as an output printed onnx_ir's
    "Skipped deduplication of initializer 'w' as it is a graph input or output" on stderr, twice, in the
    middle of optimize/compile output; nothing in it is the user's to act on."""
    import logging

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], list(range(8)))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [w],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with caplog.at_level(logging.WARNING):
        optimize_model(proto, passes=["cleanup"], feed_shapes={"x": [2, 4]})
    assert not [r for r in caplog.records if "deduplication" in r.getMessage()]
