"""The runtime over a real TensorRT engine: built here (TensorRT-RTX builds on the CPU), run where a GPU
that TensorRT supports exists (`trt_run`; none of our machines: RTX refuses CC 9.0, facts §6)."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from trtforge.core.manifest import ShapeRange
from trtforge.errors import UserError

D = 64


@pytest.fixture(scope="module")
def engine_path(tmp_path_factory):
    import onnx
    from onnx import TensorProto, helper

    from trtforge.compiler.pipeline import compile_model

    d = tmp_path_factory.mktemp("trt")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["x2"]),
            helper.make_node("Add", ["x2", "one"], ["y"]),
            helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0),
        ],
        "standin_twin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", D]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch"]),
        ],
        initializer=[
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx_path = d / "twin.onnx"
    onnx.save(model, onnx_path)
    out = d / "twin.engine"
    compile_model(
        str(onnx_path),
        output=out,
        shapes={"x": ShapeRange([1, D], [8, D], [32, D])},
        streams=2,
        progress=False,
    )
    return out


@pytest.mark.trt_build
def test_real_engine_manifest_passes_checks_up_to_the_gpu(engine_path):
    from trtforge.core.backend import get_backend
    from trtforge.core.manifest import read_manifest
    from trtforge.runtime import load

    m = read_manifest(engine_path)
    assert m.streams == 2 and len(m.profiles) == 2
    backend = get_backend(m.backend["name"])
    if backend.capabilities.can_run:
        eng = load(engine_path)
        assert eng.streams == 2 and eng.device_memory_for_profile(0) >= 0
    else:
        with pytest.raises(UserError, match="cannot run engines here"):
            load(engine_path)
    data = engine_path.read_bytes()
    engine_path.write_bytes(data[: len(data) // 2])
    try:
        with pytest.raises(UserError, match="truncated or modified"):
            load(engine_path)
    finally:
        engine_path.write_bytes(data)


@pytest.mark.trt_run
def test_real_engine_runs_on_two_streams(engine_path):
    import torch

    from trtforge.runtime import load

    eng = load(engine_path)
    assert [s.name for s in eng.inputs] == ["x"] and {s.name for s in eng.outputs} == {"y", "s"}
    assert eng.profiles[0]["x"].max == [32, D]
    with eng.session(streams=2) as s:

        def one(seed):
            x = torch.randn(1 + seed % 32, D, device="cuda")
            out = s.submit({"x": x}).result()
            torch.testing.assert_close(out["y"], x * 2 + 1)
            torch.testing.assert_close(out["s"], (x * 2 + 1).sum(-1), rtol=1e-4, atol=1e-3)
            return True

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert all(pool.map(one, range(64)))
        x = np.random.default_rng(0).standard_normal((5, D)).astype(np.float32)
        np.testing.assert_allclose(s.run({"x": x})["y"], x * 2 + 1, rtol=1e-6)
        stats = s.memory_stats()
        assert sum(lane["calls"] for lane in stats["lanes"]) == 65
        assert max(lane["arena_peak_request"] for lane in stats["lanes"]) <= eng.device_memory_for_profile(0)
        with pytest.raises(UserError, match="dimension 0: 33 not in"):
            s.run({"x": torch.randn(33, D, device="cuda")})
    with pytest.raises(UserError, match="--streams 3"):
        eng.session(streams=3)


@pytest.mark.trt_run
def test_real_engine_cuda_graphs_and_torch_allocator(engine_path):
    import torch

    from trtforge.runtime import load

    with load(engine_path).session(streams=1, cuda_graphs=True, torch_allocator=True) as s:
        for _ in range(4):
            x = torch.randn(8, D, device="cuda")
            torch.testing.assert_close(s.run({"x": x})["y"], x * 2 + 1)
        stats = s.memory_stats()
        assert stats["lanes"][0]["graph_captured"] or stats["graph_failures"]
