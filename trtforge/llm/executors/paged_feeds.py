"""StepBatch -> the paged step graph's inputs, and logits rows back: one mapping for every graph executor.

The ONNX Runtime executor (:mod:`.onnxruntime_exec`) and the TensorRT executor (:mod:`.tensorrt_exec`)
run the same step graph, so they must pad a ragged :class:`~trtforge.llm.executors.base.StepBatch` the same
way: each sequence becomes one row of ``[B, S]`` (S = its longest new-token run), padded positions
write to a scratch slot that is never read, and the logits of a sequence's last real token are its row
(or its ``[row, column]`` in an all-positions graph). The contract is in
:mod:`trtforge.llm.compile` ("Paged contract").
"""

from __future__ import annotations

import numpy as np

from trtforge.errors import UserError
from trtforge.llm.executors.base import StepBatch

FEED_NAMES = ("input_ids", "position_ids", "past_lens", "new_lens", "block_tables", "slot_mapping")


def padded_feeds(
    batch: StepBatch, scratch_slot: int, rows: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The graph's padded feeds (pools excluded) for sequences `rows` of `batch` (default: all, in order).

    `scratch_slot` is the pool slot padded positions write to (the first slot of the scratch block).
    A subset keeps the block-table width of the whole batch, so every subset binds the same shape.
    """
    qsl = batch.query_start_loc.astype(np.int64)
    rows = np.arange(batch.num_seqs) if rows is None else np.asarray(rows, dtype=np.int64)
    starts, qlens = qsl[:-1][rows], np.diff(qsl)[rows]
    seq = max(int(qlens.max(initial=1)), 1)
    cols = np.arange(seq)[None, :]
    real = cols < qlens[:, None]
    flat = (starts[:, None] + cols)[real]
    ids = np.zeros((len(rows), seq), np.int64)
    pos = np.zeros((len(rows), seq), np.int64)
    slots = np.full((len(rows), seq), scratch_slot, np.int64)
    ids[real], pos[real], slots[real] = batch.input_ids[flat], batch.positions[flat], batch.slot_mapping[flat]
    return {
        "input_ids": ids,
        "position_ids": pos,
        "past_lens": batch.context_lens[rows].astype(np.int64) - qlens,
        "new_lens": qlens,
        "block_tables": np.ascontiguousarray(batch.block_tables[rows], dtype=np.int32),
        "slot_mapping": slots,
    }


def logits_rows(batch: StepBatch, all_logits: bool, where: str) -> tuple[np.ndarray, np.ndarray | None]:
    """For each of ``batch.logits_indices``: its sequence, and its column when the graph has all logits.

    A last-token graph (``all_logits`` False) returns one row per sequence, so only a sequence's last new
    token may be asked for; anything else is a UserError naming the graph (`where`).
    """
    qsl = batch.query_start_loc.astype(np.int64)
    idx = batch.logits_indices.astype(np.int64)
    seq = np.searchsorted(qsl, idx, side="right") - 1
    col = idx - qsl[seq]
    if all_logits:
        return seq, col
    if (col != np.diff(qsl)[seq] - 1).any():
        raise UserError(
            f"{where} returns each row's last-token logits only; logits were asked for other rows. "
            "Export it with all_logits=True."
        )
    return seq, None


__all__ = ["FEED_NAMES", "logits_rows", "padded_feeds"]
