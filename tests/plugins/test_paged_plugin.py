"""The PagedAttention IPluginV3 classes against the TensorRT Python bindings installed here.

TensorRT-RTX 1.7.1 (CI) has IPluginV3OneBuildV2 (aliased outputs) and the creator base class, so
plugin and creator are real binding subclasses; only adding the plugin to a network is not.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.core.backend import backend_available
from trtforge.errors import UserError
from trtforge.kernels.configs import DECODE_CANDIDATES
from trtforge.plugins.attention.paged_plugin import (
    paged_config_for_tactic,
    paged_plugin_classes,
    paged_valid_tactics,
    paged_workspace_bytes,
    parse_paged_fields,
    register_paged_plugin,
    workspace_rows,
)
from trtforge.plugins.attention.spec import PagedAttentionAttrs

pytestmark = pytest.mark.skipif(not backend_available(), reason="no TensorRT Python bindings importable")

ATTRS = PagedAttentionAttrs(num_heads=32, kv_num_heads=8, scale=0.125)  # exact in FP32


@pytest.fixture(scope="module")
def classes(backend):
    return paged_plugin_classes(backend)


def _desc(trt, dtype, dims, fmt=None, max_dims=None):
    desc = trt.DynamicPluginTensorDesc()
    tensor = trt.PluginTensorDesc()
    tensor.type = dtype
    tensor.dims = trt.Dims(list(dims))
    tensor.format = fmt if fmt is not None else trt.TensorFormat.LINEAR
    desc.desc = tensor
    desc.max = trt.Dims(list(max_dims or dims))
    return desc


def _inputs(trt, dtype=None, q=(4, 32, 1, 128), kv=(4, 8, 1, 128), pool=(100, 16, 8, 128), b=4):
    """query, key, value, pools [num_blocks, block_size, Hkv, D], block_table, slot_mapping, lengths."""
    dt = trt.DataType
    f = dtype or dt.HALF
    dims = [q, kv, kv, pool, pool, (b, 64), (b, q[2]), (b,), (b,)]
    types = [f, f, f, f, f, dt.INT32, dt.INT32, dt.INT32, dt.INT32]
    return [_desc(trt, t, d) for t, d in zip(types, dims)]


def test_serialization_round_trip_through_the_creator(trt, classes):
    plugin_cls, creator_cls = classes
    plugin = plugin_cls(ATTRS)
    creator = creator_cls()
    for phase in (trt.TensorRTPhase.BUILD, trt.TensorRTPhase.RUNTIME):
        rebuilt = creator.create_plugin("pa", plugin.get_fields_to_serialize(), phase)
        assert rebuilt.attrs == ATTRS
        assert (rebuilt.plugin_name, rebuilt.plugin_version, rebuilt.plugin_namespace) == (
            "PagedAttention",
            "1",
            "trtforge",
        )
    assert [f.name for f in creator.field_names] == ["num_heads", "kv_num_heads", "scale"]


def test_fields_as_the_onnx_parser_passes_them(trt):
    fields = trt.PluginFieldCollection(
        [
            trt.PluginField("num_heads", np.array([8], np.int64), trt.PluginFieldType.INT64),
            trt.PluginField("kv_num_heads", np.array([2], np.int64), trt.PluginFieldType.INT64),
            trt.PluginField("scale", np.array([0.25], np.float64), trt.PluginFieldType.FLOAT64),
            trt.PluginField(
                "plugin_namespace", np.frombuffer(b"trtforge", np.int8), trt.PluginFieldType.CHAR
            ),
            trt.PluginField("plugin_version", np.frombuffer(b"1", np.int8), trt.PluginFieldType.CHAR),
        ]
    )
    assert parse_paged_fields(fields) == PagedAttentionAttrs(8, 2, 0.25)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kv_num_heads": 2, "scale": 0.1}, "required field 'num_heads'"),
        ({"num_heads": 8, "kv_num_heads": 3, "scale": 0.1}, "must divide num_heads"),
        ({"num_heads": 8, "kv_num_heads": 0, "scale": 0.1}, "kv_num_heads"),
        ({"num_heads": 8, "kv_num_heads": 2, "scale": float("nan")}, "scale"),
        ({"num_heads": 8, "kv_num_heads": 2, "scale": 0.1, "causal": 1}, "unknown plugin field 'causal'"),
    ],
)
def test_attribute_validation_errors(trt, classes, fields, message):
    _, creator_cls = classes
    collection = [
        trt.PluginField(n, np.array([v], np.float32 if isinstance(v, float) else np.int32),
                        trt.PluginFieldType.FLOAT32 if isinstance(v, float) else trt.PluginFieldType.INT32)
        for n, v in fields.items()
    ]  # fmt: skip
    with pytest.raises(UserError, match=message):
        creator_cls().create_plugin("pa", trt.PluginFieldCollection(collection), trt.TensorRTPhase.BUILD)


def test_pool_outputs_alias_the_pool_inputs(trt, classes):
    plugin = classes[0](ATTRS)
    assert plugin.num_outputs == 3
    assert [plugin.get_aliased_input(i) for i in range(3)] == [-1, 3, 4]
    half, i32 = trt.DataType.HALF, trt.DataType.INT32
    assert plugin.get_output_data_types([half] * 5 + [i32] * 4) == [half, half, half]
    dims = [trt.DimsExprs(4)] * 5 + [trt.DimsExprs(2)] * 2 + [trt.DimsExprs(1)] * 2
    assert [len(d) for d in plugin.get_output_shapes(dims, [], None)] == [4, 4, 4]


def test_supported_dtype_and_format_combinations(trt, classes):
    plugin = classes[0](ATTRS)
    dt = trt.DataType

    def ok(types_, fmt=None):
        in_out = [_desc(trt, t, (1, 1, 1, 1), fmt=fmt) for t in types_]
        return all(plugin.supports_format_combination(p, in_out, 9) for p in range(len(types_)))

    i32 = [dt.INT32] * 4  # block_table, slot_mapping, seq_lens, query_lens
    for f in (dt.HALF, dt.BF16):
        assert ok([f] * 5 + i32 + [f] * 3)
    assert not ok([dt.FLOAT] * 5 + i32 + [dt.FLOAT] * 3)  # the kernels are FP16/BF16
    assert not ok([dt.HALF] * 5 + [dt.INT64] + i32[1:] + [dt.HALF] * 3)  # an int64 block table
    assert not ok([dt.HALF] * 5 + [dt.INT32, dt.INT64, dt.INT32, dt.INT32] + [dt.HALF] * 3)  # int64 slots
    assert not ok([dt.HALF, dt.HALF, dt.HALF, dt.BF16, dt.HALF] + i32 + [dt.HALF] * 3)
    assert not ok([dt.HALF] * 5 + i32 + [dt.HALF] * 3, fmt=trt.TensorFormat.CHW2)


def test_configure_checks_heads_block_size_and_head_dim(trt, classes):
    plugin = classes[0](ATTRS)
    plugin.configure_plugin(_inputs(trt), [])
    assert plugin.head_dim == 128
    plugin.configure_plugin(_inputs(trt, q=(-1, 32, -1, 128), kv=(-1, 8, -1, 128), pool=(-1, 64, 8, 128)), [])
    plugin.configure_plugin(_inputs(trt, q=(4, 32, 300, 128), kv=(4, 8, 300, 128)), [])  # a prefill step
    cases = [
        ({"q": (4, 16, 1, 128)}, "16 heads but num_heads is 32"),
        ({"kv": (4, 4, 1, 128)}, "4 heads but kv_num_heads is 8"),
        ({"pool": (100, 16, 4, 128)}, "key_cache .* has 4 heads"),
        ({"pool": (100, 24, 8, 128)}, "block size 24"),
        ({"q": (4, 32, 1, 48), "kv": (4, 8, 1, 48), "pool": (100, 16, 8, 48)}, "head dim 48"),
        ({"pool": (100, 16, 8, 64)}, "cache head dim 64"),
    ]
    for change, message in cases:
        with pytest.raises(UserError, match=message):
            plugin.configure_plugin(_inputs(trt, **change), [])
    with pytest.raises(UserError, match="takes 9 inputs"):
        plugin.configure_plugin(_inputs(trt)[:7], [])


def test_workspace_covers_every_runtime_shape_of_the_profile(trt, classes):
    plugin = classes[0](ATTRS)
    descs = _inputs(trt)
    descs[0] = _desc(trt, trt.DataType.HALF, (-1, 32, -1, 128), max_dims=(256, 32, 2048, 128))
    size = plugin.get_workspace_size(descs, [])
    # only S_q = 1 steps split K/V (longer ones run chunked prefill): sized for q_len 1, not 2048
    assert size == paged_workspace_bytes(256, 32, 8, 1, 128) < 64 << 20
    for b in (1, 7, 256):
        assert workspace_rows(b, 32, 8, 1) <= workspace_rows(256, 32, 8, 1)
        # enqueue lowers splits to rows // (B·Hq): always at least the heuristic's ~4 programs/SM
        assert workspace_rows(b, 32, 8, 1) // (b * 32) >= 2


def test_tactics_are_the_decode_candidates_that_fit(trt, classes):
    plugin = classes[0](ATTRS)
    plugin.configure_plugin(_inputs(trt), [])
    assert (
        plugin.get_valid_tactics() == paged_valid_tactics(128) == list(range(1, len(DECODE_CANDIDATES) + 1))
    )
    big = paged_valid_tactics(256)
    assert big and len(big) < len(DECODE_CANDIDATES)  # 128-key tiles x 3 stages do not fit at D=256
    assert paged_config_for_tactic(1, 128) == DECODE_CANDIDATES[0]
    assert paged_config_for_tactic(0, 256) == (32, 4, 2, 1.0)
    plugin.set_tactic(5)
    clone = plugin.attach_to_context(None)
    assert clone is not plugin and clone.tactic == 5 and clone.attrs == ATTRS


def test_backend_that_cannot_host_plugins_is_refused(backend):
    if backend.capabilities.can_host_plugins:
        pytest.skip(f"{backend.name} {backend.version} can host plugins; this checks the refusal path")
    with pytest.raises(UserError, match="--attention native"):
        register_paged_plugin(backend)
