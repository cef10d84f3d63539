"""The FlashAttention IPluginV3 classes against the TensorRT Python bindings installed here.

TensorRT-RTX 1.7.1 (CI) has the IPluginV3* and creator base classes, so the plugin and creator are
real binding subclasses here; only adding the plugin to a network (datacenter TensorRT) is not.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from trtforge.core.backend import backend_available
from trtforge.errors import UserError
from trtforge.kernels.configs import (
    HopperConfig,
    KernelConfig,
    config_for_tactic,
    default_config,
    hopper_configs,
    tactic_configs,
    valid_tactics,
)
from trtforge.plugins.attention.plugin import (
    check_plugin_support,
    output_dims,
    parse_fields,
    plugin_classes,
    register_plugins,
)
from trtforge.plugins.attention.spec import LAYOUT_PACKED, FlashAttentionAttrs

pytestmark = pytest.mark.skipif(not backend_available(), reason="no TensorRT Python bindings importable")


@pytest.fixture(scope="module")
def classes(backend):
    return plugin_classes(backend)


def _field(trt, name, values, kind):
    return trt.PluginField(name, np.asarray(values), kind)


def _desc(trt, dtype, dims=(2, 4, 8, 64), fmt=None):
    desc = trt.DynamicPluginTensorDesc()
    tensor = trt.PluginTensorDesc()
    tensor.type = dtype
    tensor.dims = trt.Dims(list(dims))
    tensor.format = fmt if fmt is not None else trt.TensorFormat.LINEAR
    desc.desc = tensor
    return desc


@pytest.mark.parametrize("layout", ["bhsd", "bs3hd"])
@pytest.mark.parametrize("causal", [False, True])
def test_serialization_round_trip_through_the_creator(trt, classes, layout, causal):
    plugin_cls, creator_cls = classes
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=12, scale=0.125, causal=causal, layout=layout))
    creator = creator_cls()
    for phase in (trt.TensorRTPhase.BUILD, trt.TensorRTPhase.RUNTIME):
        rebuilt = creator.create_plugin("attn", plugin.get_fields_to_serialize(), phase)
        assert rebuilt.attrs == plugin.attrs
        assert (rebuilt.plugin_name, rebuilt.plugin_version, rebuilt.plugin_namespace) == (
            "FlashAttention",
            "1",
            "trtforge",
        )
    assert (creator.name, creator.plugin_version, creator.plugin_namespace) == (
        "FlashAttention",
        "1",
        "trtforge",
    )
    assert [f.name for f in creator.field_names] == ["num_heads", "scale", "causal", "layout"]


def test_fields_as_the_onnx_parser_passes_them(trt):
    """INT64/FLOAT64 numbers, a CHAR layout, and the parser's own plugin_* attributes."""
    fields = trt.PluginFieldCollection(
        [
            _field(trt, "num_heads", np.array([8], np.int64), trt.PluginFieldType.INT64),
            _field(trt, "scale", np.array([0.25], np.float64), trt.PluginFieldType.FLOAT64),
            _field(trt, "causal", np.array([1], np.int32), trt.PluginFieldType.INT32),
            _field(trt, "layout", np.frombuffer(b"bs3hd\0", np.int8), trt.PluginFieldType.CHAR),
            _field(trt, "plugin_namespace", np.frombuffer(b"trtforge", np.int8), trt.PluginFieldType.CHAR),
            _field(trt, "plugin_version", np.frombuffer(b"1", np.int8), trt.PluginFieldType.CHAR),
        ]
    )
    assert parse_fields(fields) == FlashAttentionAttrs(8, 0.25, True, LAYOUT_PACKED)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scale": 0.1}, "required field 'num_heads'"),
        ({"num_heads": 4}, "required field 'scale'"),
        ({"num_heads": 0, "scale": 0.1}, "num_heads"),
        ({"num_heads": 4, "scale": -1.0}, "scale"),
        ({"num_heads": 4, "scale": float("inf")}, "scale"),
        ({"num_heads": 4, "scale": 0.1, "causal": 3}, "causal"),
        ({"num_heads": 4, "scale": 0.1, "layout": "sbhd"}, "layout"),
        ({"num_heads": 4, "scale": 0.1, "heads": 4}, "unknown plugin field 'heads'"),
        ({"num_heads": [4, 4], "scale": 0.1}, "one value"),
    ],
)
def test_attribute_validation_errors(trt, classes, fields, message):
    _, creator_cls = classes
    kinds = {float: trt.PluginFieldType.FLOAT32, int: trt.PluginFieldType.INT32}
    collection = []
    for name, value in fields.items():
        if isinstance(value, str):
            collection.append(
                _field(trt, name, np.frombuffer(value.encode(), np.int8), trt.PluginFieldType.CHAR)
            )
        else:
            first = value[0] if isinstance(value, list) else value
            dtype = np.float32 if isinstance(first, float) else np.int32
            collection.append(_field(trt, name, np.array(np.atleast_1d(value), dtype), kinds[type(first)]))
    with pytest.raises(UserError, match=message):
        creator_cls().create_plugin("attn", trt.PluginFieldCollection(collection), trt.TensorRTPhase.BUILD)


