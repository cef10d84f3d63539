"""torch -> ONNX export: dict inputs, dynamic axes, both exporters, fallback, .pt2 and factories."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from tests.models import BERT_INPUTS, bert_inputs, tiny_bert
from trtforge._usercode import load_factory
from trtforge.compiler.export import export_module, normalize_inputs, resolve_dynamic
from trtforge.compiler.sources import from_onnx_file, from_pt2
from trtforge.errors import ExportError, UserError
from trtforge.numerics.sessions import exact_session

OUTS = ["last_hidden_state", "pooler_output"]


def _ort_matches_torch(path, model, batch: int, seq: int) -> None:
    feeds = bert_inputs(batch, seq, seed=batch * 100 + seq)
    sess = exact_session(path)
    got = sess.run(None, {k: v.numpy() for k, v in feeds.items()})
    with torch.no_grad():
        ref = model(**feeds)
    np.testing.assert_allclose(got[0], ref.last_hidden_state.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got[1], ref.pooler_output.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_dict_inputs_dynamic_axes(tmp_path, exporter: str) -> None:
    model = tiny_bert()
    art = export_module(
        model, bert_inputs(2, 8), tmp_path, dynamic="batch,seq", output_names=OUTS, exporter=exporter
    )
    rec = art.record
    assert rec.exporter == exporter and rec.fallback_reason is None
    assert rec.input_names == list(BERT_INPUTS) and rec.output_names == OUTS
    assert rec.verified and max(rec.max_abs_error.values()) < 1e-4
    assert rec.opset is not None and rec.opset >= 17
    proto = onnx.load(str(art.path))
    dims = [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert all(dims), f"both axes dynamic, got {dims}"
    for batch, seq in [(1, 5), (7, 64), (1, 64), (7, 5)]:
        _ort_matches_torch(art.path, model, batch, seq)


def test_tuple_inputs_named_from_signature(tmp_path) -> None:
    model = tiny_bert()
    feeds = bert_inputs(2, 6)
    art = export_module(model, (feeds["input_ids"], feeds["attention_mask"]), tmp_path, output_names=OUTS)
    assert art.record.input_names == ["input_ids", "attention_mask"]


class _DataDependent(torch.nn.Module):
    """Python control flow on tensor data: torch.export refuses it, the legacy tracer records one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return torch.relu(self.lin(x))
        return self.lin(x)


def test_legacy_fallback_records_reason(tmp_path, capfd) -> None:
    """The reason is recorded in one line; torch.export's partial FX graph, which it prints to stderr when
    it fails (hundreds of lines for a transformers model), does not reach the user's console."""
    x = torch.ones(2, 4)
    art = export_module(_DataDependent(), x, tmp_path, dynamic="batch")
    assert art.record.exporter == "legacy"
    assert art.record.fallback_reason and art.record.fallback_reason.startswith("dynamo exporter failed")
    assert art.record.verified
    err = capfd.readouterr().err
    assert "def forward(self" not in err and "torch.ops.aten" not in err, err[:500]


