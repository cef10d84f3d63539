"""attention: scaled dot-product attention subgraphs -> one attention node, chosen by a strategy.

    S = (Q * qs) @ (Kᵀ * ks) * s      (each scale a Mul, a Div or absent)
    S = S + mask                      (optional; any additive mask: padding, causal, both)
    S = (S + bias) + mask             (or a bias and a mask: MPNet's relative-position bias, then
                                       padding; fused as one attn_mask `bias + mask`)
    S = Where(cond, fill, S)          (or a masked_fill of the scaled scores alone, XLM / FlauBERT;
                                       native only, as in the folded rule below: an absorbing fill,
                                       moved onto attn_mask)
    P = Softmax(S, axis=-1)           (optionally Where(IsNaN(P), 0, P), as torch exports SDPA)
    O = P @ V                         Q, V: [B, H, S, D]; K: [B, H, S, D] or [B, S, H, D]

Nothing may stand between the scaled scores and the mask: a soft-capped attention (Gemma 2's
`cap * tanh(S / cap)`, Div / Tanh / Mul there) or an ALiBi one (BLOOM, MPT, falcon-rw: an Add of the
position bias there) does not match, and stays as it is, since no target here applies a cap or a bias
(TensorRT's parser refuses ONNX Attention's `softcap`).

The key may be transposed directly (BHSd -> BHdS), through a 3-D reshape (dynamo's SDPA
decomposition) or from BSHd (eager exports); this is onnxscript's `SDPA` rule pattern
(`ort_fusions/sdpa.py`), extended with the mask added on either side, a NaN fill of any shape,
rank-only shape checks (legacy exports carry unknown dims) and a standard-op target.

Heads folded into the batch (bmm-style: DeBERTa-v2/v3, legacy exports of nn.MultiheadAttention with
need_weights) are a second matcher, `FoldedAttentionFusion`, for the native strategy only:

    S = (Q * qs) @ (Kᵀ * ks) * s      Q, V: [N, S, D] with N = B*H; Kᵀ from [N, S, D] (perm [0, 2, 1])
                                       or [S, N, D] (perm [1, 2, 0]); a scale may also be a runtime
                                       scalar (DeBERTa's sqrt(D * factor) from Shape), applied to its
                                       operand before the attention node, with `scale` 1 for it
    S = S + bias                      (optional, any rank <= 3: relative positions, an additive mask)
    S = Reshape(S, [-1, H, Sq, Skv]) + mask4   ("4d": an optional per-head view; H must be a
        ... Reshape(P, [-1, Sq, Skv])            constant of the Reshape; mask4 optional)
    S = Where(cond, fill, S)          (optional masked_fill, either branch order; fill a finite
                                       constant scalar <= -1e30, else no match: -inf rows are NaN)
    O = Softmax(S, axis=-1) @ V

becomes Squeeze(Attention(Unsqueeze(Q, 1), Unsqueeze(K, 1), Unsqueeze(V, 1), attn_mask), 1): one head
over the batch N, attn_mask [N, 1, Sq, Skv] built from the terms (the 4-D view's terms are combined on
[B, H, Sq, Skv], then reshaped with N, Sq, Skv read from Q and K at run time). The masked_fill moves
onto the terms, Where(cond, fill, bias or 0): the fill absorbs any score added to it, so masked
entries are exact, and query rows whose every key is filled (padding queries, DeBERTa's [B, 1, S, S]
mask) get their query and terms zeroed, the uniform softmax torch gives them, exactly (ONNX Runtime's
Attention zeroes rows of the dtype's lowest value, and FP16 saturates every fill to it). A boolean
attn_mask would not do: it gives NaN or 0 on those rows. The rule leaves matched nodes to a dead-node
sweep, since exporters read Shape() of the intermediate scores for the view Reshapes.

Strategies share the matcher and differ in the node emitted:
- `native`: ONNX `Attention` (opset 23), `scale` explicit, mask as `attn_mask`, or `is_causal=1`
  when the mask is a pure position comparison (see `_mask.py`). TensorRT maps it to IAttention.
- `plugin`: `trtforge.plugins.attention.onnx_node.make_flash_attention_node` (custom domain),
  with the model's [B, S] padding input as key_padding_mask; the plugin module's ONNX reference
  function is added so ONNX Runtime can verify the graph.
- `paged`: a paged-cache step already in standard ONNX (the decoder's paged step graph: ScatterND at
  the slot mapping into block pools [num_blocks, block_size, Hkv, D], Gather through the block table,
  Attention) -> one `trtforge::PagedAttention` node per layer (`paged_attention.py`), whose pool
  outputs TensorRT aliases to its pool inputs; its ONNX reference function is added.
- `none`: nothing is rewritten (the pass still reports what it would have matched).
Graphs that already contain `Attention` have nothing left to match and are left alone.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import _ir_utils, pattern

from trtforge.errors import UserError
from trtforge.passes._base import PassContext, PassOutcome, PassSpec, apply_rules
from trtforge.passes._mask import analyze_mask

ATTENTION_OPSET = 23
PLUGIN_MODULE = "trtforge.plugins.attention.onnx_node"
PAGED_MODULE = "trtforge.plugins.attention.paged_onnx_node"
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


def load_plugin_module():
    """Import the attention-plugin ONNX helpers, or explain why `--attention plugin` cannot work."""
    try:
        module = importlib.import_module(PLUGIN_MODULE)
    except ImportError as e:
        raise UserError(
            f"--attention plugin needs {PLUGIN_MODULE} (the attention-plugin feature), which cannot "
            f"be imported here ({e}). Use --attention native (ONNX Attention) or none."
        ) from e
    for name in ("make_flash_attention_node", "add_reference_function"):
        if not hasattr(module, name):
            raise UserError(f"--attention plugin: {PLUGIN_MODULE} has no '{name}'; update trtforge.")
    return module


def _scale(kind: str | None, value: ir.Value | None) -> float | None:
    """Multiplier a Mul/Div/absent scaling applies; None if the scale is not a constant scalar."""
    if kind in (None, "None"):
        return 1.0
    s = _ir_utils.get_singleton_value(value)
    if s is None:
        return None
    return float(s) if kind == "Mul" else 1.0 / float(s)


def _rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else v.shape.rank()


def _static(v: ir.Value, axis: int) -> int | None:
    d = v.shape[axis]
    return d if isinstance(d, int) else None


def _head_count(query: ir.Value) -> int | None:
    """H of a [B, H, S, D] query: its static dim, else the constant in the head-split Reshape.

    Legacy exports leave dims unknown; the head split `Reshape(x, [B, S, H, D])` (a constant or a
    Concat with constant pieces) followed by `Transpose(perm=[0, 2, 1, 3])` still names H.
    """
    if query.shape is not None and isinstance(query.shape[1], int):
        return query.shape[1]
    v = query
    while (node := v.producer()) is not None and node.op_type in ("Mul", "Div"):
        v = node.inputs[0]
    node = v.producer()
    if node is None or node.op_type != "Transpose":
        return None
    if list(node.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        return None
    reshape = node.inputs[0].producer()
    if reshape is None or reshape.op_type != "Reshape" or len(reshape.inputs) < 2:
        return None
    target = reshape.inputs[1]
    concat = target.producer()
    if target.const_value is not None:
        dims = [int(d) for d in target.const_value.numpy().reshape(-1)]
    elif concat is not None and concat.op_type == "Concat" and len(concat.inputs) == 4:
        dims = [_ir_utils.get_singleton_value(i) for i in concat.inputs]
    else:
        return None
    if len(dims) != 4:
        return None
    h, d = dims[2], dims[3]
    if isinstance(h, int) and h > 0:
        return h
    hidden = _last_dim(reshape.inputs[0])
    if h == -1 and isinstance(d, int) and d > 0 and hidden and hidden % d == 0:
        return hidden // d
    return None


def _last_dim(v: ir.Value) -> int | None:
    """Static size of the last axis: from the shape, else from the projection that produced `v`."""
    if v.shape is not None and v.shape.rank() and isinstance(v.shape[-1], int):
        return v.shape[-1]
    node = v.producer()
    if node is None:
        return None
    consts = [i.const_value for i in node.inputs if i is not None and i.const_value is not None]
    if node.op_type == "Split" and consts:
        sizes = consts[0].numpy().reshape(-1)
        index = list(node.outputs).index(v)
        return int(sizes[index]) if index < sizes.size else None
    if node.op_type == "Add" and consts and consts[0].shape.rank() == 1:
        return int(consts[0].shape[0])
    if node.op_type == "MatMul" and consts and consts[0].shape.rank() == 2:
        return int(consts[0].shape[1])
    return None


def _same_dim(a: ir.Value, i: int, b: ir.Value, j: int) -> bool:
    if a.shape is None or b.shape is None or a.shape.rank() < -i or b.shape.rank() <= j:
        return False
    da, db = a.shape[i], b.shape[j]
    if isinstance(da, int) or isinstance(db, int):
        return da == db
    return da.value is not None and da.value == db.value


def _value_head_reason(key: ir.Value, value: ir.Value, axis: int) -> str | None:
    """Why the attention cannot be fused when V's head size differs from K's (LeViT: keys of 8, values
    of 32), else None. ONNX Attention and ONNX Runtime allow it, but TensorRT's attention layer requires K
    and V of one shape: the parser refused the whole graph ("Key and Value must have the same shape"),
    and the flash-attention plugin takes one head size."""
    k_dh, v_dh = _static(key, axis), _static(value, axis)
    if k_dh is not None and v_dh is not None and k_dh != v_dh:
        return f"value head size {v_dh} != key head size {k_dh} (TensorRT's attention needs K and V alike)"
    return None


def _full_mask(op, mask: ir.Value, query: ir.Value, key: ir.Value) -> ir.Value:
    """The mask, expanded to [.., Sq, Skv] unless its last two dims provably are that already.

    The ONNX spec lets attn_mask broadcast, but ONNX Runtime 1.32 requires mask dim -2 == Sq
    (a [B, 1, 1, S] padding mask is rejected), so broadcast masks are expanded explicitly.
    """
    if _same_dim(mask, -2, query, 2) and _same_dim(mask, -1, key, 2):
        return mask
    sq = op.Shape(query, start=2, end=3)
    skv = op.Shape(key, start=2, end=3)
    ones = op.Constant(value=ir.tensor([1, 1], dtype=ir.DataType.INT64))
    return op.Expand(mask, op.Concat(ones, sq, skv, axis=0))


def _scaled(op, x, scale, tag: str):
    """`x`, `x * scale` or `x / scale`, tagged `tag` with the kind ("Mul", "Div", "None")."""
    return pattern.OrValue(
        [op.Mul(x, scale), op.Div(x, scale), x], tag_var=tag, tag_values=["Mul", "Div", "None"]
    )


def _scalings(b: dict) -> tuple[tuple[str | None, ir.Value | None], ...]:
    """The (kind, value) of the query's, the key's and the product's scaling a match bound."""
    return tuple((b.get(f"{w}_scaling"), b.get(f"{w}_scale")) for w in ("query", "key", "qk"))


