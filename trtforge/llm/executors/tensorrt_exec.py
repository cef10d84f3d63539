"""The TensorRT step executor: a paged step engine (``trtforge compile MODEL --generate --cache-layout
paged``) behind the :class:`~trtforge.llm.executors.base.StepExecutor` protocol.

Three parts, the first two pure Python (tested on the CPU against a TensorRT-RTX build):

- :func:`read_step_engine` validates the manifest: a ``generation`` section with a paged cache, the
  step graph's I/O names and dtypes, pools ``[num_blocks, block_size, Hkv, D]``, and a prefill and a
  decode profile whose ranges are those the generation section implies (``llm.contract.step_profiles``).
- :func:`plan_step` maps a :class:`StepBatch` to engine calls with the feed mapping the ONNX Runtime
  executor uses (:mod:`.paged_feeds`): sequences bringing one token go to the decode profile, the others
  to the prefill profile; every bound shape is checked against that profile's range first.
- :class:`TrtPagedExecutor` owns the device state, allocated once: the K/V pools of every layer (plus a
  scratch block padded positions write to), one execution context per profile with its own device
  memory and CUDA stream, and a logits buffer per context. It is loaded through the encoder runtime
  (:func:`trtforge.runtime.engine.load`: manifest hash, backend version, GPU support, deserialization)
  and calls TensorRT only through :mod:`trtforge.runtime.trt_context`.

Overlap. When the engine writes the pools in place (``get_aliased_input_tensor`` names each pool input
for its pool output, as a KV-cache-update layer does), a mixed step's prefill call and decode call run
concurrently on their two streams over the same pools: they write disjoint slots (copy-on-write has
already given every written block a single owner) and each context has its own profile, as TensorRT
requires of concurrent contexts (tensorrt-facts.md §4.3). When the pool outputs are separate tensors (the
``ScatterND`` paged graph of today: each call writes a whole new pool), two concurrent calls would each
drop the other's writes, so a step is one call (prefill profile if any sequence brings more than one
token) and the pools are double-buffered: the call reads one set and writes the other, then they swap.

No machine here runs a TensorRT engine (architecture.md); the device path follows the documented API:
``set_optimization_profile_async`` then ``set_input_shape``, ``set_tensor_address`` for every I/O tensor,
``execute_async_v3`` on a non-default stream (tensorrt-facts.md §4.2; TensorRT 10.15 C++
``IExecutionContext`` reference, docs.nvidia.com/deeplearning/tensorrt/latest/_static/c-api/
classnvinfer1_1_1_i_execution_context.html; the 8.x-to-10.x migration page "Migrating from enqueueV2 to
enqueueV3"; TensorRT-RTX "Working with Dynamic Shapes": create a context, select a profile covering the
input dimensions, set them, enqueue, docs.nvidia.com/deeplearning/tensorrt-rtx/latest/inference-library/
work-with-dynamic-shapes.html; the ``tensorrt_rtx`` 1.7.1 docstrings of the same calls), and is exercised
by the ``trt_run`` tests where a supported GPU exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.core.manifest import Manifest, ShapeRange, read_manifest, settle_for_reading
from trtforge.errors import TrtforgeError, UserError, is_int
from trtforge.llm.executors.base import ExecutorFacts, StepBatch, check_max_model_len
from trtforge.llm.executors.paged_feeds import logits_rows, padded_feeds

PHASES = ("prefill", "decode")
_FEED_DTYPES = {
    "input_ids": "int64",
    "position_ids": "int64",
    "past_lens": "int64",
    "new_lens": "int64",
    "block_tables": "int32",
    "slot_mapping": "int64",
}
_REQUIRED = ("num_layers", "num_kv_heads", "head_dim", "vocab_size", "max_seq", "max_batch", "max_prefill")
_BUILD_HINT = "Build one with `trtforge compile MODEL --generate --cache-layout paged -o OUT.engine`."


@dataclass(frozen=True)
class StepEngineSpec:
    """What the executor binds, read from a validated paged step-engine manifest."""

    label: str
    generation: dict[str, Any]
    block_size: int
    engine_blocks: int  # largest pool the profiles allow, scratch block included
    pool_dims: tuple[int, int, int]  # (block_size, Hkv, D)
    pool_dtype: str
    pool_inputs: tuple[str, ...]
    pool_outputs: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    profiles: dict[str, int]  # phase -> engine profile index
    ranges: dict[str, dict[str, ShapeRange]]  # phase -> input name -> range
    manifest: Manifest  # what it was read from: passed down so that loading reads the file once

    @property
    def all_logits(self) -> bool:
        return bool(self.generation.get("all_logits"))

    @property
    def vocab_size(self) -> int:
        return int(self.generation["vocab_size"])


def _fail(label: str, what: str) -> UserError:
    return UserError(f"{label}: {what} {_BUILD_HINT}")


def read_step_engine(path: str | Path, manifest: Manifest | None = None) -> StepEngineSpec:
    """Validate the manifest of a paged step engine (no TensorRT, no GPU); UserError names what is wrong."""
    from trtforge.llm.contract import DECODE, PREFILL, paged_input_names, paged_output_names, step_profiles

    p = Path(path)
    label = f"TensorRT engine '{p}'"
    settle_for_reading(p)  # (a compile killed while publishing the pair: its engine may be renamed in now)
    if not p.is_file():
        raise UserError(f"{label} {'is a directory' if p.is_dir() else 'does not exist'}.")
    m = manifest if manifest is not None else read_manifest(p)
    g = m.generation
    if not g:
        raise _fail(label, "its manifest has no `generation` section, so it is not a step engine.")
    cache = g.get("cache") or {}
    if cache.get("layout") != "paged":
        raise _fail(
            label,
            f"it has a {cache.get('layout')!r} KV cache; the TensorRT executor serves paged step engines.",
        )
    missing = [k for k in _REQUIRED if not isinstance(g.get(k), int)] + [
        f"cache.{k}" for k in ("block_size", "num_blocks") if not isinstance(cache.get(k), int)
    ]
    if missing:
        raise _fail(label, f"its generation section lacks the integer fields {missing}.")
    layers, bs, blocks = int(g["num_layers"]), int(cache["block_size"]), int(cache["num_blocks"])
    if bs < 1 or blocks < 2:
        raise _fail(
            label, f"cache.block_size {bs} / cache.num_blocks {blocks}: need >= 1 and >= 2 (scratch)."
        )
    want_in, want_out = paged_input_names(layers), paged_output_names(layers)
    if list(cache.get("inputs", [])) != want_in[6:] or list(cache.get("outputs", [])) != want_out[1:]:
        raise _fail(label, f"cache.inputs/outputs do not name the {layers} layers' pools {want_in[6:]}.")
    ins, outs = {t.name: t for t in m.inputs}, {t.name: t for t in m.outputs}
    if set(ins) != set(want_in) or set(outs) != set(want_out):
        have, want = {*ins, *outs}, set(want_in + want_out)
        raise _fail(
            label,
            f"its I/O does not match the paged step graph: missing {sorted(want - have)}, unexpected "
            f"{sorted(have - want)}.",
        )
    dims = [bs, int(g["num_kv_heads"]), int(g["head_dim"])]
    pool_dtype = str(cache.get("dtype"))
    expect = {n: (d, None) for n, d in _FEED_DTYPES.items()} | {"logits": ("float32", None)}
    expect |= {n: (pool_dtype, [-1, *dims]) for n in want_in[6:] + want_out[1:]}
    for name, (dtype, shape) in expect.items():
        t = ins.get(name) or outs[name]
        if t.dtype != dtype or (shape is not None and list(t.shape) != shape):
            raise _fail(
                label,
                f"tensor '{name}' is {t.dtype} {list(t.shape)}, expected {dtype}"
                + (
                    f" {shape} ([num_blocks, block_size, kv_heads, head_dim] in cache.dtype)."
                    if shape
                    else "."
                ),
            )
    phases = g.get("profiles") or {}
    idx = {ph: phases.get(ph) for ph in PHASES}
    if not all(isinstance(i, int) and 0 <= i < len(m.profiles) for i in idx.values()) or len(
        set(idx.values())
    ) != len(PHASES):
        raise _fail(
            label,
            f"generation.profiles is {phases!r}: expected distinct prefill and decode indices into its "
            f"{len(m.profiles)} optimization profiles.",
        )
    implied = step_profiles(g)
    earlier = step_profiles(g, fixed_batch_prefill=True)  # (max_batch 1 engines built before)
    ranges = {}
    for ph, base in (("prefill", PREFILL), ("decode", DECODE)):
        got = m.profiles[idx[ph]]
        for name, want in implied[base].items():
            if got.get(name) not in (want, earlier[base][name]):
                raise _fail(
                    label,
                    f"profile {idx[ph]} ({ph}) gives '{name}' {got.get(name)}, but its generation section "
                    f"implies {want}; the manifest was edited or belongs to another build.",
                )
        ranges[ph] = dict(got)
    return StepEngineSpec(
        label=label,
        generation=g,
        block_size=bs,
        engine_blocks=blocks,
        pool_dims=(dims[0], dims[1], dims[2]),
        pool_dtype=pool_dtype,
        pool_inputs=tuple(want_in[6:]),
        pool_outputs=tuple(want_out[1:]),
        input_names=tuple(want_in),
        output_names=tuple(want_out),
        profiles=idx,
        ranges=ranges,
        manifest=m,
    )


@dataclass(frozen=True)
class EngineCall:
    """One enqueue: the sequences (rows of the batch) it runs, its phase/profile, feeds and input shapes."""

    phase: str
    profile: int
    rows: np.ndarray
    feeds: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]  # every engine input, pools included


def plan_step(spec: StepEngineSpec, batch: StepBatch, pool_blocks: int, *, split: bool) -> list[EngineCall]:
    """The engine calls for `batch` over pools of `pool_blocks` blocks (the last is scratch).

    `split`: decode rows (one new token) and prefill rows go to separate calls on their own profiles
    (for in-place pools); otherwise one call, on the decode profile only when every row is a decode.
    UserError when a call's shapes leave its profile (batch, chunk or block-table limits of the engine).
    """
    decode = batch.query_lens == 1
    if split:
        groups = [("prefill", np.flatnonzero(~decode)), ("decode", np.flatnonzero(decode))]
    else:
        groups = [("decode" if decode.all() else "prefill", np.arange(batch.num_seqs))]
    pool = (pool_blocks, *spec.pool_dims)
    calls = []
    for phase, rows in groups:
        if not len(rows):
            continue
        feeds = padded_feeds(batch, (pool_blocks - 1) * spec.block_size, rows)
        shapes = {n: tuple(int(d) for d in a.shape) for n, a in feeds.items()}
        shapes |= dict.fromkeys(spec.pool_inputs, pool)
        for name, shape in shapes.items():
            r = spec.ranges[phase][name]
            if len(shape) != len(r.min) or not all(lo <= d <= hi for lo, d, hi in zip(r.min, shape, r.max)):
                raise UserError(
                    f"{spec.label}: the {phase} call binds '{name}' as {list(shape)}, outside profile "
                    f"{spec.profiles[phase]} ({r.min} .. {r.max}). Keep SchedulerConfig.max_num_seqs <= "
                    f"max_batch {spec.generation['max_batch']} and max_prefill_chunk <= max_prefill "
                    f"{spec.generation['max_prefill']}, or rebuild with larger --max-batch/--max-prefill."
                )
        calls.append(EngineCall(phase, spec.profiles[phase], rows, feeds, shapes))
    return calls


@dataclass
class _Lane:
    """One profile's execution context, stream, device memory and logits buffer."""

    ctx: Any
    stream: Any
    scratch: Any
    logits: Any


