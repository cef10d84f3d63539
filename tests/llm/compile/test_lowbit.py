"""compile --generate --precision fp8 / int4: Q/DQ form, exact-ORT accuracy vs FP32, TensorRT-RTX builds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import trtforge
import trtforge.llm.api
from tests.llm.tiny_models import prompts, tiny_model
from trtforge.cli.main import main as cli_main
from trtforge.errors import UserError

NEW = 12
SIZES = {"hidden_size": 128, "intermediate_size": 256}  # multiples of the INT4 block (128)
COMMON = {"max_seq": 64, "max_batch": 4, "max_prefill": 32, "exporter": "legacy", "progress": False}


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", **SIZES)


def _step(model, path, precision, **kw):
    return trtforge.compile(
        model, generate=True, build=False, save_onnx=path, precision=precision, **COMMON, **kw
    )


def _cosines(ref, low):
    return np.concatenate(
        [(r * q).sum(-1) / np.linalg.norm(r, axis=-1) / np.linalg.norm(q, axis=-1) for r, q in zip(ref, low)]
    )


def _consumers_of_dq(graph):
    return {o: n for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}


@pytest.fixture(scope="module")
def fp32(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("fp32") / "fp32.onnx"
    _step(model, path, "fp32")
    return trtforge.llm.api.load(path)


def test_fp8_step_graph(model, fp32, tmp_path):
    """E4M3 Q/DQ on both inputs of every projection (per-channel weights), LM head and attention float."""
    calib = prompts(model.config.vocab_size, lens=(5, 9, 17, 3, 12, 20, 7, 30), seed=5)
    _step(model, tmp_path / "fp8.onnx", "fp8", calib_prompts=calib)
    g = onnx.load(str(tmp_path / "fp8.onnx")).graph
    inits = {i.name: i for i in g.initializer}
    dq = _consumers_of_dq(g)
    matmuls = [n for n in g.node if n.op_type == "MatMul"]
    quantized = [n for n in matmuls if n.input[0] in dq and n.input[1] in dq]
    # 2 layers x (fused qkv, o, fused gate/up, down) = 8, the LM head left in float
    assert len(quantized) == 8 and len(matmuls) == 9, [n.name for n in matmuls]
    for n in quantized:
        w_dq = dq[n.input[1]]
        assert inits[w_dq.input[0]].data_type == onnx.TensorProto.FLOAT8E4M3FN
        assert onnx.numpy_helper.to_array(inits[w_dq.input[1]]).ndim == 1  # per output channel
        act_q = next(x for x in g.node if x.output and x.output[0] == dq[n.input[0]].input[0])
        assert act_q.op_type == "QuantizeLinear"
        assert inits[act_q.input[2]].data_type == onnx.TensorProto.FLOAT8E4M3FN
    assert not any(i in dq for n in g.node if n.op_type in ("Attention", "TensorScatter") for i in n.input)
    fp8 = trtforge.llm.api.load(tmp_path / "fp8.onnx")
    batch = prompts(model.config.vocab_size)
    tokens, ref = fp32.generate(batch, NEW, stop_at_eos=False, return_logits=True)
    cos = _cosines(ref, fp8.score(batch, tokens))
    # Measured on this random-weight model (FP8 + the FP16 rest): mean logits cosine 0.971 (E4M3 keeps
    # 3 mantissa bits; the same bar as the INT8 test's). The trained model's perplexity is the real test.
    assert cos.mean() >= 0.95, f"mean logits cosine {cos.mean():.4f}"


def test_fp8_without_prompts_records_its_random_calibration(model, tmp_path):
    result = _step(model, tmp_path / "fp8.onnx", "fp8")
    rec = result.records["fp8"]
    assert rec["format"] == "fp8" and rec["calibration_prompts"]["source"].startswith("seeded random")
    check = rec["exact_check"]
    # measured 0.28 on this random model (near-flat logits, 8 rows of random tokens)
    assert 0 < check["logits_rel_l2"] < 0.5 and check["logits_max_abs_error"] > 0


def test_int4_step_graph(model, fp32, tmp_path):
    """Blocked DequantizeLinear (int4 [K, N], scale [K/128, N], axis 0) feeding each projection MatMul."""
    result = _step(model, tmp_path / "int4.onnx", "int4")
    g = onnx.load(str(tmp_path / "int4.onnx")).graph
    inits = {i.name: i for i in g.initializer}
    dq = _consumers_of_dq(g)
    matmuls = [n for n in g.node if n.op_type == "MatMul"]
    quantized = [n for n in matmuls if n.input[1] in dq]
    assert len(quantized) == 8 and len(matmuls) == 9
    assert not any(n.op_type == "QuantizeLinear" for n in g.node)  # weight-only
    for n in quantized:
        node = dq[n.input[1]]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == {"axis": 0, "block_size": 128}
        w, s = inits[node.input[0]], onnx.numpy_helper.to_array(inits[node.input[1]])
        assert w.data_type == onnx.TensorProto.INT4 and s.shape == (w.dims[0] // 128, w.dims[1])
        q = onnx.numpy_helper.to_array(w).astype(np.float32)
        assert q.min() >= -7 and q.max() <= 7 and np.abs(q).max() == 7  # symmetric, full range used
    rec = result.records["int4"]
    assert rec["matmuls_quantized"] == 8 and rec["weight_bytes"]["int4"] < rec["weight_bytes"]["float"] / 6
    int4 = trtforge.llm.api.load(tmp_path / "int4.onnx")
    batch = prompts(model.config.vocab_size)
    tokens, ref = fp32.generate(batch, NEW, stop_at_eos=False, return_logits=True)
    cos = _cosines(ref, int4.score(batch, tokens))
    # Measured: mean cosine 0.788 on these random Gaussian weights (4-bit round-to-nearest of the
    # near-flat logits of a random model); the trained model's perplexity is the real test.
    assert cos.mean() >= 0.7, f"mean logits cosine {cos.mean():.4f}"


def test_refusals(tmp_path):
    small = tiny_model("llama", intermediate_size=96)  # no weight has 128k input channels
    with pytest.raises(UserError, match="int4: no MatMul weight qualifies"):
        _step(small, tmp_path / "a.onnx", "int4")
    with pytest.raises(UserError, match="--calib-data only applies"):
        _step(small, tmp_path / "b.onnx", "int4", calib_prompts=[[1, 2]])
    with pytest.raises(UserError, match="fp8 --cache-layout paged"):
        _step(small, tmp_path / "c.onnx", "fp8", cache_layout="paged")
    assert not list(tmp_path.iterdir())


def test_encoder_compile_refuses_fp8(tmp_path, capsys):
    model = "tests.llm.tiny_models:llama_factory"
    rc = cli_main(["compile", model, "-o", str(tmp_path / "x.engine"), "--precision", "fp8"])
    assert rc == 2 and "decoder step graphs only" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _build(model, tmp_path, precision, targets):
    out = tmp_path / f"{precision}.engine"
    return trtforge.compile(model, output=out, generate=True, precision=precision, targets=targets, **COMMON)


@pytest.mark.trt_build
def test_trt_rtx_builds_fp8_for_ada_and_refuses_ampere(model, tmp_path):
    result = _build(model, tmp_path, "fp8", ["SM89"])
    assert result.engine_path.stat().st_size > 0
    assert result.records["build"]["layer_types"].get("QUANTIZE", 0) == 8
    (tmp_path / "no").mkdir()
    with pytest.raises(UserError, match=r"--precision fp8 step engine for SM80.*fp8_e4m3"):
        _build(model, tmp_path / "no", "fp8", ["SM80"])
    assert not list((tmp_path / "no").iterdir())


@pytest.mark.trt_build
def test_trt_rtx_builds_int4_weight_only(model, tmp_path):
    result = _build(model, tmp_path, "int4", ["SM80"])
    assert result.records["build"]["layer_types"].get("DEQUANTIZE", 0) == 8
    assert result.manifest.precision["mode"] == "int4"