class AttentionFusion(pattern.RewriteRuleClassBase):
    """MatMul-scale-mask-Softmax-MatMul -> Attention / plugin node (module docstring)."""

    def __init__(self, strategy: str) -> None:
        super().__init__(name=f"AttentionFusion[{strategy}]")
        self.strategy = strategy

    def pattern(
        self, op, query, key, value, mask, bias, cond, fill, query_scale, key_scale, qk_scale, nan_fill
    ):
        key_t = pattern.OrValue(
            [
                op.Transpose(key, perm=[0, 1, 3, 2]),  # BHSd -> BHdS
                op.Reshape(
                    op.Transpose(op.Reshape(key, pattern.ANY_VALUE), perm=[0, 2, 1]), pattern.ANY_VALUE
                ),
                op.Transpose(key, perm=[0, 2, 3, 1]),  # BSHd -> BHdS
            ],
            tag_var="key_format",
            tag_values=["BHSd", "BHSd", "BSHd"],
        )
        query = _scaled(op, query, query_scale, "query_scaling")
        key_t = _scaled(op, key_t, key_scale, "key_scaling")
        score = op.MatMul(query, key_t)  # Q Kᵀ
        score = _scaled(op, score, qk_scale, "qk_scaling")
        biased = pattern.OrValue([op.Add(score, bias), op.Add(bias, score)])
        score = pattern.OrValue(
            [op.Add(biased, mask), op.Add(mask, biased), op.Add(score, mask), op.Add(mask, score), score],
            tag_var="mask_side",
            tag_values=["bias_right", "bias_left", "right", "left", "none"],
        )
        score = pattern.OrValue(  # masked_fill (XLM, FlauBERT): native only, an absorbing fill
            [op.Where(cond, fill, score), op.Where(cond, score, fill), score],
            tag_var="fill_side",
            tag_values=["fill_if_true", "fill_if_false", "none"],
        )
        weights = op.Softmax(score, axis=-1)
        weights = pattern.OrValue([op.Where(op.IsNaN(weights), nan_fill, weights), weights])
        return op.MatMul(weights, value)  # P V

    def check(
        self, context, query, key, value, mask, bias, nan_fill, cond=None, fill=None, **b
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if cond is not None:
            if self.strategy != "native":
                return result.fail(f"{self.strategy}: masked_fill scores are fused for native only", cond)
            if mask is not None:  # an ALiBi step graph's masked_fill(S + bias): left alone (docstring)
                return result.fail("masked_fill of scores with an additive term (a position bias)", mask)
            reason = _fill_reason(cond, fill)
            if reason is not None:
                return result.fail(reason, fill)
            if fill.dtype != query.dtype:
                return result.fail(f"masked_fill value dtype {fill.dtype} != query dtype {query.dtype}", fill)
            if _rank(cond) is None or _rank(cond) > 4:
                return result.fail(f"masked_fill condition rank {_rank(cond)} is unknown or above 4", cond)
        for name, v in (("query", query), ("key", key), ("value", value)):
            if _rank(v) != 4:
                return result.fail(f"{name} is not a rank-4 tensor (rank {_rank(v)})", v)
            if v.dtype not in _FLOATS or v.dtype != query.dtype:
                return result.fail(f"{name} dtype {v.dtype} is not the query's float dtype", v)
        k_dh = _static(key, 3)
        q_dh = _static(query, 3)
        if q_dh is not None and k_dh is not None and q_dh != k_dh:
            return result.fail(f"query head size {q_dh} != key head size {k_dh}", key)
        reason = _value_head_reason(key, value, axis=3)
        if reason is not None:
            return result.fail(reason, value)
        if nan_fill is not None and _ir_utils.get_singleton_value(nan_fill) != 0:
            return result.fail("Softmax NaN fill is not the constant 0", nan_fill)
        for kind, val in _scalings(b):
            if _scale(kind, val) is None:
                return result.fail("a score scale is not a constant scalar", val)
        for what, m in (("mask", mask), ("score bias", bias)):
            if m is None:
                continue
            if _rank(m) is None or _rank(m) > 4:
                return result.fail(f"{what} rank {_rank(m)} is unknown or above 4", m)
            if m.dtype != query.dtype:
                return result.fail(f"additive {what} dtype {m.dtype} != query dtype {query.dtype}", m)
        if self.strategy == "plugin":
            if bias is not None:
                return result.fail("plugin: the scores carry an additive bias besides the mask", bias)
            if _head_count(query) is None:
                return result.fail("plugin needs a known head count (query dim 1 / head Reshape)", query)
            if mask is not None:
                info = analyze_mask(mask, context.model.graph)
                if info.data_inputs and info.padding_input is None:
                    names = [v.name for v in info.data_inputs]
                    return result.fail(f"plugin: mask reads {names}, not one [B, S] padding input", mask)
        return result

    def rewrite(self, op, query, key, value, mask, bias, key_format, cond=None, fill=None, **b):
        scale = 1.0
        for kind, val in _scalings(b):
            scale *= _scale(kind, val)
        if key_format == "BSHd":
            key = op.Transpose(key, perm=[0, 2, 1, 3])
        if cond is not None:  # the fill moves onto the additive terms; fully filled rows zeroed
            zero = op.Constant(value=ir.tensor(np.array(0, dtype=query.dtype.numpy())))
            term = _masked_fill(op, cond, fill, zero, b["fill_side"])
            dead = _dead_rows(op, cond, b["fill_side"])  # [.., Sq, 1]: broadcasts onto Q [B, H, Sq, D]
            query = op.Where(dead, zero, query)
            term = op.Where(dead, zero, term)
            return op.Attention(query, key, value, _full_mask(op, term, query, key), scale=scale)
        info = analyze_mask(mask, mask.graph or query.graph) if mask is not None else None
        if self.strategy == "plugin":
            return self._plugin(op, query, key, value, info, scale)
        if bias is not None:  # (S + bias) + mask == S + (bias + mask): one additive attn_mask, no is_causal
            combined = _full_mask(op, op.Add(bias, mask), query, key)
            return op.Attention(query, key, value, combined, scale=scale)
        if info is not None and info.causal and not info.data_inputs:
            return op.Attention(query, key, value, is_causal=1, scale=scale)
        if mask is None:
            return op.Attention(query, key, value, scale=scale)
        return op.Attention(query, key, value, _full_mask(op, mask, query, key), scale=scale)

    def _plugin(self, op, query, key, value, info, scale):
        module = load_plugin_module()
        padding = info.padding_input if info is not None else None
        template = module.make_flash_attention_node(
            query,
            key,
            value,
            padding,
            num_heads=_head_count(query),
            scale=scale,
            causal=bool(info is not None and info.causal),
        )
        node = template if isinstance(template, ir.Node) else template.producer()
        inputs = list(node.inputs)
        attrs = dict(node.attributes)
        for i in range(len(inputs)):  # detach the template so it leaves no uses behind
            node.replace_input_with(i, None)
        out = getattr(op, node.op_type)(*inputs, _domain=node.domain, _version=node.version, **attrs)
        out.producer().overload = node.overload  # selects the masked / unmasked reference function
        out.dtype, out.shape = node.outputs[0].dtype, node.outputs[0].shape
        return out


# A masked_fill constant at or below this absorbs any score it is added to (float32: ulp(1e30)/2 is
# about 4e22), so `fill + s == fill` exactly and fully masked rows stay uniform, as torch computes them.
_ABSORBING_FILL = -1e30


def _runtime_scalar(v: ir.Value | None, dtype: ir.DataType | None) -> bool:
    """True for a non-constant scalar scale of the scores' dtype (a shape of ones, rank <= 3, so it
    broadcasts onto a [N, S, D] operand without changing its shape)."""
    if v is None or v.shape is None or v.dtype != dtype or v.shape.rank() > 3:
        return False
    return all(isinstance(d, int) and d == 1 for d in v.shape)


def _split_heads(target: ir.Value | None) -> int | None:
    """H of the `Reshape(scores, [-1, H, Sq, Skv])` that views folded scores per head: a constant
    target, or a Concat of four pieces whose second is a constant."""
    if target is None:
        return None
    if target.const_value is not None:
        dims = [int(d) for d in target.const_value.numpy().reshape(-1)]
        h = dims[1] if len(dims) == 4 else None
    else:
        node = target.producer()
        if node is None or node.op_type != "Concat" or len(node.inputs) != 4:
            return None
        h = _ir_utils.get_singleton_value(node.inputs[1])
    return int(h) if isinstance(h, int) and h > 0 else None


def _fill_reason(cond: ir.Value | None, fill: ir.Value | None) -> str | None:
    """Why a `Where(cond, fill, scores)` masked_fill cannot become an additive mask (None: it can)."""
    if cond is None:
        return None
    if cond.dtype != ir.DataType.BOOL:
        return f"masked_fill condition dtype {cond.dtype} is not bool"
    value = _ir_utils.get_singleton_value(fill)
    if value is None:
        return "masked_fill value is not a constant scalar"
    if not math.isfinite(value):
        # torch gives a fully -inf row NaN; the rewrite would give it a uniform softmax instead.
        return f"masked_fill value {float(value):g} is not finite"
    if not float(value) <= _ABSORBING_FILL:
        return f"masked_fill value {float(value):g} is not very negative (<= {_ABSORBING_FILL:g})"
    return None


class FoldedAttentionFusion(pattern.RewriteRuleClassBase):
    """Attention with the heads folded into the batch ([B*H, S, D] bmm) -> Attention on [N, 1, S, D].

    `view` "3d": the scores stay [N, Sq, Skv]; "4d": they are viewed as [B, H, Sq, Skv] between a
    Reshape after the bias and one after the Softmax (DeBERTa). See the module docstring.
    """

    def __init__(self, strategy: str, view: str) -> None:
        # Exporters read Shape() of the intermediate scores (for the view Reshapes): those uses die with
        # the rewrite, so the matched nodes are left for the rule set's dead-node sweep, not checked.
        super().__init__(name=f"FoldedAttentionFusion[{strategy},{view}]", remove_nodes=False)
        self.strategy = strategy
        self.view = view

    def pattern(
        self,
        op,
        query,
        key,
        value,
        bias,
        mask,
        cond,
        fill,
        view_shape,
        flat_shape,
        query_scale,
        key_scale,
        qk_scale,
    ):
        key_t = pattern.OrValue(
            [op.Transpose(key, perm=[0, 2, 1]), op.Transpose(key, perm=[1, 2, 0])],
            tag_var="key_format",
            tag_values=["NSd", "SNd"],
        )
        query = _scaled(op, query, query_scale, "query_scaling")
        key_t = _scaled(op, key_t, key_scale, "key_scaling")
        score = op.MatMul(query, key_t)
        score = _scaled(op, score, qk_scale, "qk_scaling")
        score = pattern.OrValue([op.Add(score, bias), op.Add(bias, score), score])
        if self.view == "4d":
            score = op.Reshape(score, view_shape)
            score = pattern.OrValue([op.Add(score, mask), op.Add(mask, score), score])
        score = pattern.OrValue(
            [op.Where(cond, fill, score), op.Where(cond, score, fill), score],
            tag_var="fill_side",
            tag_values=["fill_if_true", "fill_if_false", "none"],
        )
        weights = op.Softmax(score, axis=-1)
        if self.view == "4d":
            weights = op.Reshape(weights, flat_shape)
        return op.MatMul(weights, value)

    def check(
        self, context, query, key, value, bias=None, mask=None, cond=None, fill=None, view_shape=None, **b
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if self.strategy != "native":
            return result.fail(f"{self.strategy}: heads folded into the batch are fused for native only")
        for name, v in (("query", query), ("key", key), ("value", value)):
            if _rank(v) != 3:
                return result.fail(f"{name} is not a rank-3 [B*H, S, D] tensor (rank {_rank(v)})", v)
            if v.dtype not in _FLOATS or v.dtype != query.dtype:
                return result.fail(f"{name} dtype {v.dtype} is not the query's float dtype", v)
        for kind, val in _scalings(b):
            if _scale(kind, val) is None and not _runtime_scalar(val, query.dtype):
                return result.fail("a score scale is neither a constant nor a runtime scalar", val)
        for what, m, most in (("score bias", bias, 3), ("mask", mask, 4)):
            if m is None:
                continue
            if _rank(m) is None or _rank(m) > most:
                return result.fail(f"{what} rank {_rank(m)} is unknown or above {most}", m)
            if m.dtype != query.dtype:
                return result.fail(f"additive {what} dtype {m.dtype} != query dtype {query.dtype}", m)
        reason = _value_head_reason(key, value, axis=2)
        if reason is not None:
            return result.fail(reason, value)
        reason = _fill_reason(cond, fill)
        if reason is not None:
            return result.fail(reason, fill)
        if self.view == "4d" and _split_heads(view_shape) is None:
            return result.fail("the per-head view Reshape has no constant head count", view_shape)
        if self.view == "3d" and cond is not None and (_rank(cond) is None or _rank(cond) > 3):
            return result.fail(f"masked_fill condition rank {_rank(cond)} is unknown or above 3", cond)
        return result

    def rewrite(
        self,
        op,
        query,
        key,
        value,
        key_format,
        bias=None,
        mask=None,
        cond=None,
        fill=None,
        view_shape=None,
        **b,
    ):
        scale = 1.0
        q_shape, k_shape = query, key
        for kind, val, side in (
            (b.get("query_scaling"), b.get("query_scale"), "q"),
            (b.get("key_scaling"), b.get("key_scale"), "k"),
            (b.get("qk_scaling"), b.get("qk_scale"), "q"),
        ):
            constant = _scale(kind, val)
            if constant is not None:
                scale *= constant
                continue
            # A runtime scalar scales its own operand (Kᵀ/s == (K/s)ᵀ), the product's scale the query.
            scaled = getattr(op, kind)(query if side == "q" else key, val)
            query, key = (scaled, key) if side == "q" else (query, scaled)
        n = op.Shape(q_shape, start=0, end=1)
        sq = op.Shape(q_shape, start=1, end=2)
        skv = op.Shape(k_shape, start=0, end=1) if key_format == "SNd" else op.Shape(k_shape, start=1, end=2)
        if key_format == "SNd":  # Kᵀ came from [S, N, D] by perm [1, 2, 0]
            key = op.Transpose(key, perm=[1, 0, 2])
        one = op.Constant(value=ir.tensor([1], dtype=ir.DataType.INT64))
        q4, k4, v4 = op.Unsqueeze(query, one), op.Unsqueeze(key, one), op.Unsqueeze(value, one)
        zero = op.Constant(value=ir.tensor(np.array(0, dtype=q_shape.dtype.numpy())))
        dead = None
        if cond is not None:
            dead = _dead_rows(op, cond, b["fill_side"])
        if self.view == "3d":
            term = bias
            if cond is not None:
                term = _masked_fill(op, cond, fill, zero if term is None else term, b["fill_side"])
            if term is not None:
                term = self._to_4d(op, term, [bias, cond], one)
            if dead is not None:
                dead = self._to_4d(op, dead, [cond], one)
        else:
            heads = op.Constant(value=ir.tensor([_split_heads(view_shape)], dtype=ir.DataType.INT64))
            per_head = op.Concat(op.Div(n, heads), heads, sq, skv, axis=0)
            term = None
            if bias is not None:
                term = op.Reshape(op.Expand(bias, op.Concat(n, sq, skv, axis=0)), per_head)
            if mask is not None:
                term = mask if term is None else op.Add(term, mask)
            if cond is not None:
                term = _masked_fill(op, cond, fill, zero if term is None else term, b["fill_side"])
            if term is not None:
                full = term if bias is not None else op.Expand(term, per_head)
                term = op.Reshape(full, op.Concat(n, one, sq, skv, axis=0))
            if dead is not None:
                rows = op.Concat(op.Div(n, heads), heads, sq, one, axis=0)
                dead = op.Reshape(op.Expand(dead, rows), op.Concat(n, one, sq, one, axis=0))
        if dead is not None:  # fully filled rows: query and terms zeroed (see _dead_rows)
            q4 = op.Where(dead, zero, q4)
            term = op.Where(dead, zero, term)
        if term is None:
            out = op.Attention(q4, k4, v4, scale=scale)
        else:
            out = op.Attention(q4, k4, v4, _full_mask(op, term, q4, k4), scale=scale)
        return op.Squeeze(out, one)

    @staticmethod
    def _to_4d(op, term, sources, one):
        """A term on the 3-D scores [N, Sq, Skv] as [N, 1, Sq, Skv]; rank 2 or less broadcasts as is."""
        return op.Unsqueeze(term, one) if max(_rank(v) or 0 for v in sources) == 3 else term


def _dead_rows(op, cond, fill_side: str):
    """[.., Sq, 1] bool: the query rows whose every key the masked_fill fills.

    torch gives such a row a uniform softmax (all scores equal the fill). An attention node cannot
    be relied on for it (ONNX Runtime's zeroes a row of the dtype's lowest value, and FP16 saturates
    every fill to that), so the rewrite zeroes those rows' query and additive terms instead: scores
    of 0 everywhere, the same uniform softmax, exactly.
    """
    filled = cond if fill_side == "fill_if_true" else op.Not(cond)
    ints = op.Cast(filled, to=ir.DataType.INT32)
    axes = op.Constant(value=ir.tensor([-1], dtype=ir.DataType.INT64))
    return op.Cast(op.ReduceMin(ints, axes, keepdims=1), to=ir.DataType.BOOL)


def _masked_fill(op, cond, fill, other, fill_side: str):
    """The masked_fill applied to the additive terms instead of the scores: with an absorbing fill,
    scores + Where(cond, fill, terms) == Where(cond, fill, scores + terms) exactly."""
    if fill_side == "fill_if_true":
        return op.Where(cond, fill, other)
    return op.Where(cond, other, fill)


def attention_rules(strategy: str) -> list[pattern.RewriteRule]:
    """The attention rule for one strategy (Q/K/V [B, H, S, D])."""
    return [AttentionFusion.rule(strategy)]


def folded_attention_rules(strategy: str) -> list[pattern.RewriteRule]:
    """The rules for heads folded into the batch (Q/K/V [B*H, S, D]); they refuse all but native."""
    return [FoldedAttentionFusion.rule(strategy, view) for view in ("4d", "3d")]


def run_attention(model: ir.Model, ctx: PassContext) -> PassOutcome:
    """Fuse attention blocks in place according to `ctx.attention`."""
    outcome = PassOutcome()
    if ctx.attention == "paged":
        return _run_paged(model, outcome)
    if any(n.op_type == "Attention" and n.domain in ("", "ai.onnx") for n in model.graph):
        outcome.notes.append("graph already contains Attention; left alone")
        return outcome
    if ctx.attention == "none":
        outcome.notes.append("attention strategy 'none': attention subgraphs kept as they are")
        return outcome
    module = load_plugin_module() if ctx.attention == "plugin" else None
    apply_rules(model, attention_rules(ctx.attention), ctx, outcome)
    # A rule set of its own: its rules leave matched nodes to a dead-node sweep over the whole model.
    apply_rules(model, folded_attention_rules(ctx.attention), ctx, outcome)
    if module is not None and outcome.matches:
        module.add_reference_function(model)
        outcome.notes.append("added the plugin's ONNX reference function for ONNX Runtime")
    return outcome


def _run_paged(model: ir.Model, outcome: PassOutcome) -> PassOutcome:
    """`paged`: standard-ONNX paged steps (ScatterND + Gather + Attention) -> PagedAttention."""
    from trtforge.passes.paged_attention import fuse_paged_attention

    try:
        module = importlib.import_module(PAGED_MODULE)
    except ImportError as e:
        raise UserError(
            f"--attention paged needs {PAGED_MODULE}, which cannot be imported here ({e})."
        ) from e
    fuse_paged_attention(model, module, outcome)
    if outcome.matches:
        module.add_paged_reference_function(model)
        outcome.notes.append("added the PagedAttention ONNX reference function for ONNX Runtime")
    return outcome


ATTENTION = PassSpec(
    name="attention",
    summary="MatMul-Softmax-MatMul attention -> Attention (opset 23) / plugin node",
    run=run_attention,
    min_opset=lambda ctx: ATTENTION_OPSET if ctx.attention == "native" else None,
)
