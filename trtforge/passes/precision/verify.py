"""Check a converted model against the FP32 outputs observed before conversion (ONNX Runtime, CPU).

ONNX Runtime's CPU provider runs FP16 graphs (computing in FP32 where an op has no FP16 kernel) but
has almost no BF16 kernels. So the check runs an emulation: the same graph computed in FP32 with every
low-precision tensor rounded (Cast to FP16/BF16 and back after each producer), which is how a strongly
typed engine stores its activations while accumulating in FP32.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common

from trtforge.passes.precision.observe import Observation
from trtforge.passes.precision.record import OutputCheck

FLOAT = ir.DataType.FLOAT


def emulate_in_fp32(model: onnx.ModelProto, low: ir.DataType) -> onnx.ModelProto:
    """The same graph in FP32 arithmetic, rounding every `low` tensor to `low` where it is produced."""
    m = ir.from_proto(model)
    g = m.graph
    for v in g.initializers.values():
        if v.dtype == low:
            v.const_value = ir.tensor(v.const_value.numpy().astype(np.float32), name=v.name)
            v.dtype = FLOAT
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
        if was_output:
            idx = list(g.outputs).index(v)
            original = v.name
            v.name = f"{original}__emu_raw"
            back.name = original
            g.outputs[idx] = back
    ir.passes.common.TopologicalSortPass()(m)
    return ir.to_proto(m)


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # As written: no fusions that would keep a tensor in FP32 that the graph stores in low precision.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def check_outputs(
    converted: onnx.ModelProto, obs: Observation, low: ir.DataType
) -> tuple[list[OutputCheck], str]:
    """Per graph output: worst abs/rel error and per-sample cosine vs FP32, and finiteness.

    Always runs the emulation (FP32 arithmetic, every low-precision tensor rounded where it is
    produced: what a strongly typed engine stores). ONNX Runtime's own FP16 run is not enough on its
    own: for ops without FP16 CPU kernels it computes consecutive nodes in FP32 and skips the rounding
    (and an overflow) in between. For FP16 the native graph runs too, and the worse result counts.
    """
    sessions = [_session(emulate_in_fp32(converted, low))]
    mode = f"onnxruntime-cpu: {low.name} storage emulated (FP32 arithmetic, every {low.name} tensor rounded)"
    if low == ir.DataType.FLOAT16:
        sessions.append(_session(converted))
        mode += " and the native FP16 graph; worst of both"
    worst: dict[str, list[float]] = {}
    finite: dict[str, bool] = {}
    for sess in sessions:
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
    checks = [OutputCheck(n, w[0], w[1], w[2], finite[n]) for n, w in worst.items()]
    return checks, mode


def _compare(got: np.ndarray, expect: np.ndarray) -> tuple[float, float, float, bool]:
    """(max abs error, max abs error / max |expected|, min per-sample cosine, finite where expected)."""
    a, b = got.astype(np.float64), expect.astype(np.float64)
    finite = bool(np.isfinite(a).all() or not np.isfinite(b).all())
    ok = np.isfinite(a) & np.isfinite(b)
    diff = np.abs(a - b)[ok]
    abs_err = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(b[ok]).max()) if ok.any() else 0.0
    rel_err = abs_err / scale if scale > 0 else abs_err
    return abs_err, rel_err, _min_cosine(np.where(ok, a, 0), np.where(ok, b, 0)), finite


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Smallest cosine similarity over samples (leading axis); 1.0 where both are zero."""
    a2 = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
    b2 = b.reshape(b.shape[0], -1) if b.ndim > 1 else b.reshape(1, -1)
    na, nb = np.linalg.norm(a2, axis=1), np.linalg.norm(b2, axis=1)
    dot = np.einsum("ij,ij->i", a2, b2)
    cos = np.where((na == 0) & (nb == 0), 1.0, dot / np.maximum(na * nb, 1e-300))
    return float(cos.min()) if cos.size else 1.0
