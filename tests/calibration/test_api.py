"""calibrate_model end to end on tiny models: record, cache round trip, SmoothQuant, accuracy fallback."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import onnx
import pytest

from tests.calibration import models
from trtforge.calibration.api import calibrate_model
from trtforge.calibration.cache import format_cache, read_calibration_cache
from trtforge.calibration.placement import name_nodes, plan_placement
from trtforge.calibration.smoothquant import apply_smoothquant
from trtforge.errors import UserError
from trtforge.numerics.sessions import exact_session


def _data(
    n: int = 64, k: int = 32, seed: int = 0, outlier_channel: int | None = None
) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((n, 6, k)).astype(np.float32)
    if outlier_channel is not None:
        x[..., outlier_channel] *= 60.0
    return {"x": x}


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("method", ["max", "percentile", "entropy", "mse"])
def test_every_method_quantizes_and_stays_close(method):
    m = models.mlp()
    q, rec = calibrate_model(m, _data(), method=method, progress=False)
    x = _data(8, seed=1)["x"]
    assert _cos(exact_session(m).run(None, {"x": x})[0], exact_session(q).run(None, {"x": x})[0]) > 0.995
    d = rec.to_dict()
    json.dumps(d)
    assert (d["method"], d["samples"], d["matmuls_quantized"], d["matmuls_total"]) == (method, 64, 2, 2)
    assert d["tensors_quantized"] == 2 and d["weights_quantized"] == 2 and d["only_real_tokens"] is False
    onnx.checker.check_model(q)


@pytest.mark.parametrize("smoothquant", [None, 0.8])
def test_weights_listed_as_graph_inputs_are_calibrated_as_weights(smoothquant):
    """Old exporters list initializers as graph inputs too. Before: Q/DQ replaced w1 and w2 by w*_int8 and
    the model came back with inputs 'w1', 'w2' that nothing defaults any more (a model no caller can run,
    exit 0); with SmoothQuant the next statistics run raised ORT's ValueError "Required inputs ([...]) are
    missing" ("internal error", exit 1)."""
    m = models.mlp()
    for t in m.graph.initializer:
        m.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    q, rec = calibrate_model(m, _data(), smoothquant=smoothquant, progress=False)
    assert [i.name for i in q.graph.input] == ["x"]  # weights, as compile's TensorRT parser takes them
    assert rec.to_dict()["matmuls_quantized"] == 2
    x = _data(8, seed=1)["x"]
    assert _cos(exact_session(m).run(None, {"x": x})[0], exact_session(q).run(None, {"x": x})[0]) > 0.995


def _weight_returned(m: onnx.ModelProto) -> None:
    m.graph.output.append(onnx.helper.make_tensor_value_info("w2", onnx.TensorProto.FLOAT, [64, 32]))


def _weight_read_in_a_branch(m: onnx.ModelProto) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    m.graph.initializer.extend(
        [
            numpy_helper.from_array((rng.standard_normal((64, 32)) / 8).astype(np.float32), "w3"),
            numpy_helper.from_array(np.array(True), "cond"),
        ]
    )
    out = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", 32])  # noqa: E731
    then = helper.make_graph([helper.make_node("MatMul", ["r", "w3"], ["t"])], "then", [], [out("t")])
    other = helper.make_graph([helper.make_node("Neg", ["o"], ["e"])], "else", [], [out("e")])
    m.graph.node.append(helper.make_node("If", ["cond"], ["z"], then_branch=then, else_branch=other))
    m.graph.output.append(out("z"))


@pytest.mark.parametrize("smoothquant", [None, 0.8])
@pytest.mark.parametrize("edit", [_weight_returned, _weight_read_in_a_branch])
def test_weights_read_outside_the_main_graph_nodes_are_kept(edit, smoothquant):
    """Before: SmoothQuant and Q/DQ dropped every initializer no main-graph node read, so a weight the
    model also returns or one an If branch reads was removed: with SmoothQuant the next statistics run
    failed in ONNX Runtime ("internal error", exit 1), without it the branch's weight was missing from
    the written model."""
    m = models.mlp()
    edit(m)
    q, _ = calibrate_model(m, _data(), smoothquant=smoothquant, progress=False)
    x = _data(8, seed=1)["x"]
    for a, b in zip(exact_session(m).run(None, {"x": x}), exact_session(q).run(None, {"x": x})):
        assert _cos(a.ravel(), b.ravel()) > 0.995


