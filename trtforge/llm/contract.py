"""The step graph's contract, shared by the exporter (``llm.compile``) and every executor: input and
output names, the two optimization profiles, and the generation metadata a graph or engine carries.

Pure Python (onnx only for the metadata helpers, imported lazily). One place, so the graph that
``llm.compile`` writes and the feeds an executor builds cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtforge._fileio import json_text
from trtforge.core.manifest import ShapeRange
from trtforge.core.onnx_io import GENERATION_KEY, parse_generation
from trtforge.errors import UserError

if TYPE_CHECKING:
    import onnx

METADATA_KEY = GENERATION_KEY
# tokens a KV block holds unless told otherwise: a paged step graph's pools (compile --generate
# --cache-layout paged) and the torch executor's alike
DEFAULT_BLOCK_SIZE = 16

_STEP_INPUTS = ["input_ids", "position_ids", "past_lens", "new_lens"]


def _with_layers(head: list[str], key: str, value: str, num_layers: int) -> list[str]:
    """`head`, then each layer's `key`.i and `value`.i."""
    return head + [name for i in range(num_layers) for name in (f"{key}.{i}", f"{value}.{i}")]


def input_names(num_layers: int) -> list[str]:
    """Step graph input names in order."""
    return _with_layers(_STEP_INPUTS, "key_cache", "value_cache", num_layers)


def output_names(num_layers: int) -> list[str]:
    """Step graph output names in order: logits, then each updated cache."""
    return _with_layers(["logits"], "key_cache_out", "value_cache_out", num_layers)


def paged_input_names(num_layers: int) -> list[str]:
    """Paged step graph input names in order."""
    return _with_layers([*_STEP_INPUTS, "block_tables", "slot_mapping"], "key_pool", "value_pool", num_layers)


def paged_output_names(num_layers: int) -> list[str]:
    """Paged step graph output names in order: logits, then each updated pool."""
    return _with_layers(["logits"], "key_pool_out", "value_pool_out", num_layers)


PREFILL, DECODE = 0, 1


def step_profiles(
    generation: dict[str, Any], *, fixed_batch_prefill: bool = False
) -> list[dict[str, ShapeRange]]:
    """The prefill and decode profiles of a step graph, from its generation section.

    A max_batch 1 graph's prefill profile still takes up to 2 rows (opt 1; the executors feed 1):
    TensorRT-RTX 1.7.1 fails to build a prefill profile whose batch is fixed at 1 for prompts of up to
    32 tokens (Myelin: "Graph contains more than one op named ..._iota"). `fixed_batch_prefill` gives
    the ranges of the engines built before (batch max 1), which the TensorRT executor still reads."""
    b, p = int(generation["max_batch"]), int(generation["max_prefill"])
    cache = [int(generation["num_kv_heads"]), int(generation["max_seq"]), int(generation["head_dim"])]

    def profile(seq_max: int, seq_opt: int, b_max: int) -> dict[str, ShapeRange]:
        out = {
            "input_ids": ShapeRange([1, 1], [b, seq_opt], [b_max, seq_max]),
            "position_ids": ShapeRange([1, 1], [b, seq_opt], [b_max, seq_max]),
            "past_lens": ShapeRange([1], [b], [b_max]),
            "new_lens": ShapeRange([1], [b], [b_max]),
        }
        if generation["cache"]["layout"] == "paged":
            return out | _paged_ranges(generation, b, b_max, seq_max, seq_opt)
        for name in generation["cache"]["inputs"]:
            out[name] = ShapeRange([1, *cache], [b, *cache], [b_max, *cache])
        return out

    return [profile(p, p, b if fixed_batch_prefill else max(b, 2)), profile(1, 1, b)]


def _paged_ranges(
    generation: dict[str, Any], b: int, b_max: int, seq_max: int, seq_opt: int
) -> dict[str, ShapeRange]:
    """Block tables up to max_seq / block_size wide, pools of 1 .. cache.num_blocks blocks."""
    cache = generation["cache"]
    width = -(-int(generation["max_seq"]) // int(cache["block_size"]))
    pool = [int(d) for d in cache["shape"][1:]]
    n = int(cache["num_blocks"])
    out = {
        "block_tables": ShapeRange([1, 1], [b, width], [b_max, width]),
        "slot_mapping": ShapeRange([1, 1], [b, seq_opt], [b_max, seq_max]),
    }
    for name in cache["inputs"]:
        out[name] = ShapeRange([1, *pool], [n, *pool], [n, *pool])
    return out


def input_vocab_size(generation: dict[str, Any]) -> int:
    """The token ids a step graph's embedding takes (its metadata's ``input_vocab_size``), wider than the
    logits' ``vocab_size`` where the LM head is pruned to a prefix of the vocabulary; graphs written before
    the key existed have one vocabulary."""
    vocab = int(generation["vocab_size"])
    ids = int(generation.get("input_vocab_size") or vocab)
    if ids < vocab:
        raise UserError(
            f"the step graph's {METADATA_KEY} metadata gives input_vocab_size {ids} below its vocab_size "
            f"{vocab} (the logits' width); expected an embedding that takes every id the LM head emits. "
            "Export the graph again with trtforge compile --generate."
        )
    return ids


def set_generation_metadata(model: onnx.ModelProto, generation: dict[str, Any]) -> None:
    """Store the generation section in the graph's metadata_props (replacing an older one), as strict JSON
    (:func:`~trtforge._fileio.json_text`: an infinite attention sink or a NaN figure is null), as the
    manifest's copy of it is."""
    keep = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    model.metadata_props.add(key=METADATA_KEY, value=json_text(generation, indent=None))


def generation_metadata(model: onnx.ModelProto, where: str) -> dict[str, Any]:
    """Read the generation section of a step graph; UserError when it is not one, or when its metadata is
    not a JSON object (graphs written before it was strict JSON, holding NaN or Infinity, are still read)."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return parse_generation(prop.value, where)
    raise UserError(
        f"'{where}' is not a trtforge step graph (no '{METADATA_KEY}' metadata). Export one with "
        "`trtforge compile MODEL --generate --save-onnx step.onnx` or trtforge.llm.compile.export_step."
    )
