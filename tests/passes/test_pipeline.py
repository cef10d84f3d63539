"""Pipeline contracts: errors, verification failures, opset records, CLI behaviour."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.large_models import protobuf_limit
from tests.passes._graphs import GraphBuilder, op_counts
from trtforge.errors import UserError
from trtforge.passes import pipeline
from trtforge.passes._base import PassOutcome, PassSpec
from trtforge.passes.attention import PLUGIN_MODULE
from trtforge.passes.pipeline import DEFAULT_PASSES, VerificationError, optimize_model
from trtforge.passes.verify import make_inputs


def _model() -> onnx.ModelProto:
    g = GraphBuilder()
    g.layernorm()
    g.attention(mask="right")
    g.gelu()
    return g.build()


def _broken_pass(model: ir.Model, ctx) -> PassOutcome:
    """Corrupts the first float initializer: what a wrong rewrite looks like to the verifier."""
    for v in model.graph.initializers.values():
        arr = v.const_value.numpy()
        if arr.dtype == np.float32 and arr.size > 1:
            v.const_value = ir.tensor(arr * 3.0 + 1.0)
            break
    return PassOutcome(matches=1)


@pytest.fixture
def broken(monkeypatch):
    monkeypatch.setitem(pipeline.PASSES, "broken", PassSpec("broken", "test: corrupts weights", _broken_pass))
    return "broken"


def _invalid_model() -> onnx.ModelProto:
    node = helper.make_node("Relu", ["missing"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_default_passes_order():
    assert DEFAULT_PASSES[0] == "cleanup" and DEFAULT_PASSES[-1] == "cleanup"
    assert DEFAULT_PASSES.index("qkv") < DEFAULT_PASSES.index("attention")


def test_unknown_pass_is_user_error():
    with pytest.raises(UserError, match="unknown pass name.*'fuse_everything'"):
        optimize_model(_model(), passes=["cleanup", "fuse_everything"])


def test_unknown_attention_strategy_is_user_error():
    with pytest.raises(UserError, match="attention strategy 'flash'"):
        optimize_model(_model(), attention="flash")


def test_invalid_graph_is_user_error():
    with pytest.raises(UserError, match="fails ONNX checking"):
        optimize_model(_invalid_model())


def test_verification_failure_names_pass_and_output(broken):
    with pytest.raises(VerificationError, match=r"pass 'broken' changed output 'y' beyond tolerance") as e:
        optimize_model(_model(), passes=["cleanup", broken])
    assert isinstance(e.value, UserError)
    assert "max abs error" in str(e.value)


def test_no_verify_lets_a_broken_pass_through(broken):
    _out, ledger = optimize_model(_model(), passes=[broken], verify=False)
    assert ledger.passes[-1].verification is None and not ledger.verify


def test_plugin_strategy_without_plugin_module_is_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, PLUGIN_MODULE, None)  # import now raises ImportError
    with pytest.raises(UserError, match="--attention plugin needs"):
        optimize_model(_model(), attention="plugin")


def test_input_model_not_modified_and_ledger_records_everything():
    model = _model()
    before = model.SerializeToString()
    out, ledger = optimize_model(model, debug=True)
    assert model.SerializeToString() == before
    assert {"LayerNormalization", "Attention", "Gelu", "Split"} <= set(op_counts(out))
    d = json.loads(json.dumps(ledger.to_dict()))
    assert d["opset_change"] == {"from": 18, "to": 23}
    for p in d["passes"]:
        assert {
            "name",
            "matches",
            "nodes_before",
            "nodes_after",
            "seconds",
            "rejected",
            "verification",
        } <= set(p)
        assert p["verification"]["max_rel_error"] < 1e-4
    onnx.checker.check_model(out)


def test_generated_inputs_respect_vocab_and_masks():
    vocab = 11
    table = helper.make_tensor("emb", TensorProto.FLOAT, [vocab, 4], np.ones(vocab * 4, np.float32))
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "ax"], ["mu"]),
        helper.make_node("Mul", ["e", "mu"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        initializer=[table, helper.make_tensor("ax", TensorProto.INT64, [1], [-1])],
    )
    feeds = make_inputs(ir.serde.deserialize_model(helper.make_model(graph)))
    assert feeds["ids"].shape == feeds["mask"].shape
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < vocab
    assert set(np.unique(feeds["mask"])) == {0, 1}
    assert feeds["mask"][0].all() and not feeds["mask"][-1].all()  # some padding, never a full row
    assert feeds["mask"].sum(axis=1).min() >= 1


# --- CLI -------------------------------------------------------------------------------------
def _cli(argv):
    from trtforge.cli.main import main

    return main(argv)


def test_cli_optimize_writes_model_and_ledger(tmp_path, capsys):
    """Attention follows precision: fused to ONNX Attention in FP16, left decomposed in FP32."""
    src, dst, led = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "ledger.json"
    onnx.save(_model(), src)
    assert _cli(["optimize", str(src), "-o", str(dst), "--ledger", str(led), "--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "attention" in out and "layernorm" in out and "opset raised 18 -> 23" in out
    assert op_counts(onnx.load(dst))["Attention"] == 1
    assert json.loads(led.read_text())["attention"] == "native"
    assert _cli(["optimize", str(src), "-o", str(dst)]) == 2  # exists, no --force
    assert _cli(["optimize", str(src), "-o", str(dst), "--force", "--ledger", str(led)]) == 0
    assert "Attention" not in op_counts(onnx.load(dst))
    assert json.loads(led.read_text())["attention"] == "none"
    capsys.readouterr()
    assert _cli(["optimize", str(src), "-o", str(dst), "--force", "--attention", "native"]) == 2
    assert "--attention native needs an FP16/BF16 graph" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv_extra", "message"),
    [(["--passes", "cleanup,nope"], "unknown pass name"), (["--attention", "flash"], "Invalid value")],
)
def test_cli_bad_options_exit_2_without_output(tmp_path, capsys, argv_extra, message):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_model(), src)
    assert _cli(["optimize", str(src), "-o", str(dst), *argv_extra]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [src]


def test_cli_invalid_graph_exit_2(tmp_path, capsys):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_invalid_model(), src)
    assert _cli(["optimize", str(src), "-o", str(dst)]) == 2
    assert "fails ONNX checking" in capsys.readouterr().err
    assert not dst.exists()


def test_cli_verify_failure_exit_2_no_partial_file(tmp_path, capsys, broken):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_model(), src)
    assert _cli(["optimize", str(src), "-o", str(dst), "--passes", f"cleanup,{broken}"]) == 2
    assert "pass 'broken' changed output 'y'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [src]


def test_large_models_skip_verification(monkeypatch):
    monkeypatch.setattr(pipeline, "VERIFY_MAX_BYTES", 16)
    _, ledger = optimize_model(_model())
    assert "ORT verification skipped" in ledger.verify_skipped_reason
    assert all(p.verification is None for p in ledger.passes)


def test_a_large_model_is_checked_as_a_file(monkeypatch):
    """Past VERIFY_MAX_BYTES the pipeline skipped onnx.checker too (it refuses an in-memory model past
    2 GB), so an invalid large graph went into the passes unchecked; it is now checked as a file with its
    external data (protobuf's limit brought down to this model's size)."""
    model = _invalid_model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "w"))
    monkeypatch.setattr(pipeline, "VERIFY_MAX_BYTES", 16)
    protobuf_limit(monkeypatch, 8_000, room=1_000)
    with pytest.raises(UserError, match="fails ONNX checking.*missing"):
        optimize_model(model)
    optimize_model(_model())  # (a valid one passes)


def test_cli_optimize_precision_fp16(tmp_path, capsys):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_model(), src)
    assert _cli(["optimize", str(src), "-o", str(dst), "--precision", "fp16"]) == 0
    assert "fp16:" in capsys.readouterr().out
    fused = onnx.load(dst)
    assert op_counts(fused)["Attention"] == 1
    float16 = onnx.TensorProto.FLOAT16
    assert any(t.data_type == float16 for t in fused.graph.initializer)
    assert fused.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # I/O stays FP32
    assert (
        _cli(["optimize", str(src), "-o", str(dst), "--force", "--precision", "fp16", "--keep-fp32", "Nope"])
        == 2
    )
    assert "--keep-fp32 'Nope'" in capsys.readouterr().err


def test_output_that_is_a_graph_input_keeps_both_names():
    """onnx_ir's output fix renames such an input to `x_orig` inside the optimizer; cleanup gives the name
    back, so the optimized model is fed and read by the same names (ORT-verified like every pass)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "passthrough",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out, ledger = optimize_model(model)
    assert [i.name for i in out.graph.input] == ["x"]
    assert [o.name for o in out.graph.output] == ["y", "x"]
    assert all(p.verification is not None for p in ledger.passes)
    onnx.checker.check_model(out)


