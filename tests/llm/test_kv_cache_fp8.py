"""``kv_cache_dtype="fp8"`` in the torch executor: pools, sizing, memory accounting, calibration,
refusals, the kernels against the reference path, and quality on the trained 21M model."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests.llm.serving_models import run_to_completion, tiny_llama
from tests.llm.test_triton_executor import _Lockstep
from trtforge.errors import UserError
from trtforge.llm import sizing
from trtforge.llm.engine import make_step_loop
from trtforge.llm.executors.kv_cache import (
    KVScales,
    calibrate_kv_scales,
    kv_element_bytes,
    resolve_kv_cache_dtype,
)
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig
from trtforge.llm.service import ServingLLM, from_pretrained, load

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / ".." / "shared" / "models"


def _tiny(dtype=torch.bfloat16):
    return copy.deepcopy(tiny_llama()).to(dtype)


def test_fp8_pools_take_one_byte_an_element_and_report_real_bytes():
    bf16 = TorchExecutor(_tiny(), num_blocks=8)
    fp8 = TorchExecutor(_tiny(), num_blocks=8, kv_cache_dtype="fp8", kv_scales=1.0)
    assert (bf16.facts.kv_dtype, bf16.facts.kv_element_bytes) == ("bfloat16", 2)
    assert (fp8.facts.kv_dtype, fp8.facts.kv_element_bytes) == ("float8_e4m3fn", 1)
    assert all(p.dtype == torch.float8_e4m3fn for p in (*fp8.k_pools, *fp8.v_pools))
    assert fp8.facts.kv_pool_bytes * 2 == bf16.facts.kv_pool_bytes
    assert fp8.facts.kv_bytes_per_token * 2 == bf16.facts.kv_bytes_per_token
    with ServingLLM(fp8) as llm:
        llm.generate([[5, 6, 7] * 7], max_new_tokens=4)
        # n=2 forks the sequence: its partly filled last block is copied (copy-on-write) in the FP8 pools
        twins = llm.completions([[5, 6, 7] * 7], SamplingParams(n=2, max_tokens=6, ignore_eos=True))
        mem = llm.memory_stats()
    assert twins[0].token_ids == twins[1].token_ids  # greedy: both samples continue alike
    assert mem.kv_dtype == "float8_e4m3fn"
    assert mem.block_bytes == fp8.facts.kv_bytes_per_token * fp8.facts.block_size
    assert mem.total_bytes == 8 * mem.block_bytes and mem.bytes_per_token == fp8.facts.kv_bytes_per_token


def test_the_same_pool_bytes_hold_twice_the_bf16_tokens(monkeypatch):
    """Sizing counts real bytes per token: a fixed CPU budget (and a fixed GPU budget) gives FP8 twice
    the blocks of BF16, through the same path from_pretrained takes (sizing.torch_pool)."""
    geometry = (32, 8, 128, 16)  # Llama-3-8B: layers, KV heads, head dim; 16-token blocks
    per_block = {
        kv: sizing.kv_block_bytes(*geometry, kv_element_bytes(kv, torch.bfloat16)) for kv in ("auto", "fp8")
    }
    assert per_block["auto"] == 2 * per_block["fp8"] == 2 * 32 * 16 * 8 * 128 * 2
    gpu = {kv: sizing.gpu_pool(100 << 30, 4 << 30, 0.9, b).num_blocks for kv, b in per_block.items()}
    assert gpu["fp8"] in (2 * gpu["auto"], 2 * gpu["auto"] + 1)  # (floor division of one budget)
    lm = _tiny()
    bf16_block = sizing.kv_block_bytes(2, 2, 16, 16, 2)
    monkeypatch.setattr(sizing, "available_ram", lambda: int(1000 * bf16_block / sizing.CPU_KV_FRACTION))
    config = sizing.default_scheduler_config(None, 64)
    blocks = {
        kv: sizing.torch_pool(
            lm,
            block_size=16,
            device="cpu",
            dtype=torch.bfloat16,
            max_model_len=None,
            config=config,
            gpu_memory_utilization=0.9,
            kv_cache_dtype=kv,
        ).num_blocks
        for kv in ("auto", "fp8")
    }
    assert blocks == {"auto": 1000, "fp8": 2000}


def test_calibrated_scales_are_each_layers_kv_amax_over_448():
    lm = _tiny(torch.float32)
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10, 11]]
    scales = calibrate_kv_scales(lm, 2, prompts)
    for layer in range(2):
        k_amax = v_amax = 0.0
        for p in prompts:
            cache = lm(input_ids=torch.tensor([p]), use_cache=True).past_key_values
            k_amax = max(k_amax, float(cache.layers[layer].keys.detach().abs().max()))
            v_amax = max(v_amax, float(cache.layers[layer].values.detach().abs().max()))
        assert scales.layer(layer) == pytest.approx((k_amax / 448, v_amax / 448), rel=1e-6)
    assert "2 prompts (9 tokens)" in scales.how
    default = calibrate_kv_scales(lm, 2)
    assert default == calibrate_kv_scales(lm, 2)  # seeded: the same scales every time
    assert "seeded random token ids" in default.how
    ex = TorchExecutor(lm, num_blocks=4, kv_cache_dtype="fp8", calib_prompts=prompts)
    assert ex.kv_scales == scales


def _run_mixed(executor, seed: int) -> None:
    """Prompts in small chunks mixed with decodes (as test_triton_executor's lockstep runs)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 300, size=int(rng.integers(1, 40))).tolist() for _ in range(4)]
    config = SchedulerConfig(
        max_num_batched_tokens=48, max_prefill_chunk=24, max_prefill_tokens_with_decodes=16
    )
    loop = make_step_loop(executor, config)
    for i, p in enumerate(prompts):
        loop.add_request(i, p, SamplingParams(max_tokens=4, ignore_eos=True))
    done = run_to_completion(loop)
    assert not [v.error for v in done.values() if v.error is not None]


@pytest.mark.parametrize("device", DEVICES)
def test_triton_fp8_executor_matches_the_fp8_reference(device):
    """The kernels (fused RoPE + FP8 write, split-KV decode and chunked prefill reading FP8) against the
    torch reference over the same FP8 pools and scales, in lockstep over mixed steps. The fused kernel
    rounds a rotated key to FP16 once, HF's rotation three times: a key can then land one FP8 step
    (6%) apart on the two paths, which this random model's sharp attention (initializer 0.2) turns
    into logit errors of several percent; its queries are scaled by 1/4 to soften the scores."""
    skip_unless_runs_here(device)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 KV needs compute capability >= 8.9")
    base = _tiny(torch.float16)
    for layer in base.model.layers:
        layer.self_attn.q_proj.weight.data *= 0.25
    scales = calibrate_kv_scales(base, 2)
    kwargs = {
        "num_blocks": 96,
        "device": device,
        "max_decode_batch": 8,
        "kv_cache_dtype": "fp8",
        "kv_scales": scales,
    }
    ref = TorchExecutor(copy.deepcopy(base), kernels="torch", **kwargs)
    test = TorchExecutor(copy.deepcopy(base), kernels="triton", **kwargs)
    assert test.fused_refusal is None, test.fused_refusal
    both = _Lockstep(ref, test, rel_tol=3e-2)
    _run_mixed(both, seed=2)
    assert both.mixed_steps > 0 and both.decode_steps > 0
    assert both.max_rel_err < both.rel_tol
    assert both.flipped == 0 and both.clear_rows >= both.rows // 3


def test_bad_kv_cache_options_are_refused(monkeypatch):
    with pytest.raises(UserError, match="'fp16' is not supported; choose 'auto'"):
        TorchExecutor(_tiny(), num_blocks=4, kv_cache_dtype="fp16")
    with pytest.raises(UserError, match="apply to kv_cache_dtype='fp8' only"):
        TorchExecutor(_tiny(), num_blocks=4, kv_scales=1.0)
    with pytest.raises(UserError, match="1 K and 1 V scales; the model has 2 layers"):
        TorchExecutor(_tiny(), num_blocks=4, kv_cache_dtype="fp8", kv_scales=KVScales((1.0,), (1.0,), "x"))
    with pytest.raises(UserError, match="positive number"):
        TorchExecutor(_tiny(), num_blocks=4, kv_cache_dtype="fp8", kv_scales=0.0)
    with pytest.raises(UserError, match="outside the vocabulary"):
        TorchExecutor(_tiny(), num_blocks=4, kv_cache_dtype="fp8", calib_prompts=[[1, 99999]])
    with pytest.raises(UserError, match="not supported by the ONNX Runtime executor yet"):
        load("step.onnx", kv_cache_dtype="fp8")
    with pytest.raises(UserError, match="not supported by the TensorRT executor yet"):
        load("llm.engine", kv_cache_dtype="fp8")
    with pytest.raises(UserError, match="nothing to calibrate"):
        from_pretrained(_tiny(), num_blocks=4, calib_prompts=[[1, 2, 3]])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10")
    with pytest.raises(UserError, match=r"NVIDIA A10 is 8.6"):
        resolve_kv_cache_dtype("fp8", torch.bfloat16, torch.device("cuda", 0))
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, torch.device("cuda", 0)) == torch.bfloat16


