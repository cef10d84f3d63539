"""The compile policy: one set of defaults for the API and every command, attention by precision, and
options that do not apply refused with the reason."""

from __future__ import annotations

import dataclasses

import click
import pytest

from trtforge.cli._options import from_params
from trtforge.compiler.build import BuildOptions
from trtforge.core.policy import (
    ExportOptions,
    PassOptions,
    PrecisionOptions,
    check_precision,
    check_source,
    resolve_attention,
)
from trtforge.errors import UserError

GROUPS = (ExportOptions, PassOptions, PrecisionOptions, BuildOptions)


def _command(name: str) -> click.Command:
    from trtforge.cli.main import cli

    return cli.get_command(click.Context(cli), name)


ARGS = {
    "compile": ["m.onnx", "-o", "m.engine"],
    "optimize": ["{model}", "-o", "out.onnx"],
    "calibrate": ["m.onnx", "--data", "d.npz", "-o", "out.onnx"],
    "report": ["m.onnx", "-o", "out"],
}


@pytest.mark.parametrize("command", list(ARGS))
def test_cli_defaults_are_the_api_defaults(command: str, tmp_path) -> None:
    """What a command passes on when no option is given builds exactly the API's default groups."""
    (tmp_path / "m.onnx").write_bytes(b"")
    cmd = _command(command)
    ctx = cmd.make_context(command, [a.format(model=tmp_path / "m.onnx") for a in ARGS[command]])
    shared = 0
    for group in GROUPS:
        helps = {f.name: f.metadata["cli"]["help"] for f in dataclasses.fields(group) if "cli" in f.metadata}
        generated = {
            p.name
            for p in cmd.params
            if p.name in helps and isinstance(p, click.Option) and helps[p.name] in (p.help or "")
        }
        shared += len(generated)
        flags = {
            flag: f.name
            for f in dataclasses.fields(group)
            if "cli" in f.metadata
            for spelling in f.metadata["cli"]["flags"]
            for flag in spelling.split("/")
        }
        for p in cmd.params:
            hand_written = [o for o in p.opts if o in flags and p.name not in generated]
            assert not hand_written, (
                f"{command} defines {hand_written} itself instead of from {group.__name__}"
            )
        built = from_params(group, {k: v for k, v in ctx.params.items() if k in generated})
        assert built == group(), f"{command}: {built} != {group()}"
    assert shared >= 3
    assert PrecisionOptions().int8_rest == "fp16"


def test_compile_exposes_every_group_field() -> None:
    names = {p.name for p in _command("compile").params}
    for group in GROUPS:
        for f in dataclasses.fields(group):
            if "cli" in f.metadata and f.name != "debug":
                assert f.name in names, f.name


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        (PrecisionOptions(), "none"),
        (PrecisionOptions(mode="fp16"), "native"),
        (PrecisionOptions(mode="bf16"), "native"),
        (PrecisionOptions(mode="int8", calib_data="d.npz"), "native"),
        (PrecisionOptions(mode="int8", calib_data="d.npz", int8_rest="fp32"), "none"),
    ],
)
def test_attention_follows_precision(precision: PrecisionOptions, expected: str) -> None:
    assert resolve_attention(PassOptions(), precision) == expected
    assert resolve_attention(None, precision) is None


@pytest.mark.parametrize(
    "precision",
    [PrecisionOptions(), PrecisionOptions(mode="int8", calib_data="d.npz", int8_rest="fp32")],
)
def test_native_attention_in_fp32_is_refused(precision: PrecisionOptions) -> None:
    with pytest.raises(UserError, match="--attention native needs an FP16/BF16 graph"):
        resolve_attention(PassOptions(attention="native"), precision)
    assert resolve_attention(PassOptions(attention="none"), precision) == "none"


