"""The public surface: trtforge.llm.load on paged and slot step graphs, from_pretrained (torch)."""

from __future__ import annotations

import onnx
import pytest

import trtforge.llm
from tests.llm.tiny_models import hf_greedy, prompts, tiny_model
from trtforge.errors import UserError
from trtforge.llm import SamplingParams, ServingLLM
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


def test_load_keeps_slot_graphs_on_the_greedy_loop(tmp_path):
    path = _save(tmp_path, "slot.onnx")
    llm = trtforge.llm.load(path)
    assert isinstance(llm, trtforge.llm.LLM)
    with pytest.raises(UserError, match="slot-layout"):
        trtforge.llm.load(path, num_blocks=8)
    with pytest.raises(UserError, match="not available"):
        trtforge.llm.load(path, executor="tvm")
    with pytest.raises(UserError, match="tensorrt executor runs a step engine"):
        trtforge.llm.load(path, executor="tensorrt")
    with pytest.raises(UserError, match="is a directory.*executor='torch'"):
        trtforge.llm.load(tmp_path)


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
