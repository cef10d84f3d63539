"""Kill real `trtforge compile` processes at random moments (SIGKILL and SIGTERM, into an empty directory
and with --force over an existing pair): the directory always holds a loadable old or new pair, or
nothing new. "Loadable" is checked with the manifest reader and sha256 check that rt.load and inspect use
(rt.load itself needs a GPU to deserialize). Also: Ctrl-C during the TensorRT build stops it promptly."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.models import tiny_onnx
from trtforge._fileio import DEAD_TEMP_AGE_S
from trtforge.core.manifest import manifest_path_for, read_manifest, resolve_pending, verify_engine_file

pytestmark = pytest.mark.trt_build

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261130
# 12 runs: each (signal, --force) pair is killed three times, in both halves (anywhere, and late: 0.8-1.2 of
# an uninterrupted compile of the same model, so some land before the publish and some after it)
RUNS = 12


def _env(tmp: Path) -> dict[str, str]:
    tmp.mkdir(exist_ok=True)
    path = os.environ.get("PYTHONPATH", "")
    return dict(
        os.environ,
        PYTHONPATH=f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        PYTHONUNBUFFERED="1",
        TMPDIR=str(tmp),
    )


def _compile(model: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "trtforge.cli.main", "compile", str(model), "-o", str(out), "--no-passes"]
    return subprocess.Popen(
        [*argv, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )


def _pair_sha(out: Path) -> str | None:
    """sha256 of the verified pair at `out` after settling leftovers, as a compile or reader does once they
    are older than the age guard; None when neither file exists."""
    aged = time.time() - 2 * DEAD_TEMP_AGE_S  # (the killed compile's: younger ones may be a live one's)
    for leftover in out.parent.glob(".trtforge-*"):
        os.utime(leftover, (aged, aged), follow_symlinks=False)
    resolve_pending(out)
    if not out.exists() and not manifest_path_for(out).exists():
        return None
    manifest = read_manifest(out)
    verify_engine_file(out, manifest)
    return manifest.engine_sha256


def test_kill_at_random_moments_leaves_a_complete_pair(tmp_path) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    old_model = tiny_onnx(tmp_path / "old.onnx", dynamic_batch=False)
    template = tmp_path / "template"
    template.mkdir()
    assert _compile(old_model, template / "m.engine", _env(tmp_path / "tmp"), "-q").wait() == 0
    old_sha = read_manifest(template / "m.engine").engine_sha256
    # one uninterrupted compile of the model the runs compile (not the old, static one): the span the kills
    # are spread over, as long as a killed run would take on this machine now
    (tmp_path / "ref").mkdir()
    t0 = time.monotonic()
    assert _compile(model, tmp_path / "ref" / "m.engine", _env(tmp_path / "tmp"), "-q").wait() == 0
    full = time.monotonic() - t0

    rng = random.Random(SEED)
    outcomes: dict[str, int] = {"nothing": 0, "old": 0, "new": 0}
    for i in range(RUNS):
        sig = (signal.SIGKILL, signal.SIGTERM)[i % 2]
        force = i % 4 >= 2
        # Half the kills anywhere in the run, half late, where the build ends and the pair is published.
        delay = rng.uniform(0.0, 1.1 * full) if i < RUNS // 2 else rng.uniform(0.8 * full, 1.2 * full)
        d = tmp_path / f"run{i}"
        if force:
            shutil.copytree(template, d)
        else:
            d.mkdir()
        out = d / "m.engine"
        env = _env(tmp_path / f"tmp{i}")
        proc = _compile(model, out, env, "-q", *(["--force"] if force else []))
        time.sleep(delay)
        proc.send_signal(sig)
        log = proc.communicate(timeout=60)[0]
        rc = proc.returncode
        allowed = (
            {0, -signal.SIGKILL} if sig == signal.SIGKILL else {0, 128 + signal.SIGTERM, -signal.SIGTERM}
        )
        assert rc in allowed, f"run {i}: {sig.name} after {delay:.2f}s gave rc {rc}:\n{log}"
        assert "Traceback" not in log, log
        if sig == signal.SIGTERM:  # SIGTERM cleans up itself: no staged file, no work directory
            assert not list(d.glob(".trtforge-*")), f"run {i}: {sorted(p.name for p in d.iterdir())}"
            assert not _ours(Path(env["TMPDIR"]))
        sha = _pair_sha(out)
        assert sorted(p.name for p in d.iterdir()) == ([] if sha is None else ["m.engine", "m.engine.json"])
        if force:
            assert sha is not None, f"run {i}: the old pair was lost"
        kind = "nothing" if sha is None else "old" if sha == old_sha else "new"
        assert not (kind == "old" and not force)
        outcomes[kind] += 1
        if rc == 0:
            assert kind == "new", f"run {i}: exit 0 without the new pair"
    assert outcomes["new"] > 0 and outcomes["nothing"] + outcomes["old"] > 0, outcomes


def _slow_onnx(path: Path, layers: int = 60, width: int = 256) -> Path:
    """A chain of MatMul+Tanh with dynamic batch and sequence: a few seconds of TensorRT-RTX build."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) * 0.05).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        nodes += [
            helper.make_node("MatMul", [prev, f"W{i}"], [f"h{i}"]),
            helper.make_node("Tanh", [f"h{i}"], [f"t{i}"]),
        ]
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", width]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "slow", io[:1], io[1:], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_build_stops_it_promptly(tmp_path, sig, code) -> None:
    model = _slow_onnx(tmp_path / "slow.onnx")
    env = _env(tmp_path / "tmp")
    out = tmp_path / "slow.engine"
    proc = _compile(model, out, env)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the profile is derived right after parsing: the build starts next
        lines.append(line)
        if "derived profile" in line:
            break
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(sig)
    log = "".join(lines) + proc.communicate(timeout=60)[0]
    waited = time.monotonic() - sent
    assert proc.returncode == code, log
    assert waited < 6.0, f"exit took {waited:.1f}s after {sig.name}"
    assert "Traceback" not in log and ("interrupted" in log or "terminated" in log), log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow.onnx", "tmp"]
    assert not _ours(tmp_path / "tmp")


def _ours(tmpdir: Path) -> list[str]:
    """What is left in TMPDIR besides ONNX Runtime's own session-id file (`.ses`, written by every
    InferenceSession since 1.32): trtforge's work directories and staged files must all be gone."""
    return sorted(p.name for p in tmpdir.iterdir() if p.name != ".ses")
