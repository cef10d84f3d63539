"""The ONNX Runtime check of a profile's MIN and MAX shapes before the build."""

from __future__ import annotations

import pytest

from tests.compiler._shape_models import broadcast_model, counted_positions_model, position_table_model
from trtforge.compiler import shape_check
from trtforge.compiler.shape_check import check_profile
from trtforge.core.manifest import ShapeRange
from trtforge.errors import UserError


def test_runs_min_and_max_when_the_model_takes_them(tmp_path) -> None:
    path = tmp_path / "b.onnx"
    broadcast_model(path, width=64)
    record = check_profile(path, {"x": ShapeRange([1, 1], [4, 64], [8, 64])})
    assert record["ran"] == ["MIN", "MAX"] and record["skipped"] is None


def test_max_the_model_cannot_run_names_input_shape_and_fix(tmp_path) -> None:
    path = tmp_path / "b.onnx"
    broadcast_model(path, width=64)
    with pytest.raises(UserError) as e:
        check_profile(path, {"x": ShapeRange([1, 1], [2, 64], [2, 128])})
    text = str(e.value)
    assert "cannot run at the profile's MAX shapes (x 2x128)" in text
    assert "--shape x:1x1:2x64:2x64" in text


def test_min_failure_suggests_opt_as_min(tmp_path) -> None:
    path = tmp_path / "b.onnx"
    broadcast_model(path, width=64)
    with pytest.raises(UserError, match=r"MIN shapes \(x 1x2\).*--shape x:1x64:2x64:2x64 "):
        check_profile(path, {"x": ShapeRange([1, 2], [2, 64], [2, 64])})


def test_position_table_overrun_is_caught(tmp_path) -> None:
    """Token ids index a table of 8 positions; MAX 16 reads past it."""
    path = tmp_path / "p.onnx"
    position_table_model(path, rows=8)
    with pytest.raises(UserError, match=r"input_ids 4x16.*--shape input_ids:1x1:2x8:4x8 "):
        check_profile(path, {"input_ids": ShapeRange([1, 1], [2, 8], [4, 16])})


def test_skips_are_recorded_with_the_reason(tmp_path, monkeypatch) -> None:
    path = tmp_path / "b.onnx"
    broadcast_model(path, width=64)
    static = check_profile(path, {"x": ShapeRange([2, 64], [2, 64], [2, 64])})
    assert static["ran"] == [] and "static profile" in static["skipped"]
    monkeypatch.setattr(shape_check, "MAX_WEIGHT_BYTES", 16)
    big = check_profile(path, {"x": ShapeRange([1, 1], [2, 64], [2, 128])})
    assert big["ran"] == [] and "weights are 256 bytes, above the 16 bytes threshold" in big["skipped"]


def test_failure_at_opt_too_is_not_blamed_on_the_range(tmp_path) -> None:
    """A graph that fails everywhere (here: OPT is also a bad width) is left to the build, with a note."""
    path = tmp_path / "b.onnx"
    broadcast_model(path, width=64)
    record = check_profile(path, {"x": ShapeRange([1, 2], [1, 3], [1, 4])})
    assert record["ran"] == ["MIN", "MAX"] and "fails in ONNX Runtime at OPT too" in record["skipped"]


def test_suggested_max_is_the_largest_that_runs(tmp_path) -> None:
    """A position table of 40 rows behind a profile up to 128: the fix found by bisection ends at 40."""
    path = tmp_path / "p.onnx"
    position_table_model(path, rows=40)
    with pytest.raises(UserError, match=r"--shape input_ids:1x1:1x8:1x40 "):
        check_profile(path, {"input_ids": ShapeRange([1, 1], [1, 8], [1, 128])})


def test_bfloat16_inputs_run_min_and_max(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
            helper.make_node("Relu", ["x32"], ["r"]),
            helper.make_node("Cast", ["r"], ["y"], to=TensorProto.BFLOAT16),
        ],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["b", 4])],
    )
    path = tmp_path / "bf16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    record = check_profile(path, {"x": ShapeRange([1, 4], [2, 4], [8, 4])})
    assert record["ran"] == ["MIN", "MAX"] and record["skipped"] is None


def test_counted_positions_are_checked_with_real_token_ids_and_full_masks(tmp_path) -> None:
    """Before: ids of 0/1 and padded masks left few positions counted, so a RoBERTa-style model with 10
    positions "ran" at 16 tokens and the range was built into the engine."""
    path = tmp_path / "counted.onnx"
    counted_positions_model(path)
    ok = ShapeRange([1, 1], [2, 8], [4, 10])
    assert check_profile(path, {"input_ids": ok, "attention_mask": ok})["ran"] == ["MIN", "MAX"]
    long = ShapeRange([1, 1], [2, 8], [4, 16])
    with pytest.raises(
        UserError, match=r"cannot run at the profile's MAX shapes .* e\.g\. --shape input_ids:1x1:2x8:4x10"
    ):
        check_profile(path, {"input_ids": long, "attention_mask": long})