@pytest.mark.parametrize(
    ("precision", "message"),
    [
        (
            PrecisionOptions(mode="fp16", calib_method="max"),
            "--calib-method is only used with --precision int8",
        ),
        (PrecisionOptions(smoothquant=None), "--no-smoothquant is only used with --precision int8"),
        (PrecisionOptions(int8_rest="bf16"), "--int8-rest is only used"),
        (PrecisionOptions(keep_fp32=("Gelu",)), "--keep-fp32 only applies to FP16/BF16 graphs"),
        (PrecisionOptions(keep_io_types=False), "--low-precision-io only applies"),
        (
            PrecisionOptions(mode="int8", calib_data="d.npz", int8_rest="fp32", data="x.npz"),
            "--precision-data only applies to FP16/BF16 graphs, but the unquantized rest stays FP32",
        ),
        (PrecisionOptions(mode="int8"), "needs calibration data"),
        (PrecisionOptions(mode="fp4"), "expected one of fp32, fp16, bf16, int8, fp8, int4"),
        (PrecisionOptions(mode="fp8"), "--precision fp8 is made for decoder step graphs only"),
        (PrecisionOptions(mode="int4"), "--precision int4 is made for decoder step graphs only"),
    ],
)
def test_inapplicable_precision_options_refused(precision: PrecisionOptions, message: str) -> None:
    with pytest.raises(UserError, match=message):
        check_precision(precision)


def test_export_options_refused_for_onnx_sources() -> None:
    check_source("m.onnx", ExportOptions())
    check_source("pkg.mod:make", ExportOptions(dynamic="batch"))
    with pytest.raises(UserError, match=r"--dynamic, --output-name only apply when exporting a torch module"):
        check_source("m.onnx", ExportOptions(dynamic="batch,seq", output_names=["y"]))
    with pytest.raises(UserError, match="--opset only applies"):
        check_source("m.onnx", ExportOptions(opset=17))
    with pytest.raises(UserError, match="example_inputs only apply when exporting a torch module"):
        check_source("m.onnx", ExportOptions(), example_inputs={"x": 1})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"streams": "2"}, r"--streams must be an integer, got '2' \(str\)"),
        ({"streams": 2.5}, r"--streams must be an integer, got 2\.5"),
        ({"opt_level": True}, r"--opt-level must be an integer, got True"),
        ({"workspace_mb": -5}, r"--workspace must be 1\.\."),
        ({"targets": [89]}, r"--target expects names such as 'SM89', got \[89\]"),
        ({"targets": 89}, r"--target expects names such as 'SM89', got 89"),
        ({"shapes": {"x": (1, 2, 3)}}, r"shapes\['x'\] is \(1, 2, 3\); expected a ShapeRange"),
        ({"shapes": [1, 2]}, r"shapes holds 1; expected 'NAME:MIN:OPT:MAX' strings"),
        ({"shapes": {"x": ([1, -4], [2, 4], [8, 4])}}, r"--shape x: negative dimension"),
    ],
)
def test_build_options_refuse_wrong_types_when_made(kwargs, message) -> None:
    """Before: TypeError/AttributeError from deep in the build, after the export and passes ran."""
    with pytest.raises(UserError, match=message):
        BuildOptions(**kwargs)


def test_build_options_accept_the_api_shorthands() -> None:
    from trtforge.core.manifest import ShapeRange

    one = BuildOptions(shapes="x:1x16:4x16:8x16")
    assert one.shapes == ("x:1x16:4x16:8x16",)
    by_name = BuildOptions(shapes={"x": "1x16:4x16:8x16", "y": ([1], [2], [3])})
    assert by_name.shapes == {
        "x": ShapeRange([1, 16], [4, 16], [8, 16]),
        "y": ShapeRange([1], [2], [3]),
    }
    assert by_name.to_dict()["shapes"]["x"] == {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": None}, r"precision must be 'fp32', 'fp16', 'bf16', 'int8' or a PrecisionOptions"),
        ({"precision": 16}, r"got 16"),
        ({"passes": 3}, r"passes must be a PassOptions, a list of pass names or None"),
        ({"passes": ["cleanup", 1]}, r"passes must be pass names"),
    ],
)
def test_compile_refuses_wrong_precision_and_passes_types(kwargs, message, tmp_path) -> None:
    import trtforge
    from tests.models import tiny_onnx

    with pytest.raises(UserError, match=message):
        trtforge.compile(str(tiny_onnx(tmp_path / "m.onnx")), output=tmp_path / "m.engine", **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