@pytest.mark.parametrize(
    "taken", ["x_smoothed", "x_smooth_inv_scale", "w2_smoothed_fc2", "x_SmoothQuant_Mul"]
)
def test_smoothquant_names_what_it_adds_apart_from_the_models_own(taken):
    """Before: SmoothQuant named its Mul output '<x>_smoothed', its scale '<x>_smooth_inv_scale', its
    weights '<w>_smoothed_<node>' and its node '<x>_SmoothQuant_Mul' whatever the model already held, so a
    model with such a tensor (or node) came out with one name made twice and calibrate exit 1 in ONNX
    Runtime. The relu's output (and node) here takes the name."""
    m = models.mlp()
    relu = next(n for n in m.graph.node if n.name == "relu")
    fc2 = next(n for n in m.graph.node if n.name == "fc2")
    relu.output[0] = fc2.input[0] = taken
    relu.name = taken
    q, rec = calibrate_model(m, _data(), smoothquant=0.8, progress=False)
    assert rec.to_dict()["smoothquant"]["matmuls_smoothed"] == 2
    x = _data(8, seed=1)["x"]
    assert _cos(exact_session(m).run(None, {"x": x})[0], exact_session(q).run(None, {"x": x})[0]) > 0.995


def test_cache_is_written_in_trt_format_and_read_back_without_statistics(tmp_path):
    cache = tmp_path / "model.calib.cache"
    m = models.mlp()
    q1, rec1 = calibrate_model(m, _data(), method="max", calib_cache=str(cache), progress=False)
    header, _scales = read_calibration_cache(cache)
    lines = cache.read_text().splitlines()
    assert header.startswith("TRT-") and header.split()[0].endswith("-MinMaxCalibration")
    name, hexval = lines[1].split(": ")
    assert struct.unpack("!f", bytes.fromhex(hexval))[0] == pytest.approx(rec1.activation_scales[name])
    assert rec1.cache["written"] and not rec1.cache["read"]
    q2, rec2 = calibrate_model(m, _data(), method="max", calib_cache=str(cache), progress=False)
    assert rec2.cache["read"] and rec2.samples == 0 and rec2.cache["tensors_from_cache"] == 2
    assert q1.SerializeToString() == q2.SerializeToString()
    q3, rec3 = calibrate_model(m, None, method="max", calib_cache=str(cache), progress=False)  # cache alone
    assert q3.SerializeToString() == q1.SerializeToString() and rec3.source.startswith("calibration cache")
    # another method's cache: its scales are not this method's (before: used, the record saying 'entropy')
    with pytest.raises(
        UserError,
        match=r"holds MinMaxCalibration scales \(method 'max'\), and this run "
        r"calibrates with method 'entropy': pass method 'max'",
    ):
        calibrate_model(m, _data(), calib_cache=str(cache), progress=False)
    partial = tmp_path / "partial.cache"
    partial.write_text("\n".join(cache.read_text().splitlines()[:2]) + "\n")
    with pytest.raises(UserError, match="no scale for 1 tensor"):
        calibrate_model(m, None, method="max", calib_cache=str(partial), progress=False)


def test_a_cache_of_the_same_graph_with_other_weights_or_data_is_refused(tmp_path):
    """A cache was keyed by its path alone: one left beside a retrained model (the same graph and tensor
    names, other weights) or read with other calibration data put those ranges into this model's Q/DQ
    without a word (q1's scales in a model whose weights are mlp(seed=1)'s). Now its header carries the
    model's and the data's fingerprints, and a mismatch is refused naming the file and --calib-cache."""
    cache = tmp_path / "model.calib.cache"
    calibrate_model(models.mlp(), _data(), method="max", calib_cache=str(cache), progress=False)
    retrained = models.mlp(seed=1)
    for data in (_data(), None):
        with pytest.raises(
            UserError,
            match=rf"calibration cache '{re.escape(str(cache))}' was computed for another model "
            r"\(fingerprint model=[0-9a-f]{32}; this model's graph and weights give [0-9a-f]{32}\).* delete "
            r"it, or pass a --calib-cache path that does not exist yet",
        ):
            calibrate_model(retrained, data, method="max", calib_cache=str(cache), progress=False)
    with pytest.raises(
        UserError,
        match=r"was computed from other calibration data \(fingerprint data=[0-9a-f]{32}; in-memory arrays "
        r"gives [0-9a-f]{32}\).* To calibrate on this data, delete it, or pass a --calib-cache path",
    ):
        calibrate_model(models.mlp(), _data(seed=5), method="max", calib_cache=str(cache), progress=False)
    header = cache.read_text().splitlines()[0]
    assert re.fullmatch(r"TRT-\d+-MinMaxCalibration model=[0-9a-f]{32} data=[0-9a-f]{32}", header), header
    fresh = tmp_path / "retrained.calib.cache"
    _, rec = calibrate_model(retrained, _data(), method="max", calib_cache=str(fresh), progress=False)
    assert rec.cache["written"] and rec.samples == 64


