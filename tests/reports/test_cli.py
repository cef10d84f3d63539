"""`trtforge report` from the command line: files written, bad input -> exit 2, --check -> exit 3."""

from __future__ import annotations

import json
import os

import pytest

from tests.reports._tiny import by_fours_onnx, classifier_onnx, classifier_weights, inputs_npz
from trtforge.cli.main import main

FAST = ["--batch", "1,2", "--warmup", "0", "--runs", "2", "--no-progress"]


@pytest.fixture
def models(tmp_path):
    wa, ba = classifier_weights(0)
    wb, bb = classifier_weights(3, noise=0.3)
    inputs_npz(tmp_path / "x.npz")
    return classifier_onnx(tmp_path / "a.onnx", wa, ba), classifier_onnx(tmp_path / "b.onnx", wb, bb)


def _run(argv, capsys):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def test_report_writes_three_files(tmp_path, models, capsys):
    a, b = models
    out = tmp_path / "out"
    argv = ["report", str(a), "-o", str(out), "--targets", f"ort,onnx={b}", "--data", str(tmp_path / "x.npz")]
    rc, text = _run([*argv, "--tolerance", ":cosine=0.5,atol=none,rtol=none", *FAST], capsys)
    assert rc == 0, text
    assert {p.name for p in out.iterdir()} == {"report.html", "report.md", "report.json"}
    assert str(out / "report.html") in text and "accuracy vs ort: 1 passed" in text
    doc = json.loads((out / "report.json").read_text())
    assert doc["settings"]["batch_sizes"] == [1, 2] and doc["settings"]["runs"] == 2
    assert doc["accuracy"][0]["tolerance"]["min_cosine"] == 0.5


def test_check_exits_3_when_an_output_fails(tmp_path, models, capsys):
    a, b = models
    argv = ["report", str(a), "-o", str(tmp_path / "o"), "--targets", f"ort,onnx={b}", "--check", *FAST]
    rc, text = _run([*argv, "--tolerance", "logits:atol=1e-6,rtol=0"], capsys)
    assert rc == 3 and "accuracy check failed" in text
    assert (tmp_path / "o" / "report.html").is_file()  # the report is written before failing


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--targets", "ort,nope"], "unknown report target 'nope'"),
        (["--batch", "0"], "positive integers"),
        (["--tolerance", "logits"], "--tolerance 'logits'"),
        (["--targets", "onnx=/does/not/exist.onnx"], "does not exist"),
        (["--output-name", "y"], "--output-name only applies to a torch module source"),
        (["--int8-rest", "fp64"], "Invalid value for '--int8-rest'"),
        (["--tokenizer", "demo"], "--tokenizer (tokenizer=) 'demo' would not be used: it only tokenizes"),
    ],
)
def test_bad_options_exit_2(tmp_path, models, capsys, extra, message):
    a, _ = models
    rc, text = _run(["report", str(a), "-o", str(tmp_path / "o"), *FAST, *extra], capsys)
    assert rc == 2 and message in text
    assert not (tmp_path / "o").exists()


