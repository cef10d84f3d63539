"""The FlashAttention TensorRT plugin: IPluginV3 (OneCore/OneBuild/OneRuntime) + IPluginCreatorV3One.

The classes derive from the lazily imported TensorRT module, so they are built in
:func:`plugin_classes` from a :class:`~trtforge.core.backend.Backend` (tensorrt-facts.md §5.1 for
the method names). TensorRT times every kernel configuration as a plugin *tactic* while building and
stores the winner in the engine, so ``enqueue`` launches one fixed configuration: no autotuning at
run time, nothing synchronized, safe inside CUDA graph capture.

Only datacenter TensorRT can put a Python plugin in a network (TensorRT-RTX has no
``add_plugin_v3``): :func:`check_plugin_support` says so early. A Python plugin also needs Python,
torch (CUDA) and Triton wherever the engine is built or run; the engine does not embed the kernel.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from trtforge.errors import UserError
from trtforge.kernels.configs import config_for_tactic, valid_tactics
from trtforge.plugins.attention.plugin_common import (
    PluginBasics,
    creator_class,
    init_plugin,
    read_fields,
    torch_dtype,
)
from trtforge.plugins.attention.spec import (
    LAYOUT_BHSD,
    LAYOUT_PACKED,
    PLUGIN_NAME,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    FlashAttentionAttrs,
    check_head_dim,
)

__all__ = [
    "check_plugin_support",
    "output_dims",
    "parse_fields",
    "plugin_classes",
    "register_creator_once",
    "register_plugins",
]

_FIELDS = {"num_heads": "int32", "scale": "float32", "causal": "int32", "layout": "char"}
_WHERE = f"{PLUGIN_NAMESPACE}::{PLUGIN_NAME}"
_REGISTERED: dict[tuple[int, str], Any] = {}  # (id(registry), plugin) -> creator (kept alive here)


def check_plugin_support(backend: Any) -> None:
    """Raise a UserError unless `backend` can host the plugin and its kernel can run here."""
    caps = backend.capabilities
    if not caps.can_host_plugins:
        raise UserError(
            f"--attention plugin needs datacenter TensorRT with custom-plugin support, but "
            f"{caps.plugin_reason}. Use `--attention native` (TensorRT's fused attention layer) instead."
        )
    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"--attention plugin runs a Triton kernel inside TensorRT and needs {', '.join(missing)} "
            "installed (pip install torch triton, CUDA builds), or use `--attention native`."
        )


def parse_fields(fields: Any) -> FlashAttentionAttrs:
    """Read the plugin fields (from the ONNX node's attributes or an engine) into validated attrs."""
    values = read_fields(fields, _WHERE, _FIELDS, required=("num_heads", "scale"))
    return FlashAttentionAttrs(
        num_heads=values["num_heads"],
        scale=values["scale"],
        causal=values.get("causal", 0),
        layout=values.get("layout", LAYOUT_BHSD),
    )


def output_dims(
    attrs: FlashAttentionAttrs, first_input: list[Any], builder: Any, floor_div: Any
) -> list[Any]:
    """Output dims from the first input's dim expressions: [B,H,S_q,D] as-is, or [B,S,3·H·D] -> [B,S,H·D]."""
    if attrs.layout == LAYOUT_BHSD:
        return list(first_input)
    batch, seq, width = first_input
    return [batch, seq, builder.operation(floor_div, width, builder.constant(3))]


@functools.lru_cache(maxsize=4)
def plugin_classes(backend: Any) -> tuple[type, type]:
    """(FlashAttentionPlugin, FlashAttentionCreator) derived from `backend.trt`'s plugin interfaces."""
    trt = backend.trt
    float_types = (trt.DataType.HALF, trt.DataType.BF16, trt.DataType.FLOAT)
    mask_types = (trt.DataType.BOOL, trt.DataType.INT32, trt.DataType.INT64)
    dtype_names = {trt.DataType.HALF: "float16", trt.DataType.BF16: "bfloat16", trt.DataType.FLOAT: "float32"}

    class FlashAttentionPlugin(
        PluginBasics, trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime
    ):
        """Fused multi-head attention; fields num_heads, scale, causal, layout."""

        def __init__(self, attrs: FlashAttentionAttrs, tactic: int = 0) -> None:
            metadata = f"heads={attrs.num_heads} causal={int(attrs.causal)} layout={attrs.layout}"
            init_plugin(self, trt, trt.IPluginV3OneBuild, PLUGIN_NAME, 1, metadata)
            self.attrs = attrs
            self.tactic = int(tactic)
            self.head_dim = -1  # known after configure_plugin: limits the tactics to tiles that fit
            self.dtype_name: str | None = None

        # -- core --------------------------------------------------------------------------------
        def clone(self) -> FlashAttentionPlugin:
            twin = FlashAttentionPlugin(self.attrs, self.tactic)
            twin.head_dim, twin.dtype_name = self.head_dim, self.dtype_name
            return twin

        # -- build -------------------------------------------------------------------------------
        def _num_data_inputs(self) -> int:
            return 3 if self.attrs.layout == LAYOUT_BHSD else 1

        def get_output_data_types(self, input_types: list[Any]) -> list[Any]:
            return [input_types[0]]

        def get_output_shapes(
            self, inputs: list[Any], shape_inputs: list[Any], expr_builder: Any
        ) -> list[Any]:
            first = [inputs[0][i] for i in range(len(inputs[0]))]
            dims = output_dims(self.attrs, first, expr_builder, trt.DimensionOperation.FLOOR_DIV)
            return [trt.DimsExprs(dims)]

        def supports_format_combination(self, pos: int, in_out: list[Any], num_inputs: int) -> bool:
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            n_data = self._num_data_inputs()
            if num_inputs not in (n_data, n_data + 1):
                return False
            if pos == 0:
                return desc.type in float_types
            if pos < n_data or pos == num_inputs:  # k, v, or the output: the dtype of input 0
                return desc.type == in_out[0].desc.type
            return desc.type in mask_types  # the key-padding mask

        def configure_plugin(self, inp: list[Any], out: list[Any]) -> None:
            n_data = self._num_data_inputs()
            if len(inp) not in (n_data, n_data + 1):
                raise UserError(
                    f"{PLUGIN_NAME} ({self.attrs.layout}) takes {n_data} input(s) plus an optional mask; "
                    f"got {len(inp)}."
                )
            dims = list(inp[0].desc.dims)
            heads = self.attrs.num_heads
            if self.attrs.layout == LAYOUT_BHSD:
                if len(dims) != 4:
                    raise UserError(f"{PLUGIN_NAME}: q must be 4-D [B, H, S, D]; got dims {dims}.")
                if dims[1] >= 0 and dims[1] != heads:
                    raise UserError(f"{PLUGIN_NAME}: q has {dims[1]} heads but num_heads is {heads}.")
                head_dim = dims[3]
            else:
                if len(dims) != 3:
                    raise UserError(f"{PLUGIN_NAME}: packed qkv must be 3-D [B, S, 3·H·D]; got dims {dims}.")
                if dims[2] >= 0 and dims[2] % (3 * heads):
                    raise UserError(f"{PLUGIN_NAME}: packed width {dims[2]} is not a multiple of 3·{heads}.")
                head_dim = dims[2] // (3 * heads) if dims[2] >= 0 else -1
            if head_dim >= 0:
                check_head_dim(head_dim, f"{PLUGIN_NAMESPACE}::{PLUGIN_NAME}")
            self.head_dim = head_dim
            self.dtype_name = dtype_names.get(inp[0].desc.type)

        def get_workspace_size(self, inp: list[Any], out: list[Any]) -> int:
            return 0

        def get_valid_tactics(self) -> list[int]:
            return valid_tactics(self.head_dim, self.dtype_name)

        # -- runtime -----------------------------------------------------------------------------
        def get_fields_to_serialize(self) -> Any:
            a = self.attrs
            values = {"num_heads": a.num_heads, "scale": a.scale, "causal": int(a.causal), "layout": a.layout}
            return self.serialized_fields(trt, _FIELDS, values)

        def enqueue(
            self,
            input_desc: list[Any],
            output_desc: list[Any],
            inputs: list[int],
            outputs: list[int],
            workspace: int,
            stream: int,
        ) -> None:
            from trtforge.kernels.flash_attention import DeviceTensor, flash_attention_raw, packed_qkv_views

            def tensor(desc: Any, ptr: int) -> DeviceTensor:
                return DeviceTensor.contiguous(ptr, torch_dtype(trt, desc.type), tuple(desc.dims))

            n_data = self._num_data_inputs()
            heads = self.attrs.num_heads
            mask = tensor(input_desc[n_data], inputs[n_data]) if len(inputs) > n_data else None
            if self.attrs.layout == LAYOUT_PACKED:
                q, k, v = packed_qkv_views(tensor(input_desc[0], inputs[0]), heads)
                b, _, s, d = q.shape
                out = DeviceTensor(
                    int(outputs[0]), q.dtype, (b, heads, s, d), (s * heads * d, d, heads * d, 1)
                )
            else:
                q, k, v = (tensor(input_desc[i], inputs[i]) for i in range(3))
                out = tensor(output_desc[0], outputs[0])
            config = config_for_tactic(self.tactic, q.shape[3], dtype_names[input_desc[0].type])
            flash_attention_raw(
                q,
                k,
                v,
                out,
                mask,
                scale=self.attrs.scale,
                causal=self.attrs.causal,
                stream=stream,
                config=config,
            )

    creator = creator_class(
        trt, PLUGIN_NAME, _FIELDS, lambda fields: FlashAttentionPlugin(parse_fields(fields))
    )
    return FlashAttentionPlugin, creator


def register_plugins(backend: Any) -> Any:
    """Register the FlashAttention creator with `backend`'s plugin registry, once; returns the creator.

    Call it before parsing an ONNX model that holds ``trtforge::FlashAttention`` nodes and before
    deserializing an engine built with them. Raises a UserError where plugins cannot be hosted.
    """
    return register_creator_once(backend, plugin_classes, _WHERE)


def register_creator_once(backend: Any, classes: Any, where: str) -> Any:
    """Register the creator of `classes(backend)` (a (plugin, creator) class pair) with `backend`'s plugin
    registry once per registry and per plugin; returns the creator, which trtforge keeps alive (TensorRT
    holds no Python reference). Shared by every trtforge plugin."""
    check_plugin_support(backend)
    registry = backend.trt.get_plugin_registry()
    key = (id(registry), where)
    if key not in _REGISTERED:
        _, creator_cls = classes(backend)
        creator = creator_cls()
        if not registry.register_creator(creator, PLUGIN_NAMESPACE):
            raise UserError(
                f"TensorRT refused to register plugin {where} v{PLUGIN_VERSION} "
                "(another creator with that name and version is already registered)."
            )
        _REGISTERED[key] = creator
    return _REGISTERED[key]
