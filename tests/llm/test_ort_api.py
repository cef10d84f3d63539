"""The public surface: trtforge.llm.load on paged and slot step graphs, from_pretrained (torch); every
one is a ServingLLM."""

from __future__ import annotations

import onnx
import pytest

import trtforge
import trtforge.llm
import trtforge.llm.api
from tests.llm.tiny_models import hf_greedy, prompts, tiny_model
from trtforge.errors import UserError
from trtforge.llm import SamplingParams, SchedulerConfig, ServingLLM
from trtforge.llm.compile.export import export_step


def _save(tmp_path, name, **kw):
    r = export_step(tiny_model("llama"), max_seq=64, max_batch=4, exporter="legacy", workdir=tmp_path, **kw)
    path = tmp_path / name
    onnx.save(r.model, str(path))
    return path


@pytest.fixture(scope="module")
def paged_path(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("api"), "paged.onnx", cache_layout="paged", block_size=4)


def test_load_paged_graph_generates_greedy_and_sampled_and_streams(paged_path):
    model = tiny_model("llama")
    batch = prompts(model.config.vocab_size)
    with trtforge.llm.load(paged_path, num_blocks=48) as llm:
        assert isinstance(llm, ServingLLM)
        got = llm.generate(batch, max_new_tokens=10, stop_at_eos=False)
        assert got == [hf_greedy(model, p, 10)[0] for p in batch]
        assert llm.generate(batch, SamplingParams(max_tokens=10, ignore_eos=True)) == got
        sampled = SamplingParams(
            max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=7, ignore_eos=True
        )
        once = llm.generate(batch, sampled, stop_at_eos=False)
        assert once == llm.generate(batch, sampled, stop_at_eos=False), "seeded sampling must repeat"
        assert once != got
        assert list(llm.stream(batch[2], sampled, stop_at_eos=False)) == once[2]
        assert list(llm.stream(batch[1], max_new_tokens=5, stop_at_eos=False)) == got[1][:5]
        stats = llm.memory_stats()
        assert stats.total_blocks == 48 and stats.free_blocks == 48 and stats.block_size == 4
        with pytest.raises(UserError, match="non-empty"):
            llm.generate([])
        with pytest.raises(UserError, match="SamplingParams"):
            llm.generate(batch, max_new_tokens=0)


@pytest.fixture(scope="module")
def compiled_slot(tmp_path_factory):
    """The step graph `trtforge compile MODEL --generate --save-onnx step.onnx` writes by default (slot)."""
    path = tmp_path_factory.mktemp("slot") / "step.onnx"
    trtforge.compile(
        tiny_model("llama"),
        None,
        generate=True,
        build=False,
        save_onnx=path,
        max_seq=64,
        max_batch=4,
        max_prefill=32,
        exporter="legacy",
        progress=False,
    )
    assert trtforge.llm.api.load(path).generation["cache"]["layout"] == "slot"
    return path


def test_load_of_the_default_compiled_graph_generates_with_sampling_params(compiled_slot):
    """The user's call that crashed (TypeError: '<' not supported between 'SamplingParams' and 'int'):
    load() serves the slot graph like any other, through the engine."""
    model = tiny_model("llama")
    batch = prompts(model.config.vocab_size)
    with trtforge.llm.load(compiled_slot) as llm:
        assert isinstance(llm, ServingLLM)
        got = llm.generate(batch, SamplingParams(max_tokens=20))
        assert got == trtforge.llm.api.load(compiled_slot).generate(batch, 20), "the raw loop's tokens"
        free = llm.generate(batch, SamplingParams(max_tokens=20, ignore_eos=True))
        assert free == [hf_greedy(model, p, 20)[0] for p in batch]
        sampled = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=3, ignore_eos=True)
        once = llm.generate(batch, sampled)
        assert once == llm.generate(batch, sampled) and once != [f[:12] for f in free]
        assert llm.memory_stats().total_blocks == 4 and llm.memory_stats().block_size == 64


def test_the_slot_pool_admits_more_requests_than_rows_and_chunks_long_prompts(compiled_slot):
    """Ten requests over a pool of 2 rows (they queue), prompts longer than max_prefill (chunked), and
    a batch mixing decode rows with prompt chunks of other lengths (one graph run per length)."""
    model = tiny_model("llama")
    batch = prompts(model.config.vocab_size, lens=(40, 3, 9, 1, 17, 33, 2, 5, 12, 7), seed=4)
    config = SchedulerConfig(max_prefill_chunk=8, max_num_batched_tokens=16)
    with trtforge.llm.load(compiled_slot, num_blocks=2, config=config) as llm:
        got = llm.generate(batch, max_new_tokens=6, stop_at_eos=False)
        assert llm.memory_stats().free_blocks == 2
    assert got == [hf_greedy(model, p, 6)[0] for p in batch]


def test_slot_graph_limits_and_bad_loads_are_user_errors(compiled_slot, tmp_path):
    with pytest.raises(UserError, match=r"\{'max_num_seqs': 8\} exceeds the step graph's limits"):
        trtforge.llm.load(compiled_slot, config=SchedulerConfig(max_num_seqs=8))
    with pytest.raises(UserError, match="max_num_seqs 5 exceeds the step graph's max batch 4"):
        trtforge.llm.load(compiled_slot, max_num_seqs=5)
    with pytest.raises(UserError, match=r"max_model_len must be an integer in \[2, 64\]"):
        trtforge.llm.load(compiled_slot, max_model_len=65)
    with pytest.raises(UserError, match="num_blocks must be an integer >= 1"):
        trtforge.llm.load(compiled_slot, num_blocks=0)
    with pytest.raises(UserError, match="not available"):
        trtforge.llm.load(compiled_slot, executor="tvm")
    with pytest.raises(UserError, match="tensorrt executor runs a step engine"):
        trtforge.llm.load(compiled_slot, executor="tensorrt")
    with pytest.raises(UserError, match="is a directory.*executor='torch'"):
        trtforge.llm.load(tmp_path)
    with pytest.raises(UserError, match="max_new_tokens must be an integer >= 1.*trtforge.llm.load"):
        trtforge.llm.api.load(compiled_slot).generate([[1, 2]], SamplingParams(max_tokens=3))


def test_from_pretrained_serves_with_the_torch_executor(tmp_path):
    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "hf")
    batch = prompts(model.config.vocab_size)[:2]
    with trtforge.llm.load(tmp_path / "hf", executor="torch", num_blocks=32) as llm:
        assert llm.generate(batch, max_new_tokens=6, stop_at_eos=False) == [
            hf_greedy(model, p, 6)[0] for p in batch
        ]
        assert llm.memory_stats().free_blocks == 32
    with pytest.raises(UserError, match="config.json"):
        trtforge.llm.from_pretrained(tmp_path)