def test_missing_model_exits_2(tmp_path, capsys):
    rc, text = _run(["report", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o")], capsys)
    assert rc == 2 and "does not exist" in text


def test_help_lists_report(capsys):
    rc, text = _run(["--help"], capsys)
    assert rc == 0 and "report" in text
    rc, text = _run(["report", "--help"], capsys)
    assert rc == 0 and "--tolerance" in text and "onnx=PATH" in text


def test_factory_source_with_torch_reference(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["report", "tests.reports._tiny:mlp_factory", "-o", str(out), "--targets", "torch,ort,ort-fp16"]
    rc, text = _run([*argv, "--output-name", "logits", "--threads", "1", *FAST], capsys)
    assert rc == 0, text
    doc = json.loads((out / "report.json").read_text())
    assert doc["reference"] == "torch" and doc["source"]["kind"] == "module"
    assert [(r["target"], r["output"], r["passed"]) for r in doc["accuracy"]] == [
        ("ort", "logits", True),
        ("ort-fp16", "logits", True),
    ]
    assert doc["settings"]["threads"] == 1


def test_default_targets_leave_out_int8_when_nothing_quantizes(tmp_path, models, capsys):
    """The tiny classifier's one 16x10 MatMul is too small for INT8: by default that is a note, not a failure;
    named with --targets, ort-int8 still fails the report."""
    a, _ = models
    out = tmp_path / "out"
    rc, text = _run(["report", str(a), "-o", str(out), "--check", *FAST], capsys)
    assert rc == 0, text
    assert "note: ort-int8 and trt-int8 left out of the default targets: nothing to quantize" in text
    doc = json.loads((out / "report.json").read_text())
    assert "ort-fp16" in doc["settings"]["targets"]
    assert not {"ort-int8", "trt-int8"} & {*doc["settings"]["targets"], *(t["name"] for t in doc["targets"])}
    assert [n for n in doc["notes"] if "INT8" in n or "int8" in n] == [
        n for n in doc["notes"] if n.startswith("ort-int8 and trt-int8 left out")
    ]
    rc, text = _run(
        ["report", str(a), "-o", str(tmp_path / "o2"), "--targets", "ort,ort-int8", "--check", *FAST], capsys
    )
    assert rc == 3 and "target(s) failed: ort-int8" in text
    assert "left out" not in text


def _trt_cannot_run_here(model) -> str | None:
    from trtforge.reports.targets import cannot_run, load_source

    return cannot_run("trt", load_source(str(model)))


def test_a_reference_that_cannot_run_here_is_refused(tmp_path, models, capsys):
    """Before: --reference trt on a machine without a TensorRT runtime wrote a report comparing nothing
    and --check exited 0. Now it is refused up front (exit 2, no report), naming why and the targets
    that can be the reference here."""
    a, _ = models
    if _trt_cannot_run_here(a) is None:
        pytest.skip("TensorRT runs engines on this machine")
    out = tmp_path / "o"
    rc, text = _run(["report", str(a), "-o", str(out), "--reference", "trt", "--check", *FAST], capsys)
    assert rc == 2, text
    assert "--reference 'trt' cannot run here" in text and "cannot run engines here" in text
    assert "targets that can serve as the reference here: ort, ort-fused" in text
    assert "Traceback" not in text and not out.exists()


def test_a_torch_reference_for_an_onnx_source_is_refused(tmp_path, models, capsys):
    a, _ = models
    rc, text = _run(["report", str(a), "-o", str(tmp_path / "o"), "--reference", "torch-cuda", *FAST], capsys)
    assert rc == 2 and "--reference 'torch-cuda' cannot run here (the source is an onnx" in text, text
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("targets", "why"),
    [("ort", "it is the only target"), ("ort,torch-cuda", "torch-cuda: the source is an onnx")],
    ids=["reference alone", "the other target cannot run"],
)
def test_check_fails_when_nothing_was_compared(tmp_path, models, capsys, targets, why):
    """Before: a report whose reference was compared with no target passed --check (exit 0)."""
    a, _ = models
    argv = ["report", str(a), "-o", str(tmp_path / "o"), "--targets", targets, *FAST]
    rc, text = _run([*argv, "--check"], capsys)
    assert rc == 3, text
    assert "nothing was compared with the reference 'ort'" in text and why in text
    assert (tmp_path / "o" / "report.json").is_file()  # the report is written before failing
    rc, text = _run([*argv, "--no-check"], capsys)
    assert rc == 0, text


def test_default_reference_skips_a_target_that_cannot_run(tmp_path, models, capsys):
    """--targets trt,ort-fp16 (no torch/ort): the default reference is the first target that runs here."""
    a, _ = models
    if _trt_cannot_run_here(a) is None:
        pytest.skip("TensorRT runs engines on this machine")
    out = tmp_path / "o"
    argv = ["report", str(a), "-o", str(out), "--targets", "trt,ort-fp16", "--no-check", *FAST]
    rc, text = _run(argv, capsys)
    assert rc == 0, text
    assert json.loads((out / "report.json").read_text())["reference"] == "ort-fp16"


def _earlier_report(tmp_path, model, capsys):
    """A report directory from an earlier run, and its files' bytes."""
    out = tmp_path / "o"
    rc, text = _run(["report", str(model), "-o", str(out), "--targets", "ort,ort-fused", *FAST], capsys)
    assert rc == 0, text
    return out, {p.name: p.read_bytes() for p in out.iterdir()}


def _beside(out):
    """Hidden staging directories left beside the report directory."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".trtforge-"))


def test_a_new_report_replaces_the_earlier_directory_whole(tmp_path, models, capsys):
    """Before: the three files were replaced one by one inside the existing directory, so what an
    earlier run killed mid-write left there (its temp files) stayed beside the new report."""
    from trtforge._fileio import temp_name

    a, b = models
    out, _ = _earlier_report(tmp_path, a, capsys)
    (out / ".report.html.k1ll3d.tmp").write_text("half an html file")  # SIGKILL during a write
    temp_name(out, "new").mkdir()  # SIGKILL while staging the next one
    (temp_name(out, "new") / "report.json").write_text("{")
    argv = ["report", str(a), "-o", str(out), "--targets", f"ort,onnx={b}", "--no-check", *FAST]
    rc, text = _run(argv, capsys)
    assert rc == 0, text
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    assert json.loads((out / "report.json").read_text())["settings"]["targets"] == ["ort", f"onnx={b}"]
    assert _beside(out) == []


def test_a_run_that_fails_leaves_the_earlier_report_as_it_was(tmp_path, models, capsys, monkeypatch):
    """Before: --data the reference rejects (exit 2) overwrote the earlier report, then deleted the new
    files, leaving the directory empty; a failure while writing left the old report intact only while
    no file had been renamed yet."""
    import numpy as np

    a, _ = models
    out, before = _earlier_report(tmp_path, a, capsys)
    np.savez(tmp_path / "bad.npz", x=np.ones((2, 3), np.float32))  # 3 features, the model takes 16
    argv = ["report", str(a), "-o", str(out), "--targets", "ort,ort-fused", *FAST]
    rc, text = _run([*argv, "--data", str(tmp_path / "bad.npz")], capsys)
    assert rc == 2 and "does not fit the model" in text, text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    import trtforge.reports.render as render

    def broken(report):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(render, "render_html", broken)  # the last file's stage fails
    rc, text = _run(argv, capsys)
    assert rc != 0 and "rendering failed" in text, text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _beside(out) == []


@pytest.mark.parametrize("swap", ["exchange", "renames"])
def test_a_failed_swap_puts_the_earlier_report_back(tmp_path, models, capsys, monkeypatch, swap):
    """The new directory's rename onto -o fails after the old one was moved aside (a filesystem without
    the exchange): the old one returns. The exchange fails with an error that is no filesystem's lack of
    it (EIO): it is reported, not taken for a reason to fall back, and the old report stays."""
    import errno
    import os

    import trtforge._fileio as fileio
    from tests.test_directory_swap import two_renames_only

    a, _ = models
    out, before = _earlier_report(tmp_path, a, capsys)
    if swap == "exchange":

        def exchange(new, path):
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(fileio, "_rename_exchange", exchange)
    else:
        two_renames_only(monkeypatch)
        real = os.rename

        def rename(src, dst):
            if ".new" in os.path.basename(src) and str(dst) == str(out):
                raise OSError(errno.EIO, "I/O error")
            return real(src, dst)

        monkeypatch.setattr(fileio.os, "rename", rename)
    rc, text = _run(["report", str(a), "-o", str(out), "--targets", "ort,ort-fused", *FAST], capsys)
    assert rc != 0 and "I/O error" in text, text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _beside(out) == []


def test_a_directory_with_other_files_keeps_them(tmp_path, models, capsys):
    """-o naming a directory that holds more than a report (a build directory, `.`): only the report's
    own files are replaced; the others stay."""
    a, _ = models
    out, _ = _earlier_report(tmp_path, a, capsys)
    (out / "model.engine").write_bytes(b"keep me")
    leftover = out / ".report.md.k1ll3d_x.tmp"  # (a killed run's: mkstemp's name, unlocked, not new)
    leftover.write_text("an earlier run's leftover")
    os.utime(leftover, (leftover.stat().st_mtime - 60,) * 2)
    argv = ["report", str(a), "-o", str(out), "--targets", "ort,ort-fp16", *FAST]
    rc, text = _run(argv, capsys)
    assert rc == 0, text
    assert sorted(p.name for p in out.iterdir()) == [
        "model.engine",
        "report.html",
        "report.json",
        "report.md",
    ]
    assert (out / "model.engine").read_bytes() == b"keep me"
    assert json.loads((out / "report.json").read_text())["settings"]["targets"] == ["ort", "ort-fp16"]


def test_a_report_into_the_working_directory(tmp_path, models, capsys, monkeypatch):
    """-o . is written in place (the working directory is never swapped away under the process)."""
    a, _ = models
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    rc, text = _run(["report", str(a), "-o", ".", "--targets", "ort,ort-fused", *FAST], capsys)
    assert rc == 0, text
    assert sorted(p.name for p in here.iterdir()) == ["report.html", "report.json", "report.md"]
    assert _beside(here) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_report_directory_that_cannot_be_made_is_a_user_error(tmp_path, models, capsys):
    """Before: -o /proc/x (a place where mkdir fails with ENOENT, not a permission errno) was a
    FileNotFoundError traceback, 'internal error', exit 1, after every target had run."""
    a, _ = models
    rc, text = _run(["report", str(a), "-o", "/proc/trtforge-report", "--targets", "ort", *FAST], capsys)
    assert rc == 2, text
    assert "cannot create a directory in '/proc' for '/proc/trtforge-report'" in text
    assert "Traceback" not in text and "internal error" not in text


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["logits", "extra"], "--output-name (output_names): 2 name(s) ['logits', 'extra'] given for a"),
        (["input"], "which the model's inputs are also named"),
        ([" "], "has an empty name"),
    ],
)
def test_bad_output_names_are_bad_input(tmp_path, capsys, names, message):
    """Before: --output-name with the wrong count, an input's name or an empty name failed the export
    inside the report: every target's row said so, a report was written and the exit code was 3 (a
    failed check), not 2 (bad input)."""
    out = tmp_path / "o"
    argv = ["report", "tests.reports._tiny:mlp_factory", "-o", str(out), "--targets", "torch,ort", *FAST]
    rc, text = _run([*argv, *(a for n in names for a in ("--output-name", n))], capsys)
    assert rc == 2 and message in text, text
    assert not out.exists()


def test_repeated_tolerances_for_one_output_add_up(tmp_path, models, capsys):
    """Before: a second --tolerance for the same output replaced the first whole: its atol was silently
    dropped (the check ran with the default)."""
    a, b = models
    out = tmp_path / "o"
    argv = ["report", str(a), "-o", str(out), "--targets", f"ort,onnx={b}", "--no-check", *FAST]
    tols = ["--tolerance", "logits:atol=0.5", "--tolerance", "logits:cosine=0.9,rtol=0"]
    rc, text = _run([*argv, *tols], capsys)
    assert rc == 0, text
    tol = json.loads((out / "report.json").read_text())["accuracy"][0]["tolerance"]
    assert (tol["atol"], tol["rtol"], tol["min_cosine"]) == (0.5, 0.0, 0.9)


def test_onnx_targets_whose_paths_hold_commas(tmp_path, models, capsys):
    """Before: --targets was split at every comma, so onnx=runs,v2/b, final.onnx became the targets
    'onnx=runs' (no such file: exit 2), 'v2/b' and ' final.onnx'. A comma now separates targets only
    where a target name follows it; an onnx=PATH given alone is taken whole."""
    from trtforge.reports.targets import split_targets

    assert [n.strip() for n in split_targets(["ort, trt", "onnx=x.onnx,ort-fp16", "ort,,trt"])] == [
        *("ort", "trt", "onnx=x.onnx", "ort-fp16", "ort", "trt")
    ]
    a, b = models
    (tmp_path / "runs,v2").mkdir()
    c = tmp_path / "runs,v2" / "b, final.onnx"
    c.write_bytes(b.read_bytes())
    out = tmp_path / "o"
    argv = ["report", str(a), "-o", str(out), "--targets", f"ort,onnx={c},ort-fp16", "--no-check", *FAST]
    rc, text = _run(argv, capsys)
    assert rc == 0, text
    doc = json.loads((out / "report.json").read_text())
    assert doc["settings"]["targets"] == ["ort", f"onnx={c}", "ort-fp16"]
    d = tmp_path / "m,ort-fp16"  # what follows its comma is a target name: taken whole when given alone
    d.write_bytes(b.read_bytes())
    argv = ["report", str(a), "-o", str(out), "--targets", "ort", "--targets", f"onnx={d}", "--no-check"]
    rc, text = _run([*argv, *FAST], capsys)
    assert rc == 0, text
    assert json.loads((out / "report.json").read_text())["settings"]["targets"] == ["ort", f"onnx={d}"]


def test_calibration_data_that_does_not_fit_is_bad_input(tmp_path, models, capsys):
    """Before: --calibration-data of the wrong width failed only the ort-int8 row: a report was written and
    the exit code was 3 (a failed check), not 2 (bad input)."""
    import numpy as np

    from tests.reports._tiny import FEATURES

    a, _ = models
    np.savez(tmp_path / "cal.npz", x=np.ones((4, FEATURES + 1), np.float32))
    out = tmp_path / "o"
    argv = ["report", str(a), "-o", str(out), "--targets", "ort,ort-int8", *FAST]
    rc, text = _run([*argv, "--calibration-data", str(tmp_path / "cal.npz")], capsys)
    assert rc == 2 and f"input 'x' has size {FEATURES + 1} on axis 1" in text, text
    assert not out.exists()


def test_a_missing_model_path_with_a_colon_is_named_as_missing(tmp_path, capsys):
    """Before: a model path holding a colon ('runs:v1/model.onnx') that did not exist was imported as a
    module:factory: "cannot import module 'runs'", which hides the typo in the path."""
    missing = "runs:v1/model.onnx"
    rc, text = _run(["report", missing, "-o", str(tmp_path / "o"), "--no-progress"], capsys)
    assert rc == 2 and f"report source '{missing}' does not exist" in text, text


def test_check_fails_when_a_latency_point_fails(tmp_path, capsys):
    """Before: a runnable target that crashed at a latency point (here a length its Reshape cannot take)
    left a 'failed' row in the latency table, and --check exited 0: a CI gate passed a model that fails
    at a size it was asked to measure."""
    by_fours_onnx(tmp_path / "m.onnx")
    argv = ["report", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o"), "--targets", "ort,ort-fused"]
    argv += ["--batch", "2", "--seq", "8,6", "--warmup", "0", "--runs", "1", "--no-progress"]
    rc, text = _run(argv, capsys)
    assert rc == 3, text
    assert "latency point(s) failed: ort batch 2 seq 6, ort-fused batch 2 seq 6 (first: " in text
    assert "accuracy check failed" not in text  # the accuracy inputs (length 8) ran and matched
    rc, text = _run([*argv, "--no-check"], capsys)
    assert rc == 0, text


def test_a_torch_export_archive_is_refused_as_what_it_is(tmp_path, capsys):
    """Before: `trtforge report m.pt2` read the archive as an engine without its manifest ("'m.pt2' is a
    model, not an engine"); now it says report does not take torch.export archives, and what to pass."""
    (tmp_path / "m.pt2").write_bytes(b"PK\x03\x04")
    rc, text = _run(["report", str(tmp_path / "m.pt2"), "-o", str(tmp_path / "o"), "--no-progress"], capsys)
    assert rc == 2 and "is a torch.export archive, which report does not take" in " ".join(text.split()), text
