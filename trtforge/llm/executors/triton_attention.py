"""trtforge's Triton attention kernels behind the torch executor's attention functions (CUDA).

Decode rows go through the split-KV kernel of :mod:`trtforge.kernels.decode_attention`
(paged pool, GQA) and all of a step's prompt chunks through one launch of the varlen kernel of
:mod:`trtforge.kernels.chunked_prefill` (LOWER_RIGHT causal over each cached prefix plus
its chunk). In a step both launches are prepared once, on the first layer, and repeated by every
layer with its own tensors (``prepare_paged_decode``, ``prepare_chunked_prefill_varlen``): the
per-layer host cost is the launches alone. The executor's pools are ``[num_blocks, block_size, Hkv,
D]``, the layout the kernels' entry points take (they index it through strided views); no K/V is
copied. Sliding-window layers pass their window to both kernels, chunked layers (Llama 4) their attention
chunk size, soft-capped layers (Gemma 2) their attention logit soft-cap, ALiBi layers (BLOOM, MPT,
falcon-rw) their slopes (the Hopper chunk kernel applies none of them: their long chunks stay on the varlen
kernel). FP8 pools are read in place: each
layer's K scale rides in the softmax scale and its V scale is one more launch argument.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trtforge.kernels import interpreting
from trtforge.kernels import num_sms as _num_sms
from trtforge.llm.executors.paged_attention import (
    AttentionMetadata,
)
from trtforge.llm.host_to_device import to_device

_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def triton_usable(
    device: torch.device,
    dtype: torch.dtype,
    block_size: int,
    head_dim: int,
    kv_dtype: torch.dtype | None = None,
) -> bool:
    """Whether the Triton kernels can serve a model of this device and dtype over pools of `kv_dtype`
    (default: the model's; else FP8 E4M3), block size and head dim (on the CPU only inside Triton's
    interpreter, ``TRITON_INTERPRET=1``: tests)."""
    return (
        (device.type == "cuda" or interpreting())
        and dtype in _KERNEL_DTYPES
        and kv_dtype in (None, dtype, torch.float8_e4m3fn)
        and block_size >= 1
        and block_size & (block_size - 1) == 0
        and 0 < head_dim <= 256
        and importlib.util.find_spec("triton") is not None
    )


# Up to this much work (batch x kv heads x the block table's key capacity) a decode launch takes one
# 64-key tile per split, up to about 2 programs per SM. A split-KV program spends ~1 us a tile (the table,
# then the K/V loads, in a chain), so the kernel's default (>= 256 keys a split) is latency-bound here.
# H200, TinyLlama-1.1B shapes, CUDA graphs over 22 layers (benchmarks/results/decode_layer_single.json),
# us a layer, default -> this rule: batch 1 at 512 keys 6.98 -> 4.15 (8 splits), 1024 keys 7.45 -> 4.52
# (16), 2048 keys 8.76 -> 5.95 (32); batch 4 at 1024 keys 9.11 -> 6.79 (16); batch 16 at 512 keys
# 10.02 -> 8.56-9.33 (4). One un-split program per (sequence, kv head) took 6.9-27 us.
SMALL_DECODE_WORK = 32 * 1024
SMALL_DECODE_TILE = 64
# Small decode launches prefetch their first tile before the PDL wait (DecodeConfig.early_kv). H100, the
# 8B single stream (benchmarks/bench_quant_speed.py --ab, results/quant_speed_s51_early_h100.json, two
# alternated rounds): BF16 5.417 -> 5.402 ms/token, FP8 + FP8 head 3.104 -> 3.094. Larger launches: not
# measured, so off there.
SMALL_DECODE_EARLY_KV = True


def small_decode_splits(batch_kv_heads: int, max_keys: int, num_sms: int) -> int:
    """Splits of a small decode launch: one 64-key tile each, at most about 2 programs per SM."""
    tiles = max(1, -(-max(max_keys, 1) // SMALL_DECODE_TILE))
    return max(1, min(tiles, (2 * num_sms) // max(batch_kv_heads, 1), 256))


class TritonDecodeAttention:
    """Decode attention (one query per sequence) through trtforge's split-KV kernel; CUDA-graph safe.

    The launch configuration is fixed per shape: `config` if given, else the kernel's default for the
    head dim with, for small work (:data:`SMALL_DECODE_WORK`), :func:`small_decode_splits` splits. It
    depends on the block table's width (the bucket's key capacity), never on the context lengths on
    the device: graph capture never triggers autotuning, and every replay runs what was captured.
    """

    def __init__(self, config: Any = None, small_work: int = SMALL_DECODE_WORK) -> None:
        self.config, self.small_work = config, small_work

    def config_for(
        self,
        batch: int,
        kv_heads: int,
        head_dim: int,
        max_keys: int,
        num_sms: int = 132,
        kv_dtype: torch.dtype | None = None,
        q_len: int = 1,
    ) -> Any:
        """The DecodeConfig for `batch` sequences of `kv_heads` heads over up to `max_keys` keys in pools
        of `kv_dtype` (None: the query's type), `q_len` queries a sequence: small work splits 64-key
        tiles, the rest takes the kernel's default for `max_keys` keys, `batch` x `kv_heads` (sequence,
        kv head) pairs and `q_len`."""
        from dataclasses import replace

        from trtforge.kernels.decode_attention import default_decode_config

        if self.config is not None:
            return self.config
        config = default_decode_config(head_dim, kv_dtype)
        if batch * kv_heads * max_keys <= self.small_work and config.block_n == SMALL_DECODE_TILE:
            splits = small_decode_splits(batch * kv_heads, max_keys, num_sms)
            return replace(config, num_splits=splits, early_kv=SMALL_DECODE_EARLY_KV)
        return default_decode_config(head_dim, kv_dtype, max_keys, batch * kv_heads, q_len)

    def pool_config(
        self,
        batch: int,
        k_pool: torch.Tensor,
        block_tables: torch.Tensor,
        sliding_window: int | None,
        device: torch.device,
        q_len: int = 1,
        chunk: int | None = None,
    ) -> Any:
        """:meth:`config_for` a launch of `batch` sequences of `q_len` queries over `k_pool` ``[N,
        block_size, Hkv, D]`` through `block_tables` (their width is the key capacity; a window or an
        attention chunk bounds the keys split)."""
        max_keys = int(block_tables.shape[1]) * int(k_pool.shape[1])
        bound = sliding_window if sliding_window is not None else chunk
        if bound is not None:  # the kernel splits only the keys some row sees (+ tile alignment)
            max_keys = min(max_keys, int(bound) + 1 + 128)
        kv_heads, head_dim = int(k_pool.shape[2]), int(k_pool.shape[3])
        return self.config_for(batch, kv_heads, head_dim, max_keys, _num_sms(device), k_pool.dtype, q_len)

    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
        q_len: int = 1,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        softcap: float | None = None,
        alibi_slopes: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Attention of `q` ``[B, Hq, D]``, into `out` (same shape) when given (FP8 pools: with their
        layer's `k_scale` / `v_scale`; a soft-capped layer: its `softcap`; an ALiBi layer: its
        `alibi_slopes`; a layer with attention sinks: its `sinks`; a chunked layer: its `chunk`). With
        `q_len` S > 1 (<= 8: verification rows) `q` is ``[B * S, Hq, D]``, each sequence's last S
        positions, attended LOWER_RIGHT causally."""
        from trtforge.kernels.decode_attention import decode_attention
        from trtforge.kernels.gemv import pdl_supported

        def view(t: torch.Tensor) -> torch.Tensor:  # [B * S, Hq, D] -> a [B, Hq, S, D] view
            return t.unflatten(0, (-1, q_len)).transpose(1, 2)

        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        config = self.pool_config(
            int(q.shape[0]) // q_len, k_pool, block_tables, sliding_window, q.device, q_len, chunk
        )
        decode_attention(
            view(q),
            k_pool,
            v_pool,
            context_lens,
            block_tables,
            scale=scale,
            config=config,
            window=sliding_window,
            out=view(out),
            pdl=pdl_supported(q.device),
            k_scale=k_scale,
            v_scale=v_scale,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
            chunk=chunk,
        )
        return out


