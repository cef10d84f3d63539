"""The PagedAttention TensorRT plugin: IPluginV3 (OneCore/OneBuildV2/OneRuntime) + IPluginCreatorV3One.

One step of the decoder's paged step graph (decode, speculative verification or ragged prefill) over
block pools [num_blocks, block_size, Hkv, D]: ``enqueue`` writes the step's new K/V rows at their
slot_mapping slots (reshape-and-cache), then runs the split-KV decode kernel (S_q = 1) or the
chunked-prefill kernel (S_q > 1, ragged rows by query_lens); the two pool outputs alias the pool
inputs (``get_aliased_input``), so the cache is updated in place (datacenter TensorRT needs
``PreviewFeature.ALIASED_PLUGIN_IO_10_03`` on the builder config). Inputs, outputs and semantics are
those of :mod:`~trtforge.plugins.attention.paged_onnx_node`. TensorRT times each decode-kernel
configuration as a tactic; ``enqueue`` launches one fixed configuration with scratch from the
TensorRT workspace: nothing is allocated, timed or synchronized. Same shape as the FlashAttention
plugin (plugin.py), whose support check it shares.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from trtforge.errors import UserError
from trtforge.kernels.configs import DECODE_CANDIDATES, decode_counter_slots
from trtforge.plugins.attention.plugin import register_creator_once
from trtforge.plugins.attention.plugin_common import (
    PluginBasics,
    creator_class,
    init_plugin,
    read_fields,
    torch_dtype,
)
from trtforge.plugins.attention.spec import (
    PAGED_ALIASES,
    PAGED_INPUTS,
    PAGED_PLUGIN_NAME,
    PLUGIN_NAMESPACE,
    PagedAttentionAttrs,
    check_block_size,
    check_paged_head_dim,
)

__all__ = [
    "paged_config_for_tactic",
    "paged_plugin_classes",
    "paged_tactic_count",
    "paged_valid_tactics",
    "paged_workspace_bytes",
    "parse_paged_fields",
    "register_paged_plugin",
    "workspace_rows",
]

_FIELDS = {"num_heads": "int32", "kv_num_heads": "int32", "scale": "float32"}
_WHERE = f"{PLUGIN_NAMESPACE}::{PAGED_PLUGIN_NAME}"
# Split programs the workspace is sized for beyond one per (batch, kv head): the split heuristic
# aims at about 4 programs per SM and the tactics at up to twice that, on GPUs of up to 256 SMs.
_EXTRA_SPLIT_PROGRAMS = 8 * 256
# Tactic t >= 1 is decode candidate t - 1: (block_n, num_warps, num_stages, split multiplier).
TACTICS = DECODE_CANDIDATES
_SHARED_MEMORY_BUDGET = 225 * 1024


def _block_d(head_dim: int) -> int:
    return max(16, 1 << (max(head_dim, 1) - 1).bit_length())


def workspace_rows(batch: int, num_heads: int, kv_num_heads: int, q_len: int) -> int:
    """Partial-output rows the workspace holds: (Hq / Hkv) · S_q · (2·B·Hkv + extra split programs).

    Monotonic in batch and q_len, so the workspace sized at the profile's maximum shapes covers
    every runtime shape; enqueue lowers the split count to what fits."""
    return (num_heads // kv_num_heads) * q_len * (2 * batch * kv_num_heads + _EXTRA_SPLIT_PROGRAMS)


def paged_workspace_bytes(batch: int, num_heads: int, kv_num_heads: int, q_len: int, head_dim: int) -> int:
    """Workspace bytes: the fused reduction's int32 arrival counters, then rows of an FP32 partial
    output (D padded) and its log-sum-exp."""
    rows = workspace_rows(batch, num_heads, kv_num_heads, q_len)
    return 4 * (decode_counter_slots(batch, num_heads) + rows * (_block_d(head_dim) + 1)) + 256


def paged_tactic_count() -> int:
    return len(TACTICS)


def paged_valid_tactics(head_dim: int | None) -> list[int]:
    """Tactics whose pipelined K/V tiles fit shared memory at `head_dim` (all while it is unknown)."""
    if head_dim is None or head_dim < 0:
        return list(range(1, len(TACTICS) + 1))
    bd = _block_d(head_dim)
    return [
        i + 1 for i, (bn, _, st, _) in enumerate(TACTICS) if st * 2 * bn * bd * 2 <= _SHARED_MEMORY_BUDGET
    ]


def paged_config_for_tactic(tactic: int, head_dim: int) -> tuple[int, int, int, float]:
    """(block_n, num_warps, num_stages, split multiplier) of a tactic; 0 or an invalid one -> default."""
    if tactic in paged_valid_tactics(head_dim):
        return TACTICS[tactic - 1]
    return (32, 4, 2, 1.0) if head_dim > 128 else (64, 4, 3, 1.0)


def parse_paged_fields(fields: Any) -> PagedAttentionAttrs:
    """Read plugin fields (ONNX node attributes or an engine's saved fields) into validated attrs."""
    return PagedAttentionAttrs(**read_fields(fields, _WHERE, _FIELDS, required=tuple(_FIELDS)))


@functools.lru_cache(maxsize=4)
def paged_plugin_classes(backend: Any) -> tuple[type, type]:
    """(PagedAttentionPlugin, PagedAttentionCreator) derived from `backend.trt`'s plugin interfaces."""
    trt = backend.trt
    float_types = (trt.DataType.HALF, trt.DataType.BF16)
    n_in = len(PAGED_INPUTS)

    class PagedAttentionPlugin(
        PluginBasics, trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuildV2, trt.IPluginV3OneRuntime
    ):
        """Paged decode attention with an in-place cache write; fields num_heads, kv_num_heads, scale."""

        def __init__(self, attrs: PagedAttentionAttrs, tactic: int = 0) -> None:
            metadata = f"heads={attrs.num_heads} kv_heads={attrs.kv_num_heads}"
            init_plugin(self, trt, trt.IPluginV3OneBuildV2, PAGED_PLUGIN_NAME, 3, metadata)
            self.attrs = attrs
            self.tactic = int(tactic)
            self.head_dim = -1

        # -- core --------------------------------------------------------------------------------
        def clone(self) -> PagedAttentionPlugin:
            twin = PagedAttentionPlugin(self.attrs, self.tactic)
            twin.head_dim = self.head_dim
            return twin

        # -- build -------------------------------------------------------------------------------
        def get_output_data_types(self, input_types: list[Any]) -> list[Any]:
            return [input_types[0], input_types[3], input_types[4]]

        def get_output_shapes(
            self, inputs: list[Any], shape_inputs: list[Any], expr_builder: Any
        ) -> list[Any]:
            return [trt.DimsExprs([d[i] for i in range(len(d))]) for d in (inputs[0], inputs[3], inputs[4])]

        def get_aliased_input(self, output_index: int) -> int:
            return PAGED_ALIASES.get(int(output_index), -1)

        def supports_format_combination(self, pos: int, in_out: list[Any], num_inputs: int) -> bool:
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR or num_inputs != n_in:
                return False
            if pos == 0:
                return desc.type in float_types
            if 5 <= pos < n_in:  # block_table, slot_mapping, seq_lens, query_lens
                return desc.type == trt.DataType.INT32
            return desc.type == in_out[0].desc.type  # new K/V, pools, output and updated pools

        def configure_plugin(self, inp: list[Any], out: list[Any]) -> None:
            if len(inp) != n_in:
                raise UserError(f"{_WHERE} takes {n_in} inputs ({', '.join(PAGED_INPUTS)}); got {len(inp)}.")
            q, k_new, _, k_pool, _, table, slots, lens, q_lens = (list(i.desc.dims) for i in inp)
            a = self.attrs
            ranks = {"query": (q, 4), "key": (k_new, 4), "key_cache": (k_pool, 4), "block_table": (table, 2)}
            ranks |= {"slot_mapping": (slots, 2), "seq_lens": (lens, 1), "query_lens": (q_lens, 1)}
            for role, (dims, rank) in ranks.items():
                if len(dims) != rank:
                    raise UserError(f"{_WHERE}: {role} must have rank {rank}; got dims {dims}.")
            if q[1] >= 0 and q[1] != a.num_heads:
                raise UserError(f"{_WHERE}: query has {q[1]} heads but num_heads is {a.num_heads}.")
            for role, heads in (("key", k_new[1]), ("key_cache [num_blocks, block_size, Hkv, D]", k_pool[2])):
                if heads >= 0 and heads != a.kv_num_heads:
                    raise UserError(
                        f"{_WHERE}: {role} has {heads} heads but kv_num_heads is {a.kv_num_heads}."
                    )
            if k_pool[1] >= 0:
                check_block_size(k_pool[1], _WHERE)
            head_dim = q[3]
            if head_dim >= 0:
                check_paged_head_dim(head_dim, _WHERE)
                if k_pool[3] >= 0 and k_pool[3] != head_dim:
                    raise UserError(
                        f"{_WHERE}: cache head dim {k_pool[3]} differs from the query's {head_dim}."
                    )
            self.head_dim = head_dim

        def get_workspace_size(self, inp: list[Any], out: list[Any]) -> int:
            q_max = list(inp[0].max)
            a = self.attrs  # split-KV scratch: only S_q = 1 steps split (longer ones run chunked prefill)
            return paged_workspace_bytes(q_max[0], a.num_heads, a.kv_num_heads, 1, q_max[3])

        def get_valid_tactics(self) -> list[int]:
            return paged_valid_tactics(self.head_dim)

        # -- runtime -----------------------------------------------------------------------------
        def get_fields_to_serialize(self) -> Any:
            a = self.attrs
            values = {"num_heads": a.num_heads, "kv_num_heads": a.kv_num_heads, "scale": a.scale}
            return self.serialized_fields(trt, _FIELDS, values)

        def enqueue(
            self,
            input_desc: list[Any],
            output_desc: list[Any],
            inputs: list[int],
            outputs: list[int],
            workspace: int,
            stream: int,
        ) -> None:
            import torch

            from trtforge.kernels import decode_attention as decode_kernel
            from trtforge.kernels.chunked_prefill import chunked_prefill_attention
            from trtforge.kernels.device_tensor import DeviceTensor
            from trtforge.kernels.paged_cache import write_kv_slots

            def tensor(desc: Any, ptr: int) -> DeviceTensor:
                return DeviceTensor.contiguous(ptr, torch_dtype(trt, desc.type), tuple(desc.dims))

            q, k_new, v_new, _, _, table, slots, lens, q_lens = (
                tensor(d, p) for d, p in zip(input_desc, inputs)
            )
            out, k_pool, v_pool = (tensor(d, p) for d, p in zip(output_desc, outputs))  # pools: aliased
            b, hq, s_q, d = q.shape
            external = torch.cuda.ExternalStream(int(stream)) if stream else None
            with torch.cuda.stream(external) if external is not None else contextlib.nullcontext():
                write_kv_slots(k_new, v_new, k_pool, v_pool, slots)
                if s_q > 1:
                    chunked_prefill_attention(
                        q, k_pool, v_pool, lens, table, q_lens=q_lens, scale=self.attrs.scale, out=out
                    )
                    return
            hkv = self.attrs.kv_num_heads
            bn, warps, stages, mult = paged_config_for_tactic(self.tactic, d)
            capacity = int(table.shape[1]) * int(k_pool.shape[1])
            splits = decode_kernel.num_splits_for(b * hkv, capacity, decode_kernel._num_sms(), bn)
            if mult != 1.0:
                splits = max(1, round(splits * mult))
            fit = workspace_rows(b, hq, hkv, 1) // max(b * hq, 1)
            splits = max(1, min(splits, fit, decode_kernel.MAX_SPLITS))
            ws = None
            if splits > 1:
                rows = decode_kernel.workspace_elements(b, hq, 1, d, splits)
                ws = DeviceTensor(int(workspace), torch.float32, (rows,), (1,))
            config = decode_kernel.DecodeConfig(bn, warps, stages, splits)
            decode_kernel.decode_attention_raw(
                q, k_pool, v_pool, lens, table, out,
                scale=self.attrs.scale, config=config, splits=splits, workspace=ws, stream=stream,
            )  # fmt: skip

    def make(fields: Any) -> PagedAttentionPlugin:
        return PagedAttentionPlugin(parse_paged_fields(fields))

    return PagedAttentionPlugin, creator_class(trt, PAGED_PLUGIN_NAME, _FIELDS, make)


def register_paged_plugin(backend: Any) -> Any:
    """Register the PagedAttention creator with `backend`'s plugin registry, once; returns the creator."""
    return register_creator_once(backend, paged_plugin_classes, _WHERE)