def test_a_cache_computed_at_other_settings_is_refused_naming_them(tmp_path):
    """The fingerprint covered the model and the data, not the settings that change the scales: a cache
    computed at another percentile, or with padding counted, was read silently. Now its header records
    them, and a run at other values is refused naming the cache, the setting and both values."""
    cache = tmp_path / "p.calib.cache"
    m = models.mlp()
    calibrate_model(m, _data(), method="percentile", percentile=99.0, calib_cache=str(cache), progress=False)
    assert cache.read_text().splitlines()[0].endswith(" percentile=99.0")
    with pytest.raises(
        UserError,
        match=rf"calibration cache '{re.escape(str(cache))}' was computed with percentile=99\.0, and this "
        r"run calibrates with percentile=99\.99: its scales are not this run's\. Pass percentile=99\.0 "
        r"\(--percentile",
    ):
        calibrate_model(m, _data(), method="percentile", calib_cache=str(cache), progress=False)
    _, rec = calibrate_model(
        m, None, method="percentile", percentile=99.0, calib_cache=str(cache), progress=False
    )
    assert rec.cache["read"]
    masked = tmp_path / "masked.calib.cache"
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal((16, 6, 32)).astype(np.float32),
        "attention_mask": (np.arange(6) < rng.integers(2, 7, (16, 1))).astype(np.int64),
    }
    calibrate_model(models.masked_mlp(), feed, method="max", calib_cache=str(masked), progress=False)
    with pytest.raises(
        UserError,
        match=r"computed with real_tokens=yes, and this run calibrates with real_tokens=no.*--all-tokens",
    ):
        calibrate_model(
            models.masked_mlp(),
            feed,
            method="max",
            only_real_tokens=False,
            calib_cache=str(masked),
            progress=False,
        )


def test_a_cache_without_a_fingerprint_is_read_as_it_is(tmp_path):
    """A TensorRT-format cache another tool wrote (no fingerprint in its header) is read as before."""
    cache = tmp_path / "model.calib.cache"
    q1, rec1 = calibrate_model(models.mlp(), _data(), method="max", calib_cache=str(cache), progress=False)
    plain = tmp_path / "plain.cache"
    plain.write_text(format_cache(rec1.activation_scales, "max"))
    q2, rec2 = calibrate_model(models.mlp(), None, method="max", calib_cache=str(plain), progress=False)
    assert rec2.cache["read"] and q2.SerializeToString() == q1.SerializeToString()


def test_cache_alone_with_smoothquant_names_the_default_and_the_way_out(tmp_path):
    """SmoothQuant is the INT8 default: the message says so and how to quantize from a cache alone
    (before: it named --accuracy-target and --smoothquant, neither of which the user had passed)."""
    cache = tmp_path / "model.calib.cache"
    m = models.mlp()
    calibrate_model(m, _data(), method="max", calib_cache=str(cache), progress=False)
    with pytest.raises(UserError, match=r"SmoothQuant \(on by default\) needs calibration data.*no-smooth"):
        calibrate_model(m, None, calib_cache=str(cache), smoothquant=0.8, progress=False)


def test_a_cache_naming_tensors_the_model_lacks_is_refused_not_mixed_in(tmp_path):
    """The mlp's cache holds 'x' and 'r'; shared_input has an 'x' (of another width and range) but no 'r'.
    Before: shared_input took the mlp's 'x' scale and said the cache was read. A cache written after
    SmoothQuant names its smoothed tensors: read with SmoothQuant off it is refused the same way."""
    cache = tmp_path / "mlp.calib.cache"
    calibrate_model(models.mlp(), _data(), method="max", calib_cache=str(cache), progress=False)
    x = {"x": np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32) * 50}
    with pytest.raises(
        UserError,
        match=r"holds scales for 1 of its 2 tensors that this model does not have "
        r"\(e\.g\. \['r'\]\); it was written for another model",
    ):
        calibrate_model(models.shared_input(), x, method="max", calib_cache=str(cache), progress=False)
    sq = tmp_path / "sq.calib.cache"
    calibrate_model(models.mlp(), _data(), calib_cache=str(sq), smoothquant=0.8, progress=False)
    with pytest.raises(UserError, match=r"it was written after SmoothQuant"):
        calibrate_model(models.mlp(), _data(), calib_cache=str(sq), progress=False)


def test_cache_text_matches_modelopt_reader(tmp_path):
    calib_utils = pytest.importorskip("modelopt.onnx.quantization.calib_utils")
    p = tmp_path / "c.cache"
    from trtforge.calibration.cache import Fingerprint

    for fingerprint in (None, Fingerprint("ab" * 16, "cd" * 16)):  # (ModelOpt skips the header line)
        p.write_text(format_cache({"t": 0.0123}, "entropy", fingerprint))
        assert calib_utils.import_scales_from_calib_cache(str(p)) == {"t_scale": pytest.approx(0.0123)}


