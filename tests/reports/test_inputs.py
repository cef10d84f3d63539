"""Generated inputs follow the I/O specs: ids within the vocabulary, 0/1 masks, static and profile dims."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.reports._tiny import classifier_onnx, classifier_weights, token_model_onnx
from trtforge.core.tensor_spec import TensorSpec
from trtforge.errors import UserError
from trtforge.reports.inputs import ReportInput, generate_feed, load_feeds, resolve_shape, specs_from_onnx
from trtforge.reports.latency import sweep_points


def test_token_ids_within_vocab_and_masks_are_binary(tmp_path):
    specs = specs_from_onnx(onnx.load(str(token_model_onnx(tmp_path / "t.onnx", vocab=37))))
    assert {s.name: s.vocab for s in specs} == {"input_ids": 37, "attention_mask": None}
    for seed in range(5):
        feed = generate_feed(specs, 4, 32, seed=seed)
        ids, mask = feed["input_ids"], feed["attention_mask"]
        assert ids.shape == mask.shape == (4, 32) and ids.dtype == mask.dtype == np.int64
        assert ids.min() >= 0 and ids.max() < 37
        assert set(np.unique(mask)) <= {0, 1} and (mask[:, 0] == 1).all()
        # padding is a tail: once 0, stays 0
        assert (np.diff(mask, axis=1) <= 0).all()


def test_generated_feeds_are_deterministic(tmp_path):
    specs = specs_from_onnx(onnx.load(str(token_model_onnx(tmp_path / "t.onnx"))))
    a, b = generate_feed(specs, 2, 8, seed=3), generate_feed(specs, 2, 8, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_static_dims_and_profile_limits():
    static = ReportInput(TensorSpec("x", "float32", (2, 16)))
    assert resolve_shape(static, 2, None) == (2, 16)
    with pytest.raises(UserError, match="static batch of 2"):
        resolve_shape(static, 8, None)
    assert sweep_points([static], (1, 8), (128,)) == [(2, None)]
    limited = ReportInput(TensorSpec("ids", "int64", (-1, -1)), limits=((1, 8), (1, 64)))
    assert resolve_shape(limited, 8, 64) == (8, 64)
    with pytest.raises(UserError, match=r"outside the engine profile \[1, 64\]"):
        resolve_shape(limited, 8, 128)


def test_npz_is_split_into_batches_and_dicts_pass_through(tmp_path):
    w, b = classifier_weights(0)
    specs = specs_from_onnx(onnx.load(str(classifier_onnx(tmp_path / "a.onnx", w, b))))
    np.savez(tmp_path / "x.npz", x=np.ones((20, 16), np.float32))
    feeds, label = load_feeds(tmp_path / "x.npz", specs)
    assert [f["x"].shape[0] for f in feeds] == [8, 8, 4] and ".npz" in label
    feeds, _ = load_feeds({"x": np.zeros((3, 16), np.float32)}, specs)
    assert feeds[0]["x"].shape == (3, 16)
    with pytest.raises(UserError, match="empty iterable"):
        load_feeds([], specs)


def test_calibration_dataset_formats_are_accepted(tmp_path):
    """A directory of .npz files goes through trtforge.calibration.data.load_dataset."""
    pytest.importorskip("trtforge.calibration.data", reason="calibration data loader not present")
    w, b = classifier_weights(0)
    specs = specs_from_onnx(onnx.load(str(classifier_onnx(tmp_path / "a.onnx", w, b))))
    d = tmp_path / "data"
    d.mkdir()
    for i in range(2):
        np.savez(d / f"part{i}.npz", x=np.full((5, 16), i, np.float32))
    feeds, label = load_feeds(d, specs, batch_size=4)
    assert sum(f["x"].shape[0] for f in feeds) == 10 and "calibration dataset" in label
    with pytest.raises(UserError):
        load_feeds(tmp_path / "missing_dir", specs)


def test_model_limits_bound_generated_sizes(tmp_path):
    """Known limits ride on the specs; accuracy sizes fit them and the sweep keeps a length that runs."""
    from trtforge.core.shapes import AxisLimit
    from trtforge.reports.inputs import fit_sizes

    model = onnx.load(str(token_model_onnx(tmp_path / "t.onnx")))
    lim = AxisLimit(1, 64, "config.max_position_embeddings = 64 of BertModel")
    specs = specs_from_onnx(model, {"input_ids": {1: lim}, "attention_mask": {1: lim}})
    assert specs[0].limits[1] == (1, 64) and specs[0].limit_source == lim.source
    with pytest.raises(
        UserError, match=r"outside the range the model takes \(config.max_position_embeddings"
    ):
        resolve_shape(specs[0], 2, 128)
    batch, seq, sweep, notes = fit_sizes(specs, (1, 8), (128,))
    assert (batch, seq, sweep) == (8, 64, [128, 64]) and "at most 64" in notes[0]
    assert fit_sizes(specs, (1, 8), (16, 32)) == (8, 16, [16, 32], [])
    engine = [ReportInput(TensorSpec("ids", "int64", (-1, -1)), limits=((1, 4), (8, 64)))]
    assert fit_sizes(engine, (1, 16), (4,))[:3] == (4, 8, [4, 8])


def test_a_static_empty_axis_is_kept(tmp_path):
    """Before: a static 0 dim (an empty axis, as trtforge's TensorSpec reads it) was taken for a dynamic
    one: the feeds got the sequence length there, and every target, the reference too, rejected them
    (the report failed, exit 3)."""
    from onnx import TensorProto, helper

    from trtforge.reports.api import build_report
    from trtforge.reports.inputs import has_seq_axis

    spec = ReportInput(TensorSpec("x", "float32", (-1, 0, 3)))
    assert resolve_shape(spec, 4, 128) == (4, 0, 3) and not has_seq_axis([spec])
    assert generate_feed([spec], 2, 16)["x"].shape == (2, 0, 3)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "empty_axis",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 0])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 0])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = build_report(
        tmp_path / "m.onnx", targets=["ort", "ort-fused"], out_dir=tmp_path / "o", batch_sizes=(2,),
        warmup=0, runs=1, progress=False,
    )  # fmt: skip
    assert [t.status for t in r.report.targets] == ["ok", "ok"], [t.reason for t in r.report.targets]
    assert [(p.batch, p.seq, p.status) for p in r.report.latency] == [(2, None, "ok")] * 2


def test_a_feed_too_large_to_generate_names_the_report_options():
    """Before: the message told a report user to give smaller --shape ranges or pass --no-verify, options
    `trtforge report` does not have, and called the chosen batch the model's declared dims."""
    spec = ReportInput(TensorSpec("ids", "int64", (-1, -1)))
    with pytest.raises(UserError) as e:
        generate_feed([spec], 1 << 16, 1 << 14)
    msg = str(e.value)
    assert "input 'ids' at batch 65536, sequence 16384 is [65536, 16384] (int64), 8 GiB" in msg, msg
    assert "--batch / --seq" in msg and "--no-verify" not in msg and "--shape" not in msg
