"""Accuracy numbers recomputed independently: the two models' outputs and every metric in numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.reports._tiny import classifier_onnx, classifier_weights, inputs_npz
from trtforge.errors import UserError
from trtforge.reports.api import build_report
from trtforge.reports.compare import parse_tolerance, resolve_tolerance
from trtforge.reports.results import Tolerance

NOISE = 0.3


@pytest.fixture(scope="module")
def pair_report(tmp_path_factory):
    """Reference model A and a perturbed copy B (as an onnx= target), on 12 user samples."""
    d = tmp_path_factory.mktemp("acc")
    wa, ba = classifier_weights(0)
    wb, bb = classifier_weights(7, noise=NOISE)
    a = classifier_onnx(d / "a.onnx", wa, ba)
    b = classifier_onnx(d / "b.onnx", wb, bb)
    x = inputs_npz(d / "x.npz", samples=12)
    target = f"onnx={b}"
    result = build_report(
        str(a),
        targets=["ort", target],
        reference="ort",
        data=str(d / "x.npz"),
        out_dir=d / "out",
        batch_sizes=(1, 4),
        warmup=1,
        runs=3,
        tolerances={"": {"atol": 0.5, "rtol": 0.0, "min_cosine": 0.9, "min_snr_db": 10.0}},
        progress=False,
    )
    ref = x.astype(np.float64) @ wa.astype(np.float64) + ba
    tgt = x.astype(np.float64) @ wb.astype(np.float64) + bb
    return result, json.loads(result.json_path.read_text()), ref, tgt, target


def _row(doc, target):
    rows = [r for r in doc["accuracy"] if r["target"] == target]
    assert len(rows) == 1, rows
    return rows[0]


def test_metrics_match_numpy(pair_report):
    _, doc, ref, tgt, target = pair_report
    row = _row(doc, target)
    assert row["status"] == "ok" and row["output"] == "logits" and row["elements"] == ref.size
    diff = np.abs(tgt - ref)
    rel = diff / np.abs(ref)
    expected = {
        "max_abs": diff.max(),
        "mean_abs": diff.mean(),
        "max_rel": rel.max(),
        "mean_rel": rel.mean(),
        "rel_l2": np.linalg.norm(tgt - ref) / np.linalg.norm(ref),
        "cosine": (tgt * ref).sum() / np.linalg.norm(tgt) / np.linalg.norm(ref),
        "min_row_cosine": (
            (tgt * ref).sum(1) / np.linalg.norm(tgt, axis=1) / np.linalg.norm(ref, axis=1)
        ).min(),
        "snr_db": 10 * np.log10((ref**2).mean() / ((tgt - ref) ** 2).mean()),
    }
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    top1 = np.mean(tgt.argmax(1) == ref.argmax(1))
    top5 = np.mean([ref.argmax(1)[i] in np.argsort(-tgt[i])[:5] for i in range(len(ref))])
    assert 0 < top1 < 1, "the perturbation should flip some argmaxes, or the check is vacuous"
    assert row["top1"] == pytest.approx(top1)
    assert row["top5"] == pytest.approx(top5)


def test_pass_fail_matches_numpy(pair_report):
    _, doc, ref, tgt, target = pair_report
    row = _row(doc, target)
    diff = np.abs(tgt - ref)
    cos = (tgt * ref).sum() / np.linalg.norm(tgt) / np.linalg.norm(ref)
    snr = 10 * np.log10((ref**2).mean() / (diff**2).mean())
    checks = {c["name"]: c["passed"] for c in row["checks"]}
    assert checks == {
        "elementwise": bool((diff <= 0.5).all()),
        "cosine": bool(cos >= 0.9),
        "snr": bool(snr >= 10),
    }
    assert row["passed"] == all(checks.values())


def test_histogram_counts_every_element(pair_report):
    _, doc, ref, tgt, target = pair_report
    h = _row(doc, target)["histogram"]
    assert sum(h["counts"]) + h["zeros"] == ref.size
    assert len(h["edges"]) == len(h["counts"]) + 1
    assert h["edges"][-1] == pytest.approx(np.abs(tgt - ref).max(), rel=1e-4)


def test_in_memory_results_are_what_was_rendered(pair_report):
    result, doc, ref, _, target = pair_report
    mem = next(r for r in result.report.accuracy if r.target == target)
    assert mem.max_abs == _row(doc, target)["max_abs"]
    outputs = result.runs["ort"].outputs
    assert [o["logits"].shape[0] for o in outputs] == [8, 4]  # the .npz split into batches of 8
    np.testing.assert_allclose(np.concatenate([o["logits"] for o in outputs]), ref, rtol=1e-5, atol=1e-5)


def test_tolerance_resolution_order():
    over = {"": {"atol": 1.0}, "logits": {"rtol": 0.5}, "t/": {"min_cosine": 0.5}, "t/logits": {"atol": 2.0}}
    tol = resolve_tolerance("t", "logits", "fp16", over)
    assert (tol.atol, tol.rtol, tol.min_cosine) == (2.0, 0.5, 0.5)
    assert tol.min_snr_db == 30.0  # the fp16 default survives
    assert resolve_tolerance("u", "other", "fp32", {"": Tolerance(min_top1=0.9)}) == Tolerance(min_top1=0.9)
    with pytest.raises(UserError, match="unknown field"):
        resolve_tolerance("t", "o", "fp32", {"": {"cos": 1}})


def test_parse_tolerance():
    assert parse_tolerance("ort-int8/logits:cosine=0.99,atol=none") == (
        "ort-int8/logits",
        {"min_cosine": 0.99, "atol": None},
    )
    assert parse_tolerance(":snr=20") == ("", {"min_snr_db": 20.0})
    with pytest.raises(UserError, match="bad item"):
        parse_tolerance("logits:speed=1")


def test_padding_positions_are_left_out(tmp_path):
    """Token outputs [batch, seq, ...] are compared on real tokens only when a padding mask is fed."""
    from trtforge.reports.compare import compare_target
    from trtforge.reports.results import TargetRun

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 5, 3))
    tgt = ref.copy()
    tgt[1, 3:] += 100.0  # garbage only at padded positions
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    r, t = TargetRun("ref", [{"y": ref}]), TargetRun("t", [{"y": tgt}])
    (row,) = compare_target(r, t, "fp32", masks=[mask])
    assert row.padding_excluded == 2 and row.elements == 8 * 3
    assert row.max_abs == 0.0 and row.passed is True
    (row,) = compare_target(r, t, "fp32", masks=None)
    assert row.padding_excluded is None and row.max_abs == pytest.approx(100.0) and row.passed is False


@pytest.mark.parametrize("broken", ["missing", "shape"])
def test_an_output_a_target_cannot_match_fails_the_check(broken):
    """A target that lacks an output, or gives it in another shape, fails the report and `--check`, even
    when its other outputs match (it used to count as 'not compared', and --check passed)."""
    from trtforge.cli.report_cmd import _failures
    from trtforge.reports.compare import compare_target
    from trtforge.reports.results import Report, TargetRun

    y, z = np.ones((2, 3)), np.zeros((2, 4))
    tgt = {"y": y} if broken == "missing" else {"y": y, "z": np.zeros((4, 2))}
    rows = compare_target(TargetRun("ref", [{"y": y, "z": z}]), TargetRun("t", [tgt]), "fp32")
    assert [(r.output, r.status) for r in rows] == [("y", "ok"), ("z", "failed")]
    report = Report("r", "now", {}, "ref", {}, {}, [], rows, [])
    s = report.summary()
    assert (s["accuracy_passed"], s["accuracy_failed"], s["accuracy_not_compared"]) == (1, 1, 0)
    assert s["all_passed"] is False
    (problem,) = _failures(report)
    assert "1 output(s)" in problem and "t/z" in problem and rows[1].reason in problem


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_nan_and_inf_the_target_reproduces_pass_and_others_fail(precision):
    """Before: an output whose reference holds NaN or inf (log of a negative, x / 0) failed every target,
    even one that reproduced it bit for bit: cosine 0, SNR -inf, no reason given."""
    import jsonschema

    from trtforge.reports.compare import compare_target
    from trtforge.reports.results import SCHEMA_FILE, Report, TargetRun

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 6)).astype(np.float32)
    ref[0, 0], ref[1, 2], ref[2, 3] = np.nan, np.inf, -np.inf
    same = ref.copy()
    same[3] += 1e-6  # the finite elements still differ a little
    (row,) = compare_target(TargetRun("ref", [{"y": ref}]), TargetRun("t", [{"y": same}]), precision)
    assert row.passed is True, row.checks
    assert row.cosine == pytest.approx(1.0) and np.isfinite(row.snr_db) and row.max_abs < 1e-5
    assert "3 NaN/inf element(s) of the reference reproduced exactly" in row.reason
    for broken in ((0, 0, 1.0), (1, 2, -np.inf), (3, 3, np.nan)):
        tgt = same.copy()
        tgt[broken[:2]] = broken[2]
        (row,) = compare_target(TargetRun("ref", [{"y": ref}]), TargetRun("t", [{"y": tgt}]), precision)
        assert row.passed is False and [c.name for c in row.checks if not c.passed][-1] == "non-finite"
        assert row.reason.startswith("1 element(s) NaN/inf in only one of target and reference")
    schema = json.loads(SCHEMA_FILE.read_text())
    row_schema = {**schema["$defs"]["accuracy_row"], "$defs": schema["$defs"]}
    jsonschema.validate(
        Report("r", "now", {}, "ref", {}, {}, [], [row], []).to_dict()["accuracy"][0], row_schema
    )


def test_an_empty_output_is_not_compared_and_a_check_of_only_that_fails():
    """Before: an output with no elements (an empty axis) PASSED every check (cosine 1, no errors), so
    --check passed a report that had compared nothing."""
    from trtforge.cli.report_cmd import _failures
    from trtforge.reports.compare import compare_target
    from trtforge.reports.results import Report, TargetInfo, TargetRun

    ref = TargetRun("ort", [{"e": np.zeros((8, 0), np.float32), "y": np.ones((2, 3))}])
    tgt = TargetRun("t", [{"e": np.zeros((8, 0), np.float32), "y": np.ones((2, 3))}])
    rows = compare_target(ref, tgt, "fp32")
    assert [(r.output, r.status, r.passed) for r in rows] == [("e", "not_compared", None), ("y", "ok", True)]
    assert rows[0].reason == "no elements to compare (shape [8, 0])"
    targets = [TargetInfo(n, "onnxruntime", "fp32", "cpu", "") for n in ("ort", "t")]
    assert _failures(Report("r", "now", {}, "ort", {}, {}, targets, rows, [])) == []
    only_empty = Report("r", "now", {}, "ort", {}, {}, targets, rows[:1], [])
    (problem,) = _failures(only_empty)
    assert "nothing was compared with the reference 'ort'" in problem and "no elements to compare" in problem
