"""The FP8 LM head (``lm_head_quantization="fp8"``): quantized and used at one token (weight-only) and
at a prefill (W8A8), with every projection method or none; a tied input embedding stays exact; the
fused path's norm + lm_head step takes the quantized weight; refusals by name; the CLI flag.

Tiny random Llamas (hidden 128) on the CPU's float32 reference path; the fused CUDA path under -m gpu.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.llm.test_quant import _cache_of, _llama, _one_sequence_step, _prompts, _with_cache
from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.kernels.qweight import Fp8Weight, fp8_linear_reference, quantize_fp8
from trtforge.llm.quant import QuantLinear, model_lm_head_quantization, model_quantization, quantize_model


def _hidden(model: torch.nn.Module, ids: list[int], prefill: int) -> torch.Tensor:
    """The LM head's input (the final-normed hidden states ``[T, H]``, float32) as the executor runs
    the sequence: a prefill of `prefill` tokens, then one token at a time on its cache (FP8 projections
    are weight-only at one token, W8A8 above)."""
    with torch.no_grad():
        out = model.model(torch.tensor([ids[:prefill]]), use_cache=True)
        rows, cache = [out.last_hidden_state[0]], _cache_of(out)
        for t in ids[prefill:]:
            out = _with_cache(model.model, torch.tensor([[t]]), cache)
            rows.append(out.last_hidden_state[0])
            cache = _cache_of(out)
    return torch.cat(rows)


@pytest.mark.parametrize("method", [None, "fp8", "int4-rtn"])
def test_fp8_head_is_quantized_and_used_at_one_token_and_at_a_prefill(method):
    """The executor's logits are the quantized head's float references: W8A8 (per-token E4M3
    activations) at a 9-token prefill, weight-only at the one-token decode (what the GEMV computes)."""
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model = _llama()
    ref_head = model.lm_head.weight.detach().clone()
    record = quantize_model(model, method, lm_head_quantization="fp8")
    head = model.lm_head
    assert isinstance(head, QuantLinear) and isinstance(head.qweight, Fp8Weight)
    assert torch.equal(head.qweight.data.view(torch.uint8), quantize_fp8(ref_head).data.view(torch.uint8))
    assert record.lm_head == "fp8" and not record.lm_head_tied
    assert record.lm_head_bytes_after < record.lm_head_bytes_before / 3  # float32 -> E4M3 + scales
    assert record.projections == (0 if method is None else 14)
    assert model_quantization(model) == method and model_lm_head_quantization(model) == "fp8"
    assert record.to_dict()["unquantized"] == "embeddings and norms (model dtype)"

    ids = _prompts(1, 10)[0]
    hidden = _hidden(model, ids, 9)
    w = head.qweight
    want_prefill = fp8_linear_reference(hidden[:9], w)
    want_one = hidden[9:] @ w.dequantize().t()
    w8a8_one = fp8_linear_reference(hidden[9:], w)
    ex = TorchExecutor(model, num_blocks=4, block_size=16)
    assert ex.facts.quantization == method and ex.facts.lm_head_quantization == "fp8"
    with torch.no_grad():
        prefill = ex.step(_one_sequence_step(ids[:9], 0)).float()
        one = ex.step(_one_sequence_step(ids[9:], 9)).float()
    torch.testing.assert_close(prefill, want_prefill, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(one, want_one, rtol=1e-4, atol=1e-5)
    # the decode row is weight-only, not W8A8 (the two differ by the activations' E4M3 rounding)
    assert (one - want_one).abs().max() < 0.01 * (w8a8_one - want_one).abs().max()


def test_tied_embedding_stays_exact_and_generation_matches_transformers():
    from trtforge.llm import from_pretrained

    model = _llama(tie_word_embeddings=True)
    embed = model.model.embed_tokens
    before = embed.weight.detach().clone()
    assert model.lm_head.weight is embed.weight
    record = quantize_model(model, "int4-rtn", lm_head_quantization="fp8")
    assert record.lm_head_tied and "tied to lm_head stays exact" in record.unquantized
    assert model.model.embed_tokens is embed and embed.weight.dtype == torch.float32
    assert torch.equal(embed.weight, before)  # untouched: the FP8 head is a copy beside it
    assert isinstance(model.lm_head, QuantLinear)
    assert torch.equal(
        model.lm_head.qweight.data.view(torch.uint8), quantize_fp8(before).data.view(torch.uint8)
    )
    ids = torch.tensor(_prompts(1, 9))
    assert torch.equal(model.model.embed_tokens(ids), before[ids])
    prompt = ids[0].tolist()
    with torch.no_grad():
        hf = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    with from_pretrained(model, num_blocks=16) as llm:
        assert llm.executor.facts.lm_head_quantization == "fp8"
        got = llm.generate([prompt], max_new_tokens=8, stop_at_eos=False)[0]
    assert got == hf[0, len(prompt) :].tolist()
    assert torch.equal(embed.weight, before)


def test_fused_logits_take_the_quantized_head_through_norm_gemv(monkeypatch):
    """FusedLayers.logits (its Triton kernels in the CPU interpreter): one token goes through norm_gemv
    with the FP8 weight (weight-only), more tokens through quant_linear (W8A8), even where the INT4
    projections' GEMV limit is 16 rows; a BF16 head keeps that limit."""
    from trtforge.llm.executors import fused_layers
    from trtforge.llm.models.families import adapter_for

    calls: list = []
    kernel = fused_layers.norm_gemv

    def spy(h, norm_weight, eps, w, bias=None):
        calls.append(w)
        return kernel(h, norm_weight, eps, w, bias)

    monkeypatch.setattr(fused_layers, "norm_gemv", spy)
    h = torch.randn(4, 128, generator=torch.Generator().manual_seed(1))
    for lm_head in ("fp8", None):
        model = _llama()
        quantize_model(model, "int4-rtn", lm_head_quantization=lm_head)
        fused = fused_layers.FusedLayers(adapter_for(model))
        assert fused.gemv_max_tokens == 16
        assert fused.head_gemv_max_tokens == (1 if lm_head else 16)
        calls.clear()
        with torch.no_grad():
            one, four = fused.logits(h[:1]), fused.logits(h)
            x = model.model.norm(h)
        if lm_head:
            w = model.lm_head.qweight
            assert len(calls) == 1 and calls[0] is w
            torch.testing.assert_close(one, x[:1] @ w.dequantize().t(), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(four, fp8_linear_reference(x, w), rtol=1e-3, atol=1e-3)
        else:
            assert len(calls) == 2 and all(w is model.lm_head.weight for w in calls)
            torch.testing.assert_close(four, x @ model.lm_head.weight.t(), rtol=1e-4, atol=1e-5)


def test_refusals_name_the_lm_head_option(monkeypatch):
    from trtforge.llm import from_pretrained, load
    from trtforge.llm.quant import apply

    with pytest.raises(UserError, match="lm_head_quantization 'int8' is not supported; choose fp8"):
        quantize_model(_llama(), "fp8", lm_head_quantization="int8")
    with pytest.raises(UserError, match="lm_head_quantization='fp8': the gpt2 family .* no quantized path"):
        quantize_model(tiny_model("gpt2"), None, lm_head_quantization="fp8")
    model = _llama()
    quantize_model(model, None, lm_head_quantization="fp8")
    with pytest.raises(UserError, match="lm_head is a QuantLinear, not an nn.Linear"):
        quantize_model(model, None, lm_head_quantization="fp8")
    with pytest.raises(UserError, match="lm_head_quantization 'int4' is not supported"):
        from_pretrained(_llama(), lm_head_quantization="int4", num_blocks=4)
    with pytest.raises(UserError, match="^lm_head_quantization='fp8' does not run with tensor_parallel_size"):
        from_pretrained(_llama(), lm_head_quantization="fp8", tensor_parallel_size=2)
    all_three = "kv_cache_dtype='fp8', quantization='fp8' and lm_head_quantization='fp8' do not run with"
    options = {"kv_cache_dtype": "fp8", "quantization": "fp8", "lm_head_quantization": "fp8"}
    with pytest.raises(UserError, match=f"^{all_three} tensor_parallel_size > 1 yet; .* drop them"):
        from_pretrained(_llama(), **options, tensor_parallel_size=2)
    with pytest.raises(UserError, match="lm_head_quantization='fp8' applies to the torch executor"):
        load("step.onnx", "onnxruntime", lm_head_quantization="fp8")
    assert quantize_model(_llama(), None) is None  # neither option: nothing to do

    # on CUDA: the FP8 GEMM's multiples of 16 (vocabulary 300 here) and FP8 tensor cores
    fake = torch.nn.Parameter(torch.zeros(1))
    monkeypatch.setattr(type(fake), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100-SXM4-80GB")
    what = "lm_head_quantization='fp8'"
    with pytest.raises(UserError, match=r"LM head is \[300, 128\] .* multiples of 16"):
        apply._check_head(_llama(), what)
    with pytest.raises(UserError, match="lm_head_quantization='fp8' needs FP8 tensor cores.*A100"):
        apply._check_device(_llama(), "fp8", what)


def lm_head_factory():
    """`trtforge generate` loads this: the tiny Llama of these tests."""
    return _llama(), None


def test_generate_cli_plumbs_the_lm_head_flag(monkeypatch, capsys):
    import trtforge.llm.quant as quant
    from trtforge.cli.main import main

    seen: list = []
    original = quant.quantize_model

    def spy(model, method, *args, **kwargs):
        record = original(model, method, *args, **kwargs)
        seen.append((method, kwargs.get("lm_head_quantization"), model_lm_head_quantization(model)))
        return record

    monkeypatch.setattr(quant, "quantize_model", spy)
    model = "tests.llm.test_quant_lm_head:lm_head_factory"
    base = ["generate", model, "--prompt-ids", "3 4 5", "--max-tokens", "3", "--ignore-eos"]
    assert main([*base, "--quantization", "int4-rtn", "--lm-head-quantization", "fp8"]) == 0
    assert len(capsys.readouterr().out.split()) == 3
    assert seen == [("int4-rtn", "fp8", "fp8")]
    assert main([*base, "--lm-head-quantization", "fp8"]) == 0  # the head alone
    assert seen[-1] == (None, "fp8", "fp8")
    capsys.readouterr()
    assert main([*base, "--lm-head-quantization", "int8"]) == 2
    assert "--lm-head-quantization" in capsys.readouterr().err
    onnx = ["generate", "step.onnx", "--prompt-ids", "3 4 5", "--lm-head-quantization", "fp8"]
    assert main(onnx) == 2
    assert "--lm-head-quantization applies to the torch executor" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("method", [None, "fp8", "int4-rtn"])
def test_fused_cuda_path_with_the_fp8_head_matches_the_float32_reference(method):
    """BF16 on the GPU, fused layers, the FP8 head: a 9-token prefill (the head W8A8 on _scaled_mm) and
    a one-token decode (norm + FP8 GEMV, weight-only, in a CUDA graph) against the CPU's float32
    reference of the same quantized weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the FP8 head needs compute capability 8.9+")
    from trtforge.kernels.qweight import Fp8Weight as Fp8
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model = _llama(num_key_value_heads=2, vocab_size=320).to(torch.bfloat16)  # (vocab: multiples of 16)
    cpu = copy.deepcopy(model).float()
    model = model.cuda()
    quantize_model(model, method, lm_head_quantization="fp8")
    quantize_model(cpu, method, lm_head_quantization="fp8")  # the same BF16 weights: the same codes
    ex = TorchExecutor(model, num_blocks=4, block_size=16)
    assert ex.fused_refusal is None and ex.facts.lm_head_quantization == "fp8"
    assert isinstance(ex._fused.head_w, Fp8) and ex._fused.head_gemv_max_tokens == 1
    ids = _prompts(1, 10)[0]
    with torch.no_grad():
        pre = cpu(torch.tensor([ids[:9]]), use_cache=True)
        one = _with_cache(cpu, torch.tensor([ids[9:]]), _cache_of(pre)).logits[0]
    want = torch.cat([pre.logits[0], one])
    got = torch.cat([ex.step(_one_sequence_step(ids[:9], 0)), ex.step(_one_sequence_step(ids[9:], 9))])
    assert ex.num_cuda_graphs == 1  # the decode step ran as a graph
    rel = (got.float().cpu() - want).norm(dim=-1) / want.norm(dim=-1)
    # BF16 activations against float32 ones: the per-token E4M3 rounding of the prefill flips where
    # they differ (the same bound as test_quant's FP8 row); the decode row is weight-only, tighter
    assert rel.max() < 0.12, rel
    assert rel[-1] < (0.12 if method == "fp8" else 0.03), rel


MODELS = Path(__file__).resolve().parents[2] / ".." / "shared" / "models"


@pytest.mark.skipif(
    not (MODELS / "code-llama-21m").is_dir(), reason="../shared/models/code-llama-21m is absent"
)
def test_fp8_head_keeps_the_trained_models_perplexity():
    """code-llama-21m on the CPU (float32): 4 windows of 256 held-out tokens, every position scored
    (the head W8A8), FP8 head alone within 0.5% of the model's perplexity (benchmarks/
    bench_quant_quality.py measured +0.07% over 24,528 tokens, BENCHMARKS.md session 14); greedy
    continuations through the serving engine (the head weight-only at each decoded token) agree on most
    tokens."""
    from transformers import AutoTokenizer

    from trtforge.llm import from_pretrained
    from trtforge.llm.models.loader import load_causal_lm

    model_dir = MODELS / "code-llama-21m"
    text = (MODELS / "eval_stdlib.txt").read_text(encoding="utf-8")[:200_000]
    tokens = AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]
    starts = torch.linspace(0, len(tokens) - 300, 4).long().tolist()
    windows = torch.tensor([tokens[s : s + 256] for s in starts])
    ref = load_causal_lm(str(model_dir)).eval()
    quant = copy.deepcopy(ref)
    quantize_model(quant, None, lm_head_quantization="fp8")
    ppl, greedy = {}, {}
    for name, lm in (("ref", ref), ("fp8", quant)):
        with torch.no_grad():
            logits = lm(input_ids=windows, use_cache=False).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)
        )
        ppl[name] = float(nll.exp())
        with from_pretrained(lm, num_blocks=32) as llm:
            greedy[name] = llm.generate(
                [w[:32].tolist() for w in windows], max_new_tokens=16, stop_at_eos=False
            )
    assert abs(ppl["fp8"] / ppl["ref"] - 1) < 0.005, ppl
    same = sum(a == b for g, r in zip(greedy["fp8"], greedy["ref"]) for a, b in zip(g, r))
    assert same >= 0.75 * 4 * 16, (greedy, ppl)


def test_a_second_fused_layers_reuses_the_first_concatenation():
    """The pool sizing builds a probe executor, then the served one, over the same modules: the second
    FusedLayers must take the first's concatenated QKV and gate/up weights (and so whatever was made for
    them, such as the INT4 tensor-core packing, which the sizing has then already seen in free memory),
    not concatenate afresh; a module whose weight was replaced since is concatenated anew."""
    from trtforge.llm.executors import fused_layers
    from trtforge.llm.models.families import adapter_for

    model = _llama()
    quantize_model(model, "int4-rtn")
    first = fused_layers.FusedLayers(adapter_for(model))
    second = fused_layers.FusedLayers(adapter_for(model))
    assert second.qkv_w[0][0] is first.qkv_w[0][0]
    assert second.gate_up_w[0] is first.gate_up_w[0]
    attn = model.model.layers[0].self_attn
    attn.k_proj.qweight = attn.k_proj.qweight.rows(0, attn.k_proj.out_features)  # a new object, same rows
    third = fused_layers.FusedLayers(adapter_for(model))
    assert third.qkv_w[0][0] is not first.qkv_w[0][0]
    assert torch.equal(third.qkv_w[0][0].packed, first.qkv_w[0][0].packed)

    biased = _llama(attention_bias=True)
    quantize_model(biased, "int4-rtn")
    first = fused_layers.FusedLayers(adapter_for(biased))
    assert fused_layers.FusedLayers(adapter_for(biased)).qkv_w[0][1] is first.qkv_w[0][1]
    q_proj = biased.model.layers[0].self_attn.q_proj
    q_proj.bias.data = torch.ones_like(q_proj.bias)  # a bias reassigned: the cached concatenation misses
    again = fused_layers.FusedLayers(adapter_for(biased))
    assert torch.equal(again.qkv_w[0][1][: q_proj.out_features], torch.ones(q_proj.out_features))


def test_float_projections_concatenate_into_views_and_a_bias_mix_is_refused():
    """The fused path's float QKV: one weight and one bias (or none), each module then a view of its rows;
    projections of which only some have a bias are refused, quantized or not."""
    from trtforge.llm.executors.fused_layers import _concat_into_views

    torch.manual_seed(0)
    mods = [torch.nn.Linear(4, 3), torch.nn.Linear(4, 2)]
    weights, biases = [m.weight.detach().clone() for m in mods], [m.bias.detach().clone() for m in mods]
    weight, bias = _concat_into_views(mods)
    assert torch.equal(weight, torch.cat(weights)) and torch.equal(bias, torch.cat(biases))
    assert mods[1].weight.data_ptr() == weight[3:].data_ptr()
    assert mods[1].bias.data_ptr() == bias[3:].data_ptr()
    unbiased = [torch.nn.Linear(4, 3, bias=False), torch.nn.Linear(4, 2, bias=False)]
    assert _concat_into_views(unbiased)[1] is None
    with pytest.raises(ValueError, match="either every projection has a bias or none does"):
        _concat_into_views([torch.nn.Linear(4, 3), torch.nn.Linear(4, 2, bias=False)])
    model = _llama(attention_bias=True)
    quantize_model(model, "int4-rtn")
    attn = model.model.layers[0].self_attn
    attn.k_proj.bias = None
    with pytest.raises(ValueError, match="either every projection has a bias or none does"):
        _concat_into_views([attn.q_proj, attn.k_proj, attn.v_proj])
