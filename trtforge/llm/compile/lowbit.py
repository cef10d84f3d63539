"""FP8 W8A8 and INT4 weight-only step graphs: explicit Q/DQ in the form TensorRT consumes.

FP8 (``--precision fp8``): E4M3 Q/DQ on the inputs of every projection MatMul, as TensorRT fuses
them into FP8 GEMMs (tensorrt-facts.md §2.1-2.3): the activation per-tensor (scale = amax / 448,
max-calibrated on prompts through :mod:`trtforge.calibration`), the weight stored as FP8 with a
per-output-channel scale behind a DequantizeLinear. No SmoothQuant: E4M3's range (2^-9 .. 448) holds
the activation outliers that INT8 needs smoothing for. Without calibration prompts, seeded random
token ids stand in (ModelOpt does the same without data), and the record says so.

INT4 (``--precision int4``): weight-only, round-to-nearest, symmetric, one scale per block of
``INT4_BLOCK`` (128) input channels: a MatMul weight [K, N] is stored as int4 with a DequantizeLinear
(opset 21+ ``axis=0, block_size=128``, scale [K / 128, N]) feeding the MatMul, which stays FP16: the
pattern TensorRT (and TensorRT-RTX's weight-only GEMMs) reads as an INT4 weight-only GEMM.

Both leave the LM head (the MatMul onto the vocabulary) in float, as TensorRT-LLM and AWQ do: it
decides the next token and is one GEMM of many; and the cache write and attention stay in float.

Measured with TensorRT-RTX 1.7.1 (CPU ahead-of-time builds of a 2-layer Llama step graph): FP8 builds
for SM89 and for the builder's default targets; for SM80 it refuses ("Cannot compile for target(s)
sm80, because the model contains HW-specific datatypes: fp8_e4m3"), which :mod:`.build` turns into a
UserError naming the precision and targets; SM90 (Hopper, where datacenter TensorRT fuses FP8) is no
TensorRT-RTX target at all (refused by ``--target`` checking). INT4 weight-only builds for SM80 and
the default targets (8 DEQUANTIZE layers feeding MATRIX_MULTIPLY).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from trtforge.core import onnx_io
from trtforge.errors import UserError

INT4_BLOCK = 128
INT4_MAX = 7  # symmetric: -8 is never produced, so the grid is the same both sides of zero
DEFAULT_CALIB_PROMPTS = 16
DEFAULT_CALIB_LEN = 64


def default_prompts(generation: dict[str, Any], n: int = DEFAULT_CALIB_PROMPTS) -> list[list[int]]:
    """`n` seeded random-token prompts within the vocabulary and the prefill limit (FP8's fallback)."""
    rng = np.random.default_rng(0)
    length = max(1, min(DEFAULT_CALIB_LEN, int(generation["max_prefill"])))
    vocab = int(generation["vocab_size"])
    return [rng.integers(0, vocab, size=length).tolist() for _ in range(n)]


def lm_head_nodes(model: onnx.ModelProto, vocab_size: int) -> list[str]:
    """Names of MatMul nodes with a constant weight onto the vocabulary (the LM head)."""
    from trtforge.calibration.placement import constant_values

    consts = constant_values(model)
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul"
        and n.input[1] in consts
        and consts[n.input[1]].ndim == 2
        and consts[n.input[1]].shape[1] == vocab_size
    ]


