"""Accuracy is CPU-independent: exact sessions compute Q/DQ as exact integer math, and every accuracy
path (calibration, fallback, verifiers, export check, report accuracy) uses them; latency uses fast."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.calibration import models
from trtforge.calibration.placement import name_nodes, plan_placement
from trtforge.calibration.qdq import insert_qdq
from trtforge.numerics import sessions
from trtforge.numerics.cpu import cpu_isa
from trtforge.numerics.sessions import EXACT, FAST, exact_session, fast_session, is_exact, session_options

DISABLED = ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def _one_matmul(k: int, n: int, seed: int = 0) -> onnx.ModelProto:
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _qdq_matmul_case(k: int = 768, n: int = 64) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """(Q/DQ model as calibration emits it, input x, float64 integer-math reference of its output)."""
    m = _one_matmul(k, n)
    name_nodes(m)
    amax = 4.0
    x = np.random.default_rng(1).uniform(-amax, amax, (16, k)).astype(np.float32)
    sx = np.float32(amax / 127)
    q = insert_qdq(m, plan_placement(m).targets, {"x": float(sx)})
    assert {n.op_type for n in q.graph.node} == {"QuantizeLinear", "DequantizeLinear", "MatMul"}
    inits = _inits(q)
    w_int8 = next(v for v in inits.values() if v.dtype == np.int8 and v.ndim == 2)
    w_scale = next(v for v in inits.values() if v.dtype == np.float32 and v.shape == (n,))
    x_int8 = np.clip(np.rint(x / sx), -128, 127).astype(np.int64)  # QuantizeLinear: round half to even
    assert np.abs(x_int8).max() == 127
    ref = (x_int8 @ w_int8.astype(np.int64)).astype(np.float64) * float(sx) * w_scale.astype(np.float64)
    return q, x, ref


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def test_exact_session_computes_qdq_matmul_as_exact_integer_math():
    """The calibration's own Q/DQ layout (per-tensor int8 activation, per-channel int8 weight): the
    exact session equals int32 accumulation of the int8 operands times the two scales to ~1e-6.
    K = 768 with activations spanning the whole int8 range: where ORT's fused AVX2 u8s8 kernel
    saturates int16 pair sums, this is where it would differ."""
    q, x, ref = _qdq_matmul_case()
    err = _rel_err(exact_session(q).run(None, {"x": x})[0], ref)
    assert err < 2e-6, f"exact Q/DQ differs from integer math by {err:.2e} (relative to max |y|)"


@pytest.mark.skipif(
    cpu_isa()["isa"] == []
    or "AVX2" not in cpu_isa()["isa"]
    or any("512" in i or "VNNI" in i or "AMX" in i for i in cpu_isa()["isa"]),
    reason="shows the AVX2-only int8 kernel; this CPU has other int8 instructions (or none known)",
)
def test_fast_session_q_dq_on_avx2_is_not_integer_math():
    """Why accuracy never uses FAST: on an AVX2-only CPU ORT fuses DQ -> MatMul into a u8s8 kernel whose
    int16 pair sums saturate, so the same graph is off by percent (measured: ~5e-2 here)."""
    q, x, ref = _qdq_matmul_case()
    assert _rel_err(fast_session(q).run(None, {"x": x})[0], ref) > 1e-3


def test_session_options_by_purpose():
    exact, fast = session_options(EXACT, threads=2), session_options(FAST)
    assert exact.graph_optimization_level == DISABLED
    assert exact.intra_op_num_threads == 2 and exact.inter_op_num_threads == 1
    assert fast.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    m = models.mlp()
    assert is_exact(exact_session(m)) and not is_exact(fast_session(m))
    with pytest.raises(ValueError, match="purpose"):
        session_options("default")  # type: ignore[arg-type]


def _transpose_matmul(dtype: int) -> onnx.ModelProto:
    """x[B,S,32] float32 -> Cast(dtype) -> Transpose(1,0,2) -> MatMul(W[32,96]): the layout an FP16
    nn.MultiheadAttention (sequence first) converts to."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    w = numpy_helper.from_array(np.ones((32, 96), np_dtype), "W")
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["h"], to=dtype),
            helper.make_node("Transpose", ["h"], ["t"], perm=[1, 0, 2]),
            helper.make_node("MatMul", ["t", "W"], ["y"]),
        ],
        "transpose_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
        [helper.make_tensor_value_info("y", dtype, ["seq", "batch", 96])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_fast_session_over_an_fp16_transpose_matmul_does_not_crash(tmp_path):
    """ORT 1.32's NchwcTransformer (ORT_ENABLE_ALL) segfaulted creating a session over an FP16 Transpose ->
    MatMul: `report` of an FP16 nn.TransformerEncoder died with SIGSEGV at the ort-fp16 latency step,
    leaving no report. Run in a child process, since the failure kills the process."""
    import subprocess
    import sys

    path = tmp_path / "fp16.onnx"
    onnx.save(_transpose_matmul(TensorProto.FLOAT16), str(path))
    code = (
        "import sys, numpy as np, onnx\n"
        "from trtforge.numerics.sessions import fast_session, run\n"
        "x = np.ones((2, 8, 32), np.float32)\n"
        "for m in (sys.argv[1], onnx.load(sys.argv[1]), open(sys.argv[1], 'rb').read()):\n"
        "    assert run(fast_session(m), {'x': x})[0].shape == (8, 2, 96)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


def test_only_fp16_graphs_lose_the_crashing_optimizer():
    """FP32 graphs keep NchwcTransformer (ORT's fast NCHWc convolutions): it is turned off for FP16 only."""
    assert sessions._has_fp16(_transpose_matmul(TensorProto.FLOAT16))
    assert not sessions._has_fp16(_transpose_matmul(TensorProto.FLOAT))
    assert not sessions._has_fp16(models.mlp().SerializeToString())


@pytest.fixture
def created(monkeypatch):
    """Every ONNX Runtime session created while the test runs: (graph optimization level, source)."""
    seen: list[tuple[ort.GraphOptimizationLevel, str]] = []
    real = ort.InferenceSession

    class Recording(real):
        def __init__(self, source, sess_options=None, *args, **kwargs):
            level = sess_options.graph_optimization_level if sess_options is not None else None
            seen.append((level, source if isinstance(source, str) else "<bytes>"))
            super().__init__(source, sess_options, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    return seen


def test_calibration_and_fallback_use_exact_sessions_only(created):
    from trtforge.calibration.api import calibrate_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((80, 5, 32)).astype(np.float32)
    x[..., 3] *= 20  # an outlier channel, so the fallback has something to return
    _, rec = calibrate_model(
        models.mlp(), {"x": x}, method="max", smoothquant=0.5, accuracy_target=0.99999, progress=False
    )
    assert rec.accuracy["probes"] > 1 and rec.fallback, "the fallback should have probed and returned nodes"
    assert len(created) >= rec.accuracy["probes"] + 2
    assert all(level == DISABLED for level, _ in created), created


def test_pass_and_precision_verifiers_use_exact_sessions_only(created):
    import onnx_ir as ir

    from trtforge.passes.precision.convert import convert_precision
    from trtforge.passes.verify import Verifier

    m = models.mlp()
    v = Verifier(ir.serde.deserialize_model(m))
    v.check(ir.serde.deserialize_model(m), "identity", [])
    n_verify = len(created)
    convert_precision(m, "fp16")
    assert n_verify >= 2 and len(created) > n_verify
    assert all(level == DISABLED for level, _ in created), created


def test_export_check_uses_an_exact_session(created, tmp_path):
    import torch

    from trtforge.compiler.export import export_module

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    art = export_module(Tiny(), {"x": torch.randn(2, 8)}, tmp_path, exporter="legacy")
    assert art.record.verified
    assert created and all(level == DISABLED for level, _ in created), created


def test_report_accuracy_is_exact_and_latency_is_fast_with_the_cpu_isa(created, tmp_path):
    pytest.importorskip("polygraphy")
    from tests.reports._tiny import classifier_onnx, classifier_weights, inputs_npz
    from trtforge.numerics.cpu import isa_summary
    from trtforge.reports.api import build_report

    a = classifier_onnx(tmp_path / "a.onnx", *classifier_weights(0))
    inputs_npz(tmp_path / "x.npz", samples=4)
    res = build_report(
        str(a),
        targets=["ort"],
        data=str(tmp_path / "x.npz"),
        out_dir=tmp_path / "out",
        batch_sizes=(2,),
        warmup=1,
        runs=2,
        progress=False,
    )
    levels = [level for level, src in created if src == str(a)]
    assert levels[0] == DISABLED, "accuracy outputs must come from the exact session"
    assert ort.GraphOptimizationLevel.ORT_ENABLE_ALL in levels[1:], (
        "latency must be timed with a fast session"
    )
    doc = json.loads(res.json_path.read_text())
    assert [(p["session"], p["cpu_isa"]) for p in doc["latency"]] == [("fast", isa_summary())]
    assert doc["environment"]["cpu_isa"]["isa"] == res.report.environment["cpu_isa"]["isa"]
    assert isa_summary() in res.markdown_path.read_text()
    x = np.load(tmp_path / "x.npz")["x"]
    expect = exact_session(str(a)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(res.runs["ort"].outputs[0]["logits"], expect)


def test_sessions_module_is_the_only_place_that_builds_ort_sessions():
    """A grep-level guard: new code must ask trtforge.numerics for sessions, not build its own."""
    from pathlib import Path

    root = Path(sessions.__file__).resolve().parents[1]
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "sessions.py"
        and ("InferenceSession(" in p.read_text() or "SessionOptions(" in p.read_text())
    ]
    assert offenders == []


def _bf16_model() -> onnx.ModelProto:
    """y = bf16(2 * x) (bfloat16 in and out) and z = float32(x) + 1: numpy has no bfloat16 ORT takes."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["x32", "x32"], ["y32"]),
            helper.make_node("Cast", ["y32"], ["y"], to=TensorProto.BFLOAT16),
            helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["xf", "one"], ["z"]),
        ],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["b", 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["b", 3]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", 3]),
        ],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("as_bf16", [True, False])
def test_run_feeds_and_returns_bfloat16_tensors(as_bf16):
    import ml_dtypes

    x = np.array([[0.5, -1.25, 3.0], [1e-3, 7.0, -0.0]], np.float32)
    feed = x.astype(ml_dtypes.bfloat16) if as_bf16 else x
    y, z = sessions.run(exact_session(_bf16_model()), {"x": feed, "unused": x})
    exact = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert y.dtype == np.float32 and y.shape == (2, 3)
    np.testing.assert_array_equal(y, exact * 2)
    np.testing.assert_array_equal(z, exact + 1)
    (only_z,) = sessions.run(exact_session(_bf16_model()), {"x": feed}, ["z"])
    np.testing.assert_array_equal(only_z, exact + 1)


def test_bfloat16_io_model_is_verified_pass_by_pass():
    from trtforge.passes.pipeline import optimize_model

    _out, ledger = optimize_model(_bf16_model())
    assert ledger.passes and all(p.verification is not None for p in ledger.passes)