def test_supported_dtype_and_format_combinations(trt, classes):
    plugin_cls, _ = classes
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=4, scale=0.125))
    dt = trt.DataType

    def ok(types_, n_inputs, fmt=None):
        in_out = [_desc(trt, t, fmt=fmt if i == len(types_) - 1 else None) for i, t in enumerate(types_)]
        return all(plugin.supports_format_combination(p, in_out, n_inputs) for p in range(len(types_)))

    for t in (dt.HALF, dt.BF16, dt.FLOAT):
        assert ok([t, t, t, t], 3)
        for m in (dt.BOOL, dt.INT32, dt.INT64):
            assert ok([t, t, t, m, t], 4)
    assert not ok([dt.HALF, dt.BF16, dt.HALF, dt.HALF], 3)  # mixed q/k dtypes
    assert not ok([dt.HALF, dt.HALF, dt.HALF, dt.FLOAT], 3)  # output differs from q
    assert not ok([dt.INT8, dt.INT8, dt.INT8, dt.INT8], 3)
    assert not ok([dt.HALF, dt.HALF, dt.HALF, dt.HALF, dt.HALF], 4)  # a float mask
    assert not ok([dt.HALF, dt.HALF, dt.HALF, dt.HALF], 3, fmt=trt.TensorFormat.CHW2)
    assert not ok([dt.HALF, dt.HALF], 1)  # wrong number of inputs for bhsd


def test_configure_checks_heads_and_head_dim(trt, classes):
    plugin_cls, _ = classes
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=4, scale=0.125))
    half = trt.DataType.HALF
    good = [_desc(trt, half, (2, 4, 8, 80)) for _ in range(3)]
    plugin.configure_plugin(good, [_desc(trt, half, (2, 4, 8, 80))])
    plugin.configure_plugin([_desc(trt, half, (-1, 4, -1, 64)) for _ in range(3)], [])  # dynamic dims
    with pytest.raises(UserError, match="head dim 48"):
        plugin.configure_plugin([_desc(trt, half, (2, 4, 8, 48)) for _ in range(3)], [])
    with pytest.raises(UserError, match="8 heads but num_heads is 4"):
        plugin.configure_plugin([_desc(trt, half, (2, 8, 8, 64)) for _ in range(3)], [])
    with pytest.raises(UserError, match="takes 3 input"):
        plugin.configure_plugin(good[:2], [])
    packed = plugin_cls(FlashAttentionAttrs(num_heads=4, scale=0.125, layout="bs3hd"))
    packed.configure_plugin([_desc(trt, half, (2, 8, 3 * 4 * 64))], [])
    with pytest.raises(UserError, match="not a multiple"):
        packed.configure_plugin([_desc(trt, half, (2, 8, 100))], [])


