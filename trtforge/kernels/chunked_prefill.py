"""Chunked prefill over a contiguous or paged K/V cache, with GQA (Triton).

A prompt chunk of S_q tokens per sequence (already written into the cache by
:func:`~trtforge.kernels.paged_cache.write_kv_cache`) attends to the sequence's cached
prefix plus itself: query i of sequence b sees keys j <= L_b - S_q,b + i (LOWER_RIGHT), where L_b =
seq_lens[b] counts the prefix and the chunk, and S_q,b = q_lens[b] (default: all S_q; ragged chunks
are padded to S_q and their padding rows are not written). With an empty prefix this is ordinary
causal prefill.

Tiles put query positions in the M dimension *interleaved with the query group*: row r is query
position r // G of head r % G of the kv head's group (G = Hq / Hkv), so each K/V tile is loaded
once for the whole group, as in the decode kernel (decode_kernel.py), whose tile loop this reuses;
K/V tiles past the block's last query's causal limit are skipped, and only tiles on the diagonal
and the ragged end carry masks. With a sliding window W (``window=``) a query at position p sees
only keys j > p - W: tiles before the block's first window are skipped, and those its rows' windows
cut are masked. With attention chunks of C positions (``chunk=``, Llama 4's chunked layers) a query at
position p sees only the keys j >= p - p % C of its own chunk, by the same machinery (each row's first key
its chunk's start). Grid: (query blocks, B·Hkv); no split-KV (the query blocks fill the GPU).
Correctness is tested in Triton's interpreter and against FP32 SDPA; it was not timed on the H200
(no device time left), so no speed is claimed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from trtforge.kernels import interpreting
from trtforge.kernels.configs import HopperConfig, chunk_prefill_config
from trtforge.kernels.decode_attention import (
    _attend_tiles,
    _check,
    check_alibi_slopes,
    check_sinks,
    check_softcap,
    fp16_products,
    fp16_query,
    key_bound,
)
from trtforge.kernels.device_tensor import pool_heads_major
from trtforge.kernels.kv_quant import FP8_KV_DTYPE
from trtforge.kernels.prepared_launch import Operand, PreparedLaunch, arg_index

__all__ = ["chunked_prefill_attention", "chunked_prefill_varlen", "prepare_chunked_prefill_varlen"]


# Arguments that change from one serving step to the next (the longest chunk, the metadata slices'
# offsets) are not specialized on, so that one compiled kernel serves every step: a specialization
# first met mid-run cost a ~0.6 s compile there (results/serving.md, session 10).
@triton.jit(
    do_not_specialize=["seq_q", "window", "stride_tb"],
    do_not_specialize_on_alignment=["SeqLens", "QLens", "QStarts", "Table"],
)
def _chunked_prefill_kernel(
    Q,
    K,
    V,
    SeqLens,
    QLens,
    QStarts,
    Table,
    Out,
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
    seq_q,
    window,
    qk_scale,
    v_scale,
    softcap,
    Slopes,
    Sinks,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_QLENS: tl.constexpr,
    DOT_F32: tl.constexpr,
    WINDOW: tl.constexpr,
    HAS_QSTARTS: tl.constexpr = False,
    KV_F16: tl.constexpr = False,
    SOFTCAP: tl.constexpr = False,
    ALIBI: tl.constexpr = False,
    SINKS: tl.constexpr = False,
    CHUNK: tl.constexpr = False,
):
    """Grid (cdiv(S_q·G, BLOCK_M), B·Hkv): BLOCK_M (query position, group head) rows of one kv head;
    WINDOW: the query at position p sees only keys j > p - window (WINDOW and CHUNK: `window` is an
    attention chunk size C, and it sees only the keys j >= p - p % C of its own chunk). With
    HAS_QSTARTS, sequence b's queries and outputs start at row QStarts[b] of flat [T, Hq, D] tensors
    (stride_*m between rows; the batch strides are unused). KV_F16 (FP8 pools): the scaled query in FP16
    and FP16 products, as in the decode kernel (:data:`~trtforge.kernels.decode_attention.FP8_KV_F16`).
    SOFTCAP: scores s (q.k times the softmax scale) become ``softcap * tanh(s / softcap)`` before the
    masks (Gemma 2). ALIBI: Slopes is a float32 [Hq] tensor (None when off); the score of query position
    p and key j gets ``Slopes[hq] * (j - p)`` added after the cap, before the masks (BLOOM, MPT,
    falcon-rw). SINKS: Sinks is a float32 [Hq] tensor (None when off) of attention-sink logits
    (gpt-oss): ``Sinks[hq]`` joins each row's softmax denominator once, as a key with no value (the
    running max and sum start from it)."""
    pid_m = tl.program_id(0)
    pid = tl.program_id(1)
    b = (pid // num_kv_heads).to(tl.int64)
    hkv = (pid % num_kv_heads).to(tl.int64)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    if HAS_QLENS:
        q_len = tl.minimum(tl.load(QLens + b).to(tl.int32), seq_q)
    else:
        q_len = seq_q

    r0 = pid_m * BLOCK_M
    offs_m = r0 + tl.arange(0, BLOCK_M)
    qi = offs_m // GROUP
    g = offs_m % GROUP
    row_ok = qi < q_len
    hq = hkv * GROUP + g
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    io_ok = row_ok[:, None] & d_ok[None, :]
    if HAS_QSTARTS:
        first = tl.load(QStarts + b).to(tl.int64)
        q_rows = first * stride_qm + hq * stride_qh + qi * stride_qm
        o_rows = first * stride_om + hq * stride_oh + qi * stride_om
    else:
        q_rows = b * stride_qb + hq * stride_qh + qi * stride_qm
        o_rows = b * stride_ob + hq * stride_oh + qi * stride_om
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :] * stride_qd, mask=io_ok, other=0.0)
    last_key = seq_len - q_len + qi
    if CHUNK:
        first_key = last_key - last_key % window
    else:
        first_key = last_key - window + 1 if WINDOW else last_key  # unread without WINDOW

    # Keys this block needs: up to the causal limit of its last real query and, WINDOW, from the
    # window start of its first (whole tiles from there). Whole tiles below the causal limit of its
    # first query and (WINDOW) from the window start of its last are visible to every row; the
    # tiles before them (head) and after them (tail) are masked.
    qi_first = r0 // GROUP
    qi_last = tl.minimum((r0 + BLOCK_M - 1) // GROUP, q_len - 1)
    hi = tl.maximum(tl.minimum(seq_len - q_len + qi_last + 1, seq_len), 0)
    hi = tl.where(r0 < q_len * GROUP, hi, 0)  # a block past a short chunk's rows reads no keys
    if WINDOW:
        if CHUNK:  # the first and last rows' chunk starts
            p_first = tl.maximum(seq_len - q_len + qi_first, 0)
            p_last = tl.maximum(seq_len - q_len + qi_last, 0)
            start_first, start_last = p_first - p_first % window, p_last - p_last % window
        else:  # their window starts
            start_first = tl.maximum(seq_len - q_len + qi_first + 1 - window, 0)
            start_last = seq_len - q_len + qi_last + 1 - window
        lo = tl.minimum((start_first // BLOCK_N) * BLOCK_N, hi)
        head_end = tl.minimum(lo + tl.cdiv(tl.maximum(start_last - lo, 0), BLOCK_N) * BLOCK_N, hi)
    else:
        lo = 0
        head_end = 0
    full_hi = tl.maximum(tl.minimum(hi, seq_len - q_len + qi_first + 1), 0)
    full_end = tl.maximum(head_end + ((full_hi - head_end) // BLOCK_N) * BLOCK_N, head_end)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = qk_scale * 1.4426950408889634
    if SOFTCAP:  # the cap in the scores' base-2 units
        softcap = softcap * 1.4426950408889634
    if ALIBI:  # each row's slope in the scores' base-2 units
        alibi = tl.load(Slopes + hq, mask=row_ok, other=0.0) * 1.4426950408889634
    else:
        alibi = l_i  # unread
    if SINKS:  # the sink in base 2 as the rows' first column: a running max of it and a sum of exp2(0) = 1
        m_i = tl.load(Sinks + hq, mask=row_ok, other=0.0) * 1.4426950408889634
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
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
    # the decode kernel's tile loop with pointer loads (no TMA descriptors: k/v bases stand in), FP8 V
    # read as bytes (the decode kernel's 16-bit pairs were not measured here, where a wgmma takes V)
    if WINDOW:
        acc, l_i, m_i = _attend_tiles(
            acc, l_i, m_i, q, k_base, v_base, k_base, v_base, 0, table_base, lo, head_end, last_key,
            first_key, qk_scale, softcap, alibi, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn,
            stride_vd, HEAD_DIM, BLOCK_N, BLOCK_D, PAGE_SIZE, True, DOT_F32, False, True, False, False,
            SOFTCAP, ALIBI,
        )  # fmt: skip
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, k_base, v_base, k_base, v_base, 0, table_base, head_end, full_end, last_key,
        first_key, qk_scale, softcap, alibi, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
        HEAD_DIM, BLOCK_N, BLOCK_D, PAGE_SIZE, False, DOT_F32, False, False, False, False, SOFTCAP, ALIBI,
    )  # fmt: skip
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, k_base, v_base, k_base, v_base, 0, table_base, full_end, hi, last_key,
        first_key, qk_scale, softcap, alibi, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
        HEAD_DIM, BLOCK_N, BLOCK_D, PAGE_SIZE, True, DOT_F32, False, WINDOW, False, False, SOFTCAP, ALIBI,
    )  # fmt: skip
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc * (v_scale / l_safe)[:, None]  # v_scale: an FP8 pool's V scale (else 1)
    tl.store(Out + o_rows[:, None] + offs_d[None, :] * stride_od, out.to(Out.dtype.element_ty), mask=io_ok)


def chunked_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    q_lens: torch.Tensor | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Attention of a prompt chunk q [B, Hq, S_q, D] over each sequence's first seq_lens[b] cached
    keys (prefix + chunk), LOWER_RIGHT causal, GQA; caches as in :func:`decode_attention`
    (contiguous [B, Hkv, S_max, D] or a block pool [num_blocks, block_size, Hkv, D] with
    `block_table`; q's dtype, or FP8 E4M3 with `k_scale` / `v_scale`, read in place).
    `q_lens` (int32 [B]) gives ragged chunk lengths (right-padded to S_q); rows past
    them are left unwritten. `window` W (sliding-window layers): the query at position p sees only
    keys j with p - W < j <= p. `softcap` c (Gemma 2): each score s = q . k * scale becomes
    c * tanh(s / c) before the masks; None: off (compiled out). `alibi_slopes` (a float32 [Hq] tensor on
    q's device; BLOOM, MPT, falcon-rw): the score of the query at position p and key j gets
    ``slope * (j - p)`` added after the cap, before the masks; None: off (compiled out). `sinks` (a float32
    [Hq] tensor on q's device; gpt-oss): head h's sink logit joins each of its rows' softmax denominators
    as a key with no value; None: off (compiled out). `chunk` C (Llama 4's chunked layers; not with a
    `window`): the query at position p sees only the keys j with p - p % C <= j <= p. Works on torch
    tensors and on DeviceTensor views (give `out`; no slopes or sinks there). Returns `out`."""
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if block_table is not None:
        k_cache, v_cache = pool_heads_major(k_cache), pool_heads_major(v_cache)
    b, hq, s_q, d, hkv, page, capacity = _check(
        q, k_cache, v_cache, seq_lens, block_table, out, max_q_len=1 << 30
    )
    window, chunked = key_bound(window, chunk, capacity)  # (longer than the cache: hides nothing)
    cap = check_softcap(softcap)
    slopes = check_alibi_slopes(alibi_slopes, hq, q)
    sink = check_sinks(sinks, hq, q)
    if q_lens is not None and (tuple(q_lens.shape) != (b,) or q_lens.dtype != torch.int32):
        raise ValueError(f"q_lens must be int32 [B] = [{b}]; got {q_lens.dtype} {tuple(q_lens.shape)}")
    if b == 0 or hq == 0:
        return out
    group = hq // hkv
    if block_m < 16 or block_m & (block_m - 1) or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_m ({block_m}) and block_n ({block_n}) must be powers of two >= 16")
    block_d = max(16, triton.next_power_of_2(d))
    table = block_table if block_table is not None else seq_lens
    stride_tb = int(block_table.stride(0)) if block_table is not None else 0
    _chunked_prefill_kernel[(triton.cdiv(s_q * group, block_m), b * hkv)](
        q, k_cache, v_cache, seq_lens, q_lens if q_lens is not None else seq_lens, seq_lens, table, out,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), stride_tb,
        hkv, s_q, window, (d**-0.5 if scale is None else float(scale)) * float(k_scale), float(v_scale), cap,
        slopes, sink,
        GROUP=group, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, PAGE_SIZE=page,
        HAS_QLENS=q_lens is not None, DOT_F32=interpreting() and q.dtype == torch.bfloat16,
        WINDOW=window > 0, KV_F16=fp16_products(k_cache.dtype), SOFTCAP=cap > 0.0, ALIBI=slopes is not None,
        SINKS=sink is not None, CHUNK=chunked, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def chunked_prefill_varlen(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    max_q_len: int,
    *,
    scale: float,
    out: torch.Tensor,
    window: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Several prompt chunks in one launch: chunk b is rows ``[q_starts[b], q_starts[b] + q_lens[b])``
    of the flat q/out ``[T, Hq, D]``, over a block pool ``[num_blocks, block_size, Hkv, D]`` through
    ``block_table[b]`` (its first ``seq_lens[b]`` keys, LOWER_RIGHT causal, GQA). `max_q_len` bounds
    q_lens (it sizes the grid); the int32 ``[B]`` tensors stay on the device. FP8 pools hold ``k /
    k_scale`` and ``v / v_scale``. `window`, `softcap`, `alibi_slopes`, `sinks` and `chunk` as in
    :func:`chunked_prefill_attention`.
    Launch parameters left None come from :func:`~trtforge.kernels.configs.chunk_prefill_config` for
    `max_q_len`. Returns `out`."""
    launch = prepare_chunked_prefill_varlen(
        q, k_pool, v_pool, seq_lens, block_table, q_starts, q_lens, max_q_len,
        out=out, window=window, block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
        softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, chunk=chunk,
    )  # fmt: skip
    launch(q, k_pool, v_pool, out, float(scale) * float(k_scale), float(v_scale))
    return out


def prepare_chunked_prefill_varlen(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    max_q_len: int,
    *,
    out: torch.Tensor,
    window: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> PreparedLaunch:
    """:func:`chunked_prefill_varlen`'s launch, checked and laid out once: called as ``launch(q,
    k_pool, v_pool, out, scale)`` with tensors of the geometry (dtype, shape, strides) of those given
    here, it attends the same chunks (every layer of a step, each with its own pools); FP8 pools:
    ``launch(q, k_pool, v_pool, out, scale * k_scale, v_scale)``. `window`, `softcap`, `alibi_slopes`,
    `sinks` and `chunk` are the layer geometry's (:func:`chunked_prefill_attention`; the slopes and sinks
    tensors are read at every launch). Launch parameters left None come from
    :func:`~trtforge.kernels.configs.chunk_prefill_config` for `max_q_len`."""
    chosen = chunk_prefill_config(max_q_len)
    block_m = chosen.block_m if block_m is None else block_m
    block_n = chosen.block_n if block_n is None else block_n
    num_warps = chosen.num_warps if num_warps is None else num_warps
    num_stages = chosen.num_stages if num_stages is None else num_stages
    if q.dim() != 3 or tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"q and out must be one [T, Hq, D] shape; got {tuple(q.shape)}, {tuple(out.shape)}")
    b = int(seq_lens.shape[0])
    for name, t in (("q_starts", q_starts), ("q_lens", q_lens)):
        if tuple(t.shape) != (b,) or t.dtype != torch.int32:
            raise ValueError(
                f"{name} must be int32 [B] = [{b}] like seq_lens; got {t.dtype} {tuple(t.shape)}"
            )
    at = functools.partial(arg_index, _chunked_prefill_kernel)
    operands = (
        Operand((at("Q"),)),
        Operand((at("K"),), pool_heads_major),
        Operand((at("V"),), pool_heads_major),
        Operand((at("Out"),)),
        Operand((at("qk_scale"),), scalar=True),
        Operand((at("v_scale"),), scalar=True),
    )
    if b == 0 or int(q.shape[0]) == 0:
        return PreparedLaunch(_chunked_prefill_kernel, (0,), (), operands)
    # the checks of the batched form, on [1, Hq, T, D] views (the grid uses max_q_len, not T)
    qv, ov = q.permute(1, 0, 2)[None], out.permute(1, 0, 2)[None]
    k_cache, v_cache = pool_heads_major(k_pool), pool_heads_major(v_pool)
    _, hq, _, d, hkv, page, capacity = _check(
        qv, k_cache, v_cache, seq_lens[:1], block_table[:1], ov, max_q_len=1 << 30
    )
    window, chunked = key_bound(window, chunk, capacity)  # (longer than the cache: hides nothing)
    cap = check_softcap(softcap)
    slopes = check_alibi_slopes(alibi_slopes, hq, q)
    sink = check_sinks(sinks, hq, q)
    if int(block_table.shape[0]) != b:
        raise ValueError(f"block_table must have B = {b} rows; got {tuple(block_table.shape)}")
    group = hq // hkv
    grid = (triton.cdiv(max(int(max_q_len), 1) * group, block_m), b * hkv)
    args = (
        None, None, None, seq_lens, q_lens, q_starts, block_table, None,
        0, q.stride(1), q.stride(0), q.stride(2), *k_cache.stride(), *v_cache.stride(),
        0, out.stride(1), out.stride(0), out.stride(2), int(block_table.stride(0)),
        hkv, int(max_q_len), window, None, 1.0, cap, slopes, sink,
    )  # fmt: skip
    return PreparedLaunch(
        _chunked_prefill_kernel, grid, args, operands,
        GROUP=group, HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=block_m, BLOCK_N=block_n,
        PAGE_SIZE=page, HAS_QLENS=True, DOT_F32=interpreting() and q.dtype == torch.bfloat16,
        WINDOW=window > 0, HAS_QSTARTS=True, KV_F16=fp16_products(k_cache.dtype), SOFTCAP=cap > 0.0,
        ALIBI=slopes is not None, SINKS=sink is not None, CHUNK=chunked, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip


# Prompt chunks of at least this many tokens go to the Hopper kernel (prepare_chunked_prefill_hopper);
# shorter ones stay on the varlen kernel: a 128-row query block would be mostly padding.
HOPPER_CHUNK_MIN_TOKENS = 256
# ... while a step's long chunks see at most this many keys in all: their K/V are gathered into scratch
# (at 8 kv heads of 128 BF16 channels, 32 K keys are 128 MB), so longer contexts stay on the varlen kernel.
HOPPER_CHUNK_MAX_KEYS = 32768
# FP8 pools too: the long chunks' blocks are gathered widened to the query's type (E4M3 codes are exact
# in BF16 and FP16; V times its scale, K's scale rides in the softmax scale), then the same kernel runs.
# False keeps them on the varlen kernel (a benchmark's A/B; read when a step's launches are prepared).
FP8_HOPPER_CHUNKS = True
# ... gathered and widened by one kernel (:func:`gather_widened`) rather than torch's byte gather, dtype
# copy and V-scale multiply (five launches and a byte copy of the blocks; read at each launch).
FUSED_FP8_GATHER = True
# Elements of a pool block one gather program widens (16 keys x 8 kv heads x 128 channels: 4 programs).
_GATHER_BLOCK = 4096


@triton.jit
def _gather_widen_kernel(
    KPool, VPool, Pages, KOut, VOut, v_scale, PAGE_ELEMS: tl.constexpr, BLOCK: tl.constexpr
):
    """Program (i, part): elements [part * BLOCK, +BLOCK) of pool block Pages[i]'s K and V codes, widened
    to the outputs' type at row block i (V times `v_scale` in float32, then rounded to nearest even)."""
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < PAGE_ELEMS
    src = tl.load(Pages + i).to(tl.int64) * PAGE_ELEMS + offs
    dst = i.to(tl.int64) * PAGE_ELEMS + offs
    k = tl.load(KPool + src, mask=ok)
    tl.store(KOut + dst, k.to(tl.float32).to(KOut.dtype.element_ty), mask=ok)
    v = tl.load(VPool + src, mask=ok)
    tl.store(VOut + dst, (v.to(tl.float32) * v_scale).to(VOut.dtype.element_ty), mask=ok)


