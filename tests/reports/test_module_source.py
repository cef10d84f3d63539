"""A torch module as the source: torch eager reference, ONNX Runtime FP32/fused/FP16/INT8, TensorRT rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.models import BERT_INPUTS, bert_inputs, tiny_bert
from trtforge.reports.api import build_report
from trtforge.reports.results import SCHEMA_FILE

pytestmark = pytest.mark.slow  # exports, fuses, converts and calibrates a tiny BERT: ~15-30 s on 2 cores


def _wrapped_bert():
    """Tiny BertModel returning plain tensors (last_hidden_state, pooler_output)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state, out.pooler_output

    return Wrapped(tiny_bert()).eval()


@pytest.fixture(scope="module")
def bert_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    module = _wrapped_bert()
    example = bert_inputs(2, 16)
    result = build_report(
        (module, example),
        out_dir=d / "out",
        batch_sizes=(1, 4),
        seq_lens=(16,),
        warmup=1,
        runs=2,
        progress=False,
        output_names=["hidden", "pooled"],
        threads=1,
    )
    return result, json.loads(result.json_path.read_text())


def test_every_target_has_a_row(bert_report):
    _, doc = bert_report
    status = {t["name"]: t["status"] for t in doc["targets"]}
    assert list(status) == [
        "torch",
        "ort",
        "ort-fused",
        "ort-fp16",
        "ort-int8",
        "trt",
        "trt-fp16",
        "trt-int8",
    ]
    for name in ("torch", "ort", "ort-fused", "ort-fp16", "ort-int8"):
        assert status[name] == "ok", next(t["reason"] for t in doc["targets"] if t["name"] == name)
    for t in doc["targets"]:
        if t["kind"] == "tensorrt" and t["status"] != "ok":
            assert t["reason"], t
    assert doc["reference"] == "torch"


def test_fp32_variants_match_torch_and_reduced_precisions_are_close(bert_report):
    _, doc = bert_report
    rows = {(r["target"], r["output"]): r for r in doc["accuracy"] if r["status"] == "ok"}
    for target in ("ort", "ort-fused"):
        for out in ("hidden", "pooled"):
            assert rows[(target, out)]["passed"] is True, rows[(target, out)]["checks"]
            assert rows[(target, out)]["max_abs"] < 1e-4
    assert rows[("ort-fp16", "hidden")]["cosine"] > 0.999
    assert rows[("ort-int8", "hidden")]["cosine"] > 0.9
    # pooled [batch, 32] is rank 2: top-1/top-5 agreement is reported for it
    assert rows[("ort", "pooled")]["top1"] == 1.0


def test_records_threads_and_derivation(bert_report):
    result, doc = bert_report
    targets = {t["name"]: t for t in doc["targets"]}
    assert targets["ort-fused"]["derived_from"] == "ort" and targets["ort-fused"]["records"]["passes"]
    assert (
        targets["ort-int8"]["derived_from"] == "ort-fused@native"
    )  # INT8 with an FP16 rest: native attention
    assert targets["ort-int8"]["records"]["calibration"]["data"] == "generated random inputs"
    assert targets["ort"]["threads"]["onnxruntime_intra_op_num_threads"] == 1
    assert targets["torch"]["threads"]["torch_num_threads"] == 1
    assert any("INT8 was calibrated on generated random inputs" in n for n in doc["notes"])
    ids = result.runs["torch"].outputs[0]
    assert set(ids) == {"hidden", "pooled"}
    feeds_shape = doc["settings"]["accuracy_input_shapes"][0]
    assert set(feeds_shape) == set(BERT_INPUTS) and feeds_shape["input_ids"] == [4, 16]


def test_json_valid(bert_report):
    jsonschema = pytest.importorskip("jsonschema")
    _, doc = bert_report
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))
    assert np.isfinite([p["p50_ms"] for p in doc["latency"] if p["status"] == "ok"]).all()


def test_a_module_fixing_its_sequence_length_still_reports(tmp_path):
    """report guesses batch,seq for token inputs; a model whose code fixes seq (Funnel) exported with seq
    fixed and reported. The export's check of asked-for dynamic axes (compile --dynamic) must not turn
    that guess into a failure: every target failed with "the export fixed axes asked to be dynamic"."""
    import torch

    class FixesSeq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(32, 8)

        def forward(self, input_ids):
            h = self.emb(input_ids)
            return h * 2 if input_ids.shape[1] == 8 else h

    ids = torch.randint(0, 32, (2, 8))
    result = build_report(
        (FixesSeq().eval(), (ids,)),
        targets=["torch", "ort"],
        out_dir=tmp_path / "rep",
        batch_sizes=(2,),
        seq_lens=(8,),
        warmup=0,
        runs=1,
        progress=False,
    )
    doc = json.loads(result.json_path.read_text())
    rows = {t["name"]: (t["status"], t.get("reason")) for t in doc["targets"]}
    assert {name: status for name, (status, _) in rows.items()} == {"torch": "ok", "ort": "ok"}, rows
