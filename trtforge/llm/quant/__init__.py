"""Serving-path weight quantization of Llama-style models (``from_pretrained(..., quantization=...)``).

- :mod:`.linear`: :class:`QuantLinear`, the module that replaces a projection, and
  :func:`quant_linear`, its one dispatch (float32 reference on the CPU; on CUDA ``torch._scaled_mm``
  for FP8 GEMMs, the Triton GEMVs of :mod:`trtforge.kernels.gemv` for small M).
- :mod:`.awq`: the activation-aware per-input-channel scale search (AWQ) on calibration prompts.
- :mod:`.apply`: :func:`quantize_model`, which checks what can be quantized and rewrites the model
  (the layers' projections, and the LM head with ``lm_head_quantization="fp8"``).

The weight formats themselves live with the kernels that read them (:mod:`trtforge.kernels.qweight`).
May import: trtforge's base modules, ``trtforge.core``, ``trtforge.kernels``, the llm ground floor
and ``trtforge.llm.models``.
"""

from trtforge.llm.quant.apply import (
    LM_HEAD_QUANTIZATIONS,
    QUANTIZATIONS,
    QuantizationRecord,
    model_lm_head_quantization,
    model_quantization,
    quantize_model,
)
from trtforge.llm.quant.linear import QuantLinear, quant_linear

__all__ = [
    "LM_HEAD_QUANTIZATIONS",
    "QUANTIZATIONS",
    "QuantLinear",
    "QuantizationRecord",
    "model_lm_head_quantization",
    "model_quantization",
    "quant_linear",
    "quantize_model",
]
