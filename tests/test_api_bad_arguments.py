"""The public Python API given the wrong kind of argument: a UserError naming the argument, never a
TypeError/AttributeError from deep inside (os.fspath, Path, proto attribute access)."""

from __future__ import annotations

import pytest

from tests.models import tiny_onnx
from trtforge.errors import UserError


def _compile_output_int(d):
    import trtforge

    trtforge.compile(str(tiny_onnx(d / "m.onnx")), None, 5)


def _rt_load_none(d):
    from trtforge.runtime import load

    load(None)


def _llm_load_none(d):
    import trtforge.llm

    trtforge.llm.load(None)


def _report_out_dir_int(d):
    from trtforge.reports.api import build_report

    build_report(str(tiny_onnx(d / "m.onnx")), out_dir=5)


def _calibrate_model_list(d):
    from trtforge.calibration.api import calibrate_model

    calibrate_model([1, 2], None)


CASES = {
    "compile(output=5)": (_compile_output_int, r"output \(the engine path\) must be a path .*got int 5"),
    "runtime.load(None)": (_rt_load_none, r"the engine must be a path .*got NoneType"),
    "llm.load(None)": (_llm_load_none, r"the model to load must be a path .*got NoneType"),
    "build_report(out_dir=5)": (_report_out_dir_int, r"out_dir \(the report directory\) must be a path"),
    "calibrate_model([1, 2])": (_calibrate_model_list, r"model must be an onnx\.ModelProto or an ONNX file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_wrong_argument_kinds_are_user_errors(case, tmp_path) -> None:
    fn, message = CASES[case]
    with pytest.raises(UserError, match=message):
        fn(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["m.onnx"])


def test_calibrate_model_takes_an_onnx_path(tmp_path) -> None:
    """A path is read like the CLI reads it (was AttributeError: 'str' object has no attribute 'graph')."""
    from trtforge.calibration.api import calibrate_model

    with pytest.raises(UserError, match=r"'nope\.onnx' does not exist"):
        calibrate_model("nope.onnx", None)
