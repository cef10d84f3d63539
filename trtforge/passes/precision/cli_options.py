"""The precision conversion a command's options lead to: `convert_precision` with `--precision-data` loaded.

The options themselves are declared once in :class:`trtforge.core.policy.PrecisionOptions` (shared by
`trtforge compile` and `trtforge optimize`); this is the call `trtforge optimize` makes with their values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

    from trtforge.passes.precision.record import PrecisionRecord


def convert_with_options(
    model: onnx.ModelProto,
    *,
    precision: str,
    keep_fp32: Sequence[str] = (),
    keep_io_types: bool = True,
    precision_data: str | None = None,
    tokenizer: Any = None,
    feed_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[onnx.ModelProto, PrecisionRecord]:
    """Run `convert_precision` with the option values (loads `precision_data` for the FP16 range check;
    `feed_shapes`: the input shapes generated data falls back to, as in `convert_precision`)."""
    from trtforge.passes.precision.convert import convert_precision

    data = None
    if precision_data is not None and precision.lower() != "fp32":
        from trtforge.calibration.data import input_specs_from_model, load_dataset

        data = load_dataset(
            precision_data, input_specs_from_model(model), tokenizer=tokenizer, what="--precision-data"
        )
    return convert_precision(
        model,
        precision,
        keep_fp32=tuple(keep_fp32),
        data=data,
        keep_io_types=keep_io_types,
        feed_shapes=feed_shapes,
    )