def test_cache_holds_tensor_names_with_colons_and_refuses_line_breaks(tmp_path):
    """tf2onnx names tensors 'input:0'. Before: any ':' was refused, so `calibrate` (which always writes a
    cache) failed such a model after all its statistics; a '\u2028' or '\r' in a name was written and the
    cache then could not be read back (its reader splits lines as str.splitlines does)."""
    p = tmp_path / "c.cache"
    p.write_text(format_cache({"input:0": 0.5, "dense/MatMul:0": 0.25}, "max"))
    assert read_calibration_cache(p)[1] == {"input:0": 0.5, "dense/MatMul:0": 0.25}
    for bad in ("a: b", "a\u2028b", "a\rb", "a\nb"):
        with pytest.raises(UserError, match="would not read back"):
            format_cache({bad: 0.5}, "max")


def test_malformed_cache_is_a_user_error(tmp_path):
    p = tmp_path / "bad.cache"
    p.write_text("TRT-1-EntropyCalibration2\nx: zz\n")
    with pytest.raises(UserError, match="line 2"):
        read_calibration_cache(p)


def test_smoothquant_keeps_the_float_function_and_flattens_the_outlier_channel():
    m = models.mlp()
    name_nodes(m)
    plan = plan_placement(m)
    data = _data(outlier_channel=3)["x"]
    amax = {"x": np.abs(data).reshape(-1, 32).max(0), "r": np.ones(64, np.float32)}
    smoothed, targets, summary = apply_smoothquant(m, plan.targets, amax, 0.5)
    x = data[:4]
    np.testing.assert_allclose(
        exact_session(smoothed).run(None, {"x": x})[0],
        exact_session(m).run(None, {"x": x})[0],
        rtol=1e-4,
        atol=1e-4,
    )
    assert summary["matmuls_smoothed"] == 2 and targets[0].activations == ["x_smoothed"]


def test_smoothquant_helps_an_activation_outlier():
    m = models.mlp()
    x = _data(8, seed=1, outlier_channel=3)["x"]
    ref = exact_session(m).run(None, {"x": x})[0]
    plain, _ = calibrate_model(m, _data(outlier_channel=3), method="max", progress=False)
    smooth, rec = calibrate_model(m, _data(outlier_channel=3), method="max", smoothquant=0.5, progress=False)
    c_plain = _cos(ref, exact_session(plain).run(None, {"x": x})[0])
    c_smooth = _cos(ref, exact_session(smooth).run(None, {"x": x})[0])
    assert c_smooth > c_plain and rec.smoothquant["alpha"] == 0.5


def test_accuracy_target_returns_the_most_sensitive_node_to_float():
    m = models.mlp()
    data = _data(80, outlier_channel=3)
    _q, rec = calibrate_model(m, data, method="max", accuracy_target=0.99999, progress=False)
    acc = rec.accuracy
    assert acc["all_quantized"]["mean"] < 0.99999 <= acc["final"]["mean"]
    assert rec.fallback and rec.fallback[0]["sensitivity"] >= rec.fallback[-1]["sensitivity"]
    assert rec.samples == 80 - acc["held_out_samples"]
    back = {f["node"] for f in rec.fallback}
    assert all(
        d["rule"] == "accuracy_fallback" for d in rec.to_dict()["fallback_decisions"] if d["node"] in back
    )


def test_bad_options_fail_before_any_statistics():
    m = models.mlp()
    with pytest.raises(UserError, match="unknown calibration method"):
        calibrate_model(m, _data(), method="kl", progress=False)
    with pytest.raises(UserError, match="attention_mask"):
        calibrate_model(m, _data(), only_real_tokens=True, progress=False)
    with pytest.raises(UserError, match="too few"):
        calibrate_model(m, _data(10), accuracy_target=0.99, progress=False)
    q, _ = calibrate_model(m, _data(), method="max", progress=False)
    with pytest.raises(UserError, match="already quantized"):
        calibrate_model(q, _data(), progress=False)
    with pytest.raises(UserError, match="nothing to quantize"):
        calibrate_model(models.small_gemm(), {"x": np.ones((4, 32), np.float32)}, progress=False)


def test_mask_constants_reaching_a_quantized_input_never_set_its_range():
    from onnx import TensorProto, helper, numpy_helper

    mask = np.zeros((6, 32), np.float32)
    mask[:, -4:] = np.finfo(np.float32).min  # a dynamo-style additive mask value
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "mask"], ["masked"], name="add_mask"),
            helper.make_node("MatMul", ["masked", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 6, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 6, 32])],
        [numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for method in ("max", "entropy", "mse", "percentile"):
        _, rec = calibrate_model(m, _data(16), method=method, progress=False)
        assert rec.dropped_values == 16 * 6 * 4
        assert 0 < rec.activation_scales["masked"] < 6.0 / 127, method