def gather_widened(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    pages: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    v_scale: float = 1.0,
) -> None:
    """Blocks `pages` (int, device) of FP8 pools `k_pool` / `v_pool` ``[N, page, Hkv, D]`` into the first
    ``len(pages)`` blocks of the 16-bit `k_out` / `v_out` ``[>= len(pages), page, Hkv, D]``, in one launch:
    K's codes widened exactly, V's times `v_scale` (float32) and rounded to nearest even, the values
    torch's gather, widening copy and multiply give."""
    n = int(pages.shape[0])
    shape = tuple(k_pool.shape[1:])
    for name, t in (("k_pool", k_pool), ("v_pool", v_pool), ("k_out", k_out), ("v_out", v_out)):
        if t.dim() != 4 or tuple(t.shape[1:]) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous [blocks, {', '.join(map(str, shape))}] tensor; "
                             f"got {tuple(t.shape)}")  # fmt: skip
    if k_pool.dtype != FP8_KV_DTYPE or v_pool.dtype != FP8_KV_DTYPE:
        raise ValueError(f"the pools must hold FP8 E4M3 codes; got {k_pool.dtype} and {v_pool.dtype}")
    if k_out.dtype not in (torch.float16, torch.bfloat16) or v_out.dtype != k_out.dtype:
        raise ValueError(f"the outputs must share a 16-bit float type; got {k_out.dtype} and {v_out.dtype}")
    if int(k_out.shape[0]) < n or int(v_out.shape[0]) < n:
        raise ValueError(f"{n} blocks do not fit outputs of {int(k_out.shape[0])} and {int(v_out.shape[0])}")
    _launch_gather_widen(k_pool, v_pool, pages, k_out, v_out, v_scale)


