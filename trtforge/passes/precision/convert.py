"""`convert_precision`: FP32 ONNX -> strongly typed mixed FP16/BF16 ONNX, with FP32 islands and a record.

TensorRT 11 and TensorRT-RTX have no FP16/BF16 builder flags: a tensor's type is what the graph says
(tensorrt-facts.md §3). So the graph itself is made low precision: weights converted, Casts at the
boundaries of FP32 islands, I/O kept FP32 by default. Steps:

1. observe: run the FP32 model in ONNX Runtime on sample data and record every float tensor's range;
2. classify (rules.py): FP32 islands by op type/attributes, by observed values and weights, by the user;
3. rewrite (rewrite.py): retype, convert weights, insert Casts, fold redundant Casts;
4. check (verify.py): the converted model's outputs against the FP32 outputs on the same batches.
"""

from __future__ import annotations

import difflib
import gc
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common

from trtforge.core import onnx_io
from trtforge.core.onnx_io import min_ir_version
from trtforge.errors import TrtforgeWarning, UserError
from trtforge.passes.precision.observe import observe
from trtforge.passes.precision.record import KeptNode, PrecisionRecord
from trtforge.passes.precision.rewrite import Rewriter, fold_casts
from trtforge.passes.precision.rules import LOW_TYPES, Classifier, Options
from trtforge.passes.precision.verify import check_outputs

