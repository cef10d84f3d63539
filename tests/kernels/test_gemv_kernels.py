"""The small-M GEMV kernels (norm/QKV, norm/gate-up/SiLU, residual) against torch references.

Without CUDA they run in Triton's CPU interpreter (tests/llm/conftest.py); on a GPU (``-m gpu``) they
run for real, and the fused executor's decode logits are compared with the Hugging Face model's.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

# the FMA paths (also one column a program) at shapes no multiple of the blocks, and the tensor-core path
CONFIGS = [
    pytest.param({"block_n": 8, "block_k": 32, "dot": False}, id="fma"),
    pytest.param({"block_n": 1, "block_k": 64, "dot": False}, id="fma-1col"),
    pytest.param({"block_n": 4, "block_k": 256, "dot": False}, id="fma-1chunk"),  # K in the first chunk
    pytest.param({"block_n": 16, "block_k": 32, "dot": True}, id="dot"),
]


def _rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm in float16: x * rstd rounded to fp16, times the weight."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return w * y


def _operands(device: str, m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 2).half().to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).half().to(device)
    nw = (torch.rand(k, generator=g) + 0.5).half().to(device)
    return g, x, w, nw


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_norm_gemv_matches_norm_then_linear(device, cfg, m):
    from trtforge.kernels.gemv import GemvConfig, norm_gemv

    skip_unless_runs_here(device)
    n, k = 45, 100  # neither a multiple of the blocks
    g, x, w, nw = _operands(device, m, n, k, seed=m)
    bias = torch.randn(n, generator=g).half().to(device)
    want = torch.nn.functional.linear(_rms_norm_ref(x.float(), nw.float(), 1e-5).half().float(), w.float())
    got = norm_gemv(x, nw, 1e-5, w, config=GemvConfig(**cfg))
    _close(got, want.half())
    got_b = norm_gemv(x, nw, 1e-5, w, bias, config=GemvConfig(**cfg))
    _close(got_b, (want + bias.float()).half())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_norm_gate_up_silu_matches_the_eager_mlp_input(device, cfg, m):
    from trtforge.kernels.gemv import GemvConfig, norm_gate_up_silu

    skip_unless_runs_here(device)
    inter, k = 37, 72
    _, x, w, nw = _operands(device, m, 2 * inter, k, seed=10 + m)
    xn = _rms_norm_ref(x, nw, 1e-6)  # fp16 all along, as the eager model
    gu = torch.nn.functional.linear(xn.float(), w.float()).half()
    want = torch.nn.functional.silu(gu[:, :inter].float()).half() * gu[:, inter:]
    got = norm_gate_up_silu(x, nw, 1e-6, w, config=GemvConfig(**cfg))
    _close(got, want)


# the one-row FMA forms DEFER_NORM changes: partials kept to the end, and summed as they come (reduce)
DEFER_CONFIGS = [
    *CONFIGS[:3],
    pytest.param({"block_n": 4, "block_k": 32, "dot": False, "reduce": True}, id="fma-reduce"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", DEFER_CONFIGS)
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("defer", [True, False], ids=["deferred", "prologue"])
def test_deferred_norm_matches_norm_then_linear(device, cfg, m, defer, monkeypatch):
    """gemv.DEFER_NORM (the default): the squares summed in the loop and rstd applied to the sums (one
    row; more rows keep the prologue), and the prologue form it replaced, for the RMSNorm QKV form with
    its bias and the gate/up + SiLU form."""
    from trtforge.kernels import gemv as mod

    skip_unless_runs_here(device)
    monkeypatch.setattr(mod, "DEFER_NORM", defer)
    n, k = 45, 100
    g, x, w, nw = _operands(device, m, n, k, seed=30 + m)
    bias = torch.randn(n, generator=g).half().to(device)
    want = torch.nn.functional.linear(_rms_norm_ref(x.float(), nw.float(), 1e-5).half().float(), w.float())
    _close(mod.norm_gemv(x, nw, 1e-5, w, bias, config=mod.GemvConfig(**cfg)), (want + bias.float()).half())
    inter = 24
    _, x, w, nw = _operands(device, m, 2 * inter, k, seed=40 + m)
    gu = torch.nn.functional.linear(_rms_norm_ref(x, nw, 1e-6).float(), w.float()).half()
    want = torch.nn.functional.silu(gu[:, :inter].float()).half() * gu[:, inter:]
    _close(mod.norm_gate_up_silu(x, nw, 1e-6, w, config=mod.GemvConfig(**cfg)), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", DEFER_CONFIGS[2:], ids=["fma-1chunk", "fma-reduce"])
def test_deferred_norm_leaves_out_the_eager_roundings(device, cfg, monkeypatch):
    """The deferred form never rounds the normalized x to FP16 (twice, as the eager path and the prologue
    form do), so over many outputs it lands closer to the float64 truth; the outputs differ, so the
    deferred path did run."""
    from trtforge.kernels import gemv as mod

    skip_unless_runs_here(device)
    n, k = 256, 192
    _, x, w, nw = _operands(device, 1, n, k, seed=50)
    xd = x.double().cpu()
    xn = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * nw.double().cpu()
    truth = xn @ w.double().cpu().t()
    cfg = mod.GemvConfig(**cfg)
    monkeypatch.setattr(mod, "DEFER_NORM", False)
    rounded = mod.norm_gemv(x, nw, 1e-5, w, config=cfg).double().cpu()
    monkeypatch.setattr(mod, "DEFER_NORM", True)
    deferred = mod.norm_gemv(x, nw, 1e-5, w, config=cfg).double().cpu()
    assert not torch.equal(deferred, rounded)
    assert (deferred - truth).abs().mean() < 0.9 * (rounded - truth).abs().mean()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv_residual_matches_addmm(device, cfg, m):
    from trtforge.kernels.gemv import GemvConfig, gemv_residual

    skip_unless_runs_here(device)
    n, k = 70, 130
    g, x, w, _ = _operands(device, m, n, k, seed=20 + m)
    res = torch.randn(m, n, generator=g).half().to(device)
    want = torch.addmm(res.float(), x.float(), w.float().t()).half()
    _close(gemv_residual(x, w, res, config=GemvConfig(**cfg)), want)


def test_bad_operands_are_refused():
    from trtforge.kernels.gemv import gemv_residual, norm_gate_up_silu

    x, w = torch.zeros(2, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match=r"residual \(2, 3\) is not \[2, 4\]"):
        gemv_residual(x, w, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="takes 1..16 rows, got 17"):
        gemv_residual(torch.zeros(17, 8), w, torch.zeros(17, 4))
    with pytest.raises(ValueError, match="not \\[M, K\\] and \\[N, K\\]"):
        gemv_residual(torch.zeros(2, 9), w, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="odd row count 5"):
        norm_gate_up_silu(x, torch.ones(8), 1e-6, torch.zeros(5, 8))


def _model(family: str, hidden: int, inter: int, vocab: int = 1000, layers: int = 2):
    """A random FP16 Llama, Qwen3 (per-head q/k norms) or Phi-3 (fused qkv_proj / gate_up_proj, 3/4
    partial rotary) with 5 query heads and one KV head."""
    import transformers

    torch.manual_seed(3)
    common = {
        "vocab_size": vocab,
        "hidden_size": hidden,  # K and N no multiple of the default blocks
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "max_position_embeddings": 512,
    }
    if family == "qwen3":
        config, cls = transformers.Qwen3Config(head_dim=hidden // 5, **common), transformers.Qwen3ForCausalLM
    elif family == "phi3":
        config = transformers.Phi3Config(pad_token_id=0, partial_rotary_factor=0.75, **common)
        cls = transformers.Phi3ForCausalLM
    else:
        config, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    return cls(config).half().eval()


def _decode_logits(ex, prompts: list[list[int]], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill each prompt alone, then `steps` batched decode steps of all; logits of the last step and
    the full token sequences (the greedy picks appended)."""
    import numpy as np

    from trtforge.llm.executors.base import StepBatch

    bs = ex.facts.block_size
    seqs = [list(p) for p in prompts]
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(len(prompts))]

    def slots(i, lo, hi):
        return [tables[i][p // bs] * bs + p % bs for p in range(lo, hi)]

    for i, p in enumerate(seqs):
        out = ex.step(StepBatch.build([i], [p], [0], [tables[i]], [slots(i, 0, len(p))], [True]))
        p.append(int(out[0].argmax()))
    for _ in range(steps):
        starts = [len(s) - 1 for s in seqs]
        out = ex.step(
            StepBatch.build(
                list(range(len(seqs))),
                [[s[-1]] for s in seqs],
                starts,
                tables,
                [slots(i, st, st + 1) for i, st in enumerate(starts)],
                [True] * len(seqs),
            )
        )
        for s, row in zip(seqs, out):
            s.append(int(row.argmax()))
    return out, torch.tensor(np.array([s[:-1] for s in seqs]))


# every family at one row and at four on CUDA; the interpreter (~12-19 s a case) takes four rows on Llama
# only: the batch changes the GEMVs' row count, not what a family's layers add (q/k norms, fused QKV)
GEMV_DECODE_CASES = [
    pytest.param(d.values[0], batch, family, id=f"{family}-{batch}-{d.id}", marks=d.marks)
    for d in DEVICES
    for batch in (1, 4)
    for family in ("llama", "qwen3", "phi3")
    if d.id == "cuda" or batch == 1 or family == "llama"
]


@pytest.mark.parametrize(("device", "batch", "family"), GEMV_DECODE_CASES)
def test_fused_gemv_decode_logits_match_the_hf_model(device, batch, family):
    from trtforge.llm.executors.torch_exec import TorchExecutor

    skip_unless_runs_here(device)
    # The interpreter: small. A 300-token vocabulary, whose one-row head GEMV takes the same 4-row blocks
    # (75 programs, not 250) and whose 4-row head the same masked last column block; two decode steps
    # (the second reads the K/V the first's GEMVs wrote, as a third would), not three. Two layers (one
    # layer's GEMVs feeding the next's) on Llama at one row; the other cases one, as each layer adds alike.
    sizes, steps = ((320, 864, 1000), 3) if device == "cuda" else ((160, 216, 300), 2)
    layers = 2 if device == "cuda" or (family, batch) == ("llama", 1) else 1
    model = _model(family, *sizes, layers=layers).to(device)
    ref_model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(3, sizes[2], (9,), generator=g).tolist() for _ in range(batch)]
    ex = TorchExecutor(model, num_blocks=64, block_size=16, kernels="triton", max_decode_batch=8)
    assert ex.fused_refusal is None
    ex._fused.gemv_max_tokens = 8  # decode steps (and their graphs, captured on first use) take the GEMVs
    calls = []
    ex._fused._gemv = lambda h, f=ex._fused._gemv: calls.append(int(h.shape[0])) or f(h)
    got, seqs = _decode_logits(ex, prompts, steps=steps)
    # decode rows took the GEMVs; the 9-token prefills (bucket-padded on CUDA) took cuBLAS
    assert batch in calls and max(calls) >= 9
    if device == "cuda":
        assert ex.num_cuda_graphs > 0  # the decode steps replayed graphs holding the GEMV kernels
    with torch.no_grad():
        want = ref_model(seqs.to(device)).logits[:, -1].float()
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) < 2e-2 * scale
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 4e-2 * scale  # picks clear of the tolerance must agree
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()