class _DataDependentNoise(torch.nn.Module):
    """Data-dependent control flow (the dynamo exporter fails) around an op no exporter can reproduce
    (fresh random numbers): the legacy graph disagrees with torch on the example inputs themselves."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x + torch.rand_like(x)
        return x


def test_fallback_reason_names_the_models_source_line_not_torchs(tmp_path) -> None:
    """The dynamo failure's one line ends with the model's line that made it where torch's "Caused by"
    names one (transformers' Longformer: modeling_longformer.py:549), never a line of torch's own."""
    from trtforge.compiler.export import export_failure

    art = export_module(_DataDependent(), torch.ones(2, 4), tmp_path)
    assert "Next steps:" not in art.record.fallback_reason
    assert "non_strict_utils" not in art.record.fallback_reason
    try:
        raise RuntimeError("step 1 failed. Next steps:\n") from ValueError(
            "Could not guard on data-dependent expression\nCaused by: (mypkg/model.py:12 in forward)"
        )
    except RuntimeError as e:
        line = export_failure(e)
    assert line.endswith(" at mypkg/model.py:12 in forward") and "Next steps" not in line


def test_an_unfaithful_legacy_export_says_why_the_legacy_exporter_ran(tmp_path) -> None:
    """When the graph the fallback wrote disagrees with torch, the error says that the legacy tracer
    wrote it, why the dynamo exporter did not, and what to do; it is the model's to change (Longformer's
    and LED's in-place slice writes), a UserError (exit 2), not a trtforge failure (exit 1, before)."""
    with pytest.raises(ExportError) as err:
        export_module(_DataDependentNoise(), torch.ones(2, 4), tmp_path)
    assert isinstance(err.value, UserError)
    text = str(err.value)
    assert "not faithful" in text and "legacy TorchScript exporter" in text
    assert "dynamo exporter failed" in text and "--exporter dynamo" in text


def test_dynamo_only_fails_clearly(tmp_path) -> None:
    with pytest.raises(ExportError, match="dynamo exporter failed"):
        export_module(_DataDependent(), torch.ones(2, 4), tmp_path, exporter="dynamo")


def data_dependent_factory():
    """`module:factory` for the CLI: a model the dynamo exporter refuses (a branch on a tensor's value)."""
    return _DataDependent(), (torch.ones(2, 4),)


def test_a_model_the_exporters_refuse_is_bad_input_and_a_bug_of_trtforges_is_not(
    tmp_path, monkeypatch, capsys
) -> None:
    """Before: a model every exporter tried refused (here --exporter dynamo and a branch on a tensor's
    value) was an ExportError, exit 1 as a trtforge failure. It is the model's to change: ModelNotExportable,
    a UserError, exit 2 with the one-line reason. An exporter failing in trtforge's own code is still a
    bug: raised as it is (not as the model's), exit 1 with its trace."""
    from trtforge.cli.main import main
    from trtforge.compiler import export
    from trtforge.errors import ModelNotExportable

    argv = ["compile", "tests.compiler.test_export:data_dependent_factory", "--exporter", "dynamo"]
    argv += ["-o", str(tmp_path / "m.engine"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: could not export _DataDependent to ONNX; dynamo exporter failed: " in err, err
    assert "Traceback" not in err and "internal error" not in err
    monkeypatch.setattr(export, "_dim_ident", None)  # a bug in trtforge's own exporter code
    with pytest.raises(TypeError, match="'NoneType' object is not callable") as raised:
        export_module(_Noisy(), torch.randn(3, 8), tmp_path, dynamic="batch", exporter="dynamo")
    assert not isinstance(raised.value, ModelNotExportable)
    assert main([*argv, "--dynamic", "batch"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error" in err and "TypeError" in err, err


class _Noisy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x))


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_export_runs_in_eval_mode_and_restores_mode(tmp_path, exporter: str) -> None:
    model = _Noisy().train()
    art = export_module(model, torch.randn(3, 8), tmp_path, exporter=exporter)
    assert model.training, "the caller's train mode is restored"
    ops = {n.op_type for n in onnx.load(str(art.path)).graph.node}
    assert "Dropout" not in ops or art.record.verified  # dropout must be inert: outputs matched torch eval


def test_export_restores_each_submodules_mode(tmp_path) -> None:
    # an eval-mode model in a wrapper left in train mode (nn.Module's default), as factories return
    # it: restoring with wrapper.train(True) turned the inner model's dropout on after the export
    inner = _Noisy().eval()
    wrapper = torch.nn.Sequential(inner)
    export_module(wrapper, torch.randn(3, 8), tmp_path, exporter="legacy")
    assert wrapper.training and not inner.training and not inner.drop.training
    x = torch.randn(3, 8)
    assert torch.equal(wrapper(x), inner.lin(x)), "the caller's model still runs without dropout"


def test_pt2_source(tmp_path) -> None:
    model = tiny_bert()
    feeds = bert_inputs(2, 8)
    ep = torch.export.export(model, (), kwargs=feeds)
    torch.export.save(ep, str(tmp_path / "bert.pt2"))
    art = from_pt2(tmp_path / "bert.pt2", tmp_path, output_names=OUTS)
    assert art.record.source_kind == "pt2" and art.record.verified
    assert art.record.input_names == list(BERT_INPUTS)


def test_factory_source(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_factories.py").write_text(
        "from tests.models import tiny_bert, bert_inputs\n"
        "def make():\n    return tiny_bert(), bert_inputs(2, 8)\n"
        "def broken():\n    raise RuntimeError('weights not found')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module, inputs = load_factory("my_factories:make")
    assert isinstance(module, torch.nn.Module) and set(inputs) == set(BERT_INPUTS)
    with pytest.raises(
        UserError, match="factory 'my_factories:broken' raised RuntimeError: weights not found"
    ):
        load_factory("my_factories:broken")
    with pytest.raises(UserError, match="has no callable 'nope'"):
        load_factory("my_factories:nope")
    with pytest.raises(UserError, match="cannot import module"):
        load_factory("no_such_module_xyz:make")


def test_onnx_source_and_corrupt_bytes(tmp_path) -> None:
    from tests.models import tiny_onnx

    art = from_onnx_file(tiny_onnx(tmp_path / "t.onnx"))
    assert art.record.source_kind == "onnx" and art.record.input_names == ["x"]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage-not-a-model" * 10)
    with pytest.raises(UserError, match="bad.onnx"):
        from_onnx_file(bad)


def test_external_data_model(tmp_path) -> None:
    """A model saved with external data (the >2 GB form) is accepted and checked by path."""
    from tests.models import tiny_onnx
    from trtforge.core.onnx_io import external_data_files, load_onnx, source_sha256

    m = onnx.load(str(tiny_onnx(tmp_path / "t.onnx")))
    onnx.save(
        m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data", size_threshold=0
    )
    assert external_data_files(tmp_path / "ext.onnx") == [tmp_path / "ext.onnx.data"]
    art = from_onnx_file(tmp_path / "ext.onnx")
    assert art.record.external_data
    assert len(load_onnx(tmp_path / "ext.onnx").graph.initializer) == 2
    before = source_sha256(tmp_path / "ext.onnx")
    (tmp_path / "ext.onnx.data").write_bytes(b"\0" * (tmp_path / "ext.onnx.data").stat().st_size)
    assert source_sha256(tmp_path / "ext.onnx") != before, "the hash covers the external weights"


def test_input_and_dynamic_spec_errors() -> None:
    model = tiny_bert()
    with pytest.raises(UserError, match="not torch.Tensors"):
        normalize_inputs(model, {"input_ids": [1, 2]})
    with pytest.raises(UserError, match="takes"):
        normalize_inputs(torch.nn.Linear(2, 2), (torch.ones(1, 2), torch.ones(1, 2)))
    feeds = bert_inputs(2, 4)
    with pytest.raises(UserError, match="dynamic axes name input 'ids'"):
        resolve_dynamic({"ids": {0: "batch"}}, feeds)
    with pytest.raises(UserError, match="out of range"):
        resolve_dynamic({"input_ids": {2: "x"}}, feeds)
    assert resolve_dynamic("batch", feeds)["attention_mask"] == {0: "batch"}
    # a positional name past every input's rank would make nothing dynamic: refused, naming it
    with pytest.raises(UserError, match=r"'hidden' \(axis 2\) lie past every input's rank"):
        resolve_dynamic("batch,seq,hidden", feeds)


class _ToComplex(torch.nn.Module):
    """Returns a complex tensor (before: exit 1, "ONNX Runtime shape (2, 4, 2) != torch shape (2, 4)")."""

    def forward(self, x):
        return torch.view_as_complex(x)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: (torch.nn.Linear(4, 3).half(), (torch.randn(2, 4).half(),)), r"has torch\.float16 weights"),
        (lambda: (torch.nn.Linear(4, 3).bfloat16(), (torch.randn(2, 4),)), r"has torch\.bfloat16 weights"),
        (
            lambda: (torch.nn.Linear(4, 3, device="meta"), (torch.randn(2, 4),)),
            r"tensors on the meta device \(no data\): parameter 'weight'",
        ),
        (lambda: (torch.nn.Linear(4, 3), (torch.randn(0, 4),)), r"'input' \(0, 4\) have a size-0 axis"),
        (
            lambda: (torch.nn.Identity(), (torch.randn(2, 4, dtype=torch.complex64),)),
            r"'input' \(torch\.complex64\) are complex; TensorRT has no complex types",
        ),
        (
            lambda: (_ToComplex(), (torch.randn(2, 4, 2),)),
            r"_ToComplex returns complex output\(s\) 'output_0' \(torch\.complex64\); .*view_as_real",
        ),
    ],
    ids=["fp16 weights", "bf16 weights", "meta weights", "size-0 example", "complex input", "complex output"],
)
def test_modules_the_exporters_cannot_check_are_user_errors(make, message, tmp_path) -> None:
    """Before: an ExportError or an ONNX Runtime NOT_IMPLEMENTED escaping as an internal error (exit 1)."""
    module, inputs = make()
    with pytest.raises(UserError, match=message):
        export_module(module, inputs, tmp_path)
    assert list(tmp_path.iterdir()) == []


class _KVCache:
    """Stands in for a transformers Cache object (DynamicCache, ...) in a model's outputs."""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (_KVCache(), r"type _KVCache, .* Hugging Face KV cache: set model\.config\.use_cache = False"),
        (3, r"output of type int, not a tensor, tuple or dict\. Wrap the model"),
    ],
    ids=["kv cache", "python int"],
)
def test_non_tensor_outputs_are_user_errors(extra, message, tmp_path) -> None:
    """Before: an ExportError (exit 1, 'internal') for a GPT2Model returning its DynamicCache."""

    class Returns(torch.nn.Module):
        def forward(self, x):
            return x * 2, extra

    with pytest.raises(UserError, match=message):
        export_module(Returns(), (torch.randn(2, 3),), tmp_path)


