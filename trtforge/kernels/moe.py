"""Fused sparse mixture-of-experts MLPs in Triton: every shape static, nothing read back to the host, so a
MoE layer can be captured in a CUDA graph (the design of vLLM's and SGLang's fused MoE).

A layer's N tokens each pick k of E experts: N * k (token, expert) pairs, pair p = token * k + slot.

1. :func:`align_block_size` sorts the pairs by expert on the device and pads each expert's segment to a
   multiple of BLOCK_M with a sentinel id (N * k), so that every BLOCK_M rows of the sorted list belong to
   one expert. Its outputs have sizes that depend only on N, k, E and BLOCK_M (an upper bound of the
   padded count, :func:`sorted_capacity`); the real padded count stays on the device (a 1-element tensor).
   Decode-sized calls do it in one Triton program, larger ones in torch ops.
2. Two launches of one grouped GEMM (:func:`fused_moe`). Its grid is the upper bound of M-blocks times
   the N-blocks; a program whose M-block starts past the real padded count returns at once. A program
   gathers its rows by pair id, multiplies them by its block's expert's weights (stacked ``[E, N, K]``,
   as transformers 5 stores ``gate_up_proj`` [E, 2 I, H] and ``down_proj`` [E, H, I]) in FP32, and
   stores by pair id (sentinel rows are skipped):

   a. gate_up: rows of x by token (pair // k), the gate and up rows (gate first) as two accumulators, the
      gated activation in the epilogue (``act(gate) * up``; ``silu`` only), one row per pair ``[N k, I]``;
   b. down: the intermediate row of each pair, times the pair's routing weight (any float dtype, widened
      to FP32), one row per pair ``[N k, H]`` in x's dtype; then the k rows of a token summed by a torch
      sum over k. Deterministic (no atomics): the same routing gives the same bits, eager or replayed.

gpt-oss's experts (transformers' GptOssExperts) are options of the same two launches (constexprs: off, the
kernel compiles as without them): the weights transposed (``[E, K, N]``, x @ W, read in place through
their strides), the gate / up columns interleaved (the tile of 2 BLOCK_N columns one accumulator, split in
the epilogue), per-expert biases added in FP32 before the activation and before the routing weight, and
the clamped SwiGLU (``gpt_oss_swiglu``, its alpha and limit float arguments). Aria's and Llama 4's experts
take the transposed option alone (``[E, H, 2 I]``, gate columns first, and ``[E, I, H]``, read in place), and
Llama 4's input scaling is one more (``scale_input``, constexpr ``SCALE_INPUT``): in the gate_up launch each
gathered row of x times its pair's routing weight, rounded to x's dtype before the dot (the reference's
``(x[t] * w).to(x.dtype)``), and the down launch not ROUTED (the k rows of a token summed unweighted).

The router beside them (:func:`route_topk`): a float32 softmax or sigmoid, top-k, renormalization and scale
in one launch, for the routers whose math is all float32 (:class:`trtforge.llm.models.moe.SparseMoe` decides).

Tiles come from a small fixed table by token count (per expert: :data:`MOE_CONFIGS`, which a benchmark may
replace): no autotuning at launch, which a graph capture could not hold. FP32 models multiply in IEEE FP32 (no
TF32), 16-bit ones on the tensor cores; every sum in FP32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from trtforge.kernels import interpreting

#: the activations the gate_up epilogue applies (a constexpr of the kernel)
ACTIVATIONS = ("silu", "gpt_oss_swiglu")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class MoeTile:
    """One launch's output columns and K chunk per program, warps, pipeline stages."""

    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class MoeConfig:
    """The launches of one layer call: BLOCK_M (the alignment's and both GEMMs' rows per program) and the
    tiles of the gate_up and the down GEMM."""

    block_m: int
    up: MoeTile
    down: MoeTile

    def __post_init__(self) -> None:
        if self.block_m not in (16, 32, 64, 128):
            raise ValueError(f"MoeConfig.block_m must be 16, 32, 64 or 128, got {self.block_m}")
        for tile in (self.up, self.down):
            if tile.block_n not in (16, 32, 64, 128, 256) or tile.block_k not in (16, 32, 64, 128, 256):
                raise ValueError(f"MoeConfig tiles need block_n and block_k in 16..256 (powers of 2): {tile}")


