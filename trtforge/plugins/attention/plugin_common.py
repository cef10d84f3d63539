"""What trtforge's TensorRT plugins share: their fields, dtypes, creator and plugin-independent methods.

A plugin's fields are declared once as ``{name: kind}`` (kind ``int32``, ``float32`` or ``char``, a
NUL-terminated string); the same declaration reads them from an ONNX node or an engine, lists them
for the creator and serializes them. TensorRT is passed in (``backend.trt``), never imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trtforge.errors import UserError
from trtforge.plugins.attention.spec import PARSER_ONLY_FIELDS, PLUGIN_NAMESPACE, PLUGIN_VERSION

FieldKinds = Mapping[str, str]  # field name -> "int32" | "float32" | "char"
_NUMPY = {"int32": np.int32, "float32": np.float32, "char": np.int8}


def read_fields(fields: Any, where: str, kinds: FieldKinds, required: tuple[str, ...]) -> dict[str, Any]:
    """Field values by name (ONNX node attributes or an engine's saved fields), or a UserError naming
    the plugin `where` and the unknown, malformed or missing field."""
    values: dict[str, Any] = {}
    for f in fields:
        name = str(f.name)
        if name in PARSER_ONLY_FIELDS:
            continue
        if name not in kinds:
            raise UserError(f"{where}: unknown plugin field '{name}'; expected {', '.join(kinds)}.")
        data = np.asarray(f.data)
        if kinds[name] == "char":
            values[name] = bytes(data.astype(np.uint8)).split(b"\0", 1)[0].decode()
        elif data.size != 1:
            raise UserError(f"{where}: field '{name}' must hold one value; got {data}.")
        else:
            values[name] = data.reshape(()).item()
    for name in required:
        if name not in values:
            raise UserError(f"{where}: required field '{name}' is missing.")
    return values


def field_collection(
    trt: Any, kinds: FieldKinds, values: Mapping[str, Any] | None = None
) -> tuple[Any, list[np.ndarray]]:
    """A PluginFieldCollection of `kinds` (empty fields, a creator's field names, without `values`;
    else those values, a plugin's fields to serialize) and the arrays it points into: a PluginField
    does not own its data, so the caller keeps them alive as long as TensorRT may read them."""
    types = {
        "int32": trt.PluginFieldType.INT32,
        "float32": trt.PluginFieldType.FLOAT32,
        "char": trt.PluginFieldType.CHAR,
    }
    arrays = []
    for name, kind in kinds.items():
        if values is None:
            arrays.append(np.array([], _NUMPY[kind]))
        elif kind == "char":
            arrays.append(np.frombuffer(str(values[name]).encode(), np.int8).copy())
        else:
            arrays.append(np.array([values[name]], _NUMPY[kind]))
    fields = [trt.PluginField(name, data, types[kind]) for (name, kind), data in zip(kinds.items(), arrays)]
    return trt.PluginFieldCollection(fields), arrays


def torch_dtype(trt: Any, dtype: Any) -> Any:
    """The torch dtype of a TensorRT tensor type (`trt.DataType` member) that a plugin's enqueue reads
    or writes; by member name, so that bindings lacking some types still map the others."""
    import torch

    table = {
        "HALF": torch.float16,
        "BF16": torch.bfloat16,
        "FLOAT": torch.float32,
        "BOOL": torch.bool,
        "INT32": torch.int32,
        "INT64": torch.int64,
    }
    return table[dtype.name]


def init_plugin(
    plugin: Any, trt: Any, build_interface: Any, name: str, num_outputs: int, metadata: str
) -> None:
    """Initialise `plugin`'s TensorRT bases (core, `build_interface`, runtime) and its identity."""
    trt.IPluginV3.__init__(plugin)
    trt.IPluginV3OneCore.__init__(plugin)
    build_interface.__init__(plugin)
    trt.IPluginV3OneRuntime.__init__(plugin)
    plugin.plugin_name = name
    plugin.plugin_version = PLUGIN_VERSION
    plugin.plugin_namespace = PLUGIN_NAMESPACE
    plugin.num_outputs = num_outputs
    plugin.metadata_string = metadata
    plugin.timing_cache_id = ""


class PluginBasics:
    """IPluginV3 methods that are the same for every trtforge plugin: one object serves every
    capability, TensorRT picks the tactic, shapes need no per-shape state, each context gets a clone."""

    tactic: int

    def serialized_fields(self, trt: Any, kinds: FieldKinds, values: Mapping[str, Any]) -> Any:
        """`values` as the PluginFieldCollection TensorRT saves in the engine; the plugin keeps the
        field arrays alive (TensorRT reads them after this returns)."""
        collection, self._field_arrays = field_collection(trt, kinds, values)
        return collection

    def get_capability_interface(self, type: Any) -> Any:  # noqa: A002 (TensorRT's name)
        return self

    def set_tactic(self, tactic: int) -> None:
        self.tactic = int(tactic)

    def on_shape_change(self, inp: list[Any], out: list[Any]) -> None:
        pass

    def attach_to_context(self, resource_context: Any) -> Any:
        return self.clone()  # type: ignore[attr-defined]


def creator_class(trt: Any, name: str, kinds: FieldKinds, make: Callable[[Any], Any]) -> type:
    """An IPluginCreatorV3One subclass named ``{name}Creator`` that lists `kinds` and builds plugins
    with `make(field_collection)`."""

    class Creator(trt.IPluginCreatorV3One):
        def __init__(self) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            self.name = name
            self.plugin_version = PLUGIN_VERSION
            self.plugin_namespace = PLUGIN_NAMESPACE
            self.field_names, self._field_arrays = field_collection(trt, kinds)

        def create_plugin(self, plugin_name: str, field_collection: Any, phase: Any) -> Any:
            return make(field_collection)

    Creator.__name__ = Creator.__qualname__ = f"{name}Creator"
    Creator.__doc__ = f"Creates {name} plugins from fields (ONNX node attributes, or an engine's fields)."
    return Creator
