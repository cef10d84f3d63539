"""One set of executor facts: the torch executor over a model and the ONNX Runtime executor over that
model's paged step graph report the same facts, each built once, frozen, and what the scheduler and
the service read."""

from __future__ import annotations

import dataclasses

import onnx
import pytest

from tests.llm.tiny_models import tiny_model
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors import OrtPagedExecutor
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sched.scheduler import Scheduler
from trtforge.llm.service import ServingLLM

BLOCK, BLOCKS, MAX_SEQ = 4, 12, 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(torch executor, ONNX Runtime executor) of one tiny Qwen3 with two EOS ids and a window."""
    model = tiny_model("qwen3", sliding_window=5, use_sliding_window=True, max_window_layers=1)
    model.config.eos_token_id = 7
    model.generation_config.eos_token_id = [9, 7]
    d = tmp_path_factory.mktemp("facts")
    result = export_step(
        model,
        max_seq=MAX_SEQ,
        max_batch=2,
        exporter="legacy",
        workdir=d,
        cache_layout="paged",
        block_size=BLOCK,
    )
    onnx.save(result.model, str(d / "step.onnx"))
    ort = OrtPagedExecutor(d / "step.onnx", BLOCKS)
    return TorchExecutor(model, BLOCKS, BLOCK, max_model_len=MAX_SEQ), ort


def test_torch_and_onnxruntime_executors_report_the_same_facts(pair):
    torch_facts, ort_facts = (ex.facts for ex in pair)
    assert torch_facts == ort_facts
    f = torch_facts
    assert (f.num_blocks, f.block_size, f.vocab_size, f.max_model_len) == (BLOCKS, BLOCK, 300, MAX_SEQ)
    assert f.eos_token_ids == (7, 9) and f.eos_token_id == 7
    assert (f.num_layers, f.num_kv_heads, f.head_dim, f.kv_dtype, f.kv_element_bytes) == (
        2,
        2,
        16,
        "float32",
        4,
    )
    assert f.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    # each executor keeps one scratch block past the blocks it hands out
    assert f.kv_pool_bytes == (BLOCKS + 1) * BLOCK * f.kv_bytes_per_token
    assert not f.kv_depends_on_prompt_len


def test_facts_are_frozen_and_read_by_the_scheduler_and_the_service(pair):
    ex = pair[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.facts.num_blocks = 1  # type: ignore[misc]
    sched = Scheduler(ex)
    assert sched.facts is ex.facts
    assert sched.memory_stats().total_blocks == ex.facts.num_blocks
    assert sched.max_model_len == ex.facts.max_model_len
    with ServingLLM(ex) as served:
        assert served.eos_token_ids == [7, 9]


def test_dynamic_rotary_facts_say_the_kv_depends_on_the_prompt_length():
    model = tiny_model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    facts = TorchExecutor(model, 8, BLOCK).facts
    assert facts.kv_depends_on_prompt_len
    assert facts.max_model_len == 2 * model.config.max_position_embeddings