def test_one_tensor_returned_twice_keeps_both_output_names():
    """torch exports `return y, y` as y -> Identity -> y2, both graph outputs; Identity elimination used to
    merge them into one value listed twice under one name (an engine with duplicate output names)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["y"], ["y2"])],
        "twice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["batch", 4]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out, ledger = optimize_model(model)
    assert [o.name for o in out.graph.output] == ["y", "y2"]
    assert all(p.verification is not None for p in ledger.passes)
    onnx.checker.check_model(out)


@pytest.mark.parametrize("side", ["input", "output"])
def test_a_pass_that_renames_graph_inputs_or_outputs_is_a_trtforge_error(monkeypatch, side):
    from trtforge.errors import TrtforgeError

    def rename(model: ir.Model, ctx) -> PassOutcome:
        getattr(model.graph, f"{side}s")[0].name = "renamed"
        return PassOutcome()

    monkeypatch.setitem(pipeline.PASSES, "rename", PassSpec("rename", f"test: renames an {side}", rename))
    with pytest.raises(TrtforgeError, match=rf"pass 'rename' changed the graph's {side} names") as e:
        optimize_model(_model(), passes=["rename"], verify=False)
    assert not isinstance(e.value, UserError)


def test_opset_raise_through_the_c_converter_does_not_warn(caplog):
    # onnxscript hands opset 17 -> 23 to onnx's C converter and logs a WARNING each time (stderr noise
    # under `compile -q`); the fallback is intended.
    import logging

    g = GraphBuilder(opset=17)
    g.attention()
    with caplog.at_level(logging.WARNING):
        _, ledger = optimize_model(g.build())
    assert ledger.opset_before == 17 and ledger.opset_after == 23
    assert not [r for r in caplog.records if r.name.startswith("onnxscript")]


def _string_labels() -> onnx.ModelProto:
    """A classifier returning its scores and the label of the best one, a string (as ONNX-ML exports)."""
    from onnx import numpy_helper

    labels = helper.make_tensor("labels", TensorProto.STRING, [4], [b"cat", b"dog", b"emu", b"fox"])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["best"], axis=1, keepdims=0),
        helper.make_node("Gather", ["labels", "best"], ["label"]),
    ]
    outputs = [
        helper.make_tensor_value_info("label", TensorProto.STRING, ["batch"]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph(nodes, "cls", [x], outputs, [labels, w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_string_output_is_verified_by_equality(monkeypatch):
    """Before: verification compared a string output as numbers ("could not convert string to float":
    a traceback, exit 1 in `optimize`); now it must be equal, and a pass that changes it is named."""
    _, ledger = optimize_model(_string_labels())
    assert all(p.verification.per_output["label"]["max_abs_error"] == 0.0 for p in ledger.passes)

    def relabel(model: ir.Model, ctx) -> PassOutcome:
        v = model.graph.initializers["labels"]
        t = helper.make_tensor("labels", TensorProto.STRING, [4], [b"ant", b"bee", b"cow", b"doe"])
        v.const_value = ir.serde.deserialize_tensor(t)
        return PassOutcome(matches=1)

    monkeypatch.setitem(pipeline.PASSES, "relabel", PassSpec("relabel", "test: renames the labels", relabel))
    with pytest.raises(
        VerificationError, match=r"pass 'relabel' changed output 'label' \(object tensor\): 2 of 2"
    ):
        optimize_model(_string_labels(), passes=["relabel"])


def _ir3_model() -> onnx.ModelProto:
    """An IR 3, opset 9 model, its weight listed among the graph inputs as IR < 4 requires (the ONNX
    model zoo's classics: ResNet, SqueezeNet)."""
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "W")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    w_in = helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "old", [x, w_in], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    return model


def test_raising_the_opset_of_an_ir3_model_raises_its_ir_version():
    """Before: optimize (opset 9 -> 23) kept IR 3, and the FP16 conversion then dropped the weight from
    the graph inputs: 'W__fp16 in initializer but not in graph input', the ONNX checker's refusal that
    compile, inspect and optimize gave the file `optimize --precision fp16` had just written."""
    from trtforge.passes.precision import convert_precision

    out, ledger = optimize_model(_ir3_model())
    assert ledger.opset_after == 23 and out.ir_version == helper.find_min_ir_version_for(out.opset_import)
    fp16, _ = convert_precision(out, "fp16")
    onnx.checker.check_model(fp16)
    bf16, _ = convert_precision(_ir3_model(), "bf16")  # (its own opset raise, 9 -> 22)
    assert bf16.ir_version >= helper.find_min_ir_version_for(bf16.opset_import)
    onnx.checker.check_model(bf16)
