"""The FP16 conversion's ONNX Runtime runs hold no extra copy of the weights: at a step graph past 2 GB
each copy is gigabytes (the 2.2 GB Llama of tests/llm/compile/test_large_step.py ran out of memory)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from trtforge.numerics import sessions
from trtforge.passes.precision import observe as observe_module
from trtforge.passes.precision.convert import convert_precision
from trtforge.passes.precision.verify import emulate_in_fp32


def _model():
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Tanh", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_fp32_emulation_reads_the_fp16_weights_through_casts():
    """emulate_in_fp32 stored an FP32 copy of every FP16 weight (twice the FP16 graph's weights, again in
    its ORT session); the weights now stay FP16 and are cast where they are read (exact)."""
    converted, _ = convert_precision(_model(), "fp16", keep_io_types=True)
    emulated = emulate_in_fp32(converted, ir.DataType.FLOAT16)
    dtypes = {t.name: t.data_type for t in emulated.graph.initializer}
    assert dtypes == {t.name: t.data_type for t in converted.graph.initializer}
    assert TensorProto.FLOAT16 in dtypes.values()
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    w16 = numpy_helper.to_array(converted.graph.initializer[0]).astype(np.float32)
    (got,) = sessions.exact_session(emulated).run(None, {"x": x})
    want = np.tanh(x.astype(np.float16).astype(np.float32) @ w16)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_the_observation_session_is_made_from_the_model_itself(monkeypatch):
    """observe copied the model to list every float tensor as an output (one more copy of the weights
    while its session loaded); the outputs are now added to the model for the session and removed after."""
    seen = []
    make = observe_module.exact_session

    def spy(model, **kw):
        seen.append((model, len(model.graph.output)))
        return make(model, **kw)

    monkeypatch.setattr(observe_module, "exact_session", spy)
    model = _model()
    observe_module.observe(model, None)
    assert seen[0][0] is model and seen[0][1] == 2  # z, and y for the session
    assert [o.name for o in model.graph.output] == ["z"]


def test_the_conversion_graph_is_collected_before_the_check_sessions(monkeypatch):
    """The onnx_ir graph the conversion rewrote is a reference cycle holding the FP32 weights (and the
    protobuf they came from): it lived on beside the check's sessions until the cycle collector ran (at
    the 2.2 GB Llama, GBs of the peak); it is collected before them."""
    import gc

    from trtforge.passes.precision import convert as convert_module

    alive = []
    check = convert_module.check_outputs

    def spy(*args, **kw):
        graphs = sum(isinstance(o, ir.Graph) for o in gc.get_objects())
        gc.collect()
        alive.append(graphs - sum(isinstance(o, ir.Graph) for o in gc.get_objects()))  # garbage ones
        return check(*args, **kw)

    monkeypatch.setattr(convert_module, "check_outputs", spy)
    convert_precision(_model(), "fp16", keep_io_types=True)
    assert alive == [0]


def test_the_output_check_opens_one_session_at_a_time(monkeypatch):
    """check_outputs made its native FP16 session while the emulation's was still held (the loop's
    variable let go of it only once the new one was made): two sessions' weights at once."""
    import weakref

    from trtforge.passes.precision import verify as verify_module

    opened = []
    make = verify_module.exact_session

    def spy(model, **kw):
        alive = [r for r in opened if r() is not None]
        assert not alive, "a session of the check is still open"
        sess = make(model, **kw)
        opened.append(weakref.ref(sess))
        return sess

    monkeypatch.setattr(verify_module, "exact_session", spy)
    convert_precision(_model(), "fp16", keep_io_types=True)
    assert len(opened) == 2
