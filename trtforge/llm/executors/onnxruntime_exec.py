"""The ONNX Runtime step executor (CPU, exact: graph optimizations off) over a paged step graph.

:class:`OrtPagedExecutor` is a :class:`trtforge.llm.executors.base.StepExecutor`: it pads each ragged
:class:`StepBatch` into the graph's [B, S] feeds, does the block copies, owns the block pools between
steps and serves :class:`trtforge.llm.engine.LLMEngine` like the torch executor.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.errors import UserError, is_int
from trtforge.llm.executors.base import ExecutorFacts, PoolAllocationError, StepBatch, check_max_model_len
from trtforge.llm.executors.paged_feeds import logits_rows, padded_feeds

ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def read_generation(path: str | Path) -> dict[str, Any]:
    """The generation metadata of a step graph file; UserError if it is missing or not ONNX. The file is
    checked as every model reader checks it (:func:`~trtforge._fileio.check_input_file`), which first
    settles what a writer killed while committing the graph and its external data file left: ONNX
    Runtime then reads the whole old pair or the whole new one, never the old graph over the new data
    file's weights."""
    import onnx

    from trtforge._fileio import check_input_file
    from trtforge.llm.contract import generation_metadata

    p = check_input_file(path, "step graph", sweep=True)
    try:
        proto = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # any parse failure: the user's file is bad
        raise UserError(f"'{p}' is not a readable ONNX file: {e}.") from e
    return generation_metadata(proto, str(p))


def step_session(path: Path, generation: dict[str, Any]) -> Any:
    """The exact ONNX Runtime session every ORT step executor runs `path` in. A BF16 step graph is refused
    first, by name: ORT's CPU provider has no bfloat16 kernels, and its own NOT_IMPLEMENTED error names a
    node, not the graph's precision or what would run it."""
    from trtforge.numerics.sessions import exact_session

    if generation.get("cache", {}).get("dtype") == "bfloat16":
        raise UserError(
            f"step graph '{path}' is BF16 (compiled with --precision bf16), and ONNX Runtime's CPU "
            "execution cannot run BF16 graphs: it has no bfloat16 kernels. Compile an FP16 or FP32 step "
            "graph for the onnxruntime executor (trtforge compile MODEL --generate --precision fp16 "
            "--save-onnx step.onnx), run the model's save_pretrained directory on the torch executor "
            "(--executor torch, trtforge.llm.from_pretrained), or build a BF16 TensorRT step engine "
            "(trtforge compile MODEL --generate --precision bf16 -o step.engine) and load it with "
            "executor='tensorrt'."
        )
    return exact_session(path)


class OrtPagedExecutor:
    """Runs StepBatch batches through a paged step graph in exact ONNX Runtime, owning its block pools.

    The pools hold ``num_blocks + 1`` blocks per layer: the last one is scratch, written by the padded
    positions of short rows and never read. Default `num_blocks`: room for max_batch full sequences.
    """

    def __init__(
        self,
        path: str | Path,
        num_blocks: int | None = None,
        *,
        max_model_len: int | None = None,
        generation: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        g = generation if generation is not None else read_generation(self.path)
        cache = g.get("cache", {})
        if cache.get("layout") != "paged":
            raise UserError(
                f"step graph '{self.path}' has a {cache.get('layout')!r} cache; the paged executor needs "
                "one exported with cache_layout='paged'."
            )
        self.generation = g
        self._block_size = int(cache["block_size"])
        why = "the step graph's max_seq, which its positions were checked against"
        self._max_model_len = check_max_model_len(max_model_len, int(g["max_seq"]), why)
        if num_blocks is None:
            num_blocks = int(g["max_batch"]) * -(-int(g["max_seq"]) // self._block_size)
        if not is_int(num_blocks) or num_blocks < 1:
            raise UserError(f"num_blocks must be an integer >= 1, got {num_blocks!r}.")
        self._num_blocks = int(num_blocks)
        self.session = step_session(self.path, g)
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.pool_names = list(cache["inputs"])
        missing = [n for n in ("block_tables", "slot_mapping", *self.pool_names) if n not in inputs]
        if missing:
            raise UserError(f"step graph '{self.path}' lacks the inputs {missing} its metadata names.")
        self.pool_dtype = np.dtype(ORT_TYPES[inputs[self.pool_names[0]].type])
        shape = (self._num_blocks + 1, self._block_size, int(g["num_kv_heads"]), int(g["head_dim"]))
        self.pools = allocate_pools(self.pool_names, shape, self.pool_dtype, self._num_blocks)
        self._pool_outputs = dict(zip(cache["outputs"], self.pool_names))
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.all_logits = bool(g.get("all_logits"))
        self.facts = ExecutorFacts.of_step_graph(
            g,
            num_blocks=self._num_blocks,
            max_model_len=self._max_model_len,
            kv_dtype=self.pool_dtype.name,
            kv_element_bytes=self.pool_dtype.itemsize,
            kv_pool_bytes=sum(p.nbytes for p in self.pools.values()),
        )

    def feeds(self, batch: StepBatch) -> dict[str, np.ndarray]:
        """The graph's padded [B, S] feeds for a ragged batch (pools excluded; shared with TensorRT)."""
        return padded_feeds(batch, self._num_blocks * self._block_size)

    def step(self, batch: StepBatch) -> np.ndarray:
        """Copy blocks, run the graph on the padded batch, keep the new pools; logits [N, vocab] float32."""
        for src, dst in batch.block_copies.tolist():
            for pool in self.pools.values():
                pool[dst] = pool[src]
        feeds = self.feeds(batch)
        outs = dict(zip(self.output_names, self.session.run(None, {**feeds, **self.pools})))
        for out_name, in_name in self._pool_outputs.items():
            self.pools[in_name] = outs[out_name]
        logits = outs["logits"]
        seq, col = logits_rows(batch, logits.ndim == 3, f"step graph '{self.path}'")
        return logits[seq] if col is None else logits[seq, col]


def allocate_pools(
    names: list[str], shape: tuple[int, ...], dtype: np.dtype, num_blocks: int
) -> dict[str, np.ndarray]:
    """Zeroed KV pools in host memory; UserError naming num_blocks when they cannot fit this machine's
    RAM (numpy's zeros are lazily committed, so an oversized pool would otherwise fail mid-generation)."""
    total = len(names) * math.prod(shape) * np.dtype(dtype).itemsize  # (Python ints: 10**30 blocks too)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (not POSIX): rely on the allocator
        ram = None
    need = f"{total / 2**30:.3g} GiB of KV pools ({len(names)} pools of {list(shape)} {np.dtype(dtype).name})"
    if ram is not None and total > ram:
        detail = f"{need}, more than this machine's {ram / 2**30:.3g} GiB of RAM"
        raise PoolAllocationError(num_blocks, detail, f"num_blocks={num_blocks} needs {detail}; lower it.")
    try:
        return {n: np.zeros(shape, dtype) for n in names}
    except (MemoryError, ValueError, OverflowError) as e:  # (numpy: "array is too big" past its sizes)
        detail = f"{need}, which could not be allocated: {type(e).__name__}: {e}"
        raise PoolAllocationError(
            num_blocks, detail, f"num_blocks={num_blocks} needs {detail}; lower it."
        ) from e
