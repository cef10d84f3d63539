"""More hostile inputs to the CLI: each exits 2 with one clear message naming what is wrong, no traceback,
and nothing left behind. Same harness as test_bad_inputs (its `workdir` fixture and snapshot rule)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.cli.test_bad_inputs import (
    Setup,
    _factory,
    _graph_onnx,
    _tiny,
    _vi,
    assert_exits_2_cleanly,
    workdir,  # noqa: F401 - a fixture
)
from tests.models import tiny_onnx


def _custom_op(command: str, *extra: str) -> Setup:
    def setup(d: Path) -> list[str]:
        import onnx
        from onnx import TensorProto, helper

        vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 4])  # noqa: E731
        nodes = [
            helper.make_node("Relu", ["x"], ["h"], name="r"),
            helper.make_node("FancyOp", ["h"], ["y"], name="fancy_1", domain="com.acme"),
        ]
        graph = helper.make_graph(nodes, "g", [vi("x")], [vi("y")])
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)]
        onnx.save(helper.make_model(graph, opset_imports=opsets), str(d / "custom.onnx"))
        if command == "calibrate":
            import numpy as np

            np.savez(d / "x.npz", x=np.ones((4, 4), np.float32))
            return ["calibrate", "custom.onnx", "--data", "x.npz", "-o", "q.onnx", *extra]
        return [command, "custom.onnx", "-o", "out.onnx" if command == "optimize" else "out.engine", *extra]

    return setup


GENERATE = ["compile", "tests.llm.tiny_models:llama_factory", "--generate", "--max-seq", "64", "-q"]


def _hf_dir(d: Path) -> str:
    from tests.llm.tiny_models import tiny_model

    tiny_model("llama").save_pretrained(d / "hf")
    return "hf"


def _py(d: Path) -> str:
    """The one factory module _factory wrote into `d`."""
    return next(p.name for p in d.glob("um_*.py"))


BAD_NAME = os.fsdecode(b"\xff\xfe.onnx")  # what Python makes of the shell's $'\xff\xfe.onnx'
NOT_UTF8 = r"'\\xff\\xfe\.onnx(\.npz)?' holds bytes that are not valid UTF-8.*rename the file"


def _bad_name(*argv: str) -> Setup:
    """An existing model (and calibration data) under a name that is not UTF-8; BAD in argv names it."""

    def setup(d: Path) -> list[str]:
        import numpy as np

        tiny_onnx(d / "m.onnx")
        shutil.copy(d / "m.onnx", d / BAD_NAME)
        np.savez(d / "x.npz", x=np.ones((4, 4), np.float32))
        shutil.copy(d / "x.npz", d / (BAD_NAME + ".npz"))
        return [a.replace("BAD", BAD_NAME) for a in argv]

    return setup


def _nan_data(command: str, value: float) -> Setup:
    """calibrate/report on the tiny model with data holding one NaN or inf."""

    def setup(d: Path) -> list[str]:
        import numpy as np

        tiny_onnx(d / "m.onnx")
        x = np.ones((4, 4), np.float32)
        x[1, 2] = value
        np.savez(d / "x.npz", x=x)
        if command == "calibrate":
            return ["calibrate", "m.onnx", "--data", "x.npz", "-o", "q.onnx"]
        return ["report", "m.onnx", "-o", "rep", "--targets", "ort", "--data", "x.npz", "--no-progress"]

    return setup


# issue #27.4: an undecodable path in every command that takes one; NaN/inf in user data.
PATH_CASES: dict[str, tuple[Setup, str]] = {
    "compile: model name not UTF-8": (_bad_name("compile", "BAD", "-o", "o.engine"), NOT_UTF8),
    "optimize: model name not UTF-8": (_bad_name("optimize", "BAD", "-o", "o.onnx"), NOT_UTF8),
    "calibrate: model name not UTF-8": (
        _bad_name("calibrate", "BAD", "--data", "x.npz", "-o", "q.onnx"),
        NOT_UTF8,
    ),
    "calibrate: data name not UTF-8": (
        _bad_name("calibrate", "m.onnx", "--data", "BAD.npz", "-o", "q.onnx"),
        NOT_UTF8,
    ),
    "report: model name not UTF-8": (_bad_name("report", "BAD", "-o", "rep", "--targets", "ort"), NOT_UTF8),
    "report: data name not UTF-8": (
        _bad_name("report", "m.onnx", "-o", "rep", "--targets", "ort", "--data", "BAD.npz"),
        NOT_UTF8,
    ),
    "inspect: file name not UTF-8": (_bad_name("inspect", "BAD"), NOT_UTF8),
    # An engine may have any name (test_legal_long_name_and_non_utf8_name_compile); a model is refused.
    "export-triton: model name not UTF-8": (_bad_name("export-triton", "BAD", "-o", "repo"), "is a model"),
    "report --data with NaN": (
        _nan_data("report", float("nan")),
        r"--data 'x\.npz': input 'x' contains 1 NaN/inf value\(s\) \(first at index \[1, 2\]\)",
    ),
    "report --data with inf": (_nan_data("report", float("inf")), r"input 'x' contains 1 NaN/inf"),
    "calibrate --data with NaN": (
        _nan_data("calibrate", float("nan")),
        r"'x\.npz': input 'x' contains 1 NaN/inf value\(s\).*calibration data must be finite",
    ),
}

CUSTOM_OP = r"'custom\.onnx' holds 1 node\(s\) of custom op\(s\) com\.acme:FancyOp that {}.* node 'fancy_1'"

# Cases that ask the TensorRT backend (its targets, parser and plugins).
NEEDS_TRT = ("--target SM999", "--target ''", "compile: custom op without a plugin", "compile --no-passes: ")
CASES: dict[str, tuple[Setup, str]] = {
    "--target SM999": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--target", "SM999"),
        r"--target 'SM999': not a compute capability .* expected one or more of CURRENT, SM75",
    ),
    "--target ''": (_tiny("compile", "m.onnx", "-o", "o.engine", "--target", ""), r"--target '':"),
    "compile --timing-cache the input model": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--timing-cache", "m.onnx"),
        r"--timing-cache 'm\.onnx' is the input model 'm\.onnx' itself",
    ),
    "optimize --ledger equal to -o": (
        _tiny("optimize", "m.onnx", "-o", "o.onnx", "--ledger", "./o.onnx"),
        r"--ledger and -o name the same file 'o\.onnx'",
    ),
    # (it said "cannot run" and to give --verify-shape sizes: no size helps a graph ONNX Runtime refuses)
    "optimize: two nodes of one name": (
        _graph_onnx(
            "dupnames",
            lambda: [
                __import__("onnx").helper.make_node("Relu", ["x"], ["a"], name="n"),
                __import__("onnx").helper.make_node("Sigmoid", ["a"], ["y"], name="n"),
            ],
            lambda: [_vi("x", "FLOAT", ["b", 4])],
            lambda: [_vi("y", "FLOAT", ["b", 4])],
            command="optimize",
        ),
        r"ONNX Runtime cannot load the input model: .*two nodes with same node name \(n\)\. \(fix the model, "
        r"or turn verification off: --no-verify\)\n$",
    ),
    # (it was taken and did nothing: no data to tokenize)
    "optimize --tokenizer without --precision-data": (
        _tiny("optimize", "m.onnx", "-o", "o.onnx", "--precision", "fp16", "--tokenizer", "demo"),
        r"--tokenizer tokenizes the text of --precision-data \(sentences\.txt\), which is not given",
    ),
    "compile -o the factory's module (--force)": (
        lambda d: [
            *_factory("def make():  # a module of its own\n    return Lin(), (torch.zeros(2, 4),)\n")(d)[:2],
            "-o",
            _py(d),
            "--force",
        ],
        r"-o \(engine\) 'um_\d+\.py' is the factory's module '.*um_\d+\.py' itself",
    ),
    "compile --generate --save-onnx equal to -o": (
        lambda d: [*GENERATE, "-o", "s.engine", "--save-onnx", "s.engine"],
        r"--save-onnx and -o \(engine\) name the same file 's\.engine'",
    ),
    "compile --generate --save-onnx equal to the manifest": (
        lambda d: [*GENERATE, "-o", "s.engine", "--save-onnx", "s.engine.json"],
        r"--save-onnx and the manifest name the same file 's\.engine\.json'",
    ),
    "compile --generate -o the factory's module (--force)": (
        lambda d: [*GENERATE, "-o", __import__("tests.llm.tiny_models").llm.tiny_models.__file__, "--force"],
        r"-o \(engine\) '.*tiny_models\.py' is the factory's module",
    ),
    "compile --generate -o a file of the model directory (--force)": (
        lambda d: ["compile", _hf_dir(d), "--generate", "--max-seq", "64", "-o", "hf/config.json", "--force"],
        # (it went on "of the model directory 'hf/config.json' itself", the file's path as the directory's)
        r"-o \(engine\) 'hf/config\.json' is the file 'config\.json' of the model directory 'hf' itself;",
    ),
    "compile: custom op without a plugin": (_custom_op("compile"), CUSTOM_OP.format("tensorrt")),
    "compile --no-passes: custom op without a plugin": (
        _custom_op("compile", "--no-passes"),
        CUSTOM_OP.format("tensorrt"),
    ),
    "optimize: custom op ONNX Runtime cannot run": (
        _custom_op("optimize"),
        CUSTOM_OP.format("ONNX Runtime") + r".*--no-verify",
    ),
    "calibrate: custom op ONNX Runtime cannot run": (
        _custom_op("calibrate"),
        CUSTOM_OP.format("ONNX Runtime"),
    ),
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.trt_build] if c.startswith(NEEDS_TRT) else []) for c in CASES],
    ids=list(CASES),
)
def test_hostile_input_exits_2_cleanly(case: str, workdir: Path, capfd: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    assert_exits_2_cleanly(*CASES[case], workdir, capfd)


@pytest.mark.parametrize("case", list(PATH_CASES), ids=list(PATH_CASES))
def test_undecodable_path_and_nonfinite_data_exit_2(
    case: str,
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert_exits_2_cleanly(*PATH_CASES[case], workdir, capfd)


def test_bracketed_names_and_paths_print_literally(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Paths, tensor names and symbolic shapes are data, not rich markup. Before: `inspect` showed the
    shape `[batch, 4]` as an empty cell, and a path holding `[/d]` (a closing tag matching nothing) made
    inspect, optimize and calibrate end in a MarkupError traceback (exit 1) after writing their output."""
    import numpy as np

    from tests.cli.test_encoder_hostile_inputs import _engine, _wide_onnx
    from trtforge.cli.main import main

    d = workdir / "[/d]"  # a directory "[" holding "d]"
    d.mkdir(parents=True)
    tiny_onnx(d / "m.onnx")
    np.savez(d / "c.npz", x=np.ones((4, 4), np.float32))
    _wide_onnx(d)
    _engine(d)
    commands = {
        "inspect": ["inspect", "[/d]/m.onnx"],
        "inspect engine": ["inspect", "[/d]/m.engine"],
        "optimize": ["optimize", "[/d]/m.onnx", "-o", "[/d]/o.onnx"],
        "calibrate": ["calibrate", "[/d]/wide.onnx", "--data", "[/d]/c.npz", "-o", "[/d]/q.onnx"],
    }
    for what, argv in commands.items():
        rc = main(argv)
        out, err = capfd.readouterr()
        text = out + err
        assert rc == 0 and "Traceback" not in text, (what, text)
        assert what == "inspect engine" or "[/d]/" in text, (what, text)  # an engine shows its file name
        if what == "inspect":
            assert "[batch, 4]" in text and "[batch, 3]" in text, text


