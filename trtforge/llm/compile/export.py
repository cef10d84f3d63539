"""Export a HF causal LM to the step graph (ONNX opset 24) with either torch exporter, checked by ORT.

The graph carries its generation metadata (``trtforge.generation`` JSON in metadata_props) so that
:func:`trtforge.llm.load` can drive it without the manifest.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from trtforge._usercode import eval_mode
from trtforge.compiler.export import refuse_unexportable, run_quietly
from trtforge.core import onnx_io
from trtforge.errors import ExportError, UserError
from trtforge.llm.compile import ops
from trtforge.llm.compile.step import DecoderStep, PagedDecoderStep
from trtforge.llm.contract import (
    DEFAULT_BLOCK_SIZE,
    input_names,
    output_names,
    paged_input_names,
    paged_output_names,
    set_generation_metadata,
)
from trtforge.llm.models.families import adapter_for, refuse_unapplied_window
from trtforge.numerics.sessions import exact_session

EXPORTERS = ("dynamo", "legacy")
DEFAULT_MAX_SEQ = 2048
CACHE_LAYOUTS = ("slot", "paged")
# ORT vs torch on the export's example inputs: both FP32, same math; a bound well above rounding noise.
EXPORT_ATOL = 1e-4


@dataclass
class StepExport:
    """An exported step graph plus what the export did."""

    model: onnx.ModelProto
    generation: dict[str, Any]
    exporter: str
    fallback_reason: str | None = None
    seconds: float = 0.0
    max_abs_error: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """JSON-ready record for the manifest."""
        return {
            "exporter": self.exporter,
            "fallback_reason": self.fallback_reason,
            "seconds": self.seconds,
            "opset": ops.STEP_OPSET,
            "max_abs_error": self.max_abs_error,
            "verified": True,
        }


def generation_section(step: DecoderStep, *, max_batch: int, max_prefill: int, dtype: str) -> dict[str, Any]:
    """The `generation` section (manifest and ONNX metadata) describing a step graph."""
    spec = step.spec.to_dict()
    layers = range(spec["num_layers"])
    if isinstance(step, PagedDecoderStep):
        cache = {
            "layout": "paged",
            "block_size": step.block_size,
            "shape": ["num_blocks", step.block_size, spec["num_kv_heads"], spec["head_dim"]],
            "dtype": dtype,
            "inputs": [f"{kind}_pool.{i}" for i in layers for kind in ("key", "value")],
            "outputs": [f"{kind}_pool_out.{i}" for i in layers for kind in ("key", "value")],
        }
    else:
        cache = {
            "layout": "slot",
            "shape": ["batch", spec["num_kv_heads"], step.max_seq, spec["head_dim"]],
            "dtype": dtype,
            "inputs": [f"{kind}_cache.{i}" for i in layers for kind in ("key", "value")],
            "outputs": [f"{kind}_cache_out.{i}" for i in layers for kind in ("key", "value")],
        }
    return {
        **spec,
        "max_seq": step.max_seq,
        "max_batch": int(max_batch),
        "max_prefill": int(max_prefill),
        "all_logits": step.all_logits,
        "cache": cache,
        "profiles": {},
    }


def example_feeds(generation: dict[str, Any], batch: int = 2, seq: int = 3) -> dict[str, torch.Tensor]:
    """Valid inputs for a prefill of `batch` rows with ragged lengths (row b has seq - b tokens, >= 1).

    For a paged graph each row gets its own blocks, placed at random in a pool with one spare block
    (the scratch block that padded positions write to); each row has room for two more tokens.
    """
    max_seq = int(generation["max_seq"])
    seq = max(1, min(seq, max_seq - 1))  # the export's check decodes one more token after the prefill
    cache = (batch, int(generation["num_kv_heads"]), max_seq, int(generation["head_dim"]))
    ids = torch.randint(
        0, int(generation["vocab_size"]), (batch, seq), generator=torch.Generator().manual_seed(0)
    )
    feeds = {
        "input_ids": ids,
        "position_ids": torch.arange(seq, dtype=torch.int64)[None].repeat(batch, 1),
        "past_lens": torch.zeros(batch, dtype=torch.int64),
        "new_lens": torch.tensor([max(1, seq - b) for b in range(batch)], dtype=torch.int64),
    }
    if generation["cache"]["layout"] == "paged":
        return _paged_example(generation, feeds)
    for i in range(int(generation["num_layers"])):
        for kind in ("key", "value"):
            feeds[f"{kind}_cache.{i}"] = torch.zeros(cache)
    return feeds


def _paged_example(generation: dict[str, Any], feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    block = int(generation["cache"]["block_size"])
    batch, seq = feeds["input_ids"].shape
    per_row = -(-(seq + 2) // block)
    num_blocks = batch * per_row + 1
    order = torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(1))
    tables = order.reshape(batch, per_row).to(torch.int32)
    feeds["block_tables"] = tables
    feeds["slot_mapping"] = slot_mapping(
        tables, feeds["position_ids"], feeds["new_lens"], block, num_blocks - 1
    )
    shape = (num_blocks, block, int(generation["num_kv_heads"]), int(generation["head_dim"]))
    for i in range(int(generation["num_layers"])):
        for kind in ("key", "value"):
            feeds[f"{kind}_pool.{i}"] = torch.randn(shape, generator=torch.Generator().manual_seed(2 + i))
    return feeds


def slot_mapping(
    tables: torch.Tensor, positions: torch.Tensor, new_lens: torch.Tensor, block_size: int, scratch: int
) -> torch.Tensor:
    """int64 [B, S] pool slots of each new token; padded positions (j >= new_lens[b]) -> block `scratch`."""
    blocks = torch.gather(tables.to(torch.int64), 1, (positions // block_size).clamp(max=tables.shape[1] - 1))
    slots = blocks * block_size + positions % block_size
    real = torch.arange(positions.shape[1])[None, :] < new_lens[:, None]
    return torch.where(real, slots, torch.full_like(slots, scratch * block_size))


def _io_names(step: DecoderStep) -> tuple[list[str], list[str]]:
    n = step.spec.num_layers
    if isinstance(step, PagedDecoderStep):
        return paged_input_names(n), paged_output_names(n)
    return input_names(n), output_names(n)


def _dynamo(step: DecoderStep, feeds: dict[str, torch.Tensor], path: Path) -> None:
    batch = torch.export.Dim("batch", min=1)
    seq = torch.export.Dim("seq", min=1, max=step.max_seq)
    shapes: tuple[Any, ...]
    if isinstance(step, PagedDecoderStep):
        blocks = torch.export.Dim("num_blocks", min=2)
        width = torch.export.Dim("max_blocks", min=1)
        pools = tuple({0: blocks} for _ in range(2 * step.spec.num_layers))
        rows = {0: batch, 1: seq}
        shapes = (rows, rows, {0: batch}, {0: batch}, {0: batch, 1: width}, rows, pools)
    else:
        caches = tuple({0: batch} for _ in range(2 * step.spec.num_layers))  # the *caches varargs
        shapes = ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch}, {0: batch}, caches)
    program = torch.onnx.export(
        step,
        tuple(feeds.values()),
        dynamo=True,
        dynamic_shapes=shapes,
        input_names=list(feeds),
        output_names=_io_names(step)[1],
        opset_version=ops.STEP_OPSET,
        custom_translation_table=ops.dynamo_translation_table(),
        optimize=True,
        verbose=False,
    )
    if program is None:
        raise ExportError("the dynamo exporter returned no program")
    program.save(str(path), external_data=None)


def _legacy(step: DecoderStep, feeds: dict[str, torch.Tensor], path: Path) -> None:
    opset = 20
    ops.register_legacy_symbolics(opset)
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "seq"},
        "position_ids": {0: "batch", 1: "seq"},
    }
    outputs = _io_names(step)[1]
    if isinstance(step, PagedDecoderStep):
        axes |= {"past_lens": {0: "batch"}, "new_lens": {0: "batch"}}
        axes |= {"block_tables": {0: "batch", 1: "max_blocks"}, "slot_mapping": {0: "batch", 1: "seq"}}
        axes |= {n: {0: "num_blocks"} for n in list(feeds)[6:]}
        axes |= {"logits": {0: "batch", 1: "seq"} if step.all_logits else {0: "batch"}}
        axes |= {n: {0: "num_blocks"} for n in outputs[1:]}
    else:
        axes |= {n: {0: "batch"} for n in list(feeds)[2:]}
        axes |= {n: {0: "batch"} for n in outputs}
    torch.onnx.export(
        step,
        tuple(feeds.values()),
        str(path),
        input_names=list(feeds),
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=opset,
        dynamo=False,
        do_constant_folding=True,
    )


def _verify(model: onnx.ModelProto, step: DecoderStep, feeds: dict[str, torch.Tensor]) -> dict[str, float]:
    """ORT (exact) vs torch on a prefill and a following decode step; ExportError beyond EXPORT_ATOL."""
    sess = exact_session(model)
    errors: dict[str, float] = {}
    in_names, names = _io_names(step)
    for phase in ("prefill", "decode"):
        with torch.no_grad():
            ref = [t.numpy() for t in step(*feeds.values())]
        got = sess.run(None, {k: v.numpy() for k, v in feeds.items()})
        for name, g, r in zip(names, got, ref):
            if g.shape != r.shape:
                raise ExportError(
                    f"step graph output '{name}' ({phase}): ORT shape {g.shape} != torch {r.shape}."
                )
            err = float(np.abs(g.astype(np.float64) - r).max()) if g.size else 0.0
            if not np.isfinite(err) or err > EXPORT_ATOL:
                raise ExportError(
                    f"step graph output '{name}' ({phase}) differs from torch: max abs error {err:.3g} > "
                    f"{EXPORT_ATOL:g}. The export is not faithful."
                )
            errors[f"{phase}:{name}"] = max(errors.get(f"{phase}:{name}", 0.0), err)
        nxt = feeds["input_ids"][:, :1] if step.all_logits else torch.from_numpy(got[0].argmax(-1))[:, None]
        lengths = feeds["past_lens"] + feeds["new_lens"]
        caches = {n: torch.from_numpy(g) for n, g in zip(in_names[-len(got) + 1 :], got[1:])}
        nxt_feeds = {
            "input_ids": nxt.to(torch.int64),
            "position_ids": lengths[:, None].clone(),
            "past_lens": lengths,
            "new_lens": torch.ones_like(lengths),
        }
        if isinstance(step, PagedDecoderStep):
            tables = feeds["block_tables"]
            scratch = next(iter(caches.values())).shape[0] - 1
            nxt_feeds["block_tables"] = tables
            nxt_feeds["slot_mapping"] = slot_mapping(
                tables, nxt_feeds["position_ids"], nxt_feeds["new_lens"], step.block_size, scratch
            )
        feeds = nxt_feeds | caches
    return errors


def export_step(
    model: torch.nn.Module,
    *,
    max_seq: int | None = None,
    max_batch: int = 8,
    max_prefill: int | None = None,
    exporter: str = "auto",
    all_logits: bool = False,
    cache_layout: str = "slot",
    block_size: int = DEFAULT_BLOCK_SIZE,
    workdir: Path,
) -> StepExport:
    """Export `model` (a supported HF causal LM) to an FP32 step graph.

    `cache_layout` "slot": per-row caches of `max_seq` (default: :func:`default_max_seq`); "paged": block
    pools of `block_size` tokens (see :mod:`trtforge.llm.compile` for both contracts). `model` runs in eval
    mode and gets each module's own mode back.
    """
    with eval_mode(model):
        return _export_step(
            model, max_seq, max_batch, max_prefill, exporter, all_logits, cache_layout, block_size, workdir
        )


def _export_step(
    model: torch.nn.Module,
    max_seq: int | None,
    max_batch: int,
    max_prefill: int | None,
    exporter: str,
    all_logits: bool,
    cache_layout: str,
    block_size: int,
    workdir: Path,
) -> StepExport:
    if max_seq is None:
        max_seq = default_max_seq(adapter_for(model))
    if exporter not in ("auto", *EXPORTERS):
        raise UserError(f"exporter must be auto, dynamo or legacy; got '{exporter}'.")
    if cache_layout not in CACHE_LAYOUTS:
        raise UserError(f"cache_layout must be one of {', '.join(CACHE_LAYOUTS)}; got {cache_layout!r}.")
    if cache_layout == "paged":
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise UserError(f"block_size must be an integer >= 1; got {block_size!r}.")
        step: DecoderStep = PagedDecoderStep(model, max_seq, block_size, all_logits=all_logits)
    else:
        step = DecoderStep(model, max_seq, all_logits=all_logits)
    dtypes = sorted({str(p.dtype) for p in model.parameters() if p.is_floating_point()} - {"torch.float32"})
    if dtypes:
        raise UserError(
            f"{type(model).__name__} has {', '.join(dtypes)} weights; export the FP32 model (e.g. "
            "from_pretrained(..., dtype=torch.float32)): the step graph is exported in FP32 and converted "
            "to FP16/BF16 by --precision."
        )
    max_prefill = max_seq if max_prefill is None else max_prefill
    _check_limits(step.adapter, max_seq, max_batch, max_prefill)
    refuse_unapplied_window(model, max_seq, "--max-seq")
    feeds = example_feeds(
        generation_section(step, max_batch=max_batch, max_prefill=max_prefill, dtype="float32")
    )
    Path(workdir).mkdir(parents=True, exist_ok=True)  # was an ExportError wrapping FileNotFoundError
    path = Path(workdir) / "step.onnx"
    attempts = list(EXPORTERS) if exporter == "auto" else [exporter]
    fallback = None
    failures: list[Exception] = []
    t0 = time.perf_counter()
    for i, which in enumerate(attempts):
        try:
            run_quietly(_dynamo if which == "dynamo" else _legacy, step, feeds, path)
            proto = ops.finalize_opset(onnx.load(str(path)))
            # The legacy exporter annotates intermediates with the example's concrete sizes; shape-based
            # folding in later passes would freeze them (seen: S baked into a Reshape). Drop them.
            del proto.graph.value_info[:]
            onnx_io.check_proto(proto, full_check=True)  # (by path past 2 GB)
            errors = _verify(proto, step, feeds)
            break
        except Exception as e:
            failures.append(e)
            reason = f"{which} exporter failed: {type(e).__name__}: {str(e).strip()[:300]}"
            if i == len(attempts) - 1:
                prior = f" (after: {fallback})" if fallback else ""
                message = f"could not export the step graph of {type(model).__name__}; {reason}{prior}"
                if any(isinstance(f, ExportError) for f in failures):  # trtforge's graph disagrees with torch
                    raise ExportError(message) from e
                refuse_unexportable(failures, message)  # the model's (exit 2), or trtforge's bug as raised
            fallback = reason
    generation = generation_section(step, max_batch=max_batch, max_prefill=max_prefill, dtype="float32")
    set_generation_metadata(proto, generation)
    return StepExport(proto, generation, which, fallback, time.perf_counter() - t0, errors)


def default_max_seq(adapter: Any) -> int:
    """The KV-cache length a step graph gets without --max-seq: the model's own length (the adapter's
    ``max_length``: max_position_embeddings / n_positions, the length the executors default max_model_len
    to), never past :attr:`~trtforge.llm.models.base.DecoderAdapter.sequence_limit`, and at most
    DEFAULT_MAX_SEQ (the slot cache is allocated whole: [max_batch, Hkv, max_seq, D] a layer)."""
    candidates = [DEFAULT_MAX_SEQ]
    with contextlib.suppress(AttributeError, TypeError, ValueError):  # (a config without the field)
        candidates.append(int(adapter.max_length))
    limit = adapter.sequence_limit
    if limit is not None:
        candidates.append(int(limit[0]))
    return max(2, min(candidates))


def check_max_seq(adapter: Any, max_seq: int, flag: str = "--max-seq") -> None:
    """UserError for a cache length past the longest sequence the model is made for (its position table,
    or its rotary's trained length as a static rotary scaling extends it); `flag` names the option."""
    limit = adapter.sequence_limit
    if limit is not None and max_seq > limit[0]:
        model_type = getattr(adapter.config, "model_type", "this")
        raise UserError(
            f"{flag} {max_seq} exceeds the model's {limit[0]} positions, the longest sequence this "
            f"{model_type} model is made for ({limit[1]}); past them it would run into positions it never "
            f"saw. Pass {flag} <= {limit[0]} "
            f"(without {flag} the default is the model's positions, at most {DEFAULT_MAX_SEQ}); a longer "
            "context needs a model whose config extends it (a larger max_position_embeddings, or a rotary "
            "scaling in rope_parameters)."
        )


def _check_limits(adapter: Any, max_seq: int, max_batch: int, max_prefill: int) -> None:
    if max_seq < 2 or max_batch < 1 or max_prefill < 1:
        raise UserError(
            "--max-seq must be >= 2 (a prompt token and a new one), --max-batch and --max-prefill >= 1 "
            f"(got {max_seq}, {max_batch}, {max_prefill})."
        )
    if max_prefill > max_seq:
        raise UserError(
            f"--max-prefill {max_prefill} exceeds --max-seq {max_seq}: a prompt must fit the cache."
        )
    check_max_seq(adapter, max_seq)