PRECISIONS = ("fp32", "fp16", "bf16")
# FP16 keeps a node in FP32 when its activations exceed this: the spacing of FP16 values at 512 is 0.5,
# too coarse for logits and residual sums (same default as ModelOpt AutoCast).
DEFAULT_DATA_MAX = 512.0
BF16_MIN_OPSET = 22  # opset 22 added bfloat16 to the remaining float ops
QDQ_MIN_OPSET = 19  # first opset whose QuantizeLinear/DequantizeLinear take FP16/BF16 scales and data
_LOW_ELEM = {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _check_keep_fp32(model: onnx.ModelProto, keep_fp32: Sequence[str]) -> frozenset[str]:
    names = {n.name for n in model.graph.node if n.name}
    ops = {n.op_type for n in model.graph.node}
    for entry in keep_fp32:
        if entry not in names and entry not in ops:
            close = difflib.get_close_matches(entry, sorted(names | ops), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UserError(
                f"--keep-fp32 {entry!r} names no node and no op type in this model. Give a node name or an "
                f"op type present in the graph (op types here: {', '.join(sorted(ops))}).{hint}"
            )
    return frozenset(keep_fp32)


def _existing_low_precision(model: onnx.ModelProto) -> dict[str, int]:
    """Count tensors (initializers and typed values) already in FP16/BF16."""
    found: dict[str, int] = {}
    for init in model.graph.initializer:
        if init.data_type in _LOW_ELEM:
            found[_LOW_ELEM[init.data_type]] = found.get(_LOW_ELEM[init.data_type], 0) + 1
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        elem = vi.type.tensor_type.elem_type
        if elem in _LOW_ELEM:
            found[_LOW_ELEM[elem]] = found.get(_LOW_ELEM[elem], 0) + 1
    for node in model.graph.node:
        if node.op_type == "Cast":
            to = next(a.i for a in node.attribute if a.name == "to")
            if to in _LOW_ELEM:
                found[_LOW_ELEM[to]] = found.get(_LOW_ELEM[to], 0) + 1
    return found


def _target_opset(model: onnx.ModelProto, precision: str, opset: int) -> tuple[int, str]:
    """The opset the low-precision graph needs (and why): BF16 kernels, low-precision Q/DQ."""
    target, why = opset, ""
    qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    if qdq and opset < QDQ_MIN_OPSET:
        target, why = QDQ_MIN_OPSET, "Q/DQ with FP16/BF16 scales (DequantizeLinear feeds low precision)"
    if precision == "bf16" and target < BF16_MIN_OPSET:
        target, why = BF16_MIN_OPSET, "BF16 kernels for all float ops"
    return target, why


def _fill_types(model: ir.Model, stats: dict) -> None:
    """Give values that shape inference left untyped the dtype ONNX Runtime produced for them."""
    for node in model.graph:
        for v in node.outputs:
            st = stats.get(v.name)
            if v.dtype is None and st is not None:
                v.dtype = ir.DataType.from_numpy(st.dtype)


def convert_precision(
    model: onnx.ModelProto,
    precision: str = "fp16",
    *,
    keep_fp32: Sequence[str] = (),
    data: Iterable[dict[str, np.ndarray]] | None = None,
    keep_io_types: bool = True,
    data_max: float = DEFAULT_DATA_MAX,
    init_max: float | None = None,
    feed_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[onnx.ModelProto, PrecisionRecord]:
    """Convert an FP32 model to mixed `precision` ("fp32" is a no-op); returns the new model and its record.

    keep_fp32: node names or op types to keep in FP32. data: feed dicts for the value check (None:
    generated from the input specs). keep_io_types: graph inputs/outputs stay FP32. data_max: largest
    activation magnitude allowed in a low-precision node. init_max: largest weight magnitude (None: the
    target format's largest finite value). feed_shapes: input shapes generated data falls back to when
    the model cannot run at the small generated sizes. The input model is not modified.
    """
    start = time.perf_counter()
    precision = precision.lower()
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision!r}: expected one of {', '.join(PRECISIONS)}.")
    keep = _check_keep_fp32(model, keep_fp32)
    opset = _opset(model)
    record = PrecisionRecord(precision, keep_io_types=keep_io_types, opset_before=opset, opset_after=opset)
    if precision == "fp32":
        record.status, record.message = "noop-fp32", "FP32 requested: the graph is left as it is"
        return model, record
    existing = _existing_low_precision(model)
    if existing:
        have = max(existing, key=existing.get)
        if have != precision:
            raise UserError(
                f"the model is already in {have.upper()} ({existing[have]} {have.upper()} tensors); "
                f"converting it to {precision.upper()} would round twice. Convert the FP32 model instead."
            )
        record.status = "already-low-precision"
        record.message = f"model already has {existing[have]} {have.upper()} tensors; not converted again"
        record.seconds = time.perf_counter() - start
        return model, record

    low = LOW_TYPES[precision]
    work = model  # (read only below: no copy of the weights)
    target, why = _target_opset(work, precision, opset)
    if target > opset:
        work = onnx.version_converter.convert_version(work, target)
        opsets = {o.domain: o.version for o in work.opset_import}
        work.ir_version = max(work.ir_version, min_ir_version(opsets))
        record.opset_after = target
        record.notes.append(f"opset raised {opset} -> {target}: {why}")
    with onnx_io.shapes_inferred(work) as typed:
        obs = observe(typed, data, feed_shapes)
        m = ir.from_proto(typed)
    record.data_source, record.sample_batches = obs.source, obs.batches

    ir.passes.common.RemoveInitializersFromInputsPass()(m)
    ir.passes.common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(m)
    _fill_types(m, obs.stats)
    init_limit = float(ml_dtypes.finfo(low.numpy()).max) if init_max is None else float(init_max)
    record.data_max, record.init_max = data_max, init_limit
    opts = Options(low=low, data_max=data_max, init_max=init_limit, keep_fp32=keep)
    decisions = Classifier(m, obs.stats, opts).run()

    casts_before = sum(n.op_type == "Cast" for n in m.graph)
    stats = Rewriter(m.graph, low).apply(decisions, keep_io_types)
    fold_casts(m)
    ir.passes.common.TopologicalSortPass()(m)
    casts_after = sum(n.op_type == "Cast" for n in m.graph)
    out = ir.to_proto(m)

    record.float_nodes = len(decisions)
    record.low_precision_nodes = sum(d.low for d in decisions.values())
    record.kept_fp32 = [
        KeptNode(n.name or "", n.op_type, d.reasons) for n, d in decisions.items() if not d.low
    ]
    record.casts_inserted = stats.casts_inserted
    record.casts_removed = casts_before + stats.casts_inserted - casts_after
    record.initializers_converted = stats.initializers_converted
    record.initializers_saturated = stats.saturated
    record.notes.extend(stats.notes)
    if stats.saturated:
        record.notes.append(
            f"{len(stats.saturated)} weight(s) hold infinity sentinels (|x| >= 1e38, e.g. attention-mask "
            f"minimum); they saturate to the {precision.upper()} limit"
        )
    record.seconds = time.perf_counter() - start
    del m, decisions, work  # (the FP32 weights and their converted arrays: `out` holds what is left)
    gc.collect()  # (an onnx_ir graph is a reference cycle: it keeps them until the collector runs)
    checked = time.perf_counter()
    record.verification, record.verification_mode = check_outputs(out, obs, low)
    record.check_seconds = time.perf_counter() - checked
    problems = record.check_problems()
    if problems:  # (the model is still returned: the user decides, told what the check saw and what helps)
        warnings.warn(
            f"{precision.upper()} conversion: {'; '.join(problems)}, on {len(obs.check_feeds)} sample "
            f"batch(es) ({obs.source}). Keep the nodes that lose it in FP32 (--keep-fp32 NODE_OR_OPTYPE: "
            f"values {precision.upper()} flushes to zero or rounds away, e.g. a subtraction of nearly "
            "equal numbers), or check with --precision-data of real inputs.",
            TrtforgeWarning,
            stacklevel=2,
        )
    return out, record
