"""Prove a pass by execution: run ONNX Runtime before and after it on generated inputs and compare.

Inputs respect the graph: symbolic dims get small fixed sizes (one size per dim name), integer
inputs that index an embedding table (a `Gather` over an initializer, possibly through Cast /
Reshape / Unsqueeze) get token ids within that table's size, and other integer or bool inputs get
0/1 masks where the last rows carry some padding. Float inputs are standard normal.

Models whose weights exceed `VERIFY_MAX_BYTES` are not verified (ONNX Runtime would need the
whole >2 GB model serialised in memory a second time, and a session per pass); the ledger says so.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from trtforge.passes._base import VerificationError, VerificationRecord

# Above this many bytes of initializers the pipeline skips ORT verification (documented in the ledger).
VERIFY_MAX_BYTES = 2 * 1024**3
# Sizes given to symbolic dims, in order of first appearance (batch, sequence, ...).
_DIM_SIZES = (2, 7, 5, 3, 6)
_UNNAMED_DIM = 4
# Ops an index tensor may pass through on its way to the embedding Gather.
_INDEX_PASSTHROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Elementwise |after - before| <= atol + rtol * |before| (FP32 rewrites reorder sums only)."""

    atol: float = 1e-4
    rtol: float = 1e-3


def weight_bytes(model: ir.Model) -> int:
    """Bytes held by the main graph's initializers (what makes a model 'large')."""
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def _embedding_rows(value: ir.Value, depth: int = 6) -> int | None:
    """Rows of the first constant table that `value` indexes through a Gather, if any."""
    if depth == 0:
        return None
    for node in value.consumers():
        if node.op_type in ("Gather", "GatherElements") and len(node.inputs) > 1 and node.inputs[1] is value:
            table = node.inputs[0]
            if table is not None and table.const_value is not None and table.const_value.shape.rank() >= 1:
                return int(table.const_value.shape[0])
        if node.op_type in _INDEX_PASSTHROUGH and node.inputs and node.inputs[0] is value:
            rows = _embedding_rows(node.outputs[0], depth - 1)
            if rows is not None:
                return rows
    return None


def _mask(shape: tuple[int, ...]) -> np.ndarray:
    """0/1 mask: row b of the batch keeps its first S - 2*b positions (at least one)."""
    m = np.ones(shape, dtype=np.int64)
    if len(shape) >= 2:
        seq = shape[-1]
        for b in range(shape[0]):
            m[b, ..., max(1, seq - 2 * b) :] = 0
    return m


def make_inputs(model: ir.Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Generate one feed dict for the graph inputs (see module docstring for the rules)."""
    rng = np.random.default_rng(seed)
    sizes: dict[str, int] = {}
    feeds: dict[str, np.ndarray] = {}
    initializer_names = set(model.graph.initializers)
    for value in model.graph.inputs:
        if value.name in initializer_names:
            continue
        if value.shape is None or value.dtype is None:
            raise VerificationError(
                f"cannot verify: graph input '{value.name}' has no declared shape or dtype; "
                "declare it in the ONNX model or run with verify off."
            )
        shape = []
        for dim in value.shape:
            if isinstance(dim, int):
                shape.append(dim)
            elif dim.value is None:
                shape.append(_UNNAMED_DIM)
            else:
                if dim.value not in sizes:
                    sizes[dim.value] = _DIM_SIZES[len(sizes) % len(_DIM_SIZES)]
                shape.append(sizes[dim.value])
        shape_t = tuple(shape)
        np_dtype = value.dtype.numpy()
        if value.dtype.is_floating_point():
            feeds[value.name] = rng.standard_normal(shape_t).astype(np_dtype)
        elif value.dtype == ir.DataType.BOOL:
            feeds[value.name] = _mask(shape_t).astype(bool)
        else:
            rows = _embedding_rows(value)
            if rows is not None:
                feeds[value.name] = rng.integers(0, rows, size=shape_t).astype(np_dtype)
            else:
                feeds[value.name] = _mask(shape_t).astype(np_dtype)
    return feeds


class Verifier:
    """Runs ORT on successive states of one model with fixed inputs and compares with the last state."""

    def __init__(self, model: ir.Model, tolerance: Tolerance | None = None) -> None:
        self.tolerance = tolerance or Tolerance()
        self.feeds = make_inputs(model)
        self.output_names = [v.name for v in model.graph.outputs]
        self.reference = self._run(model, "the input model")

    def _run(self, model: ir.Model, what: str) -> list[np.ndarray]:
        import onnxruntime as ort

        proto = ir.serde.serialize_model(model)
        opts = ort.SessionOptions()
        # Execute our graph as written: ORT's own fusions would hide what the pass did.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 3
        try:
            session = ort.InferenceSession(
                proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
            return session.run(None, self.feeds)
        except Exception as e:
            raise VerificationError(f"ONNX Runtime cannot run {what}: {e}") from e

    def check(self, model: ir.Model, pass_name: str, new_nodes: list[str]) -> VerificationRecord:
        """Run the model after `pass_name`, compare every output with the state before it, then advance."""
        after = self._run(model, f"the model after pass '{pass_name}'")
        if len(after) != len(self.reference):
            raise VerificationError(
                f"pass '{pass_name}' changed the number of outputs ({len(self.reference)} -> {len(after)})."
            )
        per_output: dict[str, dict[str, float]] = {}
        worst = ("", 0.0, 0.0)
        tol = self.tolerance
        for name, ref, got in zip(self.output_names, self.reference, after):
            if ref.shape != got.shape or ref.dtype != got.dtype:
                raise VerificationError(
                    f"pass '{pass_name}' changed output '{name}' from {ref.dtype}{list(ref.shape)} "
                    f"to {got.dtype}{list(got.shape)}; nodes it emitted: {_first(new_nodes)}."
                )
            ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
            both_nan = np.isnan(ref64) & np.isnan(got64)
            diff = np.where(both_nan, 0.0, np.abs(got64 - ref64))
            diff = np.nan_to_num(diff, nan=np.inf)
            max_abs = float(diff.max()) if diff.size else 0.0
            scale = float(np.nanmax(np.abs(ref64))) if ref64.size and not np.all(np.isnan(ref64)) else 0.0
            max_rel = max_abs / max(scale, 1e-12)
            per_output[name] = {"max_abs_error": max_abs, "max_rel_error": max_rel}
            if max_abs >= worst[1]:
                worst = (name, max_abs, max_rel)
            bad = diff > tol.atol + tol.rtol * np.abs(np.nan_to_num(ref64))
            if np.any(bad):
                raise VerificationError(
                    f"pass '{pass_name}' changed output '{name}' beyond tolerance: max abs error "
                    f"{max_abs:.3g}, max rel error {max_rel:.3g} (allowed |d| <= {tol.atol:g} + "
                    f"{tol.rtol:g}*|ref|, {int(bad.sum())} of {bad.size} elements exceed it); "
                    f"nodes it emitted: {_first(new_nodes)}. Run without this pass "
                    "(--passes) and report the model."
                )
        self.reference = after
        return VerificationRecord(worst[1], worst[2], worst[0], per_output)


def _first(names: list[str], k: int = 5) -> str:
    if not names:
        return "none"
    more = f" (+{len(names) - k} more)" if len(names) > k else ""
    return ", ".join(f"'{n}'" for n in names[:k]) + more
