"""The pass pipeline: check the model, raise its opset once, run passes in order, verify each one.

`optimize_model` is the entry the compile pipeline and `trtforge optimize` use. The order lives in
`DEFAULT_PASSES`, not in the passes: cleanup first (folding exposes the patterns), normalisations
and activations, then the SwiGLU gate/up merge (before the generic sibling merge, which would
otherwise take the pair unchecked), the QKV merge, rotary (on the merged Q/K heads), attention
(whose matcher reads Q/K/V after those), the GQA fold (on the Attention nodes it emitted), then a
final cleanup of what the rewrites left dead.

Opset: the default-domain opset is raised once, before the first pass, to the highest opset the
selected passes emit (`PassSpec.min_opset`: LayerNorm 18, Gelu 20, RMSNorm, RotaryEmbedding and
native Attention 23), with onnxscript's version converter (onnx's C converter as fallback). It is
its own ledger step ("opset"), verified like a pass. Raising it up front keeps any plugin
reference functions from being inlined by a later conversion.

Large models: a model past protobuf's 2 GB is checked as a file with external data
(`core.onnx_io.check_proto`); above `verify.VERIFY_MAX_BYTES` (2 GiB) of weights the ORT verification
of each pass is skipped (a copy of the weights written out and loaded per pass); the ledger's
`verify_skipped_reason` says so.
"""

from __future__ import annotations

import logging
import numbers
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir

from trtforge.errors import TrtforgeError, UserError, checked_call, shown
from trtforge.passes._base import (
    ATTENTION_STRATEGIES,
    PassContext,
    PassLedger,
    PassOutcome,
    PassRecord,
    PassSpec,
    VerificationError,
    opset_of,
)
from trtforge.passes.attention import ATTENTION, load_plugin_module
from trtforge.passes.cleanup import CLEANUP
from trtforge.passes.gelu import GELU
from trtforge.passes.gqa import GQA
from trtforge.passes.layernorm import LAYERNORM
from trtforge.passes.qkv import QKV
from trtforge.passes.rmsnorm import RMSNORM
from trtforge.passes.rotary import ROTARY
from trtforge.passes.swiglu import SWIGLU
from trtforge.passes.verify import VERIFY_MAX_BYTES, Verifier, weight_bytes

__all__ = [
    "DEFAULT_PASSES",
    "PASSES",
    "PassLedger",
    "VerificationError",
    "optimize_model",
]

logger = logging.getLogger(__name__)

PASSES: dict[str, PassSpec] = {
    p.name: p for p in (CLEANUP, LAYERNORM, RMSNORM, GELU, SWIGLU, QKV, ROTARY, ATTENTION, GQA)
}
DEFAULT_PASSES: tuple[str, ...] = (
    "cleanup",
    "layernorm",
    "rmsnorm",
    "gelu",
    "swiglu",
    "qkv",
    "rotary",
    "attention",
    "gqa",
    "cleanup",
)


def _validate(passes: Sequence[str] | None, attention: str) -> list[str]:
    if isinstance(passes, str):  # "cleanup,gelu", as --passes takes it (it was read letter by letter)
        passes = [p.strip() for p in passes.split(",") if p.strip()]
    if passes is not None and (
        not isinstance(passes, (list, tuple)) or not all(isinstance(p, str) for p in passes)
    ):
        raise UserError(
            f"passes must be a list of pass names (or None: the default ones), got {shown(passes)}."
        )
    names = list(DEFAULT_PASSES if passes is None else passes)
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise UserError(
            f"unknown pass name(s) {unknown}; known passes: {sorted(PASSES)} "
            f"(default order: {','.join(DEFAULT_PASSES)})."
        )
    if attention not in ATTENTION_STRATEGIES:
        raise UserError(
            f"unknown attention strategy '{attention}'; expected one of {list(ATTENTION_STRATEGIES)}."
        )
    if attention == "plugin" and "attention" in names:
        load_plugin_module()
    return names


