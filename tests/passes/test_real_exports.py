"""Coverage on real torch.onnx exports (dynamo and legacy) of tiny transformers with random weights."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest

from tests.passes.conftest import LAYERS
from trtforge.passes.pipeline import DEFAULT_PASSES, optimize_model
from trtforge.passes.verify import make_inputs

pytestmark = pytest.mark.slow
EXPORTERS = ["dynamo", "legacy"]


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _qkv_splits(model: onnx.ModelProto) -> int:
    producers = {o: n for n in model.graph.node for o in n.output}
    count = 0
    for n in model.graph.node:
        if n.op_type == "Split" and len(n.output) == 3:
            src = producers.get(n.input[0])
            while src is not None and src.op_type in ("Add", "Reshape"):
                src = producers.get(src.input[0])
            count += src is not None and src.op_type in ("MatMul", "Gemm")
    return count


def _max_rel_err(a: onnx.ModelProto, b: onnx.ModelProto) -> float:
    import onnx_ir as ir

    from trtforge.numerics.sessions import exact_session

    feeds = make_inputs(ir.serde.deserialize_model(a), seed=3)
    ref = exact_session(a).run(None, feeds)[0].astype(np.float64)
    got = exact_session(b).run(None, feeds)[0]
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("kind", ["bert", "gpt2", "vit"])
def test_every_block_fused(tiny_export, kind, exporter):
    original = tiny_export(kind, exporter)
    fused, ledger = optimize_model(original)
    ops = _ops(fused)
    assert ops["LayerNormalization"] == 2 * LAYERS + 1
    assert ops["Gelu"] == LAYERS
    assert ops["Attention"] == LAYERS
    assert _qkv_splits(fused) == LAYERS
    assert "Softmax" not in ops and "Erf" not in ops and "Tanh" not in ops
    assert ledger.opset_after == 23
    assert all(p.verification is not None for p in ledger.passes)
    assert _max_rel_err(original, fused) < 1e-4


def test_gpt2_without_padding_mask_becomes_is_causal(tiny_export):
    # dynamo only: the legacy exporter cannot export transformers 5's mask-free GPT-2 (aten::diff).
    fused, _ = optimize_model(tiny_export("gpt2_nomask", "dynamo"))
    atts = [n for n in fused.graph.node if n.op_type == "Attention"]
    assert len(atts) == LAYERS
    for node in atts:
        assert {a.name: a.i for a in node.attribute}.get("is_causal") == 1
        assert len(node.input) == 3


def test_gpt2_with_padding_keeps_mask_as_attn_mask(tiny_export):
    fused, _ = optimize_model(tiny_export("gpt2", "dynamo"))
    for node in (n for n in fused.graph.node if n.op_type == "Attention"):
        assert len(node.input) == 4 and node.input[3]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_plugin_strategy_on_real_exports(tiny_export, exporter):
    module = pytest.importorskip(
        "trtforge.plugins.attention.onnx_node", reason="attention plugin module absent"
    )
    fused, ledger = optimize_model(tiny_export("gpt2", exporter), attention="plugin")
    nodes = [n for n in fused.graph.node if n.domain == module.DOMAIN]
    assert len(nodes) == LAYERS
    assert "Attention" not in _ops(fused)
    assert fused.functions, "the reference function must be in the model so ORT can run it"
    att = next(p for p in ledger.passes if p.name == "attention")
    assert att.matches == LAYERS and att.verification is not None


def test_ledger_is_json(tiny_export):
    import json

    _, ledger = optimize_model(tiny_export("bert", "dynamo"), debug=True)
    d = json.loads(json.dumps(ledger.to_dict()))
    names = [p["name"] for p in d["passes"]]
    assert names == ["opset", *DEFAULT_PASSES]
    att = d["passes"][names.index("attention")]
    assert att["matches"] == LAYERS and att["verification"]["max_rel_error"] < 1e-4
    assert att["nodes_after"] < att["nodes_before"]
    assert d["opset_change"] == {"from": 20, "to": 23}
    assert isinstance(d["passes"][names.index("layernorm")]["rejected"], list)


@pytest.mark.trt_build
def test_fp16_fused_bert_builds_with_attention_layers(tiny_export):
    """FP16 copy of the fused BertModel -> TensorRT(-RTX) network with IAttention per block, and a plan."""
    from tests.passes._fp16 import cast_model_fp16
    from trtforge.core.backend import get_backend

    fused, _ = optimize_model(tiny_export("bert64", "dynamo"))
    model16 = cast_model_fp16(fused)
    backend = get_backend()
    trt = backend.trt
    builder = backend.create_builder()
    network = backend.create_network(builder)
    parser = backend.create_parser(network)
    assert parser.parse(model16.SerializeToString()), [
        parser.get_error(i).desc() for i in range(parser.num_errors)
    ]
    types = collections.Counter(network.get_layer(i).type for i in range(network.num_layers))
    assert types[trt.LayerType.ATTENTION_OUTPUT] == LAYERS
    assert types[trt.LayerType.NORMALIZATION] == 2 * LAYERS + 1
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        profile.set_shape(network.get_input(i).name, (1, 1), (2, 16), (4, 64))
    config.add_optimization_profile(profile)
    backend.set_build_targets(config, None)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 0
