"""The public Python API given the wrong kind of argument: a UserError naming the argument, never a
TypeError/AttributeError from deep inside (os.fspath, Path, proto attribute access)."""

from __future__ import annotations

import os
from pathlib import Path

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


def _compile_output(output):
    def run(d):
        import trtforge

        trtforge.compile(str(tiny_onnx(d / "m.onnx")), None, output)

    return run


CASES = {
    "compile(output=5)": (_compile_output_int, r"output \(the engine path\) must be a path .*got int 5"),
    # both were ValueError: PosixPath('.') has an empty name (settling a publish left at a nameless path)
    "compile(output='')": (_compile_output(""), r"output engine: the path is empty; expected a file name"),
    "compile(output='.')": (_compile_output("."), r"output engine '\.' is a directory; expected a file path"),
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


def _compile(d, *args, **options):
    import trtforge

    return trtforge.compile(str(tiny_onnx(d / "m.onnx")), *args, **options)


def _sampling(**fields):
    from trtforge.llm import SamplingParams

    return SamplingParams(**fields)


MISSPELLED = {
    # each was Python's "got an unexpected keyword argument" TypeError (or, through **options, a deep one)
    "trtforge.compile(precison=)": (
        lambda d: _compile(d, output=d / "m.engine", precison="fp16"),
        r"trtforge\.compile\(\) has no option 'precison' \(did you mean 'precision'\?\)",
    ),
    "trtforge.compile(generat=)": (
        lambda d: _compile(d, output=d / "m.engine", generat=True),
        r"no option 'generat' \(did you mean 'generate'\?\)",
    ),
    "compile_model(workspace=)": (
        lambda d: __import__("trtforge.compiler.pipeline").compiler.pipeline.compile_model(
            str(tiny_onnx(d / "m.onnx")), output=d / "m.engine", workspace=64
        ),
        r"compile_model\(\) has no option 'workspace' \(did you mean 'workspace_mb'\?\)",
    ),
    "build_report(batch_size=)": (
        lambda d: __import__("trtforge.reports.api").reports.api.build_report(
            str(tiny_onnx(d / "m.onnx")), out_dir=d / "r", batch_size=[1]
        ),
        r"build_report\(\) has no option 'batch_size' \(did you mean 'batch_sizes'\?\)",
    ),
    "calibrate_model(methd=)": (
        lambda d: __import__("trtforge.calibration.api").calibration.api.calibrate_model(
            str(tiny_onnx(d / "m.onnx")), None, methd="minmax"
        ),
        r"calibrate_model\(\) has no option 'methd' \(did you mean 'method'\?\)",
    ),
    "runtime.load(manifst=)": (
        lambda d: __import__("trtforge.runtime").runtime.load("m.engine", manifst=None),
        r"load\(\) has no option 'manifst' \(did you mean 'manifest'\?\)",
    ),
    "llm.load(executer=)": (
        lambda d: __import__("trtforge.llm").llm.load("m.onnx", executer="onnxruntime"),
        r"load\(\) has no option 'executer' \(did you mean 'executor'\?\)",
    ),
    "llm.from_pretrained(dtyp=)": (
        lambda d: __import__("trtforge.llm").llm.from_pretrained("gpt2", dtyp="fp16"),
        r"from_pretrained\(\) has no option 'dtyp' \(did you mean 'dtype'\?\)",
    ),
    "SamplingParams(temprature=)": (
        lambda d: _sampling(temprature=0.5),
        r"SamplingParams\(\) has no option 'temprature' \(did you mean 'temperature'\?\)",
    ),
    "trtforge.compile(generate='yes')": (
        lambda d: _compile(d, output=d / "m.engine", generate="yes"),
        r"generate must be True or False, got str 'yes'",
    ),
    "trtforge.compile(None)": (
        lambda d: __import__("trtforge").compile(None, output=d / "m.engine"),
        r"model must be a torch\.nn\.Module, an \.onnx or \.pt2 file path.*got NoneType None",
    ),
    "trtforge.compile(5)": (
        lambda d: __import__("trtforge").compile(5, output=d / "m.engine"),
        r"model must be a torch\.nn\.Module.*got int 5",
    ),
    "trtforge.compile(model, inputs, output, 'fp16')": (  # was Python's TypeError
        lambda d: _compile(d, None, d / "m.engine", "fp16"),
        r"compile\(\): too many positional arguments",
    ),
    "trtforge.compile(progress='no')": (  # was read as true
        lambda d: _compile(d, output=d / "m.engine", progress="no"),
        r"progress must be True or False, got str 'no'",
    ),
    "trtforge.compile(log=5)": (  # was "TypeError: 'int' object is not callable" mid-compile
        lambda d: _compile(d, output=d / "m.engine", log=5),
        r"log must be a function taking a message \(or None\), got int",
    ),
    "llm.from_pretrained(bytes)": (  # was "expected a Hugging Face causal LM ..., got bytes"
        lambda d: __import__("trtforge.llm").llm.from_pretrained(os.fsencode(d / "nope")),
        r"'.*nope' is not a model file nor a 'package\.module:factory' reference",
    ),
    "runtime.load(bytes)": (
        lambda d: __import__("trtforge.runtime").runtime.load(b"nope.engine"),
        r"engine 'nope\.engine' does not exist \(nor its manifest",
    ),
}


@pytest.mark.parametrize("case", list(MISSPELLED))
def test_misspelled_options_and_wrong_models_are_user_errors(case, tmp_path) -> None:
    """A misspelled option is refused by name with the close one suggested; never ignored, never a
    TypeError; nothing is written."""
    fn, message = MISSPELLED[case]
    with pytest.raises(UserError, match=message):
        fn(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["m.onnx"])


def test_numpy_integer_streams_compiles(tmp_path) -> None:
    """streams=np.int64(2) passed every check, built the engine, then failed writing the manifest
    ("Object of type int64 is not JSON serializable"): nothing written after the whole build."""
    import numpy as np

    import trtforge

    result = trtforge.compile(
        str(tiny_onnx(tmp_path / "m.onnx")), output=tmp_path / "m.engine", streams=np.int64(2)
    )
    assert result.manifest.streams == 2 and type(result.manifest.streams) is int
    assert (tmp_path / "m.engine.json").is_file()


def test_bytes_model_path_compiles(tmp_path) -> None:
    """A bytes path (as os functions take) is a path; it read as a module needing example_inputs."""
    import trtforge

    model = tiny_onnx(tmp_path / "m.onnx")
    result = trtforge.compile(bytes(model), output=tmp_path / "m.engine")
    assert (tmp_path / "m.engine").is_file() and (tmp_path / "m.engine.json").is_file()
    assert result is not None


EXPORT_ARGS = {
    # each was a TypeError/AttributeError from inside the exporter's argument handling, or (output_names=[1])
    # an ExportError after both exporters failed on it
    "dynamic=5": ({"dynamic": 5}, r"--dynamic \(dynamic\) must be dim names per axis .*got int 5"),
    "dynamic={'input': 5}": (
        {"dynamic": {"input": 5}},
        r"dynamic axes of input 'input' must be \{axis: dim name\}.*got int 5",
    ),
    "opset='17'": ({"opset": "17"}, r"--opset \(opset\) must be an integer or None, got str '17'"),
    "output_names=[1]": ({"output_names": [1]}, r"output_names\) must be names \(strings\), got int 1"),
    "output_names=5": ({"output_names": 5}, r"output_names\) must be a list of names, got int 5"),
}


@pytest.mark.parametrize("case", list(EXPORT_ARGS))
def test_export_option_kinds_are_user_errors(case, tmp_path) -> None:
    import torch

    import trtforge

    options, message = EXPORT_ARGS[case]
    with pytest.raises(UserError, match=message):
        trtforge.compile(torch.nn.Linear(4, 3), torch.zeros(2, 4), tmp_path / "m.engine", **options)
    assert list(tmp_path.iterdir()) == []


def test_one_output_name_as_a_str(tmp_path) -> None:
    """output_names='logits' names the one output (it was read letter by letter: "3 name(s) ['l', 'o', ...]
    given for a model with 1 output"); dynamic={'input': 'batch'} names axis 0 of that input."""
    import torch

    import trtforge

    result = trtforge.compile(
        torch.nn.Linear(4, 3),
        torch.zeros(2, 4),
        tmp_path / "m.engine",
        output_names="logits",
        dynamic={"input": "batch"},
    )
    assert [t.name for t in result.manifest.outputs] == ["logits"]
    assert result.manifest.inputs[0].shape == [-1, 4]


def test_numpy_integer_opset(tmp_path) -> None:
    """opset=np.int64(17) was refused as "--opset (opset) must be an integer or None, got int64 17"."""
    import numpy as np
    import torch

    import trtforge

    result = trtforge.compile(
        torch.nn.Linear(4, 3), torch.zeros(2, 4), tmp_path / "m.engine", opset=np.int64(17)
    )
    assert result.manifest.source["opset"] == 17


REPORT_ARGS = {
    # each was a TypeError from a comparison or loop deep inside, or (targets="ort") target 'o'
    "batch_sizes='1'": (
        {"batch_sizes": "1"},
        r"batch_sizes \(batch sizes\) must be a list of positive integers, got '1'",
    ),
    "batch_sizes=1": (
        {"batch_sizes": 1},
        r"batch_sizes \(batch sizes\) must be a list of positive integers, got 1",
    ),
    "seq_lens=[1.5]": (
        {"seq_lens": [1.5]},
        r"seq_lens \(sequence lengths\) must be a list of positive integers",
    ),
    "runs='3'": ({"runs": "3"}, r"runs must be an integer >= 1, got '3'"),
    "warmup=True": ({"warmup": True}, r"warmup must be an integer >= 0, got True"),
    "targets='ort'": ({"targets": "ort"}, r"targets must be a list of target names .*got 'ort'"),
    "tolerances=[1]": (
        {"tolerances": [1]},
        r"tolerances must be a mapping of output keys to limits .*got \[1\]",
    ),
}


@pytest.mark.parametrize("case", list(REPORT_ARGS))
def test_build_report_argument_kinds_are_user_errors(case, tmp_path) -> None:
    from trtforge.reports.api import build_report

    options, message = REPORT_ARGS[case]
    with pytest.raises(UserError, match=message):
        build_report(str(tiny_onnx(tmp_path / "m.onnx")), out_dir=tmp_path / "r", **options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


CALIBRATE_ARGS = {
    # each was a TypeError from a comparison deep inside
    "percentile='99'": (
        {"method": "percentile", "percentile": "99"},
        r"percentile must be a number, got '99'",
    ),
    "smoothquant='0.5'": ({"smoothquant": "0.5"}, r"smoothquant must be a number or None, got '0\.5'"),
    "samples='8'": ({"samples": "8"}, r"samples must be an integer >= 1 or None, got '8'"),
    "batch_size=0": ({"batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
    "op_types=[1]": ({"op_types": [1]}, r"op_types must be a list of names, got \[1\]"),
}


@pytest.mark.parametrize("case", list(CALIBRATE_ARGS))
def test_calibrate_model_argument_kinds_are_user_errors(case, tmp_path) -> None:
    import numpy as np

    from trtforge.calibration.api import calibrate_model

    options, message = CALIBRATE_ARGS[case]
    data = {"x": np.ones((4, 4), np.float32)}
    with pytest.raises(UserError, match=message):
        calibrate_model(str(tiny_onnx(tmp_path / "m.onnx")), [data], **options)


def test_calibrate_model_takes_one_op_type_or_node_as_a_str(tmp_path) -> None:
    """op_types='MatMul' is the one op type (it was read letter by letter: "cannot quantize op type(s)
    ['M', 'a', ...]"), exclude_nodes='matmul' the one node (was "excluded node(s) ['a', 'l', ...]")."""
    import numpy as np

    from trtforge.calibration.api import calibrate_model

    model = tiny_onnx(tmp_path / "m.onnx")
    data = [{"x": np.ones((4, 4), np.float32)}]
    # the tiny model's 4x3 MatMul is too small to quantize: what matters is which names were understood
    with pytest.raises(UserError, match=r"no \['MatMul'\] node qualifies"):
        calibrate_model(str(model), data, op_types="MatMul")
    with pytest.raises(UserError, match=r"excluded by the user"):
        calibrate_model(str(model), data, exclude_nodes="matmul")


DRAFT = Path(__file__).resolve().parents[1] / ".." / "shared" / "models" / "code-llama-3m"


@pytest.mark.skipif(not DRAFT.is_dir(), reason=f"the trained model {DRAFT} is absent")
def test_serving_llm_methods_refuse_a_misspelled_option_by_name() -> None:
    """ServingLLM.generate(max_tokens=4) was Python's TypeError naming no alternative."""
    import trtforge.llm

    llm = trtforge.llm.from_pretrained(str(DRAFT), max_model_len=64)
    try:
        with pytest.raises(
            UserError, match=r"generate\(\) has no option 'max_tokens' \(did you mean 'max_new_tokens'"
        ):
            llm.generate([[1, 2]], max_tokens=4)
        with pytest.raises(
            UserError, match=r"stream\(\) has no option 'max_new_token' \(did you mean 'max_new_tokens'"
        ):
            llm.stream([1, 2], max_new_token=3)
        with pytest.raises(UserError, match=r"submit\(\) has no option 'param' \(did you mean 'params'"):
            llm.submit([1, 2], param=None)
        assert len(llm.generate([[1, 2]], max_new_tokens=3, stop_at_eos=False)[0]) == 3
    finally:
        llm.close()


OPTIMIZE_ARGS = {
    # the first three were AttributeErrors/TypeErrors; the last three were taken (read letter by letter,
    # failing inside verification, or ignored)
    "model=None": (None, {}, r"model must be an onnx\.ModelProto or an ONNX file path, got NoneType"),
    "verfy=": (
        "m",
        {"verfy": False},
        r"optimize_model\(\) has no option 'verfy' \(did you mean 'verify'\?\)",
    ),
    "passes=[1]": ("m", {"passes": [1]}, r"passes must be a list of pass names .*got \[1\]"),
    "feed_shapes={'x': '2x4'}": (
        "m",
        {"feed_shapes": {"x": "2x4"}},
        r"feed_shapes\['x'\] must be a list of dims",
    ),
    "verify_shapes={'zz': ..}": (
        "m",
        {"verify_shapes": {"zz": [2, 4]}},
        r"verify_shapes: the model has no input 'zz'",
    ),
    "feed_shapes=[2, 4]": (
        "m",
        {"feed_shapes": [2, 4]},
        r"feed_shapes must be a dict of input name -> shape",
    ),
}


@pytest.mark.parametrize("case", list(OPTIMIZE_ARGS))
def test_optimize_model_argument_kinds_are_user_errors(case, tmp_path) -> None:
    import onnx

    from trtforge.passes.pipeline import optimize_model

    model, options, message = OPTIMIZE_ARGS[case]
    with pytest.raises(UserError, match=message):
        optimize_model(onnx.load(str(tiny_onnx(tmp_path / "m.onnx"))) if model else model, **options)


def test_optimize_model_takes_a_path_and_comma_separated_passes(tmp_path) -> None:
    """As calibrate_model and compile do (a path was "AttributeError: 'str' object has no attribute
    'graph'"; passes='cleanup' was read as passes c, l, e, a, ...)."""
    from trtforge.passes.pipeline import optimize_model

    out, ledger = optimize_model(str(tiny_onnx(tmp_path / "m.onnx")), passes="cleanup, gelu")
    assert [p["name"] for p in ledger.to_dict()["passes"] if p["name"] != "opset"] == ["cleanup", "gelu"]
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Add", "Relu"]
