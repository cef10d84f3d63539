"""Build ONE step engine with two profiles: 0 = prefill (S up to max_prefill), 1 = decode (S = 1).

One engine rather than two: both phases share one copy of the weights (two engines would each embed
them), and the cache inputs have the same static S_max in both. A context picks its profile per phase.
Measured (TensorRT-RTX 1.7.1, CPU build, FP16 Llama-style hidden 256, 4 layers, vocab 2,000, S_max 256,
B 4, prefill 128): one two-profile engine 15.7 MB vs 13.6 MB prefill-only + 11.7 MB decode-only =
25.3 MB for two engines.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from trtforge.compiler.build import serialize_network
from trtforge.compiler.network import network_io, parse_onnx
from trtforge.core.backend import get_backend
from trtforge.errors import BuildError, UserError
from trtforge.llm.contract import step_profiles


def layer_census(network: Any) -> dict[str, int]:
    """Layer type -> count of a parsed network (what the builder was given)."""
    return dict(
        sorted(
            Counter(
                str(network.get_layer(i).type).rsplit(".", 1)[-1] for i in range(network.num_layers)
            ).items()
        )
    )


def _head_dim_hint(generation: dict[str, Any]) -> str:
    """Why a step engine of this model may not build, where known (measured with TensorRT-RTX 1.7.1)."""
    head_dim = int(generation.get("head_dim") or 8)
    if head_dim % 8 == 0:
        return ""
    return (
        f"\n  The model's head_dim {head_dim} is not a multiple of 8, on which TensorRT-RTX's FP16/BF16 "
        "kernels fail (head dims 8, 16, 24, 32, 40 build). Serve the model with the torch executor "
        "(trtforge.llm.from_pretrained) or its FP32 step graph with ONNX Runtime instead."
    )


LOW_BIT = ("fp8", "int4")


def refused_precision(be: Any, precision: str, targets: list[str], error: str) -> UserError:
    """The builder's refusal of an FP8 / INT4 step graph as one paragraph naming precision and targets."""
    where = ", ".join(targets) if targets else "its default targets"
    lines = [ln.strip() for ln in error.splitlines()[1:] if ln.strip()][-3:]
    hint = {
        "fp8": "FP8 GEMMs need compute capability 8.9+ (Ada) on TensorRT-RTX, and Hopper (SM 9.0) or newer "
        "on datacenter TensorRT; TensorRT-RTX does not target SM 9.0 at all",
        "int4": "INT4 weight-only GEMMs need a builder with weight-only INT4 kernels for these targets",
    }[precision]
    return UserError(
        f"{be.name} {be.version} cannot build the --precision {precision} step engine for {where}: "
        f"{hint}. Builder said: {' | '.join(lines) or error.strip()[:300]}. The quantized step graph itself "
        "is valid (checked in exact ONNX Runtime): write it with --save-onnx and build it with a TensorRT "
        "that supports the target, or use --precision fp16/bf16/int8 here."
    )


# TensorRT-RTX refuses a profile shape of more elements than this ("tensor volume exceeds 1099511627776");
# it is 2 TiB of FP16, more than any GPU holds, so it bounds every backend's usable shapes as well
MAX_TENSOR_VOLUME = 2**40


def _set_shape(profile: Any, name: str, rng: Any) -> None:
    """One input's range in an optimization profile; a range TensorRT cannot hold (a dimension past
    int64, a pool it calls inconsistent, more elements than a tensor may have) is the cache options'
    fault, named as such, not a trace or a builder error after the export."""
    for label, dims in (("opt", rng.opt), ("max", rng.max)):
        volume = math.prod(int(d) for d in dims)
        if volume > MAX_TENSOR_VOLUME:
            raise UserError(
                f"the step engine's input '{name}' would hold {volume:,} elements at its {label} shape "
                f"{list(dims)}, past the {MAX_TENSOR_VOLUME:,} a TensorRT tensor may have. --num-blocks, "
                "--max-batch, --max-seq and --block-size size it; lower them."
            )
    try:
        profile.set_shape(name, rng.min, rng.opt, rng.max)
    except (TypeError, ValueError, RuntimeError) as e:
        lines = str(e).strip().splitlines() or [type(e).__name__]
        first = "a dimension past int64" if isinstance(e, TypeError) else lines[0][:200].rstrip(".:")
        raise UserError(
            f"TensorRT cannot take the step engine's range of input '{name}' (min {list(rng.min)}, max "
            f"{list(rng.max)}): {first}. --num-blocks, --max-batch, --max-seq and --block-size size it; "
            "lower them."
        ) from e


def build_step_engine(
    onnx_path: Path,
    generation: dict[str, Any],
    *,
    backend: str | None = None,
    targets: list[str] | None = None,
    opt_level: int | None = None,
    workspace_mb: int | None = None,
    progress: bool = True,
    precision: str = "fp16",
) -> tuple[bytes, dict[str, Any]]:
    """Parse the step graph and build the two-profile engine; returns (engine bytes, build record).

    A builder that refuses a quantized (`precision` fp8 / int4) graph raises a UserError naming the
    precision and the targets (see :func:`refused_precision`)."""
    be = get_backend(backend)
    if not be.capabilities.can_build:
        raise UserError(f"{be.name} cannot build engines here: {be.capabilities.build_reason}.")
    t0 = time.perf_counter()
    builder = be.create_builder()
    network = be.create_network(builder)
    be.logger.take()
    parser = parse_onnx(be, network, onnx_path)
    inputs, outputs = network_io(network)
    profiles = step_profiles(generation)
    config = builder.create_builder_config()
    for prof in profiles:
        p = builder.create_optimization_profile()
        for name, rng in prof.items():
            _set_shape(p, name, rng)
        if config.add_optimization_profile(p) < 0:
            raise UserError(f"TensorRT rejected the step-graph optimization profile {prof}.")
    if opt_level is not None:
        config.builder_optimization_level = opt_level
    if workspace_mb is not None:
        config.set_memory_pool_limit(be.trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    chosen = be.set_build_targets(config, list(targets or []))
    parsed = time.perf_counter()
    decomposed: list[str] = []
    try:
        data, messages = serialize_network(be, builder, network, config, progress, "the step engine")
    except BuildError as fused_error:
        # fused kernels first (the fast path); small head dims or hidden sizes fail a Myelin check there
        decomposed = be.mark_attention_decomposable(network)
        try:
            if not decomposed:
                raise
            data, messages = serialize_network(be, builder, network, config, progress, "the step engine")
        except BuildError as e:
            if precision in LOW_BIT:
                raise refused_precision(be, precision, chosen, str(e)) from fused_error
            raise BuildError(f"{e}{_head_dim_hint(generation)}") from fused_error
    del parser
    record = {
        "backend": be.describe(),
        "targets": chosen,
        "inputs": inputs,
        "outputs": outputs,
        "profiles": profiles,
        "layers": network.num_layers,
        "layer_types": layer_census(network),
        "attention_decomposed": decomposed,
        "warnings": [m for sev, m in messages if sev == "WARNING"][:50],
        "seconds": {"parse": parsed - t0, "build": time.perf_counter() - parsed},
        "engine_bytes": len(data),
    }
    return data, record
