"""Launch configurations of the flash-attention kernel (pure Python: the plugin's build side lists
them as TensorRT tactics without importing torch or Triton)."""

from __future__ import annotations

from dataclasses import dataclass, replace

# The longest query a sequence may bring to the split-KV decode kernel (speculative verification rows of
# up to 7 proposals + 1; kernels.decode_attention, and the torch executor's static decode path).
MAX_Q_LEN = 8


@dataclass(frozen=True)
class KernelConfig:
    """One launch configuration: tile sizes, warps per program and software-pipelining depth."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False  # move q/k/v/out with tensor descriptors (Hopper copy engine) where eligible


# Hopper candidates (H100/H200: 228 KB shared memory per SM, 64 K registers; wgmma works on 64-row
# warpgroup tiles): 128-row Q tiles with 4 warps (one warpgroup) or 8 (two), 256-row tiles with 16
# warps (four warpgroups sharing each K/V tile: half the K/V traffic per FLOP; 124 registers, no
# spills at D=128 with 64-wide K/V tiles, which 128-wide ones would spill), 2-4 pipeline stages;
# 64-row tiles for short sequences, where larger ones leave SMs idle. BLOCK_M is a multiple of
# BLOCK_N so that the causal diagonal costs few masked tiles. Configs that do not fit a head dim's
# shared memory are skipped by the autotuner (and fail loudly as a fixed TensorRT tactic).
AUTOTUNE_CONFIGS: tuple[KernelConfig, ...] = (
    KernelConfig(128, 128, 8, 2),
    KernelConfig(128, 128, 8, 3),
    KernelConfig(128, 128, 8, 4),
    KernelConfig(128, 64, 4, 3),
    KernelConfig(128, 64, 8, 3),
    KernelConfig(256, 64, 16, 2),
    KernelConfig(256, 64, 16, 3),
    KernelConfig(64, 64, 4, 3),
)


# The chunked-prefill kernel's launch (kernels.chunked_prefill: paged prompt chunks, BLOCK_M rows of
# (query token, group head)) by the step's longest chunk: (shortest chunk it applies to, config),
# ascending. Session 10's tiles at every length so far; benchmarks/sweep_chunked_prefill.py times the
# candidates below on the H200 (session 15's profile: 210 TFLOP/s on 2,048-token chunks with these).
CHUNK_PREFILL_CONFIGS: tuple[tuple[int, KernelConfig], ...] = ((1, KernelConfig(64, 64, 4, 2)),)
CHUNK_PREFILL_CANDIDATES: tuple[KernelConfig, ...] = (
    KernelConfig(64, 64, 4, 2),
    KernelConfig(64, 64, 4, 3),
    KernelConfig(64, 32, 4, 3),
    KernelConfig(128, 64, 4, 2),
    KernelConfig(128, 64, 4, 3),
    KernelConfig(128, 64, 8, 2),
    KernelConfig(128, 64, 8, 3),
    KernelConfig(128, 128, 8, 2),
    KernelConfig(256, 64, 8, 2),
)


def chunk_prefill_config(
    max_q_len: int, table: tuple[tuple[int, KernelConfig], ...] | None = None
) -> KernelConfig:
    """The chunked-prefill launch for a step whose longest prompt chunk has `max_q_len` tokens: the
    last entry of `table` (ascending by shortest chunk; default :data:`CHUNK_PREFILL_CONFIGS`, read at
    call time) that applies, else its first."""
    table = CHUNK_PREFILL_CONFIGS if table is None else table
    chosen = table[0][1]
    for shortest, config in table:
        if max_q_len >= shortest:
            chosen = config
    return chosen


# Hopper's per-block shared-memory limit (227 KB), less a margin for barriers and scratch.
SHARED_MEMORY_PER_BLOCK = 232448  # what an sm_90 block may opt into
SHARED_MEMORY_BUDGET = SHARED_MEMORY_PER_BLOCK - 2048


def fits(config: KernelConfig, block_d: int, itemsize: int = 2) -> bool:
    """Whether `config`'s pipelined K/V tiles plus the Q tile fit in shared memory at D tile `block_d`.

    Estimate (within ~1 KB of what Triton 3.6 allocates for both variants on sm_90):
    stages · 2 · BLOCK_N · BLOCK_D + BLOCK_M · BLOCK_D elements.
    """
    elems = config.num_stages * 2 * config.block_n * block_d + config.block_m * block_d
    return elems * itemsize <= SHARED_MEMORY_BUDGET


def block_d_for(head_dim: int) -> int:
    """The D tile: the next power of two, at least 16."""
    return max(16, 1 << (max(head_dim, 1) - 1).bit_length())


def default_config(head_dim: int, dtype_name: str) -> KernelConfig:
    """The configuration used without autotuning (TensorRT tactic 0, Triton's interpreter).

    `dtype_name` is "float16", "bfloat16" or "float32".
    """
    if dtype_name == "float32":
        return KernelConfig(64, 32, 4, 2)
    if head_dim <= 64:
        return KernelConfig(128, 64, 4, 3)
    return KernelConfig(128, 64, 8, 3)


WG_ROWS = 64  # query rows per consumer warpgroup of the Hopper kernel (one wgmma M atom)
HOPPER_HEAD_DIMS = (64, 128)
# Gluon, the dialect the Hopper kernel is written in, is experimental: its API changes between
# Triton releases (3.9 rejects this kernel). The kernel runs only on the releases it was proven on
# (the H200's 3.6); elsewhere the portable kernel runs.
HOPPER_TRITON_RELEASES = ("3.6",)


def hopper_triton_supported(version: str) -> bool:
    """Whether Triton `version` (e.g. "3.6.0") is a release the Hopper kernel was proven on."""
    return ".".join(version.split(".")[:2]) in HOPPER_TRITON_RELEASES


@dataclass(frozen=True)
class HopperConfig:
    """One launch configuration of the warp-specialized Hopper kernel (kernel_hopper.py)."""

    num_wg: int  # consumer warpgroups; the query block is num_wg * 64 rows
    block_n: int  # K/V tile rows
    stages: int  # K/V ring depth
    q_bufs: int = 1  # Q blocks in flight: 2 lets the producer load the next block's Q early
    pingpong: bool = True  # consumers take turns issuing their products
    persistent: bool = True  # one program per SM looping over query blocks
    pairs: bool = False  # causal: programs take query blocks in pairs of equal total work
    split_q: bool = False  # load the first warpgroup's next Q before the rest (one Q buffer)
    o_in_k: bool = False  # stage the output in the last K tile and hand Q back after the last Q·Kᵀ

    def __post_init__(self) -> None:
        if self.o_in_k and self.block_n < self.num_wg * WG_ROWS:
            raise ValueError(
                f"o_in_k stages each warpgroup's {WG_ROWS} output rows in one K tile: BLOCK_N "
                f"{self.block_n} must be at least {self.num_wg * WG_ROWS} for {self.num_wg} warpgroups"
            )

    @property
    def block_m(self) -> int:
        return self.num_wg * WG_ROWS


def hopper_shared_bytes(c: HopperConfig, head_dim: int, itemsize: int = 2) -> int:
    """Shared memory a Hopper configuration allocates: its Q blocks plus `stages` K and V tiles."""
    return (c.q_bufs * c.block_m + 2 * c.stages * c.block_n) * head_dim * itemsize + 1024


# Measured on the H200 (benchmarks/results/attention.md): 3 consumer warpgroups (192-row blocks) win
# D=64 non-causal from S=2048 on, 2 win causal; at D=128 a 3-deep K/V ring beats a second Q buffer.
# Causal blocks cost 1..n K/V tiles, so programs that take them round-robin finish unevenly; the
# `pairs` configs take them in pairs (i, n-1-i) of equal total cost. `o_in_k` (+ `split_q` at D=128)
# wins the short sequences (S <= 2048: +2-4%). Configs that never won in the session-3/4 probes
# (non-persistent D=128, no-pingpong pairs, ...) were dropped: each one costs autotuning time.
_HOPPER_CONFIGS = {
    64: (HopperConfig(3, 128, 4, 2), HopperConfig(3, 128, 4, 1, True, False),
         HopperConfig(2, 128, 4, 2, o_in_k=True), HopperConfig(2, 128, 4, 2, pairs=True, o_in_k=True),
         HopperConfig(2, 128, 4, 2, True, False, True)),
    128: (HopperConfig(2, 128, 3, 1), HopperConfig(2, 128, 3, 1, False),
          HopperConfig(2, 128, 3, 1, o_in_k=True), HopperConfig(2, 128, 3, 1, split_q=True, o_in_k=True),
          HopperConfig(2, 128, 3, 1, pairs=True, split_q=True),
          HopperConfig(2, 128, 3, 1, pairs=True, split_q=True, o_in_k=True)),
}  # fmt: skip

# Serving's long prompt chunks on the Hopper kernel (chunked_prefill.prepare_chunked_prefill_hopper):
# causal from the chunk's cached keys on. The fastest config without pairs on all six chunk sets of
# benchmarks/bench_chunk_hopper.py (H200, session 27, 1-3% over the plain one); pairs win fresh chunks
# but lose a step's two-prompt set by 30%.
CHUNK_HOPPER_CONFIG = HopperConfig(2, 128, 3, 1, split_q=True, o_in_k=True)


def hopper_configs(head_dim: int, causal: bool | None = None) -> tuple[HopperConfig, ...]:
    """The Hopper kernel's candidates for a head dim (empty where it does not apply); with `causal`
    False, without the `pairs` ones (only a causal mask makes blocks unequal)."""
    cands = _HOPPER_CONFIGS.get(head_dim, ())
    fit = (c for c in cands if hopper_shared_bytes(c, head_dim) <= SHARED_MEMORY_PER_BLOCK)
    return tuple(c for c in fit if causal is not False or not c.pairs)


AnyConfig = KernelConfig | HopperConfig


def tactic_configs() -> tuple[AnyConfig, ...]:
    """The TensorRT tactics, in order (tactic t >= 1 is element t - 1): every tile config, pointer
    loads first, then the same tiles through tensor descriptors, then the Hopper kernel's configs."""
    hopper = tuple(dict.fromkeys(c for d in HOPPER_HEAD_DIMS for c in _HOPPER_CONFIGS[d]))
    return AUTOTUNE_CONFIGS + tuple(replace(c, tma=True) for c in AUTOTUNE_CONFIGS) + hopper


def valid_tactics(head_dim: int | None, dtype_name: str | None = None) -> list[int]:
    """The tactics that can run this head dim and dtype (all of them while the head dim is unknown):
    tiles that fit shared memory, and Hopper configs only for their head dims in FP16/BF16."""
    if head_dim is None or head_dim < 0:
        return list(range(1, len(tactic_configs()) + 1))
    itemsize = 4 if dtype_name == "float32" else 2
    bd = block_d_for(head_dim)
    valid = []
    for i, c in enumerate(tactic_configs()):
        if isinstance(c, HopperConfig):
            ok = c in hopper_configs(head_dim) and dtype_name in (None, "float16", "bfloat16")
        else:
            ok = fits(c, bd, itemsize)
        if ok:
            valid.append(i + 1)
    return valid


def config_for_tactic(tactic: int, head_dim: int, dtype_name: str) -> AnyConfig:
    """The configuration of TensorRT tactic `tactic`; tactic 0 (none chosen), or one that cannot run
    this head dim, runs the default configuration."""
    configs = tactic_configs()
    if tactic in valid_tactics(head_dim, dtype_name):
        return configs[tactic - 1]
    return default_config(head_dim, dtype_name)


# Decode kernel (decode_kernel.py) candidates: (block_n, num_warps, num_stages, multiplier of the
# split heuristic's count). The autotuned launch times them; the PagedAttention plugin offers them
# as tactics 1..n. Chosen on the H200 (benchmarks/results/decode_attention.md): 64-key tiles with
# 2-3 stages win most shapes, 128-key tiles with 2 stages the large batches, 2 warps the paged pools;
# the last four (8 warps, 128-key tiles with 3 stages, twice the splits at 4 stages) were added for
# the small B·Hkv shapes once the split reduction was fused into the split kernel.
DECODE_CANDIDATES: tuple[tuple[int, int, int, float], ...] = (
    (64, 4, 3, 1.0), (64, 4, 2, 1.0), (64, 4, 4, 1.0), (32, 4, 4, 1.0), (128, 4, 2, 1.0),
    (128, 8, 3, 1.0), (64, 2, 3, 1.0), (64, 4, 2, 2.0), (64, 4, 3, 2.0), (64, 4, 3, 0.5), (128, 4, 2, 0.5),
    (64, 8, 3, 1.0), (128, 8, 2, 1.0), (64, 4, 4, 2.0), (128, 4, 3, 0.5),
)  # fmt: skip

# Extra decode candidates for contiguous caches TMA can read (decode_kernel._tma_descriptors): the
# same fields, whole tiles loaded by tensor descriptors. Not plugin tactics (the plugin's pools are
# paged). Deeper pipelines than the pointer loads', since a bulk copy costs one thread one instruction.
DECODE_TMA_CANDIDATES: tuple[tuple[int, int, int, float], ...] = (
    (64, 4, 3, 1.0), (64, 4, 4, 1.0), (64, 4, 6, 1.0), (128, 4, 2, 1.0), (128, 4, 3, 1.0),
    (128, 8, 3, 1.0), (64, 4, 4, 0.5), (128, 4, 3, 0.5), (64, 4, 4, 2.0),
)  # fmt: skip


def decode_counter_slots(batch: int, num_heads: int) -> int:
    """4-byte slots at the start of a decode workspace for the fused reduction's arrival counters:
    one per (batch, kv head), sized by the query heads (an upper bound, so that callers need not know
    the kv heads) and rounded up to 128 bytes so that the partial outputs after them stay aligned."""
    return -(-max(batch * num_heads, 1) // 32) * 32