def test_the_cli_refuses_fp8_kv_on_a_step_graph(capsys):
    from trtforge.cli.main import main

    assert main(["generate", "step.onnx", "--prompt-ids", "1 2", "--kv-cache-dtype", "fp8"]) == 2
    assert "not supported by the ONNX Runtime executor yet" in capsys.readouterr().err.replace("\n", " ")


def _bench():
    """benchmarks/bench_kv_fp8_quality.py (its window_nll: perplexity through an executor)."""
    spec = importlib.util.spec_from_file_location(
        "bench_kv_fp8_quality", ROOT / "benchmarks" / "bench_kv_fp8_quality.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp8_kv_keeps_the_trained_models_perplexity(device, request):
    """code-llama-21m, FP32 on the CPU: 6 windows of 384 held-out tokens, each one prefill step reading its
    K/V back from the pool. FP8 KV (default calibration) within 1% of the FP32 cache's perplexity, and
    greedy continuations of 4 prompts agree on most tokens. The 0.5% acceptance figure is measured by
    benchmarks/bench_kv_fp8_quality.py over 32 windows of 512 tokens (+0.40%, BENCHMARKS.md): on these
    ~2,300 tokens the FP8 rounding pattern alone moves the delta by about +-0.25% (the same pools with
    the scales multiplied by 0.9 .. 4 gave -0.03% .. +0.48%; the default scales +0.55%), so the bound
    here is 1%: a wrong scale or layout moves perplexity by far more. On a GPU (BF16 model, the Triton
    kernels, decode from CUDA graphs) the same bounds against the BF16 cache."""
    if device == "cuda" and (not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9)):
        pytest.skip("needs a CUDA GPU with FP8 support (compute capability >= 8.9)")
    model_dir = MODELS / "code-llama-21m"
    text = MODELS / "eval_stdlib.txt"
    if not model_dir.is_dir() or not text.is_file():
        pytest.skip(f"the trained models are absent ({MODELS}); see shared/models/README.md")
    from transformers import AutoTokenizer

    from trtforge.llm.models.loader import load_causal_lm

    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))  # (restored after this test)
    torch.set_num_threads(2)
    tokens = AutoTokenizer.from_pretrained(model_dir)(text.read_text(encoding="utf-8")[:400_000])["input_ids"]
    starts = np.linspace(0, len(tokens) - 400, 6).astype(int)
    windows = [tokens[s : s + 384] for s in starts]
    lm = load_causal_lm(str(model_dir))
    if device == "cuda":
        lm = lm.to(device="cuda", dtype=torch.bfloat16)
    bench = _bench()
    ppl, greedy = {}, {}
    for kv in ("auto", "fp8"):
        ex = TorchExecutor(lm, num_blocks=40, kv_cache_dtype=kv)
        total = count = 0
        for w in windows:
            s, c = bench.window_nll(ex, w)
            total, count = total + s, count + c
        ppl[kv] = math.exp(total / count)
        with ServingLLM(ex) as llm:
            greedy[kv] = llm.generate([w[:48] for w in windows[:4]], max_new_tokens=16, stop_at_eos=False)
    assert abs(ppl["fp8"] / ppl["auto"] - 1) < 0.01, ppl
    same = sum(a == b for g, r in zip(greedy["fp8"], greedy["auto"]) for a, b in zip(g, r))
    assert same >= 0.6 * 4 * 16, (greedy, ppl)
