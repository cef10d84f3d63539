"""Launch configurations of the flash-attention kernel (pure Python: the plugin's build side lists
them as TensorRT tactics without importing torch or Triton)."""

from __future__ import annotations

from dataclasses import dataclass, replace


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


# Hopper's per-block shared-memory limit (227 KB), less a margin for barriers and scratch.
SHARED_MEMORY_BUDGET = 232448 - 2048


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


def tactic_configs() -> tuple[KernelConfig, ...]:
    """The TensorRT tactics, in order (tactic t >= 1 is element t - 1): every tile config, pointer
    loads first, then the same tiles through tensor descriptors."""
    return AUTOTUNE_CONFIGS + tuple(replace(c, tma=True) for c in AUTOTUNE_CONFIGS)


def valid_tactics(head_dim: int | None, dtype_name: str | None = None) -> list[int]:
    """The tactics whose tiles fit this head dim (all of them while the head dim is unknown)."""
    if head_dim is None or head_dim < 0:
        return list(range(1, len(tactic_configs()) + 1))
    itemsize = 4 if dtype_name == "float32" else 2
    bd = block_d_for(head_dim)
    return [i + 1 for i, c in enumerate(tactic_configs()) if fits(c, bd, itemsize)]


def config_for_tactic(tactic: int, head_dim: int, dtype_name: str) -> KernelConfig:
    """The configuration of TensorRT tactic `tactic`; tactic 0 (none chosen), or one whose tiles do
    not fit this head dim, runs the default configuration."""
    configs = tactic_configs()
    if tactic in valid_tactics(head_dim, dtype_name):
        return configs[tactic - 1]
    return default_config(head_dim, dtype_name)
