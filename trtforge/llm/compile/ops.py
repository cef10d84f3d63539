"""The two ops of a step graph that torch has no ONNX form for: a KV-cache write and attention over it.

Both are torch custom ops (``torch.library``) with exact torch reference implementations, so the step
module runs in eager torch, and each exporter translates them to standard ONNX: the cache write to
``TensorScatter`` (opset 24; TensorRT: KV_CACHE_UPDATE) and the attention to ``Attention`` (opset 23/24;
TensorRT: IAttention) with an explicit bool mask, one output, no ``present_*``, no ``nonpad_kv_seqlen``.
The paged layout's write (``paged_cache_write``) is plain ONNX: ``ScatterND`` into the pool flattened
to [num_blocks * block_size, Hkv, D] at the slot mapping, reshaped back; its read (``paged_gather``)
is ``Gather(pool, block_tables)`` + Transpose + Reshape to [B, Hkv, max_blocks * block_size, D].
Neither exporter emits opset 24 (torch's dynamo exporter stops at 23, the legacy one at 20), so the
translations emit both ops in a placeholder domain and :func:`finalize_opset` moves them to the default
domain at opset 24 (between 20 and 24 the other ops only gained types, no semantics).

A soft-capped layer (Gemma 2's attention logit soft-capping) attends through :func:`step_attention`'s
plain torch ops instead, traced as they are: MatMul, Mul by the scale, Div / Tanh / Mul by the cap,
Where for the mask, Softmax, MatMul. Not ONNX ``Attention``'s ``softcap`` attribute: TensorRT's ONNX
parser refuses it ("Setting softcap is not supported in TensorRT Attention", TensorRT-RTX 1.7.1), and
neither the attention-fusion pass (its pattern has nothing between the scale and the mask) nor the
paged pass (it rewrites Attention nodes only) turns the decomposed form into a kernel without the cap.
An ALiBi layer (BLOOM, MPT, falcon-rw) attends through the same plain ops with its position bias (each
head's slope times key position minus query position, one ``[B, H, S, T]`` tensor a step shares between
the layers whose slopes are equal) added to the scaled (capped) scores before the mask: an Add there
matches neither pass either, and the TensorRT plugin never sees such a layer. A layer with attention
sinks (gpt-oss) attends through the same plain ops with each head's sink logit concatenated to the masked
scores as one more column before the Softmax and that column sliced off after it
(:func:`~trtforge.llm.models.base.attention_sinks`): ONNX ``Attention`` has no sinks input in the opset
TensorRT-RTX parses, and the Concat / Slice around the Softmax match neither pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trtforge.llm.models.base import attention_sinks

PLACEHOLDER_DOMAIN = "trtforge.step"
STEP_OPSET = 24


@torch.library.custom_op("trtforge::kv_cache_write", mutates_args=())
def kv_cache_write(cache: Tensor, update: Tensor, write_index: Tensor) -> Tensor:
    """A copy of `cache` [B,H,S_max,D] with `update` [B,H,S,D] written at rows write_index[b] .. +S."""
    b, h, s, d = update.shape
    pos = write_index.to(torch.int64)[:, None] + torch.arange(s, device=update.device)[None, :]
    return cache.scatter(2, pos[:, None, :, None].expand(b, h, s, d), update.to(cache.dtype))


@kv_cache_write.register_fake
def _kv_cache_write_fake(cache: Tensor, update: Tensor, write_index: Tensor) -> Tensor:
    return torch.empty_like(cache)


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    scale: float,
    softcap: float | None = None,
    bias: Tensor | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """softmax(cap(q k^T * scale) + bias, masked) v with q [B,Hq,S,D], k/v [B,Hkv,T,D] (GQA), bool mask
    [B,1,S,T]; cap(s) = softcap * tanh(s / softcap) (None: s), before the mask as transformers' Gemma 2
    applies it; `bias` [B,Hq,S,T] (None: none) an ALiBi layer's position bias
    (:func:`~trtforge.llm.models.base.alibi_bias`), in the scores' dtype; `sinks` [Hq] (None: none) a
    gpt-oss layer's sink logits, one more softmax column a head that gives no value
    (:func:`~trtforge.llm.models.base.attention_sinks`).
    Masked scores become the dtype's lowest value (as transformers' eager masks make them), not -inf: a
    query that sees no key (a padding row under a window) then averages the values instead of turning
    NaN, which its K/V row would carry into the cache and, times a zero weight, into later steps."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if sinks is not None:
        return torch.matmul(attention_sinks(scores, sinks).to(v.dtype), v)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@torch.library.custom_op("trtforge::cache_attention", mutates_args=())
