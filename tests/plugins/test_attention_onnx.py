"""The trtforge::FlashAttention ONNX node and its reference function, run by ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from trtforge.errors import UserError
from trtforge.numerics.sessions import exact_session
from trtforge.plugins.attention.onnx_node import (
    add_reference_function,
    add_reference_function_proto,
    flash_attention_attributes,
    make_flash_attention_node,
)
from trtforge.plugins.attention.spec import DOMAIN, MASKED_OVERLOAD, OP_TYPE

H, D = 2, 16


def _value(name: str, dtype: ir.DataType, dims: list) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))


def _model(masked: bool, causal: bool, dtype=ir.DataType.FLOAT16, mask_dtype=ir.DataType.INT64, opset=18):
    q, k, v = (_value(n, dtype, ["B", H, "S", D]) for n in "qkv")
    mask = _value("mask", mask_dtype, ["B", "S"]) if masked else None
    node = make_flash_attention_node(q, k, v, mask, num_heads=H, scale=0.3, causal=causal, name="attn")
    inputs = [q, k, v] + ([mask] if masked else [])
    graph = ir.Graph(inputs, node.outputs, nodes=[node], opset_imports={"": opset}, name="g")
    model = ir.Model(graph, ir_version=9)
    add_reference_function(model)
    return model


def _reference(q, k, v, mask, causal, scale):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * scale
    s_q, s_kv = s.shape[-2:]
    keep = np.ones((q.shape[0], 1, s_q, s_kv), bool)
    if causal:
        keep &= np.tril(np.ones((s_q, s_kv), bool))
    if mask is not None:
        keep &= (mask != 0)[:, None, None, :]
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    denom = p.sum(-1, keepdims=True)
    p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
    return p @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("masked", "mask_np"), [(False, None), (True, np.int64), (True, np.int32), (True, np.bool_)]
)
@pytest.mark.parametrize("dtype", [ir.DataType.FLOAT16, ir.DataType.FLOAT])
def test_onnxruntime_runs_the_reference_and_matches_numpy(causal, masked, mask_np, dtype):
    mask_dtype = {None: ir.DataType.INT64, np.int64: ir.DataType.INT64, np.int32: ir.DataType.INT32}
    mask_dtype[np.bool_] = ir.DataType.BOOL
    proto = ir.to_proto(_model(masked, causal, dtype, mask_dtype[mask_np]))
    onnx.checker.check_model(proto, full_check=True)
    session = exact_session(proto)
    rng = np.random.default_rng(0)
    np_dtype = np.float16 if dtype == ir.DataType.FLOAT16 else np.float32
    b, s = 3, 9
    feeds = {n: rng.standard_normal((b, H, s, D)).astype(np_dtype) for n in "qkv"}
    mask = None
    if masked:
        mask = np.ones((b, s), dtype=mask_np)
        mask[1, 6:] = 0  # right padding
        mask[2, :4] = 0  # left padding: with causal, rows 0..3 see no key -> zeros
        feeds["mask"] = mask
    (out,) = session.run(None, feeds)
    assert out.dtype == np_dtype and out.shape == (b, H, s, D)
    ref = _reference(feeds["q"], feeds["k"], feeds["v"], mask, causal, 0.3)
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=2e-3 if np_dtype == np.float16 else 1e-5)
    if masked and causal:
        assert not np.any(out[2, :, :4])


def test_node_carries_the_contract():
    model = _model(masked=True, causal=True)
    node = next(iter(model.graph))
    assert (node.domain, node.op_type, node.overload) == (DOMAIN, OP_TYPE, MASKED_OVERLOAD)
    attrs = {name: a.value for name, a in node.attributes.items()}
    assert attrs == {
        "num_heads": H,
        "scale": pytest.approx(0.3),
        "causal": 1,
        "plugin_namespace": "trtforge",
        "plugin_version": "1",
    }
    out = node.outputs[0]
    assert out.dtype == ir.DataType.FLOAT16 and list(out.shape) == ["B", H, "S", D]
    assert model.opset_imports[DOMAIN] == 1 and model.ir_version >= 10
    assert {(f.domain, f.name, f.overload) for f in model.functions.values()} == {
        (DOMAIN, OP_TYPE, ""),
        (DOMAIN, OP_TYPE, MASKED_OVERLOAD),
    }
    unmasked = next(iter(_model(masked=False, causal=False).graph))
    assert unmasked.overload == "" and len(unmasked.inputs) == 3


def test_reference_function_is_idempotent_and_follows_model_opset():
    model = _model(masked=False, causal=False, opset=21)
    add_reference_function(model)
    assert len(model.functions) == 2
    assert all(f.opset_imports[""] == 21 for f in model.functions.values())


def test_old_opset_is_a_user_error():
    with pytest.raises(UserError, match="opset >= 15"):
        _model(masked=False, causal=False, opset=14)


def test_model_proto_convenience():
    q, k, v = (_value(n, ir.DataType.FLOAT, [1, H, 4, D]) for n in "qkv")
    node = make_flash_attention_node(q, k, v, num_heads=H, scale=0.25, causal=False)
    graph = ir.Graph([q, k, v], node.outputs, nodes=[node], opset_imports={"": 18}, name="g")
    proto = ir.to_proto(ir.Model(graph, ir_version=10))
    fixed = add_reference_function_proto(proto)
    assert {f.name for f in fixed.functions} == {OP_TYPE}
    onnx.checker.check_model(fixed, full_check=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": 2.5}, "num_heads"),
        ({"scale": 0.0}, "scale"),
        ({"scale": float("nan")}, "scale"),
        ({"causal": 2}, "causal"),
    ],
)
def test_bad_attributes_are_user_errors(kwargs, message):
    args = {"num_heads": 2, "scale": 0.1, "causal": False, **kwargs}
    with pytest.raises(UserError, match=message):
        flash_attention_attributes(**args)


def test_bad_inputs_are_user_errors():
    q = _value("q", ir.DataType.INT32, [1, H, 4, D])
    k, v = (_value(n, ir.DataType.FLOAT, [1, H, 4, D]) for n in "kv")
    with pytest.raises(UserError, match="'q' has dtype INT32"):
        make_flash_attention_node(q, k, v, num_heads=H, scale=0.1, causal=0)
    q3 = _value("q", ir.DataType.FLOAT, [1, 4, D])
    with pytest.raises(UserError, match="rank 4"):
        make_flash_attention_node(q3, k, v, num_heads=H, scale=0.1, causal=0)
    mask = _value("m", ir.DataType.FLOAT, [1, 4])
    with pytest.raises(UserError, match="key_padding_mask"):
        make_flash_attention_node(k, k, v, mask, num_heads=H, scale=0.1, causal=0)
    half = _value("h", ir.DataType.FLOAT16, [1, H, 4, D])
    with pytest.raises(UserError, match="share one dtype"):
        make_flash_attention_node(half, k, v, num_heads=H, scale=0.1, causal=0)
