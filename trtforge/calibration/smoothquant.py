"""SmoothQuant (Xiao et al. 2023): migrate activation outliers into the weights of MatMuls.

For an activation X [.., K] read by MatMuls with weights W [K, N], per input channel k:
``s_k = max|X_k|^alpha / max|W_k,:|^(1 - alpha)``; the graph computes ``(X * (1/s)) @ (diag(s) W)``,
mathematically the same product, with a flatter activation to quantize per-tensor. The 1/s is a
Mul node in front of the group (TensorRT fuses it into the following Q); W is rescaled offline.
Whether it helps is measured per model (benchmarks/results/calibration.md), not assumed.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from trtforge.calibration.placement import QuantTarget, constant_values

if TYPE_CHECKING:
    import onnx

_S_MIN, _S_MAX = 1e-4, 1e4


def smoothable_groups(targets: list[QuantTarget]) -> dict[str, list[QuantTarget]]:
    """Activation tensor -> MatMul targets with a [K, N] weight that read it (the smoothing groups)."""
    groups: dict[str, list[QuantTarget]] = {}
    for t in targets:
        if t.op_type == "MatMul" and t.rule == "gemm_inputs" and t.weight_axis == 1:
            groups.setdefault(t.activations[0], []).append(t)
    return groups


def apply_smoothquant(
    model: onnx.ModelProto,
    targets: list[QuantTarget],
    channel_amax: dict[str, np.ndarray],
    alpha: float,
) -> tuple[onnx.ModelProto, list[QuantTarget], dict[str, object]]:
    """(smoothed model copy, targets rewired to the smoothed tensors/weights, summary)."""
    import onnx
    from onnx import helper, numpy_helper

    from trtforge.calibration.qdq import drop_unused_initializers, insert_before
    from trtforge.core.names import fresh_names, proto_graph_names

    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    fresh = fresh_names(proto_graph_names(g))
    consts = constant_values(out)
    index = {n.name: i for i, n in enumerate(g.node)}
    groups = smoothable_groups(targets)
    new_targets = {id(t): t for t in targets}
    inserts: dict[int, list[onnx.NodeProto]] = {}
    smoothed_of: dict[str, str] = {}
    ratios = []
    for tensor, group in groups.items():
        x_amax = channel_amax.get(tensor)
        weights = [consts[t.weight] for t in group if t.weight]
        if x_amax is None or any(w.shape[0] != x_amax.shape[0] for w in weights):
            continue
        w_amax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        ok = (x_amax > 0) & (w_amax > 0)
        s = np.ones_like(x_amax, dtype=np.float64)
        s[ok] = x_amax[ok].astype(np.float64) ** alpha / w_amax[ok].astype(np.float64) ** (1.0 - alpha)
        s = np.clip(s, _S_MIN, _S_MAX)
        ratios.append(float(x_amax.max() / max(np.median(x_amax), 1e-12)))
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), fresh(f"{tensor}_smooth_inv_scale"))
        smoothed = fresh(f"{tensor}_smoothed")
        smoothed_of[tensor] = smoothed
        g.initializer.append(inv)
        first = min(index[t.node] for t in group)
        inserts.setdefault(first, []).append(
            helper.make_node("Mul", [tensor, inv.name], [smoothed], name=fresh(f"{tensor}_SmoothQuant_Mul"))
        )
        for t in group:
            node = g.node[index[t.node]]
            w_name = fresh(f"{t.weight}_smoothed_{t.node}")
            g.initializer.append(
                numpy_helper.from_array((consts[t.weight] * s[:, None]).astype(np.float32), w_name)
            )
            node.input[0], node.input[1] = smoothed, w_name
            new_targets[id(t)] = dataclasses.replace(t, activations=[smoothed], weight=w_name)
    insert_before(g, inserts)
    drop_unused_initializers(out)
    read = {t for n in g.node for t in n.input}
    summary = {
        "alpha": alpha,
        "tensors_smoothed": len(ratios),
        "matmuls_smoothed": sum(len(v) for k, v in groups.items() if smoothed_of.get(k) in read),
        "max_outlier_ratio_before": max(ratios) if ratios else None,
    }
    return out, [new_targets[id(t)] for t in targets], summary
