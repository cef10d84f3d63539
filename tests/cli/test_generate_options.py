"""The --generate option group of `trtforge compile`: its options are refused without --generate."""

from __future__ import annotations

import pytest

from tests.models import tiny_onnx
from trtforge.cli.main import main


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-seq", "64"], "--max-seq"),
        (["--max-batch", "2"], "--max-batch"),
        (["--max-prefill", "8"], "--max-prefill"),
        (["--all-logits"], "--all-logits"),
    ],
)
def test_step_engine_options_need_generate(tmp_path, capsys, argv, flag) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    rc = main(["compile", str(model), "-o", str(tmp_path / "m.engine"), *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert flag in err and "--generate" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_api_refuses_example_inputs_with_generate(tmp_path) -> None:
    import trtforge

    with pytest.raises(trtforge.UserError, match="pass no example_inputs"):
        trtforge.compile("unused:factory", {"input_ids": [[1]]}, tmp_path / "m.engine", generate=True)
    assert list(tmp_path.iterdir()) == []
