"""TensorRT-RTX builds of zoo architectures (`tests/passes/_zoo.py`) whose graphs once broke the build
or have a fusion TensorRT must accept: MPNet's attention with a relative-position bias in attn_mask,
MobileBERT INT8 (weight scales FP16 cannot hold, after SmoothQuant)."""

from __future__ import annotations

import pytest

from tests.passes._zoo import ZOO

pytestmark = [pytest.mark.trt_build, pytest.mark.slow]


def _compile(name: str, precision, tmp_path):
    import trtforge

    module, inputs, dynamic = ZOO[name]()
    return trtforge.compile(
        module, inputs, tmp_path / f"{name}.engine", dynamic=dynamic, precision=precision, progress=False
    ).manifest


def test_mpnet_fp16_builds_its_biased_attention_as_tensorrt_attention(tmp_path) -> None:
    m = _compile("mpnet", "fp16", tmp_path)
    assert sum(p["matches"] for p in m.records["passes"]["passes"] if p["name"] == "attention") == 2
    layers = m.records["build"]["layer_types"]
    assert layers.get("ATTENTION_INPUT") == 2 and layers.get("ATTENTION_OUTPUT") == 2, layers


def test_mobilebert_int8_builds(tmp_path) -> None:
    import numpy as np

    from trtforge.compiler.stages import PrecisionOptions

    ids = np.random.default_rng(0).integers(3, 128, (8, 8))
    np.savez(tmp_path / "calib.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    precision = PrecisionOptions(mode="int8", calib_data=str(tmp_path / "calib.npz"), progress=False)
    m = _compile("mobilebert", precision, tmp_path)
    layers = m.records["build"]["layer_types"]
    assert layers.get("QUANTIZE", 0) > 0 and layers.get("DEQUANTIZE", 0) > 0, layers
