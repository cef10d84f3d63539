"""Triton decode attention (FlashDecoding): split-KV over a contiguous or paged cache, with GQA.

One query step of 1..8 tokens per sequence reads that sequence's whole K/V cache, so decode is bound
by memory bandwidth, and a (batch x kv-head) grid leaves most SMs idle at small batch. Each program
therefore takes one (batch, kv head, split) triple: it attends to one contiguous chunk of the keys
and writes a normalized partial output plus its log-sum-exp to the workspace. Fused reduction: each
program then increments its (batch, kv head)'s arrival counter (acquire-release), and the last one
to arrive rescales and sums every split's partials into the output and puts the counter back to 0,
so that zeroed counters stay zero from launch to launch (they must be zero when a launch starts).
Where no zeroed counters exist (a TensorRT workspace, which holds anything at enqueue; CUDA-graph
capture without a caller's workspace), a second kernel reduces instead: zeroing counters at each
launch measured slower than that kernel on the H200. With one split the kernel writes the output
directly.

GQA: the ``num_heads / kv_num_heads`` query heads that share a kv head, times the query length, are
the rows (M dimension) of one tile, so each K/V tile is loaded once for the whole group and both
products run on the tensor cores (rows padded to at least 16).

Causal alignment is LOWER_RIGHT: with context length L (the new tokens included) and q_len S_q,
query i sees keys j <= L - S_q + i. A row that sees no key gets zeros. With a sliding window W it
also sees only keys j > L - S_q + i - W, and the splits share out only those keys. With attention chunks
of C positions (Llama 4's chunked layers) the query at position p sees only the keys of its own chunk,
j >= p - p % C (each row's first key; the same WINDOW machinery with another first key), and the splits
share out only the keys some row sees.

FP8 (E4M3) pools: their codes are widened in registers and both products run in FP16 (the query is
scaled by the softmax scale, times the pool's K scale, and rounded to FP16; p is rounded to FP16 before
P.V), whatever the query's type. Hopper widens two E4M3 codes to FP16 in one ``cvt.rn.f16x2.e4m3x2``;
reaching BF16 costs two more conversions an element pair, at the conversion units' lower rate. With
BF16 products the kernel read FP8 pools no faster than BF16 ones (1.6-2.3 TB/s, session 12); FP16
products took 16% off the serving launch at 256 x 1,024 keys, and with 128-key tiles
(:data:`FP8_KV_DECODE_CONFIG`) it runs 1.6x faster than over BF16 pools (session 18, H200). FP16 holds
every E4M3 value exactly and rounds the scaled query and p more finely than BF16; the scaled query is
clamped to FP16's range (a logit beyond it saturates the softmax either way). ``FP8_KV_F16 = False``
restores the BF16 products (a benchmark's A/B). The chunked-prefill kernel, which shares the tile
loop, does the same over FP8 pools (:func:`fp16_products`).

FP8 V as 16-bit pairs (:data:`FP8_V_PAIRS`): P.V's B operand wants two consecutive keys of one channel
in a register, which one-byte codes laid out channels-last give only by byte loads from shared memory
(256 of them a 128-key tile a thread on 2 warps, and as many byte packs). Read as int16, each element
holds one key's even and odd channel; 16-bit elements reach the MMA layout by ``ldmatrix.trans``, and two
of them (consecutive keys) split into an even-channel and an odd-channel FP16 pair by one byte permute
and one ``cvt.rn.f16x2.e4m3x2`` each (:func:`fp8_pair_halves`). P.V then runs as two products of half
the width whose columns are the even and the odd channels, interleaved back once after the tile loop.
On the H200 (benchmarks/bench_kv_fp8.py --serving-sweep --ab, results/kv_fp8_pairs_s31.json) the served
launch took 263 us at 256 x 2,048 keys (4.09 TB/s) against 310 as bytes, 0.83x geometric mean over six
served shapes; on sm_90 the 2-warp launch no longer spills.

Contiguous caches that TMA can read (``DecodeConfig.tma``) load their whole tiles through tensor
descriptors of the ``[B·Hkv·S_max, D]`` view; ragged and causal-tail tiles keep masked pointer loads.

Caches (strides in elements, so either axis order of the pool works):
- contiguous: k/v ``[B, Hkv, S_max, D]`` with per-sequence lengths ``seq_lens [B]`` int32.
- paged: a block pool k/v ``[num_blocks, block_size, Hkv, D]`` (the step graph's and the executors'
  layout) and ``block_table [B, max_blocks]`` int32; logical position j of sequence b is slot
  ``j % block_size`` of block ``block_table[b, j // block_size]``. The entry points pass the kernels
  a ``[num_blocks, Hkv, block_size, D]`` strided view of it (:func:`pool_heads_major`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from trtforge.kernels import interpreting
from trtforge.kernels.configs import (
    DECODE_CANDIDATES,
    DECODE_TMA_CANDIDATES,
    MAX_Q_LEN,
    decode_counter_slots,
)
from trtforge.kernels.device_tensor import pool_heads_major
from trtforge.kernels.kv_quant import FP8_KV_DTYPE
from trtforge.kernels.prepared_launch import Operand, PreparedLaunch, arg_index

__all__ = [
    "DecodeConfig",
    "decode_attention",
    "decode_attention_raw",
    "default_decode_config",
    "num_splits_for",
    "prepare_paged_decode",
    "workspace_elements",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
MAX_SPLITS = 256
MIN_SPLIT_TOKENS = 256  # fewer keys per split than this costs more in the reduction than it gains
FP8_KV_F16 = True  # FP8 pools: products in FP16 (module docstring); False: in the query's type
FP8_V_PAIRS = True  # FP8 V read as 16-bit pairs of adjacent channels (module docstring); False: as bytes


@dataclass(frozen=True)
class DecodeConfig:
    """One launch configuration: keys per tile, warps and pipeline depth; `num_splits` 0 = heuristic;
    `fused` False reduces the splits in a second kernel instead of in each group's last program;
    `tma` loads a contiguous cache's whole tiles by bulk tensor copies where eligible; `early_kv`: a
    programmatic dependent launch over a paged pool reads its block-table entries and prefetches its
    first tile's K/V lines into L2 *before* it waits for the previous kernel (which writes q and the new
    keys, never the table or older keys), so that DRAM latency overlaps that kernel. A prefetch is a
    hint: the loads after the wait read whatever L2 holds then, so the outputs do not change."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    num_splits: int = 0
    fused: bool = True
    tma: bool = False  # full tiles of a contiguous cache through tensor descriptors (Hopper's TMA)
    early_kv: bool = False  # (PDL, paged) the first tile prefetched before the wait


# The fixed launch over FP8 pools (the serving path's, graph-captured) for head dims up to 128; a
# module setting so that a benchmark can try another before the graphs are captured. An FP8 tile of
# 128 keys holds the bytes of a BF16 one of 64. H200 sweep (benchmarks/bench_kv_fp8.py --serving-sweep,
# results/kv_fp8_sweep_s18.json; Hq 32 / Hkv 8 / D 128, 16-token pages): best at all six served shapes,
# 0.65x the BF16 default's time (geometric mean): 256 x 1,024 keys 175 us (3.06 TB/s of FP8 bytes)
# against 271, 241 x 256 54 against 82, 64 x 8,192 324 against 521 (3.32 TB/s), 1 x 32,768 32 against 41.
FP8_KV_DECODE_CONFIG = DecodeConfig(block_n=128, num_warps=4, num_stages=2)
# ... and, with at least FP8_KV_TWO_WARPS_MIN_PAIRS (sequence, kv head) pairs at one query a sequence, the
# same tiles on 2 warps. H200 (bench_kv_fp8.py --serving-sweep; results/kv_fp8_sweep_s25.json), us, 4 warps
# -> 2, V as bytes: 256 x 1,024 keys 178.2 -> 170.2, 256 x 2,048 341.9 -> 325.5, 64 x 8,192 334.1 -> 321.5,
# but 241 x 256 53.9 -> 55.4, so up to SHORT_DECODE_KEYS keys kept 4 warps then. With V as 16-bit pairs
# (results/kv_fp8_pairs_s31.json, same call) 2 warps win there too (241 x 256: 47.1 -> 44.6; 256 x 2,048:
# 298.1 -> 262.7); not for one sequence (1 x 32,768: 28.5 -> 33.7, below the pair count). Verification
# rows keep 4 warps (default_decode_config's q_len): on sm_90 2 warps spilled 904 bytes at 8 queries a
# sequence (bytes V). FP8_KV_TWO_WARPS_MIN_PAIRS = inf keeps 4 warps everywhere.
FP8_KV_MANY_PAIRS_DECODE_CONFIG = DecodeConfig(block_n=128, num_warps=2, num_stages=2)
FP8_KV_TWO_WARPS_MIN_PAIRS = 512


