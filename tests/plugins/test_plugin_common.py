"""Field handling shared by trtforge's plugins, against the TensorRT Python bindings installed here."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from trtforge.core.backend import backend_available, get_backend
from trtforge.errors import UserError
from trtforge.plugins.attention.paged_plugin import paged_plugin_classes
from trtforge.plugins.attention.plugin import plugin_classes
from trtforge.plugins.attention.plugin_common import field_collection, read_fields
from trtforge.plugins.attention.spec import FlashAttentionAttrs, PagedAttentionAttrs

pytestmark = pytest.mark.skipif(not backend_available(), reason="no TensorRT Python bindings importable")

KINDS = {"num_heads": "int32", "scale": "float32", "layout": "char", "kv_num_heads": "int32"}


def _churn() -> list:
    """Free what can be freed, then allocate many small arrays: memory a dangling field would reuse."""
    gc.collect()
    return [np.full(4, 3, np.int32) for _ in range(256)] + [np.full(8, 7, np.int8) for _ in range(256)]


def test_serialized_fields_stay_valid_after_the_call(trt):
    """A PluginField does not own its array: the plugin must keep what it serialized alive until
    TensorRT reads it (a collection built from temporaries read back freed memory)."""
    plugin_cls, _ = plugin_classes(get_backend())
    paged_cls, _ = paged_plugin_classes(get_backend())
    plugins = [
        plugin_cls(FlashAttentionAttrs(num_heads=12, scale=0.125, causal=True, layout="bs3hd")),
        paged_cls(PagedAttentionAttrs(num_heads=8, kv_num_heads=2, scale=0.25)),
    ]
    for plugin in plugins:
        fields = plugin.get_fields_to_serialize()
        keep = _churn()
        got = {str(f.name): np.asarray(f.data).copy() for f in fields}
        del keep
        if "layout" in got:
            assert bytes(got["layout"].astype(np.uint8)) == b"bs3hd"
            assert got["num_heads"].tolist() == [12] and got["causal"].tolist() == [1]
        else:
            assert got["kv_num_heads"].tolist() == [2] and got["scale"].tolist() == [0.25]


def test_field_collection_round_trips_through_read_fields(trt):
    values = {"num_heads": 6, "scale": 0.5, "layout": "bhsd", "kv_num_heads": 3}
    collection, arrays = field_collection(trt, KINDS, values)
    keep = _churn()
    assert read_fields(collection, "x::Y", KINDS, required=("num_heads",)) == values
    assert len(arrays) == len(KINDS)
    del keep
    names, _ = field_collection(trt, KINDS)
    assert [str(f.name) for f in names] == list(KINDS)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scale": 0.5}, "x::Y: required field 'num_heads' is missing"),
        ({"num_heads": 2, "heads": 2}, "unknown plugin field 'heads'; expected num_heads, scale, layout"),
        ({"num_heads": [2, 3]}, "field 'num_heads' must hold one value"),
    ],
)
def test_read_fields_names_the_plugin_and_the_field(trt, values, message):
    fields = []
    for name, value in values.items():
        data = np.array(np.atleast_1d(value), np.float32 if isinstance(value, float) else np.int32)
        kind = trt.PluginFieldType.FLOAT32 if data.dtype == np.float32 else trt.PluginFieldType.INT32
        fields.append((trt.PluginField(name, data, kind), data))
    collection = trt.PluginFieldCollection([f for f, _ in fields])
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        read_fields(
            collection, "x::Y", {k: KINDS[k] for k in ("num_heads", "scale", "layout")}, ("num_heads",)
        )