class TrtPagedExecutor:
    """Runs StepBatch batches through a paged step engine on a CUDA GPU, owning its K/V pools.

    `num_blocks` (default: the engine's pool less the scratch block) sizes the pools the block manager
    hands out; it may be smaller than what the engine was built for, never larger. `spec`: the engine's
    :func:`read_step_engine` when the caller already read it (its manifest is then not read again).
    """

    def __init__(
        self,
        path: str | Path,
        num_blocks: int | None = None,
        *,
        max_model_len: int | None = None,
        device: Any = None,
        spec: StepEngineSpec | None = None,
    ) -> None:
        self.path = Path(path)
        self.spec = spec = read_step_engine(self.path) if spec is None else spec
        g = spec.generation
        most = spec.engine_blocks - 1
        num_blocks = most if num_blocks is None else num_blocks
        if not is_int(num_blocks) or not 1 <= num_blocks <= most:
            raise UserError(
                f"num_blocks must be an integer in [1, {most}] ({spec.label} holds pools of {most} blocks "
                f"plus one scratch block; rebuild with a larger --num-blocks for more), got {num_blocks!r}."
            )
        num_blocks = int(num_blocks)
        max_model_len = check_max_model_len(max_model_len, int(g["max_seq"]), "the engine's --max-seq")
        self._num_blocks, self._max_model_len = num_blocks, max_model_len
        self._open(device)
        pools = (*self.pools.values(), *self._spare.values())
        self.facts = ExecutorFacts.of_step_graph(
            g,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            kv_dtype=spec.pool_dtype,
            kv_element_bytes=pools[0].element_size(),
            kv_pool_bytes=sum(t.numel() * t.element_size() for t in pools),
        )

    def _open(self, device: Any) -> None:
        """Deserialize through the runtime, allocate pools, contexts, streams and buffers once."""
        import torch

        from trtforge.runtime._device import CudaDevice, make_device
        from trtforge.runtime._dtypes import torch_dtype
        from trtforge.runtime.engine import load

        spec = self.spec
        self.device = make_device(device)
        if not isinstance(self.device, CudaDevice):
            raise UserError(f"the TensorRT executor runs on a CUDA device, got {device!r}.")
        # manifest hash, backend version, GPU support, deserialize (§4.1); the manifest already read
        self.engine = load(self.path, manifest=spec.manifest)
        handle = self.engine.handle
        dev, dtype = self.device.torch_device, torch_dtype(spec.pool_dtype, where=spec.label)
        shape = (self._num_blocks + 1, *spec.pool_dims)
        self.pools = {n: torch.zeros(shape, dtype=dtype, device=dev) for n in spec.pool_inputs}
        aliased = {o: handle.aliased_input(o) for o in spec.pool_outputs}
        self.in_place = all(aliased[o] == i for o, i in zip(spec.pool_outputs, spec.pool_inputs))
        # Pools written to separate outputs are double-buffered: written here, swapped in after the call.
        self._spare = {
            i: torch.zeros(shape, dtype=dtype, device=dev)
            for o, i in zip(spec.pool_outputs, spec.pool_inputs)
            if aliased[o] != i
        }
        self._lanes: dict[str, _Lane] = {}
        for phase in PHASES:
            profile, stream = spec.profiles[phase], self.device.new_stream()
            ctx = handle.create_context()  # one context per profile: they may run concurrently (§4.3)
            ctx.set_optimization_profile(profile, stream.cuda_stream)  # §4.2, before any input shape
            size = handle.device_memory_size_for_profile(profile)
            scratch = torch.empty(max(size, 1), dtype=torch.uint8, device=dev)
            ctx.set_device_memory(scratch.data_ptr(), size)  # §4.2 user-managed, 256-byte aligned
            b, s = spec.ranges[phase]["input_ids"].max
            logits = torch.empty(b * (s if spec.all_logits else 1) * spec.vocab_size, device=dev)
            self._lanes[phase] = _Lane(ctx, stream, scratch, logits)
            stream.synchronize()  # the profile switch is done before the first enqueue on any stream

    @property
    def max_batch(self) -> int:
        """Sequences one step may hold (the profiles' batch limit)."""
        return int(self.spec.generation["max_batch"])

    @property
    def max_prefill(self) -> int:
        """New tokens one sequence may bring in a step (the prefill profile's limit)."""
        return int(self.spec.generation["max_prefill"])

    def step(self, batch: StepBatch) -> Any:
        """Copy blocks, enqueue the prefill and decode calls on their streams; logits [N, V] (torch)."""
        import torch

        calls = plan_step(self.spec, batch, self._num_blocks + 1, split=self.in_place)
        main = self.device.current_stream()
        for src, dst in batch.block_copies.tolist():  # copy-on-write, before any call writes
            for pool in self.pools.values():
                pool[dst].copy_(pool[src])
        keep = []
        for call in calls:
            lane = self._lanes[call.phase]
            lane.stream.wait_stream(main)
            keep.append(self._enqueue(lane, call))
        seq, col = logits_rows(batch, self.spec.all_logits, self.spec.label)
        out = torch.empty((len(seq), self.spec.vocab_size), device=self.device.torch_device)
        where = np.full(batch.num_seqs, -1, np.int64)
        for call in calls:
            main.wait_stream(self._lanes[call.phase].stream)
            where[call.rows] = np.arange(len(call.rows))
            pick = np.flatnonzero(np.isin(seq, call.rows))
            if not len(pick):
                continue
            b, s = call.shapes["input_ids"]
            logits = self._lanes[call.phase].logits[
                : b * (s if self.spec.all_logits else 1) * self.spec.vocab_size
            ]
            logits = logits.view(b, s, -1) if self.spec.all_logits else logits.view(b, -1)
            rows = torch.from_numpy(where[seq[pick]]).to(out.device)
            sel = logits[rows] if col is None else logits[rows, torch.from_numpy(col[pick]).to(out.device)]
            out[torch.from_numpy(pick).to(out.device)] = sel
        for name, spare in list(self._spare.items()):  # the call wrote the spare set: it is current now
            self.pools[name], self._spare[name] = spare, self.pools[name]
        main.synchronize()  # logits, pools and `keep` (the feeds) are settled before the next step
        del keep
        return out

    def _enqueue(self, lane: _Lane, call: EngineCall) -> list[Any]:
        """Bind one call's shapes and addresses and enqueue it on its lane's stream; returns its feeds."""
        import torch

        ctx, dev = lane.ctx, self.device.torch_device
        with torch.cuda.stream(lane.stream):
            feeds = {n: torch.from_numpy(a).to(dev, non_blocking=True) for n, a in call.feeds.items()}
        for name, shape in call.shapes.items():
            ctx.set_input_shape(name, shape)  # §4.2, after the profile
        for name, t in feeds.items():
            ctx.set_tensor_address(name, t.data_ptr())  # §4.2
        for name, out in zip(self.spec.pool_inputs, self.spec.pool_outputs):
            ctx.set_tensor_address(name, self.pools[name].data_ptr())
            ctx.set_tensor_address(out, self._spare.get(name, self.pools[name]).data_ptr())
        ctx.set_tensor_address("logits", lane.logits.data_ptr())
        if not ctx.execute_async(lane.stream.cuda_stream):  # §4.2 execute_async_v3, releases the GIL
            raise TrtforgeError(
                f"{self.spec.label}: TensorRT failed to enqueue the {call.phase} call (see its log)."
            )
        return list(feeds.values())


__all__ = ["EngineCall", "StepEngineSpec", "TrtPagedExecutor", "plan_step", "read_step_engine"]