def fp16_products(kv_dtype: torch.dtype) -> bool:
    """Whether attention over pools of `kv_dtype` runs its products in FP16 (FP8 pools, ``FP8_KV_F16``):
    the decode and chunked-prefill kernels' KV_F16."""
    return FP8_KV_F16 and kv_dtype == FP8_KV_DTYPE


# 16-bit pools, head dims up to 128: the tile follows the keys a launch may see (its block table's
# width), when the caller passes them. H200 sweeps (benchmarks/sweep_paged_decode_splits.py, results/
# paged_decode_configs_s24.json and _s24_mid.json; Hq 32 / Hkv 8 / D 128, pages of 16, heuristic splits),
# against the 64-key tiles over 3 stages that served every length before: at 190 keys 32-key tiles over
# 4 stages took 64.4 us for 241 rows and 106.8 for 425 (64-key: 67.8, 110.3; 128-key: 71.3, 111.5); from
# 300 keys 128-key tiles over 2 stages win: 256 rows at 300 keys 101.0 us (105.0), at 600 166.4 (187.7),
# at 1,000 264.1 (288.7), 62 rows at 2,100 keys 147.7 (159.9). DECODE_CONFIG_BY_KEYS False keeps 64-key
# tiles everywhere (a module setting, for benchmarks to compare before the graphs are captured).
SHORT_KEYS_DECODE_CONFIG = DecodeConfig(block_n=32, num_warps=4, num_stages=4)
LONG_KEYS_DECODE_CONFIG = DecodeConfig(block_n=128, num_warps=4, num_stages=2)
SHORT_DECODE_KEYS = 256  # up to this many keys: SHORT_KEYS_DECODE_CONFIG; past it LONG_KEYS_DECODE_CONFIG
DECODE_CONFIG_BY_KEYS = True


def default_decode_config(
    head_dim: int,
    kv_dtype: torch.dtype | None = None,
    max_keys: int | None = None,
    batch_kv_heads: int | None = None,
    q_len: int = 1,
) -> DecodeConfig:
    """The configuration used without an explicit one: smaller tiles where a wide D fills registers;
    FP8 pools: :data:`FP8_KV_DECODE_CONFIG`, on 2 warps for many (sequence, kv head) pairs at one query a
    sequence (:data:`FP8_KV_MANY_PAIRS_DECODE_CONFIG`, when `batch_kv_heads` is given; more query rows
    spill on 2 warps); 16-bit pools over up to `max_keys` keys (when given): short tiles for short
    contexts and long ones for long (:data:`DECODE_CONFIG_BY_KEYS`)."""
    if kv_dtype == FP8_KV_DTYPE and head_dim <= 128:
        pairs = batch_kv_heads if q_len == 1 else None
        if pairs is not None and pairs >= FP8_KV_TWO_WARPS_MIN_PAIRS:
            return FP8_KV_MANY_PAIRS_DECODE_CONFIG
        return FP8_KV_DECODE_CONFIG
    if head_dim > 128:
        return DecodeConfig(block_n=32, num_warps=4, num_stages=2)
    if max_keys is not None and DECODE_CONFIG_BY_KEYS:
        return SHORT_KEYS_DECODE_CONFIG if max_keys <= SHORT_DECODE_KEYS else LONG_KEYS_DECODE_CONFIG
    return DecodeConfig(block_n=64, num_warps=4, num_stages=3)


def num_splits_for(batch_kv_heads: int, max_len: int, num_sms: int, block_n: int) -> int:
    """Splits per (batch, kv head): about 2 programs per SM (rounded down) while B·Hkv <= 2 per SM,
    then enough for about 4 per SM (2 splits up to B·Hkv = 4 per SM, then 1); each >= 256 keys.

    Measured on the H200 (benchmarks/results/decode_attention.md, split sweep, 64-key tiles): 32
    splits at B·Hkv = 8 (40 us; 64 splits: 47 us), 8 at 32 (68 us; 16: 78 us), 1-2 at 128 (67-68 us;
    5: 73 us), 2-4 at 512 (494-501 us; 1: 555 us). The chunk is a whole number of tiles, and the
    count is trimmed so that no split is left empty.
    """
    tiles = max(1, triton.cdiv(max(max_len, 1), block_n))
    bh = max(batch_kv_heads, 1)
    want = (2 * num_sms) // bh if bh <= 2 * num_sms else triton.cdiv(4 * num_sms, bh)
    splits = max(1, min(want, triton.cdiv(max_len, MIN_SPLIT_TOKENS), tiles, MAX_SPLITS))
    per_split = triton.cdiv(tiles, splits)
    return triton.cdiv(tiles, per_split)


@triton.jit
def fp16_query(q, qk_scale):
    """The query times `qk_scale`, clamped to FP16's range and rounded to FP16: over FP8 pools the scale
    rides in q, so the codes widen straight to FP16 (one cvt a pair) and both products run in FP16."""
    return tl.clamp(q.to(tl.float32) * qk_scale, -65504.0, 65504.0).to(tl.float16)


@triton.jit
def softcap_scores(qk, cap):
    """Logit soft-capping of base-2 scores: ``cap * tanh(qk / cap)`` with `qk` the scores q.k * scale
    times log2(e) and `cap` the cap times log2(e), i.e. Gemma 2's ``c * tanh(s / c)`` on the natural
    scores s, then in base 2. tanh(x) = 1 - 2 / (exp(2x) + 1): exp2 only (no libdevice tanh, so the
    interpreter runs it too); exp(2x) overflowing to inf gives 1, underflowing to 0 gives -1."""
    e = tl.math.exp2(qk * (2.0 * 1.4426950408889634 / cap))
    return cap * (1.0 - 2.0 / (e + 1.0))


def _per_head_vector(what: str, t: Any, num_heads: int, q: Any) -> torch.Tensor | None:
    """None for None, else `t` itself, which must be a contiguous float32 ``[num_heads]`` tensor on the
    device of the query `q` (ValueError naming `what` otherwise). `q` is only looked at when `t` is given:
    a DeviceTensor view (the TensorRT plugin's) has no device and never takes a per-head vector."""
    if t is None:
        return None
    device = getattr(q, "device", None)
    if device is None:
        raise ValueError(f"{what} need the query as a torch tensor; got {type(q).__name__}")
    ok = (
        isinstance(t, torch.Tensor)
        and t.dtype == torch.float32
        and tuple(t.shape) == (num_heads,)
        and t.is_contiguous()
        and t.device == device
    )
    if not ok:
        got = (
            f"{t.dtype} {tuple(t.shape)} stride {t.stride()} on {t.device}"
            if isinstance(t, torch.Tensor)
            else t
        )
        raise ValueError(
            f"{what} must be a contiguous float32 [{num_heads}] tensor (one per query head) on {device}; "
            f"got {got}"
        )
    return t


def check_alibi_slopes(slopes: Any, num_heads: int, q: Any) -> torch.Tensor | None:
    """The ALiBi slopes a kernel launch takes (:func:`_per_head_vector`): one slope a query head,
    natural-scale: the score of a query at position p and a key at position j gets ``slope * (j - p)``."""
    return _per_head_vector("ALiBi slopes", slopes, num_heads, q)


def check_sinks(sinks: Any, num_heads: int, q: Any) -> torch.Tensor | None:
    """The attention sinks a kernel launch takes (gpt-oss; :func:`_per_head_vector`): one learned logit a
    query head (natural units, beside the scaled scores) that joins each row's softmax denominator as an
    extra column with no value."""
    return _per_head_vector("attention sinks", sinks, num_heads, q)


def key_bound(window: int | None, chunk: int | None, capacity: int) -> tuple[int, bool]:
    """The kernels' `window` argument and CHUNK flag for a layer's sliding `window` or attention `chunk`
    (at most one of them) over a cache of `capacity` positions: (0, False) where neither hides a key (a
    window or chunk as long as the cache), else (W, False) or (C, True). ValueError below 1, or both."""
    if window is not None and chunk is not None:
        raise ValueError(f"a layer has a sliding window ({window}) or attention chunks ({chunk}), not both")
    if window is not None and int(window) < 1:
        raise ValueError(f"sliding window must be >= 1 keys; got {window}")
    if chunk is not None and int(chunk) < 1:
        raise ValueError(f"attention chunk must be >= 1 positions; got {chunk}")
    bound = window if window is not None else chunk
    if bound is None or int(bound) >= capacity:
        return 0, False
    return int(bound), chunk is not None


