"""`trtforge report MODEL --generate` on the trained model: what it prints while it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtforge.cli.main import main

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "models"
MODEL = SHARED / "code-llama-21m"
pytestmark = pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model is absent: {MODEL}")
SMALL = ["--windows", "1", "--window-len", "16", "--batch", "1", "--prompt-len", "4", "--new-tokens", "2"]


@pytest.mark.parametrize("progress", [True, False], ids=["progress", "no-progress"])
def test_the_weights_are_read_once_for_every_variant(capfd, tmp_path, progress) -> None:
    """Before: transformers' "Loading weights" bar once per serving variant (each read the model again);
    now the model is read once and each variant copies it, and --no-progress shows no bar at all."""
    argv = ["report", str(MODEL), "--generate", "-o", str(tmp_path / "rep"), "--text"]
    argv += [str(SHARED / "eval_stdlib.txt"), "--variants", "fp32,int4-rtn,kv-fp8", *SMALL]
    assert main(argv + ([] if progress else ["--no-progress"])) == 0
    out, err = capfd.readouterr()
    assert "3 variant(s) ran, 0 failed" in out, out + err
    assert err.count("Loading weights: 100%") == (1 if progress else 0), err
    assert ("variants ━" in err and "3/3" in err) == progress, err  # (rich: the final state off a tty)
