"""The PagedAttention ONNX node and its reference function: ONNX Runtime (exact, optimizations off)
against the kernel's math (the Triton kernels; in the CPU interpreter here) and against FP32 SDPA."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from trtforge.errors import UserError
from trtforge.plugins.attention.paged_onnx_node import add_paged_reference_function, make_paged_attention_node

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F16 = ir.DataType.FLOAT16


def _values(b, hq, hkv, s_q, d, nb, bs, mb, dtype=F16):
    specs = [
        ("q", dtype, [b, hq, s_q, d]),
        ("k", dtype, [b, hkv, s_q, d]),
        ("v", dtype, [b, hkv, s_q, d]),
        ("kc", dtype, [nb, hkv, bs, d]),
        ("vc", dtype, [nb, hkv, bs, d]),
        ("table", ir.DataType.INT32, [b, mb]),
        ("lens", ir.DataType.INT32, [b]),
    ]
    return [ir.Value(name=n, type=ir.TensorType(t), shape=ir.Shape(s)) for n, t, s in specs]


def _model(b, hq, hkv, s_q, d, nb, bs, mb, opset=24):
    vals = _values(b, hq, hkv, s_q, d, nb, bs, mb)
    node = make_paged_attention_node(*vals, num_heads=hq, kv_num_heads=hkv, scale=d**-0.5, name="pa")
    model = ir.Model(
        ir.Graph(vals, list(node.outputs), nodes=[node], opset_imports={"": opset}), ir_version=10
    )
    add_paged_reference_function(model)
    return ir.serde.serialize_model(model)


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "bs", "lens"),
    [(4, 1, 1, 64, 16, [1, 16, 17]), (8, 2, 4, 32, 16, [4, 15, 40]), (4, 4, 2, 80, 32, [33, 2])],
)
def test_reference_function_matches_the_kernels(hq, hkv, s_q, d, bs, lens):
    from tests.plugins.decode_reference import paged_from_contiguous, reference_decode
    from trtforge.plugins.attention.decode_kernel import DecodeConfig
    from trtforge.plugins.attention.paged_cache import paged_decode_step

    gen = torch.Generator().manual_seed(hq * d + s_q)
    b, s_max = len(lens), 48
    lens_t = torch.tensor(lens, dtype=torch.int32)
    k = torch.randn(b, hkv, s_max, d, generator=gen).half()
    v = torch.randn(b, hkv, s_max, d, generator=gen).half()
    # pools hold every block a sequence will use; spare blocks hold stale (finite) data
    k_pool, v_pool, table = paged_from_contiguous(k, v, torch.full((b,), s_max), bs, gen)
    k_pool, v_pool = k_pool.nan_to_num(7.0), v_pool.nan_to_num(-7.0)
    q = torch.randn(b, hq, s_q, d, generator=gen).half()
    k_new = torch.randn(b, hkv, s_q, d, generator=gen).half()
    v_new = torch.randn(b, hkv, s_q, d, generator=gen).half()
    feeds = {"q": q, "k": k_new, "v": v_new, "kc": k_pool, "vc": v_pool, "table": table, "lens": lens_t}
    model = _model(b, hq, hkv, s_q, d, k_pool.shape[0], bs, table.shape[1])
    out, k_out, v_out = _ort(model, {n: t.numpy() for n, t in feeds.items()})

    kp, vp = k_pool.clone().to(DEVICE), v_pool.clone().to(DEVICE)
    ours = paged_decode_step(
        q.to(DEVICE), k_new.to(DEVICE), v_new.to(DEVICE), kp, vp, table.to(DEVICE), lens_t.to(DEVICE),
        scale=d**-0.5, config=DecodeConfig(block_n=16, num_splits=2),
    )  # fmt: skip
    assert np.array_equal(k_out, kp.cpu().numpy()) and np.array_equal(v_out, vp.cpu().numpy())
    assert not np.array_equal(k_out, k_pool.numpy())  # the step did write
    assert np.abs(out.astype(np.float32) - ours.float().cpu().numpy()).max() < 2e-3
    ref = reference_decode(q.float(), kp.cpu(), vp.cpu(), lens_t, table, scale=d**-0.5).numpy()
    assert np.abs(out.astype(np.float32) - ref).max() < 2e-3


def test_node_outputs_follow_query_and_pools():
    vals = _values(2, 8, 2, 1, 64, 10, 16, 4)
    node = make_paged_attention_node(*vals, num_heads=8, kv_num_heads=2, scale=0.125, name="pa")
    assert (node.domain, node.op_type, len(node.outputs)) == ("trtforge", "PagedAttention", 3)
    assert [o.shape for o in node.outputs] == [vals[0].shape, vals[3].shape, vals[4].shape]
    assert node.outputs[1].name == "pa_present_key_cache"
    assert node.attributes["plugin_namespace"].value == "trtforge"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_num_heads": 4}, "must divide num_heads"),
        ({"table_dtype": ir.DataType.INT64}, "block_table"),
        ({"pool_dtype": ir.DataType.BFLOAT16}, "share one dtype"),
    ],
)
def test_bad_nodes_are_rejected(change, message):
    vals = _values(2, 6, 3, 1, 64, 10, 16, 4)
    if "table_dtype" in change:
        vals[5] = ir.Value(name="t", type=ir.TensorType(change["table_dtype"]), shape=ir.Shape([2, 4]))
    if "pool_dtype" in change:
        vals[3] = ir.Value(
            name="kc", type=ir.TensorType(change["pool_dtype"]), shape=ir.Shape([10, 3, 16, 64])
        )
    with pytest.raises(UserError, match=message):
        make_paged_attention_node(*vals, num_heads=6, kv_num_heads=change.get("kv_num_heads", 3), scale=0.1)


def test_reference_function_needs_attention_opset():
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 17}), ir_version=10)
    with pytest.raises(UserError, match="opset >= 23"):
        add_paged_reference_function(model)
