"""INT8 SmoothQuant W8A8 for step graphs, calibrated on prompts through trtforge.calibration.

Each prompt becomes one prefill sample (past_lens 0, zero caches), so the statistics are those of
the model's real activations on real tokens; the calibration stage then smooths and inserts Q/DQ
around MatMul/Gemm. The cache write and attention stay in float (FP16 after the precision stage).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from trtforge.errors import UserError
from trtforge.llm import contract

SMOOTHQUANT_ALPHA = 0.8


def prompt_dataset(
    model: onnx.ModelProto, generation: dict[str, Any], prompts: Sequence[Sequence[int]]
) -> Any:
    """A CalibrationDataset of prefill feeds, one sample per prompt (each 1..max_prefill tokens)."""
    from trtforge.calibration.data import CalibrationDataset, input_specs_from_model

    if not prompts:
        raise UserError("--precision int8 with --generate needs calibration prompts (lists of token ids).")
    vocab = contract.input_vocab_size(generation)  # (the embedding's ids)
    limit = int(generation["max_prefill"])
    check_prompts(prompts, limit, vocab)
    cache = (1, int(generation["num_kv_heads"]), int(generation["max_seq"]), int(generation["head_dim"]))
    chunks = []
    # one zeroed KV cache per input, shared by every prompt's sample (batches stack copies of their rows):
    # a cache of its own per prompt was max_seq x KV heads x head_dim x 2 x layers floats each, ~134 MB
    # for a 16-layer model with 8 KV heads at 2,048, GBs over a few dozen prompts
    empty = {name: np.zeros(cache, np.float32) for name in generation["cache"]["inputs"]}
    for p in prompts:
        ids = [int(t) for t in p]
        chunk = {  # the leading axis is the sample axis (the batch rows the dataset stacks)
            "input_ids": np.array([ids], np.int64),
            "position_ids": np.arange(len(ids), dtype=np.int64)[None],
            "past_lens": np.zeros(1, np.int64),
            "new_lens": np.array([len(ids)], np.int64),
        }
        chunk.update(empty)
        chunks.append(chunk)
    return CalibrationDataset(input_specs_from_model(model), source="prompts", batch_size=1, chunks=chunks)


def check_prompts(prompts: Sequence[Sequence[int]], limit: int, vocab: int) -> None:
    """UserError naming the prompt (and --calib-data, --max-prefill) unless each holds 1..`limit` ids
    in 0..`vocab` - 1: each is one prefill of the step graph. `compile --generate` calls it before the
    export, which it preceded by a minute at a real model, its message naming neither option."""
    for i, p in enumerate(prompts):
        ids = [int(t) for t in p]
        outside = [t for t in ids if not 0 <= t < vocab]
        if outside:
            raise UserError(
                f"calibration prompt {i} (--calib-data, blank lines skipped) holds token ids {outside[:5]} "
                f"outside the model's vocabulary 0..{vocab - 1}; give ids of the model's own tokenizer."
            )
        if not 1 <= len(ids) <= limit:
            raise UserError(
                f"calibration prompt {i} (--calib-data, blank lines skipped) has {len(ids)} token ids; each "
                f"runs as one prefill of the step graph, which takes 1..{limit} (--max-prefill, default "
                "--max-seq): cut the prompt, or raise --max-prefill."
            )


def quantize_step(
    model: onnx.ModelProto,
    generation: dict[str, Any],
    prompts: Sequence[Sequence[int]],
    *,
    method: str = "max",
    smoothquant: float | None = SMOOTHQUANT_ALPHA,
    progress: bool = False,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """INT8 Q/DQ step graph (SmoothQuant W8A8) and the calibration record."""
    from trtforge.calibration.api import calibrate_model

    data = prompt_dataset(model, generation, prompts)
    out, record = calibrate_model(model, data, method=method, smoothquant=smoothquant, progress=progress)
    return out, record.to_dict()
