"""Serving-path weight quantization (trtforge.llm.quant): the rewrite, AWQ's folding, the executor and
from_pretrained with quantization, and the refusals.

Tiny random Llamas with hidden 128 (one INT4 group per row) run on the CPU's float32 reference path;
the trained 21M model (../shared/models) checks from_pretrained end to end where it is present. The
CUDA paths (fused GEMVs, ``torch._scaled_mm``) run under ``-m gpu``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.quant import QuantLinear, model_quantization, quantize_model

MODELS = Path(__file__).resolve().parents[2] / ".." / "shared" / "models"
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4}


def _llama(**over):
    """Weights of a trained model's scale (initializer_range 0.02), so errors do not snowball."""
    return tiny_model("llama", **(SHAPE | {"initializer_range": 0.02} | over)).float().eval()


def _prompts(n: int = 4, length: int = 24, vocab: int = 300) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


@pytest.mark.parametrize("method", ["fp8", "int4-rtn", "int4-awq"])
def test_quantize_model_replaces_the_projections_only(method):
    model = _llama()
    ref = copy.deepcopy(model)
    record = quantize_model(model, method, _prompts() if method == "int4-awq" else None)
    assert record.projections == 2 * 7 and model_quantization(model) == method
    assert record.bytes_after < record.bytes_before / (3 if method == "fp8" else 6)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, QuantLinear) and isinstance(layer.mlp.down_proj, QuantLinear)
    assert type(model.lm_head) is torch.nn.Linear and torch.equal(model.lm_head.weight, ref.lm_head.weight)
    ids = torch.tensor(_prompts(2, 16))
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    rel = (got - want).norm() / want.norm()
    assert 0 < rel < (0.1 if method == "fp8" else 0.3), rel
    if method == "int4-awq":
        assert set(record.alphas) == {
            f"layers.{i}.{g}" for i in (0, 1) for g in ("qkv", "o", "gate_up", "down")
        }


def test_awq_folding_keeps_the_float_model():
    """The searched scales multiply the weights' columns and divide the previous op: before any
    rounding the model computes the same logits (v->o folds where shapes match, up->down always)."""
    from trtforge.llm.quant.apply import _awq_layer

    model = _llama()
    ids = torch.tensor(_prompts(2, 16))
    with torch.no_grad():
        before = model(ids).logits
        alphas: dict = {}
        for i, layer in enumerate(model.model.layers):
            _awq_layer(model, layer, i, [torch.tensor(p) for p in _prompts()], alphas)
        after = model(ids).logits
    assert any(a > 0 for a in alphas.values())  # some group is scaled
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)


def test_awq_beats_round_to_nearest_on_outlier_channels():
    """Activations with a few large channels (as real LLMs have): AWQ's output error is below RTN's."""
    from trtforge.kernels.qweight import quantize_int4
    from trtforge.llm.quant.awq import search_scales

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 256, generator=g)
    x[:, :4] *= 30.0
    w = torch.randn(64, 256, generator=g) / 16
    s, alpha, ratio = search_scales(x, [w])
    rtn = (x @ quantize_int4(w).dequantize().t() - x @ w.t()).pow(2).mean()
    awq = (x @ (quantize_int4(w * s).dequantize() / s).t() - x @ w.t()).pow(2).mean()
    assert alpha > 0 and ratio < 0.8 and awq < 0.8 * rtn


def test_torch_executor_runs_the_quantized_model_and_records_it():
    """Greedy tokens through the engine equal transformers' greedy loop over the same quantized model."""
    from trtforge.llm import from_pretrained

    model = _llama()
    quantize_model(model, "int4-rtn")
    prompt = _prompts(1, 9)[0]
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
    with from_pretrained(model, num_blocks=16) as llm:
        assert llm.executor.facts.quantization == "int4-rtn"
        got = llm.generate([prompt], max_new_tokens=8, stop_at_eos=False)[0]
    assert got == hf[0, len(prompt) :].tolist()


def test_refusals_name_what_is_unsupported():
    with pytest.raises(UserError, match="'int3' is not supported; choose one of fp8, int4-awq, int4-rtn"):
        quantize_model(_llama(), "int3")
    with pytest.raises(UserError, match="gpt2 family .* has no quantized path"):
        quantize_model(tiny_model("gpt2"), "fp8")
    with pytest.raises(UserError, match="needs calibration prompts"):
        quantize_model(_llama(), "int4-awq")
    with pytest.raises(UserError, match="not a multiple of the INT4 group size 128"):
        quantize_model(tiny_model("llama").float(), "int4-rtn")  # hidden 64
    from trtforge.llm import from_pretrained

    with pytest.raises(UserError, match="quantization 'bf8' is not supported"):
        from_pretrained(_llama(), quantization="bf8", num_blocks=4)


def test_fp8_refused_on_a_gpu_without_fp8_tensor_cores(monkeypatch):
    from trtforge.llm.quant import apply

    model = _llama()
    fake = torch.nn.Parameter(torch.zeros(1))
    monkeypatch.setattr(type(fake), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(UserError, match="A100-SXM4-80GB has 8.0"):
        apply._check_device(model, "fp8")


@pytest.mark.skipif(
    not (MODELS / "code-llama-21m").is_dir(), reason="../shared/models/code-llama-21m is absent"
)
def test_from_pretrained_awq_on_the_trained_model():
    from trtforge.llm import from_pretrained

    path = MODELS / "code-llama-21m"
    calib = [list(range(10, 138))]
    with from_pretrained(str(path), quantization="int4-awq", calib_prompts=calib, num_blocks=8) as llm:
        assert llm.executor.facts.quantization == "int4-awq"
        out = llm.generate([[0, 400, 401, 402]], max_new_tokens=4, stop_at_eos=False)[0]
    assert len(out) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fp8", "int4-rtn"])
def test_fused_cuda_path_matches_the_float32_reference(method):
    """BF16 on the GPU, fused layers (GEMVs at decode, _scaled_mm / dequantize+GEMM at prefill): greedy
    tokens of the quantized model against transformers' loop over the same quantized model on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if method == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9+")
    from trtforge.llm import from_pretrained

    model = _llama(num_key_value_heads=2)
    cpu = copy.deepcopy(model)
    quantize_model(cpu, method)
    prompt = _prompts(1, 9)[0]
    with torch.no_grad():
        want = cpu(torch.tensor([prompt])).logits[0, -1]
    with from_pretrained(
        model, quantization=method, device="cuda", dtype=torch.bfloat16, num_blocks=16
    ) as llm:
        assert llm.executor.fused_refusal is None and llm.executor.facts.quantization == method
        got = llm.completions([prompt])[0]
        assert len(got.token_ids) >= 1
        ex = llm.executor
    del ex
    # the first greedy token: BF16 rounding may flip a near tie, so compare the reference's margin
    top2 = want.topk(2).values
    if top2[0] - top2[1] > 0.05 * want.abs().max():
        assert got.token_ids[0] == int(want.argmax())
