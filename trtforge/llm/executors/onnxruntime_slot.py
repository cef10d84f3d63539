"""The slot-layout step executor: runs raw feeds through a step graph in exact ONNX Runtime, checking
them against the graph first (the batched greedy loop of :mod:`trtforge.llm.api`; paged graphs are
served by :mod:`.onnxruntime_exec`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trtforge.errors import UserError

ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


class OrtStepExecutor:
    """One exact ONNX Runtime session over a step graph."""

    def __init__(self, path: str | Path, generation: dict[str, Any]):
        from trtforge.numerics.sessions import exact_session

        self.path = Path(path)
        self.generation = generation
        self.session = exact_session(self.path)
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