#: (fewest rows per expert it applies to, config), ascending, by the call's tokens times k over E (the
#: rows an expert gets on average: what fills a BLOCK_M block; Mixtral's 64 tokens give 16, Qwen3-MoE's
#: 256 give 16): decode-like calls (16-row blocks, long K chunks, the gate_up tile's 2 x 32 weight rows
#: narrow so that the few experts hit still spread over the SMs), mid-sized (32 rows), prefill-like (64
#: rows, wide tiles, wgmma) and long prefills (128 rows). The first three began as a guess shaped after
#: vLLM's published H100/H200 tuning; session 48's sweep on an H100 (benchmarks/sweep_moe_tiles.py over six
#: models' expert shapes, 1-4,096 tokens, twelve configs) moved the 64-row config down to 32 rows an expert
#: (Hunyuan-A13B at 32: 1.06x; Mixtral at 64: 1.19x, GLM-4.5-Air 1.11x) and added the 128-row one from 256
#: (1.00-1.12x: at 128 rows it read 0.94-0.95x). Read at call time, so a benchmark may replace it.
MOE_CONFIGS: tuple[tuple[int, MoeConfig], ...] = (
    (0, MoeConfig(16, MoeTile(32, 128, 4, 4), MoeTile(64, 128, 4, 4))),
    (24, MoeConfig(32, MoeTile(64, 128, 4, 3), MoeTile(128, 64, 4, 3))),
    (32, MoeConfig(64, MoeTile(128, 64, 8, 3), MoeTile(256, 64, 8, 3))),
    (256, MoeConfig(128, MoeTile(128, 64, 8, 3), MoeTile(128, 64, 8, 3))),
)


