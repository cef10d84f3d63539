"""The fusion passes on real exports of common encoder architectures (tiny random-weight configs,
`_zoo.py`): every pass verified by ONNX Runtime, and the blocks each architecture has fused.

Not fused on purpose (noted, not failures): CLIP's quick_gelu (x * sigmoid(1.702 x)), MobileBERT's
NoNorm and ReLU. DeBERTa-v2's attention (heads folded into the batch: rank-3 bmm, Where-masked) fuses
through the folded-heads rule (`tests/passes/test_folded_attention.py`).
"""

from __future__ import annotations

import collections

import pytest

from tests.passes._zoo import ZOO
from trtforge.compiler.export import export_module
from trtforge.passes.pipeline import optimize_model

pytestmark = pytest.mark.slow

# Op counts after the passes (legacy exporter; the dynamo exports below fuse to the same counts).
EXPECTED: dict[str, dict[str, int]] = {
    "distilbert": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "albert": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "electra": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "deberta_v2": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "mpnet": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "xlm_roberta": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "mobilebert": {"Attention": 2, "Split": 4},
    "modernbert": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "RotaryEmbedding": 4},
    "sentence_embedding": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "clip_text": {"LayerNormalization": 5, "Attention": 2, "Split": 2},
    "siglip_text": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "t5_encoder": {"RMSNormalization": 5, "Attention": 2, "Split": 2},
    "bart_encoder": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "marian_encoder": {"LayerNormalization": 4, "Gelu": 2, "Attention": 2, "Split": 2},
    "deit": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "dinov2": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "beit": {"LayerNormalization": 4, "Gelu": 2, "Attention": 2, "Split": 2},
    "clip_vision": {"LayerNormalization": 5, "Attention": 2, "Split": 2},
    "siglip_vision": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "swin": {"LayerNormalization": 6, "Gelu": 2, "Attention": 2, "Split": 2},
    "segformer": {"LayerNormalization": 9, "Gelu": 2, "Attention": 2, "Split": 2},
    "convnext": {"LayerNormalization": 4, "Gelu": 2},
    "resnet": {},
    "mobilevit": {"LayerNormalization": 21, "Attention": 9, "Split": 9},
    "audio_spectrogram": {"LayerNormalization": 5, "Gelu": 2, "Attention": 2, "Split": 2},
    "whisper_encoder": {"LayerNormalization": 5, "Gelu": 4, "Attention": 2, "Split": 2},
    "wav2vec2": {"LayerNormalization": 6, "Gelu": 5, "Attention": 2, "Split": 2},
}
# The dynamo exporter too, where its graph differs in what the passes match (torch 2.13 cannot
# export T5, Swin or BEiT with dynamic shapes: "Cannot view a tensor ..."; `auto` falls back to legacy).
DYNAMO = ["mpnet", "modernbert", "distilbert", "whisper_encoder", "wav2vec2", "segformer"]


def _fuse(name: str, exporter: str, tmp_path):
    module, inputs, dynamic = ZOO[name]()
    art = export_module(module, inputs, tmp_path, dynamic=dynamic, exporter=exporter)
    named = inputs.items() if isinstance(inputs, dict) else zip(art.record.input_names, inputs)
    fused, ledger = optimize_model(art.load(), feed_shapes={k: list(v.shape) for k, v in named})
    return fused, ledger


@pytest.mark.parametrize(
    ("name", "exporter"), [(n, "legacy") for n in EXPECTED] + [(n, "dynamo") for n in DYNAMO]
)
def test_zoo_architecture_fuses_and_verifies(name, exporter, tmp_path):
    fused, ledger = _fuse(name, exporter, tmp_path)
    assert all(p.verification is not None for p in ledger.passes), "every pass verified by ONNX Runtime"
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    assert {k: ops[k] for k in EXPECTED[name]} == EXPECTED[name]
    if EXPECTED[name].get("Attention"):
        assert "Softmax" not in ops


def test_sliding_window_mask_stays_a_mask(tmp_path):
    # causal + window, no padding input: is_causal=1 would drop the window (verification at 7
    # positions sees a window of 4; a model's real window of 4096 it would not)
    fused, _ = _fuse("mistral_sliding_window", "dynamo", tmp_path)
    att = next(n for n in fused.graph.node if n.op_type == "Attention")
    assert len(att.input) == 4 and "is_causal" not in {a.name for a in att.attribute}
