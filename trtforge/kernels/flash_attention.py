"""Triton flash-attention forward: online softmax, tiled over K/V, no S×S matrix in memory.

Layout: every operand is addressed through explicit (batch, head, seq, dim) strides in elements. So
the same kernel reads q/k/v as contiguous [B, H, S, D] tensors *and* as strided views of the packed
QKV projection [B, S, 3, H, D] (= [B, S, 3·H·D]) that the QKV-merge pass produces, and writes its
output either as [B, H, S, D] or straight into [B, S, H·D], which the output projection consumes.
The packed form therefore costs no transpose on either side; the [B, H, S, D] form is what ONNX
`Attention` (opset 23) uses. Loads along D are contiguous when the D stride is 1 (Triton
specializes stride 1 at compile time), which holds in both layouts.

Precision: FP16 and BF16 inputs run their QKᵀ and PV products on the tensor cores with FP32
accumulation and an FP32 online softmax (exp2 with the scale folded in). FP32 inputs are accepted
and run the same kernel with TF32 tensor-core products (about 1e-3 relative error), still
accumulating in FP32: correct, but not the fast path.

Masks: `causal` aligns the triangle to the top-left corner (key j is visible to query i iff j <= i),
as torch SDPA and ONNX `Attention` do. An optional key-padding mask of shape [B, S_kv] (bool or any
integer type, nonzero = real token) hides padded keys anywhere in the row (left or right padding).
A query row that sees no key at all gets an output of zeros (not NaN).

Head dims 32/64/80/96/128 (any D <= 256): the D tile is the next power of two and the loads of the
padding columns are masked. Any sequence length: only the last K/V tile (and, when causal, the
tiles on the diagonal) carry bounds/causal masks; all other tiles run unmasked.

Two variants of one kernel body: "pointer" (masked pointer loads, cp.async pipelining) and "tma"
(Hopper tensor descriptors: the copy engine moves Q/K/V tiles and the output, zero-filling ragged
edges, so no load masks; needs FP16/BF16 and 16-byte-aligned strides, else "pointer" runs). Neither
wins everywhere on the H200 (benchmarks/results/attention.md), so an autotuned launch times both
once per shape bucket and keeps the faster; tiles and pipeline depth are autotuned over
:data:`~trtforge.kernels.configs.AUTOTUNE_CONFIGS` (Hopper-sized, pruned to what fits in
shared memory). A TensorRT plugin instead gets every (tiles, variant) pair as a tactic.

On sm_90 GPUs (H100/H200) FP16/BF16 problems with head dim 64 or 128 and no key-padding mask can
also run the warp-specialized Gluon kernel of :mod:`trtforge.kernels.flash_attention_hopper`
(FlashAttention-3-style producer/consumer warpgroups); the autotuned launch times it against this
kernel per shape bucket and keeps the faster, and a TensorRT plugin gets its configs as tactics.

The launch API takes torch tensors (:func:`flash_attention`) or raw device pointers plus a raw CUDA
stream handle (:func:`flash_attention_raw`), which is what a TensorRT plugin's ``enqueue`` gets.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

from trtforge.kernels import interpreting
from trtforge.kernels.configs import (
    AUTOTUNE_CONFIGS,
    HOPPER_HEAD_DIMS,
    HOPPER_TRITON_RELEASES,
    AnyConfig,
    HopperConfig,
    KernelConfig,
    default_config,
    fits,
    hopper_configs,
    hopper_triton_supported,
)
from trtforge.kernels.device_tensor import DeviceTensor, _itemsize, packed_qkv_views

__all__ = [
    "AUTOTUNE_CONFIGS",
    "DeviceTensor",
    "HopperConfig",
    "KernelConfig",
    "default_config",
    "flash_attention",
    "flash_attention_raw",
    "packed_qkv_views",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MASK_DTYPES = (torch.bool, torch.int8, torch.uint8, torch.int32, torch.int64)
MAX_HEAD_DIM = 256


@triton.jit
def _attn_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    k_desc,
    v_desc,
    b,
    h,
    km_base,
    lo,
    hi,
    offs_m,
    seq_kv,
    qk_scale,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    stride_mn,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KMASK: tl.constexpr,
    DOT_F32: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Fold the K/V tiles [lo, hi) into the running (acc, l_i, m_i); MASKED tiles check bounds/causal.

    With USE_TMA, K/V tiles come through tensor descriptors (the copy engine zero-fills rows past
    S_kv and columns past HEAD_DIM); otherwise through masked pointer loads.
    """
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if not USE_TMA:
            k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
            v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if USE_TMA:
            k = k_desc.load([b, h, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        elif MASKED:
            kv_ok = (offs_n[:, None] < seq_kv) & d_ok[None, :]
            k = tl.load(k_ptrs, mask=kv_ok, other=0.0)
        elif BLOCK_D != HEAD_DIM:
            k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
        if DOT_F32:
            qk = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32))
        else:
            qk = tl.dot(q, tl.trans(k))
        if MASKED or HAS_KMASK:
            if MASKED:
                keep = offs_n[None, :] < seq_kv
                if CAUSAL:
                    keep = keep & (offs_n[None, :] <= offs_m[:, None])
                if HAS_KMASK:
                    km = tl.load(km_base + offs_n * stride_mn, mask=offs_n < seq_kv, other=0)
                    keep = keep & (km[None, :] != 0)
            else:
                km = tl.load(km_base + offs_n * stride_mn)
                keep = km[None, :] != 0
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen only masked keys keeps m = -inf; subtract 0 instead of -inf there.
            m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_sub[:, None])
            alpha = tl.math.exp2(m_i - m_sub)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA:
            v = v_desc.load([b, h, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        elif MASKED:
            v = tl.load(v_ptrs, mask=kv_ok, other=0.0)
        elif BLOCK_D != HEAD_DIM:
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
        if DOT_F32:
            acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _flash_attn_fwd(
    Q,
    K,
    V,
    Out,
    KM,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_mb,
    stride_mn,
    num_heads,
    seq_q,
    seq_kv,
    qk_scale,
    SEQ_Q_BUCKET,
    SEQ_KV_BUCKET,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KMASK: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program = BLOCK_M query rows of one (batch, head); grid (cdiv(S_q, BLOCK_M), B·H)."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        # Longest rows (most K/V tiles) first: better tail balance across the SMs.
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)
    q_base = Q + b * stride_qb + h * stride_qh
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    o_base = Out + b * stride_ob + h * stride_oh
    km_base = KM + b * stride_mb

    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_ok = (offs_m[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_ok, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = qk_scale * 1.4426950408889634  # softmax in base 2

    if CAUSAL:
        kv_end = tl.minimum(seq_kv, m0 + BLOCK_M)
        full_end = (tl.minimum(seq_kv, m0) // BLOCK_N) * BLOCK_N
    else:
        kv_end = seq_kv
        full_end = (seq_kv // BLOCK_N) * BLOCK_N
    # Tiles every row of this block sees whole: no bounds or causal checks.
    acc, l_i, m_i = _attn_tiles(
        acc, l_i, m_i, q, k_base, v_base, k_base, v_base, b, h, km_base, 0, full_end, offs_m, seq_kv,
        qk_scale, stride_kn, stride_kd, stride_vn, stride_vd, stride_mn,
        HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, HAS_KMASK, DOT_F32, False,
    )  # fmt: skip
    # The ragged last tile and, when causal, the tiles on the diagonal.
    acc, l_i, m_i = _attn_tiles(
        acc, l_i, m_i, q, k_base, v_base, k_base, v_base, b, h, km_base, full_end, kv_end, offs_m, seq_kv,
        qk_scale, stride_kn, stride_kd, stride_vn, stride_vd, stride_mn,
        HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, HAS_KMASK, DOT_F32, False,
    )  # fmt: skip
    # Rows that saw no key (all padded) have l = 0 and acc = 0: write zeros, not NaN.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc * (1.0 / l_safe)[:, None]
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=q_ok)


@triton.jit
def _flash_attn_fwd_tma(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    KM,
    stride_mb,
    stride_mn,
    num_heads,
    seq_q,
    seq_kv,
    qk_scale,
    SEQ_Q_BUCKET,
    SEQ_KV_BUCKET,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KMASK: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """As :func:`_flash_attn_fwd`, with q/k/v/out moved by the Hopper copy engine (4-D descriptors
    over [B, H, S, D] of any 16-byte-aligned strides): no load masks, ragged edges zero-filled, the
    output store clipped at S_q and HEAD_DIM."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    km_base = KM + b.to(tl.int64) * stride_mb
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q = desc_q.load([b, h, m0, 0]).reshape(BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = qk_scale * 1.4426950408889634

    if CAUSAL:
        kv_end = tl.minimum(seq_kv, m0 + BLOCK_M)
        full_end = (tl.minimum(seq_kv, m0) // BLOCK_N) * BLOCK_N
    else:
        kv_end = seq_kv
        full_end = (seq_kv // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attn_tiles(
        acc, l_i, m_i, q, KM, KM, desc_k, desc_v, b, h, km_base, 0, full_end, offs_m, seq_kv,
        qk_scale, 0, 0, 0, 0, stride_mn,
        HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, HAS_KMASK, DOT_F32, True,
    )  # fmt: skip
    acc, l_i, m_i = _attn_tiles(
        acc, l_i, m_i, q, KM, KM, desc_k, desc_v, b, h, km_base, full_end, kv_end, offs_m, seq_kv,
        qk_scale, 0, 0, 0, 0, stride_mn,
        HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, HAS_KMASK, DOT_F32, True,
    )  # fmt: skip
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc * (1.0 / l_safe)[:, None]
    desc_o.store([b, h, m0, 0], out.to(desc_o.dtype).reshape(1, 1, BLOCK_M, BLOCK_D))


def _bucket(n: int) -> int:
    """Autotuning key for a sequence length: next power of two, at most 16384."""
    return min(triton.next_power_of_2(max(int(n), 1)), 16384)


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: Any) -> list[triton.Config]:
    """Drop tiles much larger than the problem (256-row tiles below 1024 query rows) and tiles whose
    pipeline does not fit in shared memory at this D tile."""
    seq_q, block_d = named_args["SEQ_Q_BUCKET"], kwargs["BLOCK_D"]
    q = named_args["Q"] if "Q" in named_args else named_args["desc_q"].base
    itemsize = _itemsize(q.dtype)
    kept = []
    for c in configs:
        mine = KernelConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
        if c.kwargs["BLOCK_M"] <= max(seq_q // 4, 64) and fits(mine, block_d, itemsize):
            kept.append(c)
    return kept or configs[-1:]


def _as_triton(c: KernelConfig, pre_hook: Any = None) -> triton.Config:
    return triton.Config(
        {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n},
        num_warps=c.num_warps,
        num_stages=c.num_stages,
        pre_hook=pre_hook,
    )


def _set_block_shapes(nargs: dict) -> None:
    """Autotuner pre-hook: the descriptors' boxes follow the config's tile sizes."""
    bm, bn, bd = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_D"]
    nargs["desc_q"].block_shape = [1, 1, bm, bd]
    nargs["desc_o"].block_shape = [1, 1, bm, bd]
    nargs["desc_k"].block_shape = [1, 1, bn, bd]
    nargs["desc_v"].block_shape = [1, 1, bn, bd]


_KEY = ["SEQ_Q_BUCKET", "SEQ_KV_BUCKET", "HEAD_DIM", "CAUSAL", "HAS_KMASK"]
_tuned_kernel = triton.autotune(
    configs=[_as_triton(c) for c in AUTOTUNE_CONFIGS],
    key=_KEY,
    prune_configs_by={"early_config_prune": _prune},
)(_flash_attn_fwd)
_tuned_kernel_tma = triton.autotune(
    configs=[_as_triton(c, pre_hook=_set_block_shapes) for c in AUTOTUNE_CONFIGS],
    key=_KEY,
    prune_configs_by={"early_config_prune": _prune},
)(_flash_attn_fwd_tma)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _check(q: Any, k: Any, v: Any, out: Any, mask: Any) -> tuple[int, int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if len(t.shape) != 4:
            raise ValueError(f"{name} must be 4-D [B, H, S, D]; got shape {tuple(t.shape)}")
    b, h, s_q, d = (int(n) for n in q.shape)
    s_kv = int(k.shape[2])
    if tuple(k.shape) != (b, h, s_kv, d) or tuple(v.shape) != (b, h, s_kv, d):
        raise ValueError(f"k and v must be [B, H, S_kv, D] = [{b}, {h}, S_kv, {d}]; got {k.shape}, {v.shape}")
    if tuple(out.shape) != (b, h, s_q, d):
        raise ValueError(f"out must be [{b}, {h}, {s_q}, {d}]; got {tuple(out.shape)}")
    dtypes = {q.dtype, k.dtype, v.dtype, out.dtype}
    if len(dtypes) != 1 or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q, k, v, out must share one dtype among {SUPPORTED_DTYPES}; got {dtypes}")
    if not 0 < d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} is outside 1..{MAX_HEAD_DIM}")
    if mask is not None:
        if tuple(mask.shape) != (b, s_kv):
            raise ValueError(f"key_padding_mask must be [B, S_kv] = [{b}, {s_kv}]; got {tuple(mask.shape)}")
        if mask.dtype not in MASK_DTYPES:
            raise ValueError(f"key_padding_mask dtype {mask.dtype} is not one of {MASK_DTYPES}")
    return b, h, s_q, s_kv, d


@functools.lru_cache(maxsize=8)
def _capability(device: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))


def _has_tma(device: int) -> bool:
    return _capability(device)[0] >= 9


_HOPPER_TRITON = hopper_triton_supported(triton.__version__)


def _hopper_eligible(q: Any, k: Any, v: Any, out: Any, mask: Any) -> bool:
    """Whether the warp-specialized Hopper kernel (kernel_hopper.py) can run this problem: no
    key-padding mask, head dim 64 or 128, a proven Triton release, an sm_90 GPU, and tensors the
    copy engine can address (the same conditions as the portable kernel's TMA variant)."""
    if mask is not None or int(q.shape[-1]) not in HOPPER_HEAD_DIMS or not _HOPPER_TRITON or interpreting():
        return False
    if not torch.cuda.is_available() or _capability(torch.cuda.current_device())[0] != 9:
        return False
    return _tma_eligible(q, k, v, out)


def _tma_eligible(*tensors: Any) -> bool:
    """Tensor descriptors need FP16/BF16, a unit last stride, 16-byte-aligned bases and strides, sm_90+."""
    for t in tensors:
        if t.dtype not in (torch.float16, torch.bfloat16) or int(t.stride()[-1]) != 1:
            return False
        if any(int(n) <= 0 for n in t.shape):
            return False
        if t.data_ptr() % 16 or any((int(st) * 2) % 16 for st in t.stride()[:-1]):
            return False
    return interpreting() or (torch.cuda.is_available() and _has_tma(torch.cuda.current_device()))


def _descriptor(t: Any, rows: int, block_d: int) -> TensorDescriptor:
    return TensorDescriptor(t, [int(n) for n in t.shape], [int(x) for x in t.stride()], [1, 1, rows, block_d])


# Autotuned launches with variant "auto": the fastest kernel per problem key, timed once. Values are
# "tma" or "pointer" (the portable kernel's variants) or a HopperConfig.
_VARIANT_CHOICE: dict[tuple, Any] = {}


def _launch(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    mask: Any,
    scale: float,
    causal: bool,
    config: AnyConfig | None,
    variant: str,
) -> None:
    geometry = None
    if mask is None and variant in ("auto", "hopper") and not isinstance(config, KernelConfig):
        geometry = _geometry(q, k, v, out, causal, config, variant)
        planned = _HOPPER_PLANS.get(geometry)
        if planned is not None:
            _launch_hopper(q, k, v, out, scale, causal, planned)
            return
    b, h, s_q, s_kv, d = _check(q, k, v, out, mask)
    if b == 0 or h == 0 or s_q == 0:
        return
    if variant not in ("auto", "tma", "pointer", "hopper"):
        raise ValueError(f"variant must be 'auto', 'tma', 'pointer' or 'hopper'; got {variant!r}")
    hopper_ok = variant in ("auto", "hopper") and _hopper_eligible(q, k, v, out, mask)
    if variant == "hopper" and not hopper_ok:
        raise ValueError(
            f"variant 'hopper' needs an sm_90 GPU, Triton {' or '.join(HOPPER_TRITON_RELEASES)}.x (this is "
            f"{triton.__version__}), FP16/BF16, head dim 64 or 128, no key-padding mask and 16-byte-aligned "
            "strides with a unit D stride; use variant 'auto' to fall back"
        )
    if isinstance(config, HopperConfig):
        if hopper_ok:
            _plan_hopper(geometry, config)
            _launch_hopper(q, k, v, out, scale, causal, config)
            return
        config = default_config(d, _dtype_name(q.dtype))  # e.g. a TensorRT tactic chosen on another GPU
    if (
        config is None
        and hopper_ok
        and (variant == "hopper" or _hopper_wins(q, k, v, out, mask, scale, causal))
    ):
        choice = _VARIANT_CHOICE.get(_choice_key(q, d, causal, mask, s_q, s_kv))
        if not isinstance(choice, HopperConfig):
            choice = hopper_configs(d)[0]
        _plan_hopper(geometry, choice)
        _launch_hopper(q, k, v, out, scale, causal, choice)
        return
    block_d = max(16, triton.next_power_of_2(d))
    mask_arg = mask if mask is not None else q  # never read when HAS_KMASK is False
    mask_strides = tuple(mask.stride()) if mask is not None else (0, 0)
    tail = (h, s_q, s_kv, float(scale), _bucket(s_q), _bucket(s_kv))
    meta = {"HEAD_DIM": d, "BLOCK_D": block_d, "CAUSAL": bool(causal), "HAS_KMASK": mask is not None}
    # Triton's CPU interpreter multiplies BF16 operands wrongly (raw bits); there, and only there,
    # the products run on FP32 copies of the (already rounded) operands.
    meta["DOT_F32"] = interpreting() and q.dtype == torch.bfloat16
    if config is None and interpreting():
        config = default_config(d, _dtype_name(q.dtype))
    tma_ok = _tma_eligible(q, k, v, out)

    def run(use_tma: bool) -> None:
        if use_tma:
            bm, bn = (config.block_m, config.block_n) if config else (64, 64)  # autotune hook resets boxes
            descs = [_descriptor(t, rows, block_d) for t, rows in ((q, bm), (k, bn), (v, bn), (out, bm))]
            args = (*descs, mask_arg, *mask_strides, *tail)
            fixed, tuned = _flash_attn_fwd_tma, _tuned_kernel_tma
        else:
            strides = (*q.stride(), *k.stride(), *v.stride(), *out.stride(), *mask_strides)
            args = (q, k, v, out, mask_arg, *strides, *tail)
            fixed, tuned = _flash_attn_fwd, _tuned_kernel
        if config is None:
            tuned[lambda m: (triton.cdiv(s_q, m["BLOCK_M"]), b * h)](*args, **meta)
            return
        fixed[(triton.cdiv(s_q, config.block_m), b * h)](
            *args,
            **meta,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )

    if config is not None:
        run(tma_ok and (config.tma if variant == "auto" else variant == "tma"))
    elif variant != "auto" or not tma_ok:
        run(tma_ok and variant == "tma")
    else:
        key = _choice_key(q, d, causal, mask, s_q, s_kv)
        if key not in _VARIANT_CHOICE:
            _VARIANT_CHOICE[key] = _fastest({"tma": lambda: run(True), "pointer": lambda: run(False)})
        run(_VARIANT_CHOICE[key] == "tma")


# Launches already decided for the Hopper kernel, by call geometry (_geometry): a repeated call
# skips the checks, the eligibility test and the choice lookup (~40 us of Python per launch).
_HOPPER_PLANS: dict[tuple, HopperConfig] = {}
_MAX_PLANS = 4096


def _geometry(q: Any, k: Any, v: Any, out: Any, causal: bool, config: Any, variant: str) -> tuple:
    """Everything the launch decision depends on: shapes, strides, dtypes, 16-byte alignment of the
    four operands, the mask-free call's options, the device and the interpreter switch."""
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return (
        tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(out.shape),
        tuple(q.stride()), tuple(k.stride()), tuple(v.stride()), tuple(out.stride()),
        q.dtype, k.dtype, v.dtype, out.dtype,
        q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, out.data_ptr() % 16,
        bool(causal), config, variant, device, interpreting(),
    )  # fmt: skip


def _plan_hopper(geometry: tuple | None, config: HopperConfig) -> None:
    """Remember that calls of `geometry` run `config` (bounded: the table is cleared when full)."""
    if geometry is None:
        return
    if len(_HOPPER_PLANS) >= _MAX_PLANS:
        _HOPPER_PLANS.clear()
    _HOPPER_PLANS[geometry] = config


def _fastest(candidates: dict[Any, Any]) -> Any:
    """The key of the fastest launch in `candidates` (key -> zero-argument launch). Each runs once
    untimed (compiles; an autotuned kernel tunes its tiles), then briefly under do_bench; on a tie
    the first listed wins."""
    times = {}
    for name, fn in candidates.items():
        fn()
        times[name] = triton.testing.do_bench(fn, warmup=5, rep=20)
    return min(times, key=times.get)


def _choice_key(q: Any, d: int, causal: bool, mask: Any, s_q: int, s_kv: int) -> tuple:
    """Autotuning key: dtype, head dim, masks, and buckets of both lengths and of B·H."""
    bh = _bucket(int(q.shape[0]) * int(q.shape[1]))
    return (str(q.dtype), d, bool(causal), mask is not None, _bucket(s_q), _bucket(s_kv), bh)


def _launch_hopper(
    q: Any, k: Any, v: Any, out: Any, scale: float, causal: bool, config: HopperConfig
) -> None:
    """Run the warp-specialized Hopper kernel (imported here: it needs Triton's Gluon dialect)."""
    from trtforge.kernels import flash_attention_hopper as kernel_hopper

    kernel_hopper.launch(q, k, v, out, scale, causal, config)


def _hopper_wins(q: Any, k: Any, v: Any, out: Any, mask: Any, scale: float, causal: bool) -> bool:
    """Time every Hopper config and both portable variants once per problem key; True if a Hopper
    config won (then it is in _VARIANT_CHOICE)."""
    s_q, d = int(q.shape[2]), int(q.shape[3])
    key = _choice_key(q, d, causal, mask, s_q, int(k.shape[2]))
    if key not in _VARIANT_CHOICE:
        cands: dict[Any, Any] = {
            c: functools.partial(_launch_hopper, q, k, v, out, scale, causal, c)
            for c in hopper_configs(d, causal)
        }
        for name in ("tma", "pointer"):
            cands[name] = functools.partial(_launch, q, k, v, out, mask, scale, causal, None, name)
        _VARIANT_CHOICE[key] = _fastest(cands)
    return isinstance(_VARIANT_CHOICE[key], HopperConfig)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    causal: bool = False,
    out: torch.Tensor | None = None,
    config: AnyConfig | None = None,
    variant: str = "auto",
) -> torch.Tensor:
    """softmax(q·kᵀ·scale [+ masks])·v for [B, H, S, D] tensors of any strides; returns [B, H, S_q, D].

    `scale` defaults to 1/sqrt(D). `key_padding_mask` is [B, S_kv], nonzero = keep. `out` may be any
    strided [B, H, S_q, D] view (e.g. of a [B, S, H·D] buffer). With `config` None the launch is
    autotuned (cached per shape bucket): on an H100/H200, where the Hopper kernel applies, over its
    configs and the portable kernel's; elsewhere over :data:`AUTOTUNE_CONFIGS`. Triton's interpreter
    uses :func:`default_config`. `variant` is "auto", "tma", "pointer" (the portable kernel's
    variants) or "hopper" (see the module docstring); with a KernelConfig, "auto" means
    ``config.tma``; a HopperConfig runs the Hopper kernel where eligible, else the default config.
    """
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    d = int(q.shape[-1])
    _launch(q, k, v, out, key_padding_mask, d**-0.5 if scale is None else scale, causal, config, variant)
    return out


def flash_attention_raw(
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    out: DeviceTensor,
    key_padding_mask: DeviceTensor | None = None,
    *,
    scale: float,
    causal: bool,
    stream: int,
    config: AnyConfig | None = None,
    variant: str = "auto",
) -> None:
    """Launch on raw device buffers, asynchronously, on the CUDA stream handle `stream` (an int).

    This is the entry a TensorRT plugin's ``enqueue`` uses: TensorRT owns the memory and the stream.
    Pass `config` to launch one fixed configuration (no autotuning, nothing timed, safe under CUDA
    graph capture); None autotunes on first use of a shape bucket, timing on `stream`.
    """
    with _on_stream(stream):
        _launch(q, k, v, out, key_padding_mask, scale, causal, config, variant)


@contextlib.contextmanager
def _on_stream(stream: int) -> Any:
    """Make `stream` (a raw cudaStream_t) torch's, hence Triton's, current stream."""
    if not stream:
        yield
        return
    ext = torch.cuda.ExternalStream(int(stream))
    with torch.cuda.stream(ext):
        yield