def _launch_gather_widen(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    pages: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    v_scale: float,
) -> None:
    """:func:`gather_widened` without its checks: for a prepared launch, whose tensors were checked when
    it was prepared (it runs once a layer a step)."""
    n = int(pages.shape[0])
    if n == 0:
        return
    elems = int(k_pool.shape[1]) * int(k_pool.shape[2]) * int(k_pool.shape[3])
    block = min(_GATHER_BLOCK, triton.next_power_of_2(elems))
    grid = (n, triton.cdiv(elems, block))
    _gather_widen_kernel[grid](k_pool, v_pool, pages, k_out, v_out, float(v_scale), elems, block, num_warps=4)


def hopper_chunks_eligible(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    window: int | None,
    out: torch.Tensor | None = None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> bool:
    """Whether a step's long prompt chunks can run the warp-specialized Hopper flash-attention kernel
    (:mod:`trtforge.kernels.flash_attention_hopper`) over their gathered K/V: no sliding window, no
    attention soft-cap, no ALiBi slopes, no attention sinks and no attention chunks (the Hopper kernel
    applies none of them: such layers stay on the varlen kernel), pools
    of the query's 16-bit type or FP8 (gathered widened to it: :data:`FP8_HOPPER_CHUNKS`), and what the
    flash-attention dispatch asks of the kernel (an sm_90 GPU, its proven Triton release, head dim 64 or
    128, tensors the copy engine can address)."""
    from trtforge.kernels.flash_attention import _hopper_eligible

    fp8 = k_pool.dtype == FP8_KV_DTYPE and FP8_HOPPER_CHUNKS
    if window is not None or softcap is not None or alibi_slopes is not None or sinks is not None:
        return False
    if chunk is not None:
        return False
    if not q.is_cuda or not (k_pool.dtype == q.dtype or fp8):
        return False
    return _hopper_eligible(q, q if fp8 else k_pool, q if fp8 else k_pool, q if out is None else out, None)


def prepare_chunked_prefill_hopper(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    chunks: list[tuple[int, int, int]],
    pages: torch.Tensor,
    config: HopperConfig | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Callable[..., None]:
    """Long prompt chunks through the Hopper flash-attention kernel: `chunks` are (first row of q,
    query tokens, keys incl. the chunk) on the host, `pages` the chunks' pool blocks in order (device,
    int). Each call ``launch(q, k_pool, v_pool, out, scale)`` gathers those blocks' K and V into
    contiguous scratch (one copy each), then runs the kernel once per chunk with its query rows aligned
    to the last keys (causal, bottom-right) and its query heads grouped over the kv heads. Why: the
    varlen kernel's ``tl`` tile loop holds chunk attention at ~270-290 TFLOP/s; the warp-specialized
    kernel overlaps its softmax with the tensor cores (1.2-1.7x on serving's chunks, H200). `scratch`:
    two [>= pages, page, Hkv, D] buffers to gather into (a caller's, kept across steps), else new ones.
    FP8 pools (``launch(q, k_pool, v_pool, out, scale * k_scale, v_scale)``): the scratch has q's dtype;
    K's codes are widened into it exactly, V's widened and times `v_scale`."""
    from trtforge.kernels import flash_attention_hopper as fh
    from trtforge.kernels.configs import CHUNK_HOPPER_CONFIG

    config = config or CHUNK_HOPPER_CONFIG
    if config.num_wg != 2:  # (3 warpgroups spill the chunk variant's offset at D=64: sm_90 compile test)
        raise ValueError(f"long prompt chunks run on 2 consumer warpgroups; got {config}")
    if k_pool.dim() != 4 or tuple(v_pool.shape) != tuple(k_pool.shape):
        raise ValueError(
            "k_pool and v_pool must share one [blocks, page, Hkv, D] shape; "
            f"got {tuple(k_pool.shape)} and {tuple(v_pool.shape)}"
        )
    page, hkv, d = (int(n) for n in k_pool.shape[1:])
    n_pages = int(pages.shape[0])
    need = sum(-(-ctx // page) for _, _, ctx in chunks)
    if need != n_pages or any(ql < 1 or ctx < ql for _, ql, ctx in chunks):
        raise ValueError(f"chunks {chunks} need {need} pages of {page} keys; got {n_pages}")
    fp8 = k_pool.dtype == FP8_KV_DTYPE
    kind = q.dtype if fp8 else k_pool.dtype
    if scratch is None:
        scratch = tuple(q.new_empty((n_pages, page, hkv, d), dtype=kind) for _ in range(2))
    for s in scratch:
        if s.dtype != kind or tuple(s.shape[1:]) != (page, hkv, d) or int(s.shape[0]) < n_pages:
            raise ValueError(f"scratch {s.dtype} {tuple(s.shape)} cannot hold {n_pages} blocks of {kind} K/V")
        if not s.is_contiguous():
            raise ValueError("scratch must be contiguous")
    scratch = (scratch[0][:n_pages], scratch[1][:n_pages])
    views, p0 = [], 0
    for start, ql, ctx in chunks:
        n = -(-ctx // page)
        k, v = (s[p0 : p0 + n].view(n * page, hkv, d)[:ctx].permute(1, 0, 2)[None] for s in scratch)
        views.append((start, ql, ctx - ql, k, v))
        p0 += n

    def launch(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, out: torch.Tensor, scale: float, *rest):
        if fp8 and FUSED_FP8_GATHER and kp.is_contiguous() and vp.is_contiguous():
            _launch_gather_widen(kp, vp, pages, scratch[0], scratch[1], float(rest[0]) if rest else 1.0)
        elif fp8:  # widened into q's dtype (exact); V's scale applied here, K's rides in `scale`
            scratch[0].copy_(kp.view(torch.uint8).index_select(0, pages).view(kp.dtype))
            scratch[1].copy_(vp.view(torch.uint8).index_select(0, pages).view(vp.dtype))
            if rest and float(rest[0]) != 1.0:
                scratch[1].mul_(float(rest[0]))
        else:
            torch.index_select(kp, 0, pages, out=scratch[0])
            torch.index_select(vp, 0, pages, out=scratch[1])
        for start, ql, offset, kc, vc in views:
            qc = q[start : start + ql].permute(1, 0, 2)[None]
            oc = out[start : start + ql].permute(1, 0, 2)[None]
            fh.launch(qc, kc, vc, oc, scale, True, config, q_offset=offset)

    return launch
