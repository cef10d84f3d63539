"""Which float nodes stay in FP32, and why: by op type and attributes, by observed values, by the user.

A node is a *float node* when one of its inputs or outputs is an FP32 tensor. Nodes on integer/bool
tensors (shape arithmetic, index math, masks) are not float nodes and are never touched. Shape and
Size only read shapes, and Cast reads any type, so they impose no type on their input.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import onnx_ir as ir

from trtforge.passes.precision.observe import SENTINEL, ValueStats

FLOAT = ir.DataType.FLOAT
LOW_TYPES = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}
_TYPE_STR = {ir.DataType.FLOAT16: "tensor(float16)", ir.DataType.BFLOAT16: "tensor(bfloat16)"}

# Inputs that accept any type: nothing is cast in front of them.
ANY_TYPE_INPUTS = {("Shape", 0), ("Size", 0), ("Cast", 0), ("CastLike", 0)}
# Numerically sensitive by op type (overflow/underflow of exp and log, powers that leave the range).
SENSITIVE_OPS = {
    "Exp": "exp overflows FP16 above 11.1 and its relative error grows with |x|",
    "Log": "log of values that underflow FP16 (< 6e-8) is -inf",
    "Pow": "powers leave the FP16 range for moderate bases",
    "ReduceLogSumExp": "exp inside the reduction overflows",
    "ReduceLogSum": "log of a sum that may overflow",
}
NO_LOW_PRECISION_OPS = {
    "Upsample": "deprecated op without low-precision kernels",
    "NonMaxSuppression": "box coordinates and scores need FP32 comparisons",
    "Celu": "no low-precision kernel in ONNX Runtime",
}
ATTR_TYPED_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
REDUCE_OPS = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceProd", "CumSum"}
# Longest reduction summed in low precision: FP16 has an 11-bit significand, so beyond 2**11 terms a
# running sum stops absorbing unit increments (2048 + 1 == 2048 in FP16).
MAX_REDUCTION = 2048


@dataclasses.dataclass
class Decision:
    """One float node: FP32 when `reasons` is non-empty; positions whose type is fixed at FP32."""

    reasons: list[str] = dataclasses.field(default_factory=list)
    fixed_inputs: set[int] = dataclasses.field(default_factory=set)
    fixed_outputs: set[int] = dataclasses.field(default_factory=set)

    @property
    def low(self) -> bool:
        return not self.reasons


@dataclasses.dataclass(frozen=True)
class InitCheck:
    """How an FP32 initializer survives conversion: fine, fine after saturating sentinels, or not."""

    problem: str  # "" when it converts well
    saturates: bool


@dataclasses.dataclass(frozen=True)
class Options:
    """Thresholds and user choices the rules read."""

    low: ir.DataType
    data_max: float
    init_max: float
    keep_fp32: frozenset[str]
    max_reduction: int = MAX_REDUCTION


def is_float(v: ir.Value | None) -> bool:
    return v is not None and v.dtype == FLOAT


def float_nodes(graph: ir.Graph) -> list[ir.Node]:
    """Nodes with an FP32 input or output, except those that only read a float input's shape/type."""
    out = []
    for node in graph:
        outs = any(is_float(v) for v in node.outputs)
        ins = any(is_float(v) and (node.op_type, i) not in ANY_TYPE_INPUTS for i, v in enumerate(node.inputs))
        if outs or ins:
            out.append(node)
    return out


