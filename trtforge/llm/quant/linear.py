"""The quantized projection: :class:`QuantLinear` and the one dispatch :func:`quant_linear`.

- CPU (and the exact reference): float32. FP8 quantizes the activations per token and multiplies the
  E4M3 values in float32 (their products are exact); INT4 dequantizes the weights to float32.
- CUDA, FP8: ``torch._scaled_mm`` (cuBLASLt, row-wise scales, BF16 out) for every M, its input
  quantized per token by one Triton kernel (:mod:`trtforge.kernels.fp8_rows`); the fused layers
  use the FP8 GEMV at one token (:mod:`trtforge.llm.executors.fused_layers`).
- CUDA, INT4: the dequantizing Triton GEMV up to :data:`~trtforge.kernels.gemv.MAX_ROWS` tokens,
  above it dequantize + one BF16 GEMM (prefill: compute-bound, the dequantize is a small part).
"""

from __future__ import annotations

import torch
from torch import nn

from trtforge.kernels.qweight import (
    Fp8Weight,
    Int4Weight,
    QuantWeight,
    fp8_linear_reference,
)


def _scaled_mm(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """W8A8 on the FP8 tensor cores: per-token activation scales (one Triton kernel, rows padded to the
    16 cuBLASLt's FP8 GEMMs take), per-channel weight scales."""
    from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

    m = int(x.shape[0])
    xq, sx = quantize_rows_fp8_padded(x.contiguous())
    out = torch._scaled_mm(
        xq,
        w.data.t(),
        scale_a=sx,
        scale_b=w.scale[None, :],
        out_dtype=torch.bfloat16,
        use_fast_accum=False,
    )
    out = out[:m].to(x.dtype)
    return out if bias is None else out + bias


def quant_linear(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear(x, w, bias)`` for quantized `w` ``[N, K]`` and `x` ``[..., K]``, in `x`'s dtype."""
    lead, k = x.shape[:-1], int(x.shape[-1])
    x2 = x.reshape(-1, k)
    if x2.device.type == "cuda":
        from trtforge.kernels.gemv import MAX_ROWS, gemv

        m = int(x2.shape[0])
        if m == 0:
            out = x2.new_zeros((0, w.shape[0]))
        elif isinstance(w, Fp8Weight):
            out = _scaled_mm(x2, w, bias)
        elif m <= MAX_ROWS:
            out = gemv(x2.contiguous(), w, bias)
        else:
            out = torch.nn.functional.linear(x2, w.dequantize().to(x2.dtype), bias)
    else:
        if isinstance(w, Fp8Weight):
            out = fp8_linear_reference(x2, w)
        else:
            out = x2.float() @ w.dequantize().t()
        out = (out if bias is None else out + bias.float()).to(x.dtype)
    return out.reshape(*lead, w.shape[0])


class QuantLinear(nn.Module):
    """A projection with quantized weights (``qweight``: :class:`Fp8Weight` or :class:`Int4Weight`).

    The weights are plain attributes, not buffers: ``Module.to(dtype)`` would cast float8 codes and
    scales. Quantize after the model is placed (:func:`trtforge.llm.quant.quantize_model` does)."""

    def __init__(self, qweight: QuantWeight, bias: torch.Tensor | None, method: str) -> None:
        super().__init__()
        self.qweight = qweight
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.method = method
        self.out_features, self.in_features = qweight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear(x, self.qweight, self.bias)

    def extra_repr(self) -> str:
        kind = "fp8 e4m3, per-channel" if isinstance(self.qweight, Fp8Weight) else "int4, group 128"
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.method} ({kind})"


__all__ = ["Fp8Weight", "Int4Weight", "QuantLinear", "quant_linear"]
