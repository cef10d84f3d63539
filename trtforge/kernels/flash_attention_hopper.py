"""Hopper fast path of the flash-attention forward, written in Gluon (Triton's explicit-layout dialect).

Why a second kernel: Triton's ``tl`` compiler schedules the whole tile loop in every warp, so the
tensor cores sit idle while the softmax runs (benchmarks/results/attention.md: 0.75-0.99x of cuDNN).
This kernel warp-specializes the work the way FlashAttention-3 does on sm_90:

* one producer warp moves Q once and K/V tiles through a ring of shared-memory stages with the copy
  engine (TMA), handing them over on mbarriers;
* NUM_WG consumer warpgroups each own 64 query rows of the block. Every step issues S_j = Q·K_jᵀ
  and O += P_{j-1}·V_{j-1} back to back as asynchronous wgmma, then runs the softmax of S_j while
  the second product is still on the tensor cores (intra-warpgroup overlap);
* with PINGPONG the consumers take turns issuing their products (an mbarrier token passed
  between them), so one warpgroup's softmax runs while the other's products occupy the tensor
  cores (inter-warpgroup overlap).

The producer gives up its registers (``setmaxnreg`` through ``warp_specialize``'s register
budgets) so the consumers can hold S, P and O in registers. Persistent programs (one per SM) loop
over work units; under a causal mask a unit can be a pair of query blocks of equal total cost
(PAIRS), which keeps the programs' loads even. With O_IN_K a warpgroup hands its Q tile back after
its last Q·Kᵀ and stages the output in the block's last K tile instead, so the next block's Q
loads while the current block finishes (short sequences gain most: few tiles per block).

Scope: FP16/BF16, head dim 64 or 128, causal or not, any sequence lengths (the 4-D descriptors
zero-fill ragged tiles, masks run only on the last and diagonal tiles, the output store is clipped),
no key-padding mask, 16-byte-aligned strides with a unit D stride. Everything else runs the
portable ``tl`` kernel (:mod:`trtforge.kernels.flash_attention`), which dispatches here.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime import driver

from trtforge.kernels.configs import WG_ROWS, HopperConfig, hopper_configs
from trtforge.kernels.device_tensor import DeviceTensor

__all__ = ["HopperConfig", "hopper_configs", "launch"]


# Integer arguments are not specialized on their values (== 1, multiples of 16): the compiled
# kernel then depends only on the config, dtype, head dim and causal flag, which is what lets
# launch() reuse it without Triton's per-call argument binding.
_INT_ARGS = ("batch", "num_heads", "seq_q", "seq_kv", "q_offset", "kv_group")


@gluon.jit
def _units_per_head(n_m, PAIRED: gl.constexpr):
    """Work units per (batch, head): query blocks, or with PAIRED pairs of them (see _unit_block)."""
    if PAIRED:
        return (n_m + 1) // 2
    else:
        return n_m


@gluon.jit
def _unit_size(unit, n_m, PAIRED: gl.constexpr):
    """Query blocks in a work unit: 1, or 2 for PAIRED units but the lone one of an odd count."""
    if PAIRED:
        per_head = (n_m + 1) // 2
        return 2 - ((n_m % 2 == 1) & (unit % per_head == 0)).to(gl.int32)
    else:
        return 1


@gluon.jit
def _unit_block(unit, half, n_m, num_heads, CAUSAL: gl.constexpr, PAIRED: gl.constexpr):
    """Block `half` of work unit `unit` -> (query block index, batch, head). Units of one head are
    adjacent (its K/V stay in L2) and causal blocks run longest first. PAIRED (causal) units join
    block n-1-i with block i (i-1 for an odd count n, whose longest block is a unit alone), so
    every unit costs the same number of K/V tiles and programs that take units round-robin finish
    together."""
    if PAIRED:
        per_head = (n_m + 1) // 2
        i = unit % per_head
        pid_m = (n_m - 1 - i) * (1 - half) + (i - n_m % 2) * half
        bh = unit // per_head
    else:
        pid_m = unit % n_m
        if CAUSAL:
            pid_m = n_m - 1 - pid_m
        bh = unit // n_m
    return pid_m, bh // num_heads, bh % num_heads


@gluon.jit
def _kv_tiles(m0, seq_kv, q_offset, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """K/V tiles query block `m0` reads: all of them, or causally up to its last row's position
    (query row i sits at key position i + q_offset)."""
    if CAUSAL:
        kv_end = gl.minimum(seq_kv, m0 + BLOCK_M + q_offset)
    else:
        kv_end = seq_kv
    return gl.cdiv(kv_end, BLOCK_N)


@gluon.jit
def _consumer(
    desc_o,
    smem,
    dims,
    qk_scale,
    WG: gl.constexpr,
    NUM_WG: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    Q_BUFS: gl.constexpr,
    CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr,
    PAIRS: gl.constexpr,
    O_IN_K: gl.constexpr,
    CHUNK: gl.constexpr,
):
    """One consumer warpgroup: for each of its program's query blocks, 64 rows through every K/V
    tile, then the normalized output, stored by the copy engine from shared memory: staged in its Q
    tile, or with O_IN_K in its 64 rows of the block's last K tile, which lets it hand Q back right
    after the last Q·Kᵀ (the producer loads the next block's Q during the last P·V and the store)."""
    q_smem, k_smem, v_smem, q_ready, q_empty, kv_ready, kv_empty, turn, k_done = smem
    batch, num_heads, seq_q, seq_kv, q_offset, _ = dims
    if not CHUNK:  # the plain kernel: no offset, at compile time
        q_offset = 0
    dtype: gl.constexpr = q_smem.dtype
    BLOCK_M: gl.constexpr = NUM_WG * 64
    # one warpgroup's wgmma accumulators: S is [64, BLOCK_N], O is [64, HEAD_DIM]; K=16 per instruction
    s_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    scale = qk_scale * 1.4426950408889634
    zero_s = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
    PAIRED: gl.constexpr = CAUSAL and PAIRS
    n_m = gl.cdiv(seq_q, BLOCK_M)
    n_units = _units_per_head(n_m, PAIRED) * num_heads * batch

    kv = 0  # K/V tiles consumed so far by this program (ring position)
    turns = 0  # issue turns taken so far
    local = 0  # query blocks done so far by this program
    staged = 0  # O_IN_K: the ring stage whose K tile holds the previous block's output
    for unit in range(gl.program_id(0), n_units, gl.num_programs(0)):
        for half in range(_unit_size(unit, n_m, PAIRED)):
            pid_m, b, h = _unit_block(unit, half, n_m, num_heads, CAUSAL, PAIRED)
            m0 = pid_m * BLOCK_M
            r0 = m0 + WG * 64  # first query row of this warpgroup
            n_tiles = _kv_tiles(m0, seq_kv, q_offset, BLOCK_M, BLOCK_N, CAUSAL)
            # tiles from this index on need a mask: the ragged end, or keys past this warpgroup's first row
            if CAUSAL:
                first_masked = gl.minimum(seq_kv // BLOCK_N, (r0 + q_offset) // BLOCK_N)
            else:
                first_masked = seq_kv // BLOCK_N
            rows = r0 + q_offset + gl.arange(0, 64, layout=row_s)  # the rows' key positions
            qb = local % Q_BUFS
            q_wg = q_smem.index(qb * NUM_WG + WG)
            acc = gl.zeros([64, HEAD_DIM], gl.float32, o_layout)
            mbarrier.wait(q_ready.index(qb * NUM_WG + WG), (local // Q_BUFS) & 1)

            # tile 0: S_0 and its softmax; nothing to overlap with yet
            stage = kv % STAGES
            mbarrier.wait(kv_ready.index(stage), (kv // STAGES) & 1)
            if PINGPONG:
                mbarrier.wait(turn.index(WG), turns & 1)
            s = warpgroup_mma(q_wg, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index((WG + 1) % NUM_WG))
            turns += 1
            s = warpgroup_mma_wait(0, deps=(s,))
            if O_IN_K:  # noqa: SIM102 (compile-time branch around a run-time one)
                if local > 0:  # the previous output has left shared memory: its stage may refill
                    tma.store_wait(0)
                    mbarrier.arrive(kv_empty.index(staged))
            if first_masked <= 0:
                cols = gl.arange(0, BLOCK_N, layout=col_s)
                keep = cols[None, :] < seq_kv
                if CAUSAL:
                    keep = keep & (cols[None, :] <= rows[:, None])
                s = gl.where(keep, s, float("-inf"))
            m_i = gl.max(s, axis=1) * scale
            p = gl.exp2(s * scale - m_i[:, None])
            l_i = gl.sum(p, axis=1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            prev = stage
            kv += 1

            for j in range(1, n_tiles):
                stage = kv % STAGES
                mbarrier.wait(kv_ready.index(stage), (kv // STAGES) & 1)
                if PINGPONG:
                    mbarrier.wait(turn.index(WG), turns & 1)
                s = warpgroup_mma(
                    q_wg, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True
                )
                acc = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(turn.index((WG + 1) % NUM_WG))
                turns += 1
                s = warpgroup_mma_wait(1, deps=(s,))
                if j >= first_masked:
                    cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_s)
                    keep = cols[None, :] < seq_kv
                    if CAUSAL:
                        keep = keep & (cols[None, :] <= rows[:, None])
                    s = gl.where(keep, s, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale)
                alpha = gl.exp2(m_i - m_new)
                p = gl.exp2(s * scale - m_new[:, None])
                l_i = l_i * alpha + gl.sum(p, axis=1)
                m_i = m_new
                acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
                mbarrier.arrive(kv_empty.index(prev))
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                prev = stage
                kv += 1

            if O_IN_K:  # the last Q·Kᵀ is done: Q may take the next block's rows
                mbarrier.arrive(q_empty.index(qb * NUM_WG + WG))
                mbarrier.arrive(k_done.index(0))
            acc = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
            acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
            l_o = gl.convert_layout(l_i, row_o)
            out = (acc * (1.0 / gl.where(l_o == 0.0, 1.0, l_o))[:, None]).to(dtype)
            if O_IN_K:
                # every warpgroup is done with this K tile; its stage is released once the store has
                # read it, early in the next block (or at the end)
                mbarrier.wait(k_done.index(0), local & 1)
                # the K tile seen as BLOCK_N // 64 Q-shaped tiles (Triton 3.6 cannot reshape a slice)
                halves = k_smem.index(prev)._reinterpret(dtype, [BLOCK_N // 64, 64, HEAD_DIM], q_smem.layout)
                o_tile = halves.index(WG)
                o_tile.store(out)
                fence_async_shared()
                tma.async_copy_shared_to_global(desc_o, [b, h, r0, 0], o_tile.reshape([1, 1, 64, HEAD_DIM]))
                staged = prev
            else:
                mbarrier.arrive(kv_empty.index(prev))
                q_wg.store(out)  # Q is consumed: its tile stages the output for the copy engine
                fence_async_shared()
                tma.async_copy_shared_to_global(desc_o, [b, h, r0, 0], q_wg.reshape([1, 1, 64, HEAD_DIM]))
                tma.store_wait(0)
                mbarrier.arrive(q_empty.index(qb * NUM_WG + WG))  # the producer may load the next Q here
            local += 1
    if O_IN_K:
        tma.store_wait(0)


@gluon.jit
def _consumer_default(
    desc_o,
    smem,
    dims,
    qk_scale,
    NUM_WG: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    Q_BUFS: gl.constexpr,
    CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr,
    PAIRS: gl.constexpr,
    O_IN_K: gl.constexpr,
    CHUNK: gl.constexpr,
):
    """The first consumer warpgroup (warp_specialize's default partition takes no index)."""
    _consumer(
        desc_o, smem, dims, qk_scale, 0, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS, CAUSAL, PINGPONG, PAIRS,
        O_IN_K, CHUNK,
    )  # fmt: skip


@gluon.jit
def _load_q(desc_q, q_smem, q_ready, q_empty, slot, phase, b, h, row, HEAD_DIM: gl.constexpr):
    """Once its consumer handed Q slot `slot` back, copy 64 query rows from `row` into it."""
    mbarrier.wait(q_empty.index(slot), phase)
    mbarrier.expect(q_ready.index(slot), desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(
        desc_q, [b, h, row, 0], q_ready.index(slot), q_smem.index(slot).reshape([1, 1, 64, HEAD_DIM])
    )


@gluon.jit
def _producer(
    desc_q,
    desc_k,
    desc_v,
    smem,
    dims,
    NUM_WG: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    Q_BUFS: gl.constexpr,
    CAUSAL: gl.constexpr,
    PAIRS: gl.constexpr,
    SPLIT_Q: gl.constexpr,
    CHUNK: gl.constexpr,
):
    """The load warp: per query block, its Q tiles (each once its warpgroup handed the slot back),
    then its K/V tiles into the ring as consumers free stages; the ring runs ahead into the
    program's next block. SPLIT_Q loads the later warpgroups' Q tiles after the first K/V tile, so
    the first warpgroup starts its next block without waiting for the others to finish theirs."""
    q_smem, k_smem, v_smem, q_ready, q_empty, kv_ready, kv_empty, _, _ = smem
    batch, num_heads, seq_q, seq_kv, q_offset, kv_group = dims
    if not CHUNK:  # the plain kernel: no offset, one kv head per query head, at compile time
        q_offset = 0
        kv_group = 1
    BLOCK_M: gl.constexpr = NUM_WG * 64
    PAIRED: gl.constexpr = CAUSAL and PAIRS
    n_m = gl.cdiv(seq_q, BLOCK_M)
    n_units = _units_per_head(n_m, PAIRED) * num_heads * batch
    kv = 0
    local = 0
    for unit in range(gl.program_id(0), n_units, gl.num_programs(0)):
        for half in range(_unit_size(unit, n_m, PAIRED)):
            pid_m, b, h = _unit_block(unit, half, n_m, num_heads, CAUSAL, PAIRED)
            m0 = pid_m * BLOCK_M
            n_tiles = _kv_tiles(m0, seq_kv, q_offset, BLOCK_M, BLOCK_N, CAUSAL)
            slot = (local % Q_BUFS) * NUM_WG  # this block's first Q tile
            # a fresh barrier counts as having completed the phase before 0: first passes wait for nothing
            q_phase = ((local // Q_BUFS) & 1) ^ 1
            for w in gl.static_range(NUM_WG):
                if w == 0 or not SPLIT_Q:
                    _load_q(desc_q, q_smem, q_ready, q_empty, slot + w, q_phase, b, h, m0 + w * 64, HEAD_DIM)
            for j in range(n_tiles):
                stage = kv % STAGES
                mbarrier.wait(kv_empty.index(stage), ((kv // STAGES) & 1) ^ 1)
                bar = kv_ready.index(stage)
                mbarrier.expect(bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
                tma.async_copy_global_to_shared(
                    desc_k,
                    [b, h // kv_group, j * BLOCK_N, 0],
                    bar,
                    k_smem.index(stage).reshape([1, 1, BLOCK_N, HEAD_DIM]),
                )
                tma.async_copy_global_to_shared(
                    desc_v,
                    [b, h // kv_group, j * BLOCK_N, 0],
                    bar,
                    v_smem.index(stage).reshape([1, 1, BLOCK_N, HEAD_DIM]),
                )
                kv += 1
                if SPLIT_Q and j == 0:
                    for w in gl.static_range(1, NUM_WG):
                        _load_q(
                            desc_q, q_smem, q_ready, q_empty, slot + w, q_phase, b, h, m0 + w * 64, HEAD_DIM
                        )
            local += 1


@gluon.jit(do_not_specialize=_INT_ARGS)
def _attn_fwd_ws(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    batch,
    num_heads,
    seq_q,
    seq_kv,
    q_offset,
    kv_group,
    qk_scale,
    NUM_WG: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    Q_BUFS: gl.constexpr,
    CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr,
    PAIRS: gl.constexpr,
    SPLIT_Q: gl.constexpr,
    O_IN_K: gl.constexpr,
    CHUNK: gl.constexpr,
):
    """Grid (programs,): program p handles work units p, p + programs, ... (a unit is a query block of
    BLOCK_M rows, or a pair of them: _unit_block), one program per unit when not persistent;
    launched with num_warps=4 (the first consumer). CHUNK reads q_offset and kv_group (grouped-query
    heads, a causal mask aligned to the last keys: a prompt chunk after its cached keys); without it
    they are 0 and 1 at compile time, the plain kernel's code."""
    dtype: gl.constexpr = desc_q.dtype
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [Q_BUFS * NUM_WG, 64, HEAD_DIM], tile_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    # one ready/empty pair per Q tile: each consumer warpgroup hands its own tile back
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_BUFS * NUM_WG, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS * NUM_WG, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    k_done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(Q_BUFS * NUM_WG):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=NUM_WG)
    for i in gl.static_range(NUM_WG):
        mbarrier.init(turn.index(i), count=1)
    mbarrier.init(k_done.index(0), count=NUM_WG)
    mbarrier.arrive(turn.index(0))  # the first warpgroup issues first
    fence_async_shared()

    # Shared memory and barriers travel as one tuple, the problem sizes as another. The compile-time
    # sizes are written out in each partition's literal argument list: an argument tuple built
    # elsewhere (assigned, or joined with +) loses their constexpr-ness in Triton 3.6's Gluon.
    smem = (q_smem, k_smem, v_smem, q_ready, q_empty, kv_ready, kv_empty, turn, k_done)
    dims = (batch, num_heads, seq_q, seq_kv, q_offset, kv_group)
    if NUM_WG == 2:
        gl.warp_specialize(
            [
                (_consumer_default, (desc_o, smem, dims, qk_scale, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS,
                                     CAUSAL, PINGPONG, PAIRS, O_IN_K, CHUNK)),
                (_consumer, (desc_o, smem, dims, qk_scale, 1, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS,
                             CAUSAL, PINGPONG, PAIRS, O_IN_K, CHUNK)),
                (_producer, (desc_q, desc_k, desc_v, smem, dims, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS,
                             CAUSAL, PAIRS, SPLIT_Q, CHUNK)),
            ],
            [4, 1],
            [240, 24],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_consumer_default, (desc_o, smem, dims, qk_scale, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS,
                                     CAUSAL, PINGPONG, PAIRS, O_IN_K, CHUNK)),
                (_consumer, (desc_o, smem, dims, qk_scale, 1, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS,
                             CAUSAL, PINGPONG, PAIRS, O_IN_K, CHUNK)),
                (_consumer, (desc_o, smem, dims, qk_scale, 2, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS,
                             CAUSAL, PINGPONG, PAIRS, O_IN_K, CHUNK)),
                (_producer, (desc_q, desc_k, desc_v, smem, dims, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, Q_BUFS,
                             CAUSAL, PAIRS, SPLIT_Q, CHUNK)),
            ],
            [4, 4, 1],
            [160, 160, 24],
        )  # fmt: skip


# Registers per thread at launch: the SM's 64 K registers over (NUM_WG + 1) warpgroups. The
# warp_specialize calls above then move them with setmaxnreg: the producer warpgroup drops to 24 and
# the consumers rise to 240 (2 consumers) or 160 (3), all multiples of 8 within the same 64 K.
_MAXNREG = {2: 168, 3: 128}


def _desc(t: Any, rows: int, head_dim: int) -> TensorDescriptor:
    """The 4-D copy-engine descriptor of `t` with [1, 1, rows, head_dim] boxes (cached: see below)."""
    return _cached_desc(t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()), rows, head_dim)


@functools.lru_cache(maxsize=512)
def _cached_desc(
    ptr: int, dtype: Any, shape: tuple, strides: tuple, rows: int, head_dim: int
) -> TensorDescriptor:
    """Building a descriptor costs ~13 us of Python; serving loops (and TensorRT, which keeps its
    buffers) launch on the same buffers again and again. The descriptor only records the address,
    shape and strides (its base is a non-owning view), so a reused address is harmless."""
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], _gl_dtype(dtype))
    shape, strides = tuple(int(n) for n in shape), tuple(int(x) for x in strides)
    base = DeviceTensor(int(ptr), dtype, shape, strides)
    return TensorDescriptor(base, list(shape), list(strides), [1, 1, rows, head_dim], layout)


def _gl_dtype(dtype: Any) -> Any:
    name = str(dtype).rsplit(".", 1)[-1]
    return {"float16": gl.float16, "bfloat16": gl.bfloat16}[name]


@functools.lru_cache(maxsize=8)
def _sm_count(device: int) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


# Compiled kernels by (config, dtype, head dim, causal, chunk, device): all the compiled code depends on
# (the descriptors' types follow from dtype, head dim and config; integers are not specialized).
_COMPILED: dict[tuple, Any] = {}
_I32 = 2**31


def _no_launch_hooks() -> bool:
    """No profiler (e.g. Proton) hooks kernel launches: those must see every launch through the JIT."""
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return all(hook is None or not getattr(hook, "calls", True) for hook in hooks)


def launch(
    q: Any, k: Any, v: Any, out: Any, scale: float, causal: bool, config: HopperConfig, q_offset: int = 0
) -> None:
    """Launch one configuration on torch's current stream; q/k/v/out are [B, H, S, D] views that
    the caller checked (kernel._hopper_eligible: FP16/BF16, D 64/128, copy-engine-aligned strides).
    K/V may have fewer heads than q (grouped-query attention: query head h reads kv head h // (H /
    Hkv)). Causal masks align query row i with key position i + `q_offset` (0: the top-left corner;
    seq_kv - seq_q: the bottom-right one, a prompt chunk after its cached keys).

    The first launch of a compiled variant goes through Triton's JIT; later ones call the compiled
    kernel directly, skipping the JIT's per-call argument binding (~65 us of Python per launch).
    """
    b, h, s_q, d = (int(n) for n in q.shape)
    s_kv, h_kv = int(k.shape[2]), int(k.shape[1])
    if h_kv < 1 or h % h_kv or tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(
            f"K {tuple(k.shape)} and V {tuple(v.shape)} must share [B, Hkv, S], "
            f"with q's {h} heads a multiple of Hkv"
        )
    if q_offset < 0:
        raise ValueError(f"q_offset must be >= 0; got {q_offset}")
    chunk = bool(q_offset) or h_kv != h  # else the plain kernel, compiled without either
    device = driver.active.get_current_device()
    n_m = triton.cdiv(s_q, config.block_m)
    units = (n_m + 1) // 2 * h * b if causal and config.pairs else n_m * h * b  # _units_per_head
    programs = max(1, min(units, _sm_count(device))) if config.persistent else units
    args = (
        _desc(q, WG_ROWS, d),
        _desc(k, config.block_n, d),
        _desc(v, config.block_n, d),
        _desc(out, WG_ROWS, d),
        b,
        h,
        s_q,
        s_kv,
        int(q_offset),
        h // h_kv,
        float(scale),
        config.num_wg,
        d,
        config.block_n,
        config.stages,
        config.q_bufs,
        bool(causal),
        config.pingpong,
        config.pairs,
        config.split_q,
        config.o_in_k,
        chunk,
    )
    key = (config, q.dtype, d, bool(causal), chunk, device)
    kernel = _COMPILED.get(key)
    direct = _no_launch_hooks() and all(-_I32 <= x < _I32 for x in args[4:10])
    if kernel is None or not direct:
        kernel = _attn_fwd_ws[(programs,)](*args, num_warps=4, maxnreg=_MAXNREG[config.num_wg])
        if direct and hasattr(kernel, "run") and not hasattr(kernel, "result"):
            _COMPILED[key] = kernel
        return
    stream = driver.active.get_current_stream(device)
    kernel.run(programs, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)