@functools.lru_cache(maxsize=512)
def _schema(op_type: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _allowed(schema: onnx.defs.OpSchema, formals: list, index: int) -> set[str]:
    if not formals:
        return set()
    formal = formals[min(index, len(formals) - 1)]
    for c in schema.type_constraints:
        if c.type_param_str == formal.type_str:
            return set(c.allowed_type_strs)
    return {formal.type_str}


def data_origin(graph: ir.Graph) -> dict[ir.Value, str]:
    """'data' (depends on graph input values), 'shape' (on shapes only) or 'const', per node output."""
    origin: dict[ir.Value, str] = dict.fromkeys(graph.inputs, "data")
    for node in graph:  # topological order
        if node.op_type in ("Shape", "Size"):
            kind = "shape"
        else:
            kinds = {origin.get(v, "const") for v in node.inputs if v is not None}
            kind = "data" if "data" in kinds else "shape" if "shape" in kinds else "const"
        for v in node.outputs:
            origin[v] = kind
    return origin


# A Q/DQ scale s multiplies codes |q| <= 127 whose own rounding error is s/2: a scale error below
# 1/254 of s moves no dequantized value by more than INT8 already does.
QDQ_SCALE_REL_ERROR = 1 / 254


def check_qdq_scale(tensor: ir.TensorProtocol, low: ir.DataType) -> InitCheck:
    """A Q/DQ scale converts unless a value flushes to zero or moves by more than `QDQ_SCALE_REL_ERROR`:
    subnormal FP16 scales (tiny weights after SmoothQuant) are fine, and keeping one FP32 would give
    the two operands of a quantized MatMul scales of different types, which TensorRT refuses."""
    w = tensor.numpy().astype(np.float32, copy=False).reshape(-1)
    back = w.astype(low.numpy()).astype(np.float32)
    nonzero = w != 0
    flushed = int(np.count_nonzero((back == 0) & nonzero))
    rel = float((np.abs(back - w)[nonzero] / np.abs(w[nonzero])).max()) if nonzero.any() else 0.0
    if flushed or not np.isfinite(back).all() or rel > QDQ_SCALE_REL_ERROR:
        return InitCheck(
            f"Q/DQ scale relative error {rel:.2e} in {low.name} > {QDQ_SCALE_REL_ERROR:.2e} "
            f"({flushed} of {w.size} values flush to zero)",
            False,
        )
    return InitCheck("", False)


def check_initializer(tensor: ir.TensorProtocol, low: ir.DataType, init_max: float) -> InitCheck:
    """Overflow above `init_max`, or relative error beyond twice the format's unit roundoff
    (which normal numbers never reach, so this flags values that flush to zero or go subnormal)."""
    w = tensor.numpy().astype(np.float32, copy=False)
    mag = np.abs(w)
    sentinel = mag >= SENTINEL
    saturates = bool(sentinel.any())
    regular = w[~sentinel & np.isfinite(w)]
    if regular.size == 0:
        return InitCheck("", saturates)
    peak = float(np.abs(regular).max())
    if peak > init_max:
        return InitCheck(f"|w| up to {peak:.4g} > init_max {init_max:.6g}", saturates)
    low_np = low.numpy()
    back = regular.astype(low_np).astype(np.float32)
    norm = float(np.linalg.norm(regular))
    unit = 2.0**-11 if low == ir.DataType.FLOAT16 else 2.0**-8
    if norm > 0:
        rel = float(np.linalg.norm(back - regular)) / norm
        if rel > 2 * unit:
            flushed = int(np.count_nonzero((back == 0) & (regular != 0)))
            return InitCheck(
                f"relative error {rel:.2e} in {low.name} ({flushed} of {regular.size} values flush to zero)",
                saturates,
            )
    return InitCheck("", saturates)


def _reduction_length(node: ir.Node, stats: dict[str, ValueStats]) -> int:
    x = node.inputs[0]
    st = stats.get(x.name) if x is not None else None
    if st is None or not st.shape:
        return 0
    shape = st.shape
    axes: list[int] | None = None
    if "axes" in node.attributes:
        axes = list(node.attributes["axes"].as_ints())
    elif node.op_type == "CumSum" or (len(node.inputs) > 1 and node.inputs[1] is not None):
        const = node.inputs[1].const_value if len(node.inputs) > 1 else None
        axes = [int(a) for a in np.atleast_1d(const.numpy())] if const is not None else None
    if axes is None or not axes:
        return int(np.prod(shape, dtype=np.int64))
    return int(np.prod([shape[a] for a in axes], dtype=np.int64))


class Classifier:
    """Runs every rule over the float nodes of one graph and returns a Decision per node."""

    def __init__(self, model: ir.Model, stats: dict[str, ValueStats], opts: Options):
        self.model = model
        self.graph = model.graph
        self.stats = stats
        self.opts = opts
        self.opset = model.opset_imports.get("", 1)
        self.origin = data_origin(self.graph)
        self.init_checks: dict[ir.Value, InitCheck] = {}

    def init_check(self, v: ir.Value) -> InitCheck:
        if v not in self.init_checks:
            self.init_checks[v] = check_initializer(v.const_value, self.opts.low, self.opts.init_max)
        return self.init_checks[v]

    def run(self) -> dict[ir.Node, Decision]:
        decisions = {node: self.decide(node) for node in float_nodes(self.graph)}
        match_quantized_operands(self.graph, decisions)
        return decisions

    def decide(self, node: ir.Node) -> Decision:
        d = Decision()
        op = node.op_type
        for entry in (node.name, op):
            if entry in self.opts.keep_fp32:
                d.reasons.append(f"user: --keep-fp32 {entry}")
                break
        schema = _schema(op, node.domain, self.opset) if node.domain in ("", "ai.onnx") else None
        if schema is None:
            d.reasons.append(f"custom op: no ONNX schema for {node.domain or 'ai.onnx'}::{op}")
            return d
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            d.reasons.append("control flow: subgraphs are not converted")
        if any(user.graph is not self.graph for v in node.outputs for user, _ in v.uses()):
            d.reasons.append("control flow: an output is read inside a subgraph, which stays FP32")
        for table, tag in ((SENSITIVE_OPS, "op type"), (NO_LOW_PRECISION_OPS, "op type")):
            if op in table:
                d.reasons.append(f"{tag}: {op} ({table[op]})")
        if op in ATTR_TYPED_OPS:
            d.reasons.append(f"op type: {op} output dtype is set by an attribute")
        self._schema_positions(node, schema, d)
        if self._is_shape_arithmetic(node):
            d.reasons.append("shape arithmetic: float math on tensor shapes, not on data")
        if op in REDUCE_OPS:
            n = _reduction_length(node, self.stats)
            if n > self.opts.max_reduction:
                d.reasons.append(f"long reduction: {n} terms > {self.opts.max_reduction}")
        self._value_rules(node, d)
        return d

    def _is_shape_arithmetic(self, node: ir.Node) -> bool:
        """Float math fed by Shape/Size (e.g. 1/sqrt(head_dim) computed at run time), and no data."""
        kinds = [self.origin.get(v, "const") for v in node.inputs if v is not None]
        if "data" in kinds:
            return False
        floats = [self.origin.get(v, "const") for v in node.inputs if is_float(v)]
        return "shape" in floats or (node.op_type == "Cast" and "shape" in kinds)

    def _schema_positions(self, node: ir.Node, schema: onnx.defs.OpSchema, d: Decision) -> None:
        want = _TYPE_STR[self.opts.low]
        convertible = 0
        for i, v in enumerate(node.inputs):
            if is_float(v) and (node.op_type, i) not in ANY_TYPE_INPUTS:
                if want in _allowed(schema, schema.inputs, i):
                    convertible += 1
                else:
                    d.fixed_inputs.add(i)
        for i, v in enumerate(node.outputs):
            if not is_float(v):
                continue
            stash = node.op_type == "LayerNormalization" and i > 0  # Mean/InvStdDev keep the stash type
            if not stash and want in _allowed(schema, schema.outputs, i):
                convertible += 1
            else:
                d.fixed_outputs.add(i)
        if convertible == 0:
            d.reasons.append(
                f"schema: {node.op_type}-{schema.since_version} has no {self.opts.low.name} "
                f"at opset {self.opset}"
            )

    def _value_rules(self, node: ir.Node, d: Decision) -> None:
        limit = self.opts.data_max
        for i, v in enumerate(node.inputs):
            if not is_float(v) or i in d.fixed_inputs or (node.op_type, i) in ANY_TYPE_INPUTS:
                continue
            if v.const_value is not None and not v.is_graph_input():
                scale = node.op_type in ("QuantizeLinear", "DequantizeLinear") and i == 1
                check = check_qdq_scale(v.const_value, self.opts.low) if scale else self.init_check(v)
                if check.problem:
                    d.reasons.append(f"weight: {v.name} {check.problem}")
                continue
            st = self.stats.get(v.name)
            if st is not None and st.absmax > limit:
                d.reasons.append(f"range: input {v.name} reaches |x| = {st.absmax:.4g} > data_max {limit:g}")
        for i, v in enumerate(node.outputs):
            if not is_float(v) or i in d.fixed_outputs:
                continue
            st = self.stats.get(v.name)
            if st is not None and st.absmax > limit:
                d.reasons.append(f"range: output {v.name} reaches |x| = {st.absmax:.4g} > data_max {limit:g}")


def _dq_inputs(node: ir.Node) -> list[ir.Node]:
    return [
        v.producer()
        for v in node.inputs
        if v is not None and v.producer() is not None and v.producer().op_type == "DequantizeLinear"
    ]


def match_quantized_operands(graph: ir.Graph, decisions: dict[ir.Node, Decision]) -> int:
    """Keep every Q/DQ of one quantized op in one scale type: when a DQ stays FP32 (a weight scale
    FP16 cannot hold), the DQs of the other operands of the ops it feeds, and the Q each of those DQs
    dequantizes, stay FP32 too. TensorRT fuses DQ(-> Cast) -> MatMul into an INT8 MatMul and refuses
    operand scales of different types ("type mismatch between matmul operand scales": MobileBERT
    after SmoothQuant). Returns the nodes moved to FP32."""
    moved = 0
    changed = True
    while changed:
        changed = False
        for node in graph:
            dqs = [dq for dq in _dq_inputs(node) if dq in decisions]
            lows = [decisions[dq].low for dq in dqs]
            if len(dqs) < 2 or all(lows) or not any(lows):
                continue
            kept = next(dq for dq in dqs if not decisions[dq].low)
            for dq in dqs:
                pair = [dq]
                q = dq.inputs[0].producer() if dq.inputs[0] is not None else None
                if q is not None and q.op_type == "QuantizeLinear" and q in decisions:
                    pair.append(q)
                for n in pair:
                    if decisions[n].low:
                        decisions[n].reasons.append(
                            f"quantized operand: '{kept.name}' feeding '{node.name}' keeps an FP32 scale, "
                            "and TensorRT needs one scale type across a quantized op's operands"
                        )
                        moved += 1
                        changed = True
    return moved
