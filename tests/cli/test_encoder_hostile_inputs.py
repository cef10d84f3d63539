"""Hostile inputs to the encoder commands (compile, optimize, calibrate, inspect, report, export-triton):
each exits 2 with one clear message naming what is wrong, no traceback, and nothing left behind. Same
harness as test_bad_inputs (its `workdir` fixture and snapshot rule)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_bad_inputs import Setup, _tiny, assert_exits_2_cleanly, workdir  # noqa: F401 - a fixture
from tests.models import tiny_onnx


def _report_npz(content: bytes) -> Setup:
    """report on the tiny model with --data c.npz holding `content` (not a readable .npz)."""

    def setup(d: Path) -> list[str]:
        tiny_onnx(d / "m.onnx")
        (d / "c.npz").write_bytes(content)
        return ["report", "m.onnx", "-o", "rep", "--targets", "ort", "--data", "c.npz", "--no-progress"]

    return setup


CASES: dict[str, tuple[Setup, str]] = {
    "report: --data .npz that is not a zip": (
        _report_npz(b"PK\x03\x04 not a zip archive"),
        r"--data 'c\.npz' is not a readable \.npz file \(BadZipFile",
    ),
    "report: empty --data .npz": (
        _report_npz(b""),
        r"--data 'c\.npz' is not a readable \.npz file \(EOFError",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_encoder_hostile_input_exits_2_cleanly(
    case: str,
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert_exits_2_cleanly(*CASES[case], workdir, capfd)
