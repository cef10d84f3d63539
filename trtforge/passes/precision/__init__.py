"""FP32 -> FP16/BF16 strongly typed graphs with FP32 islands (TensorRT 11 has no precision flags).

`convert_precision(model, "fp16" | "bf16" | "fp32", ...) -> (model, PrecisionRecord)`. Heavy imports
(onnx, onnx_ir, onnxruntime) happen on first use, so importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtforge._lazy import lazy_attributes

if TYPE_CHECKING:
    from trtforge.passes.precision.convert import PRECISIONS, convert_precision
    from trtforge.passes.precision.record import PrecisionRecord

__all__ = ["PRECISIONS", "PrecisionRecord", "convert_precision"]
_LAZY = {
    "convert_precision": "trtforge.passes.precision.convert",
    "PRECISIONS": "trtforge.passes.precision.convert",
    "PrecisionRecord": "trtforge.passes.precision.record",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
