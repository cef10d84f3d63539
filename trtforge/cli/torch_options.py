"""The executor flags shared by `trtforge generate` and `trtforge serve`: --executor (and what its
auto picks), and the torch executor's --device, --dtype (where the model runs: a GPU in bfloat16 where
there is one), --quantization, --lm-head-quantization, --kv-cache-dtype, --calib-data (the calibration
prompts of both) and --tensor-parallel-size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

QUANTIZATIONS = ("fp8", "int4-awq", "int4-rtn")  # trtforge.llm.quant.QUANTIZATIONS (kept light here)
LM_HEAD_QUANTIZATIONS = ("fp8",)  # trtforge.llm.quant.LM_HEAD_QUANTIZATIONS
EXECUTORS = ("auto", "onnxruntime", "tensorrt", "torch")  # trtforge.llm.service.EXECUTORS
# trtforge.llm.executors.kv_cache.KV_CACHE_DTYPES: every name kv_cache_dtype takes
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "float8_e4m3fn")
_BY_SUFFIX = {".engine": "tensorrt", ".onnx": "onnxruntime"}


def executor_option(fn: Callable) -> Callable:
    """Add --executor to a command (read it with :func:`resolve_executor`)."""
    return click.option(
        "--executor",
        type=click.Choice(EXECUTORS),
        default="auto",
        show_default=True,
        help="auto: tensorrt for a .engine MODEL, onnxruntime for a .onnx, torch otherwise.",
    )(fn)


def resolve_executor(model: str, executor: str) -> str:
    """The executor --executor names; auto: tensorrt for a .engine MODEL, onnxruntime for a .onnx, torch
    for anything else (a save_pretrained directory or module:factory)."""
    if executor != "auto":
        return executor
    return next((v for k, v in _BY_SUFFIX.items() if model.endswith(k)), "torch")


DTYPES = ("auto", "bfloat16", "float16", "float32")


def torch_executor_options(fn: Callable) -> Callable:
    """Add --device, --dtype, --quantization, --lm-head-quantization, --kv-cache-dtype, --calib-data and
    --tensor-parallel-size to a command (read them with :func:`torch_executor_kwargs`)."""
    fn = click.option(
        "--dtype",
        type=click.Choice(DTYPES),
        default="auto",
        show_default=True,
        help="torch executor weights and KV cache; auto: bfloat16 on a GPU, float32 on the CPU.",
    )(fn)
    fn = click.option(
        "--device",
        default=None,
        help="torch executor: cuda, cuda:N or cpu (default: cuda where there is a GPU).",
    )(fn)
    fn = click.option(
        "--tensor-parallel-size",
        default=1,
        show_default=True,
        type=click.IntRange(1),
        help="torch executor: split the model over N ranks (worker processes; one GPU each on CUDA).",
    )(fn)
    fn = click.option(
        "--calib-data",
        "calib_data",
        default=None,
        type=click.Path(exists=True, dir_okay=False),
        help="Calibration prompts for --quantization int4-awq and the FP8 KV cache's scales: one per "
        "line, space-separated token ids (the file `compile --generate --calib-data` takes; FP8 KV "
        "default: seeded random ids); at most 1,024 prompts.",
    )(fn)
    fn = click.option(
        "--kv-cache-dtype",
        type=click.Choice(KV_CACHE_DTYPES),
        default="auto",
        show_default=True,
        help="torch executor KV cache: auto = the model's dtype; fp8 (or fp8_e4m3, float8_e4m3fn) = E4M3 "
        "pools with per-layer scales (half BF16's bytes; GPUs of compute capability 8.9+, or the CPU).",
    )(fn)
    fn = click.option(
        "--lm-head-quantization",
        type=click.Choice(LM_HEAD_QUANTIZATIONS),
        default=None,
        help="Quantize the LM head too (torch executor, Llama-style models; with any --quantization or "
        "none): fp8 = E4M3 with per-row scales, weight-only at one token, W8A8 above (compute capability "
        "8.9+ on CUDA). Saves half of a BF16 head's bytes read per decoded token (Llama-3-8B: 1.05 -> "
        "0.53 GB); costs some perplexity (BENCHMARKS.md, session 14). A tied input embedding stays exact.",
    )(fn)
    return click.option(
        "--quantization",
        type=click.Choice(QUANTIZATIONS),
        default=None,
        help="Quantize the weights (torch executor, Llama-style models): fp8 (E4M3 weights: weight-only "
        "at one token, W8A8 above; needs compute capability 8.9+ on CUDA), int4-awq (needs --calib-data) "
        "or int4-rtn; embeddings stay, and lm_head unless --lm-head-quantization.",
    )(fn)


def torch_executor_kwargs(
    executor: str,
    *,
    quantization: str | None,
    kv_cache_dtype: str,
    calib_data: str | None,
    tensor_parallel_size: int,
    lm_head_quantization: str | None = None,
    device: str | None = None,
    dtype: str = "auto",
) -> dict[str, Any]:
    """The `llm.load` / `from_pretrained` keywords of the flags; `load` refuses those the executor does
    not take, --quantization, --lm-head-quantization, --device and --dtype are refused here (by their
    flags' names). The torch executor runs where :func:`~trtforge.llm.service.placement` puts it: a GPU
    in bfloat16 where there is one (a CPU in FP32 would be tens of times slower, silently)."""
    from trtforge.cli._options import read_prompt_ids
    from trtforge.errors import UserError

    flags = (
        ("--quantization", quantization),
        ("--lm-head-quantization", lm_head_quantization),
        ("--device", device),
        ("--dtype", None if dtype == "auto" else dtype),
    )
    for flag, value in flags:
        if value is not None and executor != "torch":
            raise UserError(
                f"{flag} applies to the torch executor; this MODEL runs on {executor} (compiled graphs "
                "and engines carry their own --precision and run on the GPU TensorRT or ONNX Runtime "
                "picks)."
            )
    kwargs: dict[str, Any] = {
        "kv_cache_dtype": kv_cache_dtype,
        "calib_prompts": read_prompt_ids(calib_data) if calib_data is not None else None,
        "tensor_parallel_size": tensor_parallel_size,
    }
    if executor == "torch":
        from trtforge.llm.service import placement

        kwargs["device"], kwargs["dtype"] = placement(device, dtype, "--device")
    if quantization is not None:
        kwargs["quantization"] = quantization
    if lm_head_quantization is not None:
        kwargs["lm_head_quantization"] = lm_head_quantization
    return kwargs