def test_build_and_runtime_surface(trt, classes):
    plugin_cls, _ = classes
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=4, scale=0.125, causal=True))
    for kind in (
        trt.PluginCapabilityType.CORE,
        trt.PluginCapabilityType.BUILD,
        trt.PluginCapabilityType.RUNTIME,
    ):
        assert plugin.get_capability_interface(kind) is plugin
    assert plugin.num_outputs == 1
    assert plugin.get_output_data_types([trt.DataType.BF16] * 3) == [trt.DataType.BF16]
    assert plugin.get_workspace_size([], []) == 0
    tactics = plugin.get_valid_tactics()
    assert tactics == sorted(set(tactics)) and min(tactics) >= 1 and len(tactics) == len(tactic_configs())
    plugin.set_tactic(5)
    clone = plugin.attach_to_context(None)
    assert clone is not plugin and clone.attrs == plugin.attrs and clone.tactic == 5
    dims = trt.DimsExprs(4)
    assert len(plugin.get_output_shapes([dims] * 3, [], None)[0]) == 4


def test_tactics_only_offer_tiles_that_fit_the_head_dim(trt, classes):
    plugin_cls, _ = classes
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=2, scale=0.1))
    plugin.configure_plugin([_desc(trt, trt.DataType.HALF, (1, 2, 8, 128)) for _ in range(3)], [])
    assert plugin.get_valid_tactics() == valid_tactics(128, "float16")
    portable = [i + 1 for i, c in enumerate(tactic_configs()) if isinstance(c, KernelConfig)]
    hopper = [i + 1 for i, c in enumerate(tactic_configs()) if isinstance(c, HopperConfig)]
    assert hopper and valid_tactics(32, "float16") == portable  # the Hopper kernel needs D 64 or 128
    assert set(valid_tactics(128, "float16")) - set(portable) == {
        t for t in hopper if tactic_configs()[t - 1] in hopper_configs(128)
    }
    assert not set(valid_tactics(128, "float32")) & set(hopper)  # and FP16/BF16
    assert config_for_tactic(hopper[0], 32, "float16") == default_config(32, "float16")
    assert config_for_tactic(0, 128, "bfloat16") == default_config(128, "bfloat16")
    assert config_for_tactic(3, 128, "float16") == default_config(128, "float16")  # 128x128x4 stages: too big
    assert config_for_tactic(1, 128, "float16") == tactic_configs()[0]


def test_packed_layout_output_shape_uses_the_expression_builder():
    calls = []
    builder = types.SimpleNamespace(
        constant=lambda c: ("const", c),
        operation=lambda op, a, b: calls.append((op, a, b)) or ("expr", op, a, b),
    )
    attrs = FlashAttentionAttrs(num_heads=4, scale=0.1, layout="bs3hd")
    dims = output_dims(attrs, ["B", "S", "W"], builder, "FLOOR_DIV")
    assert dims == ["B", "S", ("expr", "FLOOR_DIV", "W", ("const", 3))]
    assert output_dims(FlashAttentionAttrs(4, 0.1), ["B", "H", "S", "D"], builder, "FLOOR_DIV") == [
        "B",
        "H",
        "S",
        "D",
    ]


def test_backend_that_cannot_host_plugins_says_use_native(backend):
    if backend.capabilities.can_host_plugins:
        pytest.skip(f"{backend.name} {backend.version} can host plugins; this checks the refusal path")
    with pytest.raises(UserError, match="--attention native"):
        check_plugin_support(backend)
    with pytest.raises(UserError, match="--attention native"):
        register_plugins(backend)


def test_capability_check_uses_the_backend_capabilities():
    caps = types.SimpleNamespace(
        can_host_plugins=False, plugin_reason="tensorrt_rtx 1.7 has no add_plugin_v3"
    )
    with pytest.raises(UserError, match=r"no add_plugin_v3\. Use `--attention native`"):
        check_plugin_support(types.SimpleNamespace(capabilities=caps))
