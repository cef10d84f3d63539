"""One-row INT4 GEMVs on the tensor cores: the decode projections of weight-only INT4 at one token.

The FMA GEMV (:mod:`trtforge.kernels.gemv`) spends about three instructions on every weight element
(unpack, subtract the float bias, FMA), so at one token it is bound by instruction issue, not by
HBM: 1.5-1.9 TB/s of INT4 bytes on an H200. Here each warp turns a 32-bit word of eight codes into
its share of a 16 x 16 weight tile in four ``lop3`` ops and three shifts, and one ``mma.sync
m16n8k16`` (16-bit operands, FP32 accumulation) multiplies the tile by x: one instruction an element
in the inner loop, 1.4-1.9 with the loads and each group's epilogue (sm_90 SASS):

- a code q becomes the 16-bit float ``BIAS + q`` by OR-ing it into the mantissa of ``BIAS`` (bf16:
  128, fp16: 1024; exact), so the product sums ``BIAS * sum(x) + sum(q * x)``, in FP32;
- per group of 128 along K a second MMA, of a tile of ones, sums x in the same fragment layout, and
  ``scale * acc + (offset - BIAS * scale) * sum(x)`` folds the group's scale and offset in FP32;
- x is the B operand: its 8 columns are x's one row repeated (each column gives the same sums).

The codes are stored in the MMA's fragment order (:func:`pack_int4_mma`): for each 16-row tile and
group, 32 lanes x 8 k-tiles of 32-bit words, each lane's eight words contiguous (two 16-byte loads).
Within a group, lane t's B fragments are x's 16 contiguous words from ``16 t`` (four 16-byte loads);
the packing permutes k to match, so the products pair the right elements. Warps split K (a group
each in turn) and sum their partials at the end. With the RMSNorm prologue the program first writes
the normalized row to shared memory (rounded as the eager path: ``x * rstd`` to the dtype, times the
norm weight, to the dtype); the gated form takes a gate tile and the matching up tile and returns
``silu(gate) * up``; the residual form adds the residual to the FP32 sum.

The packed copy is made once per weight (:func:`mma_words`, by :func:`trtforge.kernels.gemv.prepare`
before graphs are captured) and kept beside the group-interleaved codes, which prefill and the FMA
kernel still read: half a byte more per weight. Products are exact and sums FP32, but the sums carry
``BIAS * sum(x)`` until the epilogue takes it out, so their rounding is that much coarser than the FMA
kernel's: in a CPU simulation at K = 4096 (FP16, BIAS 1024) the largest error was 1.5e-4 against 9e-7,
and 16 of 256 outputs rounded to the neighbouring 16-bit value (BF16's BIAS of 128 costs ~8x less).

The MMAs and the unpacking are inline PTX (``mma.sync`` on registers the layout puts in each lane),
written in Gluon for its explicit layouts: the tensors are indexed ``[warp, tile, lane/4, lane%4,
k-tile]``, so the 32 lanes of a warp hold one tile's fragments in the same registers.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from trtforge.kernels.qweight import INT4_GROUP, Int4Weight

TILE_ROWS = 16  # weight rows an MMA tile holds
# Launch rule from the H200 sweep (benchmarks/bench_int4_mma.py --warps 8 4 --groups 4 2 1,
# results/int4_mma_sweep_s20.json; Llama-3-8B shapes, us against the FMA kernel's default): gate_up + SiLU
# 4 warps, a group at a time, 24.0 (FMA 34.7); qkv + norm 8 warps, one group, 7.87 (9.65); down +
# residual 8 warps, two groups, 14.1 (17.0); o + residual (4 groups a warp) is slower here at best (6.52
# against 5.32), so it stays on the FMA kernel. Four groups at once took 150-230 registers (one program
# an SM) and lost everywhere (the kernel now takes one or two); so did a cp.async ring of 3, 4 or 6
# groups in shared memory (commit 7eb9a6b, removed after: a layer's three 50.5-56.2 us against 46.1,
# results/int4_mma_stages_s20.json). None: the module's rule; a tuple (warps, groups): forced, for sweeps.
MMA_WARPS: int | None = None
GROUPS_PER_ITERATION: int | None = None
MIN_GROUPS_PER_WARP_RESIDUAL = 8  # residual form: fewer groups a warp than this go to the FMA kernel
# True: launched as a programmatic dependent launch (where the caller says the GPU has it), each program
# prefetches its first groups' words into L2, then waits for the previous kernel (as the FMA kernels do:
# they request their first weight chunk before griddepcontrol.wait). H200, session 21 (results/
# int4_mma_s21.json, quant_speed_s21_single.json): gate_up 23.35 us against 24.02, down 13.27 against
# 13.99, qkv 8.23 against 7.95; 8B INT4 + FP8 head single stream 2.111 ms/token against 2.175.
# Deeper prefetches (a bulk L2 prefetch of 1-8 groups a warp ahead, or all of them) measured slower in
# every form (commit 9962b22, results/int4_mma_pf_s21.json: gate_up 25.3-30.5 us).
EARLY_WEIGHTS = True
# A register cap on every form, for sweeps (None: ptxas's choice, or GATED_MAXNREG for the gated form).
# At 72 (results/int4_mma_s21.json): gate_up 23.10 us against 24.02, qkv 7.93 against 7.95, down 20.71
# against 13.99 (it spills in the loop), hence the gated form's own cap below.
MAXNREG: int | None = None
# Tried and removed (session 54, revert of b303b5c): two register sets taken in turn, each reloaded two
# groups ahead, so that no loop-carried copy waits for loads in flight (the hottest stall in session 53's
# ncu profile). ptxas still issued both sets' reloads after both groups' products. H100
# (results/int4_mma_ping_s54_h100.json, quant_speed_s54_ab_h100.json): qkv 7.66 us against 7.75, gate_up
# 26.26 against 26.34, down 13.64 against 13.73; the 8B INT4 + FP8 head token 2.254 ms against 2.227,
# and 2.631 with the gated form too (it spills at GATED_MAXNREG).
# True: each warp's first U groups of words, scales and offsets are loaded into registers at the start,
# before the PDL wait and the RMSNorm prologue (x's words after the wait), not prefetched into L2 there
# and loaded after the prologue. H200 (results/int4_mma_s22.json, quant_speed_s22_fix.json): gate_up 22.59
# -> 21.43 us, down 13.46 -> 12.62; 8B INT4 + FP8 head single stream 2.062 -> 2.004 ms/token.
FIRST_LOADS_EARLY = True
# True: the RMSNorm prologue reads x once, a whole row a program in registers (up to ONE_PASS_MAX_K), rather
# than twice in chunks (sum of squares, then the normalized row). Measured no better (same files): gate_up
# 22.29 alone, 21.58 with the first loads early; single stream 2.032 alone, 2.006 with them (2.004 without).
ONE_PASS_NORM = False
ONE_PASS_MAX_K = 8192
# The gated form's register cap (None: ptxas's 96 with PDL, 5 programs an SM, two waves of 896). At 72 7 fit
# (one wave; ptxas spills 16 bytes to L1): gate_up 23.10 us against 24.02 (early weights off,
# results/int4_mma_s21.json); 8B INT4 + FP8 head single stream 2.046 ms/token against 2.097
# (quant_speed_s21_graphfused.json).
GATED_MAXNREG: int | None = 72
# The norm form's (QKV's) register cap (None: ptxas's choice, 64 registers on sm_90). With MAXNREG 88 on
# every form, qkv took 6.81 us against 7.75 on an H100 (session 54, results/int4_mma_ping_s54_h100.json),
# where gate_up and down got slower. On the norm form alone, the 8B INT4 + FP8 head single stream on an H100
# (session 56, five rounds side by side over two calls, every round faster): 2.189-2.194 ms/token (medians)
# against 2.224-2.226, 0.418x BF16 against 0.425x (results/quant_ab_s56_h100*.json); FP8 and BF16 do not
# launch this kernel.
NORM_MAXNREG: int | None = 88


def register_cap(gated: bool, norm: bool) -> int | None:
    """The ``maxnreg`` a form launches with: MAXNREG for every form where set, else the gated form's
    GATED_MAXNREG or the norm form's NORM_MAXNREG; None: ptxas's choice."""
    return MAXNREG or (GATED_MAXNREG if gated else NORM_MAXNREG if norm else None)


def launch_rule(k: int, gated: bool, norm: bool) -> tuple[int, int] | None:
    """(warps, groups a warp at once) for a one-row projection over K, or None: the FMA kernel's."""
    groups = k // INT4_GROUP
    if MMA_WARPS is not None:
        warps = MMA_WARPS
        u = GROUPS_PER_ITERATION or 1
    elif gated:
        warps, u = 4, 1
    elif norm:
        warps, u = 8, 1
    else:
        warps, u = 8, 2
        if groups // warps < MIN_GROUPS_PER_WARP_RESIDUAL:
            return None
    if groups % warps:
        return None
    u = 2 if u >= 2 else 1  # the kernel takes one or two groups at once
    while (groups // warps) % u:
        u //= 2
    return warps, u


MAX_NORM_K = 16384  # the normalized row is staged in shared memory (2 bytes an element, to a power of 2)


def pack_int4_mma(codes: torch.Tensor, group_size: int = INT4_GROUP) -> torch.Tensor:
    """int32 ``[N/16, K/128, 32, 8]`` of 4-bit `codes` ``[N, K]`` in the MMA fragment order.

    Word j of lane l = 4g + t (tile of rows 16r.., group of k 128c..) holds, at bits 4s and 16 + 4s
    (s = 0..3), the codes of row ``16r + g + 8 (s & 1)`` at ``k = 128c + 32t + 4j + 2(s >> 1)`` and
    ``+ 1``: the A fragment of ``mma.m16n8k16`` (registers {a0,a1}, {a2,a3}, {a4,a5}, {a6,a7}) for
    the B fragments lane t loads (x's words ``64c + 16t + 2j`` and ``+ 1``)."""
    n, k = codes.shape
    if n % TILE_ROWS or k % group_size or group_size != INT4_GROUP:
        raise ValueError(
            f"the INT4 MMA packing takes rows in tiles of {TILE_ROWS} and groups of {INT4_GROUP}; "
            f"got [{n}, {k}] with groups of {group_size}"
        )
    c = codes.to(torch.int32).view(n // 16, 2, 8, k // 128, 4, 8, 2, 2)  # [r, hi8, g, grp, t, j, h, e]
    words = torch.zeros(n // 16, k // 128, 8, 4, 8, dtype=torch.int32, device=codes.device)  # [r,grp,g,t,j]
    for s in range(4):
        part = c[:, s & 1, :, :, :, :, s >> 1]  # [r, g, grp, t, j, e]
        lo, hi = part[..., 0].permute(0, 2, 1, 3, 4), part[..., 1].permute(0, 2, 1, 3, 4)
        words |= (lo << (4 * s)) | (hi << (16 + 4 * s))
    return words.reshape(n // 16, k // 128, 32, 8).contiguous()


def mma_words(w: Int4Weight) -> torch.Tensor:
    """`w`'s codes in :func:`pack_int4_mma`'s order, made once and kept on the weight."""
    words = w.__dict__.get("_mma_words")
    if words is None:
        words = pack_int4_mma(w.codes(), w.group_size)
        object.__setattr__(w, "_mma_words", words)  # (a cache, not a field: rows() and cat start afresh)
    return words


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def eligible(w: Int4Weight, n: int, gated: bool, norm: bool, device: torch.device) -> bool:
    """Whether this kernel takes a one-row projection of `w` in that form (`n` output columns; gated:
    gate/up pairs) on `device`: an NVIDIA GPU with 16-bit MMAs (sm_80+), whole tiles of rows, a launch
    for its K (:func:`launch_rule`), a staged row that fits, scales and offsets laid out alike."""
    k = int(w.shape[1])
    return (
        device.type == "cuda"
        and torch.version.hip is None  # (inline PTX: NVIDIA GPUs only)
        and _capability(device) >= (8, 0)
        and w.group_size == INT4_GROUP
        and n % TILE_ROWS == 0
        and k % INT4_GROUP == 0
        and launch_rule(k, gated, norm) is not None
        and (not norm or k <= MAX_NORM_K)
        and w.scale.stride(1) == 1
        and tuple(w.offset.stride()) == tuple(w.scale.stride())
    )


def prepared_words(w: Int4Weight) -> torch.Tensor | None:
    """`w`'s packing if :func:`mma_words` made it (the dispatch never packs in the hot path)."""
    return w.__dict__.get("_mma_words")


def supported(x: torch.Tensor, w: Int4Weight, n: int, gated: bool, norm: bool) -> bool:
    """Whether this kernel runs ``x @ w^T`` now: one row of a 16-bit x, `w` :func:`eligible` for the form
    and already packed (:func:`trtforge.kernels.gemv.prepare`)."""
    return (
        prepared_words(w) is not None
        and int(x.shape[0]) == 1
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.stride(1) == 1
        and x.data_ptr() % 16 == 0
        and eligible(w, n, gated, norm, x.device)
    )


_sl = gl.SliceLayout


@gluon.jit
def _iota(N: gl.constexpr, DIM: gl.constexpr, L: gl.constexpr):
    """``arange(N)`` along dimension DIM of the rank-5 layout L, size 1 along the others."""
    if DIM == 0:
        v = gl.arange(0, N, layout=_sl(1, _sl(2, _sl(3, _sl(4, L)))))
        r = v[:, None, None, None, None]
    elif DIM == 1:
        v = gl.arange(0, N, layout=_sl(0, _sl(2, _sl(3, _sl(4, L)))))
        r = v[None, :, None, None, None]
    elif DIM == 2:
        v = gl.arange(0, N, layout=_sl(0, _sl(1, _sl(3, _sl(4, L)))))
        r = v[None, None, :, None, None]
    elif DIM == 3:
        v = gl.arange(0, N, layout=_sl(0, _sl(1, _sl(2, _sl(4, L)))))
        r = v[None, None, None, :, None]
    else:
        v = gl.arange(0, N, layout=_sl(0, _sl(1, _sl(2, _sl(3, L)))))
        r = v[None, None, None, None, :]
    return r


@gluon.jit
def _split8(t, L4: gl.constexpr, TRIVIAL: gl.constexpr = True):
    """The 8 slices ``t[..., j]`` (j = 0..7) of a tensor whose last dimension lies within each thread."""
    t = gl.reshape(t, [t.shape[0], t.shape[1], t.shape[2], t.shape[3], 2, 2, 2])  # j = 4 i0 + 2 i1 + i2
    a, b = gl.split(t)  # i2 = 0, 1
    a0, a1 = gl.split(a)  # i1
    b0, b1 = gl.split(b)
    a00, a01 = gl.split(a0)  # i0
    a10, a11 = gl.split(a1)
    b00, b01 = gl.split(b0)
    b10, b11 = gl.split(b1)
    return (
        gl.convert_layout(a00, L4, assert_trivial=TRIVIAL),
        gl.convert_layout(b00, L4, assert_trivial=TRIVIAL),
        gl.convert_layout(a10, L4, assert_trivial=TRIVIAL),
        gl.convert_layout(b10, L4, assert_trivial=TRIVIAL),
        gl.convert_layout(a01, L4, assert_trivial=TRIVIAL),
        gl.convert_layout(b01, L4, assert_trivial=TRIVIAL),
        gl.convert_layout(a11, L4, assert_trivial=TRIVIAL),
        gl.convert_layout(b11, L4, assert_trivial=TRIVIAL),
    )


@gluon.jit
def _split2(t):
    """``t[..., 0::2]`` and ``t[..., 1::2]`` of a rank-5 tensor (pairs within each thread)."""
    return gl.split(gl.reshape(t, [t.shape[0], t.shape[1], t.shape[2], t.shape[3], t.shape[4] // 2, 2]))


@gluon.jit
def _unpack(w, MAGIC: gl.constexpr):
    """A word's 8 codes as the four 16-bit-pair registers of an A fragment, each code q as BIAS + q."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 t; lop3.b32 $0, $4, 0x000F000F, " + MAGIC + ", 0xEA; shr.u32 t, $4, 4; "
        "lop3.b32 $1, t, 0x000F000F, " + MAGIC + ", 0xEA; shr.u32 t, $4, 8; "
        "lop3.b32 $2, t, 0x000F000F, " + MAGIC + ", 0xEA; shr.u32 t, $4, 12; "
        "lop3.b32 $3, t, 0x000F000F, " + MAGIC + ", 0xEA; }",
        "=r,=r,=r,=r,r",
        [w],
        dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, TY: gl.constexpr):
    """``c + A @ B`` for one m16n8k16 tile a lane's fragments at a time (FP32 accumulators)."""
    return gl.inline_asm_elementwise(
        "mma.sync.aligned.m16n8k16.row.col.f32." + TY + "." + TY + ".f32 "
        "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
        [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
        dtype=(gl.float32, gl.float32, gl.float32, gl.float32),
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _group_loads(it, w_ptrs, x_ptrs, Scales, Offsets, row_off, stride_sn, w4, ok, NW: gl.constexpr,
                 NORM: gl.constexpr):  # fmt: skip
    """The global loads of a warp's group `it` (warp w takes group ``it * NW + w``), none unless `ok`:
    its words, x's words (unless NORM: then from shared memory), rows g and g + 8's float16 scales and
    offsets."""
    grp = it * NW + w4
    ok = gl.to_tensor(ok)
    words = gl.load(w_ptrs + it * NW * 256, mask=ok)
    x = gl.load(x_ptrs + it * NW * 64, mask=ok) if not NORM else words
    s_g = gl.load(Scales + row_off + grp, mask=ok)
    o_g = gl.load(Offsets + row_off + grp, mask=ok)
    s_g8 = gl.load(Scales + row_off + 8 * stride_sn + grp, mask=ok)
    o_g8 = gl.load(Offsets + row_off + 8 * stride_sn + grp, mask=ok)
    return words, x, s_g, o_g, s_g8, o_g8


@gluon.jit
def _group_mma(loads, xs, gi, tot0, tot2, ones, zero, zero1, L4: gl.constexpr, LX: gl.constexpr,
               R: gl.constexpr, MAGIC: gl.constexpr, TY: gl.constexpr, BIAS: gl.constexpr,
               NORM: gl.constexpr):  # fmt: skip
    """`tot0` / `tot2` (rows g / g + 8 of each tile) plus one group's products, its scales and offsets
    folded in: ``scale * sum((BIAS + q) x) + (offset - BIAS * scale) * sum(x)``."""
    words, x, s_g, o_g, s_g8, o_g8 = loads
    if NORM:
        xc = xs.index(gi).load(LX)
    else:
        xc = x
    ws = _split8(words, L4)
    xb0, xb1 = _split2(xc)
    b0s = _split8(xb0, L4, R == 1)  # (R > 1: L4 repeats x's registers along the tiles)
    b1s = _split8(xb1, L4, R == 1)
    c0, c1, c2, c3 = zero, zero, zero, zero
    x0, x1, x2, x3 = zero1, zero1, zero1, zero1
    for j in gl.static_range(8):
        a0, a1, a2, a3 = _unpack(ws[j], MAGIC)
        c0, c1, c2, c3 = _mma(a0, a1, a2, a3, b0s[j], b1s[j], c0, c1, c2, c3, TY)
        x0, x1, x2, x3 = _mma(ones, ones, ones, ones, b0s[j], b1s[j], x0, x1, x2, x3, TY)
    sf, sf8 = s_g.to(gl.float32), s_g8.to(gl.float32)
    tot0 += sf * c0 + (o_g.to(gl.float32) - BIAS * sf) * x0
    tot2 += sf8 * c2 + (o_g8.to(gl.float32) - BIAS * sf8) * x0
    return tot0, tot2


@gluon.jit
def _prefetch_l2(ptrs):
    """``prefetch.global.L2`` of every address in `ptrs` (no registers, no wait)."""
    gl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; // dummy $0",
        "=r,l",
        [ptrs.to(gl.int64)],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _griddep(op: gl.constexpr):
    """A programmatic-dependent-launch control instruction (``griddepcontrol.wait`` or
    ``.launch_dependents``; both no-ops when the launch is not PDL)."""
    gl.inline_asm_elementwise(op + " // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _loop_setup(X, Wm, stride_sn, tile, word_off, xw_i, w_i, g_i, j_i, ONE: gl.constexpr, L4: gl.constexpr,
                NW: gl.constexpr, R: gl.constexpr):  # fmt: skip
    """The main loop's constants: the ones tile (x's sums), zeroed accumulators, each warp's index, the
    word / x-word pointers and the rows' offsets into the scales and offsets (rows g and g + 8 of a tile)."""
    ones = gl.full([NW, 1, 8, 4], ONE, gl.int32, layout=L4)
    zero = gl.zeros([NW, R, 8, 4], gl.float32, layout=L4)
    zero1 = gl.zeros([NW, 1, 8, 4], gl.float32, layout=L4)
    w4 = gl.max(w_i + j_i * 0, 4)  # [NW, 1, 1, 1]
    w_ptrs = Wm + word_off + w_i * 256
    x_ptrs = X.to(gl.pointer_type(gl.int32)) + xw_i
    row_off = gl.max(tile * 16 + g_i + j_i * 0, 4) * stride_sn  # [NW, R, 8, 4] (constant along j)
    return ones, zero, zero1, w4, w_ptrs, x_ptrs, row_off


@gluon.jit
def _int4_mma_kernel(
    X, Wm, Scales, Offsets, Out, Res, NormW, NG, stride_sn, up_tiles, eps, K,
    NORM: gl.constexpr, GATED: gl.constexpr, HAS_RES: gl.constexpr, NW: gl.constexpr, R: gl.constexpr,
    BF16: gl.constexpr, KW: gl.constexpr, U: gl.constexpr, PDL: gl.constexpr = False,
    FIRST_EARLY: gl.constexpr = False, ONE_PASS: gl.constexpr = False,
):  # fmt: skip
    """Out[n] = epilogue(sum_k prologue(x)[k] * W[n, k]) for R tiles of 16 rows (gated: the gate tile
    ``pid`` and the up tile ``up_tiles + pid``)."""
    L: gl.constexpr = gl.BlockedLayout([1, R, 1, 1, 8], [1, 1, 8, 4, 1], [NW, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    LX: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 16], [1, 1, 8, 4, 1], [NW, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    L4: gl.constexpr = gl.SliceLayout(4, L)
    if BF16:
        MAGIC: gl.constexpr = "0x43004300"
        BIAS: gl.constexpr = 128.0
        TY: gl.constexpr = "bf16"
        ONE: gl.constexpr = 0x3F803F80
    else:
        MAGIC: gl.constexpr = "0x64006400"
        BIAS: gl.constexpr = 1024.0
        TY: gl.constexpr = "f16"
        ONE: gl.constexpr = 0x3C003C00
    pid = gl.program_id(0)
    w_i = _iota(NW, 0, L)
    g_i = _iota(8, 2, L)
    t_i = _iota(4, 3, L)
    j_i = _iota(8, 4, L)
    r_i = _iota(R, 1, L)
    if GATED:
        tile = pid + r_i * up_tiles
    else:
        tile = pid * R + r_i
    word_off = (tile * NG * 32 + g_i * 4 + t_i) * 8 + j_i  # + group * 256
    xw_i = _iota(NW, 0, LX) * 64 + _iota(4, 3, LX) * 16 + _iota(16, 4, LX)  # + it * NW * 64
    if FIRST_EARLY:
        # the first U groups' words, scales and offsets into registers before anything waits (constants:
        # safe to read before the previous kernel ends) or the RMSNorm prologue runs; x's words after
        ones, zero, zero1, w4, w_ptrs, x_ptrs, row_off = _loop_setup(
            X, Wm, stride_sn, tile, word_off, xw_i, w_i, g_i, j_i, ONE, L4, NW, R
        )
        l0 = _group_loads(0, w_ptrs, x_ptrs, Scales, Offsets, row_off, stride_sn, w4, True, NW, True)
        l1 = _group_loads(1, w_ptrs, x_ptrs, Scales, Offsets, row_off, stride_sn, w4, U > 1, NW, True)
    if PDL:
        if not FIRST_EARLY:
            # before the previous kernel's writes are waited for: its first U groups' words (each lane's 32
            # bytes) into L2 (constants: safe to read early; the scales' lines are left to the loop)
            first = gl.min(word_off, 4) + gl.max(w_i + j_i * 0, 4) * 256  # [NW, R, 8, 4]: each lane's word 0
            for u in gl.static_range(U):
                _prefetch_l2(Wm + first + u * NW * 256)
        _griddep("griddepcontrol.wait;")  # x and the residual: the previous kernel's, visible from here
        _griddep("griddepcontrol.launch_dependents;")  # the next kernel may start its own prefetching
    KWP: gl.constexpr = 1 << (KW - 1).bit_length()  # (shapes are powers of two: the tail unused)
    if NORM and ONE_PASS:  # the normalized row into shared memory, x read once (a whole row a program)
        XL1: gl.constexpr = gl.BlockedLayout([KWP * 2 // (32 * NW)], [32], [NW], [0])
        offs1 = gl.arange(0, KWP * 2, layout=XL1)
        ok1 = offs1 < K
        xv1 = gl.load(X + offs1, mask=ok1, other=0.0)
        xf1 = xv1.to(gl.float32)
        rstd = gl.rsqrt(gl.sum(xf1 * xf1, 0) / K + eps)
        nw1 = gl.load(NormW + offs1, mask=ok1, other=0.0)
        smem = gl.allocate_shared_memory(X.dtype.element_ty, [KWP * 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        smem.store(((xf1 * rstd).to(X.dtype.element_ty) * nw1).to(X.dtype.element_ty))
        gl.thread_barrier()
        xs = smem._reinterpret(gl.int32, [KWP // (64 * NW), NW, 1, 1, 4, 16],
                               gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0]))  # fmt: skip
    elif NORM:  # the normalized row into shared memory, in chunks of CH (x read twice)
        CH: gl.constexpr = 4 * 32 * NW
        XL: gl.constexpr = gl.BlockedLayout([4], [32], [NW], [0])
        offs = gl.arange(0, CH, layout=XL)
        sq = gl.zeros([CH], gl.float32, layout=XL)
        for c in gl.static_range(KW * 2 // CH):
            xv = gl.load(X + c * CH + offs).to(gl.float32)
            sq += xv * xv
        rstd = gl.rsqrt(gl.sum(sq, 0) / K + eps)
        smem = gl.allocate_shared_memory(X.dtype.element_ty, [KWP * 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        for c in gl.static_range(KW * 2 // CH):
            xv = gl.load(X + c * CH + offs).to(gl.float32)
            nw = gl.load(NormW + c * CH + offs)
            smem.slice(c * CH, CH).store(((xv * rstd).to(X.dtype.element_ty) * nw).to(X.dtype.element_ty))
        gl.thread_barrier()
        xs = smem._reinterpret(gl.int32, [KWP // (64 * NW), NW, 1, 1, 4, 16],
                               gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0]))  # fmt: skip
    else:
        xs = 0  # (unused: x comes from global memory)
    if not FIRST_EARLY:
        # (set up only here, after the wait and the prologue: set up before them, the gated form's registers
        # at GATED_MAXNREG spilled 204 bytes, not 16, and INT4 single stream ran 2.88 ms/token, not 2.05)
        ones, zero, zero1, w4, w_ptrs, x_ptrs, row_off = _loop_setup(
            X, Wm, stride_sn, tile, word_off, xw_i, w_i, g_i, j_i, ONE, L4, NW, R
        )
        l0 = _group_loads(0, w_ptrs, x_ptrs, Scales, Offsets, row_off, stride_sn, w4, True, NW, NORM)
        l1 = _group_loads(1, w_ptrs, x_ptrs, Scales, Offsets, row_off, stride_sn, w4, U > 1, NW, NORM)
    elif not NORM:
        x0 = gl.load(x_ptrs, mask=gl.to_tensor(True))
        x1 = gl.load(x_ptrs + NW * 64, mask=gl.to_tensor(U > 1))
        l0 = (l0[0], x0, l0[2], l0[3], l0[4], l0[5])
        l1 = (l1[0], x1, l1[2], l1[3], l1[4], l1[5])
    tot0 = zero
    tot2 = zero
    # U (1 or 2) groups a warp an iteration, all requested one iteration ahead (a group's loads alone do not
    # cover HBM's latency): the next iteration's are in flight while this one's MMAs run
    ITERS = (NG // NW) // U
    for it in range(ITERS):
        g0 = (it + 1) * U
        more = it + 1 < ITERS
        n0 = _group_loads(g0, w_ptrs, x_ptrs, Scales, Offsets, row_off, stride_sn, w4, more, NW, NORM)
        n1 = _group_loads(
            g0 + 1, w_ptrs, x_ptrs, Scales, Offsets, row_off, stride_sn, w4, more & (U > 1), NW, NORM
        )
        tot0, tot2 = _group_mma(
            l0, xs, it * U, tot0, tot2, ones, zero, zero1, L4, LX, R, MAGIC, TY, BIAS, NORM
        )
        if U > 1:
            tot0, tot2 = _group_mma(
                l1, xs, it * U + 1, tot0, tot2, ones, zero, zero1, L4, LX, R, MAGIC, TY, BIAS, NORM
            )
        l0, l1 = n0, n1
    tot0 = gl.sum(tot0, 0)  # [R, 8, 4]: the warps' partials summed
    tot2 = gl.sum(tot2, 0)
    L3: gl.constexpr = gl.SliceLayout(0, L4)
    r3 = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
    g3 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None]
    t3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    dtype = Out.dtype.element_ty
    if GATED:
        # [R=2, 8, 4] -> gate and up
        gate0, up0 = gl.split(gl.permute(tot0, [1, 2, 0]))
        gate2, up2 = gl.split(gl.permute(tot2, [1, 2, 0]))
        L2: gl.constexpr = gl.SliceLayout(0, L3)
        g2 = gl.arange(0, 8, layout=gl.SliceLayout(1, L2))[:, None]
        t2 = gl.arange(0, 4, layout=gl.SliceLayout(0, L2))[None, :]
        gate0 = gl.convert_layout(gate0, L2)
        up0 = gl.convert_layout(up0, L2)
        gate2 = gl.convert_layout(gate2, L2)
        up2 = gl.convert_layout(up2, L2)
        rows = pid * 16 + g2 + t2 * 0
        g = gate0.to(dtype).to(gl.float32)
        a = (g / (1.0 + gl.exp(-g))).to(dtype).to(gl.float32) * up0.to(dtype).to(gl.float32)
        gl.store(Out + rows, a.to(dtype), mask=t2 == 0)
        g = gate2.to(dtype).to(gl.float32)
        a = (g / (1.0 + gl.exp(-g))).to(dtype).to(gl.float32) * up2.to(dtype).to(gl.float32)
        gl.store(Out + rows + 8, a.to(dtype), mask=t2 == 0)
    else:
        rows = (pid * R + r3) * 16 + g3 + t3 * 0
        if HAS_RES:
            tot0 += gl.load(Res + rows).to(gl.float32)
            tot2 += gl.load(Res + rows + 8).to(gl.float32)
        gl.store(Out + rows, tot0.to(dtype), mask=t3 == 0)
        gl.store(Out + rows + 8, tot2.to(dtype), mask=t3 == 0)


def emulate(words: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """float64 ``sum_k x[k] * q[n, k]`` ``[N]`` from packed `words` and x ``[K]``, through the PTX
    fragment tables of ``mma.m16n8k16`` (A: {a0,a1} row g, k 2t..2t+1; {a2,a3} row g+8; {a4,a5} row
    g, k 2t+8..; {a6,a7} row g+8, k 2t+8..; B: {b0,b1} k 2t..2t+1, {b2,b3} k 2t+8.., column g) and
    the kernel's choice of B (lane t's x words ``64c + 16t + 2j`` and ``+ 1``): what the kernel's
    products sum, computed independently of :func:`pack_int4_mma`, so a test can hold one to the other."""
    tiles, groups = int(words.shape[0]), int(words.shape[1])
    w = words.to(torch.int64).view(tiles, groups, 8, 4, 8)  # [r, c, g, t, j]
    nib = [((w >> (4 * s)) & 15, (w >> (16 + 4 * s)) & 15) for s in range(4)]  # reg s: (lo, hi)
    a = torch.zeros(tiles, groups, 8, 16, 16, dtype=torch.float64)  # [r, c, j, row, k in the tile]
    g = torch.arange(8)[:, None]
    t = torch.arange(4)[None, :]
    for s, (row_off, k_off) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        for e in range(2):
            vals = nib[s][e].permute(0, 1, 4, 2, 3).double()  # [r, c, j, g, t]
            a[:, :, :, g + row_off, 2 * t + k_off + e] = vals
    xw = x.double().view(groups, 4, 8, 2, 2)  # [c, t, j, word 2j / 2j+1, element]
    b = torch.zeros(groups, 8, 16, dtype=torch.float64)  # [c, j, k in the tile] (every column alike)
    for h in range(2):
        for e in range(2):
            b[:, :, 2 * torch.arange(4) + 8 * h + e] = xw[:, :, :, h, e].permute(0, 2, 1)
    out = torch.einsum("rcjnk,cjk->rn", a, b)
    return out.reshape(tiles * 16)


def launch(
    x: torch.Tensor,
    w: Int4Weight,
    out: torch.Tensor,
    n: int,
    *,
    res: torch.Tensor | None = None,
    norm_w: torch.Tensor | None = None,
    eps: float = 0.0,
    up_rows: int = 0,
    pdl: bool = False,
) -> None:
    """Write ``epilogue(prologue(x) @ dequantize(w)^T)`` ``[1, n]`` into `out` (the forms of
    :mod:`trtforge.kernels.gemv`: RMSNorm prologue with `norm_w`, gated with `up_rows` (the up rows
    start there; `out` then holds ``silu(gate) * up``), residual with `res`); see :func:`supported`.
    `pdl` (Hopper and later: :func:`trtforge.kernels.gemv.pdl_supported`) with :data:`EARLY_WEIGHTS`:
    a programmatic dependent launch that prefetches its first weights before it waits for the previous
    kernel."""
    k = int(x.shape[1])
    words = mma_words(w)
    gated = up_rows > 0
    if gated and up_rows % TILE_ROWS:
        raise ValueError(f"int4_mma: the up rows must start at a whole tile, not row {up_rows}")
    tiles_per_program = 2 if gated else 1
    rule = launch_rule(k, gated, norm_w is not None)
    if rule is None:
        raise ValueError(f"int4_mma: no launch for K={k} here (see supported())")
    warps, u = rule
    early = bool(pdl and EARLY_WEIGHTS)
    maxnreg = register_cap(gated, norm_w is not None)
    options = ({"launch_pdl": True} if early else {}) | ({"maxnreg": maxnreg} if maxnreg else {})
    grid = (n // TILE_ROWS,)
    _int4_mma_kernel[grid](
        x, words, w.scale, w.offset, out,
        res if res is not None else out,
        norm_w if norm_w is not None else out,
        k // INT4_GROUP, w.scale.stride(0), up_rows // TILE_ROWS, float(eps), k,
        NORM=norm_w is not None, GATED=gated, HAS_RES=res is not None, NW=warps, R=tiles_per_program,
        BF16=x.dtype == torch.bfloat16, KW=k // 2 if norm_w is not None else 0, U=u, PDL=early,
        FIRST_EARLY=FIRST_LOADS_EARLY, ONE_PASS=ONE_PASS_NORM and k <= ONE_PASS_MAX_K,
        num_warps=warps, **options,
    )  # fmt: skip
