"""Llama 4's text model (llm.models.llama4): chunked attention on the torch executor's paged path through
prompt chunks and decode steps that cross chunk boundaries, its NoPE layers' query scaling against
transformers' own formula, the paths that refuse its chunks (tensor parallelism, the fused layers) by
name, and its static decode steps on the fused MoE reading nothing back to the host. (The fused MoE
against grouped: test_moe_fused; the step graph: test_moe's step-graph suite and test_decoder_paged; the
chunk rule beside the windows: test_windows; the config draws: test_config_variants; the Triton kernels in
lockstep with the torch reference: test_triton_executor.)"""

from __future__ import annotations

import pytest
import torch

from tests.llm.tiny_models import hf_greedy, tiny_model
from trtforge.errors import UserError
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.fused_layers import fusable
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import adapter_for

NEW_TOKENS = 12


# No chunks: every layer full. (transformers 5.17 still marks the RoPE layers chunked where
# attention_chunk_size is None, a config the adapter refuses: its forward cannot build their mask.)
UNCHUNKED = {"attention_chunk_size": None, "layer_types": ["full_attention"] * 3}


def test_the_tiny_model_chunks_its_rope_layers_and_scales_its_nope_queries():
    """Chunks of 8 on the RoPE layers, the NoPE layer full with Llama 4's query scaling in the spec."""
    spec = adapter_for(tiny_model("llama4_text")).spec
    assert spec.attention_chunks == [8, None, 8] and spec.sliding_windows == [None] * 3
    assert spec.rotary["interleaved"] and spec.mlp_kinds == ["dense", "moe", "moe"]
    assert spec.rotary["query_scaling"] == {
        "form": "llama4",
        "beta": 0.5,
        "period": 4,
        "nope_only": True,
        "float32": False,
        "promoted": True,
        "from_one": True,
    }
    assert adapter_for(tiny_model("llama4_text", **UNCHUNKED)).spec.attention_chunks == []


def test_query_scaling_is_transformers_attention_temperature_tuning():
    """``Llama4TextAttention``'s attn_scales, element for element (float32, from the position + 1)."""
    adapter = adapter_for(tiny_model("llama4_text"))
    positions = torch.arange(0, 5000, 7)
    want = torch.log1p(torch.floor((positions.float() + 1.0) / 4)) * 0.5 + 1.0
    got = adapter.query_scaling.factor(positions, torch.float64)
    assert got.dtype == torch.float32 and torch.equal(got[..., 0], want)


@pytest.mark.parametrize("prompt_len", [3, 9, 17])
def test_greedy_decode_across_chunk_boundaries_matches_transformers(prompt_len):
    """The prompt in two chunks (the first ending inside an attention chunk), then one token a step: every
    step's logits are transformers' generate() logits (float64 model), its tokens the same."""
    model = tiny_model("llama4_text", seed=1).double()
    prompt = torch.randint(0, 300, (prompt_len,), generator=torch.Generator().manual_seed(5)).tolist()
    want, want_logits = hf_greedy(model, prompt, NEW_TOKENS)
    assert len(set(want)) > 3, f"degenerate reference output {want}"
    ex = TorchExecutor(model, num_blocks=16, block_size=4)
    table = list(range(16))
    cut = max(1, prompt_len - 5)
    steps = [(prompt[:cut], 0), (prompt[cut:], cut)] if cut < prompt_len else [(prompt, 0)]
    for ids, start in steps:
        batch = StepBatch.build(
            ["s"], [ids], [start], [table], [list(range(start, start + len(ids)))], [True]
        )
        out = ex.step(batch)[0]
    got = [int(out.argmax())]
    torch.testing.assert_close(out, want_logits[0], rtol=1e-5, atol=1e-5)
    for t in range(1, NEW_TOKENS):
        p = prompt_len + t - 1
        out = ex.step(StepBatch.build(["s"], [[got[-1]]], [p], [table], [[p]], [True]))[0]
        torch.testing.assert_close(out, want_logits[t], rtol=1e-5, atol=1e-5)
        got.append(int(out.argmax()))
    assert got == want


def test_tensor_parallelism_refuses_its_chunks_and_its_attention_by_name():
    """With dense layers only (no MoE MLP to refuse it first): the chunked layers, then (no chunk) the q/k
    norms and scaled NoPE queries."""
    dense = adapter_for(tiny_model("llama4_text", moe_layers=[]))
    assert not dense.has_moe
    with pytest.raises(UserError, match=r"chunked attention layers \(attention_chunk_size=8\)"):
        dense.check_shard(2)
    unchunked = adapter_for(tiny_model("llama4_text", moe_layers=[], **UNCHUNKED))
    with pytest.raises(UserError, match="tensor parallelism is not supported for llama4_text .*use_qk_norm"):
        unchunked.check_shard(2)


def test_the_fused_layers_refuse_chunked_layers():
    """fusable() names chunked layers (a Llama-style adapter given a chunk: no Llama-style family has one)."""
    adapter = adapter_for(tiny_model("llama"))
    assert fusable(adapter) is None
    adapter.chunks = [8, None]
    assert fusable(adapter).startswith("chunked attention layers (attention_chunk_size")


def test_static_decode_steps_on_the_fused_moe_read_nothing_back(monkeypatch):
    """Llama 4's decode steps on the static path with its MoE blocks fused (forced on the CPU: the
    interpreter), past an attention chunk boundary: every layer (chunked and NoPE attention, the scaled
    queries, the router, the input-scaled experts, the shared expert) reads no device value on the host,
    so a CUDA graph can hold them; the executor refuses no graph."""
    from tests._devices import skip_unless_runs_here
    from tests._host_sync import no_host_reads

    skip_unless_runs_here("cpu")  # the kernels take CPU tensors in the interpreter only
    ex = TorchExecutor(tiny_model("llama4_text", seed=1), num_blocks=16, block_size=4, static_decode=True)
    assert ex.cuda_graphs_refusal is None
    ex._adapter.moe_formulation = "fused"
    table, prompt = list(range(16)), list(range(3, 14))
    ex.step(StepBatch.build(["s"], [prompt], [0], [table], [list(range(11))], [True]))
    forward = ex._forward

    def guarded(*args, **kwargs):
        with no_host_reads(monkeypatch):
            return forward(*args, **kwargs)

    monkeypatch.setattr(ex, "_forward", guarded)
    for p in range(11, 18):
        ex.step(StepBatch.build(["s"], [[5]], [p], [table], [[p]], [True]))
    assert ex._static, "the decode steps did not take the static path"
