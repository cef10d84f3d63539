"""--quantization of `trtforge generate` and `trtforge serve` (the torch executor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

QUANTIZATIONS = ("fp8", "int4-awq", "int4-rtn")  # trtforge.llm.quant.QUANTIZATIONS (kept light here)


def quant_options(fn: Callable) -> Callable:
    """Add --quantization to a command (its calibration prompts come from the command's --calib-data)."""
    return click.option(
        "--quantization",
        type=click.Choice(QUANTIZATIONS),
        default=None,
        help="Quantize the weights (torch executor, Llama-style models): fp8 (W8A8, needs compute "
        "capability 8.9+ on CUDA), int4-awq (needs --calib-data) or int4-rtn; lm_head and embeddings stay.",
    )(fn)


def quant_kwargs(quantization: str | None, executor: str) -> dict[str, Any]:
    """The from_pretrained keywords for --quantization (UserError where it does not apply)."""
    from trtforge.errors import UserError

    if quantization is None:
        return {}
    if executor != "torch":
        raise UserError(
            f"--quantization applies to the torch executor; this MODEL runs on {executor} (compiled graphs "
            "and engines carry their own --precision)."
        )
    return {"quantization": quantization}
