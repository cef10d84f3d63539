"""Prove a pass by execution: run ONNX Runtime before and after it on generated inputs and compare.

Inputs come from `trtforge.numerics.feeds` (the rules every verifier shares): symbolic dims get small
fixed sizes (one size per dim name), token ids stay within the embedding table they index, masks get
padded tails, floats are standard normal. Sessions are EXACT (`trtforge.numerics.sessions`): the graph
runs as written, so ORT's own fusions can neither hide what a pass did nor add CPU-specific error.

Models whose weights exceed `VERIFY_MAX_BYTES` are not verified (ONNX Runtime would need the
whole >2 GB model serialised in memory a second time, and a session per pass); the ledger says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from trtforge._custom_ops import refuse_unknown_to_onnxruntime
from trtforge.numerics.compare import Tolerance, compare_arrays, elementwise_failures
from trtforge.numerics.feeds import DEFAULT_SIZES, model_feed
from trtforge.numerics.sessions import exact_session, run
from trtforge.passes._base import VerificationError, VerificationRecord

if TYPE_CHECKING:
    import onnx

# Above this many bytes of initializers the pipeline skips ORT verification (documented in the ledger).
VERIFY_MAX_BYTES = 2 * 1024**3
# FP32 rewrites only reorder sums: elementwise |after - before| <= atol + rtol * |before|.
FP32_REWRITE = Tolerance(atol=1e-4, rtol=1e-3)


def weight_bytes(model: ir.Model) -> int:
    """Bytes held by the main graph's initializers (what makes a model 'large')."""
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def _check_declared(model: ir.Model) -> None:
    initializer_names = set(model.graph.initializers)
    for value in model.graph.inputs:
        if value.name not in initializer_names and (value.shape is None or value.dtype is None):
            raise VerificationError(
                f"cannot verify: graph input '{value.name}' has no declared shape or dtype; "
                "declare it in the ONNX model or run with verify off."
            )


def make_inputs(model: ir.Model, seed: int = 0) -> dict[str, np.ndarray]:
    """One feed dict for the graph inputs (`trtforge.numerics.feeds` rules, sizes `DEFAULT_SIZES`)."""
    _check_declared(model)
    return model_feed(ir.serde.serialize_model(model), sizes=DEFAULT_SIZES, seed=seed)


class Verifier:
    """Runs ORT on successive states of one model with fixed inputs and compares with the last state.

    Inputs are generated at `DEFAULT_SIZES`; a model that cannot run that small (a convolution stack
    over audio samples needs hundreds) is fed at `fallback_shapes` instead when the caller knows
    shapes it runs at (compile: the build profile's OPT, i.e. the example inputs). `shapes` (the
    user's, `optimize --verify-shape`) are fed from the start, with no fallback.
    """

    def __init__(
        self,
        model: ir.Model,
        tolerance: Tolerance | None = None,
        fallback_shapes: Mapping[str, Sequence[int]] | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.tolerance = tolerance or FP32_REWRITE
        _check_declared(model)
        proto = ir.serde.serialize_model(model)
        refuse_unknown_to_onnxruntime(
            proto,
            "the model",
            "Every pass is verified by running the graph in ONNX Runtime: run the passes with verify off "
            "(--no-verify), or give ONNX Runtime the op as an ONNX local function.",
        )
        self.feeds = model_feed(proto, sizes=DEFAULT_SIZES, shapes=shapes)
        self.output_names = [v.name for v in model.graph.outputs]
        try:
            session = self._session(proto, "the input model")
        except VerificationError as e:  # a graph it refuses (no input size helps, unlike a failed run)
            raise VerificationError(f"{e} (fix the model, or turn verification off: --no-verify)") from e
        try:
            self.reference = self._feed(session, "the input model")
        except VerificationError as e:
            if shapes:
                fed = _shapes(self.feeds)
                raise VerificationError(f"{e} (verification fed inputs of shapes {fed})") from e
            if not fallback_shapes:
                raise VerificationError(
                    f"{e} (verification fed generated inputs of shapes {_shapes(self.feeds)}; for a model "
                    "that cannot run at those sizes, give shapes it runs at: `compile --shape` (its OPT "
                    "shapes feed verification) or `optimize --verify-shape NAME:DIMS`; or turn "
                    "verification off: --no-verify)"
                ) from e
            first = _shapes(self.feeds)
            self.feeds = model_feed(proto, sizes=DEFAULT_SIZES, shapes=fallback_shapes)
            self.reference = self._feed(session, f"the input model at {_shapes(self.feeds)} (nor at {first})")

    def _session(self, proto: onnx.ModelProto, what: str) -> Any:
        try:
            return exact_session(proto, quiet=True)
        except Exception as e:
            raise VerificationError(f"ONNX Runtime cannot load {what}: {e}") from e

    def _feed(self, session: Any, what: str) -> list[np.ndarray]:
        try:
            return run(session, self.feeds)
        except Exception as e:
            raise VerificationError(f"ONNX Runtime cannot run {what}: {e}") from e

    def _run(self, model: ir.Model | onnx.ModelProto, what: str) -> list[np.ndarray]:
        proto = ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model
        return self._feed(self._session(proto, what), what)

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
            if ref.dtype.kind not in "biuf":  # strings (an ONNX-ML label output): equal or not, no error size
                if not np.array_equal(ref, got):
                    differ = int(np.count_nonzero(ref != got))
                    raise VerificationError(
                        f"pass '{pass_name}' changed output '{name}' ({ref.dtype} tensor): {differ} of "
                        f"{ref.size} elements differ; nodes it emitted: {_first(new_nodes)}. Run without "
                        "this pass (--passes) and report the model."
                    )
                per_output[name] = {"max_abs_error": 0.0, "max_rel_error": 0.0}
                continue
            m = compare_arrays(ref, got)
            max_abs, max_rel = m.max_abs, m.peak_rel
            per_output[name] = {"max_abs_error": max_abs, "max_rel_error": max_rel}
            if max_abs >= worst[1]:
                worst = (name, max_abs, max_rel)
            bad = elementwise_failures(ref, got, tol)
            if np.any(bad):
                raise VerificationError(
                    f"pass '{pass_name}' changed output '{name}' beyond tolerance: max abs error "
                    f"{max_abs:.3g}, max rel error {max_rel:.3g} (allowed |d| <= {tol.atol or 0:g} + "
                    f"{tol.rtol or 0:g}*|ref|, {int(bad.sum())} of {bad.size} elements exceed it); "
                    f"nodes it emitted: {_first(new_nodes)}. Run without this pass "
                    "(--passes) and report the model."
                )
        self.reference = after
        return VerificationRecord(worst[1], worst[2], worst[0], per_output)


def _shapes(feeds: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())


def _first(names: list[str], k: int = 5) -> str:
    if not names:
        return "none"
    more = f" (+{len(names) - k} more)" if len(names) > k else ""
    return ", ".join(f"'{n}'" for n in names[:k]) + more