def _check_shapes(option: str, shapes: Any, inputs: set[str]) -> None:
    """`shapes`: None or input name -> list of positive ints (a name the model has no input of was
    ignored, a '2x4' string failed inside verification)."""
    if shapes is None:
        return
    if not isinstance(shapes, Mapping):
        raise UserError(
            f"{option} must be a dict of input name -> shape (list of ints), got {shown(shapes)}."
        )
    for name, shape in shapes.items():
        if name not in inputs:
            raise UserError(f"{option}: the model has no input {shown(name)} (inputs: {sorted(inputs)}).")
        if (
            isinstance(shape, (str, bytes))
            or not isinstance(shape, Sequence)
            or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise UserError(f"{option}[{name!r}] must be a list of dims (ints >= 0), got {shown(shape)}.")


def _check(model: onnx.ModelProto) -> None:
    from trtforge.core.onnx_io import check_proto

    try:
        check_proto(model)  # (as a file with external data past 2 GB)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
        raise UserError(f"the input ONNX model fails ONNX checking: {first}") from e


def _count(model: ir.Model) -> int:
    return sum(1 for _ in model.graph)


def _raise_opset(model: ir.Model, target: int) -> None:
    from onnxscript import version_converter

    from trtforge.core.onnx_io import min_ir_version

    before = opset_of(model)
    # onnxscript warns on stderr each time it hands a conversion to onnx's C converter (every legacy
    # export at opset 17): the fallback is intended, and the ledger's opset step records the result.
    converter_log = logging.getLogger("onnxscript.version_converter")
    level = converter_log.level
    converter_log.setLevel(logging.ERROR)
    try:
        version_converter.convert_version(model, target, fallback=True)
    except Exception as e:
        raise UserError(f"cannot raise the model's ONNX opset from {before} to {target}: {e}") from e
    finally:
        converter_log.setLevel(level)
    if (opset_of(model) or 0) < target:
        raise UserError(
            f"cannot raise the model's ONNX opset from {before} to {target} (the version converter "
            "left it unchanged); run without the passes that need it (--passes)."
        )
    model.ir_version = max(model.ir_version, min_ir_version(dict(model.opset_imports)))


@checked_call
def optimize_model(
    model: onnx.ModelProto,
    *,
    passes: list[str] | None = None,
    attention: str = "native",
    verify: bool = True,
    debug: bool = False,
    feed_shapes: Mapping[str, Sequence[int]] | None = None,
    verify_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[onnx.ModelProto, PassLedger]:
    """Run the pass pipeline on `model` and return the rewritten model plus its ledger.

    Args:
        model: ONNX model (external data loaded, if any). Not modified.
        passes: pass names in order (default `DEFAULT_PASSES`); see `PASSES`.
        attention: "native" (ONNX Attention), "plugin" (trtforge flash-attention node) or "none".
        verify: run ONNX Runtime before/after each pass and raise `VerificationError` on a change.
        debug: record why candidate matches were rejected.
        feed_shapes: input shapes verification falls back to when the model cannot run at the small
            generated sizes (compile passes the build profile's OPT shapes).
        verify_shapes: input shapes verification feeds from the start (`optimize --verify-shape`).

    Raises:
        UserError: unknown pass / strategy, a model failing ONNX checking, an opset that cannot be raised.
        VerificationError: a pass changed an output beyond tolerance (names pass, output, error).
    """
    if isinstance(model, (str, os.PathLike)):  # a path is read (and checked) as calibrate_model reads it
        from trtforge.core.onnx_io import load_onnx

        model = load_onnx(model)
    if not isinstance(model, onnx.ModelProto):
        raise UserError(f"model must be an onnx.ModelProto or an ONNX file path, got {type(model).__name__}.")
    names = _validate(passes, attention)
    inputs = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    for option, shapes in (("feed_shapes", feed_shapes), ("verify_shapes", verify_shapes)):
        _check_shapes(option, shapes, inputs)
    try:
        ir_model = ir.serde.deserialize_model(model)
    except Exception:
        _check(model)  # an invalid graph (two nodes writing one tensor) says so by name
        raise
    _check(model)
    large = weight_bytes(ir_model) > VERIFY_MAX_BYTES
    ctx = PassContext(attention=attention, debug=debug)
    ledger = PassLedger(attention=attention, verify=verify, opset_before=opset_of(ir_model))
    verifier = None
    if verify and large:
        ledger.verify_skipped_reason = (
            f"weights exceed {VERIFY_MAX_BYTES / 1024**3:.0f} GiB; ORT verification skipped (per pass)"
        )
    elif verify:
        verifier = Verifier(ir_model, fallback_shapes=feed_shapes, shapes=verify_shapes)

    target = max((PASSES[n].min_opset(ctx) or 0 for n in names), default=0)
    if (ledger.opset_before or 0) < target:
        _run_step(ledger, verifier, ir_model, "opset", lambda m: _opset_outcome(m, target))
    for name in names:
        spec = PASSES[name]
        _run_step(ledger, verifier, ir_model, name, lambda m, spec=spec: spec.run(m, ctx))
    ledger.opset_after = opset_of(ir_model)
    return ir.serde.serialize_model(ir_model), ledger


def _untype_unknown_dtypes(model: ir.Model) -> None:
    """Leave untyped the intermediate values a pass typed as tensors of an unknown element type: a rewrite
    over a graph whose values carry no types (an exported graph before cleanup's inference, e.g. ``--passes
    attention``) makes such outputs, which ONNX cannot serialize; untyped, ONNX Runtime infers them."""
    outputs = {id(v) for v in model.graph.outputs}
    for node in model.graph:
        for value in node.outputs:
            if value.type is not None and value.dtype is None and id(value) not in outputs:
                value.type = None


def _opset_outcome(model: ir.Model, target: int) -> PassOutcome:
    before = opset_of(model)
    _raise_opset(model, target)
    return PassOutcome(matches=1, notes=[f"default-domain opset {before} -> {opset_of(model)}"])


def _run_step(ledger: PassLedger, verifier: Verifier | None, model: ir.Model, name: str, fn) -> None:
    existing = {id(n) for n in model.graph}
    inputs_before = [v.name for v in model.graph.inputs]
    outputs_before = [v.name for v in model.graph.outputs]
    nodes_before = _count(model)
    opset_before = opset_of(model)
    t0 = time.perf_counter()
    outcome: PassOutcome = fn(model)
    seconds = time.perf_counter() - t0
    _untype_unknown_dtypes(model)
    for kind, before, after in (
        ("input", inputs_before, [v.name for v in model.graph.inputs]),
        ("output", outputs_before, [v.name for v in model.graph.outputs]),
    ):
        if after != before:
            raise TrtforgeError(
                f"pass '{name}' changed the graph's {kind} names {before} -> {after} (a trtforge bug: "
                "callers feed and read these names); run without it (--passes) and report the model."
            )
    record = PassRecord(
        name=name,
        matches=outcome.matches,
        nodes_before=nodes_before,
        nodes_after=_count(model),
        seconds=round(seconds, 4),
        per_rule=outcome.per_rule,
        opset_before=opset_before,
        opset_after=opset_of(model),
        rejected=outcome.rejected,
        notes=outcome.notes,
    )
    if verifier is not None:
        new_nodes = [n.name or n.op_type for n in model.graph if id(n) not in existing]
        record.verification = verifier.check(model, name, new_nodes)
    logger.info("pass %s: %d matches, %d -> %d nodes", name, record.matches, nodes_before, record.nodes_after)
    ledger.passes.append(record)
