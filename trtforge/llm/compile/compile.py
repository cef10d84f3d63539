"""`compile_generate`: HF causal LM -> step graph -> passes -> FP16/BF16 -> two-profile engine + manifest.

Reached through ``trtforge.compile(model, output=..., generate=True, ...)`` and
``trtforge compile MODEL --generate``. Precision: TensorRT's attention layer builds only in FP16/BF16
(architecture.md), so the step engine is FP16 by default and FP32 is refused; caches are stored in
the graph's low precision, logits stay FP32, numerically sensitive ops stay FP32 islands.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from trtforge.core import onnx_io
from trtforge.errors import UserError, shown
from trtforge.llm.compile.build import build_step_engine
from trtforge.llm.compile.export import (
    CACHE_LAYOUTS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_SEQ,
    default_max_seq,
    example_feeds,
    export_step,
)
from trtforge.llm.contract import DECODE, PREFILL, set_generation_metadata
from trtforge.llm.models.families import adapter_for
from trtforge.llm.models.loader import load_causal_lm, transformers_bars

Log = Callable[[str], None]
_VERIFIER_MIN_SEQ = 8
_PASSES_ATOL = 1e-4
GENERATE_PRECISIONS = ("fp16", "bf16", "fp32", "int8", "fp8", "int4")
QUANTIZED = ("int8", "fp8", "int4")  # Q/DQ step graphs; the rest of each is FP16
_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "float16", "fp8": "float16"}
_DTYPE["int4"] = "float16"


def _low_precision(proto: onnx.ModelProto, mode: str, data: list[dict[str, np.ndarray]]) -> tuple[Any, dict]:
    """FP16/BF16 graph with FP16/BF16 caches and FP32 logits (reuses passes.precision)."""
    from trtforge.passes.precision import convert_precision

    out, record = convert_precision(proto, mode, data=data, keep_io_types=False)
    logits = next(o for o in out.graph.output if o.name == "logits")
    if logits.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        for node in out.graph.node:
            node.output[:] = ["logits_low" if o == "logits" else o for o in node.output]
        out.graph.node.append(
            onnx.helper.make_node("Cast", ["logits_low"], ["logits"], to=onnx.TensorProto.FLOAT)
        )
        logits.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    onnx_io.check_proto(out)
    return out, record.to_dict()


def _no_stage(_name: str, _message: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def apply_precision(
    proto: onnx.ModelProto,
    generation: dict[str, Any],
    precision: str,
    calib_prompts: Sequence[Sequence[int]] | None,
    records: dict[str, Any],
    *,
    stage: Callable[[str, str], contextlib.AbstractContextManager[Any]] = _no_stage,
    progress: bool = False,
) -> onnx.ModelProto:
    """The precision stages of an exported (and fused) FP32 step graph: Q/DQ for int8 / fp8 / int4,
    then FP16/BF16 for the rest; each stage's record goes into `records` under its name, and the
    cache dtype into `generation`. `stage(name, message)` times each (the compile session's)."""
    if precision == "int8":
        from trtforge.llm.compile.int8 import quantize_step

        message = f"INT8 SmoothQuant W8A8, calibrated on {len(calib_prompts or [])} prompts"
        with stage("int8", message):
            proto, records["int8"] = quantize_step(proto, generation, calib_prompts or [], progress=progress)
    if precision in ("fp8", "int4"):
        from trtforge.llm.compile import lowbit

        if precision == "fp8":
            n = len(calib_prompts or [])
            message = f"FP8 E4M3 W8A8 Q/DQ, calibrated on {n or 'random-token'} prompts"
        else:
            message = f"INT4 weight-only, blocks of {lowbit.INT4_BLOCK} (blocked DequantizeLinear)"
        with stage(precision, message):
            before = proto
            if precision == "fp8":
                proto, rec = lowbit.quantize_step_fp8(proto, generation, calib_prompts, progress=progress)
            else:
                proto, rec = lowbit.quantize_step_int4(proto, generation)
            rec["exact_check"] = lowbit.check_step_accuracy(before, proto, generation)
            records[precision] = rec
    if precision != "fp32":
        low = "fp16" if precision in QUANTIZED else precision
        with stage(low, f"converting to {low}"):
            data = [{k: v.numpy() for k, v in example_feeds(generation).items()}]
            proto, records[low] = _low_precision(proto, low, data)
    generation["cache"]["dtype"] = _DTYPE[precision]
    return proto


def _same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, generation: dict[str, Any]) -> float:
    """Exact ORT on a valid ragged prefill: the passes must not change any output beyond _PASSES_ATOL.
    One session at a time (each holds the weights)."""
    from trtforge.errors import TrtforgeError
    from trtforge.numerics.sessions import exact_session

    feeds = {k: v.numpy() for k, v in example_feeds(generation).items()}
    ref = exact_session(before).run(None, feeds)
    got = exact_session(after).run(None, feeds)
    err = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(ref, got))
    if not err <= _PASSES_ATOL:
        raise TrtforgeError(f"the fusion passes changed the step graph's outputs (max abs error {err:.3g}).")
    return err


