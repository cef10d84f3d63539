"""The quantized projection: :class:`QuantLinear` and the one dispatch :func:`quant_linear`.

What runs at ``M`` tokens (:func:`weight_only_max_tokens` is the boundary, shared with the fused
layers of :mod:`trtforge.llm.executors.fused_layers`):

- FP8, M <= 1 (decode): weight-only (W8A16). CUDA: the Triton GEMV widens the E4M3 codes in registers,
  multiplies the 16-bit activations in FP32 and applies the per-row scales at the end; CPU: float32
  ``x @ dequantized(W)^T``, the same numbers up to float32 summation order.
- FP8, more tokens (prefill, batched decode): W8A8, its input quantized per token by one Triton kernel
  (:mod:`trtforge.kernels.fp8_rows`). CUDA: up to :data:`FP8_SKINNY_MAX_TOKENS` tokens on Hopper
  trtforge's skinny wgmma GEMM (:mod:`trtforge.kernels.fp8_skinny`), above it (or on Ada)
  ``torch._scaled_mm`` (cuBLASLt, row-wise scales, fast accumulation, BF16 out); CPU:
  :func:`~trtforge.kernels.qweight.fp8_linear_reference` (the same E4M3 activations, products exact in
  float32). The CPU differs from CUDA only where cuBLASLt rounds its FP32 sum to BF16 before a non-BF16
  model's dtype, and in summation order.
- INT4: weight-only at every M. CUDA: the dequantizing Triton GEMV up to
  :data:`~trtforge.kernels.gemv.MAX_ROWS` tokens, above it dequantize + one 16-bit GEMM (prefill:
  compute-bound, the dequantize is a small part); CPU: float32 ``x @ dequantized(W)^T``.
"""

from __future__ import annotations

import torch
from torch import nn

from trtforge.kernels import has_wgmma
from trtforge.kernels.qweight import (
    Fp8Rows,
    Fp8Weight,
    Int4Weight,
    QuantWeight,
    fp8_codes_linear_reference,
    fp8_linear_reference,
)