def cache_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale, masked) v with q [B,Hq,S,D], k/v [B,Hkv,T,D] (GQA), bool mask [B,1,S,T]."""
    return attention_reference(q, k, v, mask, scale)


def step_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    scale: float,
    softcap: float | None = None,
    bias: Tensor | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """One layer's attention in a step graph: :func:`cache_attention` (exported as ONNX Attention), or
    with a `softcap`, an ALiBi `bias` or attention `sinks`, :func:`attention_reference`'s plain ops
    (exported as they are: module docstring)."""
    if softcap is None and bias is None and sinks is None:
        return cache_attention(q, k, v, mask, scale)
    return attention_reference(q, k, v, mask, scale, softcap, bias, sinks)


@torch.library.custom_op("trtforge::paged_cache_write", mutates_args=())
def paged_cache_write(pool: Tensor, update: Tensor, slot_mapping: Tensor) -> Tensor:
    """A copy of `pool` [N,bs,H,D] with `update` [B,H,S,D] written at flat slots slot_mapping [B,S]."""
    flat = pool.reshape(-1, pool.shape[2], pool.shape[3]).clone()
    rows = update.transpose(1, 2).reshape(-1, update.shape[1], update.shape[3]).to(pool.dtype)
    flat[slot_mapping.reshape(-1).to(torch.int64)] = rows
    return flat.view(pool.shape)


@paged_cache_write.register_fake
def _paged_cache_write_fake(pool: Tensor, update: Tensor, slot_mapping: Tensor) -> Tensor:
    return torch.empty_like(pool)


@torch.library.custom_op("trtforge::paged_gather", mutates_args=())
def paged_gather(pool: Tensor, tables: Tensor) -> Tensor:
    """[B, Hkv, max_blocks * bs, D]: the blocks of each row of tables, in order, from pool [N, bs, H, D]."""
    return pool[tables.to(torch.int64)].permute(0, 3, 1, 2, 4).flatten(2, 3).contiguous()


@paged_gather.register_fake
def _paged_gather_fake(pool: Tensor, tables: Tensor) -> Tensor:
    b, width = tables.shape
    return pool.new_empty((b, pool.shape[2], width * pool.shape[1], pool.shape[3]))


@cache_attention.register_fake
def _cache_attention_fake(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    return torch.empty_like(q)


def dynamo_translation_table() -> dict[Any, Any]:
    """onnxscript translations of both ops, for the dynamo exporter's custom_translation_table."""
    import onnx
    from onnxscript import values

    step = values.Opset(PLACEHOLDER_DOMAIN, 1)  # the standard schemas, emitted in the placeholder domain
    tensor_scatter = values.Op(step, "TensorScatter", onnx.defs.get_schema("TensorScatter", STEP_OPSET, ""))
    attention = values.Op(step, "Attention", onnx.defs.get_schema("Attention", STEP_OPSET, ""))

    def write_onnx(cache, update, write_index):
        return tensor_scatter(cache, update, write_index, axis=2)

    def attention_onnx(q, k, v, mask, scale: float):
        return attention(q, k, v, mask, scale=scale)[0]  # finalize_opset drops the other three outputs

    def paged_write_onnx(pool, update, slot_mapping):
        from onnxscript import opset18 as op

        flat_shape = op.Concat(op.Constant(value_ints=[-1]), op.Shape(pool, start=2), axis=0)
        idx = op.Unsqueeze(slot_mapping, op.Constant(value_ints=[-1]))
        rows = op.Transpose(update, perm=[0, 2, 1, 3])
        return op.Reshape(op.ScatterND(op.Reshape(pool, flat_shape), idx, rows), op.Shape(pool))

    def paged_gather_onnx(pool, tables):
        from onnxscript import opset18 as op

        rows = op.Transpose(op.Gather(pool, tables, axis=0), perm=[0, 3, 1, 2, 4])
        shape = op.Concat(
            op.Shape(tables, start=0, end=1),
            op.Shape(pool, start=2, end=3),
            op.Constant(value_ints=[-1]),
            op.Shape(pool, start=3, end=4),
            axis=0,
        )
        return op.Reshape(rows, shape)

    return {
        torch.ops.trtforge.kv_cache_write.default: write_onnx,
        torch.ops.trtforge.paged_gather.default: paged_gather_onnx,
        torch.ops.trtforge.paged_cache_write.default: paged_write_onnx,
        torch.ops.trtforge.cache_attention.default: attention_onnx,
    }