def check_softcap(softcap: float | None) -> float:
    """The soft-cap a kernel launch takes: 0.0 for None (off), else `softcap` (ValueError unless it is a
    finite number > 0: ``cap * tanh(s / cap)`` is undefined at 0)."""
    if softcap is None:
        return 0.0
    cap = float(softcap)
    if not (cap > 0.0 and cap != float("inf")):
        raise ValueError(f"attention soft-cap must be a finite number > 0 (or None: off); got {softcap}")
    return cap


# One output half of fp8_pair_halves, two int16 elements at a time: the byte permute picks both keys'
# even (0x0020) or odd (0x0031) channel codes into one 16-bit pair, which one cvt widens to FP16.
_PAIR_HALF_PTX = (
    "{{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, $1, 0, {}; mov.b32 {{lo, hi}}, t; "
    "cvt.rn.f16x2.e4m3x2 $0, lo; }}"
)
EVEN_PAIR_PTX = tl.constexpr(_PAIR_HALF_PTX.format("0x0020"))
ODD_PAIR_PTX = tl.constexpr(_PAIR_HALF_PTX.format("0x0031"))


@triton.jit
def _pair_half(v16, PTX: tl.constexpr):
    """The FP16 values of one channel of each int16 code pair of `v16`, by the inline PTX `PTX`."""
    return tl.inline_asm_elementwise(PTX, "=r,r", [v16], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def fp8_pair_halves(v16, ASM: tl.constexpr):
    """Each int16 of `v16` holds two adjacent E4M3 codes (a head dim's even and odd channel of one key):
    their FP16 values as two tensors of `v16`'s shape (even, odd). ASM (CUDA): two elements at a time,
    one byte permute and one ``cvt.rn.f16x2.e4m3x2`` per output pair; else integer ops and casts (the
    interpreter, which runs no PTX)."""
    if ASM:
        even = _pair_half(v16, EVEN_PAIR_PTX)
        odd = _pair_half(v16, ODD_PAIR_PTX)
    else:
        even = (v16 & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        odd = ((v16 >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return even, odd


@triton.jit
def _load_tile(ptrs, desc, row, n_ok, d_ok, MASKED: tl.constexpr, TMA: tl.constexpr, FULL_D: tl.constexpr):
    """One K or V tile of keys x channels: MASKED bounds the keys (`n_ok`) and channels (`d_ok`); TMA
    takes it whole from the descriptor `desc` at `row`; else only channels past the head dim are masked
    (none when FULL_D)."""
    if MASKED:
        tile = tl.load(ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    elif TMA:
        tile = desc.load([row, 0])
    elif not FULL_D:
        tile = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _attend_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    k_desc,
    v_desc,
    desc_row,
    table_base,
    lo,
    hi,
    last_key,
    first_key,
    qk_scale,
    softcap,
    alibi,
    stride_kb,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vd,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_F32: tl.constexpr,
    TMA: tl.constexpr,
    WINDOW: tl.constexpr,
    V_PAIRS: tl.constexpr,
    PAIRS_ASM: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
):
    """Fold keys [lo, hi) into (acc, l_i, m_i). MASKED tiles bound loads by `hi` and hide keys past
    each row's `last_key` (LOWER_RIGHT causal) and, WINDOW, before its `first_key`; unmasked ones
    are wholly visible to every row. TMA:
    unmasked tiles come from the descriptors, key n of this (batch, kv head) at row desc_row + n.
    V_PAIRS (FP8 V, :func:`v_pairs_options`): V read as int16 pairs of adjacent channels and P.V as an
    even- and an odd-channel product (PAIRS_ASM: split by inline PTX), interleaved back into acc.
    SOFTCAP: the base-2 scores are soft-capped by `softcap` (:func:`softcap_scores`) before the masks.
    ALIBI: each row's base-2 slope `alibi` [BLOCK_M] times (key - the row's query position, `last_key`) is
    added to its scores after the cap, before the masks (<= 0 on every key the row sees)."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    if V_PAIRS:
        acc_even, acc_odd = tl.split(tl.reshape(acc, [acc.shape[0], BLOCK_D // 2, 2]))
        v16_base = v_base.to(tl.pointer_type(tl.int16))
        offs_j = tl.arange(0, BLOCK_D // 2)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        if PAGE_SIZE > 0:
            if MASKED:
                blk = tl.load(table_base + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
            else:
                blk = tl.load(table_base + offs_n // PAGE_SIZE).to(tl.int64)
            slot = offs_n % PAGE_SIZE
            k_rows = blk * stride_kb + slot * stride_kn
            v_rows = blk * stride_vb + slot * stride_vn
        else:
            k_rows = offs_n.to(tl.int64) * stride_kn
            v_rows = offs_n.to(tl.int64) * stride_vn
        k_ptrs = k_base + k_rows[:, None] + offs_d[None, :] * stride_kd
        k = _load_tile(k_ptrs, k_desc, desc_row + start_n, n_ok, d_ok, MASKED, TMA, BLOCK_D == HEAD_DIM)
        if V_PAIRS:  # whole rows of 16-bit code pairs (BLOCK_D == HEAD_DIM, no TMA)
            if PAGE_SIZE > 0:
                v16_rows = blk * (stride_vb // 2) + slot * (stride_vn // 2)
            else:
                v16_rows = offs_n.to(tl.int64) * (stride_vn // 2)
            v16_ptrs = v16_base + v16_rows[:, None] + offs_j[None, :]
            if MASKED:
                v16 = tl.load(v16_ptrs, mask=n_ok[:, None], other=0)
            else:
                v16 = tl.load(v16_ptrs)
        else:
            v_ptrs = v_base + v_rows[:, None] + offs_d[None, :] * stride_vd
            v = _load_tile(v_ptrs, v_desc, desc_row + start_n, n_ok, d_ok, MASKED, TMA, BLOCK_D == HEAD_DIM)
            v = v.to(q.dtype)
        # FP8 pools: widened in registers to the query's type (exact); their scales are applied outside
        k = k.to(q.dtype)
        q_op, k_op = (q.to(tl.float32), k.to(tl.float32)) if DOT_F32 else (q, k)
        qk = tl.dot(q_op, tl.trans(k_op))
        qk = qk * qk_scale
        if SOFTCAP:
            qk = softcap_scores(qk, softcap)
        if ALIBI:
            qk += alibi[:, None] * (offs_n[None, :] - last_key[:, None]).to(tl.float32)
        if MASKED:
            keep = (offs_n[None, :] <= last_key[:, None]) & n_ok[None, :]
            if WINDOW:
                keep = keep & (offs_n[None, :] >= first_key[:, None])
            qk = tl.where(keep, qk, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)  # rows that saw no key yet
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = m_ij
        p = tl.math.exp2(qk - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_PAIRS:
            v_even, v_odd = fp8_pair_halves(v16, PAIRS_ASM)
            p16 = p.to(tl.float16)
            acc_even = tl.dot(p16, v_even, acc_even * alpha[:, None])
            acc_odd = tl.dot(p16, v_odd, acc_odd * alpha[:, None])
        elif DOT_F32:
            acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc * alpha[:, None])
        else:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    if V_PAIRS:
        acc = tl.reshape(tl.join(acc_even, acc_odd), [acc.shape[0], BLOCK_D])
    return acc, l_i, m_i


@triton.jit
def _reduce_group(
    MidO,
    MidL,
    Out,
    base,
    b,
    hkv,
    num_splits,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    GROUP: tl.constexpr,
    SEQ_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TAIL_ROWS: tl.constexpr,
    TAIL_SPLITS: tl.constexpr,
):
    """Rescale and sum the `num_splits` partials of one query group's rows (workspace rows
    base + r·num_splits + s) into Out, TAIL_ROWS rows x TAIL_SPLITS splits at a time."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for r0 in range(0, GROUP * SEQ_Q, TAIL_ROWS):
        offs_r = r0 + tl.arange(0, TAIL_ROWS)
        r_ok = offs_r < GROUP * SEQ_Q
        m = tl.full([TAIL_ROWS], float("-inf"), dtype=tl.float32)
        total = tl.zeros([TAIL_ROWS], dtype=tl.float32)
        acc = tl.zeros([TAIL_ROWS, BLOCK_D], dtype=tl.float32)
        for s0 in range(0, num_splits, TAIL_SPLITS):
            offs_s = s0 + tl.arange(0, TAIL_SPLITS)
            ok = r_ok[:, None] & (offs_s < num_splits)[None, :]
            row = base + offs_r[:, None] * num_splits + offs_s[None, :]
            # .cg: read the other programs' partials from L2, never from a stale L1 line
            lse = tl.load(MidL + row, mask=ok, other=float("-inf"), cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows no split saw a key for
            alpha = tl.math.exp2(m - m_sub)
            w = tl.math.exp2(lse - m_sub[:, None])  # 0 for empty splits and padding
            parts = tl.load(
                MidO + row[:, :, None] * BLOCK_D + offs_d[None, None, :],
                mask=ok[:, :, None] & d_ok[None, None, :],
                other=0.0,
                cache_modifier=".cg",
            )
            acc = acc * alpha[:, None] + tl.sum(parts * w[:, :, None], 1)
            total = total * alpha + tl.sum(w, 1)
            m = m_new
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        hq = hkv * GROUP + offs_r // SEQ_Q
        qi = offs_r % SEQ_Q
        o_ptrs = Out + b * stride_ob + hq[:, None] * stride_oh + qi[:, None] * stride_om
        tl.store(
            o_ptrs + offs_d[None, :] * stride_od,
            out.to(Out.dtype.element_ty),
            mask=r_ok[:, None] & d_ok[None, :],
        )


@triton.jit
def _prefetch_first_tile(
    k_base,
    v_base,
    table_base,
    lo,
    hi,
    stride_kb,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vd,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PF_LINES: tl.constexpr,
    PF_ELEMS: tl.constexpr,
):
    """``prefetch.global.L2`` of the 128-byte lines of keys [lo, min(lo + BLOCK_N, hi)) in a paged K and
    V pool (PF_LINES lines of PF_ELEMS elements a row); keys past `hi` prefetch block 0's (harmless)."""
    offs_n = lo + tl.arange(0, BLOCK_N)
    blk = tl.load(table_base + offs_n // PAGE_SIZE, mask=offs_n < hi, other=0).to(tl.int64)
    slot = offs_n % PAGE_SIZE
    line = (tl.arange(0, PF_LINES) * PF_ELEMS)[None, :]
    _prefetch_l2(k_base + (blk * stride_kb + slot * stride_kn)[:, None] + line * stride_kd)
    _prefetch_l2(v_base + (blk * stride_vb + slot * stride_vn)[:, None] + line * stride_vd)


@triton.jit
def _prefetch_l2(ptrs):
    """``prefetch.global.L2`` of every address in `ptrs` (no registers, no wait)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; // dummy $0",
        "=r,l",
        [ptrs.to(tl.int64)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


# Per-step arguments (split count, window, block-table width, metadata pointers) are not specialized on:
# a specialization first met mid-run cost a ~1 s compile in a serving step (results/serving.md).
@triton.jit(
    do_not_specialize=["num_splits", "window", "stride_tb"],
    do_not_specialize_on_alignment=["SeqLens", "Table", "Counters"],
)
def _decode_split_kernel(
    Q,
    K,
    V,
    KDesc,
    VDesc,
    SeqLens,
    Table,
    Out,
    MidO,
    MidL,
    Counters,
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
    stride_tb,
    num_kv_heads,
    num_splits,
    window,
    qk_scale,
    v_scale,
    softcap,
    Slopes,
    Sinks,
    GROUP: tl.constexpr,
    SEQ_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DIRECT: tl.constexpr,
    FUSED: tl.constexpr,
    TAIL_ROWS: tl.constexpr,
    TAIL_SPLITS: tl.constexpr,
    DOT_F32: tl.constexpr,
    TMA: tl.constexpr,
    WINDOW: tl.constexpr,
    KV_F16: tl.constexpr = False,
    V_PAIRS: tl.constexpr = False,
    PAIRS_ASM: tl.constexpr = False,
    PDL: tl.constexpr = False,
    STAMP: tl.constexpr = False,
    EARLY_KV: tl.constexpr = False,
    PF_LINES: tl.constexpr = 1,
    PF_ELEMS: tl.constexpr = 64,
    SOFTCAP: tl.constexpr = False,
    ALIBI: tl.constexpr = False,
    SINKS: tl.constexpr = False,
    CHUNK: tl.constexpr = False,
):
    """Grid (num_splits, B·Hkv): one program attends a query group to one chunk of one sequence;
    WINDOW: query i (position L - S_q + i) sees only its last `window` keys, and the splits share
    out only the keys some row sees; WINDOW and CHUNK: `window` is an attention chunk size C instead,
    query i (position p) sees only the keys j >= p - p % C of its own chunk;
    FUSED: the group's last program to finish reduces all its splits. TMA (contiguous caches laid
    out [B·Hkv·S_max, D]): KDesc/VDesc are that 2-D view's tensor descriptors, one tile per load.
    STAMP (a diagnostic for benchmarks/probe_decode_bandwidth.py; DIRECT contiguous launches only):
    MidO is an int64 [B·Hkv, 3] buffer that receives each pair's (start ns, end ns, SM id), and
    stride_tb (unread there) rotates the pairs over the programs. KV_F16 (FP8 pools): the query is
    scaled and rounded to FP16 up front, and the products run in FP16 (module docstring); V_PAIRS /
    PAIRS_ASM: FP8 V read as 16-bit pairs (:func:`v_pairs_options`). SOFTCAP: scores s (q.k times the
    softmax scale) become ``softcap * tanh(s / softcap)`` before the masks (Gemma 2). ALIBI: Slopes is a
    float32 [Hq] tensor (None when off) and the score of query position p, key j gets ``Slopes[hq] *
    (j - p)`` added after the cap, before the masks (BLOOM, MPT, falcon-rw). SINKS: Sinks is a float32
    [Hq] tensor (None when off) of attention-sink logits (gpt-oss): ``Sinks[hq]`` joins each row's softmax
    denominator once, as a key with no value; split 0 starts its running max and sum from it, so the
    reduction over the splits counts it once."""
    if PDL and not EARLY_KV:  # launched early (programmatic dependent launch): wait for its writes
        gdc_wait()
        gdc_launch_dependents()
    split = tl.program_id(0)
    pid = tl.program_id(1)
    if STAMP:  # program p takes pair (p + stride_tb) mod grid; it stamps the pair's row of MidO
        pid = (pid + stride_tb) % tl.num_programs(1)
        t_start = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
    b = (pid // num_kv_heads).to(tl.int64)
    hkv = (pid % num_kv_heads).to(tl.int64)
    seq_len = tl.load(SeqLens + b).to(tl.int32)

    if WINDOW and CHUNK:  # row 0 sees keys from the start of its chunk on (whole tiles from there)
        row0 = tl.maximum(seq_len - SEQ_Q, 0)
        kv_lo = ((row0 - row0 % window) // BLOCK_N) * BLOCK_N
    elif WINDOW:  # row 0 sees keys from L - S_q + 1 - window on (whole tiles from there)
        kv_lo = (tl.maximum(seq_len - SEQ_Q + 1 - window, 0) // BLOCK_N) * BLOCK_N
    else:
        kv_lo = 0
    tiles = tl.cdiv(seq_len - kv_lo, BLOCK_N)
    per_split = tl.cdiv(tiles, num_splits)
    lo = kv_lo + split * per_split * BLOCK_N
    hi = tl.minimum(lo + per_split * BLOCK_N, seq_len)
    # Keys every row sees: j <= L - S_q (LOWER_RIGHT) and, WINDOW, j >= L - window (the last row's
    # first key; CHUNK: the start of the last row's chunk). Whole tiles between run unmasked; those
    # before (head) and after (tail) masked.
    if WINDOW:
        if CHUNK:
            last_row = tl.maximum(seq_len - 1, 0)
            last_first = last_row - last_row % window
        else:
            last_first = seq_len - window
        head_end = tl.minimum(lo + tl.cdiv(tl.maximum(last_first - lo, 0), BLOCK_N) * BLOCK_N, hi)
    else:
        head_end = lo
    full_hi = tl.minimum(hi, seq_len - SEQ_Q + 1)
    full_end = tl.maximum(head_end + ((full_hi - head_end) // BLOCK_N) * BLOCK_N, head_end)
    if PDL and EARLY_KV:  # (paged) the first tile's lines into L2 while the previous kernel runs, then wait
        _prefetch_first_tile(
            K + hkv * stride_kh, V + hkv * stride_vh, Table + b * stride_tb, lo, hi, stride_kb, stride_kn,
            stride_kd, stride_vb, stride_vn, stride_vd, BLOCK_N, PAGE_SIZE, PF_LINES, PF_ELEMS,
        )  # fmt: skip
        gdc_wait()
        gdc_launch_dependents()

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    g = offs_m // SEQ_Q
    qi = offs_m % SEQ_Q
    row_ok = offs_m < GROUP * SEQ_Q
    hq = hkv * GROUP + g
    d_ok = offs_d < HEAD_DIM
    q_rows = b * stride_qb + hq * stride_qh + qi * stride_qm
    q_ptrs = Q + q_rows[:, None] + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    last_key = seq_len - SEQ_Q + qi
    if CHUNK:
        first_key = last_key - last_key % window
    else:
        first_key = last_key - window + 1 if WINDOW else last_key  # unread without WINDOW

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = qk_scale * 1.4426950408889634  # softmax in base 2
    if SOFTCAP:  # the cap in the scores' base-2 units
        softcap = softcap * 1.4426950408889634
    if ALIBI:  # each row's slope in the scores' base-2 units
        alibi = tl.load(Slopes + hq, mask=row_ok, other=0.0) * 1.4426950408889634
    else:
        alibi = l_i  # unread
    if SINKS:  # split 0's partial holds the sink: a running max of it and a sum of exp2(0) = 1
        sink = tl.load(Sinks + hq, mask=row_ok, other=0.0) * 1.4426950408889634
        m_i = tl.where(split == 0, sink, m_i)
        l_i = tl.where(split == 0, 1.0, l_i)
    if KV_F16:
        q = fp16_query(q, qk_scale)
        qk_scale = 1.0

    if PAGE_SIZE > 0:
        k_base = K + hkv * stride_kh
        v_base = V + hkv * stride_vh
    else:
        k_base = K + b * stride_kb + hkv * stride_kh
        v_base = V + b * stride_vb + hkv * stride_vh
    table_base = Table + b * stride_tb
    desc_row = (pid * (stride_kh // stride_kn)).to(tl.int32) if TMA else 0
    if WINDOW:
        acc, l_i, m_i = _attend_tiles(
            acc, l_i, m_i, q, k_base, v_base, KDesc, VDesc, desc_row, table_base, lo, head_end,
            last_key, first_key, qk_scale, softcap, alibi, stride_kb, stride_kn, stride_kd, stride_vb,
            stride_vn, stride_vd, HEAD_DIM, BLOCK_N, BLOCK_D, PAGE_SIZE, True, DOT_F32, False, True, V_PAIRS,
            PAIRS_ASM, SOFTCAP, ALIBI,
        )  # fmt: skip
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, k_base, v_base, KDesc, VDesc, desc_row, table_base, head_end, full_end,
        last_key, first_key, qk_scale, softcap, alibi, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn,
        stride_vd, HEAD_DIM, BLOCK_N, BLOCK_D, PAGE_SIZE, False, DOT_F32, TMA, False, V_PAIRS, PAIRS_ASM,
        SOFTCAP, ALIBI,
    )  # fmt: skip
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, k_base, v_base, KDesc, VDesc, desc_row, table_base, full_end, hi,
        last_key, first_key, qk_scale, softcap, alibi, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn,
        stride_vd, HEAD_DIM, BLOCK_N, BLOCK_D, PAGE_SIZE, True, DOT_F32, False, WINDOW, V_PAIRS, PAIRS_ASM,
        SOFTCAP, ALIBI,
    )  # fmt: skip

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc * (v_scale / l_safe)[:, None]  # v_scale: an FP8 pool's V scale (else 1)
    io_ok = row_ok[:, None] & d_ok[None, :]
    if DIRECT:
        o_ptrs = Out + b * stride_ob + hq[:, None] * stride_oh + qi[:, None] * stride_om
        tl.store(o_ptrs + offs_d[None, :] * stride_od, out.to(Out.dtype.element_ty), mask=io_ok)
        if STAMP:
            t_end = tl.inline_asm_elementwise(
                "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
            )
            sm = tl.inline_asm_elementwise(
                "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1
            )
            tl.store(MidO + pid * 3, t_start)
            tl.store(MidO + pid * 3 + 1, t_end)
            tl.store(MidO + pid * 3 + 2, sm.to(tl.int64))
    else:
        nq = num_kv_heads * GROUP
        row = ((b * nq + hq) * SEQ_Q + qi) * num_splits + split
        tl.store(MidO + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=io_ok)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))
        tl.store(MidL + row, lse, mask=row_ok)
        if FUSED:
            # Every thread's partial stores precede the counter's release; the program that takes
            # the count to num_splits acquires all of them (a fence at GPU scope each way).
            tl.debug_barrier()
            arrived = tl.atomic_add(Counters + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                base = (b * nq + hkv * GROUP) * SEQ_Q * num_splits
                _reduce_group(
                    MidO, MidL, Out, base, b, hkv, num_splits,
                    stride_ob, stride_oh, stride_om, stride_od,
                    GROUP, SEQ_Q, HEAD_DIM, BLOCK_D, TAIL_ROWS, TAIL_SPLITS,
                )  # fmt: skip
                tl.atomic_xchg(Counters + pid, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def _decode_reduce_kernel(
    MidO,
    MidL,
    Out,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    num_heads,
    num_splits,
    SEQ_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (B·Hq·S_q,): rescale each split's partial output by exp2(lse - max) and sum."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    qi = row % SEQ_Q
    hq = (row // SEQ_Q) % num_heads
    b = row // (SEQ_Q * num_heads)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    lse = tl.load(MidL + row * num_splits + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m_sub)  # 0 for empty splits
    parts = tl.load(
        MidO + (row * num_splits + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
        mask=s_ok[:, None],
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    o_ptrs = Out + b * stride_ob + hq * stride_oh + qi * stride_om + offs_d * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)


@functools.lru_cache(maxsize=8)
def _sm_count(device: int) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _num_sms() -> int:
    if interpreting() or not torch.cuda.is_available():
        return 132  # an H100/H200: the interpreter then exercises the same split counts
    return _sm_count(torch.cuda.current_device())


def _check(
    q: Any, k: Any, v: Any, seq_lens: Any, block_table: Any, out: Any, max_q_len: int = MAX_Q_LEN
) -> tuple[int, ...]:
    """Validate shapes/dtypes; return (B, Hq, S_q, D, Hkv, page_size, capacity)."""
    for name, t in (("q", q), ("k_cache", k), ("v_cache", v), ("out", out)):
        if len(t.shape) != 4:
            raise ValueError(f"{name} must be 4-D; got shape {tuple(t.shape)}")
    b, hq, s_q, d = (int(n) for n in q.shape)
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k_cache and v_cache must have one shape; got {tuple(k.shape)}, {tuple(v.shape)}")
    hkv, d_kv = int(k.shape[1]), int(k.shape[3])
    if d_kv != d:
        raise ValueError(f"cache head dim {d_kv} differs from the query's {d}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"kv heads ({hkv}) must divide query heads ({hq})")
    if not 1 <= s_q <= max_q_len:
        raise ValueError(f"query length {s_q} is outside 1..{max_q_len} (decode / speculative verification)")
    if not 0 < d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} is outside 1..{MAX_HEAD_DIM}")
    if tuple(out.shape) != (b, hq, s_q, d):
        raise ValueError(f"out must be [{b}, {hq}, {s_q}, {d}]; got {tuple(out.shape)}")
    dtypes = {q.dtype, out.dtype}
    if len(dtypes) != 1 or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q and out must share one dtype among {SUPPORTED_DTYPES}; got {dtypes}")
    if k.dtype != v.dtype or k.dtype not in (q.dtype, FP8_KV_DTYPE):
        raise ValueError(
            f"caches must both be {q.dtype} (q's dtype) or {FP8_KV_DTYPE}; got {k.dtype}, {v.dtype}"
        )
    if tuple(seq_lens.shape) != (b,) or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32 [B] = [{b}]; got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if block_table is None:
        if int(k.shape[0]) != b:
            raise ValueError(f"contiguous caches must be [B={b}, Hkv, S_max, D]; got {tuple(k.shape)}")
        return b, hq, s_q, d, hkv, 0, int(k.shape[2])
    page = int(k.shape[2])
    if page < 1 or page & (page - 1):
        raise ValueError(f"block size {page} must be a power of two (16, 32, 64, ...)")
    if len(block_table.shape) != 2 or int(block_table.shape[0]) != b or block_table.dtype != torch.int32:
        raise ValueError(
            f"block_table must be int32 [B, max_blocks] with B = {b}; got {block_table.dtype} "
            f"{tuple(block_table.shape)}"
        )
    return b, hq, s_q, d, hkv, page, int(block_table.shape[1]) * page


# Candidates timed by the autotuned launch (configs.DECODE_CANDIDATES); those whose pipelined K/V
# tiles exceed shared memory are skipped.
AUTOTUNE_CANDIDATES = DECODE_CANDIDATES
TMA_AUTOTUNE_CANDIDATES = DECODE_TMA_CANDIDATES  # besides, on contiguous caches TMA can read
SHARED_MEMORY_BUDGET = 225 * 1024
_CHOICE: dict[tuple, DecodeConfig] = {}
TUNING_TIMES: dict[tuple, dict[DecodeConfig, float]] = {}  # per key: each candidate's median ms


def _fits(block_n: int, stages: int, block_d: int, tma: bool = False, elem_bytes: int = 2) -> bool:
    """Whether the pipelined K/V tiles (`elem_bytes` an element: 1 for FP8 pools) fit in shared memory.
    Triton's pipeliner gives bulk tensor copies `stages - 1` buffers (sm_90 compiles: 128-key tiles, D
    128, 4 stages = 3 buffers, 200 KB with 8 KB of scratch); pointer loads are bounded by `stages`."""
    buffers = stages - 1 if tma else stages
    return buffers * 2 * block_n * block_d * elem_bytes + (8 * 1024 if tma else 0) <= SHARED_MEMORY_BUDGET


def _bucket(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _resolve_splits(cfg: DecodeConfig, batch_kv_heads: int, max_len: int) -> int:
    splits = cfg.num_splits or num_splits_for(batch_kv_heads, max_len, _num_sms(), cfg.block_n)
    return max(1, min(splits, MAX_SPLITS))


def workspace_elements(batch: int, num_heads: int, q_len: int, head_dim: int, splits: int) -> int:
    """4-byte elements of scratch a launch with `splits` > 1 needs: the fused reduction's arrival
    counters (int32, :func:`~trtforge.kernels.configs.decode_counter_slots`), then FP32
    partial outputs and log-sum-exps."""
    if splits <= 1:
        return 0
    block_d = max(16, triton.next_power_of_2(head_dim))
    return decode_counter_slots(batch, num_heads) + batch * num_heads * q_len * splits * (block_d + 1)


# Arrival counters of launches without a caller's workspace, one zeroed set per (device, stream):
# launches on one stream run in order, and each leaves its counters zero for the next.
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def _stream_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """`n` zeroed int32 counters for a launch on the current stream; None under CUDA-graph capture,
    where the reduction runs as a second kernel: counters of a graph's own would need a captured
    memset at each replay, which measured slower than the reduce kernel (results/decode_attention.md).
    Counters zeroed once outside capture and shared by every captured launch of an executor measured no
    faster either (session 56, 8B single stream on an H100: BF16 +0.1%, FP8 +0.6%;
    results/quant_ab_s56_h100.json)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.index if device.index is not None else -1, stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(_bucket(n), dtype=torch.int32, device=device)
    return buf


def _workspace_views(workspace: Any, counters: int, rows: int, block_d: int) -> tuple[Any, Any, Any]:
    """(counters int32 [counters], partial outputs [rows, block_d], lse [rows]) in a 4-byte
    `workspace`: a torch tensor or a float32 DeviceTensor."""
    if isinstance(workspace, torch.Tensor):
        flat = workspace.view(-1)
        mid_o = flat[counters : counters + rows * block_d].view(torch.float32).view(rows, block_d)
        mid_l = flat[counters + rows * block_d : counters + rows * (block_d + 1)].view(torch.float32)
        return flat[:counters].view(torch.int32), mid_o, mid_l
    cnt = workspace.view((counters,), (1,), dtype=torch.int32)
    mid_o = workspace.view((rows, block_d), (block_d, 1), offset=counters)
    mid_l = workspace.view((rows,), (1,), offset=counters + rows * block_d)
    return cnt, mid_o, mid_l


def _tma_descriptors(k: Any, v: Any, block_n: int) -> tuple[Any, Any] | None:
    """Tensor descriptors of contiguous caches [B, Hkv, S_max, D] viewed as [B·Hkv·S_max, D] with
    [block_n, D] tiles, or None where TMA cannot read them (a DeviceTensor, strided or unaligned
    caches, a D that is no power of two or under 16 bytes a row, row indices past int32)."""
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return None
    rows, d = k.numel() // max(int(k.shape[-1]), 1), int(k.shape[-1])
    ok = (
        k.dtype != FP8_KV_DTYPE  # FP8 caches: pointer loads (no bulk-copy tiles of 1-byte elements tuned)
        and k.is_contiguous()
        and v.is_contiguous()
        and d & (d - 1) == 0
        and d * k.element_size() >= 16
        and 0 < rows < 2**31
        and k.data_ptr() % 16 == 0
        and v.data_ptr() % 16 == 0
    )
    if not ok:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor  # Triton >= 3.4; only TMA launches need it

    return tuple(TensorDescriptor(t, [rows, d], [d, 1], [block_n, d]) for t in (k, v))


def v_pairs_options(kv_dtype: torch.dtype, d: int, v: Any) -> dict[str, bool]:
    """The V_PAIRS / PAIRS_ASM constexprs of the decode and chunked-prefill kernels for a V cache `v`
    (4-D, channels last) of `kv_dtype` and head dim `d`: FP8 V is read as 16-bit pairs of adjacent
    channels (:data:`FP8_V_PAIRS`) where the products run in FP16, D is a power of two of at least 32 (each
    half-width product's N must reach the MMA's 16), the channels are contiguous and every other stride and
    the base address even; PAIRS_ASM on CUDA (inline PTX)."""
    pairs = (
        FP8_V_PAIRS
        and fp16_products(kv_dtype)
        and d >= 32
        and d == triton.next_power_of_2(d)
        and v.stride(3) == 1
        and all(st % 2 == 0 for st in v.stride()[:3])
        and v.data_ptr() % 2 == 0
    )
    return {"V_PAIRS": pairs, "PAIRS_ASM": pairs and not interpreting()}


def _split_options(
    cfg: DecodeConfig,
    group: int,
    s_q: int,
    d: int,
    page: int,
    direct: bool,
    fused: bool,
    tma: bool,
    window: int,
    pdl: bool,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    v_pairs: dict[str, bool] | None = None,
    softcap: float = 0.0,
    alibi: bool = False,
    sinks: bool = False,
    chunk: bool = False,
) -> dict[str, Any]:
    """The split kernel's constexprs and launch options: one definition for :func:`_launch` and the
    prepared launches of :func:`prepare_paged_decode`. The last program's reduction works on tiles
    of about 32 FP32 values a thread (TAIL_ROWS x TAIL_SPLITS partials at a time). `dtype` is the
    query's, `kv_dtype` the pools' (FP8 pools take FP16 products: ``FP8_KV_F16``); `v_pairs`: the V cache's
    :func:`v_pairs_options` (None: off), unused with TMA; `softcap` > 0: soft-capped scores (SOFTCAP);
    `alibi`: ALiBi position biases (ALIBI); `sinks`: attention-sink logits (SINKS); `chunk`: `window` is an
    attention chunk size (CHUNK)."""
    block_d = max(16, triton.next_power_of_2(d))
    v_pairs = v_pairs if v_pairs is not None and not tma else {"V_PAIRS": False, "PAIRS_ASM": False}
    tail = 1024 * cfg.num_warps
    tail_rows = min(triton.next_power_of_2(group * s_q), max(1, tail // block_d))
    return {
        "GROUP": group, "SEQ_Q": s_q, "HEAD_DIM": d, "BLOCK_D": block_d,
        "BLOCK_M": max(16, triton.next_power_of_2(group * s_q)), "BLOCK_N": cfg.block_n, "PAGE_SIZE": page,
        "DIRECT": direct, "FUSED": fused, "TAIL_ROWS": tail_rows,
        "TAIL_SPLITS": max(1, tail // (tail_rows * block_d)),
        "DOT_F32": interpreting() and dtype == torch.bfloat16, "TMA": tma, "WINDOW": window > 0, "PDL": pdl,
        "KV_F16": fp16_products(kv_dtype), **v_pairs, "SOFTCAP": softcap > 0.0, "ALIBI": alibi,
        "SINKS": sinks, "CHUNK": chunk and window > 0, "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages, "launch_pdl": pdl,
        "EARLY_KV": cfg.early_kv and pdl and page > 0 and not interpreting(),
        "PF_LINES": triton.next_power_of_2(max(1, -(-d * kv_dtype.itemsize // 128))),
        "PF_ELEMS": max(1, 128 // kv_dtype.itemsize),
    }  # fmt: skip


def _reduce_options(s_q: int, d: int, splits: int, pdl: bool) -> dict[str, Any]:
    """The reduce kernel's constexprs and launch options (grid: one program per query row)."""
    block_d = max(16, triton.next_power_of_2(d))
    return {
        "SEQ_Q": s_q, "HEAD_DIM": d, "BLOCK_D": block_d, "BLOCK_S": max(2, triton.next_power_of_2(splits)),
        "PDL": pdl, "num_warps": 4 if block_d >= 128 else 2, "launch_pdl": pdl,
    }  # fmt: skip


def _own_scratch(device: torch.device, rows: int, d: int, counters: int, fused: bool) -> tuple[Any, Any, Any]:
    """(partial outputs, log-sum-exps, arrival counters or None) of a launch without a caller's
    workspace: `rows` FP32 partials, and this stream's counters where the reduction is `fused` and
    the stream is not being captured."""
    block_d = max(16, triton.next_power_of_2(d))
    mid_o = torch.empty((rows, block_d), dtype=torch.float32, device=device)
    mid_l = torch.empty((rows,), dtype=torch.float32, device=device)
    return mid_o, mid_l, _stream_counters(device, counters) if fused else None


def _launch(
    q,
    k,
    v,
    seq_lens,
    block_table,
    out,
    scale,
    cfg,
    splits,
    workspace,
    zeroed=True,
    window=0,
    pdl=False,
    v_scale=1.0,
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    chunk=False,
) -> None:
    """Run the split kernel (and, unfused, the reduce kernel) with scratch from `workspace` (4-byte
    elements, at least workspace_elements(...); None: allocate, with this stream's counters).
    `zeroed` False: the workspace's counters hold anything, so the reduction runs unfused. `window`
    > 0: sliding-window attention over each query's last `window` keys (`chunk`: attention within chunks of
    `window` positions instead). `pdl`: programmatic dependent
    launches (each kernel waits for the previous one's writes on the device; Hopper and later).
    `scale` multiplies q . k (an FP8 pool's K scale folded in), `v_scale` the output (its V scale);
    `softcap` > 0 soft-caps the scaled scores (:func:`check_softcap`'s value); `alibi_slopes` (None: off)
    adds ALiBi position biases (:func:`check_alibi_slopes`'s value), `sinks` (None: off) attention-sink
    logits (:func:`check_sinks`'s value)."""
    b, hq, s_q, d = (int(n) for n in q.shape)
    hkv = int(k.shape[1])
    page = int(k.shape[2]) if block_table is not None else 0
    direct = splits == 1
    fused = cfg.fused and not direct
    rows = b * hq * s_q * splits
    counters = seq_lens  # never touched unless fused
    if direct:
        mid_o = mid_l = out  # never touched
    elif workspace is None:
        mid_o, mid_l, found = _own_scratch(q.device, rows, d, b * hkv, fused)
        fused = found is not None
        counters = found if fused else counters
    else:
        block_d = max(16, triton.next_power_of_2(d))
        cnt, mid_o, mid_l = _workspace_views(workspace, decode_counter_slots(b, hq), rows, block_d)
        fused = fused and zeroed
        if fused:
            counters = cnt
    table = block_table if block_table is not None else seq_lens
    stride_tb = int(block_table.stride(0)) if block_table is not None else 0
    descs = _tma_descriptors(k, v, cfg.block_n) if cfg.tma and page == 0 else None
    k_desc, v_desc = descs if descs is not None else (k, v)  # unread without TMA
    options = _split_options(
        cfg, hq // hkv, s_q, d, page, direct, fused, descs is not None, window, pdl, q.dtype, k.dtype,
        v_pairs_options(k.dtype, d, v), softcap, alibi_slopes is not None, sinks is not None, chunk,
    )  # fmt: skip
    _decode_split_kernel[(splits, b * hkv)](
        q, k, v, k_desc, v_desc, seq_lens, table, out, mid_o, mid_l, counters,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), stride_tb,
        hkv, splits, int(window), float(scale), float(v_scale), float(softcap), alibi_slopes, sinks,
        **options,
    )  # fmt: skip
    if not direct and not fused:
        _decode_reduce_kernel[(b * hq * s_q,)](
            mid_o, mid_l, out, *out.stride(), hq, splits, **_reduce_options(s_q, d, splits, pdl)
        )


def _key_of(q, k, block_table, max_len: int) -> tuple:
    """Autotuning key: dtypes, head dim, group, q_len, block size, buckets of B·Hkv and length, device."""
    b, hq, s_q, d = (int(n) for n in q.shape)
    hkv = int(k.shape[1])
    page = int(k.shape[2]) if block_table is not None else 0
    device = q.device.index if q.is_cuda else -1
    return (q.dtype, k.dtype, d, hq // hkv, s_q, page, _bucket(b * hkv), _bucket(max_len), device)


def _kernel_ms(fn: Any) -> float:
    """Median time of `fn` replayed from a CUDA graph (kernel time: a decode step is short enough that
    eager timing would measure Python launch overhead); eager CUDA-event timing if capture fails."""
    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=10, return_mode="median"))
    except RuntimeError:
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median"))


def _autotuned(
    q,
    k,
    v,
    seq_lens,
    block_table,
    out,
    scale,
    max_len,
    window=0,
    v_scale=1.0,
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    chunk=False,
) -> DecodeConfig:
    """The fastest candidate for this problem's key, timed once per key (each compiled and run once,
    then timed as CUDA-graph replays)."""
    b, _, _, d = (int(n) for n in q.shape)
    hkv = int(k.shape[1])
    key = _key_of(q, k, block_table, max_len)
    if key in _CHOICE:
        return _CHOICE[key]
    block_d = max(16, triton.next_power_of_2(d))
    base = num_splits_for(b * hkv, max_len, _num_sms(), 64)
    tma = block_table is None and _tma_descriptors(k, v, 64) is not None
    candidates = [(c, False) for c in AUTOTUNE_CANDIDATES]
    candidates += [(c, True) for c in TMA_AUTOTUNE_CANDIDATES] if tma else []
    times = {}
    for (bn, warps, stages, mult), use_tma in candidates:
        if not _fits(bn, stages, block_d, use_tma, k.element_size()):
            continue
        splits = 0 if mult == 1.0 else max(1, min(MAX_SPLITS, round(base * mult)))
        cfg = DecodeConfig(bn, warps, stages, splits, tma=use_tma)
        if cfg in times:
            continue
        n = _resolve_splits(cfg, b * hkv, max_len)

        def fn(cfg: DecodeConfig = cfg, n: int = n) -> None:
            _launch(
                q, k, v, seq_lens, block_table, out, scale, cfg, n, None,
                window=window, v_scale=v_scale, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                chunk=chunk,
            )  # fmt: skip

        try:
            fn()
        except triton.runtime.errors.OutOfResources:
            continue
        times[cfg] = _kernel_ms(fn)
    best = min(times, key=times.get) if times else default_decode_config(d, k.dtype)
    _CHOICE[key] = best
    TUNING_TIMES[key] = times
    return best


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    max_seq_len: int | None = None,
    window: int | None = None,
    pdl: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Attention of q [B, Hq, S_q<=8, D] over each sequence's first seq_lens[b] cached keys.

    Contiguous caches are [B, Hkv, S_max, D]; with `block_table` [B, max_blocks] the caches are a
    block pool [num_blocks, block_size, Hkv, D]. The caches have q's dtype or are FP8 E4M3
    (float8_e4m3fn) holding ``k / k_scale`` and ``v / v_scale`` (:mod:`.kv_quant`), read in place and
    widened in registers. Causal (LOWER_RIGHT) when S_q > 1. `max_seq_len`
    (default: the cache capacity) sizes the split count; `seq_lens` stays on the device. With
    `config` None, a CUDA launch outside graph capture is autotuned once per problem bucket over
    :data:`AUTOTUNE_CANDIDATES` (and, on a contiguous cache that tensor descriptors can read,
    :data:`TMA_AUTOTUNE_CANDIDATES`); the interpreter and graph capture use :func:`default_decode_config`.
    Eager launches reduce the splits inside the split kernel (with this stream's counters); a
    captured launch reduces them in a second kernel. `window` W (sliding-window layers): query i,
    at position L - S_q + i, sees only keys at positions > L - S_q + i - W. `softcap` c (Gemma 2's
    attention logit soft-capping): each score s = q . k * scale becomes c * tanh(s / c) before the
    masks; None: off (compiled out). `alibi_slopes` (ALiBi: BLOOM, MPT, falcon-rw; a float32 [Hq] tensor
    on q's device): the score of query i (position p = L - S_q + i) and key j gets ``slope * (j - p)``
    added, after the cap and before the masks; None: off (compiled out). `sinks` (gpt-oss's attention
    sinks; a float32 [Hq] tensor on q's device): head h's sink logit joins each of its rows' softmax
    denominators as a key with no value (probability mass the values do not get); None: off (compiled
    out). `chunk` C (Llama 4's chunked layers; not with a `window`): the query at position p sees only
    the keys j >= p - p % C of its own chunk. `pdl` (CUDA, Hopper and later): launch as programmatic
    dependent launches.
    """
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if block_table is not None:
        k_cache, v_cache = pool_heads_major(k_cache), pool_heads_major(v_cache)
    b, hq, _, d, hkv, _, capacity = _check(q, k_cache, v_cache, seq_lens, block_table, out)
    if b == 0 or hq == 0:
        return out
    window, chunked = key_bound(window, chunk, capacity)
    cap = check_softcap(softcap)
    slopes = check_alibi_slopes(alibi_slopes, hq, q)
    sink = check_sinks(sinks, hq, q)
    max_len = min(max_seq_len or capacity, capacity)
    s_q = int(q.shape[2])
    max_len = min(max_len, window + s_q + 128) if window else max_len  # + tile alignment
    scale = (d**-0.5 if scale is None else float(scale)) * float(k_scale)
    if config is None:
        tune = not interpreting() and q.is_cuda and not torch.cuda.is_current_stream_capturing()
        fallback = default_decode_config(d, k_cache.dtype)
        geometry = (window, v_scale, cap, slopes, sink, chunked)
        config = (
            _autotuned(q, k_cache, v_cache, seq_lens, block_table, out, scale, max_len, *geometry)
            if tune
            else _CHOICE.get(_key_of(q, k_cache, block_table, max_len), fallback)
        )
    splits = _resolve_splits(config, b * hkv, max_len)
    _launch(
        q, k_cache, v_cache, seq_lens, block_table, out, scale, config, splits, None,
        window=window, pdl=pdl, v_scale=v_scale, softcap=cap, alibi_slopes=slopes, sinks=sink, chunk=chunked,
    )  # fmt: skip
    return out


def decode_attention_raw(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    seq_lens: Any,
    block_table: Any | None,
    out: Any,
    *,
    scale: float,
    config: DecodeConfig,
    splits: int,
    workspace: Any | None,
    stream: int,
    counters_zeroed: bool = False,
) -> None:
    """Launch on raw device buffers (DeviceTensor views) on the CUDA stream handle `stream`, with a
    fixed config and split count and scratch from `workspace` (a float32 DeviceTensor, or a 4-byte
    torch tensor, of at least :func:`workspace_elements` elements): nothing is allocated, timed or
    synchronized (a TensorRT plugin's enqueue). A TensorRT workspace holds anything at enqueue, so
    by default the splits are reduced by a second kernel; `counters_zeroed` says that the
    workspace's arrival counters are zero (zeroed once and used only by these launches, which leave
    them zero), and the reduction is then fused into the split kernel (one launch). Caches as in
    :func:`decode_attention`."""
    if block_table is not None:
        k_cache, v_cache = pool_heads_major(k_cache), pool_heads_major(v_cache)
    _check(q, k_cache, v_cache, seq_lens, block_table, out)
    if splits > 1 and workspace is None:
        raise ValueError("a launch with more than one split needs a workspace")
    args = (q, k_cache, v_cache, seq_lens, block_table, out, scale, config, splits, workspace)
    if not stream:
        _launch(*args, zeroed=counters_zeroed)
        return
    with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
        _launch(*args, zeroed=counters_zeroed)


def prepare_paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor,
    *,
    config: DecodeConfig,
    rows: slice | None = None,
    window: int | None = None,
    pdl: bool = False,
    q_len: int = 1,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> PreparedLaunch:
    """:func:`decode_attention`'s launch over a block pool with a fixed `config`, one query per
    sequence, checked and laid out once: called as ``launch(q, k_pool, v_pool, out, scale)`` with
    tensors of the geometry of those given here, it attends the same sequences (every layer of a
    serving step); FP8 pools: ``launch(q, k_pool, v_pool, out, scale * k_scale, v_scale)``.
    q and out are ``[B, Hq, D]``, or flat ``[T, Hq, D]`` steps whose `rows` are the B decode rows.
    With `q_len` > 1 (<= 8: speculative verification) each sequence has `q_len` consecutive query rows
    (q and out ``[B * q_len, Hq, D]``, or `rows` spanning them), attended LOWER_RIGHT causally.
    `window`, `softcap`, `alibi_slopes`, `sinks` and `chunk` are the layer geometry's, as in
    :func:`decode_attention`
    (the slopes and sinks tensors are read at every launch: keep them alive and unchanged). Scratch (partials;
    this stream's arrival counters, outside graph capture) is taken here once and reused by every
    launch, so launches run in order on the stream current here."""
    if q_len == 1:
        pick = (lambda t: t.unsqueeze(2)) if rows is None else (lambda t: t[rows].unsqueeze(2))
    else:

        def pick(t: torch.Tensor) -> torch.Tensor:  # [B * q_len, Hq, D] -> a [B, Hq, q_len, D] view
            return (t if rows is None else t[rows]).unflatten(0, (-1, q_len)).transpose(1, 2)

    q4, out4 = pick(q), pick(out)
    k, v = pool_heads_major(k_pool), pool_heads_major(v_pool)
    b, hq, s_q, d, hkv, page, capacity = _check(q4, k, v, seq_lens, block_table, out4)
    at = functools.partial(arg_index, _decode_split_kernel)
    operands = (
        Operand((at("Q"),), pick),
        Operand((at("K"), at("KDesc")), pool_heads_major),  # the descriptors are unread without TMA
        Operand((at("V"), at("VDesc")), pool_heads_major),
        Operand((at("Out"),), pick),
        Operand((at("qk_scale"),), scalar=True),
        Operand((at("v_scale"),), scalar=True),
    )
    if b == 0 or hq == 0:
        return PreparedLaunch(_decode_split_kernel, (0,), (), operands)
    window, chunked = key_bound(window, chunk, capacity)  # (as decode_attention)
    cap = check_softcap(softcap)
    slopes = check_alibi_slopes(alibi_slopes, hq, q)
    sink = check_sinks(sinks, hq, q)
    max_len = min(capacity, window + s_q + 128) if window else capacity
    splits = _resolve_splits(config, b * hkv, max_len)
    direct = splits == 1
    fused = config.fused and not direct
    counters, mid_o, mid_l = seq_lens, out4, out4  # never touched unless fused / split
    if not direct:  # as _launch without a caller's workspace
        mid_o, mid_l, found = _own_scratch(q.device, b * hq * s_q * splits, d, b * hkv, fused)
        fused = found is not None
        counters = found if fused else counters
    args = (
        None, None, None, None, None, seq_lens, block_table, None, mid_o, mid_l, counters,
        *q4.stride(), *k.stride(), *v.stride(), *out4.stride(), int(block_table.stride(0)),
        hkv, splits, window, None, 1.0, cap, slopes, sink,
    )  # fmt: skip
    reduce = None
    if not direct and not fused:
        reduce = PreparedLaunch(
            _decode_reduce_kernel,
            (b * hq * s_q,),
            (mid_o, mid_l, None, *out4.stride(), hq, splits),
            (Operand(), Operand(), Operand(), Operand((2,), pick), Operand()),
            **_reduce_options(s_q, d, splits, pdl),
        )
    options = _split_options(
        config, hq // hkv, s_q, d, page, direct, fused, False, window, pdl, q.dtype, k.dtype,
        v_pairs_options(k.dtype, d, v), cap, slopes is not None, sink is not None, chunked,
    )  # fmt: skip
    return PreparedLaunch(_decode_split_kernel, (splits, b * hkv), args, operands, reduce, **options)
