"""The ONNX form of the PagedAttention plugin: a ``trtforge::PagedAttention`` node with three outputs
(attention output, and the two cache pools updated in place), and a model-local ONNX function of
the same name that ONNX Runtime runs.

Inputs: query [B, Hq, S, D]; key/value [B, Hkv, S, D] (this step's new rows, right-padded);
key_cache / value_cache pools [num_blocks, block_size, Hkv, D] (the decoder step graph's layout);
block_table [B, max_blocks] int32; slot_mapping [B, S] int32, the flat pool slot
(block * block_size + offset) each new row is written to (padding rows: a scratch slot the caller
never reads); seq_lens [B] int32, each row's length *after* this step; query_lens [B] int32, its
real new tokens (1 <= query_lens[b] <= S). Query i of row b sits at position seq_lens[b] -
query_lens[b] + i and sees keys j <= that position with j < seq_lens[b] (LOWER_RIGHT for the real
rows; a padding row sees the whole sequence, as in the step graph; the plugin leaves padding rows'
output unspecified). The reference function is standard ONNX (opset >= 23) in the step graph's
own form: ScatterND into the pool flattened to [num_blocks * block_size, Hkv, D] at slot_mapping,
Gather(block_table) -> Transpose [0, 3, 1, 2, 4] -> Reshape [B, Hkv, max_blocks * block_size, D],
and ``Attention`` (GQA by the head counts, in the inputs' dtype, as the step graph computes it) with
that mask; keys at or past seq_lens[b] are zeroed first, so stale pool contents never reach the
output. TensorRT's parser maps the node to
the plugin through its ``plugin_namespace``/``plugin_version`` attributes.
"""

from __future__ import annotations

import onnx
import onnx.parser
import onnx_ir as ir

from trtforge.errors import UserError
from trtforge.plugins.attention.onnx_node import check_one_dtype, check_value
from trtforge.plugins.attention.spec import (
    DOMAIN,
    PAGED_OP_TYPE,
    PAGED_OUTPUTS,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    PagedAttentionAttrs,
)

__all__ = ["add_paged_reference_function", "make_paged_attention_node", "paged_attention_attributes"]

DOMAIN_VERSION = 1
MIN_OPSET = 23  # Attention
_FLOAT_TYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT)
_FUNCTION_ATTRS = "num_heads, kv_num_heads, scale, plugin_namespace, plugin_version"

_BODY = f"""
{PAGED_OP_TYPE} <{_FUNCTION_ATTRS}> (q, k_new, v_new, k_pool, v_pool, table, slots, seq_lens, query_lens)
    => (out, k_pool_out, v_pool_out) {{
    i0 = Constant <value = int64 {{0}}> ()
    i1 = Constant <value = int64 {{1}}> ()
    ax0 = Constant <value = int64[1] {{0}}> ()
    ax1 = Constant <value = int64[1] {{1}}> ()
    ax2 = Constant <value = int64[1] {{2}}> ()
    axl = Constant <value = int64[1] {{-1}}> ()
    ax13 = Constant <value = int64[2] {{1, 3}}> ()
    k_rows = Shape <start = 2> (k_pool)
    v_rows = Shape <start = 2> (v_pool)
    k_flat_shape = Concat <axis = 0> (axl, k_rows)
    v_flat_shape = Concat <axis = 0> (axl, v_rows)
    k_shape = Shape (k_pool)
    v_shape = Shape (v_pool)
    kflat = Reshape (k_pool, k_flat_shape)
    vflat = Reshape (v_pool, v_flat_shape)
    slots64 = Cast <to = 7> (slots)
    idx = Unsqueeze (slots64, axl)
    kupd = Transpose <perm = [0, 2, 1, 3]> (k_new)
    vupd = Transpose <perm = [0, 2, 1, 3]> (v_new)
    kw = ScatterND (kflat, idx, kupd)
    vw = ScatterND (vflat, idx, vupd)
    k_pool_out = Reshape (kw, k_shape)
    v_pool_out = Reshape (vw, v_shape)
    tbl = Cast <to = 7> (table)
    nb1 = Shape <start = 0, end = 1> (k_pool)
    nb = Squeeze (nb1)
    last_blk = Sub (nb, i1)
    tclip = Clip (tbl, i0, last_blk)
    kg = Gather <axis = 0> (k_pool_out, tclip)
    vg = Gather <axis = 0> (v_pool_out, tclip)
    kt = Transpose <perm = [0, 3, 1, 2, 4]> (kg)
    vt = Transpose <perm = [0, 3, 1, 2, 4]> (vg)
    b1 = Shape <start = 0, end = 1> (q)
    hkv1 = Shape <start = 2, end = 3> (k_pool)
    d1 = Shape <start = 3, end = 4> (k_pool)
    shape4 = Concat <axis = 0> (b1, hkv1, axl, d1)
    kc = Reshape (kt, shape4)
    vc = Reshape (vt, shape4)
    l1 = Shape <start = 2, end = 3> (kc)
    total = Squeeze (l1)
    cols = Range (i0, total, i1)
    lens = Cast <to = 7> (seq_lens)
    qlens = Cast <to = 7> (query_lens)
    past = Sub (lens, qlens)
    sq1 = Shape <start = 2, end = 3> (q)
    sq = Squeeze (sq1)
    steps = Range (i0, sq, i1)
    past2 = Unsqueeze (past, ax1)
    steps2 = Unsqueeze (steps, ax0)
    pos = Add (past2, steps2)
    pos3 = Unsqueeze (pos, ax2)
    causal = LessOrEqual (cols, pos3)
    lens2 = Unsqueeze (lens, ax1)
    kv_ok = Less (cols, lens2)
    kv_ok3 = Unsqueeze (kv_ok, ax1)
    keep3 = And (causal, kv_ok3)
    mask = Unsqueeze (keep3, ax1)
    kv_ok4 = Unsqueeze (kv_ok, ax13)
    zero_f = Constant <value_float = 0.0> ()
    zero = CastLike (zero_f, kc)
    kz = Where (kv_ok4, kc, zero)
    vz = Where (kv_ok4, vc, zero)
    out = Attention <scale: float = @scale> (q, kz, vz, mask)
}}
"""


