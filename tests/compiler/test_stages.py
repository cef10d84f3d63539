"""The graph stages between export and build (trtforge.compiler.stages)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.reports._tiny import token_model_onnx
from trtforge.compiler.stages import _int8_stage
from trtforge.core.manifest import ShapeRange
from trtforge.core.policy import PrecisionOptions
from trtforge.errors import UserError


def test_int8_stage_fits_calibration_data_to_the_shape_profile(tmp_path, monkeypatch):
    """With --shape input_ids:1x1:2x8:4x16 the engine never runs more than 16 tokens. Before: text was
    tokenized to 128 and arrays of any length calibrated as they were (exit 0)."""
    import trtforge.calibration.api as api

    model = onnx.load(str(token_model_onnx(tmp_path / "m.onnx", vocab=30522, width=32, matmul=True)))
    seen: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        api,
        "calibrate_model",
        lambda m, data, **_: (m, seen.extend(b["input_ids"].shape for b in data) or _Rec()),
    )
    profile = {n: ShapeRange([1, 1], [2, 8], [4, 16]) for n in ("input_ids", "attention_mask")}
    (tmp_path / "s.txt").write_text(" ".join(["word"] * 100) + "\nshort one\n")
    opts = PrecisionOptions(mode="int8", calib_data=str(tmp_path / "s.txt"), tokenizer="demo")
    _int8_stage(opts).fn(model, None, profile=profile)
    assert seen and max(shape[1] for shape in seen) == 16
    np.savez(
        tmp_path / "c.npz", input_ids=np.ones((4, 32), np.int64), attention_mask=np.ones((4, 32), np.int64)
    )
    opts = PrecisionOptions(mode="int8", calib_data=str(tmp_path / "c.npz"))
    with pytest.raises(
        UserError, match=r"'input_ids' has size 32 on axis 1, outside the engine's profile 1\.\.16"
    ):
        _int8_stage(opts).fn(model, None, profile=profile)


class _Rec:
    def to_dict(self) -> dict:
        return {}