def for_dtype(tile: MoeTile, dtype: torch.dtype, block_m: int) -> MoeTile:
    """`tile` as launched for `dtype` at `block_m` rows: FP32 tiles take twice the shared memory and multiply
    on FMAs (IEEE, no tensor cores) with their sums in registers, so their K chunk is halved (down to 32),
    their pipeline held to 2 stages and their columns to 8,192 / block_m (a 128-row block's 128 columns,
    gated, spilled on sm_90), which keeps every table config in shared memory and registers without spills;
    16-bit tiles as given."""
    if dtype != torch.float32:
        return tile
    block_n, block_k = min(tile.block_n, max(16, 8192 // block_m)), max(32, tile.block_k // 2)
    return replace(tile, block_n=block_n, block_k=block_k, num_stages=min(tile.num_stages, 2))


def moe_config(
    num_tokens: int,
    top_k: int = 1,
    num_experts: int = 1,
    table: tuple[tuple[int, MoeConfig], ...] | None = None,
) -> MoeConfig:
    """The config for a layer call of `num_tokens` tokens, each to `top_k` of `num_experts` experts: the
    last entry of `table` (default :data:`MOE_CONFIGS`, read at call time) whose fewest rows per expert
    ``num_tokens * top_k / num_experts`` the call reaches, else the first."""
    table = MOE_CONFIGS if table is None else table
    rows = num_tokens * top_k / num_experts
    chosen = table[0][1]
    for fewest, config in table:
        if rows >= fewest:
            chosen = config
    return chosen


def sorted_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows of the sorted, padded pair list for any routing of `num_pairs` pairs: each expert hit pads its
    segment by at most BLOCK_M - 1, and at most min(E, pairs) experts are hit; rounded up to whole blocks."""
    bound = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return triton.cdiv(bound, block_m) * block_m


def align_block_size(
    experts: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs of `experts` ``[N, k]`` (each token's expert ids) sorted by expert, each expert's segment
    padded to a multiple of `block_m` with the sentinel ``N * k``, on `experts`' device without a host sync.

    Returns ``sorted_ids`` int32 ``[C]`` (pair ids, C = :func:`sorted_capacity`; past the real padded count
    all sentinels), ``block_expert`` int32 ``[C / block_m]`` (each block's expert; blocks past the real
    count clamped to the last expert, never read) and ``padded`` int32 ``[1]``, the real padded count.
    Within an expert the pairs keep their order (a stable sort).

    Decode-sized calls (up to :data:`ALIGN_KERNEL_MAX_PAIRS` pairs, :data:`ALIGN_KERNEL_MAX_EXPERTS`
    experts) take one Triton program (:func:`_align_kernel`), the others ~15 torch ops: in a CUDA graph each
    op is a launch, which at one token cost more than the experts' weights take to stream."""
    flat = experts.reshape(-1)
    p = flat.numel()
    if (
        (flat.is_cuda or interpreting())
        and 0 < p <= ALIGN_KERNEL_MAX_PAIRS
        and num_experts <= ALIGN_KERNEL_MAX_EXPERTS
    ):
        return _align_by_kernel(flat, num_experts, block_m)
    return _align_by_torch(flat, num_experts, block_m)


def _align_by_torch(
    flat: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`align_block_size` in torch ops (any size)."""
    flat = flat.long()
    p, dev = flat.numel(), flat.device
    cap = sorted_capacity(p, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + (block_m - 1)) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    rank = torch.arange(p, device=dev) - (counts.cumsum(0) - counts)[by_expert]
    dest = (ends - padded)[by_expert] + rank
    sorted_ids = torch.full((cap,), p, dtype=torch.int32, device=dev).scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(0, cap, block_m, device=dev)
    block_expert = torch.searchsorted(ends, starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


#: alignments of up to this many pairs run as one Triton program (:func:`_align_kernel`, which walks them
#: in chunks, twice), larger ones as torch ops; and of up to this many experts (the program holds a row per
#: expert for each chunk of pairs)
ALIGN_KERNEL_MAX_PAIRS = 1024
ALIGN_KERNEL_MAX_EXPERTS = 1024


@triton.jit
def _align_kernel(
    Experts,
    SortedIds,
    BlockExpert,
    Padded,
    P,
    E,
    CAP,
    NUM_BLOCKS,
    BLOCK_M: tl.constexpr,
    E_POW2: tl.constexpr,
    CHUNK: tl.constexpr,
    FILL: tl.constexpr,
):
    """One program: count each expert's pairs (a chunk of pairs against every expert at once), pad the
    counts to BLOCK_M and take their running sums (each expert's segment start), give each block its expert
    (the first whose segment ends past the block's start, clamped to E - 1), fill the list with the sentinel
    P, then walk the pairs again, in order, placing each at its expert's start plus the pairs of that expert
    before it (earlier chunks' running count, this chunk's exclusive cumulative sum): a stable sort."""
    e_offs = tl.arange(0, E_POW2)
    counts = tl.zeros([E_POW2], dtype=tl.int32)
    for start in range(0, P, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ex = tl.load(Experts + offs, mask=offs < P, other=-1).to(tl.int32)
        counts += tl.sum((ex[:, None] == e_offs[None, :]).to(tl.int32), axis=0)
    padded = (counts + (BLOCK_M - 1)) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.store(Padded, tl.sum(padded, axis=0))
    for b0 in range(0, NUM_BLOCKS, CHUNK):
        blocks = b0 + tl.arange(0, CHUNK)
        first = tl.sum((ends[None, :] <= (blocks * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(BlockExpert + blocks, tl.minimum(first, E - 1), mask=blocks < NUM_BLOCKS)
    for c0 in range(0, CAP, FILL):
        slots = c0 + tl.arange(0, FILL)
        tl.store(SortedIds + slots, tl.zeros([FILL], dtype=tl.int32) + P, mask=slots < CAP)
    tl.debug_barrier()  # every sentinel stored before any pair lands on its slot
    running = tl.zeros([E_POW2], dtype=tl.int32)
    for start in range(0, P, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        valid = offs < P
        ex = tl.load(Experts + offs, mask=valid, other=-1).to(tl.int32)
        hit = (ex[:, None] == e_offs[None, :]).to(tl.int32)
        before = tl.cumsum(hit, axis=0) - hit
        dest = tl.sum(hit * (before + (starts + running)[None, :]), axis=1)
        tl.store(SortedIds + dest, offs.to(tl.int32), mask=valid)
        running += tl.sum(hit, axis=0)


def _align_by_kernel(
    flat: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`align_block_size` as one launch of :func:`_align_kernel`."""
    p, dev = flat.numel(), flat.device
    cap = sorted_capacity(p, num_experts, block_m)
    e_pow2 = max(16, triton.next_power_of_2(num_experts))
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=dev)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=dev)
    padded = torch.empty(1, dtype=torch.int32, device=dev)
    _align_kernel[(1,)](
        flat.contiguous(), sorted_ids, block_expert, padded, p, num_experts, cap, cap // block_m,
        BLOCK_M=block_m, E_POW2=e_pow2, CHUNK=max(1, 8192 // e_pow2), FILL=1024, num_warps=4,
    )  # fmt: skip
    return sorted_ids, block_expert, padded


@triton.jit
def _moe_gemm_kernel(
    A,
    W,
    Out,
    RoutingW,
    SortedIds,
    BlockExpert,
    Padded,
    num_pairs,
    row_blocks,
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    Bias,
    alpha,
    limit,
    ROW_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    ROUTED: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    W_KN: tl.constexpr = False,
    INTERLEAVED: tl.constexpr = False,
    HAS_BIAS: tl.constexpr = False,
    SCALE_INPUT: tl.constexpr = False,
):
    """Grid (row_blocks * column blocks): program pid makes rows [pid_m * BLOCK_M, +BLOCK_M) of the
    sorted pair list times columns [pid_n * BLOCK_N, +BLOCK_N) of its block's expert's ``W[e]`` ``[N (x2
    GATED), K]``; the row blocks of one column block are neighbours, so programs reading the same weight
    tile run together.

    Row r of the block is pair ``SortedIds[r]``; its A row is pair // ROW_DIV (the token for gate_up, the
    pair for down); sentinel rows (>= num_pairs) read row 0 and store nothing. GATED: columns n and N + n
    (gate, up; INTERLEAVED: 2 n and 2 n + 1) in two accumulators (W_KN and INTERLEAVED: one of 2 BLOCK_N
    columns, split in the epilogue), ``ACT(gate) * up`` stored (ACT
    ``gpt_oss_swiglu``: ``(clamp(up, +-limit) + 1) * g * sigmoid(alpha * g)``, g = min(gate, limit)).
    ROUTED: times the pair's routing weight. W_KN: ``W[e]`` stored ``[K, N (x2)]`` (x @ W), read in
    place: stride_wn is then its stride along K, its columns unit stride. HAS_BIAS: ``Bias[e]`` (contiguous
    ``[E, N (x2 GATED)]``, columns as W's) added in FP32 before the activation and the routing weight.
    Columns past N wrap to valid rows of W (no masks along N in the loop); their outputs are not stored.
    SCALE_INPUT: each A row times its pair's routing weight (FP32), rounded to A's dtype before the dot
    (Llama 4's ``(x * w).to(x.dtype)``; the down launch then runs without ROUTED). DOT_F32 (the
    interpreter, whose 16-bit dot is not exact): the tiles widened to FP32 first. Bias, alpha and limit
    are None (constexprs) where unused, so the plain launches compile as before."""
    pid = tl.program_id(0)
    pid_m = pid % row_blocks
    pid_n = pid // row_blocks
    if pid_m * BLOCK_M >= tl.load(Padded):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(SortedIds + offs_m)
    valid = pair < num_pairs
    rows = tl.where(valid, pair // ROW_DIV, 0).to(tl.int64)
    expert = tl.load(BlockExpert + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    arange_k = tl.arange(0, BLOCK_K)
    a_rows = A + rows[:, None] * stride_am
    if SCALE_INPUT:
        row_w = tl.load(RoutingW + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
    # W's columns (rows of W[e] unless W_KN) that feed the gate (or only) and the up accumulator
    if INTERLEAVED:
        gate_cols = 2 * (offs_n % N).to(tl.int64)
        up_cols = gate_cols + 1
    else:
        gate_cols = (offs_n % N).to(tl.int64)
        up_cols = gate_cols + N
    # transposed and interleaved (gpt-oss's gate_up): one contiguous [K, 2 BLOCK_N] tile a step, gate and
    # up side by side in one accumulator, split in the epilogue (vector loads, one MMA of double width)
    PAIRED: tl.constexpr = W_KN and INTERLEAVED and GATED
    if PAIRED:
        pair_cols = (pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)) % (2 * N)
        w_cols = W + expert * stride_we + pair_cols.to(tl.int64)[None, :]
        acc2 = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
    elif W_KN:
        w_cols = W + expert * stride_we + gate_cols[None, :]
        u_cols = W + expert * stride_we + up_cols[None, :]
    elif INTERLEAVED:
        w_rows = W + expert * stride_we + gate_cols[:, None] * stride_wn
    else:
        w_rows = W + expert * stride_we + (offs_n % N).to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + arange_k
        if W_KN:
            k_rows = offs_k.to(tl.int64)[:, None] * stride_wn
            if EVEN_K:
                a = tl.load(a_rows + offs_k[None, :])
                w = tl.load(w_cols + k_rows)
            else:
                a = tl.load(a_rows + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
                w = tl.load(w_cols + k_rows, mask=offs_k[:, None] < K, other=0.0)
            if SCALE_INPUT:
                a = (a.to(tl.float32) * row_w).to(A.dtype.element_ty)
            if DOT_F32:
                a, w = a.to(tl.float32), w.to(tl.float32)
            if PAIRED:
                acc2 = tl.dot(a, w, acc2, input_precision=PRECISION)
            else:
                acc = tl.dot(a, w, acc, input_precision=PRECISION)
            if GATED and not PAIRED:
                if EVEN_K:
                    u = tl.load(u_cols + k_rows)
                else:
                    u = tl.load(u_cols + k_rows, mask=offs_k[:, None] < K, other=0.0)
                if DOT_F32:
                    u = u.to(tl.float32)
                acc_up = tl.dot(a, u, acc_up, input_precision=PRECISION)
        else:
            if EVEN_K:
                a = tl.load(a_rows + offs_k[None, :])
                w = tl.load(w_rows + offs_k[None, :])
            else:
                k_ok = offs_k[None, :] < K
                a = tl.load(a_rows + offs_k[None, :], mask=k_ok, other=0.0)
                w = tl.load(w_rows + offs_k[None, :], mask=k_ok, other=0.0)
            if SCALE_INPUT:
                a = (a.to(tl.float32) * row_w).to(A.dtype.element_ty)
            if DOT_F32:
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
            if GATED:
                up_step = stride_wn if INTERLEAVED else N * stride_wn
                if EVEN_K:
                    u = tl.load(w_rows + up_step + offs_k[None, :])
                else:
                    u = tl.load(w_rows + up_step + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
                if DOT_F32:
                    u = u.to(tl.float32)
                acc_up = tl.dot(a, tl.trans(u), acc_up, input_precision=PRECISION)
    if HAS_BIAS:
        b_row = Bias + expert * (2 * N if GATED else N)
        if PAIRED:
            acc2 += tl.load(b_row + pair_cols).to(tl.float32)[None, :]
        else:
            acc += tl.load(b_row + gate_cols).to(tl.float32)[None, :]
            if GATED:
                acc_up += tl.load(b_row + up_cols).to(tl.float32)[None, :]
    if PAIRED:
        acc, acc_up = tl.split(tl.reshape(acc2, [BLOCK_M, BLOCK_N, 2]))
    if GATED:
        if ACT == "gpt_oss_swiglu":
            gate = tl.minimum(acc, limit)
            up = tl.minimum(tl.maximum(acc_up, -limit), limit)
            acc = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
        else:
            if ACT == "silu":
                acc = acc * tl.sigmoid(acc)
            acc = acc * acc_up
    if ROUTED:
        acc = acc * tl.load(RoutingW + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
    out = Out + pair.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def _refuse(name: str, want: str, t: torch.Tensor) -> ValueError:
    return ValueError(f"fused_moe: {name} must be {want}, got {t.dtype} {tuple(t.shape)}")


def _check(x, gate_up, down, weights, experts, transposed: bool) -> tuple[int, int]:
    """ValueError naming the argument that is not what the kernels take; else (E, I)."""
    if x.dim() != 2 or x.dtype not in _DTYPES or x.stride(1) != 1:
        raise _refuse("x", "FP16, BF16 or FP32 [N, H] with unit stride along H", x)
    n, h = x.shape
    if transposed:
        if gate_up.dim() != 3 or gate_up.dtype != x.dtype or gate_up.shape[1] != h or gate_up.shape[2] % 2:
            raise _refuse("gate_up", f"{x.dtype} [E, {h}, 2 I] (transposed: x's dtype and H)", gate_up)
        e, i = gate_up.shape[0], gate_up.shape[2] // 2
        if tuple(down.shape) != (e, i, h) or down.dtype != x.dtype:
            raise _refuse("down", f"{x.dtype} [{e}, {i}, {h}] (transposed)", down)
    else:
        if gate_up.dim() != 3 or gate_up.dtype != x.dtype or gate_up.shape[2] != h or gate_up.shape[1] % 2:
            raise _refuse("gate_up", f"{x.dtype} [E, 2 I, {h}] (x's dtype and H)", gate_up)
        e, i = gate_up.shape[0], gate_up.shape[1] // 2
        if tuple(down.shape) != (e, h, i) or down.dtype != x.dtype:
            raise _refuse("down", f"{x.dtype} [{e}, {h}, {i}]", down)
    if gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("fused_moe: the expert weights need unit stride along their last axis")
    if experts.dim() != 2 or experts.shape[0] != n or experts.is_floating_point():
        raise _refuse("experts", f"integer [{n}, k]", experts)
    if tuple(weights.shape) != tuple(experts.shape) or not weights.is_floating_point():
        raise _refuse("weights", f"float {tuple(experts.shape)} (the experts' shape)", weights)
    return int(e), int(i)


def _check_options(x, e: int, i: int, activation, gate_up_bias, down_bias, alpha, limit) -> None:
    """ValueError for an activation, its parameters or a bias the kernels do not take."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe: activation must be one of {ACTIVATIONS}, got {activation!r}")
    swiglu = activation == "gpt_oss_swiglu"
    for name, v in (("alpha", alpha), ("limit", limit)):
        if swiglu and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v):
            raise ValueError(f"fused_moe: activation 'gpt_oss_swiglu' needs {name} as a float, got {v!r}")
        if not swiglu and v is not None:
            raise ValueError(f"fused_moe: {name} is a parameter of 'gpt_oss_swiglu', not of {activation!r}")
    if (gate_up_bias is None) != (down_bias is None):
        raise ValueError("fused_moe: gate_up_bias and down_bias come together (both or neither)")
    h = x.shape[1]
    for name, b, cols in (("gate_up_bias", gate_up_bias, 2 * i), ("down_bias", down_bias, h)):
        if b is not None and (tuple(b.shape) != (e, cols) or b.dtype != x.dtype):
            raise _refuse(name, f"{x.dtype} [{e}, {cols}]", b)


def fused_moe(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    *,
    activation: str = "silu",
    transposed: bool = False,
    interleaved: bool = False,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    alpha: float | None = None,
    limit: float | None = None,
    scale_input: bool = False,
    config: MoeConfig | None = None,
) -> torch.Tensor:
    """``sum_j weights[t, j] * down[e] @ (act(gate[e] @ x[t]) * (up[e] @ x[t]))`` over each token t's k
    experts ``e = experts[t, j]``, in x's dtype: x ``[N, H]``, gate_up ``[E, 2 I, H]`` (gate rows first),
    down ``[E, H, I]``, weights and experts ``[N, k]``. Every launch and tensor size depends only on N, k,
    E and the config (default :func:`moe_config` of N, k and E), so the call can be captured in a CUDA
    graph.

    gpt-oss's experts are options: `transposed` (gate_up ``[E, H, 2 I]``, down ``[E, I, H]``, applied as
    ``x @ W``, read in place), `interleaved` (gate = even columns, up = odd, rather than halves), biases
    `gate_up_bias` ``[E, 2 I]`` and `down_bias` ``[E, H]`` (columns as the weights'; added in FP32 before
    the activation and before the routing weight: ``weights[t, j] * (h @ W + b)``), `activation`
    ``gpt_oss_swiglu`` with its `alpha` and `limit` (:data:`ACTIVATIONS`). Aria's and Llama 4's experts
    are `transposed` alone. `scale_input` (Llama 4's): each pair's input row times its routing weight,
    rounded to x's dtype (``(x[t] * weights[t, j]).to(x.dtype)``), and its output summed unweighted:
    ``sum_j down[e] @ (act(gate[e] @ x_j) * (up[e] @ x_j))``."""
    e, i = _check(x, gate_up, down, weights, experts, transposed)
    _check_options(x, e, i, activation, gate_up_bias, down_bias, alpha, limit)
    if scale_input and (interleaved or gate_up_bias is not None or activation != "silu"):
        raise ValueError(
            "fused_moe: scale_input (Llama 4's experts) takes gate / up halves, no biases and SiLU; got "
            f"interleaved={interleaved}, biases={gate_up_bias is not None}, activation={activation!r}"
        )
    n, h, k = int(x.shape[0]), int(x.shape[1]), int(experts.shape[1])
    if n == 0:
        return x.new_zeros((0, h))
    cfg = config or moe_config(n, k, e)
    p = n * k
    sorted_ids, block_expert, padded = align_block_size(experts, e, cfg.block_m)
    row_blocks = int(block_expert.numel())
    inter = torch.empty((p, i), dtype=x.dtype, device=x.device)
    out = torch.empty((p, h), dtype=x.dtype, device=x.device)
    routing = weights.reshape(-1).contiguous()
    dot_f32 = interpreting() and x.dtype != torch.float32
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    biased = gate_up_bias is not None
    up_bias, down_b = (gate_up_bias.contiguous(), down_bias.contiguous()) if biased else (None, None)
    swiglu = (float(alpha), float(limit)) if activation == "gpt_oss_swiglu" else (None, None)
    # transposed weights' stride along K: W[e] is [K, N] with unit-stride columns
    up_tile, down_tile = for_dtype(cfg.up, x.dtype, cfg.block_m), for_dtype(cfg.down, x.dtype, cfg.block_m)
    launches = (
        (x, gate_up, inter, i, h, up_tile, k, True, False, up_bias, interleaved, scale_input),
        (inter, down, out, h, i, down_tile, 1, False, not scale_input, down_b, False, False),
    )
    for a, w, o, cols, depth, tile, row_div, gated, routed, bias, inter_cols, scaled in launches:
        grid = (row_blocks * triton.cdiv(cols, tile.block_n),)
        _moe_gemm_kernel[grid](
            a, w, o, routing, sorted_ids, block_expert, padded, p, row_blocks, cols, depth,
            a.stride(0), w.stride(0), w.stride(1), o.stride(0), bias, *swiglu,
            ROW_DIV=row_div, GATED=gated, ACT=activation, ROUTED=routed, EVEN_K=depth % tile.block_k == 0,
            DOT_F32=dot_f32, PRECISION=precision, BLOCK_M=cfg.block_m, BLOCK_N=tile.block_n,
            BLOCK_K=tile.block_k, W_KN=transposed, INTERLEAVED=inter_cols, HAS_BIAS=biased,
            SCALE_INPUT=scaled, num_warps=tile.num_warps, num_stages=tile.num_stages,
        )  # fmt: skip
    return out.view(n, k, h).sum(dim=1)


#: routers of up to this many experts take :func:`route_topk` on CUDA (the program holds a row of scores)
ROUTE_KERNEL_MAX_EXPERTS = 4096
#: the routing orders :func:`route_topk` computes (llm.models.moe.ROUTINGS' order)
ROUTE_ORDERS = ("softmax_topk", "topk_softmax", "sigmoid_topk", "topk_sigmoid")


@triton.jit
def _expf(LIBDEVICE: tl.constexpr, x):
    """e^x as CUDA's expf (libdevice, what torch's softmax and sigmoid call); Triton's own exp (the
    approximate ex2, scaled) where there is no libdevice: the interpreter."""
    if LIBDEVICE:
        return libdevice.exp(x)
    return tl.exp(x)


@triton.jit
def _route_kernel(
    Logits,
    Bias,
    Weights,
    Experts,
    E,
    stride_row,
    NORM_EPS,
    NORM_MIN,
    SCALE,
    K: tl.constexpr,
    K_POW2: tl.constexpr,
    E_POW2: tl.constexpr,
    ORDER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORM: tl.constexpr,
    HAS_MIN: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """One token a program: its float32 scores (a softmax over the experts, a sigmoid of each, or the
    logits themselves where the top k are chosen first), k rounds of picking the highest choice score (plus
    the selection bias; the lowest expert id among ties) and taking its unbiased score, then a softmax or a
    sigmoid of the k (where chosen first), renormalization, the scale, and the weights in Weights' dtype.
    Exponentials by libdevice's expf, as torch's softmax and sigmoid take them (:func:`_expf`)."""
    row = tl.program_id(0)
    offs = tl.arange(0, E_POW2)
    valid = offs < E
    x = tl.load(Logits + row * stride_row + offs, mask=valid, other=0.0).to(tl.float32)
    if ORDER == 0:
        xm = tl.where(valid, x, float("-inf"))
        num = _expf(LIBDEVICE, xm - tl.max(xm, axis=0))
        s = num / tl.sum(num, axis=0)
    elif ORDER == 2:
        s = 1.0 / (1.0 + _expf(LIBDEVICE, -x))
    else:
        s = x
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(Bias + offs, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))
    kofs = tl.arange(0, K_POW2)
    top = tl.zeros([K_POW2], dtype=tl.float32)
    ids = tl.zeros([K_POW2], dtype=tl.int32)
    for j in tl.static_range(K):
        best = tl.max(choice, axis=0)
        idx = tl.min(tl.where(choice == best, offs, E_POW2), axis=0)
        top = tl.where(kofs == j, tl.sum(tl.where(offs == idx, s, 0.0), axis=0), top)
        ids = tl.where(kofs == j, idx, ids)
        choice = tl.where(offs == idx, float("-inf"), choice)
    kvalid = kofs < K
    if ORDER == 1:
        t = tl.where(kvalid, top, float("-inf"))
        num = tl.where(kvalid, _expf(LIBDEVICE, t - tl.max(t, axis=0)), 0.0)
        top = num / tl.sum(num, axis=0)
    elif ORDER == 3:
        top = 1.0 / (1.0 + _expf(LIBDEVICE, -top))
    top = tl.where(kvalid, top, 0.0)
    if RENORM:
        total = tl.sum(top, axis=0) + NORM_EPS
        if HAS_MIN:
            total = tl.maximum(total, NORM_MIN)
        top = top / total
    top = top * SCALE
    tl.store(Weights + row * K + kofs, top.to(Weights.dtype.element_ty), mask=kvalid)
    tl.store(Experts + row * K + kofs, ids.to(tl.int64), mask=kvalid)


def route_topk(
    logits: torch.Tensor,
    k: int,
    order: str,
    *,
    renormalize: bool,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    norm_min: float | None = None,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A MoE router's top-k weights ``[N, k]`` (`out_dtype`) and expert ids (int64) from its logits
    ``[N, E]`` in one launch, as :class:`trtforge.llm.models.moe.SparseMoe` routes in float32 (`order` one of
    :data:`ROUTE_ORDERS`; `bias` the selection bias added to the scores for the choice only; the
    renormalizing sum plus `norm_eps`, clamped below at `norm_min`; then times `scale`), sorted by
    choice score as ``torch.topk`` sorts; its sums run in another order than torch's. On CUDA this
    replaces ~6 launches a layer (softmax, top-k, sum, divide, cast) inside a decode graph."""
    if order not in ROUTE_ORDERS:
        raise ValueError(f"route_topk: order must be one of {ROUTE_ORDERS}, got {order!r}")
    n, e = logits.shape
    if not 0 < k <= e:
        raise ValueError(f"route_topk: k must be in 1..{e} (the experts), got {k}")
    weights = torch.empty((n, k), dtype=out_dtype, device=logits.device)
    experts = torch.empty((n, k), dtype=torch.int64, device=logits.device)
    if n == 0:
        return weights, experts
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    _route_kernel[(n,)](
        logits, logits if bias is None else bias.contiguous(), weights, experts, e, logits.stride(0),
        float(norm_eps), 0.0 if norm_min is None else float(norm_min), float(scale),
        K=k, K_POW2=triton.next_power_of_2(k), E_POW2=max(16, triton.next_power_of_2(e)),
        ORDER=ROUTE_ORDERS.index(order), HAS_BIAS=bias is not None, RENORM=bool(renormalize),
        HAS_MIN=norm_min is not None, LIBDEVICE=not interpreting(), num_warps=4,
    )  # fmt: skip
    return weights, experts