@dataclass
class _StepPlan:
    """What every layer of one step shares: the decode rows (`where`: a slice of the step's rows, or
    their indices), their tables and lengths; the prompt chunks' starts, lengths, tables and context
    lengths; and, per layer geometry, the launches prepared from them."""

    decode: tuple[Any, torch.Tensor, torch.Tensor] | None
    chunks: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int] | None
    launches: dict[tuple, tuple[Callable[..., None], ...]] = field(default_factory=dict)
    # sequences of 2..8 new tokens (speculative verification rows), per query length: (q_len, their
    # rows (a slice or indices), tables, lengths), attended by the split-KV decode kernel
    short: tuple[tuple[int, Any, torch.Tensor, torch.Tensor], ...] = ()
    # with hopper_chunks: the long chunks as (first row, query tokens, keys) and their pool blocks, and
    # the other chunks' varlen plan (None: none), for layers the Hopper kernel can run
    long_chunks: tuple[list[tuple[int, int, int]], torch.Tensor] | None = None
    short_chunks: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None


def _layer_key(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    out: torch.Tensor,
    window: int | None,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
) -> tuple:
    """Everything a prepared launch depends on besides the addresses: the window, the attention chunk, the
    soft-cap, the ALiBi slopes (their presence, and the tensor a launch reads them from: the layers of a
    model share one), the attention sinks (likewise: one tensor a layer) and every tensor's device, dtype,
    shape and strides."""
    return (
        window,
        chunk,
        softcap,
        None if alibi_slopes is None else (alibi_slopes.device, alibi_slopes.data_ptr()),
        None if sinks is None else (sinks.device, sinks.data_ptr()),
        *(q.device, q.dtype, q.shape, q.stride()),
        *(k_pool.device, k_pool.dtype, k_pool.shape, k_pool.stride()),
        *(v_pool.device, v_pool.dtype, v_pool.shape, v_pool.stride()),
        *(out.device, out.dtype, out.shape, out.stride()),
    )