def quantize_step_fp8(
    model: onnx.ModelProto,
    generation: dict[str, Any],
    prompts: Sequence[Sequence[int]] | None,
    *,
    progress: bool = False,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """FP8 E4M3 Q/DQ step graph (per-tensor activations, per-channel weights) and its record."""
    from trtforge.calibration.api import calibrate_model
    from trtforge.calibration.placement import name_nodes
    from trtforge.llm.compile.int8 import prompt_dataset

    work = onnx.ModelProto()
    work.CopyFrom(model)
    name_nodes(work)
    source = "prompts"
    if not prompts:
        prompts, source = default_prompts(generation), "seeded random token ids (no --calib-data)"
    head = lm_head_nodes(work, int(generation["vocab_size"]))
    data = prompt_dataset(work, generation, prompts)
    out, record = calibrate_model(
        work,
        data,
        method="max",
        smoothquant=None,
        exclude_nodes=tuple(head),
        progress=progress,
        fmt="fp8",
    )
    rec = record.to_dict()
    rec["calibration_prompts"] = {"count": len(prompts), "source": source}
    rec["kept_float"] = {"lm_head": head}
    return out, rec


def _block_quantize(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(int4 weight [K, N], float32 scales [K / block, N]) by round-to-nearest within each block."""
    import ml_dtypes

    k, n = w.shape
    blocks = w.reshape(k // block, block, n)
    amax = np.abs(blocks).max(axis=1)
    scale = np.where(amax > 0, amax / INT4_MAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(blocks / scale[:, None, :]), -INT4_MAX, INT4_MAX).reshape(k, n)
    return q.astype(ml_dtypes.int4), scale


def quantize_step_int4(
    model: onnx.ModelProto, generation: dict[str, Any], *, block_size: int = INT4_BLOCK
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """INT4 weight-only (blocked DequantizeLinear) step graph and its record (what was quantized, why
    the rest was not). Refuses a model in which no projection qualifies."""
    from onnx import helper, numpy_helper

    from trtforge.calibration.placement import constant_values, name_nodes
    from trtforge.llm.compile.ops import STEP_OPSET

    if STEP_OPSET < 21:
        raise UserError(f"INT4 blocked DequantizeLinear needs opset 21; step graphs are opset {STEP_OPSET}.")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    name_nodes(out)
    g = out.graph
    consts = constant_values(out)
    head = set(lm_head_nodes(out, int(generation["vocab_size"])))
    inits = {i.name: i for i in g.initializer}
    decisions, done, weight_bytes = [], {}, {"float": 0, "int4": 0}
    for node in list(g.node):
        if node.op_type != "MatMul":
            continue
        w = consts.get(node.input[1])
        why = None
        if node.name in head:
            why = "LM head: kept in float (TensorRT-LLM and AWQ keep it)"
        elif w is None or w.ndim != 2 or node.input[1] not in inits:
            why = "no constant 2-D weight initializer (an activation x activation MatMul)"
        elif w.shape[0] % block_size:
            why = f"input channels {w.shape[0]} are not a multiple of the block size {block_size}"
        if why:
            decisions.append({"node": node.name, "quantized": False, "reason": why})
            continue
        name = node.input[1]
        if name not in done:
            q, scale = _block_quantize(w.astype(np.float32), block_size)
            wq, s, dq = f"{name}_int4", f"{name}_int4_scale", f"{name}_int4_dequantized"
            g.initializer.extend([numpy_helper.from_array(q, wq), numpy_helper.from_array(scale, s)])
            at = list(g.node).index(node)
            g.node.insert(
                at,
                helper.make_node(
                    "DequantizeLinear", [wq, s], [dq], name=f"{name}_DQ", axis=0, block_size=block_size
                ),
            )
            done[name] = dq
            weight_bytes["float"] += w.size * 4
            weight_bytes["int4"] += w.size // 2 + scale.size * 4
        node.input[1] = done[name]
        decisions.append({"node": node.name, "quantized": True, "shape": list(w.shape)})
    if not done:
        reasons = sorted({d["reason"] for d in decisions})
        raise UserError(
            f"--precision int4: no MatMul weight qualifies for INT4 blocks of {block_size} (kept in float: "
            f"{reasons or ['no MatMul']}); the model's hidden sizes must be multiples of {block_size}."
        )
    read = {t for n in g.node for t in n.input} | {o.name for o in g.output}
    keep = [i for i in g.initializer if i.name in read]
    del g.initializer[:]
    g.initializer.extend(keep)
    onnx_io.check_proto(out)
    record = {
        "format": "int4",
        "scheme": f"weight-only, symmetric round-to-nearest, blocks of {block_size} input channels",
        "block_size": block_size,
        "matmuls_quantized": sum(d["quantized"] for d in decisions),
        "matmuls_total": len(decisions),
        "weights_quantized": len(done),
        "weight_bytes": weight_bytes,
        "decisions": decisions,
    }
    return out, record


def check_step_accuracy(
    before: onnx.ModelProto, after: onnx.ModelProto, generation: dict[str, Any]
) -> dict[str, float]:
    """The quantized step graph against the float one in exact ONNX Runtime, on a ragged prefill of
    the export's example feeds (8 rows of random tokens): max abs and relative-L2 error of the logits,
    and top-1 agreement (a coarse check on random tokens: the perplexity report is the real one), as
    :mod:`trtforge.numerics.compare` defines them."""
    from trtforge.llm.compile.export import example_feeds
    from trtforge.numerics.compare import compare_arrays, topk_agreement
    from trtforge.numerics.sessions import exact_session

    feeds = {k: v.numpy() for k, v in example_feeds(generation, batch=8, seq=16).items()}
    ref = exact_session(before).run(["logits"], feeds)[0]
    got = exact_session(after).run(["logits"], feeds)[0]
    metrics = compare_arrays(ref, got)
    return {
        "logits_max_abs_error": metrics.max_abs,
        "logits_rel_l2": metrics.rel_l2,
        "top1_agreement": topk_agreement(ref, got)[0],
    }
