"""`trtforge optimize --verify-shape NAME:DIMS`: verification of a model that cannot run at the small
generated sizes (a convolution front end over samples, as Wav2Vec2's) runs at the user's shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtforge.cli.main import main


def _conv_then_gelu(path: Path) -> None:
    """x[B, L] -> Unsqueeze -> Conv(kernel 10, stride 5) -> decomposed GELU: it needs L >= 10 (the
    generated feed has 7), and it has a pattern for the passes to fuse."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 1, 10)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array(np.sqrt(2.0), dtype=np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axis1"], ["x3"]),
        helper.make_node("Conv", ["x3", "W"], ["c"], kernel_shape=[10], strides=[5]),
        helper.make_node("Div", ["c", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["c", "e1"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "frames"])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "conv.onnx"
    _conv_then_gelu(path)
    return path


def test_the_user_shape_feeds_verification_and_the_passes_run(model, tmp_path, capsys) -> None:
    import onnx

    out = tmp_path / "fused.onnx"
    assert main(["optimize", str(model), "-o", str(out), "--verify-shape", "x:2x64"]) == 0
    assert "Gelu" in {n.op_type for n in onnx.load(str(out)).graph.node}
    fp16 = tmp_path / "fused16.onnx"
    assert (
        main(["optimize", str(model), "-o", str(fp16), "--verify-shape", "x:2x64", "--precision", "fp16"])
        == 0
    )


def test_without_it_the_error_says_which_option_gives_shapes(model, tmp_path, capsys) -> None:
    assert main(["optimize", str(model), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert "x [2, 7]" in err and "optimize --verify-shape NAME:DIMS" in err
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope:2x64", "--verify-shape nope: the model has no input 'nope'; its inputs: x."),
        ("x:64", "--verify-shape x: 64 has rank 1, but input 'x' has rank 2"),
        ("x2x64", "--verify-shape 'x2x64' is not NAME:DIMS"),
        ("x:2xq", "--verify-shape x: '2xq' is not a shape"),
        ("x:65536x65536", "--verify-shape x: 65536x65536 holds more than 2**31 - 1 elements"),
        ("x:2x7", r"Invalid input shape: {7} (verification fed inputs of shapes x [2, 7])"),
    ],
)
def test_bad_shapes_exit_2_naming_the_option(model, tmp_path, capsys, value, message) -> None:
    assert main(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--verify-shape", value]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.onnx").exists()


def test_given_twice_is_refused(model, tmp_path, capsys) -> None:
    argv = ["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--verify-shape", "x:2x64"]
    assert main([*argv, "--verify-shape", "x:1x32"]) == 2
    assert "--verify-shape x: given twice" in capsys.readouterr().err


def _ids_and_mask(path: Path) -> None:
    """input_ids[batch, seq] -> Gather(E[16,8]) times attention_mask[batch, seq]: the two must agree."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    e = numpy_helper.from_array(np.ones((16, 8), np.float32), "E")
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["h"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
        helper.make_node("Mul", ["h", "m3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ids_mask",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [e, numpy_helper.from_array(np.array([-1], np.int64), "axes")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_an_input_left_generated_takes_the_dim_sizes_given(tmp_path, capsys) -> None:
    """Before: `--verify-shape input_ids:3x9` fed attention_mask at its own generated [2, 7], so the model
    could not run and optimize exited 2 with ONNX Runtime's broadcast error."""
    model = tmp_path / "ids_mask.onnx"
    _ids_and_mask(model)
    out = tmp_path / "out.onnx"
    argv = ["optimize", str(model), "-o", str(out), "--verify-shape", "input_ids:3x9"]
    assert main(argv) == 0, capsys.readouterr()


def test_inputs_sharing_a_dim_name_given_different_sizes_are_refused(tmp_path, capsys) -> None:
    model = tmp_path / "ids_mask.onnx"
    _ids_and_mask(model)
    argv = ["optimize", str(model), "-o", str(tmp_path / "out.onnx")]
    assert main([*argv, "--verify-shape", "input_ids:1x8", "--verify-shape", "attention_mask:1x9"]) == 2
    err = capsys.readouterr().err
    expected = "--verify-shape attention_mask: dim 1 is 'seq', which --verify-shape input_ids sets to 8"
    assert f"{expected}, not 9" in err
    assert not (tmp_path / "out.onnx").exists()
