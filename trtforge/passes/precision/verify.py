"""Check a converted model against the FP32 outputs observed before conversion (ONNX Runtime, CPU).

Sessions are EXACT (`trtforge.numerics`): no ORT fusion keeps in FP32 a tensor the graph stores in low
precision. ONNX Runtime's CPU provider runs FP16 graphs (computing in FP32 where an op has no FP16 kernel) but
has almost no BF16 kernels. So the check runs an emulation: the same graph computed in FP32 with every
low-precision tensor rounded (Cast to FP16/BF16 and back after each producer), which is how a strongly
typed engine stores its activations while accumulating in FP32.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common

from trtforge.numerics.compare import compare_arrays
from trtforge.numerics.sessions import exact_session
from trtforge.passes.precision.observe import Observation
from trtforge.passes.precision.record import OutputCheck

FLOAT = ir.DataType.FLOAT


def emulate_in_fp32(model: onnx.ModelProto, low: ir.DataType) -> onnx.ModelProto:
    """The same graph in FP32 arithmetic, rounding every `low` tensor to `low` where it is produced. A `low`
    weight stays stored as it is and is cast to FP32 where it is read (exact): an FP32 copy of the weights
    would double a large model's."""
    m = ir.from_proto(model)
    g = m.graph
    stored = []
    for v in g.initializers.values():
        if v.dtype != low:
            continue
        if v.is_graph_output():
            v.const_value = ir.tensor(v.const_value.numpy().astype(np.float32), name=v.name)
            v.dtype = FLOAT
        else:
            stored.append((v, list(v.uses())))
    for v, uses in stored:
        wide = ir.Value(name=f"{v.name}__emu_fp32", type=ir.TensorType(FLOAT), shape=v.shape)
        g.append(ir.node("Cast", [v], {"to": FLOAT}, outputs=[wide]))
        for user, idx in uses:
            user.replace_input_with(idx, wide)
    for node in list(g):
        for attr_name in ("to", "dtype"):
            attr = node.attributes.get(attr_name)
            if node.op_type != "Cast" and attr is not None and attr.as_int() == low:
                node.attributes[attr_name] = ir.AttrInt64(attr_name, FLOAT)
        if node.op_type in ("ConstantOfShape", "Constant") and "value" in node.attributes:
            t = node.attributes["value"].as_tensor()
            if t.dtype == low:
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(t.numpy().astype(np.float32)))
    producers = [(None, v) for v in g.inputs if v.dtype == low]
    producers += [(n, v) for n in list(g) for v in n.outputs if v.dtype == low]
    for node, v in producers:
        uses = list(v.uses())
        was_output = v.is_graph_output()
        if node is not None and node.op_type == "Cast":
            rounded = v  # already rounded by the Cast; only bring it back to FP32
        else:
            v.dtype = FLOAT
            rounded = ir.Value(name=f"{v.name}__emu_low", type=ir.TensorType(low), shape=v.shape)
            g.append(ir.node("Cast", [v], {"to": low}, outputs=[rounded]))
        back = ir.Value(name=f"{v.name}__emu_fp32", type=ir.TensorType(FLOAT), shape=v.shape)
        g.append(ir.node("Cast", [rounded], {"to": FLOAT}, outputs=[back]))
        for user, idx in uses:
            user.replace_input_with(idx, back)
        # (a graph input returned as it is stays the output under its name, the feed's: renamed, the
        # session asked for an input of the new name)
        if was_output and node is not None:
            idx = list(g.outputs).index(v)
            original = v.name
            v.name = f"{original}__emu_raw"
            back.name = original
            g.outputs[idx] = back
    ir.passes.common.TopologicalSortPass()(m)
    return ir.to_proto(m)


def check_outputs(
    converted: onnx.ModelProto, obs: Observation, low: ir.DataType
) -> tuple[list[OutputCheck], str]:
    """Per graph output: worst abs/rel error and per-sample cosine vs FP32, and finiteness.

    Always runs the emulation (FP32 arithmetic, every low-precision tensor rounded where it is
    produced: what a strongly typed engine stores). ONNX Runtime's own FP16 run is not enough on its
    own: for ops without FP16 CPU kernels it computes consecutive nodes in FP32 and skips the rounding
    (and an overflow) in between. For FP16 the native graph runs too, and the worse result counts.
    """
    graphs = [lambda: emulate_in_fp32(converted, low)]
    mode = f"onnxruntime-cpu: {low.name} storage emulated (FP32 arithmetic, every {low.name} tensor rounded)"
    if low == ir.DataType.FLOAT16:
        graphs.append(lambda: converted)
        mode += " and the native FP16 graph; worst of both"
    worst: dict[str, list[float]] = {}
    finite: dict[str, bool] = {}
    for graph in graphs:  # (one session at a time: each holds a copy of the weights)
        sess = exact_session(graph())
        in_types = {i.name: i.type for i in sess.get_inputs()}
        out_names = [o.name for o in sess.get_outputs()]
        for feed, ref in zip(obs.check_feeds, obs.check_outputs):
            fp16_in = {k for k, t in in_types.items() if t == "tensor(float16)"}
            cast_feed = {k: (a.astype(np.float16) if k in fp16_in else a) for k, a in feed.items()}
            got = dict(zip(out_names, sess.run(None, cast_feed)))
            for name, expect in ref.items():
                if expect.dtype.kind != "f":
                    continue
                abs_err, rel_err, cos, fin = _compare(got[name], expect)
                finite[name] = finite.get(name, True) and fin
                w = worst.setdefault(name, [0.0, 0.0, 1.0])
                w[0], w[1], w[2] = max(w[0], abs_err), max(w[1], rel_err), min(w[2], cos)
        del sess  # (before the next session is made, not once it replaces this one)
    checks = [OutputCheck(n, w[0], w[1], w[2], finite[n]) for n, w in worst.items()]
    return checks, mode


def _compare(got: np.ndarray, expect: np.ndarray) -> tuple[float, float, float, bool]:
    """(max abs error, max abs error / max |expected|, min per-sample cosine, finite where expected),
    over the elements finite in both (`trtforge.numerics.compare` metrics)."""
    a, b = got.astype(np.float64), expect.astype(np.float64)
    finite = bool(np.isfinite(a[np.isfinite(b)]).all())
    ok = np.isfinite(a) & np.isfinite(b)
    m = compare_arrays(np.where(ok, b, 0.0), np.where(ok, a, 0.0))
    return m.max_abs, m.peak_rel, m.min_row_cosine, finite