def _scaled_mm(
    x: torch.Tensor | Fp8Rows,
    w: Fp8Weight,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    into: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A8 on the FP8 tensor cores (+ `residual`): per-token activation scales (one Triton kernel, rows
    padded to the 16 cuBLASLt's FP8 GEMMs take), per-channel weight scales; on Hopper up to
    :data:`FP8_SKINNY_MAX_TOKENS` rows trtforge's skinny wgmma GEMM (:mod:`trtforge.kernels.fp8_skinny`),
    and up to :data:`FP8_MID_MAX_TOKENS` its mid-sized one where the output is narrow, instead of
    cuBLASLt; that one takes the residual into its FP32 epilogue with :data:`FP8_MID_FOLD_RESIDUAL`.
    `x` may come quantized already (:class:`~trtforge.kernels.qweight.Fp8Rows`, from a fused norm or
    activation): then its codes are multiplied as they are."""
    m = int(x.shape[0])
    if isinstance(x, Fp8Rows):
        xq, sx = x.q, x.s
    else:
        from trtforge.kernels.fp8_rows import quantize_rows_fp8_padded

        xq, sx = quantize_rows_fp8_padded(x.contiguous())
    kind = x.dtype if x.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
    out = None
    if m <= FP8_SKINNY_MAX_TOKENS and has_wgmma(x.device):  # (0: off, and nothing imported)
        from trtforge.kernels.fp8_skinny import MAX_ROWS, fp8_skinny_gemm

        if m <= MAX_ROWS:  # the bias joins the FP32 sum; one rounding, to x's dtype where it can
            out = fp8_skinny_gemm(xq[:m], sx[:m], w.data, w.scale, bias, out_dtype=kind)
    if out is None and m <= FP8_MID_MAX_TOKENS and has_wgmma(x.device):  # (0: off, and nothing imported)
        from trtforge.kernels import num_sms
        from trtforge.kernels.gemm_mid import fp8_mid_wins, mid_gemm_fp8

        if fp8_mid_wins(m, w.data.shape[0], num_sms(x.device)):
            fold = FP8_MID_FOLD_RESIDUAL and residual is not None and bias is None
            if fold and residual.dtype == x.dtype == kind:  # the residual joins the FP32 sum: done
                out = mid_gemm_fp8(xq[:m], sx[:m], w.data, w.scale, residual=residual, out_dtype=kind)
                return out if into is None else into.copy_(out)
            out = mid_gemm_fp8(xq[:m], sx[:m], w.data, w.scale, bias, out_dtype=kind)
    if out is None:
        out = torch._scaled_mm(
            xq,
            w.data.t(),
            scale_a=sx,
            scale_b=w.scale[None, :],
            out_dtype=torch.bfloat16,
            use_fast_accum=FP8_FAST_ACCUM,
        )[:m].to(x.dtype)
        out = out if bias is None else out + bias
    out = out.to(x.dtype)  # (a bias of another dtype promoted the sum)
    return _add_into(residual, out, into)


def _add_into(residual: torch.Tensor | None, out: torch.Tensor, into: torch.Tensor | None) -> torch.Tensor:
    """``residual + out`` (just `out` without a residual), written into `into` where given; `into` may
    be `residual` itself, which then takes the sum in place."""
    if residual is None:
        return out if into is None else into.copy_(out)
    return residual + out if into is None else torch.add(residual, out, out=into)


FP8_WEIGHT_ONLY_MAX_TOKENS = 1  # FP8 runs W8A16 (the GEMV) up to this many tokens, W8A8 above
# W8A8 up to this many tokens runs the skinny FP8 GEMM rather than cuBLASLt's (CUDA; at most
# fp8_skinny.MAX_ROWS; 0 turns it off). On the H200 (session 16, benchmarks/sweep_fp8_skinny.py) it
# beat quantize + _scaled_mm by 1.1-1.6x per 8B projection at 64 rows and 1.4-1.8x at one; FP8 serving
# (bench_quant_speed.py) went from 1.22x to 1.26x BF16 in the same run. One token stays on the GEMV.
FP8_SKINNY_MAX_TOKENS = 64
# W8A8 above the skinny GEMM's rows and up to this many tokens runs trtforge's mid-sized GEMM
# (trtforge.kernels.gemm_mid.mid_gemm_fp8; Hopper) instead of cuBLASLt where gemm_mid.fp8_mid_wins: the
# narrow outputs (8B's o and down), whose 64 x 64 tiles number under 2x the SMs. H200, session 17: a
# layer's four GEMMs at 128 rows 92 us against 115 (sweep_mid_gemm.py --fp8, which folds o's and down's
# residual adds into this kernel; the served path adds them after it), at 256 rows the decode step's
# GEMMs 4.18 -> 4.01 ms (profile_mixed_step.py), and 128/128 FP8 serving 19,796 -> 19,836 tok/s side by
# side (within noise, never slower). 0 turns it off.
FP8_MID_MAX_TOKENS = 256
# On that GEMM, a residual (o and down in the fused layers) joins its FP32 sum instead of an add after
# the rounding: one kernel and one rounding fewer. The sweep's o/down wins above counted the fold; the
# served path does not fold until this is measured on the H200 (False: off).
FP8_MID_FOLD_RESIDUAL = False
# cuBLASLt's FP8 GEMMs sum the tensor cores' products without its periodic promotion to an FP32
# accumulator (use_fast_accum; the schedule of vLLM's CUTLASS W8A8 kernels too). H200, session 32
# (benchmarks/bench_fp8_gemm.py --outliers, bench_quant_quality.py, profile_mixed_step.py --ab): an 8B
# layer's four GEMMs 1.13x faster at 1,086 tokens (1.06x at 4,096), served steps 4-11% faster; the
# accumulation error is 2-3x larger against the product of the same E4M3 operands, but FP8's rounding
# dominates: the RMS error against the unquantized product goes from 3.61e-2 to 3.62e-2 (down, K
# 14,336: 3.70e-2 to 3.72e-2), and the trained 21M model served on the GPU moves from +0.35% to +0.43%
# perplexity over BF16 (#28: <= 1%). False: exact accumulation.
FP8_FAST_ACCUM = True


def weight_only_max_tokens(w: QuantWeight) -> int:
    """Token counts up to which `w`'s projection runs on the GEMV (CUDA), its weights widened in
    registers: FP8 weight-only (W8A16; above it W8A8 on the FP8 tensor cores); INT4 the GEMV's row
    limit :data:`~trtforge.kernels.gemv.MAX_ROWS`."""
    if isinstance(w, Fp8Weight):
        return FP8_WEIGHT_ONLY_MAX_TOKENS
    from trtforge.kernels.gemv import MAX_ROWS  # (imports Triton: not at module level)

    return MAX_ROWS


def quant_linear(
    x: torch.Tensor | Fp8Rows,
    w: QuantWeight,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``linear(x, w, bias)`` for quantized `w` ``[N, K]`` and `x` ``[..., K]``, in `x`'s dtype, plus
    `residual` (``[..., N]``, x's dtype) where given: added to the rounded product, or, on the FP8
    mid-sized GEMM with :data:`FP8_MID_FOLD_RESIDUAL`, to its FP32 sum before the one rounding. `out`
    (contiguous, ``[..., N]``) receives the result where given and may be `residual` itself (a
    piecewise step's residual stream, summed in place). `x` may be pre-quantized
    :class:`~trtforge.kernels.qweight.Fp8Rows` for an FP8 `w`: that is W8A8 at any token count."""
    if isinstance(x, Fp8Rows):
        return _quantized_rows_linear(x, w, bias, residual, out)
    lead, k = x.shape[:-1], int(x.shape[-1])
    x2 = x.reshape(-1, k)
    m = int(x2.shape[0])
    r2 = None if residual is None else residual.reshape(m, w.shape[0])
    o2 = None if out is None else out.view(m, w.shape[0])
    if x2.device.type == "cuda":
        if m == 0:
            y = x2.new_zeros((0, w.shape[0]))
        elif m <= weight_only_max_tokens(w):
            from trtforge.kernels.gemv import gemv

            y = gemv(x2.contiguous(), w, bias)
        elif isinstance(w, Fp8Weight):
            return _scaled_mm(x2, w, bias, r2, o2).reshape(*lead, w.shape[0])
        else:
            y = torch.nn.functional.linear(x2, w.dequantize().to(x2.dtype), bias)
    else:
        if isinstance(w, Fp8Weight) and m > FP8_WEIGHT_ONLY_MAX_TOKENS:
            y = fp8_linear_reference(x2, w)
        else:  # weight-only: what the GEMV computes
            y = x2.float() @ w.dequantize().t()
        y = (y if bias is None else y + bias.float()).to(x.dtype)
    return _add_into(r2, y, o2).reshape(*lead, w.shape[0])


def _quantized_rows_linear(
    x: Fp8Rows,
    w: QuantWeight,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`quant_linear` of pre-quantized rows: W8A8 (CUDA: :func:`_scaled_mm`; CPU: the float32
    reference of the same codes)."""
    if not isinstance(w, Fp8Weight) or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"quant_linear: pre-quantized FP8 rows {list(x.shape)} need an FP8 weight [N, {x.shape[1]}], "
            f"got {type(w).__name__} {list(w.shape)}"
        )
    m, n = x.m, w.shape[0]
    r2 = None if residual is None else residual.reshape(m, n)
    o2 = None if out is None else out.view(m, n)
    if x.device.type == "cuda":
        return _scaled_mm(x, w, bias, r2, o2)
    y = fp8_codes_linear_reference(x.q[:m], x.s[:m], w, bias).to(x.dtype)
    return _add_into(r2, y, o2)


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


__all__ = ["Fp8Weight", "Int4Weight", "QuantLinear", "quant_linear", "weight_only_max_tokens"]
