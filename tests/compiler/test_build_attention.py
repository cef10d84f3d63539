"""IAttention without a fused TensorRT kernel: the build falls back to a decomposed attention and says so."""

from __future__ import annotations

import pytest

from trtforge.compiler.build import BuildOptions, build_engine

pytestmark = pytest.mark.trt_build


def _attention_onnx(path, head_size: int, heads: int = 2):
    """q/k/v [B, heads, S, head_size] FP16 -> one opset-23 Attention -> [B, heads, S, head_size]."""
    import onnx
    from onnx import TensorProto, helper

    dims = ["batch", heads, "seq", head_size]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, dims) for n in ("q", "k", "v")]
    graph = helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attn")],
        "attention",
        io,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.save(model, path)
    return path


def _shapes(head_size: int, heads: int = 2) -> list[str]:
    return [f"{n}:1x{heads}x1x{head_size}:2x{heads}x8x{head_size}:4x{heads}x16x{head_size}" for n in "qkv"]


def test_head_size_without_fused_kernel_builds_decomposed(tmp_path) -> None:
    """Head size 8 has no fused kernel in TensorRT-RTX 1.7; the build used to fail in Myelin."""
    path = _attention_onnx(tmp_path / "a.onnx", head_size=8)
    data, record = build_engine(path, BuildOptions(shapes=_shapes(8), progress=False))
    assert len(data) > 0
    assert record.attention_decomposed == ["attn"]
    assert any("attention attn built decomposed" in w for w in record.warnings)
    assert record.to_dict()["attention_decomposed"] == ["attn"]


def test_head_size_with_fused_kernel_stays_fused(tmp_path) -> None:
    """Where TensorRT has a kernel, nothing is marked decomposable and no warning is added."""
    path = _attention_onnx(tmp_path / "a.onnx", head_size=64)
    data, record = build_engine(path, BuildOptions(shapes=_shapes(64), progress=False))
    assert len(data) > 0
    assert record.attention_decomposed == []
    assert not any("built decomposed" in w for w in record.warnings)
