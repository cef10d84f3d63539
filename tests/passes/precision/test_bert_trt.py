"""Converted graphs build with TensorRT-RTX on the CPU: fused FP16 BERT (attention layers), INT8+FP16."""

from __future__ import annotations

import onnx
import pytest

from tests.models import BERT_INPUTS, bert_inputs, tiny_bert
from tests.passes.precision.test_convert import qdq_matmul
from trtforge.passes.precision import convert_precision

pytestmark = pytest.mark.trt_build
SHAPES = [f"{n}:1x1:4x16:8x64" for n in BERT_INPUTS]


@pytest.fixture(scope="module")
def fused_bert(tmp_path_factory) -> onnx.ModelProto:
    from trtforge.compiler.export import export_module
    from trtforge.passes.pipeline import optimize_model

    work = tmp_path_factory.mktemp("bert")
    names = ["last_hidden_state", "pooler"]
    art = export_module(tiny_bert(), bert_inputs(2, 8), work, dynamic="batch,seq", output_names=names)
    fused, _ = optimize_model(onnx.load(str(art.path)))
    assert [n.op_type for n in fused.graph.node].count("Attention") == 2
    return fused


def _build(model: onnx.ModelProto, path, shapes=SHAPES):
    from trtforge.compiler.build import BuildOptions, build_engine

    onnx.save(model, str(path))
    return build_engine(path, BuildOptions(shapes=shapes, progress=False))


def test_fp16_fused_bert_builds_with_attention_layers(fused_bert, tmp_path) -> None:
    low, rec = convert_precision(fused_bert, "fp16")
    assert rec.fp32_nodes == 0 and all(c.finite and c.min_cosine > 0.9999 for c in rec.verification)
    attention = [n for n in low.graph.node if n.op_type == "Attention"]
    assert attention and all(
        i.data_type == onnx.TensorProto.FLOAT16 for i in low.graph.initializer if "weight" in i.name
    )
    data, build = _build(low, tmp_path / "bert.fp16.onnx")
    assert len(data) > 0
    layers = build.layer_types
    assert layers.get("ATTENTION_INPUT", 0) == 2 and layers.get("ATTENTION_OUTPUT", 0) == 2
    assert [t.dtype for t in build.inputs] == ["int64"] * 3
    assert {t.dtype for t in build.outputs} == {"float32"}  # keep_io_types


def test_fp32_fused_attention_builds_only_decomposed(fused_bert, tmp_path) -> None:
    """Why the conversion matters: TensorRT's fused attention has no FP32 kernel, so an FP32 Attention
    node builds only as separate MatMul/Softmax kernels, which the build record names."""
    data, build = _build(fused_bert, tmp_path / "bert.fp32.onnx")
    assert len(data) > 0 and len(build.attention_decomposed) == 2
    assert any("built decomposed" in w for w in build.warnings)


@pytest.mark.parametrize("weight_scale", [0.003, 1e-5])
def test_int8_qdq_with_fp16_rest_builds(tmp_path, weight_scale: float) -> None:
    """Q/DQ with FP16 scales (opset 19): TensorRT sees DQ -> MatMul with no Cast in between, also when
    the weight scales are subnormal in FP16 (both operand scales must share a type)."""
    low, _ = convert_precision(qdq_matmul(weight_scale=weight_scale), "fp16")
    data, build = _build(low, tmp_path / "qdq.fp16.onnx", shapes=["x:1x16:4x16:8x16"])
    assert len(data) > 0
    assert build.layer_types["DEQUANTIZE"] == 2 and build.layer_types["QUANTIZE"] == 1
