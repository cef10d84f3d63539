"""A step graph that `trtforge compile --generate --save-onnx` (or any trtforge writer) was killed (SIGKILL)
while committing: the step-graph readers (`trtforge generate` / `serve STEP.onnx`, `trtforge.llm.load`)
settle it first, as every other reader of a trtforge output does, and so read the old step graph or the
new one, never the old graph over the new weights of its external data file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.compiler.test_kill import _env
from trtforge._fileio import temp_name

# Saves the step graph ARGV[1] to ARGV[2] as trtforge writes every ONNX file (save_onnx_atomic), its weights
# in ARGV[2].data as a model past 2 GB has them, and is killed (SIGKILL) right after its os.replace onto
# ARGV[3]: the rename of the data file onto its place, or of the commit point's record.
_WRITER = """
import os, signal, sys
from pathlib import Path
import onnx
import trtforge.core.onnx_io as onnx_io
onnx_io._has_external = lambda model: True
real = os.replace
def replace(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if Path(dst) == Path(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
onnx_io.save_onnx_atomic(onnx.load(sys.argv[1]), sys.argv[2])
"""
PROMPT = ["--prompt-ids", "3 4 5", "--max-tokens", "8", "--ignore-eos"]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> tuple[Path, Path]:
    """(the old step graph, the new one): the same tiny Llama's, the new one's every weight perturbed, its
    small ones too (the norms, which stay inside the model file beside the external data)."""
    import onnx
    from onnx import numpy_helper

    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.compile.export import export_step

    root = tmp_path_factory.mktemp("steps")
    exp = export_step(tiny_model("llama"), max_seq=16, max_batch=2, exporter="legacy", workdir=root / "x")
    onnx.save(exp.model, str(root / "old.onnx"))
    rng = np.random.default_rng(0)
    for init in exp.model.graph.initializer:
        w = numpy_helper.to_array(init)
        if w.dtype == np.float32 and w.size > 1:
            noise = rng.standard_normal(w.shape).astype(w.dtype)
            init.CopyFrom(numpy_helper.from_array(w + noise, init.name))
    onnx.save(exp.model, str(root / "new.onnx"))
    return root / "old.onnx", root / "new.onnx"


def _generate(path: Path, capsys) -> str:
    from trtforge.cli.main import main

    capsys.readouterr()
    rc = main(["generate", str(path), *PROMPT])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.mark.parametrize(
    ("old", "stop"),
    [
        (True, "step.onnx.data"),  # the data file renamed, the model not yet: the old model's offsets
        (False, "commit of step.onnx.data"),  # the commit point, nothing renamed: "does not exist"
    ],
)
def test_a_step_graph_reader_settles_a_killed_commit(
    graphs, tmp_path, capsys, monkeypatch, old, stop
) -> None:
    """Before: read_generation read the step graph by onnx.load and ONNX Runtime by its path, never
    settling the commit a killed writer left: after a kill between the renames of the data file and the
    model, `trtforge generate` ran the old model over the new weights (tokens of neither graph); after a
    kill at the commit point of a first write, it said the step graph did not exist."""
    import onnx

    import trtforge.core.onnx_io as onnx_io

    old_graph, new_graph = graphs
    expected = _generate(new_graph, capsys)
    assert expected != _generate(old_graph, capsys)
    d = tmp_path / "d"
    d.mkdir()
    if old:
        monkeypatch.setattr(onnx_io, "_has_external", lambda model: True)
        onnx_io.save_onnx_atomic(onnx.load(str(old_graph)), d / "step.onnx")
        monkeypatch.undo()
    name = stop.removeprefix("commit of ")
    stop_at = temp_name(d / name, "commit") if stop.startswith("commit of ") else d / name
    writer = subprocess.run(
        [sys.executable, "-c", _WRITER, str(new_graph), str(d / "step.onnx"), str(stop_at)],
        env=_env(tmp_path / "tmp"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert writer.returncode == -9, writer.stderr
    assert os.path.lexists(temp_name(d / "step.onnx.data", "commit")), sorted(os.listdir(d))
    assert _generate(d / "step.onnx", capsys) == expected
    assert sorted(os.listdir(d)) == ["step.onnx", "step.onnx.data"], "the commit was not settled"