def _check_cache_layout(
    layout: str, block_size: int | None, num_blocks: int | None, max_seq: int, max_batch: int, build: bool
) -> int | None:
    """Validate the cache-layout options; returns the engine's pool size in blocks (paged builds only)."""
    if layout not in CACHE_LAYOUTS:
        raise UserError(f"--cache-layout {layout!r}: expected one of {', '.join(CACHE_LAYOUTS)}.")
    options = (("--block-size", block_size), ("--num-blocks", num_blocks))
    given = [flag for flag, v in options if v is not None]
    if layout == "slot" and given:
        raise UserError(f"{', '.join(given)}: only for --cache-layout paged (the slot cache has no blocks).")
    if layout == "slot":
        return None
    for flag, v in options:
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise UserError(f"{flag} must be an integer >= 1; got {v!r}.")
    if num_blocks is not None and not build:
        raise UserError(
            "--num-blocks sizes the engine's block pool; the paged step graph alone (no engine build) takes "
            "any pool size: leave it out."
        )
    bs = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    if block_size is not None and block_size > max_seq:  # (past int64, the export's own arithmetic failed)
        raise UserError(
            f"--block-size {shown(block_size)} exceeds the KV-cache length {max_seq} (--max-seq): a block "
            "holds tokens of one sequence, so one longer than the longest sequence only allocates memory no "
            f"token uses. Pass --block-size <= {max_seq}."
        )
    need = 2  # one block of a sequence plus the scratch block padded positions write to
    if num_blocks is not None and num_blocks < need:
        raise UserError(f"--num-blocks {num_blocks}: the pool needs at least {need} blocks (one is scratch).")
    # Default: every one of max_batch rows at max_seq tokens, plus the scratch block.
    return num_blocks if num_blocks is not None else max_batch * -(-max_seq // bs) + 1


def compile_generate(
    model: Any,
    output: str | os.PathLike[str] | None,
    *,
    max_seq: int | None = None,
    max_batch: int = 8,
    max_prefill: int | None = None,
    precision: str = "fp16",
    exporter: str = "auto",
    passes: bool = True,
    all_logits: bool = False,
    cache_layout: str = "slot",
    block_size: int | None = None,
    num_blocks: int | None = None,
    calib_prompts: Sequence[Sequence[int]] | None = None,
    save_onnx: str | os.PathLike[str] | None = None,
    build: bool = True,
    backend: str | None = None,
    targets: Sequence[str] | None = None,
    opt_level: int | None = None,
    workspace_mb: int | None = None,
    force: bool = False,
    progress: bool = True,
    log: Log | None = None,
) -> Any:
    """Compile a causal LM into a step engine (+ manifest with a `generation` section); see module doc.

    `max_seq` (the KV-cache length) defaults to the positions the model is made for, at most
    DEFAULT_MAX_SEQ; a longer one than the model's positions (as a static rotary scaling extends them) is
    refused. `build=False` stops after the ONNX stages (then `save_onnx` is required and `output` unused).
    `cache_layout="paged"` exports block pools of `block_size` tokens (default 16); the engine's pools hold
    up to `num_blocks` blocks (default: max_batch rows of max_seq tokens plus one scratch block).
    Returns a CompileResult. Everything is written atomically; nothing is left behind on failure.
    """
    from trtforge.compiler.session import CompileSession, source_files
    from trtforge.llm.prompts import check_calib_prompts

    log = log or (lambda _m: None)
    if isinstance(precision, str):
        precision = precision.lower()
    if precision not in GENERATE_PRECISIONS:
        raise UserError(
            f"--generate --precision {precision!r}: step graphs are {', '.join(GENERATE_PRECISIONS)}."
        )
    if build and precision == "fp32":
        raise UserError(
            "--generate --precision fp32: TensorRT's attention layer builds only in FP16/BF16; use "
            "--precision fp16 (default) or bf16. An FP32 step graph (for ONNX Runtime) is written without an "
            "engine from Python: trtforge.compile(model, None, generate=True, build=False, "
            "save_onnx='step.onnx', precision='fp32')."
        )
    check_calib_prompts(calib_prompts)
    if precision == "int8" and not calib_prompts:
        raise UserError(
            "--generate --precision int8 needs calibration prompts: --calib-data FILE (token ids, one prompt "
            "per line) or calib_prompts=[[ids...], ...] in the API."
        )
    if calib_prompts and precision not in ("int8", "fp8"):
        raise UserError(
            f"--calib-data only applies to --generate --precision int8 or fp8 (calibrated activations); "
            f"--precision {precision} "
            + ("is weight-only round-to-nearest and needs no data." if precision == "int4" else "has none.")
        )
    from trtforge.compiler.build import BuildOptions

    if build:  # builder options checked before the export, as compile does
        opts = BuildOptions(targets=targets, backend=backend, opt_level=opt_level, workspace_mb=workspace_mb)
        targets, opt_level, workspace_mb = opts.targets, opts.opt_level, opts.workspace_mb
    # (checked before the model loads; the default pool size follows max_seq, known once it has)
    _check_cache_layout(cache_layout, block_size, num_blocks, max_seq or DEFAULT_MAX_SEQ, max_batch, build)
    if precision in QUANTIZED and cache_layout == "paged":
        raise UserError(
            f"--generate --precision {precision} --cache-layout paged: quantized step graphs are made and "
            "checked on the slot-layout step graph only; use --cache-layout slot, or --precision fp16/bf16 "
            "for a paged step graph."
        )
    session = CompileSession(output, save_onnx=save_onnx, force=force, build=build, log=log)
    with transformers_bars(progress):  # (-q: no "Loading weights" bar on stderr)
        lm = load_causal_lm(model)
    if max_seq is None:  # the model's positions, at most DEFAULT_MAX_SEQ
        max_seq = default_max_seq(adapter_for(lm))
    pool_blocks = _check_cache_layout(cache_layout, block_size, num_blocks, max_seq, max_batch, build)
    if calib_prompts and precision in ("int8", "fp8"):  # before the export (a minute at a real model)
        from trtforge.llm.compile.int8 import check_prompts

        emb = lm.get_input_embeddings() if hasattr(lm, "get_input_embeddings") else None
        vocab = int(emb.weight.shape[0]) if hasattr(emb, "weight") else 2**63  # (else: at the dataset)
        check_prompts(calib_prompts, max_seq if max_prefill is None else max_prefill, vocab)
    if precision in QUANTIZED:
        from trtforge.llm.models.moe import refuse_moe

        refuse_moe(lm, f"--generate --precision {precision}", "the projections of dense-MLP models")
    session.refuse_overwriting(source_files(model))  # after the load: a factory's module is known
    records = session.records
    with session:
        message = f"exporting the {type(lm).__name__} step graph (max_seq {max_seq}, max_batch {max_batch})"
        with session.stage("export", message):
            exp = export_step(
                lm,
                max_seq=max_seq,
                max_batch=max_batch,
                max_prefill=max_prefill,
                exporter=exporter,
                all_logits=all_logits,
                cache_layout=cache_layout,
                block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size,
                workdir=session.workdir,
            )
        records["export"] = exp.record()
        proto, generation = exp.model, exp.generation
        lm_name = type(lm).__name__
        del exp, lm  # (the torch weights: the stages below hold the graph's copies)
        if passes:
            from trtforge.passes.pipeline import optimize_model

            with session.stage("passes", "running fusion passes"):
                # The pass manager verifies on its own generated inputs (batch 2, S 7, past_lens 1), which
                # need S_max >= 8; every pass result is also checked below on valid step feeds.
                before = proto
                proto, ledger = optimize_model(proto, attention="none", verify=max_seq >= _VERIFIER_MIN_SEQ)
                records["passes"] = ledger.to_dict()
                records["passes"]["step_check_max_abs_error"] = _same_outputs(before, proto, generation)
                del before  # (the unfused graph's weights, up to 1x more past the passes)
        proto = apply_precision(
            proto, generation, precision, calib_prompts, records, stage=session.stage, progress=progress
        )
        if cache_layout == "paged" and build:
            generation["cache"]["num_blocks"] = pool_blocks
        generation["profiles"] = {"prefill": PREFILL, "decode": DECODE}
        set_generation_metadata(proto, generation)
        if not build:
            return session.publish_onnx(proto)
        # (weights in NAME.data past protobuf's 2 GB, as every ONNX file trtforge writes; the save moves them
        # out of `proto`: --save-onnx is written from the file, named as it so that the data file it names
        # and the manifest's hash are the same)
        name = Path(os.fsdecode(save_onnx)).name if save_onnx is not None else "step_final.onnx"
        onnx_path = onnx_io.save_onnx(proto, session.workdir / name)
        with session.stage("build", "building the step engine (prefill + decode profiles)"):
            engine, build_record = build_step_engine(
                onnx_path,
                generation,
                backend=backend,
                targets=list(targets or []) or None,
                opt_level=opt_level,
                workspace_mb=workspace_mb,
                progress=progress,
                precision=precision,
            )
        records["build"] = {
            k: v for k, v in build_record.items() if k not in ("inputs", "outputs", "profiles")
        }
        manifest = session.manifest(
            engine,
            backend=build_record["backend"] | {"targets": build_record["targets"]},
            inputs=build_record["inputs"],
            outputs=build_record["outputs"],
            profiles=build_record["profiles"],
            source={
                "kind": "causal_lm",
                "path": str(model) if isinstance(model, (str, os.PathLike)) else lm_name,
                "onnx_sha256": onnx_io.source_sha256(onnx_path),
                "opset": 24,
            },
            build_options={
                "generate": True,
                "max_seq": max_seq,
                "max_batch": max_batch,
                "max_prefill": generation["max_prefill"],
                "cache_layout": cache_layout,
                "block_size": generation["cache"].get("block_size"),
                "num_blocks": pool_blocks,
                "exporter": exporter,
                "passes": passes,
                "opt_level": opt_level,
                "workspace_mb": workspace_mb,
            },
            precision={"mode": precision, "float": precision, "attention": "native", "keep_io_types": False},
            generation=generation,
        )
        return session.publish(
            engine, manifest, lambda path: onnx_io.save_onnx_atomic(onnx_io.load_onnx(onnx_path), path)
        )


__all__ = ["apply_precision", "compile_generate", "load_causal_lm"]
