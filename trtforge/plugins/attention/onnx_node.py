"""The ONNX form of the `plugin` attention strategy: a ``trtforge::FlashAttention`` node, and a
model-local ONNX function of the same name so that ONNX Runtime (and the pass verifier) can run it.

TensorRT's ONNX parser sees the node's ``plugin_namespace``/``plugin_version`` attributes and maps it
to the registered plugin (tensorrt-facts.md §5.2); ONNX Runtime, which has no such op, expands the
local function instead. The function computes the same math as the kernel in FP32 with standard
ONNX ops (opset >= 15): softmax(q·kᵀ·scale, masked)·v, top-left causal, key padding, and zeros for
rows that see no key.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx.parser
import onnx_ir as ir

from trtforge.errors import UserError
from trtforge.plugins.attention.spec import (
    DOMAIN,
    MASKED_OVERLOAD,
    OP_TYPE,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    FlashAttentionAttrs,
)

__all__ = [
    "add_reference_function",
    "add_reference_function_proto",
    "flash_attention_attributes",
    "make_flash_attention_node",
]

DOMAIN_VERSION = 1
MIN_OPSET = 15  # CastLike, Shape(start, end)
_FLOAT_TYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT)
_MASK_TYPES = (ir.DataType.BOOL, ir.DataType.INT32, ir.DataType.INT64)
_FUNCTION_ATTRS = "num_heads, scale, causal, plugin_namespace, plugin_version"

# Shared body: FP32 scores, the causal triangle (only when causal = 1), masked softmax.
_SCORES = """
    qf = Cast <to = 1> (q)
    kf = Cast <to = 1> (k)
    vf = Cast <to = 1> (v)
    kt = Transpose <perm = [0, 1, 3, 2]> (kf)
    raw = MatMul (qf, kt)
    sc = Constant <value_float: float = @scale> ()
    s = Mul (raw, sc)
    shq = Shape <start = 2, end = 3> (q)
    shk = Shape <start = 2, end = 3> (k)
    sq = Squeeze (shq)
    skv = Squeeze (shk)
    i0 = Constant <value = int64 {0}> ()
    i1 = Constant <value = int64 {1}> ()
    rows = Range (i0, sq, i1)
    cols = Range (i0, skv, i1)
    ax0 = Constant <value = int64[1] {0}> ()
    ax1 = Constant <value = int64[1] {1}> ()
    r2 = Unsqueeze (rows, ax1)
    c2 = Unsqueeze (cols, ax0)
    above = Greater (c2, r2)
    ci = Constant <value_int: int = @causal> ()
    cb = Cast <to = 9> (ci)
    hide = And (above, cb)
    keep_c = Not (hide)
"""
_SOFTMAX = """
    lowest = Constant <value_float = -3.4e38> ()
    zero = Constant <value_float = 0.0> ()
    sm = Where (keep, s, lowest)
    p = Softmax <axis = -1> (sm)
    pk = Where (keep, p, zero)
    o = MatMul (pk, vf)
    out = CastLike (o, q)
"""
_UNMASKED = f"""
{OP_TYPE} <{_FUNCTION_ATTRS}> (q, k, v) => (out) {{
{_SCORES}
    keep = Identity (keep_c)
{_SOFTMAX}
}}
"""
_MASKED = f"""
{OP_TYPE} <{_FUNCTION_ATTRS}> (q, k, v, key_padding_mask) => (out) {{
{_SCORES}
    mb = Cast <to = 9> (key_padding_mask)
    ax12 = Constant <value = int64[2] {{1, 2}}> ()
    m4 = Unsqueeze (mb, ax12)
    keep = And (keep_c, m4)
{_SOFTMAX}
}}
"""


def flash_attention_attributes(*, num_heads: int, scale: float, causal: bool | int) -> dict[str, object]:
    """The node's attributes as a plain dict (for builders other than onnx_ir, e.g. a rewriter's `op`)."""
    attrs = FlashAttentionAttrs(num_heads=num_heads, scale=scale, causal=causal)
    return {
        "num_heads": attrs.num_heads,
        "scale": attrs.scale,
        "causal": int(attrs.causal),
        "plugin_namespace": PLUGIN_NAMESPACE,
        "plugin_version": PLUGIN_VERSION,
    }


def check_value(value: ir.Value, where: str, role: str, allowed: Sequence[ir.DataType], rank: int) -> None:
    """Reject a known wrong dtype/rank of the input `role` of the trtforge op `where` early; an unknown
    type or shape is accepted (filled in later). Both plugins' ONNX nodes check their inputs with it."""
    dtype = value.dtype
    if dtype is not None and dtype not in allowed:
        names = ", ".join(t.name for t in allowed)
        raise UserError(f"{where}: {role} '{value.name}' has dtype {dtype.name}; expected {names}.")
    if value.shape is not None and len(value.shape) != rank:
        raise UserError(f"{where}: {role} '{value.name}' must have rank {rank}; got shape {value.shape}.")


