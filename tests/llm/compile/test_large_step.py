"""compile --generate of a step graph past protobuf's 2 GB: every stage (the export's check and ORT
comparison, the passes, SmoothQuant / FP8 / INT4 Q/DQ, the FP16 conversion, the save) takes the large
graph as a file with external data and never serialises it whole. Fast: the limit brought down to a tiny
model's size (tests/large_models.py); the real > 2 GB run is `test_a_real_step_graph_past_2_gb` (opt-in,
``--large-models``)."""

from __future__ import annotations

import os
import resource
import time

import pytest

import trtforge
import trtforge.llm
from tests.large_models import protobuf_limit
from tests.llm.tiny_models import prompts, tiny_model
from trtforge.core import onnx_io

# bytes of weights: the tiny Llama's FP32 step graph holds 450 kB of them and 35 kB of graph besides (its FP16
# graph: 225 kB), within the 100 kB of room left for the graph
LIMIT = 150_000
OPTIONS = {"max_seq": 64, "max_batch": 4, "max_prefill": 32, "exporter": "legacy", "progress": False}
NEW = 8


def _greedy(model, path, precision, batch, **kw):
    """Compile the step graph to `path` and decode `batch` greedily on it (ONNX Runtime)."""
    trtforge.compile(
        model, None, generate=True, build=False, save_onnx=path, precision=precision, **OPTIONS, **kw
    )
    with trtforge.llm.load(path, num_blocks=48) as llm:
        return llm.generate(batch, max_new_tokens=NEW, stop_at_eos=False)


@pytest.mark.parametrize(
    ("precision", "layout"),
    [("fp16", "slot"), ("fp16", "paged"), ("int8", "slot"), ("fp8", "slot"), ("int4", "slot")],
)
def test_a_large_step_graph_compiles_through_every_stage(precision, layout, tmp_path, monkeypatch):
    """Before: the export's onnx.checker on the in-memory graph refused it ("too large, call check_model
    with model path"), which compile reported as a model it cannot export (exit 2); past that, every
    ONNX Runtime session (the export's comparison with torch, the passes' check, calibration, the FP16
    conversion's observation, the quantized graphs' accuracy check) serialised it, as did shape inference
    and the checker of the precision stages."""
    model = tiny_model("llama")
    batch = prompts(model.config.vocab_size)
    kw = {"cache_layout": layout}
    if precision in ("int8", "fp8"):
        kw["calib_prompts"] = prompts(model.config.vocab_size, lens=(5, 9, 17, 3), seed=5)
    want = _greedy(model, tmp_path / "small.onnx", precision, batch, **kw)
    protobuf_limit(monkeypatch, LIMIT, room=100_000)
    out = tmp_path / "large.onnx"
    assert _greedy(model, out, precision, batch, **kw) == want
    if precision == "fp16":  # (INT8's 1-byte weights end below the threshold: one file)
        assert onnx_io.external_data_files(out) == [tmp_path / "large.onnx.data"]


def big_llama():
    """A random-weight Llama of 2.2 GB of FP32 weights (32000 x 2048, 10 layers), past protobuf's 2 GB:
    a factory, as `compile MODULE:FACTORY` takes it, so that the loaded model is compile's own."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=10,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval(), {}


@pytest.mark.large_model
def test_a_real_step_graph_past_2_gb(tmp_path):
    """compile --generate of a Llama whose FP32 step graph holds 2.3 GB of weights, to its FP16 step graph
    (the dynamo exporter first, as `compile` does). Before: exit 2, "could not export the step graph ...
    This protobuf of onnx model is too large (>2GiB)", after 3-4 min and 15.5 GB of peak memory. Now every
    stage runs on it (the FP32 graphs past 2 GB as files with external data), and the FP16 graph decodes
    in ONNX Runtime."""
    out = tmp_path / "step.onnx"
    t0 = time.perf_counter()
    result = trtforge.compile(
        f"{__name__}:big_llama",
        None,
        generate=True,
        build=False,
        save_onnx=out,
        precision="fp16",
        max_seq=64,
        max_batch=2,
        progress=False,
    )
    seconds = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"compile --generate of the 2.3 GB step graph: {seconds:.0f} s, peak RSS {peak_gb:.1f} GB")
    # (the FP16 graph holds half the FP32 weights: 1.16 GB, under EXTERNAL_DATA_THRESHOLD, so one file)
    assert os.path.getsize(out) > 1.1e9 and onnx_io.external_data_files(out) == []
    onnx_io.check_model(out, where="the saved step graph")
    assert result.records["passes"]["step_check_max_abs_error"] <= 1e-4
    with trtforge.llm.load(out, num_blocks=16) as llm:
        (tokens,) = llm.generate([[1, 15, 27]], max_new_tokens=2, stop_at_eos=False)
    assert len(tokens) == 2 and all(0 <= t < 32000 for t in tokens)