class _DictOut(torch.nn.Module):
    """Outputs a dict holding a tensor and a tuple, with a None left out (as HF ModelOutputs do)."""

    def __init__(self, key: str = "logits") -> None:
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)
        self.key = key

    def forward(self, x):
        y = self.lin(x)
        return {self.key: y, "unused": None, "parts": (y.relu(), y.sigmoid())}


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_dict_outputs_are_named_by_their_keys(tmp_path, exporter: str) -> None:
    art = export_module(_DictOut(), {"x": torch.randn(2, 5)}, tmp_path, dynamic="batch", exporter=exporter)
    assert art.record.output_names == ["logits", "parts.0", "parts.1"]
    assert [o.name for o in onnx.load(str(art.path)).graph.output] == ["logits", "parts.0", "parts.1"]
    assert art.record.verified


def test_hf_model_output_keys_name_the_outputs(tmp_path) -> None:
    art = export_module(tiny_bert(), bert_inputs(2, 8), tmp_path, dynamic="batch,seq")
    assert art.record.output_names == OUTS


def test_tuple_outputs_and_key_clashing_with_an_input_keep_positional_names(tmp_path) -> None:
    """A key that is also an input name would make two graph values one name: positional names instead."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    art = export_module(_DictOut(key="x"), {"x": torch.randn(2, 5)}, tmp_path / "a")
    assert art.record.output_names == ["output_0", "output_1", "output_2"]
    lin = torch.nn.Linear(5, 3)

    class Pair(torch.nn.Module):
        def forward(self, x):
            return lin(x), (lin(x).relu(),)

    art = export_module(Pair(), {"x": torch.randn(2, 5)}, tmp_path / "b")
    assert art.record.output_names == ["output_0", "output_1"]


def test_export_failure_names_the_root_cause_without_colour_codes() -> None:
    # torch's dynamo ConversionError says which export step failed (in ANSI colour); the cause says why.
    from trtforge.compiler.export import export_failure

    class ConversionError(RuntimeError):
        pass

    try:
        try:
            raise ValueError("Cannot view a tensor with shape [s43, s53, 2, 16] as (s43, s53, 32)!")
        except ValueError as inner:
            message = "Failed to decompose. \x1b[96mThis is step 2/3\x1b[0m.\nNext steps: ..."
            raise ConversionError(message) from inner
    except ConversionError as e:
        line = export_failure(e)
    assert "\x1b" not in line and "Next steps" not in line
    assert line.startswith("ConversionError: Failed to decompose. This is step 2/3.")
    assert "(caused by ValueError: Cannot view a tensor" in line
    assert export_failure(ValueError("plain")) == "ValueError: plain"


def test_dynamic_string_keeps_positions_of_empty_entries() -> None:
    # "batch,,height,width" on NCHW images: channels static; empty entries used to be dropped, which
    # named H "width" and left W static.
    import torch

    feeds = {"x": torch.zeros(2, 3, 32, 32)}
    assert resolve_dynamic("batch,,height,width", feeds) == {"x": {0: "batch", 2: "height", 3: "width"}}
    assert resolve_dynamic(["batch", "", "h"], feeds) == {"x": {0: "batch", 2: "h"}}
    assert resolve_dynamic("batch,seq,", {"ids": torch.zeros(2, 8)}) == {"ids": {0: "batch", 1: "seq"}}


def test_an_opset_the_dynamo_exporter_cannot_reach_falls_back_to_legacy(tmp_path, capfd) -> None:
    """Before: dynamo's version converter logged a traceback, kept opset 18 and the export went on as if
    --opset 7 had been honoured."""
    art = export_module(torch.nn.Linear(4, 3), (torch.zeros(2, 4),), tmp_path, opset=7)
    assert (art.record.opset, art.record.exporter) == (7, "legacy")
    assert "wrote opset 18, not the --opset 7 asked for" in art.record.fallback_reason
    assert "Traceback" not in "".join(capfd.readouterr())
    with pytest.raises(ExportError, match=r"dynamo exporter failed: .*not the --opset 7 asked for"):
        export_module(torch.nn.Linear(4, 3), (torch.zeros(2, 4),), tmp_path, opset=7, exporter="dynamo")


class _SpecializesSeq(torch.nn.Module):
    """Its code branches on the sequence length, so torch.export fixes that axis to the example's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[1] == 16 else x + 1


def test_a_dynamic_axis_the_model_specializes_is_refused_not_dropped(tmp_path) -> None:
    """Before: the dynamo exporter quietly wrote seq as the fixed size 16 and the export 'succeeded', so
    `compile --dynamic batch,seq` built an engine for length 16 only without a word."""
    x = (torch.randn(2, 16),)
    with pytest.raises(UserError) as e:
        export_module(_SpecializesSeq(), x, tmp_path, dynamic="batch,seq", exporter="dynamo")
    msg = str(e.value)
    assert "input 'x' axis 1 ('seq') fixed to 16" in msg and "--dynamic" in msg
    # batch alone stays dynamic and exports
    art = export_module(_SpecializesSeq(), x, tmp_path, dynamic="batch", exporter="dynamo")
    dims = onnx.load(str(art.path)).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_value == 16
