"""ONNX -> TensorRT network, before any build: parse with node-level errors, refuse graph I/O an engine
cannot bind and custom ops no importer or plugin builds, register trtforge's plugins, and read the
network's I/O as TensorSpecs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtforge.core.backend import Backend, trt_dtype_name
from trtforge.core.tensor_spec import TensorSpec
from trtforge.errors import UserError


def parse_onnx(backend: Backend, network: Any, onnx_path: Path, source: str | None = None) -> Any:
    """Parse `onnx_path` into `network`; UserError listing every node the parser rejects, by name."""
    parser = backend.create_parser(network)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        lines = []
        for e in errors:
            node = e.node_name() or (f"#{e.node()}" if e.node() >= 0 else "<model>")
            lines.append(f"  node {node} ({e.node_operator() or '-'}): {e.desc()} [{e.code()}]")
        lines += _parser_hints(errors)
        raise UserError(
            f"TensorRT's ONNX parser ({backend.name} {backend.version}) rejected "
            f"{source or repr(str(onnx_path))}:\n" + "\n".join(lines)
        )
    return parser


def _parser_hints(errors: list[Any]) -> list[str]:
    """Lines saying what some parser errors mean. For a standard ONNX op the parser has no importer for,
    it looks for a plugin of that name and says "Plugin not found, are the plugin name, version, and
    namespace correct?", though no plugin is involved; a dynamic EyeLike is fixed by the passes."""
    import onnx

    named = [(e.node_operator() or "", e.desc()) for e in errors]
    ops = sorted({op for op, desc in named if "Plugin not found" in desc and onnx.defs.has(op)})
    hints = []
    if any("Eyelike does not work for dynamically shaped" in desc for _, desc in named):
        hints.append(
            "  EyeLike over a dynamic shape: the cleanup pass rewrites it as Range/Equal, which TensorRT "
            "parses; compile with the passes (not --no-passes; --passes must include cleanup)."
        )
    if ops:
        hints.append(
            f"  {', '.join(ops)}: standard ONNX op(s) this TensorRT's parser has no importer for (it then "
            "looks for a plugin of that name; none is missing). Express the computation with other ops, or "
            "run it outside the engine."
        )
    return hints


# ONNX element types no TensorRT engine binding can hold.
_NO_BINDING_TYPES = ("STRING", "COMPLEX64", "COMPLEX128")


def check_io(onnx_path: Path) -> None:
    """UserError for graph I/O an engine cannot bind as the model names it: an output that is a graph
    input passed through unchanged (the parser would rename the input to `__NAME`, so callers' feeds
    would no longer match), or a string/complex tensor."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    passthrough = [o.name for o in graph.output if o.name in inputs]
    if passthrough:
        raise UserError(
            f"output(s) {passthrough} are graph inputs returned unchanged; a TensorRT engine needs distinct "
            "input and output tensors (its ONNX parser would rename the input, so feeds by the model's "
            "input names would fail). Drop them from the model's outputs (the caller already holds them)."
        )
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for v in values:
            type_name = onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)
            if v.name in inputs | {o.name for o in graph.output} and type_name in _NO_BINDING_TYPES:
                raise UserError(
                    f"{kind} '{v.name}' is a {type_name.lower()} tensor; TensorRT engines bind numeric and "
                    "bool tensors only. Keep string/complex processing outside the model."
                )


def check_custom_ops(onnx_path: str | os.PathLike[str], backend: Backend, source: str | None = None) -> None:
    """UserError naming every node of a custom-domain op the backend's ONNX parser has neither an importer
    nor a registered plugin for (said before any pass or build runs, instead of the parser's message)."""
    import onnx

    from trtforge._custom_ops import custom_nodes, refuse_unknown

    proto = onnx.load(str(onnx_path), load_external_data=False)
    nodes = custom_nodes(proto)
    if not nodes:
        return
    importers = backend.parser_supports({n.op_type for n in nodes})
    creators = backend.plugin_creators()
    unknown = [
        n
        for n in nodes
        if n.op_type not in importers and (n.op_type, n.plugin_version, n.plugin_namespace) not in creators
    ]
    near = sorted({c for c in creators for n in unknown if c[0] == n.op_type})
    versions = (
        " Registered under those names: "
        + ", ".join(f"{name} version {v!r} namespace {ns!r}" for name, v, ns in near)
        + "; the parser looks up the node's plugin_version (default '1') and plugin_namespace (default '') "
        "attributes, so set them to match."
        if near
        else ""
    )
    refuse_unknown(
        proto,
        lambda n: n not in unknown,
        source or f"'{onnx_path}'",
        f"{backend.name} {backend.version}",
        "TensorRT builds an op outside the ONNX standard only through a plugin registered under the op's "
        "name: load the plugin's library before compiling (in the API, "
        "tensorrt.get_plugin_registry().load_library(PATH) before trtforge.compile), or export the op as "
        f"standard ONNX ops or an ONNX local function.{versions}",
    )


def register_plugins_if_needed(backend: Backend, onnx_path: Path) -> None:
    """Register trtforge's plugin creators before parsing a graph that holds trtforge-domain nodes."""
    import onnx

    from trtforge.plugins.attention.spec import DOMAIN

    proto = onnx.load(str(onnx_path), load_external_data=False)
    if any(n.domain == DOMAIN for n in proto.graph.node):
        from trtforge.plugins.attention.plugin import register_plugins

        register_plugins(backend)


def network_io(network: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of a parsed network as manifest TensorSpecs (-1 for dynamic dims)."""
    ins = [network.get_input(i) for i in range(network.num_inputs)]
    outs = [network.get_output(i) for i in range(network.num_outputs)]
    spec = lambda t: TensorSpec(t.name, trt_dtype_name(t.dtype), [int(d) for d in t.shape])  # noqa: E731
    return [spec(t) for t in ins], [spec(t) for t in outs]