def long_chunk_plan(meta: AttentionMetadata, chunks: np.ndarray) -> tuple:
    """Which of a step's prompt chunks (sequence indices `chunks`) run the Hopper kernel: those of at least
    HOPPER_CHUNK_MIN_TOKENS query tokens, while they see at most HOPPER_CHUNK_MAX_KEYS keys in all.
    Returns ([(first row, query tokens, keys)] of those, the other chunks, the long ones' block-table
    entries as flat indices into the contiguous [B, W] table, in order), or (None, None, None). Host
    arrays only: no device work."""
    from trtforge.kernels.chunked_prefill import HOPPER_CHUNK_MAX_KEYS, HOPPER_CHUNK_MIN_TOKENS

    qsl, ctx, bs = meta.query_start_loc_host, meta.context_lens_host, meta.block_size
    qlens = qsl[1:] - qsl[:-1]
    long = chunks[qlens[chunks] >= HOPPER_CHUNK_MIN_TOKENS]
    if not len(long) or int(ctx[long].sum()) > HOPPER_CHUNK_MAX_KEYS:
        return None, None, None
    row = int(meta.block_tables.shape[1])
    pages = [s * row + np.arange(-(-int(ctx[s]) // bs)) for s in long]
    spans = [(int(qsl[s]), int(qlens[s]), int(ctx[s])) for s in long]
    return spans, chunks[qlens[chunks] < HOPPER_CHUNK_MIN_TOKENS], np.concatenate(pages)


class TritonPagedAttention:
    """Mixed prefill/decode attention: all decode rows in one decode launch, all prompt chunks in one.

    Sequences of 2 to 8 new tokens (a speculative verification row: the last token and its proposals)
    go to the split-KV decode kernel with that query length, one launch per length: the chunk kernel
    does not split the keys, so for a few query rows over a long context it would leave the GPU idle
    (``short_queries=False`` sends them to the chunk kernel, for comparison).

    The chunk launch reads the flat ``[T, Hq, D]`` query and writes the output in place (no copies);
    decode rows that lie together (the scheduler puts running sequences first) are read and written
    in place too. A step's plan (which rows decode, their block tables and lengths, chunk bounds) is
    built once from the host-side metadata, and both launches are prepared once per step (checks,
    split count, grid, arguments, scratch; :mod:`trtforge.kernels.prepared_launch`):
    each layer then only launches the kernels with its own q, pools, output and scale.

    ``hopper_chunks`` (on by default; used where ``chunked_prefill.hopper_chunks_eligible`` holds: sm_90,
    16-bit or FP8 pools, no sliding window, no attention chunks, no soft-cap): prompt chunks of at least
    ``HOPPER_CHUNK_MIN_TOKENS`` tokens run the warp-specialized Hopper flash-attention kernel over their
    gathered K/V (FP8 pools gathered widened to the query's type) instead of the varlen kernel
    (``bench_throughput.py --hopper-chunks`` A/Bs it; FP8 + FP8 KV at 8B 2048/128, session 30: 2,626 ->
    2,737 tok/s).

    ``concurrent`` (CUDA, on by default: on the H200 it made 8B 2048/128 serving 1.7% faster and the mixed
    burst 1.7%, measured side by side in session 16; benchmarks/profile_mixed_step.py and
    bench_throughput.py --concurrent-attention A/B it): in a step with both prompt chunks and decode-
    kernel rows, the decode-kernel launches run on a side stream beside the chunk launch, so the decode
    rows' K/V reads (bandwidth-bound) overlap the chunks' attention (compute-bound); the layer waits for
    both. The decode launches are then prepared on the side stream (their arrival counters are that
    stream's).
    """

    def __init__(
        self,
        decode: TritonDecodeAttention | None = None,
        short_queries: bool = True,
        concurrent: bool = True,
        hopper_chunks: bool = True,
    ) -> None:
        self.decode = decode or TritonDecodeAttention()
        self.short_queries = short_queries
        self.concurrent = concurrent
        self.hopper_chunks = hopper_chunks
        self._gather: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._plan_for: AttentionMetadata | None = None
        self._plan: _StepPlan | None = None
        self._side: dict[int, Any] = {}

    def _side_stream(self, plan: _StepPlan, q: torch.Tensor) -> Any:
        """The side stream the step's decode-kernel launches run on (see ``concurrent``), or None: off,
        not CUDA, a step without both kinds of launch, or inside a graph capture."""
        if not (self.concurrent and q.is_cuda and plan.chunks is not None):
            return None
        if (plan.decode is None and not plan.short) or torch.cuda.is_current_stream_capturing():
            return None
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        if index not in self._side:
            self._side[index] = torch.cuda.Stream(q.device)
        return self._side[index]

    def _make_plan(self, meta: AttentionMetadata, device: torch.device) -> _StepPlan:
        from trtforge.kernels.configs import MAX_Q_LEN

        qsl = meta.query_start_loc_host
        qlens = qsl[1:] - qsl[:-1]
        bs = meta.block_size
        longest_short = MAX_Q_LEN if self.short_queries else 1
        decode, chunks = np.flatnonzero(qlens == 1), np.flatnonzero(qlens > longest_short)
        short = np.flatnonzero((qlens > 1) & (qlens <= longest_short))
        gather = 0 < len(decode) < len(qlens)  # decode rows' tables and lengths are a selection
        long, rest, pages = self._long_chunks(meta, chunks, device)
        # one copy to the device: the decode rows' sequences (where selected), then the chunks' starts,
        # lengths and sequences, then those of the chunks left to the varlen kernel beside the long ones,
        # then the long ones' flat block-table indices (int32: the kernels read them, index_select takes
        # them)
        parts = [decode] if gather else []
        parts += [qsl[chunks], qlens[chunks], chunks]
        if long is not None:
            parts += [qsl[rest], qlens[rest], rest, pages]
        packed = np.concatenate(parts).astype(np.int32)
        indices = to_device(packed, device) if len(packed) else None
        decode_plan = None
        if len(decode):
            width = -(-int(meta.context_lens_host[decode].max()) // bs)
            rows = qsl[decode].astype(np.int64)
            if gather:
                seqs = indices[: len(decode)]
                tables = meta.block_tables.index_select(0, seqs)[:, :width]
                lens = meta.context_lens.index_select(0, seqs)
            else:
                tables, lens = meta.block_tables[:, :width], meta.context_lens
            lo = int(rows[0])
            if int(rows[-1]) - lo + 1 == len(rows):  # one stretch of rows: slices, no gather or scatter
                where: Any = slice(lo, lo + len(rows))
            else:
                where = to_device(rows, device)
            decode_plan = (where, tables, lens)
        chunk_plan = None
        if len(chunks):
            first, n = len(decode) if gather else 0, len(chunks)
            starts, lens_q, seqs = indices[first : first + 3 * n].view(3, n).unbind(0)
            width = -(-int(meta.context_lens_host[chunks].max()) // bs)
            tables = meta.block_tables.index_select(0, seqs)[:, :width]
            lens = meta.context_lens.index_select(0, seqs)
            chunk_plan = (starts, lens_q, tables, lens, int(qlens[chunks].max()))
        plan = _StepPlan(decode_plan, chunk_plan, short=self._short_plan(meta, short, device))
        if long is not None:
            first, n = (len(decode) if gather else 0) + 3 * len(chunks), len(rest)
            if n:
                starts, lens_q, seqs = indices[first : first + 3 * n].view(3, n).unbind(0)
                width = -(-int(meta.context_lens_host[rest].max()) // bs)
                tables = meta.block_tables.index_select(0, seqs)[:, :width]
                lens = meta.context_lens.index_select(0, seqs)
                plan.short_chunks = (starts, lens_q, tables, lens, int(qlens[rest].max()))
            flat = meta.block_tables if meta.block_tables.is_contiguous() else meta.block_tables.contiguous()
            plan.long_chunks = (long, flat.view(-1).index_select(0, indices[first + 3 * n :]))
        return plan

    def _long_chunks(self, meta: AttentionMetadata, chunks: np.ndarray, device: torch.device) -> tuple:
        """:func:`long_chunk_plan` where ``hopper_chunks`` is on and the device is an sm_90 GPU, else
        (None, None, None)."""
        if not (self.hopper_chunks and device.type == "cuda" and len(chunks)):
            return None, None, None
        if torch.cuda.get_device_capability(device)[0] != 9:
            return None, None, None
        return long_chunk_plan(meta, chunks)

    def _gather_scratch(
        self, pool: torch.Tensor, blocks: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V buffers of `dtype` (the pool's, or the query's over FP8 pools, which are gathered widened)
        of at least `blocks` pool blocks for the long chunks' gather, kept across steps and grown (to a
        multiple of 1,024 blocks) only when a step needs more: a new size every step would send the
        allocator to the driver mid-serving. (Only the current stream uses them, in step order.)"""
        key = (pool.device, dtype, *pool.shape[1:])
        held = self._gather.get(key)
        if held is None or int(held[0].shape[0]) < blocks:
            if held is not None:
                blocks = max(blocks, 2 * int(held[0].shape[0]))
            n = -(-blocks // 1024) * 1024
            held = tuple(pool.new_empty((n, *pool.shape[1:]), dtype=dtype) for _ in range(2))
            self._gather[key] = held
        return held

    @staticmethod
    def _short_plan(meta: AttentionMetadata, short: np.ndarray, device: torch.device) -> tuple:
        """(q_len, rows, tables, lengths) of the sequences of each short query length."""
        qsl, out = meta.query_start_loc_host, []
        qlens = qsl[1:] - qsl[:-1]
        for s in np.unique(qlens[short]):
            seqs = short[qlens[short] == s]
            rows = (qsl[seqs][:, None] + np.arange(s)[None, :]).reshape(-1).astype(np.int64)
            packed = to_device(np.concatenate([seqs, rows]).astype(np.int32), device)
            seq_idx = packed[: len(seqs)]
            width = -(-int(meta.context_lens_host[seqs].max()) // meta.block_size)
            tables = meta.block_tables.index_select(0, seq_idx)[:, :width]
            lens = meta.context_lens.index_select(0, seq_idx)
            lo = int(rows[0])
            where: Any = slice(lo, lo + len(rows))
            if int(rows[-1]) - lo + 1 != len(rows):
                where = packed[len(seqs) :].long()
            out.append((int(s), where, tables, lens))
        return tuple(out)

    def plan_of(self, meta: AttentionMetadata, device: torch.device) -> _StepPlan:
        """The plan of the step `meta` describes (built on its first layer, kept until the next step)."""
        if self._plan_for is not meta or self._plan is None:
            self._plan, self._plan_for = self._make_plan(meta, device), meta
        return self._plan

    def _prepare(
        self,
        plan: _StepPlan,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        out: torch.Tensor,
        window: int | None,
        softcap: float | None = None,
        alibi_slopes: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
        side: Any = None,
        chunk: int | None = None,
    ) -> tuple[Callable[..., None], ...]:
        """The step's launches for layers of this geometry (window, soft-cap, ALiBi slopes, attention
        sinks and attention chunk included):
        each called as ``(q, k_pool, v_pool, out, scale * k_scale, v_scale)``. With a `side` stream they are
        prepared on it (their arrival counters and scratch are that stream's), but for the Hopper chunk
        launch: it runs last, on the current stream, which its gather scratch then belongs to."""
        from trtforge.kernels.chunked_prefill import hopper_chunks_eligible, prepare_chunked_prefill_hopper

        hopper = plan.long_chunks is not None and hopper_chunks_eligible(
            q, k_pool, window, out, softcap, alibi_slopes, sinks, chunk
        )
        geometry = {"window": window, "softcap": softcap, "alibi_slopes": alibi_slopes, "sinks": sinks}
        geometry["chunk"] = chunk
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            launches = self._prepare_side(plan, q, k_pool, v_pool, out, geometry, hopper)
        if hopper:  # last, run on the current stream: its gather scratch is that stream's
            spans, pages = plan.long_chunks
            scratch = self._gather_scratch(k_pool, int(pages.shape[0]), q.dtype)  # FP8 pools: widened
            launches.append(prepare_chunked_prefill_hopper(q, k_pool, v_pool, spans, pages, scratch=scratch))
        return tuple(launches)

    def _prepare_side(
        self, plan, q, k_pool, v_pool, out, geometry: dict[str, Any], hopper: bool
    ) -> list[Callable[..., None]]:
        """:meth:`_prepare`'s launches but the Hopper chunk launch (`hopper`: the long chunks take it, so
        the varlen kernel gets only the others); `geometry`: the layer's window, soft-cap, ALiBi slopes and
        attention sinks (the kernels' keywords)."""
        from trtforge.kernels.chunked_prefill import prepare_chunked_prefill_varlen
        from trtforge.kernels.decode_attention import prepare_paged_decode
        from trtforge.kernels.gemv import pdl_supported

        launches: list[Callable[..., None]] = []
        window = geometry["window"]
        if plan.decode is not None:
            where, tables, lens = plan.decode
            rows = where.stop - where.start if isinstance(where, slice) else int(where.shape[0])
            config = self.decode.pool_config(rows, k_pool, tables, window, q.device, chunk=geometry["chunk"])
            pdl = pdl_supported(q.device)
            if isinstance(where, slice):
                launch = prepare_paged_decode(
                    q, k_pool, v_pool, lens, tables, out, config=config, rows=where, pdl=pdl, **geometry
                )  # fmt: skip
                launches.append(launch)
            else:  # scattered rows: gathered into a copy, their outputs into a scratch tensor
                scratch = q.new_empty((rows, *q.shape[1:]))
                launch = prepare_paged_decode(
                    scratch, k_pool, v_pool, lens, tables, scratch, config=config, pdl=pdl, **geometry
                )  # fmt: skip

                def gathered(q, kp, vp, out, scale, v_scale):  # (tensors, then the two floats)
                    launch(q.index_select(0, where), kp, vp, scratch, scale, v_scale)
                    out.index_copy_(0, where, scratch)

                launches.append(gathered)
        for short in plan.short:  # (not unpacked here: the decode closure above reads `where`)
            launches.append(self._prepare_short(*short, q, k_pool, v_pool, out, geometry))
        varlen = plan.short_chunks if hopper else plan.chunks
        if varlen is not None:
            starts, lens_q, tables, lens, max_q_len = varlen
            launches.append(
                prepare_chunked_prefill_varlen(
                    q,
                    k_pool,
                    v_pool,
                    lens,
                    tables,
                    starts,
                    lens_q,
                    max_q_len,
                    out=out,
                    **geometry,
                )
            )
        return launches

    def _prepare_short(
        self, s, where, tables, lens, q, k_pool, v_pool, out, geometry: dict[str, Any]
    ) -> Callable[..., None]:
        """The decode kernel's launch over sequences of `s` query rows each (rows `where`; `geometry`: the
        layer's window, soft-cap, ALiBi slopes and attention sinks)."""
        from trtforge.kernels.decode_attention import prepare_paged_decode
        from trtforge.kernels.gemv import pdl_supported

        n = int(tables.shape[0])
        config = self.decode.pool_config(
            n, k_pool, tables, geometry["window"], q.device, s, geometry["chunk"]
        )
        pdl = pdl_supported(q.device)
        if isinstance(where, slice):
            return prepare_paged_decode(
                q,
                k_pool,
                v_pool,
                lens,
                tables,
                out,
                config=config,
                rows=where,
                pdl=pdl,
                q_len=s,
                **geometry,
            )
        scratch = q.new_empty((n * s, *q.shape[1:]))
        launch = prepare_paged_decode(
            scratch, k_pool, v_pool, lens, tables, scratch, config=config, pdl=pdl, q_len=s, **geometry
        )  # fmt: skip

        def gathered(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, out: torch.Tensor, *scales):
            launch(q.index_select(0, where), kp, vp, scratch, *scales)
            out.index_copy_(0, where, scratch)

        return gathered

    def __call__(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        softcap: float | None = None,
        alibi_slopes: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Attention of the step's tokens `q` ``[T, Hq, D]``, into `out` (same shape) when given (FP8
        pools: with their layer's `k_scale` / `v_scale`; a soft-capped layer: its `softcap`; an ALiBi layer:
        its `alibi_slopes`, read by the prepared launches at every layer; a layer with attention sinks: its
        `sinks`, likewise; a chunked layer: its attention `chunk`)."""
        plan = self.plan_of(meta, q.device)
        if out is None:
            out = torch.empty_like(q)
        key = _layer_key(q, k_pool, v_pool, out, sliding_window, softcap, alibi_slopes, sinks, chunk)
        side = self._side_stream(plan, q)
        launches = plan.launches.get(key)
        if launches is None:
            launches = self._prepare(
                plan, q, k_pool, v_pool, out, sliding_window, softcap, alibi_slopes, sinks, side, chunk
            )
            plan.launches[key] = launches
        qk_scale, v_scale = float(scale) * float(k_scale), float(v_scale)
        if side is None:
            for launch in launches:
                launch(q, k_pool, v_pool, out, qk_scale, v_scale)
            return out
        current = torch.cuda.current_stream(q.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for launch in launches[:-1]:
                launch(q, k_pool, v_pool, out, qk_scale, v_scale)
        launches[-1](q, k_pool, v_pool, out, qk_scale, v_scale)
        current.wait_stream(side)
        return out