def test_report_progress_shows_a_bracketed_target_literally() -> None:
    """A report's progress line names its targets, and `onnx=PATH` holds a path: `[/x]` in it raised a
    MarkupError mid-report."""
    from trtforge.reports.api import StepProgress

    bar = StepProgress(True, 2)
    with bar.running():
        bar.step("running onnx=[/x]/m.onnx", advance=1)


def test_optimize_fp16_that_loses_an_output_says_so_and_records_the_check(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before: `optimize --precision fp16` of a graph whose FP16 form outputs zeros (an activation below
    FP16's subnormals) printed "4 nodes converted" and exit 0; the check against FP32 that saw it was
    dropped, and --ledger held no word of the conversion. Now a warning names the output, the summary line
    gives the check, and the ledger holds the conversion's record under "precision"."""
    import json

    import onnx

    from tests.passes.precision.test_convert import flushing_activation
    from trtforge.cli.main import main

    onnx.save(flushing_activation(), str(workdir / "act.onnx"))
    rc = main(["optimize", "act.onnx", "-o", "o.onnx", "--precision", "fp16", "--ledger", "l.json"])
    out, err = capfd.readouterr()
    assert rc == 0, out + err
    assert re.search(
        r"^warning: FP16 conversion: output 'y' agrees with the FP32 model's to a cosine of only "
        r"0\.000 .*--keep-fp32",
        err,
        re.M,
    ), err
    assert "vs FP32 in exact ORT: min cosine 0.000000" in " ".join(out.split()), out
    check = json.loads((workdir / "l.json").read_text())["precision"]["verification"]
    assert [c["name"] for c in check] == ["y"] and check[0]["min_cosine"] < 0.5


def test_optimize_fp16_of_an_fp16_model_says_it_was_not_converted_again(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before: "fp16: 0 nodes converted, 0 kept FP32" and nothing of why (the model holds FP16 already)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtforge.cli.main import main

    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["b", 4])  # noqa: E731
    w = numpy_helper.from_array(np.ones((4, 4), np.float16), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g", [vi("x")], [vi("y")], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(workdir / "h.onnx"))
    rc = main(["optimize", "h.onnx", "-o", "o.onnx", "--precision", "fp16"])
    out = " ".join("".join(capfd.readouterr()).split())
    assert rc == 0, out
    assert (
        "precision fp16: already-low-precision (model already has 4 FP16 tensors; not converted again)" in out
    )
    assert "nodes converted" not in out


def test_inspect_json_is_strict_json_when_a_manifest_holds_nan_or_infinity(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Python's json reads and writes NaN and Infinity (a record's exact-match SNR, a hand edit), which
    are no JSON: `inspect --json | jq` failed on them. Now they print as null."""
    import json

    from tests.cli.test_encoder_hostile_inputs import _engine
    from trtforge.cli.main import main

    path = _engine(workdir).with_name("m.engine.json")
    manifest = json.loads(path.read_text())
    manifest["records"] = {
        "check": {"snr_db": float("inf"), "cosine": float("nan"), "kept": [float("-inf"), 1.5]}
    }
    path.write_text(json.dumps(manifest))
    rc = main(["inspect", "m.engine", "--json"])
    out, err = capfd.readouterr()
    assert rc == 0, out + err

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} is not JSON")

    doc = json.loads(out, parse_constant=refuse)
    assert doc["records"]["check"] == {"snr_db": None, "cosine": None, "kept": [None, 1.5]}
