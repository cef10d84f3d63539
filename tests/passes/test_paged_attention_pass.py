"""The `paged` attention strategy: a paged step written in standard ONNX (ScatterND + Gather +
Attention, here the PagedAttention reference function inlined; pools [num_blocks, block_size, Hkv, D])
becomes one PagedAttention node, and ONNX Runtime gives the same outputs before and after (the pass
manager checks it, and so does this test on valid paged inputs). The decoder's own paged step graphs
are covered in tests/llm/compile/test_decoder_paged.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import onnx_ir as ir
import onnxruntime as ort
import pytest

from trtforge.passes.pipeline import optimize_model
from trtforge.plugins.attention.paged_onnx_node import add_paged_reference_function, make_paged_attention_node

F16 = ir.DataType.FLOAT16


def _standard_model(b=3, hq=8, hkv=2, s_q=2, d=32, nb=12, bs=16, mb=4, dynamic=False) -> onnx.ModelProto:
    """The paged decode step in standard ops: the reference function's body, inlined."""
    batch = "batch" if dynamic else b
    specs = [
        ("query", F16, [batch, hq, s_q, d]),
        ("key", F16, [batch, hkv, s_q, d]),
        ("value", F16, [batch, hkv, s_q, d]),
        ("key_cache", F16, [nb, bs, hkv, d]),
        ("value_cache", F16, [nb, bs, hkv, d]),
        ("block_table", ir.DataType.INT32, [batch, mb]),
        ("slot_mapping", ir.DataType.INT32, [batch, s_q]),
        ("seq_lens", ir.DataType.INT32, [batch]),
        ("query_lens", ir.DataType.INT32, [batch]),
    ]
    vals = [ir.Value(name=n, type=ir.TensorType(t), shape=ir.Shape(s)) for n, t, s in specs]
    node = make_paged_attention_node(*vals, num_heads=hq, kv_num_heads=hkv, scale=0.2, name="layer0")
    for out, name in zip(node.outputs, ("attn_out", "present_key_cache", "present_value_cache")):
        out.name = name
    graph = ir.Graph(vals, list(node.outputs), nodes=[node], opset_imports={"": 24}, name="decode_step")
    model = ir.Model(graph, ir_version=10)
    add_paged_reference_function(model)
    proto = onnx.inliner.inline_local_functions(ir.serde.serialize_model(model))
    assert not any(n.domain == "trtforge" for n in proto.graph.node)
    return proto


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def _feeds(b=3, hq=8, hkv=2, s_q=2, d=32, nb=12, bs=16, mb=4, seed=0):
    rng = np.random.default_rng(seed)
    order = rng.permutation(nb)
    table, scratch = order[: b * mb].reshape(b, mb).astype(np.int32), int(order[-1])
    lens, q_lens = np.array([2, 17, 64][:b], dtype=np.int32), np.array([2, 1, 2][:b], dtype=np.int32)
    slots = np.full((b, s_q), scratch * bs, dtype=np.int32)  # right padding -> the scratch block
    for i in range(b):
        for j in range(q_lens[i]):
            pos = lens[i] - q_lens[i] + j
            slots[i, j] = table[i, pos // bs] * bs + pos % bs
    return {
        "query": rng.standard_normal((b, hq, s_q, d)).astype(np.float16),
        "key": rng.standard_normal((b, hkv, s_q, d)).astype(np.float16),
        "value": rng.standard_normal((b, hkv, s_q, d)).astype(np.float16),
        "key_cache": rng.standard_normal((nb, bs, hkv, d)).astype(np.float16),
        "value_cache": rng.standard_normal((nb, bs, hkv, d)).astype(np.float16),
        "block_table": table,
        "slot_mapping": slots,
        "seq_lens": lens,
        "query_lens": q_lens,
    }


@pytest.mark.parametrize("dynamic", [False, True])
def test_paged_strategy_fuses_the_standard_form_and_ort_agrees(dynamic):
    original = _standard_model(dynamic=dynamic)
    optimized, ledger = optimize_model(original, passes=["attention", "cleanup"], attention="paged")
    nodes = [(n.domain, n.op_type) for n in optimized.graph.node]
    assert nodes.count(("trtforge", "PagedAttention")) == 1
    assert not {"ScatterND", "Gather", "Attention", "Transpose"} & {op for _, op in nodes}
    assert [o.name for o in optimized.graph.output] == [
        "attn_out",
        "present_key_cache",
        "present_value_cache",
    ]
    assert ledger.matches("attention") == 1
    feeds = _feeds()
    for before, after in zip(_run(original, feeds), _run(optimized, feeds)):
        assert before.shape == after.shape
        assert np.abs(before.astype(np.float32) - after.astype(np.float32)).max() <= 1e-3


def test_plain_attention_is_not_taken_for_a_paged_step():
    """An Attention over ordinary K/V inputs has no pool behind it: nothing is rewritten."""
    q = ir.Value(name="q", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 2, 3, 8]))
    k = ir.Value(name="k", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 2, 3, 8]))
    m = ir.Value(name="m", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([1, 1, 3, 3]))
    node = ir.Node("", "Attention", [q, k, k, m], num_outputs=1)
    node.outputs[0].name = "o"
    node.outputs[0].dtype, node.outputs[0].shape = ir.DataType.FLOAT, ir.Shape([1, 2, 3, 8])
    model = ir.Model(
        ir.Graph([q, k, m], node.outputs, nodes=[node], opset_imports={"": 23}, name="g"), ir_version=10
    )
    optimized, ledger = optimize_model(
        ir.serde.serialize_model(model), passes=["attention"], attention="paged", debug=True
    )
    assert [n.op_type for n in optimized.graph.node] == ["Attention"]
    record = next(r for r in ledger.passes if r.name == "attention")
    assert record.matches == 0 and any("not gathered from a ScatterND" in r for r in record.rejected)


def test_the_older_heads_major_pool_form_is_refused_with_its_reason():
    """Pools [num_blocks, Hkv, block_size, D] (gathered with Transpose [0, 2, 1, 3, 4]) are not its layout."""
    proto = _standard_model()
    for node in proto.graph.node:
        for attr in node.attribute:
            if node.op_type == "Transpose" and list(attr.ints) == [0, 3, 1, 2, 4]:
                attr.ints[:] = [0, 2, 1, 3, 4]
    optimized, ledger = optimize_model(proto, passes=["attention"], attention="paged", debug=True)
    record = next(r for r in ledger.passes if r.name == "attention")
    assert record.matches == 0 and any("[num_blocks, block_size, Hkv, D]" in r for r in record.rejected)
    assert "PagedAttention" not in {n.op_type for n in optimized.graph.node}
