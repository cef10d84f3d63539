"""ONNX Runtime sessions made for a purpose: EXACT for every accuracy figure, FAST for latency only.

EXACT turns graph optimizations off, so ORT runs the graph as written: QuantizeLinear/DequantizeLinear
compute in float and a DQ -> MatMul stays a float MatMul, matching exact integer math to ~1e-6 (what
TensorRT's INT8 GEMMs compute). With optimizations on, ORT fuses Q/DQ into its own int8 kernels whose
arithmetic depends on the CPU (u8s8 with int16 saturation on AVX2, VNNI elsewhere), so an accuracy
measured that way would change from machine to machine. FAST keeps ORT's optimizations for timing.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from trtforge.errors import UserError

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

Purpose = Literal["exact", "fast"]
EXACT: Purpose = "exact"
FAST: Purpose = "fast"
PROVIDERS = ("CPUExecutionProvider",)


def session_options(
    purpose: Purpose, *, threads: int | None = None, quiet: bool = False
) -> ort.SessionOptions:
    """SessionOptions for `purpose`; `threads` pins intra-op threads (and one inter-op thread); `quiet`
    logs fatal errors only, for callers that report a failing run through its exception."""
    import onnxruntime as ort

    if purpose not in (EXACT, FAST):
        raise ValueError(f"session purpose must be '{EXACT}' or '{FAST}', got {purpose!r}")
    opts = ort.SessionOptions()
    opts.log_severity_level = 4 if quiet else 3
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if purpose == EXACT
        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    if threads:
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
    return opts


def make_session(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    purpose: Purpose = EXACT,
    *,
    threads: int | None = None,
    quiet: bool = False,
) -> ort.InferenceSession:
    """A CPU session over an in-memory model, serialized bytes or a file path (ORT errors propagate). A
    model past protobuf's 2 GB (:func:`~trtforge.core.onnx_io.needs_external`) is handed to ONNX Runtime
    as a file with its weights in external data (:func:`~trtforge.core.onnx_io.model_file`): ORT parses
    no protobuf that large (its session holds about one copy of the weights, as from bytes)."""
    import onnxruntime as ort

    from trtforge.core import onnx_io

    disabled = list(FP16_CRASHING_OPTIMIZERS) if purpose == FAST and _has_fp16(model) else None
    opts = session_options(purpose, threads=threads, quiet=quiet)
    if isinstance(model, (str, os.PathLike)):
        source: str | bytes = str(model)
    elif isinstance(model, bytes):
        source = model
    elif onnx_io.needs_external(model):
        with onnx_io.model_file(model) as path:  # (the session has read or mapped it once made)
            return ort.InferenceSession(
                str(path), opts, providers=list(PROVIDERS), disabled_optimizers=disabled
            )
    else:
        source = model.SerializeToString()
    return ort.InferenceSession(source, opts, providers=list(PROVIDERS), disabled_optimizers=disabled)


# ORT graph optimizers that crash the process (SIGSEGV, no exception) on FP16 graphs: ORT 1.32's
# NchwcTransformer on any FP16 Transpose -> MatMul (nn.MultiheadAttention's sequence-first layout), at
# ORT_ENABLE_ALL only. Its NCHWc kernels are FP32-only, so an FP16 graph loses nothing without it.
FP16_CRASHING_OPTIMIZERS = ("NchwcTransformer",)


def _has_fp16(model: onnx.ModelProto | bytes | str | os.PathLike[str]) -> bool:
    """True when the main graph holds an FP16 tensor: an initializer, a graph input/output, or a Cast to it
    (what a `--precision fp16` conversion writes). A file is read without its external data."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(str(model), load_external_data=False)
    elif isinstance(model, bytes):
        model = onnx.ModelProto.FromString(model)
    fp16 = onnx.TensorProto.FLOAT16
    g = model.graph
    return (
        any(t.data_type == fp16 for t in g.initializer)
        or any(v.type.tensor_type.elem_type == fp16 for v in (*g.input, *g.output))
        or any(
            n.op_type == "Cast" and any(a.name == "to" and a.i == fp16 for a in n.attribute) for n in g.node
        )
    )


def exact_session(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    *,
    threads: int | None = None,
    quiet: bool = False,
) -> ort.InferenceSession:
    """The session every accuracy figure comes from (graph optimizations off; see the module doc)."""
    return make_session(model, EXACT, threads=threads, quiet=quiet)


def refuse_unloadable(model: onnx.ModelProto, where: str, remedy: str) -> None:
    """UserError when ONNX Runtime refuses to load `model` (a value's declared type clashing with what its
    node makes, two nodes of one name, an op's shape inference failing on the declared shapes): its reason,
    said before a stage that runs the model fails on it deep inside. Errors that are not ORT's refusal of
    the graph propagate."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    from trtforge.errors import clipped

    try:
        exact_session(model, quiet=True)
    except (
        state.Fail,
        state.InvalidArgument,
        state.InvalidGraph,
        state.InvalidProtobuf,
        state.NotImplemented,
    ) as e:
        reason = str(e).strip().replace("\n", " ").rstrip(". ")
        raise UserError(f"{where}: ONNX Runtime cannot load it: {clipped(reason)}. {remedy}") from e


def fast_session(
    model: onnx.ModelProto | bytes | str | os.PathLike[str], *, threads: int | None = None
) -> ort.InferenceSession:
    """A session for latency timing only (ORT's fusions on; its numbers depend on the CPU's ISA)."""
    return make_session(model, FAST, threads=threads)


def is_exact(session: ort.InferenceSession) -> bool:
    """True when `session` runs with graph optimizations off (the EXACT purpose)."""
    import onnxruntime as ort

    level = session.get_session_options().graph_optimization_level
    return level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL


BF16 = "tensor(bfloat16)"


def run(session: ort.InferenceSession, feed: dict, names: list[str] | None = None) -> list:
    """`session.run` on the entries of `feed` the session takes as inputs (others are ignored).

    ORT's numpy bridge has no bfloat16: bfloat16 inputs (ml_dtypes arrays, or float arrays cast here) go
    in as OrtValues, and bfloat16 outputs come back as float32 arrays (exact: every bfloat16 is a float32).
    """
    inputs = {i.name: i.type for i in session.get_inputs()}
    feed = {k: v for k, v in feed.items() if k in inputs}
    outputs = {o.name: o.type for o in session.get_outputs()}
    wanted = list(outputs) if names is None else list(names)
    if BF16 not in inputs.values() and all(outputs.get(n) != BF16 for n in wanted):
        return session.run(names, feed)
    return _run_ort_values(session, feed, inputs, wanted)


def _run_ort_values(
    session: ort.InferenceSession, feed: dict, types: dict[str, str], names: list[str]
) -> list:
    import ml_dtypes
    import numpy as np
    import onnx
    import onnxruntime as ort

    values = {}
    for name, array in feed.items():
        if types[name] == BF16:
            bits = np.ascontiguousarray(np.asarray(array).astype(ml_dtypes.bfloat16)).view(np.uint16)
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx.TensorProto.BFLOAT16)
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
    return [_to_numpy(v) for v in session.run_with_ort_values(names, values)]


def _to_numpy(value: ort.OrtValue):
    """An OrtValue as numpy; a bfloat16 tensor (which OrtValue.numpy refuses) as float32."""
    import ctypes

    import ml_dtypes
    import numpy as np

    if value.data_type() != BF16:
        return value.numpy()
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, np.float32)
    raw = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    bits = np.frombuffer(raw, dtype=np.uint16).copy()
    return bits.view(ml_dtypes.bfloat16).astype(np.float32).reshape(shape)
