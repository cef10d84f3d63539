"""A model the exporters refuse is the user's to change: exit 2 with one paragraph naming the model and
the exporter's reason (ModelNotExportable), from report, from a .pt2 conversion and from a decoder's
step-graph export alike; an exporter failing in trtforge's own code stays a bug (exit 1, its trace)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtforge.cli.main import main
from trtforge.errors import ExportError, ModelNotExportable


class _Eigh(torch.nn.Module):
    """An op no exporter has an ONNX form for (torch.linalg.eigh)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigh(x @ x.T)[0]


class _DataDependentNoise(torch.nn.Module):
    """The dynamo exporter refuses the branch on a tensor's value; the legacy graph it falls back to
    disagrees with torch (fresh random numbers): not exportable faithfully."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x + torch.rand_like(x)
        return x


def eigh_factory():
    """`module:factory` for the CLI."""
    return _Eigh(), (torch.ones(4, 4),)


def noise_factory():
    return _DataDependentNoise(), (torch.ones(2, 4),)


def test_report_on_a_module_that_cannot_be_exported_is_bad_input(tmp_path: Path, capfd) -> None:
    """Before: every target "failed" on the export and the report exited 3 (a failed check), its files
    written. Now exit 2, one paragraph naming MODEL and why the export is refused, no report written."""
    spec = "tests.cli.test_export_refusals:noise_factory"
    out = tmp_path / "rep"
    assert main(["report", spec, "-o", str(out), "--no-progress"]) == 2
    text = "".join(capfd.readouterr())
    assert f"error: '{spec}': ONNX Runtime output 'output_0' differs from torch" in text, text
    assert "dynamo exporter failed" in text and "no report was written" in text, text
    assert "Traceback" not in text and "internal error" not in text, text
    assert not out.exists()


def test_a_failing_legacy_export_prints_no_torch_ir_graph(tmp_path: Path, capfd) -> None:
    """Before: the TorchScript exporter printed "Torch IR graph at exception: graph(...)" (the whole
    graph, to stdout) past run_quietly, above the error that says the same in one line."""
    argv = ["compile", "tests.cli.test_export_refusals:eigh_factory", "--exporter", "legacy"]
    assert main([*argv, "-o", str(tmp_path / "m.engine"), "--quiet"]) == 2
    out, err = capfd.readouterr()
    assert "error: could not export _Eigh to ONNX; legacy exporter failed: UnsupportedOperatorError" in err
    assert "Torch IR graph" not in out + err and "graph(" not in out + err, out + err


@pytest.fixture(scope="module")
def eigh_pt2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "eigh.pt2"
    module, inputs = eigh_factory()
    torch.export.save(torch.export.export(module, inputs), str(path))
    return path


def test_a_pt2_the_exporter_cannot_convert_is_bad_input(eigh_pt2: Path, tmp_path: Path, capfd) -> None:
    """Before: ExportError, exit 1 as a trtforge failure. Now ModelNotExportable, exit 2, naming the
    file and the op the exporter has no ONNX function for."""
    assert main(["compile", str(eigh_pt2), "-o", str(tmp_path / "m.engine"), "--quiet"]) == 2
    err = capfd.readouterr().err
    assert f"error: could not convert '{eigh_pt2}' to ONNX: ConversionError" in err, err
    assert "aten._linalg_eigh" in err and "Traceback" not in err, err


def test_a_pt2_conversion_failing_in_trtforges_code_stays_a_bug(
    eigh_pt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trtforge.compiler.sources import from_pt2

    monkeypatch.setattr(torch.onnx, "export", None)  # called in trtforge's own frame: its bug
    with pytest.raises(TypeError, match="'NoneType' object is not callable") as raised:
        from_pt2(eigh_pt2, tmp_path)
    assert not isinstance(raised.value, ModelNotExportable)


def _refuses(*_args) -> None:
    """An exporter refusing the model (raised outside trtforge's code, as torch's refusals are)."""
    raise torch.onnx.errors.UnsupportedOperatorError("aten::quux", 17, None)


def test_a_step_graph_the_exporters_refuse_is_bad_input(tmp_path: Path, monkeypatch) -> None:
    """Before: ExportError (exit 1, a trtforge failure) whatever refused. Now the model's
    (ModelNotExportable, exit 2) when both exporters refuse it, naming the model's class; a failure in
    trtforge's own code is raised as it is; ORT disagreeing with the graph stays an ExportError."""
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.compile import export

    model = tiny_model("llama")
    monkeypatch.setattr(export, "_dynamo", _refuses)
    monkeypatch.setattr(export, "_legacy", _refuses)
    with pytest.raises(ModelNotExportable, match=r"of LlamaForCausalLM; legacy exporter failed: Unsupported"):
        export.export_step(model, max_seq=16, max_batch=2, workdir=tmp_path)

    monkeypatch.setattr(export, "ops", None)  # trtforge's own code failing after an export: a bug
    monkeypatch.setattr(export, "_legacy", lambda *a: None)
    with pytest.raises(AttributeError) as raised:
        export.export_step(model, max_seq=16, max_batch=2, exporter="legacy", workdir=tmp_path)
    assert not isinstance(raised.value, ModelNotExportable)

    def disagrees(*_args) -> None:
        raise ExportError("ONNX Runtime disagrees with torch")

    monkeypatch.setattr(export, "_legacy", disagrees)
    with pytest.raises(ExportError) as raised:
        export.export_step(model, max_seq=16, max_batch=2, exporter="legacy", workdir=tmp_path)
    assert not isinstance(raised.value, ModelNotExportable)
