"""Nodes of an ONNX model outside the standard domains, and which of them a runtime has no kernel for.

TensorRT's parser maps an op it has no importer for to a plugin of the same name, and ONNX Runtime needs
a registered kernel; either one otherwise fails in its own words, late. These checks name the node, op and
domain first, before any export, pass or build runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtforge.errors import UserError

if TYPE_CHECKING:
    import onnx

# Domains of the ONNX standard (ONNX Runtime and TensorRT implement these themselves).
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
# trtforge's own ops: the attention plugin (registered with the builder on demand) and the decoder
# export's placeholder domain (rewritten to standard ops before any graph leaves the exporter).
OWN_DOMAINS = frozenset({"trtforge", "trtforge.step"})
# Without onnxruntime's kernel listing: the domains its CPU build ships kernels for.
_ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc"})
_SHOWN = 5


@dataclass(frozen=True)
class CustomNode:
    """A node whose op is neither standard ONNX, trtforge's own, nor a function defined in the model."""

    name: str
    op_type: str
    domain: str
    where: str  # "the main graph", "a subgraph of node 'loop'", "function 'dom:f'"
    plugin_version: str = "1"  # the plugin the TensorRT parser looks up (node attributes, its defaults)
    plugin_namespace: str = ""

    def describe(self) -> str:
        """ "node 'n' (op 'Op' of domain 'dom', in the main graph)"."""
        return f"node '{self.name}' (op '{self.op_type}' of domain '{self.domain}', in {self.where})"


def custom_nodes(proto: onnx.ModelProto) -> list[CustomNode]:
    """Every custom-domain node of `proto`: main graph, control-flow subgraphs and model-local functions."""
    import onnx

    local = {(f.domain, f.name) for f in proto.functions}
    found: list[CustomNode] = []

    def walk(nodes: Iterable[onnx.NodeProto], where: str) -> None:
        for i, n in enumerate(nodes):
            if n.domain not in STANDARD_DOMAINS | OWN_DOMAINS and (n.domain, n.op_type) not in local:
                strings = {a.name: a.s.decode(errors="replace") for a in n.attribute if a.type == a.STRING}
                found.append(
                    CustomNode(
                        n.name or f"#{i}",
                        n.op_type,
                        n.domain,
                        where,
                        strings.get("plugin_version", "1"),
                        strings.get("plugin_namespace", ""),
                    )
                )
            for a in n.attribute:
                sub = f"a subgraph of node '{n.name or f'#{i}'}'"
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g.node, sub)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        walk(g.node, sub)

    walk(proto.graph.node, "the main graph")
    for f in proto.functions:
        walk(f.node, f"function '{f.domain}:{f.name}'")
    return found


def _listing(nodes: list[CustomNode]) -> str:
    more = f" and {len(nodes) - _SHOWN} more" if len(nodes) > _SHOWN else ""
    return "; ".join(n.describe() for n in nodes[:_SHOWN]) + more


def refuse_unknown(
    proto: onnx.ModelProto, known: Callable[[CustomNode], bool], where: str, runtime: str, remedy: str
) -> None:
    """UserError naming the custom nodes of `proto` that `known` rejects (`runtime` cannot run them)."""
    unknown = [n for n in custom_nodes(proto) if not known(n)]
    if unknown:
        ops = sorted({f"{n.domain}:{n.op_type}" for n in unknown})
        raise UserError(
            f"{where} holds {len(unknown)} node(s) of custom op(s) {', '.join(ops)} that {runtime} has no "
            f"implementation for: {_listing(unknown)}. {remedy}"
        )


@functools.lru_cache(maxsize=1)
def _ort_kernels() -> frozenset[tuple[str, str]] | None:
    """(domain, op_type) of every kernel this onnxruntime registers, or None where it does not say."""
    try:
        from onnxruntime.capi import _pybind_state

        return frozenset((k.domain, k.op_type) for k in _pybind_state.get_all_opkernel_def())
    except (ImportError, AttributeError):
        return None


def onnxruntime_knows(node: CustomNode) -> bool:
    """True when ONNX Runtime (CPU) has a kernel for `node`'s op (or, not knowing, for its domain)."""
    kernels = _ort_kernels()
    if kernels is None:
        return node.domain in _ORT_DOMAINS
    return (node.domain, node.op_type) in kernels


def refuse_unknown_to_onnxruntime(proto: onnx.ModelProto, where: str, remedy: str) -> None:
    """UserError naming the custom nodes ONNX Runtime cannot run, said before a session fails on them."""
    import onnxruntime

    refuse_unknown(proto, onnxruntime_knows, where, f"ONNX Runtime {onnxruntime.__version__}", remedy)
