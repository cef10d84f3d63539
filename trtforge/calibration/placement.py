"""Where Q/DQ goes so TensorRT fuses it (tensorrt-facts.md §2.2): named rules, each returning a reason.

- ``gemm_inputs``: MatMul/Gemm/Conv get Q/DQ on their activation input(s) (per-tensor) and on their
  constant weight (per output channel: MatMul [K, N] -> axis 1, Gemm transB -> 0 else 1, Conv -> 0).
- ``attention_bmm``: a MatMul with two activation inputs (QK^T, AV) quantizes both per-tensor;
  softmax, masks and scaling between them stay in float.
- ``small_gemm``: GEMMs with K or N < 16, and Convs with < 16 channels not a multiple of 8, stay in
  float (NVIDIA: Q/DQ there costs TensorRT time).
- ``residual_add``: an Add joining a quantized Conv's output with another activation gets Q/DQ on
  the other (residual) input only, so TensorRT fuses Conv + Add.
- Normalization, softmax, GELU and every other op are never quantized; a tensor read by several
  quantized consumers is quantized once (see qdq.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from trtforge.errors import UserError

if TYPE_CHECKING:
    import onnx

SUPPORTED_OP_TYPES = ("MatMul", "Gemm", "Conv")
_MIN_GEMM_DIM = 16


@dataclass
class QuantTarget:
    """One node to quantize: activation inputs (per-tensor) and an optional constant weight (per-channel)."""

    node: str
    op_type: str
    rule: str
    activations: list[str]
    weight: str | None = None
    weight_axis: int | None = None


@dataclass
class Decision:
    """Why a candidate node is or is not quantized."""

    node: str
    op_type: str
    quantized: bool
    rule: str
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "op_type": self.op_type,
            "quantized": self.quantized,
            "rule": self.rule,
            "reason": self.reason,
        }


@dataclass
class Plan:
    """The placement: nodes to quantize, extra residual tensors, and every decision with its reason."""

    targets: list[QuantTarget] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)

    def activation_tensors(self) -> list[str]:
        """Every activation tensor to quantize, each once, in graph order."""
        seen: dict[str, None] = {}
        for t in self.targets:
            for a in t.activations:
                seen.setdefault(a, None)
        return list(seen)


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node a unique name (placement, exclusions and reports refer to nodes by name)."""
    used = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in used:
                name += "_"
            n.name = name
            used.add(name)


def constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs by tensor name (the graph's build-time constants)."""
    from onnx import numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def plan_placement(
    model: onnx.ModelProto,
    *,
    op_types: tuple[str, ...] = SUPPORTED_OP_TYPES,
    exclude_nodes: tuple[str, ...] = (),
) -> Plan:
    """Choose the nodes and tensors to quantize (the model's nodes must be named: see name_nodes)."""
    bad = sorted(set(op_types) - set(SUPPORTED_OP_TYPES))
    if bad:
        raise UserError(f"cannot quantize op type(s) {bad}; supported: {list(SUPPORTED_OP_TYPES)}.")
    if not op_types:
        raise UserError(
            f"--op-types (op_types) names no op type, so nothing would be quantized; give one or more of "
            f"{','.join(SUPPORTED_OP_TYPES)}."
        )
    names = {n.name for n in model.graph.node}
    unknown = sorted(set(exclude_nodes) - names)
    if unknown:
        raise UserError(
            f"excluded node(s) {unknown} are not in the model; node names are as in the ONNX graph."
        )
    consts = constant_values(model)
    plan = Plan()
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        if node.name in exclude_nodes:
            plan.decisions.append(
                Decision(node.name, node.op_type, False, "excluded", "excluded by the user")
            )
            continue
        target, decision = _classify(node, consts)
        plan.decisions.append(decision)
        if target is not None:
            plan.targets.append(target)
    _residual_adds(model, plan, consts)
    return plan


def _float_const(consts: dict[str, np.ndarray], name: str) -> np.ndarray | None:
    v = consts.get(name)
    return v if v is not None and v.dtype.kind == "f" else None


def _classify(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> tuple[QuantTarget | None, Decision]:
    def skip(rule: str, reason: str) -> tuple[None, Decision]:
        return None, Decision(node.name, node.op_type, False, rule, reason)

    def take(t: QuantTarget, reason: str) -> tuple[QuantTarget, Decision]:
        return t, Decision(node.name, node.op_type, True, t.rule, reason)

    if node.op_type == "MatMul":
        a, b = node.input[0], node.input[1]
        wa, wb = _float_const(consts, a), _float_const(consts, b)
        if wa is None and wb is None:
            return take(
                QuantTarget(node.name, "MatMul", "attention_bmm", [a, b]),
                "activation x activation MatMul (attention BMM): both inputs per-tensor",
            )
        if wb is not None and wa is None and wb.ndim == 2:
            k, n = wb.shape
            if min(k, n) < _MIN_GEMM_DIM:
                return skip("small_gemm", f"weight {k}x{n}: K or N < {_MIN_GEMM_DIM}, kept in float")
            return take(
                QuantTarget(node.name, "MatMul", "gemm_inputs", [a], b, 1),
                f"activation per-tensor, weight [{k}, {n}] per-channel axis 1",
            )
        return skip("unsupported_weight", "constant input is not a 2-D right-hand weight; kept in float")
    if node.op_type == "Gemm":
        w = _float_const(consts, node.input[1])
        if w is None or _float_const(consts, node.input[0]) is not None:
            return skip("unsupported_weight", "Gemm without a constant B and an activation A; kept in float")
        trans_b = any(at.name == "transB" and at.i == 1 for at in node.attribute)
        n, k = (w.shape[0], w.shape[1]) if trans_b else (w.shape[1], w.shape[0])
        if min(k, n) < _MIN_GEMM_DIM:
            return skip("small_gemm", f"Gemm K={k} N={n}: K or N < {_MIN_GEMM_DIM}, kept in float")
        axis = 0 if trans_b else 1
        return take(
            QuantTarget(node.name, "Gemm", "gemm_inputs", [node.input[0]], node.input[1], axis),
            f"activation per-tensor, weight per-channel axis {axis} (transB={int(trans_b)})",
        )
    w = _float_const(consts, node.input[1])  # Conv
    if w is None or _float_const(consts, node.input[0]) is not None:
        return skip("unsupported_weight", "Conv without a constant weight; kept in float")
    group = next((at.i for at in node.attribute if at.name == "group"), 1)
    cout, cin = int(w.shape[0]), int(w.shape[1]) * int(group)
    if min(cin, cout) < _MIN_GEMM_DIM and not (cin % 8 == 0 and cout % 8 == 0):
        return skip("small_gemm", f"Conv {cin}->{cout} channels: < {_MIN_GEMM_DIM} and not a multiple of 8")
    return take(
        QuantTarget(node.name, "Conv", "gemm_inputs", [node.input[0]], node.input[1], 0),
        "activation per-tensor, weight per-channel axis 0",
    )


def _residual_adds(model: onnx.ModelProto, plan: Plan, consts: dict[str, np.ndarray]) -> None:
    quantized_conv_out = {
        o
        for n in model.graph.node
        for o in n.output
        if n.op_type == "Conv" and n.name in {t.node for t in plan.targets}
    }
    for node in model.graph.node:
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        a, b = node.input
        if a in consts or b in consts:
            continue
        if (a in quantized_conv_out) == (b in quantized_conv_out):
            continue
        residual = b if a in quantized_conv_out else a
        plan.targets.append(QuantTarget(node.name, "Add", "residual_add", [residual]))
        plan.decisions.append(
            Decision(
                node.name,
                "Add",
                True,
                "residual_add",
                f"residual input '{residual}' quantized (not the Conv output) so TensorRT fuses Conv + Add",
            )
        )
