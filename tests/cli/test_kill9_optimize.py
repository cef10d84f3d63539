"""SIGKILL sent to a real `trtforge optimize` that writes OUT.onnx with its weights in OUT.onnx.data, over
an earlier run's pair: at the moments of its commit (right after its first rename, after its commit
record, before its commit point) and at random moments of the run. Afterwards the pair, as trtforge's
reader (load_onnx) finds it, is the old run's or the new run's, both files, checked by content.

Before the group commit the two files were renamed one after the other: a kill between the renames left
the new data file beside the old model, which loaded without an error (the same tensor shapes and
offsets) with the other run's weights."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.compiler.test_kill import _env
from trtforge._fileio import sha256_file, temp_name

# `trtforge ARGV...` with the weights of any model written to OUT.data, as for a model over 1.8 GB. With
# TRTFORGE_TEST_STOP set, os.replace stops after its rename onto that path (touching CTL/reached) and
# waits there to be killed.
_OPTIMIZE = """
import os, runpy, sys, time
from pathlib import Path
import trtforge.core.onnx_io as onnx_io
onnx_io._has_external = lambda model: True
stop, real = os.environ.get("TRTFORGE_TEST_STOP"), os.replace
def replace(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if stop and Path(dst) == Path(stop):
        (Path(os.environ["TRTFORGE_TEST_CTL"]) / "reached").touch()
        time.sleep(600)
os.replace = replace
sys.argv = ["trtforge", *sys.argv[1:]]
runpy.run_module("trtforge.cli.main", run_name="__main__")
"""


def _model(path: Path, seed: int) -> Path:
    """x[B,64] -> Relu(x @ W + b): 16 KiB of weights, which go to the data file; the same shapes for
    every seed, so one seed's model reads another's data file without an error."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
            helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
            helper.make_node("Relu", ["hb"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [w, b],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _optimize(model: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    argv = ["optimize", str(model), "-o", str(out), "--force", "--no-verify"]
    return subprocess.Popen(
        [sys.executable, "-c", _OPTIMIZE, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )


def _pair(d: Path) -> tuple[str, str]:
    """The sha256 of OUT.onnx and OUT.onnx.data in `d`, after trtforge's model reader has loaded them."""
    from trtforge.core.onnx_io import load_onnx

    load_onnx(d / "out.onnx")
    return sha256_file(d / "out.onnx"), sha256_file(d / "out.onnx.data")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path, tuple[str, str], tuple[str, str], float]:
    """(the new model, a directory holding the old run's pair, the old pair, the new pair, the seconds of
    an uninterrupted run)."""
    root = tmp_path_factory.mktemp("kill9")
    old_model, new_model = _model(root / "old.onnx", 1), _model(root / "new.onnx", 2)
    (root / "old").mkdir()
    (root / "new").mkdir()
    assert _optimize(old_model, root / "old" / "out.onnx", _env(root / "tmp")).wait(120) == 0
    t0 = time.monotonic()
    assert _optimize(new_model, root / "new" / "out.onnx", _env(root / "tmp")).wait(120) == 0
    full = time.monotonic() - t0
    old, new = _pair(root / "old"), _pair(root / "new")
    assert (
        old[1] != new[1]
        and (root / "old" / "out.onnx.data").stat().st_size == (root / "new" / "out.onnx.data").stat().st_size
    )
    return new_model, root / "old", old, new, full


@pytest.mark.parametrize(
    ("stop", "expect"),
    [
        ("out.onnx.data", "new"),  # its first rename onto an output: a mix, before
        ("commit of out.onnx.data", "new"),  # the primary record: the commit point
        ("commit of out.onnx", "old"),  # the secondary record: before the commit point
    ],
)
def test_kill9_during_the_commit_leaves_the_old_or_the_new_pair(runs, tmp_path, stop, expect) -> None:
    new_model, old_dir, old, new, _ = runs
    d = tmp_path / "d"
    shutil.copytree(old_dir, d)
    name = stop.removeprefix("commit of ")
    stop_at = temp_name(d / name, "commit") if stop.startswith("commit of ") else d / name
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    env = dict(_env(tmp_path / "tmp"), TRTFORGE_TEST_STOP=str(stop_at), TRTFORGE_TEST_CTL=str(ctl))
    proc = _optimize(new_model, d / "out.onnx", env)
    deadline = time.monotonic() + 120
    while not (ctl / "reached").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()
    log = proc.communicate(timeout=60)[0].decode(errors="replace")
    assert (ctl / "reached").exists(), f"the run never renamed onto {stop_at.name}:\n{log}"
    assert _pair(d) == {"old": old, "new": new}[expect]
    assert sorted(os.listdir(d)) == ["out.onnx", "out.onnx.data"], "staged files or records were left"


def test_kill9_at_random_moments_leaves_the_old_or_the_new_pair(runs, tmp_path) -> None:
    new_model, old_dir, old, new, full = runs
    rng = random.Random(20261207)
    seen = set()
    for i in range(4):  # half anywhere in the run, half where it ends and the pair is committed
        d = tmp_path / f"run{i}"
        shutil.copytree(old_dir, d)
        proc = _optimize(new_model, d / "out.onnx", _env(tmp_path / f"tmp{i}"))
        time.sleep(rng.uniform(0.0, 1.1 * full) if i < 2 else rng.uniform(0.85 * full, 1.15 * full))
        proc.kill()
        proc.communicate(timeout=60)
        pair = _pair(d)
        assert pair in (old, new), f"run {i}: a mix of the old and the new pair (rc {proc.returncode})"
        seen.add("new" if pair == new else "old")
        if proc.returncode == 0:
            assert pair == new, f"run {i}: exit 0 without the new pair"
        assert not [p for p in d.iterdir() if p.name.endswith(".commit")], os.listdir(d)
    assert seen, seen
    # what the kills before the commit point left (staging directories) the next run's commit sweeps
    runs_left = [tmp_path / f"run{i}" for i in range(4) if len(os.listdir(tmp_path / f"run{i}")) > 2]
    d = runs_left[0] if runs_left else tmp_path / "run0"
    assert _optimize(new_model, d / "out.onnx", _env(tmp_path / "tmp0")).wait(120) == 0
    assert sorted(os.listdir(d)) == ["out.onnx", "out.onnx.data"]
