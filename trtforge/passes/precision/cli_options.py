"""Click options shared by `trtforge compile` and `trtforge optimize`, and the call they lead to.

@click.command()
@precision_options                    # or @precision_options(default="fp32")
def compile_cmd(model, precision, keep_fp32, keep_io_types, precision_data, **kw):
    proto, record = convert_with_options(proto, precision=precision, keep_fp32=keep_fp32,
                                         keep_io_types=keep_io_types, precision_data=precision_data)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    import onnx

    from trtforge.passes.precision.record import PrecisionRecord

F = TypeVar("F", bound=Callable[..., Any])
CHOICES = ("fp32", "fp16", "bf16")
PARAMS = ("precision", "keep_fp32", "keep_io_types", "precision_data")


def _options(default: str) -> list[Callable[[F], F]]:
    return [
        click.option(
            "--precision",
            type=click.Choice(CHOICES, case_sensitive=False),
            default=default,
            show_default=True,
            help="Compute precision written into the graph (TensorRT 11 / RTX have no FP16 flag): "
            "fp16/bf16 convert weights and activations, keeping sensitive nodes in FP32.",
        ),
        click.option(
            "--keep-fp32",
            "keep_fp32",
            multiple=True,
            metavar="NODE_OR_OPTYPE",
            help="Keep this node (by name) or every node of this op type in FP32. Repeatable.",
        ),
        click.option(
            "--keep-io-types/--low-precision-io",
            "keep_io_types",
            default=True,
            show_default=True,
            help="Graph inputs/outputs stay FP32 (default), or take the low precision type too.",
        ),
        click.option(
            "--precision-data",
            metavar="DATA",
            default=None,
            help="Sample inputs for the FP16 range check (.npz, directory, sentences.txt with "
            "--tokenizer, or module:function). Default: generated from the input specs.",
        ),
    ]


def precision_options(fn: F | None = None, *, default: str = "fp16") -> Any:
    """Add --precision, --keep-fp32, --keep-io-types/--low-precision-io and --precision-data."""

    def wrap(f: F) -> F:
        for option in reversed(_options(default)):
            f = option(f)
        return f

    return wrap(fn) if fn is not None else wrap


def convert_with_options(
    model: onnx.ModelProto,
    *,
    precision: str,
    keep_fp32: Sequence[str] = (),
    keep_io_types: bool = True,
    precision_data: str | None = None,
    tokenizer: Any = None,
) -> tuple[onnx.ModelProto, PrecisionRecord]:
    """Run `convert_precision` with the values of the options above (loads --precision-data if given)."""
    from trtforge.passes.precision.convert import convert_precision

    data = None
    if precision_data is not None and precision.lower() != "fp32":
        from trtforge.calibration.data import input_specs_from_model, load_dataset

        data = load_dataset(precision_data, input_specs_from_model(model), tokenizer=tokenizer)
    return convert_precision(
        model, precision, keep_fp32=tuple(keep_fp32), data=data, keep_io_types=keep_io_types
    )
