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
        ("kc", dtype, [nb, bs, hkv, d]),
        ("vc", dtype, [nb, bs, hkv, d]),
        ("table", ir.DataType.INT32, [b, mb]),
        ("slots", ir.DataType.INT32, [b, s_q]),
        ("lens", ir.DataType.INT32, [b]),
        ("qlens", ir.DataType.INT32, [b]),
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


def _slot_mapping(table, lens, q_lens, s_q, bs, scratch):
    """Each row's new tokens at positions lens - q_lens .. lens - 1 through its table; padding rows
    (i >= q_lens[b]) at slots of the scratch block, as the decoder's executors feed them."""
    slots = torch.empty(len(lens), s_q, dtype=torch.int32)
    for b, (n, m) in enumerate(zip(lens.tolist(), q_lens.tolist())):
        for i in range(s_q):
            pos = n - m + i
            slots[b, i] = int(table[b, pos // bs]) * bs + pos % bs if i < m else scratch * bs + i % bs
    return slots


@pytest.mark.parametrize(
    ("hq", "hkv", "s_q", "d", "bs", "lens", "q_lens"),
    [
        (4, 1, 1, 64, 16, [1, 16, 17], [1, 1, 1]),  # decode, GQA 4
        (8, 2, 4, 32, 16, [4, 15, 40], [4, 2, 3]),  # ragged right-padded step over prefixes
        (4, 4, 2, 80, 64, [33, 2], [2, 1]),  # MHA, 64-token blocks
        (8, 1, 6, 64, 64, [70, 6, 9], [3, 6, 1]),  # GQA 8: prefill chunk, whole prompt, one token
    ],
)
def test_reference_function_matches_the_kernels(hq, hkv, s_q, d, bs, lens, q_lens):
    """Pools [num_blocks, block_size, Hkv, D] at random block placement: ORT's reference function and
    the Triton write + decode / chunked-prefill kernels write the same pools and agree on every real
    query row, and both match FP32 SDPA over the gathered keys."""
    from tests.kernels.decode_reference import paged_from_contiguous, reference_decode
    from trtforge.kernels.decode_attention import DecodeConfig
    from trtforge.kernels.paged_cache import paged_attention_step

    gen = torch.Generator().manual_seed(hq * d + s_q)
    b, s_max = len(lens), max(lens) + bs
    lens_t, q_lens_t = torch.tensor(lens, dtype=torch.int32), torch.tensor(q_lens, dtype=torch.int32)
    k = torch.randn(b, hkv, s_max, d, generator=gen).half()
    v = torch.randn(b, hkv, s_max, d, generator=gen).half()
    # pools hold every block a sequence will use; spare blocks hold stale (finite) data
    k_pool, v_pool, table = paged_from_contiguous(k, v, torch.full((b,), s_max), bs, gen)
    k_pool, v_pool = k_pool.nan_to_num(7.0), v_pool.nan_to_num(-7.0)
    scratch = min(set(range(k_pool.shape[0])) - set(table.flatten().tolist()))
    slots = _slot_mapping(table, lens_t, q_lens_t, s_q, bs, scratch)
    q = torch.randn(b, hq, s_q, d, generator=gen).half()
    k_new = torch.randn(b, hkv, s_q, d, generator=gen).half()
    v_new = torch.randn(b, hkv, s_q, d, generator=gen).half()
    feeds = {"q": q, "k": k_new, "v": v_new, "kc": k_pool, "vc": v_pool, "table": table}
    feeds |= {"slots": slots, "lens": lens_t, "qlens": q_lens_t}
    model = _model(b, hq, hkv, s_q, d, k_pool.shape[0], bs, table.shape[1])
    out, k_out, v_out = _ort(model, {n: t.numpy() for n, t in feeds.items()})

    kp, vp = k_pool.clone().to(DEVICE), v_pool.clone().to(DEVICE)
    ours = paged_attention_step(
        q.to(DEVICE), k_new.to(DEVICE), v_new.to(DEVICE), kp, vp, table.to(DEVICE), slots.to(DEVICE),
        lens_t.to(DEVICE), q_lens_t.to(DEVICE), scale=d**-0.5,
        out=torch.full_like(q, float("nan")).to(DEVICE), config=DecodeConfig(block_n=16, num_splits=2),
    ).float().cpu()  # fmt: skip
    kept = [n for n in range(k_pool.shape[0]) if n != scratch]  # padding rows race on the scratch block
    assert np.array_equal(k_out[kept], kp.cpu().numpy()[kept])
    assert np.array_equal(v_out[kept], vp.cpu().numpy()[kept])
    written = (k_out != k_pool.numpy()).any(axis=(2, 3))
    assert written[kept].sum() == sum(q_lens)  # exactly the real new tokens' slots
    for i, m in enumerate(q_lens):
        got = out[i, :, :m].astype(np.float32)
        assert np.abs(got - ours[i, :, :m].numpy()).max() < 2e-3
        ref = reference_decode(
            q[i : i + 1, :, :m].float(), kp.cpu(), vp.cpu(), lens_t[i : i + 1], table[i : i + 1], d**-0.5
        )
        assert np.abs(got - ref[0].numpy()).max() < 2e-3
        assert torch.isnan(ours[i, :, m:]).all()  # the plugin leaves padding rows unwritten
        assert np.isfinite(out[i]).all()  # the reference function defines them


def test_node_outputs_follow_query_and_pools():
    vals = _values(2, 8, 2, 1, 64, 10, 16, 4)
    assert vals[3].shape == ir.Shape([10, 16, 2, 64])  # [num_blocks, block_size, Hkv, D]
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
        ({"slots_dtype": ir.DataType.INT64}, "slot_mapping"),
        ({"pool_dtype": ir.DataType.BFLOAT16}, "share one dtype"),
    ],
)
def test_bad_nodes_are_rejected(change, message):
    vals = _values(2, 6, 3, 1, 64, 10, 16, 4)
    if "table_dtype" in change:
        vals[5] = ir.Value(name="t", type=ir.TensorType(change["table_dtype"]), shape=ir.Shape([2, 4]))
    if "slots_dtype" in change:
        vals[6] = ir.Value(name="s", type=ir.TensorType(change["slots_dtype"]), shape=ir.Shape([2, 1]))
    if "pool_dtype" in change:
        vals[3] = ir.Value(
            name="kc", type=ir.TensorType(change["pool_dtype"]), shape=ir.Shape([10, 16, 3, 64])
        )
    with pytest.raises(UserError, match=message):
        make_paged_attention_node(*vals, num_heads=6, kv_num_heads=change.get("kv_num_heads", 3), scale=0.1)