def _write_symbolic(g: Any, cache: Any, update: Any, write_index: Any) -> Any:
    return g.op(f"{PLACEHOLDER_DOMAIN}::TensorScatter", cache, update, write_index, axis_i=2).setType(
        cache.type()
    )


def _paged_write_symbolic(g: Any, pool: Any, update: Any, slot_mapping: Any) -> Any:
    minus_one = g.op("Constant", value_t=torch.tensor([-1], dtype=torch.int64))
    flat = g.op("Reshape", pool, g.op("Concat", minus_one, g.op("Shape", pool, start_i=2), axis_i=0))
    rows = g.op("Transpose", update, perm_i=[0, 2, 1, 3])
    written = g.op("ScatterND", flat, g.op("Unsqueeze", slot_mapping, minus_one), rows)
    return g.op("Reshape", written, g.op("Shape", pool)).setType(pool.type())


def _paged_gather_symbolic(g: Any, pool: Any, tables: Any) -> Any:
    rows = g.op("Transpose", g.op("Gather", pool, tables, axis_i=0), perm_i=[0, 3, 1, 2, 4])
    minus_one = g.op("Constant", value_t=torch.tensor([-1], dtype=torch.int64))
    shape = g.op(
        "Concat",
        g.op("Shape", tables, start_i=0, end_i=1),
        g.op("Shape", pool, start_i=2, end_i=3),
        minus_one,
        g.op("Shape", pool, start_i=3, end_i=4),
        axis_i=0,
    )
    return g.op("Reshape", rows, shape).setType(pool.type().with_sizes([None] * 4))


def _attention_symbolic(g: Any, q: Any, k: Any, v: Any, mask: Any, scale: Any) -> Any:
    from torch.onnx import symbolic_helper

    value = float(symbolic_helper._maybe_get_const(scale, "f"))
    return g.op(f"{PLACEHOLDER_DOMAIN}::Attention", q, k, v, mask, scale_f=value).setType(q.type())


def register_legacy_symbolics(opset: int) -> None:
    """Teach the TorchScript (legacy) exporter both ops; idempotent."""
    from torch.onnx import register_custom_op_symbolic

    register_custom_op_symbolic("trtforge::kv_cache_write", _write_symbolic, opset)
    register_custom_op_symbolic("trtforge::cache_attention", _attention_symbolic, opset)
    register_custom_op_symbolic("trtforge::paged_cache_write", _paged_write_symbolic, opset)
    register_custom_op_symbolic("trtforge::paged_gather", _paged_gather_symbolic, opset)


def finalize_opset(model: Any) -> Any:
    """Move the placeholder-domain nodes to the default domain at opset 24; Attention keeps only Y."""
    import onnx

    def fix(nodes: Any) -> None:
        for node in nodes:
            if node.domain == PLACEHOLDER_DOMAIN:
                node.domain = ""
                if node.op_type == "Attention":  # one output: TensorRT rejects present_* (facts doc)
                    del node.output[1:]
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    fix(attr.g.node)

    fix(model.graph.node)
    for fn in model.functions:
        fix(fn.node)
        keep = [o for o in fn.opset_import if o.domain != PLACEHOLDER_DOMAIN]
        del fn.opset_import[:]
        fn.opset_import.extend(keep)
    keep = [o for o in model.opset_import if o.domain not in (PLACEHOLDER_DOMAIN, "", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend([onnx.helper.make_opsetid("", STEP_OPSET), *keep])
    return model
