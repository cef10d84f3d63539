"""Slot-layout step graphs in exact ONNX Runtime: raw feeds, and the same graph behind the serving engine.

:class:`OrtStepExecutor` runs raw feeds through a slot-layout step graph, checking them against the
graph first (the teacher-forced and per-step-logits loop of :mod:`trtforge.llm.api`, a numerics tool).
:class:`OrtSlotPoolExecutor` serves that graph through the engine like any paged executor: its pool is
the slot cache, one row ``[Hkv, max_seq, D]`` per block, so a block holds a whole sequence (block size
= max_seq) and each sequence owns one block. Paged graphs are served by :mod:`.onnxruntime_exec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trtforge.errors import UserError, is_int
from trtforge.llm.executors.base import ExecutorFacts, StepBatch, check_max_model_len
from trtforge.llm.executors.onnxruntime_exec import ORT_TYPES, allocate_pools, read_generation, step_session
from trtforge.llm.executors.paged_feeds import logits_rows, padded_feeds


class OrtStepExecutor:
    """One exact ONNX Runtime session over a step graph."""

    def __init__(self, path: str | Path, generation: dict[str, Any]):
        self.path = Path(path)
        self.generation = generation
        self.session = step_session(self.path, generation)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.max_batch = int(generation["max_batch"])
        self.max_seq = int(generation["max_seq"])
        cache = generation["cache"]
        self.cache_inputs = list(cache["inputs"])
        missing = [
            n
            for n in ("input_ids", "position_ids", "past_lens", "new_lens", *self.cache_inputs)
            if n not in self.inputs
        ]
        if missing:
            raise UserError(f"step graph '{self.path}' lacks the inputs {missing} its metadata names.")
        self.cache_dtype = np.dtype(ORT_TYPES[self.inputs[self.cache_inputs[0]].type])
        self.cache_dims = (int(generation["num_kv_heads"]), self.max_seq, int(generation["head_dim"]))

    def new_cache(self, batch: int) -> dict[str, np.ndarray]:
        """Zeroed caches for `batch` rows."""
        return {n: np.zeros((batch, *self.cache_dims), self.cache_dtype) for n in self.cache_inputs}

    def check_feeds(self, feeds: dict[str, np.ndarray]) -> None:
        """UserError naming the first tensor whose name, dtype or shape does not fit this graph."""
        unknown = sorted(set(feeds) - set(self.inputs))
        if unknown:
            raise UserError(f"step graph '{self.path}' has no inputs named {unknown}.")
        missing = sorted(set(self.inputs) - set(feeds))
        if missing:
            raise UserError(f"step graph '{self.path}' needs the inputs {missing}.")
        batch = feeds["input_ids"].shape[0] if feeds["input_ids"].ndim == 2 else -1
        if batch < 1 or batch > self.max_batch:
            raise UserError(
                f"input_ids has shape {list(feeds['input_ids'].shape)}: expected [B, S] with 1 <= B <= "
                f"max_batch {self.max_batch} of step graph '{self.path}'."
            )
        for name, value in feeds.items():
            want = np.dtype(ORT_TYPES.get(self.inputs[name].type, np.float32))
            if value.dtype != want:
                raise UserError(
                    f"input '{name}' has dtype {value.dtype}, step graph '{self.path}' expects {want} "
                    "(a cache from another engine or precision?)."
                )
        for name in self.cache_inputs:
            shape = tuple(feeds[name].shape)
            if shape != (batch, *self.cache_dims):
                raise UserError(
                    f"cache input '{name}' has shape {list(shape)}, step graph '{self.path}' expects "
                    f"{[batch, *self.cache_dims]} ([B, kv_heads, max_seq, head_dim]); was it made for "
                    "another engine?"
                )
        seq = feeds["input_ids"].shape[1]
        past, new = feeds["past_lens"], feeds["new_lens"]
        if (
            feeds["position_ids"].shape != feeds["input_ids"].shape
            or past.shape != (batch,)
            or new.shape != (batch,)
        ):
            raise UserError("position_ids must match input_ids [B, S]; past_lens and new_lens must be [B].")
        if (new < 1).any() or (new > seq).any() or (past < 0).any() or (past + seq > self.max_seq).any():
            raise UserError(
                f"lengths out of range: need 1 <= new_lens <= S={seq}, past_lens >= 0 and past_lens + S <= "
                f"max_seq {self.max_seq}; got past_lens {past.tolist()}, new_lens {new.tolist()}."
            )

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check the feeds, run one step, return the outputs by name."""
        self.check_feeds(feeds)
        return dict(zip(self.output_names, self.session.run(None, feeds)))