def test_reference_function_needs_attention_opset():
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 17}), ir_version=10)
    with pytest.raises(UserError, match="opset >= 23"):
        add_paged_reference_function(model)


def test_bad_inputs_name_the_op_the_input_and_what_was_expected():
    """Each message in full: the op, the input's role and name, what it is and what was expected."""
    i32 = ir.DataType.INT32

    def refused(index, dtype, shape):
        vals = _values(2, 6, 3, 1, 64, 10, 16, 4)
        vals[index] = ir.Value(name="x", type=ir.TensorType(dtype), shape=ir.Shape(shape))
        with pytest.raises(UserError) as info:
            make_paged_attention_node(*vals, num_heads=6, kv_num_heads=3, scale=0.1)
        return str(info.value)

    assert refused(0, i32, [2, 6, 1, 64]) == (
        "trtforge::PagedAttention: query 'x' has dtype INT32; expected FLOAT16, BFLOAT16, FLOAT."
    )
    assert refused(4, F16, [10, 16, 3]) == (
        "trtforge::PagedAttention: value_cache 'x' must have rank 4; got shape [10,16,3]."
    )
    assert refused(7, i32, [2, 1]) == (
        "trtforge::PagedAttention: seq_lens 'x' must have rank 1; got shape [2,1]."
    )
    assert refused(2, ir.DataType.FLOAT, [2, 3, 1, 64]) == (
        "trtforge::PagedAttention: query, key, value and the caches must share one dtype; "
        "got ['FLOAT', 'FLOAT16']."
    )