def check_one_dtype(values: Sequence[ir.Value], where: str, roles: str) -> None:
    """Refuse inputs `values` (named `roles` in the message) of the op `where` whose known dtypes differ."""
    dtypes = {x.dtype for x in values if x.dtype is not None}
    if len(dtypes) > 1:
        raise UserError(f"{where}: {roles} must share one dtype; got {sorted(t.name for t in dtypes)}.")


def make_flash_attention_node(
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    key_padding_mask: ir.Value | None = None,
    *,
    num_heads: int,
    scale: float,
    causal: bool | int,
    name: str | None = None,
) -> ir.Node:
    """A ``trtforge::FlashAttention`` node on q, k, v [B, H, S, D] (and an optional [B, S_kv] mask).

    The node is not inserted into any graph: the caller places it (e.g. ``graph.insert_before``) and
    rewires uses to ``node.outputs[0]``, whose dtype and (when known) shape are copied from q.
    With a mask the node carries the overload ``"masked"`` so that ONNX Runtime picks the 4-input
    reference function; call :func:`add_reference_function` once on the model.
    """
    where = f"{DOMAIN}::{OP_TYPE}"
    for value, role in ((q, "q"), (k, "k"), (v, "v")):
        check_value(value, where, role, _FLOAT_TYPES, 4)
    check_one_dtype((q, k, v), where, "q, k, v")
    inputs = [q, k, v]
    if key_padding_mask is not None:
        check_value(key_padding_mask, where, "key_padding_mask", _MASK_TYPES, 2)
        inputs.append(key_padding_mask)
    attrs = flash_attention_attributes(num_heads=num_heads, scale=scale, causal=causal)
    ir_attrs = [
        ir.AttrInt64("num_heads", attrs["num_heads"]),
        ir.AttrFloat32("scale", attrs["scale"]),
        ir.AttrInt64("causal", attrs["causal"]),
        ir.AttrString("plugin_namespace", PLUGIN_NAMESPACE),
        ir.AttrString("plugin_version", PLUGIN_VERSION),
    ]
    node = ir.Node(
        DOMAIN,
        OP_TYPE,
        inputs,
        ir_attrs,
        overload=MASKED_OVERLOAD if key_padding_mask is not None else "",
        num_outputs=1,
        version=DOMAIN_VERSION,
        name=name,
    )
    out = node.outputs[0]
    out.dtype = q.dtype
    if q.shape is not None:
        out.shape = ir.Shape(q.shape)
    if name:
        out.name = f"{name}_output"
    return node


def _reference_functions(opset: int) -> list[ir.Function]:
    functions = []
    for text, overload in ((_UNMASKED, ""), (_MASKED, MASKED_OVERLOAD)):
        header = f'<domain: "{DOMAIN}", opset_import: ["" : {opset}]>'
        proto = onnx.parser.parse_function(header + text)
        proto.overload = overload
        proto.doc_string = "Reference semantics of the trtforge FlashAttention plugin (FP32 math)."
        functions.append(ir.serde.deserialize_function(proto))
    return functions


def add_reference_function(model: ir.Model) -> None:
    """Add the local functions ``trtforge::FlashAttention`` (both overloads) and the opset import.

    Idempotent. The functions import the model's own default-domain opset (at least 15), since ONNX
    Runtime expects a model's functions to agree with the model on each domain's version.
    """
    opset = model.opset_imports.get("", None)
    if opset is None or opset < MIN_OPSET:
        raise UserError(
            f"{DOMAIN}::{OP_TYPE} reference function needs default-domain opset >= {MIN_OPSET}; "
            f"the model imports {opset}. Re-export with a newer opset."
        )
    for function in _reference_functions(opset):
        model.functions[function.identifier()] = function
    model.opset_imports[DOMAIN] = DOMAIN_VERSION
    if model.ir_version < 10:  # node overloads need IR version 10
        model.ir_version = 10


def add_reference_function_proto(model: onnx.ModelProto) -> onnx.ModelProto:
    """:func:`add_reference_function` for an ``onnx.ModelProto``; returns a new proto."""
    ir_model = ir.serde.deserialize_model(model)
    add_reference_function(ir_model)
    return ir.serde.serialize_model(ir_model)