class OrtSlotPoolExecutor:
    """Runs StepBatch batches through a slot-layout step graph: the StepExecutor protocol over a pool of
    `num_blocks` slot-cache rows (default: the graph's max_batch), each one block of max_seq tokens.

    A step runs the graph once per distinct new-token count among its sequences (decode rows together,
    each prompt-chunk length together), so no row is padded: the graph writes a row's new K/V at its
    past length, which could not hold a padded run near max_seq. The rows of a run are gathered from
    the pool and written back after it.
    """

    def __init__(
        self,
        path: str | Path,
        num_blocks: int | None = None,
        *,
        max_model_len: int | None = None,
        generation: dict[str, Any] | None = None,
    ) -> None:
        g = generation if generation is not None else read_generation(path)
        if g.get("cache", {}).get("layout") == "paged":
            raise UserError(f"step graph '{path}' has a paged cache; serve it with OrtPagedExecutor.")
        self.graph = OrtStepExecutor(path, g)
        self.generation = g
        # a block is a cache row of max_seq tokens: each running sequence holds one
        max_seq = self.graph.max_seq
        why = "the step graph's max_seq, the length of its cache rows"
        max_model_len = check_max_model_len(max_model_len, max_seq, why)
        num_blocks = self.graph.max_batch if num_blocks is None else num_blocks
        if not is_int(num_blocks) or num_blocks < 1:
            raise UserError(
                f"num_blocks must be an integer >= 1 (slot-cache rows: one per running sequence), got "
                f"{num_blocks!r}."
            )
        self.max_batch, self.max_prefill = self.graph.max_batch, int(g["max_prefill"])
        self.all_logits = bool(g.get("all_logits"))
        shape = (int(num_blocks), *self.graph.cache_dims)
        self.pools = allocate_pools(self.graph.cache_inputs, shape, self.graph.cache_dtype, int(num_blocks))
        self._outputs = {n: n.replace("_cache.", "_cache_out.") for n in self.graph.cache_inputs}
        dtype = np.dtype(self.graph.cache_dtype)
        self.facts = ExecutorFacts.of_step_graph(
            g,
            num_blocks=int(num_blocks),
            block_size=max_seq,
            max_model_len=max_model_len,
            kv_dtype=dtype.name,
            kv_element_bytes=dtype.itemsize,
            kv_pool_bytes=sum(p.nbytes for p in self.pools.values()),
        )

    def step(self, batch: StepBatch) -> np.ndarray:
        """Copy blocks, run the graph on each run of equal new-token counts; logits [N, vocab] float32."""
        for src, dst in batch.block_copies.tolist():
            for pool in self.pools.values():
                pool[dst] = pool[src]
        where = f"step graph '{self.graph.path}'"
        seq, col = logits_rows(batch, self.all_logits, where)
        out = np.empty((len(seq), self.facts.vocab_size), np.float32)
        qlens = batch.query_lens
        rows = batch.block_tables[:, 0].astype(np.int64)
        for n in np.unique(qlens):
            group = np.flatnonzero(qlens == n)
            feeds = padded_feeds(batch, 0, group)  # equal lengths: nothing is padded
            del feeds["block_tables"], feeds["slot_mapping"]
            mine = rows[group]
            res = self.graph.run(feeds | {name: pool[mine] for name, pool in self.pools.items()})
            for name, pool in self.pools.items():
                pool[mine] = res[self._outputs[name]]
            picked = np.flatnonzero(np.isin(seq, group))
            local = np.searchsorted(group, seq[picked])
            logits = res["logits"]
            out[picked] = logits[local] if col is None else logits[local, col[picked]]
        return out
