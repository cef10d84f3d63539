"""`trtforge calibrate`: end to end on a tiny model; bad data -> exit 2 before calibration, no output."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.calibration import models
from trtforge.cli.main import main


@pytest.fixture
def model_path(tmp_path):
    p = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), p)
    return p


def test_calibrate_writes_model_cache_and_report(tmp_path, model_path, capsys):
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).standard_normal((20, 4, 32)).astype(np.float32))
    out = tmp_path / "mlp.int8.onnx"
    rc = main(
        [
            "calibrate",
            str(model_path),
            "--data",
            str(tmp_path / "d.npz"),
            "-o",
            str(out),
            "--method",
            "percentile",
            "--samples",
            "16",
            "--report",
            str(tmp_path / "r.json"),
        ]
    )
    assert rc == 0
    q = onnx.load(out)
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) == 2
    cache = out.with_suffix(".calib.cache")
    assert (
        cache.read_text().startswith("TRT-") and "PercentileCalibration" in cache.read_text().splitlines()[0]
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["samples"] == 16 and report["matmuls_quantized"] == 2
    assert "MatMuls in INT8" in capsys.readouterr().err
    # existing outputs are not clobbered without --force
    rc = main(["calibrate", str(model_path), "--data", str(tmp_path / "d.npz"), "-o", str(out)])
    assert rc == 2


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"input": np.zeros((4, 4, 32), np.float32)}, "input names do not match"),
        ({"x": np.zeros((4, 4, 32), np.int32)}, "dtype int32"),
        ({"x": np.zeros((4, 32), np.float32)}, "rank 2"),
        ({"x": np.zeros((0, 4, 32), np.float32)}, "empty"),
        ({"x": np.full((4, 4, 32), np.nan, np.float32)}, "NaN"),
    ],
    ids=["names", "dtype", "rank", "empty", "nan"],
)
def test_bad_data_exits_2_with_a_clear_message_and_no_output(tmp_path, model_path, capsys, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    out = tmp_path / "out.onnx"
    rc = main(["calibrate", str(model_path), "--data", str(tmp_path / "bad.npz"), "-o", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "bad.npz" in err
    assert not out.exists() and not out.with_suffix(".calib.cache").exists()
    assert "calibrating" not in err  # rejected before statistics started


def test_an_interrupted_write_leaves_no_calib_cache_without_its_model(tmp_path, model_path, monkeypatch):
    """--calib-cache PATH (not there yet) is written with the model, in one set of renames. Before:
    calibrate_model renamed it into place first, so a Ctrl-C (or a failure) while the model was written
    left a new cache beside no model, and the next run read it and skipped statistics."""
    import trtforge.core.onnx_io

    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).standard_normal((8, 4, 32)).astype(np.float32))
    out, cache = tmp_path / "q.onnx", tmp_path / "my.cache"
    argv = ["calibrate", str(model_path), "--data", str(tmp_path / "d.npz"), "-o", str(out), "-q"]

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trtforge.core.onnx_io, "save_onnx", interrupted)  # (the model's write)
    assert main([*argv, "--calib-cache", str(cache)]) == 130
    assert not out.exists() and not cache.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "mlp.onnx"]  # no staged files left
    monkeypatch.undo()
    assert main([*argv, "--calib-cache", str(cache)]) == 0
    assert out.exists() and cache.read_text().startswith("TRT-")


def test_a_calib_cache_of_the_model_before_retraining_exits_2_naming_it(tmp_path, model_path, capsys):
    """The default cache (-o's name, .calib.cache) given back as --calib-cache after the model was
    retrained (same graph and tensor names, other weights): its stale scales went into the new model's
    Q/DQ, exit 0. Now exit 2 naming the cache and --calib-cache, and no output is written."""
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).standard_normal((20, 4, 32)).astype(np.float32))
    argv = ["calibrate", str(model_path), "--data", str(tmp_path / "d.npz"), "--no-smoothquant", "--quiet"]
    assert main([*argv, "-o", str(tmp_path / "v1.onnx"), "--method", "max"]) == 0
    cache = tmp_path / "v1.calib.cache"
    onnx.save(models.mlp(seed=1), model_path)  # retrained
    out = tmp_path / "v2.onnx"
    rc = main([*argv, "-o", str(out), "--method", "max", "--calib-cache", str(cache)])
    err = capsys.readouterr().err
    assert rc == 2 and f"calibration cache '{cache}' was computed for another model" in " ".join(err.split())
    assert "--calib-cache path that does not exist yet" in " ".join(err.split())
    assert not out.exists()
