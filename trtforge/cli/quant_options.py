"""--quantization and --calib-data of `trtforge generate` and `trtforge serve` (the torch executor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

QUANTIZATIONS = ("fp8", "int4-awq", "int4-rtn")  # trtforge.llm.quant.QUANTIZATIONS (kept light here)


def quant_options(fn: Callable) -> Callable:
    """Add --quantization and --calib-data to a command."""
    fn = click.option(
        "--calib-data",
        "calib_data",
        default=None,
        help="Calibration prompts for --quantization int4-awq: a text file, one prompt per line as "
        "space-separated token ids (the file `compile --generate --precision int8 --calib-data` takes).",
    )(fn)
    return click.option(
        "--quantization",
        type=click.Choice(QUANTIZATIONS),
        default=None,
        help="Quantize the weights (torch executor, Llama-style models): fp8 (W8A8, needs compute "
        "capability 8.9+ on CUDA), int4-awq (needs --calib-data) or int4-rtn; lm_head and embeddings stay.",
    )(fn)


def quant_kwargs(quantization: str | None, calib_data: str | None, executor: str) -> dict[str, Any]:
    """The from_pretrained keywords for the options (UserError where they do not apply)."""
    from trtforge.cli.compile_generate import _read_prompts
    from trtforge.errors import UserError

    if quantization is None:
        if calib_data is not None:
            raise UserError("--calib-data calibrates --quantization int4-awq; give --quantization too.")
        return {}
    if executor != "torch":
        raise UserError(
            f"--quantization applies to the torch executor; this MODEL runs on {executor} (compiled graphs "
            "and engines carry their own --precision)."
        )
    prompts = _read_prompts(calib_data) if calib_data is not None else None
    return {"quantization": quantization, "calib_prompts": prompts}
