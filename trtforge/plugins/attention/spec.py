"""The FlashAttention op as one fact shared by the ONNX node, its reference function and the plugin.

Pure Python (no torch, onnx or TensorRT imports): the node helper, the plugin creator and the CLI
capability check all validate attributes here, so they agree on what is legal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtforge.errors import UserError

DOMAIN = "trtforge"
OP_TYPE = "FlashAttention"
PLUGIN_NAME = OP_TYPE  # the ONNX parser maps op_type -> plugin name
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "trtforge"
# Node overload (ONNX IR >= 10) selecting the 4-input reference function: ONNX functions cannot
# take a trailing optional input, so the masked form is a second overload of the same op.
MASKED_OVERLOAD = "masked"

LAYOUT_BHSD = "bhsd"  # q, k, v: [B, H, S, D] each; output [B, H, S_q, D]
LAYOUT_PACKED = "bs3hd"  # one packed qkv input [B, S, 3·H·D]; output [B, S, H·D]
LAYOUTS = (LAYOUT_BHSD, LAYOUT_PACKED)
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 128)
# Node attributes the ONNX parser forwards as plugin fields but which only select the creator.
PARSER_ONLY_FIELDS = ("plugin_namespace", "plugin_version")


@dataclass(frozen=True)
class FlashAttentionAttrs:
    """The op's attributes, validated: heads > 0, a finite positive scale, causal 0/1, a known layout."""

    num_heads: int
    scale: float
    causal: bool = False
    layout: str = LAYOUT_BHSD

    def __post_init__(self) -> None:
        where = f"{DOMAIN}::{OP_TYPE}"
        if isinstance(self.num_heads, bool) or int(self.num_heads) != self.num_heads or self.num_heads < 1:
            raise UserError(
                f"{where}: attribute num_heads must be a positive integer; got {self.num_heads!r}."
            )
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and self.scale > 0):
            raise UserError(
                f"{where}: attribute scale must be a finite positive float (usually 1/sqrt(head_dim)); "
                f"got {self.scale!r}."
            )
        if self.causal not in (0, 1, True, False):
            raise UserError(f"{where}: attribute causal must be 0 or 1; got {self.causal!r}.")
        if self.layout not in LAYOUTS:
            raise UserError(f"{where}: attribute layout must be one of {LAYOUTS}; got {self.layout!r}.")
        object.__setattr__(self, "num_heads", int(self.num_heads))
        object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "causal", bool(self.causal))


def check_head_dim(head_dim: int, where: str) -> None:
    """Raise a UserError unless the kernel supports `head_dim` (tested: 32, 64, 80, 96, 128)."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise UserError(
            f"{where}: head dim {head_dim} is not supported by the FlashAttention plugin; "
            f"supported: {SUPPORTED_HEAD_DIMS}. Use `--attention native` for this model."
        )


# -- PagedAttention: a step (decode or ragged prefill) over paged K/V pools [num_blocks, block_size, Hkv, D]
PAGED_OP_TYPE = "PagedAttention"
PAGED_PLUGIN_NAME = PAGED_OP_TYPE
PAGED_HEAD_DIMS = (64, 80, 96, 128, 256)
MAX_DECODE_Q_LEN = 8  # the split-KV decode kernel's query lengths (longer steps: chunked prefill)
MAX_BLOCK_SIZE = 256
# Inputs and outputs, in order. Outputs 1 and 2 are inputs 3 and 4 updated in place (aliased).
PAGED_INPUTS = (
    "query",
    "key",
    "value",
    "key_cache",
    "value_cache",
    "block_table",
    "slot_mapping",
    "seq_lens",
    "query_lens",
)
PAGED_OUTPUTS = ("output", "present_key_cache", "present_value_cache")
PAGED_ALIASES = {1: 3, 2: 4}  # output index -> the input index whose memory it reuses


@dataclass(frozen=True)
class PagedAttentionAttrs:
    """Validated attributes: query heads, kv heads (dividing them) and a finite positive scale."""

    num_heads: int
    kv_num_heads: int
    scale: float

    def __post_init__(self) -> None:
        where = f"{DOMAIN}::{PAGED_OP_TYPE}"
        for name in ("num_heads", "kv_num_heads"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, (int, float)) or int(n) != n or n < 1:
                raise UserError(f"{where}: attribute {name} must be a positive integer; got {n!r}.")
            object.__setattr__(self, name, int(n))
        if self.num_heads % self.kv_num_heads:
            raise UserError(
                f"{where}: kv_num_heads ({self.kv_num_heads}) must divide num_heads ({self.num_heads}) "
                "(grouped-query attention)."
            )
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and self.scale > 0):
            raise UserError(f"{where}: attribute scale must be a finite positive float; got {self.scale!r}.")
        object.__setattr__(self, "scale", float(self.scale))


def check_paged_head_dim(head_dim: int, where: str) -> None:
    """Raise a UserError unless the decode kernel was tested at `head_dim`."""
    if head_dim not in PAGED_HEAD_DIMS:
        raise UserError(
            f"{where}: head dim {head_dim} is not supported by the PagedAttention plugin; "
            f"supported: {PAGED_HEAD_DIMS}."
        )


def check_block_size(block_size: int, where: str) -> None:
    """Raise a UserError unless the pool's block size is a power of two up to MAX_BLOCK_SIZE."""
    if block_size < 1 or block_size > MAX_BLOCK_SIZE or block_size & (block_size - 1):
        raise UserError(
            f"{where}: cache block size {block_size} must be a power of two up to {MAX_BLOCK_SIZE} "
            "(16, 32 and 64 are the tested sizes)."
        )
