"""Quantized weight formats the kernels read, with their float32 references.

- :class:`Fp8Weight`: E4M3 weights ``[N, K]`` with one float32 scale per output channel. Two uses
  (the boundary: :func:`trtforge.llm.quant.linear.weight_only_max_tokens`): at decode, weight-only
  (W8A16): the GEMV widens the codes in registers and multiplies the 16-bit activations, checked
  against float32 ``x @ dequantize()^T``; above it W8A8: the activations quantized per token at run
  time (:func:`quantize_rows_fp8`) for ``torch._scaled_mm``. The product of two E4M3 values is exact
  in float32, so :func:`fp8_linear_reference` is the exact execution W8A8 is checked against.
- :class:`Fp8Rows`: activations quantized per token (E4M3 rows and their scales) handed from a kernel
  that quantizes as it computes straight to a W8A8 GEMM.
- :class:`Int4Weight` (weight-only): asymmetric 4-bit codes ``q`` in 0..15 in groups of
  :data:`INT4_GROUP` along K, and per group a float16 scale and offset: ``w = q * scale + offset``.
  Eight codes a 32-bit word (little-endian bytes), interleaved within a group of G: nibble i of
  the group's word j holds k = i * G/8 + j, so that the GEMV's loads of the x elements meeting one
  nibble position are contiguous (:func:`pack_int4`, :meth:`Int4Weight.codes`).

Both quantize row by row (per output channel, groups along K), so the rows of several projections
concatenated (one QKV weight, one gate/up weight) are the concatenation of their quantized rows:
:func:`cat_weights`, :meth:`rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtforge.kernels.kv_quant import FP8_MAX, to_e4m3

INT4_GROUP = 128
_TINY = 1e-12
_QUANT_ELEMENTS = 1 << 26  # elements a weight is quantized by at once (256 MB of float32 each temporary)


@dataclass(frozen=True)
class Fp8Weight:
    """E4M3 ``data`` ``[N, K]`` and float32 ``scale`` ``[N]``: ``w[n] ~ data[n] * scale[n]``."""

    data: torch.Tensor
    scale: torch.Tensor
    kind = "fp8"

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.data.shape[0]), int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return self.data.numel() + self.scale.numel() * self.scale.element_size()

    def dequantize(self) -> torch.Tensor:
        """float32 ``[N, K]``."""
        return self.data.float() * self.scale.float()[:, None]

    def rows(self, lo: int, hi: int) -> Fp8Weight:
        return Fp8Weight(self.data[lo:hi], self.scale[lo:hi])


@dataclass(frozen=True)
class Fp8Rows:
    """Activations quantized per token, the input of a W8A8 GEMM: E4M3 codes `q` ``[Mp, K]`` and float32
    scales `s` ``[Mp, 1]`` (Mp: `m` rounded up to 16; rows past `m` zero codes, scale 1), and the
    `dtype` of the activations the rows stand for (the GEMM's output type). A producer that quantizes
    as it computes (a fused norm or activation) hands these on, so no 16-bit copy of the rows is written
    and read again."""

    q: torch.Tensor
    s: torch.Tensor
    m: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return self.m, int(self.q.shape[1])

    @property
    def device(self) -> torch.device:
        return self.q.device


@dataclass(frozen=True)
class Int4Weight:
    """``packed`` uint8 ``[N, K/2]``, float16 ``scale`` and ``offset`` ``[N, K/G]``: ``w = q*s + o``."""

    packed: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    kind = "int4"

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.packed.shape[0]), 2 * int(self.packed.shape[1])

    @property
    def group_size(self) -> int:
        return self.shape[1] // int(self.scale.shape[1])

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 2 * self.scale.numel() * self.scale.element_size()

    def codes(self) -> torch.Tensor:
        """The 4-bit codes ``[N, K]`` as uint8 (undoing :func:`pack_int4`)."""
        n, k = self.shape
        g = self.group_size
        b = self.packed.view(n, k // g, g // 8, 4)  # [n, group, word j, byte]
        nib = torch.stack((b & 15, b >> 4), dim=-1).flatten(-2)  # [n, group, j, nibble i]
        return nib.transpose(-1, -2).reshape(n, k)  # k = i * G/8 + j

    def dequantize(self) -> torch.Tensor:
        """float32 ``[N, K]``."""
        n, k = self.shape
        q = self.codes().float().view(n, -1, self.group_size)
        w = q * self.scale.float()[:, :, None] + self.offset.float()[:, :, None]
        return w.view(n, k)

    def rows(self, lo: int, hi: int) -> Int4Weight:
        return Int4Weight(self.packed[lo:hi], self.scale[lo:hi], self.offset[lo:hi])


QuantWeight = Fp8Weight | Int4Weight


def cat_weights(weights: list[QuantWeight]) -> QuantWeight:
    """The weights' rows concatenated (one format, one K)."""
    kinds = {type(w) for w in weights}
    if len(kinds) != 1:
        raise ValueError(
            f"cannot concatenate weights of different formats {sorted(k.__name__ for k in kinds)}"
        )
    if isinstance(weights[0], Fp8Weight):
        return Fp8Weight(torch.cat([w.data for w in weights]), torch.cat([w.scale for w in weights]))
    return Int4Weight(
        torch.cat([w.packed for w in weights]),
        torch.cat([w.scale for w in weights]),
        torch.cat([w.offset for w in weights]),
    )


def _ieee_ratio(numerator: float, t: torch.Tensor) -> torch.Tensor:
    """``numerator / t`` as one correctly rounded float32 division per element, as the kernels' ``div_rn``.
    torch computes ``scalar / tensor`` as ``reciprocal(t) * scalar``, two roundings: about a quarter of
    the quotients then differ by an ulp, and so do the codes of values near a rounding tie."""
    return torch.div(torch.full_like(t, numerator), t)


def quantize_fp8(w: torch.Tensor) -> Fp8Weight:
    """Per-output-channel E4M3: each row scaled so its largest magnitude is :data:`FP8_MAX`."""
    w = w.detach()
    amax = w.abs().amax(dim=1).float().clamp_min(_TINY)
    ratio = _ieee_ratio(FP8_MAX, amax)
    data = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    rows = max(1, _QUANT_ELEMENTS // max(1, int(w.shape[1])))  # bounds the float32 temporaries
    for lo in range(0, int(w.shape[0]), rows):
        data[lo : lo + rows] = to_e4m3(w[lo : lo + rows].float() * ratio[lo : lo + rows, None])
    return Fp8Weight(data, (amax / FP8_MAX).contiguous())


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token activation quantization: E4M3 ``[M, K]`` and float32 scales ``[M, 1]``.

    ``inv = 448 / amax`` then ``round(x * inv)`` to E4M3 (round half to even), scale ``amax / 448``:
    the Triton kernel of :mod:`trtforge.kernels.fp8_rows` computes the same codes on the GPU."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp_min(_TINY)
    xq = to_e4m3(xf * _ieee_ratio(FP8_MAX, amax))
    return xq, amax / FP8_MAX


def fp8_linear_reference(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 in float32 (exact products): ``(q(x) @ q(w)^T) * sx * sw (+ bias)``, float32 ``[M, N]``."""
    return fp8_codes_linear_reference(*quantize_rows_fp8(x), w, bias)


def fp8_codes_linear_reference(
    xq: torch.Tensor, sx: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`fp8_linear_reference` of activations already quantized (E4M3 `xq` ``[M, K]``, float32
    scales `sx` ``[M, 1]``): float32 ``[M, N]``."""
    out = (xq.float() @ w.data.float().t()) * sx.float() * w.scale.float()[None, :]
    return out if bias is None else out + bias.float()


def _int4_groups(
    w: torch.Tensor, group_size: int, clip: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes (float ``[N, K/G, G]``), float16 scales and offsets ``[N, K/G]`` of RTN asymmetric INT4."""
    n, k = w.shape
    if k % group_size or group_size % 8:
        raise ValueError(f"INT4 groups of {group_size} must be a multiple of 8 (a word) dividing K={k}")
    g = w.detach().float().view(n, k // group_size, group_size)
    lo = g.amin(dim=-1).clamp(max=0.0)
    hi = g.amax(dim=-1).clamp(min=0.0)
    if clip is not None:
        lo, hi = lo * clip, hi * clip
    scale = ((hi - lo) / 15.0).clamp_min(1e-7).half()  # (above float16's smallest subnormal)
    s = scale.float()
    zero = torch.round(-lo / s).clamp(0, 15)
    offset = (-zero * s).half()
    q = torch.round((g - offset.float()[..., None]) / s[..., None]).clamp(0, 15)
    return q, scale, offset


def quantize_int4(
    w: torch.Tensor, group_size: int = INT4_GROUP, clip: torch.Tensor | None = None
) -> Int4Weight:
    """Round-to-nearest asymmetric INT4 over groups of `group_size` along K (K must divide into them).

    Per group: ``scale = (max - min) / 15`` and ``offset = -zero * scale`` (zero the integer code of
    0.0, so zero stays exact), both rounded to float16 first; codes ``round((w - offset) / scale)``.
    `clip` ``[N, K / group_size]`` (AWQ's clipping search) shrinks each group's min and max first."""
    q, scale, offset = _int4_groups(w, group_size, clip)
    return Int4Weight(pack_int4(q.to(torch.uint8).view(w.shape), group_size), scale.contiguous(),
                      offset.contiguous())  # fmt: skip


def pack_int4(codes: torch.Tensor, group_size: int = INT4_GROUP) -> torch.Tensor:
    """uint8 ``[N, K/2]`` of 4-bit `codes` ``[N, K]``: per group of `group_size`, 32-bit words j of
    nibbles i (bits 4i..4i+3, little-endian bytes) holding k = i * group_size/8 + j."""
    n, k = codes.shape
    q = codes.view(n, k // group_size, 8, group_size // 8).transpose(-1, -2)  # [n, group, j, i]
    return (q[..., 0::2] | (q[..., 1::2] << 4)).reshape(n, k // 2).contiguous()


def fake_quantize_int4(
    w: torch.Tensor, group_size: int = INT4_GROUP, clip: torch.Tensor | None = None
) -> torch.Tensor:
    """``quantize_int4(w, ...).dequantize()`` without packing: what the searches score (float32)."""
    q, scale, offset = _int4_groups(w, group_size, clip)
    return (q * scale.float()[..., None] + offset.float()[..., None]).view(w.shape)