def paged_attention_attributes(*, num_heads: int, kv_num_heads: int, scale: float) -> dict[str, object]:
    """The node's attributes as a plain dict (validated)."""
    a = PagedAttentionAttrs(num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale)
    return {
        "num_heads": a.num_heads,
        "kv_num_heads": a.kv_num_heads,
        "scale": a.scale,
        "plugin_namespace": PLUGIN_NAMESPACE,
        "plugin_version": PLUGIN_VERSION,
    }


def make_paged_attention_node(
    q: ir.Value,
    k_new: ir.Value,
    v_new: ir.Value,
    k_pool: ir.Value,
    v_pool: ir.Value,
    block_table: ir.Value,
    slot_mapping: ir.Value,
    seq_lens: ir.Value,
    query_lens: ir.Value,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    name: str | None = None,
) -> ir.Node:
    """A ``trtforge::PagedAttention`` node (not inserted into a graph): outputs are the attention
    output (q's dtype and shape) and the two pools after the write (the pools' dtype and shape).
    Call :func:`add_paged_reference_function` once on the model so ONNX Runtime can run it."""
    where = f"{DOMAIN}::{PAGED_OP_TYPE}"
    floats = {"query": q, "key": k_new, "value": v_new, "key_cache": k_pool, "value_cache": v_pool}
    for role, value in floats.items():
        check_value(value, where, role, _FLOAT_TYPES, 4)
    check_one_dtype(tuple(floats.values()), where, "query, key, value and the caches")
    check_value(block_table, where, "block_table", (ir.DataType.INT32,), 2)
    check_value(slot_mapping, where, "slot_mapping", (ir.DataType.INT32,), 2)
    check_value(seq_lens, where, "seq_lens", (ir.DataType.INT32,), 1)
    check_value(query_lens, where, "query_lens", (ir.DataType.INT32,), 1)
    attrs = paged_attention_attributes(num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale)
    ir_attrs = [
        ir.AttrInt64("num_heads", attrs["num_heads"]),
        ir.AttrInt64("kv_num_heads", attrs["kv_num_heads"]),
        ir.AttrFloat32("scale", attrs["scale"]),
        ir.AttrString("plugin_namespace", PLUGIN_NAMESPACE),
        ir.AttrString("plugin_version", PLUGIN_VERSION),
    ]
    node = ir.Node(
        DOMAIN,
        PAGED_OP_TYPE,
        [q, k_new, v_new, k_pool, v_pool, block_table, slot_mapping, seq_lens, query_lens],
        ir_attrs,
        num_outputs=3,
        version=DOMAIN_VERSION,
        name=name,
    )
    for out, like, role in zip(node.outputs, (q, k_pool, v_pool), PAGED_OUTPUTS):
        out.dtype = like.dtype
        if like.shape is not None:
            out.shape = ir.Shape(like.shape)
        if name:
            out.name = f"{name}_{role}"
    return node


def reference_function(opset: int) -> ir.Function:
    """The op's semantics as an ONNX function importing default-domain opset `opset` (>= 23)."""
    header = f'<domain: "{DOMAIN}", opset_import: ["" : {opset}]>'
    proto = onnx.parser.parse_function(header + _BODY)
    proto.doc_string = "Reference semantics of the trtforge PagedAttention plugin (write, gather, attend)."
    return ir.serde.deserialize_function(proto)


def add_paged_reference_function(model: ir.Model) -> None:
    """Add the local function ``trtforge::PagedAttention`` and the domain import (idempotent)."""
    opset = model.opset_imports.get("", None)
    if opset is None or opset < MIN_OPSET:
        raise UserError(
            f"{DOMAIN}::{PAGED_OP_TYPE} reference function uses ONNX Attention and needs default-domain "
            f"opset >= {MIN_OPSET}; the model imports {opset}."
        )
    function = reference_function(opset)
    model.functions[function.identifier()] = function
    model.opset_imports[DOMAIN] = DOMAIN_VERSION
