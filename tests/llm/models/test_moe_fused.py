"""The fused formulation of the sparse MoE MLPs (llm.models.moe ``fused``: trtforge.kernels.moe) against
the grouped one and float64 math, per family form: Mixtral's float32 renormalized routing weights,
Qwen2-MoE's gated shared expert (and a dense layer), GraniteMoE's top-k-then-softmax, gpt-oss's experts
(transformers' GptOssExperts read in place, their biases, the clamped SwiGLU), GLM-4.5's grouped sigmoid
routing with a selection bias and a routed scale, Llama 4's experts (transposed, their inputs scaled by the
routing weights) and Aria's (transposed); in Triton's CPU interpreter without CUDA and for real on a GPU.
The blocks it refuses run grouped, and the torch executor keeps its CUDA-graph refusal for them, naming the
reason; on a GPU, the executor's graph-captured decode (and piecewise prompt steps) of MoE models gives its
eager tokens, and grouped ones."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests._host_sync import no_host_reads
from tests.llm.tiny_models import aria_runs_here, tiny_model
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import adapter_for

# gpt_oss: its experts' layout (transposed, interleaved, biased, the clamped SwiGLU; the tiny model's limit
# of 1 bites) and its router (a bias, top-k then softmax in the model's dtype); glm4_moe: DeepSeek-V3-style
# routing (float32 sigmoid scores, a selection bias, expert groups, float32 weights scaled by 2.5) and an
# ungated shared MLP (HunYuan-MoE's and ERNIE 4.5-MoE's routings are softmax top-k as Mixtral's and
# Qwen2-MoE's, their experts the plain layout: the GPU decode test below takes them); minimax_m2: sigmoid
# scores of logits in the model's dtype with its block's selection bias, on the route kernel; llama4_text:
# the top-2 logits' sigmoid scaling each expert's input (rounded to the model's dtype), the outputs summed
# unweighted, its experts transposed (x @ W); aria_text: the plain experts transposed, top-k then softmax
FAMILIES = (
    "mixtral",
    "qwen2_moe",
    "granitemoe",
    "gpt_oss",
    "glm4_moe",
    "minimax_m2",
    "llama4_text",
    "aria_text",
)
# one ulp at 1.0 (FP32: the summation order over K, tens of products, dominates its rounding)
_ULP = {torch.float32: 2**-20, torch.bfloat16: 2**-7, torch.float16: 2**-10}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_matches_grouped_and_is_as_close_to_float64(monkeypatch, device, dtype, family):
    """Each MoE layer's fused output (1, 18 and 60 tokens: two rows of the tile table) is the grouped one
    within 4 ulps of (|out| + its mean), and no farther from the float64 block than grouped is (RMS,
    with a margin); the fused call reads nothing back to the host (route, kernels, shared expert)."""
    skip_unless_runs_here(device)
    model = tiny_model(family)
    exact = adapter_for(model.double())  # the float64 reference first, then the model in `dtype`
    x64 = torch.randn(79, model.config.hidden_size, generator=torch.Generator().manual_seed(1)).double()
    layers = [i for i, m in enumerate(exact.moe) if m is not None]
    with torch.no_grad():
        want = {i: exact.mlp(i, x64) for i in layers}
    adapter = adapter_for(model.to(device, dtype))
    ulp = _ULP[dtype]
    for i in layers:
        moe = adapter.moe[i]
        assert moe.fused_refusal() is None
        for rows in (slice(0, 1), slice(1, 19), slice(19, 79)):
            x = x64[rows].to(device, dtype)
            with torch.no_grad():
                with no_host_reads(monkeypatch):
                    got = moe.forward(x, "fused")
                grouped = moe.forward(x, "grouped")
            assert got.dtype == dtype and got.shape == x.shape
            g, f, w = grouped.double().cpu(), got.double().cpu(), want[i][rows]
            tol = 4 * ulp * (g.abs() + g.abs().mean()) + 1e-6
            assert ((f - g).abs() <= tol).all(), f"layer {i} rows {rows}: {(f - g).abs().max()} off grouped"
            rms = lambda t: float(t.pow(2).mean().sqrt())  # noqa: E731
            assert rms(f - w) <= 1.25 * rms(g - w) + 2 * ulp * rms(w), (i, rows, rms(f - w), rms(g - w))


def _refused(family: str, change: str) -> torch.nn.Module:
    """A tiny `family` model whose first MoE block's experts are changed the way `change` names."""
    model = tiny_model(family)
    experts = next(m for m in adapter_for(model).moe if m is not None).block.experts
    if change == "bias":
        experts.gate_up_proj_bias = torch.nn.Parameter(torch.zeros(experts.gate_up_proj.shape[:2]))
    elif change == "gelu":
        experts.act_fn = torch.nn.GELU()
    elif change == "float64":
        model.double()
    elif change == "strided":  # the same values, each expert's matrix stored column-major
        down = experts.down_proj.detach()
        experts.down_proj = torch.nn.Parameter(down.transpose(1, 2).contiguous().transpose(1, 2))
    return model


_BIASED = r"experts with parameters \['down_proj', 'gate_up_proj', 'gate_up_proj_bias'\]"


@pytest.mark.parametrize(
    ("family", "change", "why"),
    [
        ("mixtral", "bias", _BIASED),
        ("mixtral", "gelu", "a GELU gate"),
        ("mixtral", "float64", "torch.float64 experts"),
        ("llama4_text", "bias", _BIASED),
        ("llama4_text", "gelu", "a GELU gate"),
        ("llama4_text", "strided", "expert weights without unit stride along their last axis"),
    ],
    ids=["bias", "gelu", "float64", "llama4-bias", "llama4-gelu", "llama4-strided"],
)
def test_blocks_the_kernels_cannot_run_stay_grouped_and_keep_the_graph_refusal(family, change, why):
    """Biases (as gpt-oss's experts have), another activation, float64, weights strided along their rows,
    in the plain layout and in Llama 4's (transposed, inputs scaled): the block names why, its ``fused``
    call runs grouped (the same bits), and the executor's CUDA-graph refusal names the layer and the
    reason; an unchanged model has no refusal, Llama 4's and Aria's included."""
    model = _refused(family, change)
    layer, moe = next((i, m) for i, m in enumerate(adapter_for(model).moe) if m is not None)
    assert moe.fused_refusal() is not None and re.match(why, moe.fused_refusal())
    x = torch.randn(5, model.config.hidden_size, dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        assert torch.equal(moe.forward(x, "fused"), moe.forward(x, "grouped"))
    ex = TorchExecutor(model, num_blocks=8, block_size=4, static_decode=True)
    refusal = ex.facts.cuda_graphs_refusal
    assert refusal.startswith("MoE MLPs: each step routes its tokens"), refusal
    assert f"cannot run: layer {layer}'s block: {moe.fused_refusal()}" in refusal
    for family in (f for f in FAMILIES if f != "aria_text" or aria_runs_here()):
        assert TorchExecutor(tiny_model(family), num_blocks=8, block_size=4).facts.cuda_graphs_refusal is None


def test_the_executor_keeps_grouped_on_the_cpu_and_the_a_b_setting_refuses_graphs(monkeypatch):
    """On the CPU the MoE layers run grouped (the fused path is CUDA's); MOE_FUSED off keeps the refusal."""
    import trtforge.llm.executors.torch_exec as te

    ex = TorchExecutor(tiny_model("mixtral"), num_blocks=8, block_size=4)
    assert ex._adapter.moe_formulation == "grouped" and ex.facts.cuda_graphs_refusal is None
    monkeypatch.setattr(te, "MOE_FUSED", False)
    off = TorchExecutor(tiny_model("mixtral"), num_blocks=8, block_size=4)
    assert off.facts.cuda_graphs_refusal.endswith("cannot run: torch_exec.MOE_FUSED is off)")


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss", "llama4_text"])
def test_static_decode_and_piecewise_steps_run_the_fused_moe_on_padded_tokens(family):
    """The executor's static paths with the fused formulation (forced on the CPU: the interpreter): decode
    steps padded to batch buckets and prompt steps to token buckets (padding tokens routed like any other)
    give the logits of eager grouped steps, the same schedule for both."""
    skip_unless_runs_here("cpu")  # the kernels take CPU tensors in the interpreter only
    from tests.llm.test_piecewise import _Lockstep, _serve

    model = tiny_model(family, seed=3)
    kwargs = {"num_blocks": 64, "block_size": 4, "max_decode_batch": 8}
    eager = TorchExecutor(model, static_decode=False, **kwargs)
    pieces = TorchExecutor(model, static_decode=True, max_graph_tokens=32, **kwargs)
    assert eager._adapter.moe_formulation == pieces._adapter.moe_formulation == "grouped"  # (the CPU)
    pieces._adapter.moe_formulation = "fused"
    both = _Lockstep(eager, pieces)
    _serve(both, async_scheduling=False, n=3, seed=1)
    assert both.mixed_steps > 0 and pieces._piecewise._records and pieces._static
    assert {"piecewise", "decode"} <= set(both.paths), set(both.paths)
    assert both.max_rel_err < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(
    "family", ["mixtral", "qwen2_moe", "gpt_oss", "glm4_moe", "llama4_text", "aria_text"]
)
def test_gpu_a_captured_moe_layer_follows_the_routing_of_each_replay(family):
    """A BF16 MoE layer (router, fused experts, Qwen2-MoE's gated shared expert) captured once in a CUDA
    graph, replayed on new hidden states whose routings differ from the capture's: each replay gives the
    eager fused call's result for its input (an ulp: the router's cuBLAS GEMM may differ in a graph), and the
    grouped formulation's within 4 ulps."""
    model = tiny_model(family).to("cuda", torch.bfloat16)
    moe = next(m for m in adapter_for(model).moe if m is not None)
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(24, model.config.hidden_size, generator=g).to("cuda", torch.bfloat16) for _ in range(4)]
    static = xs[0].clone()
    with torch.no_grad():
        moe.forward(static, "fused")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe.forward(static, "fused")
        captured_routing = moe.route(xs[0])[1]
        for x in xs[1:]:
            assert not torch.equal(moe.route(x)[1], captured_routing)
            static.copy_(x)
            graph.replay()
            torch.testing.assert_close(out, moe.forward(x, "fused"), rtol=2**-7, atol=1e-3)
            grouped = moe.forward(x, "grouped").float()
            tol = 4 * 2**-7 * (grouped.abs() + grouped.abs().mean())
            assert ((out.float() - grouped).abs() <= tol).all()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "family",
    [
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "granitemoeshared",
        "gpt_oss",
        "hunyuan_v1_moe",
        "ernie4_5_moe",
        "glm4_moe",
        "dots1",
        "flex_olmo",
        "exaone_moe",
        "cohere2_moe",
        "mellum",
        "solar_open",
        "granitemoe_swa",
        "minimax_m2",
        "minicpm5_moe",
        "kolibri1",
        "hy_v3",
        "flint",
        "afmoe",
        "beam",
        "laguna",
        "llama4_text",
        "aria_text",
    ],
)
def test_gpu_graph_decode_of_moe_models_matches_eager_and_grouped(monkeypatch, family):
    """FP32 MoE models served on CUDA: decode steps captured in CUDA graphs and prompt steps in piecewise
    graphs (fused MoE) give the tokens of eager fused steps and of eager grouped steps (MOE_FUSED off)."""
    import trtforge.llm.executors.torch_exec as te
    from tests.llm.serving_models import run_to_completion
    from trtforge.llm.engine import make_step_loop
    from trtforge.llm.sampling import SamplingParams

    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 300, size=int(rng.integers(1, 60))).tolist() for _ in range(20)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 30)), ignore_eos=True) for _ in prompts]
    model = tiny_model(family, max_position_embeddings=512).float().cuda()
    outs, graphs = {}, {}
    for name, fused, static in (("grouped", False, False), ("fused", True, False), ("graphs", True, True)):
        monkeypatch.setattr(te, "MOE_FUSED", fused)
        ex = TorchExecutor(model, num_blocks=256, block_size=16, static_decode=static)
        assert ex._adapter.moe_formulation == ("fused" if fused else "grouped")
        sched = make_step_loop(ex)
        for i, (p, sp) in enumerate(zip(prompts, params)):
            sched.add_request(i, p, sp)
        outs[name] = {k: v.output_token_ids for k, v in run_to_completion(sched).items()}
        graphs[name] = (ex.num_cuda_graphs, ex.num_piecewise_graphs)
    assert outs["fused"] == outs["graphs"] == outs["grouped"]
    assert graphs["graphs"][0] > 0 and graphs["graphs"][1] > 0, graphs
    assert graphs["grouped"] == graphs["fused"] == (0, 0)


@pytest.mark.parametrize("family", ["llama4_text", "aria_text"])
def test_transposed_experts_reach_the_kernels_in_place_with_their_options(monkeypatch, family):
    """Llama 4's and Aria's blocks hand the fused kernels their experts' own parameters (``x @ W``, read
    through their strides: no copy, no re-layout) with ``transposed``, and Llama 4's with ``scale_input``
    (Aria's weights its outputs). The values are compared with grouped and float64 math in
    test_fused_matches_grouped_and_is_as_close_to_float64, which runs both families."""
    skip_unless_runs_here("cpu")  # the kernels take CPU tensors in the interpreter only
    from trtforge.kernels import moe as kernels

    calls = []
    real = kernels.fused_moe
    monkeypatch.setattr(kernels, "fused_moe", lambda *a, **kw: calls.append((a, kw)) or real(*a, **kw))
    model = tiny_model(family)
    moe = next(m for m in adapter_for(model).moe if m is not None)
    x = torch.randn(7, model.config.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        moe.forward(x, "fused")
    (args, kw), ex = calls[0], moe.block.experts
    assert args[1] is ex.gate_up_proj and args[2] is ex.down_proj
    assert kw == {"scale_input": family == "llama4_text", "transposed": True}


def test_aria_experts_run_transposed_or_an_older_layout_is_refused_by_name():
    """Aria's experts: the fused transposed layout where this transformers builds it (5.25), else (5.17's
    fc1 / fc2 grouped GEMMs) a refusal that names the layout and what to upgrade."""
    import transformers as tf

    from tests.llm.tiny_models import aria_experts_fused
    from trtforge.errors import UserError

    if not hasattr(tf, "AriaTextConfig"):
        pytest.skip(f"transformers {tf.__version__} has no AriaTextConfig")
    cfg = tf.AriaTextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, moe_num_experts=4, moe_topk=2,
    )  # fmt: skip
    hf = tf.AriaTextForCausalLM(cfg).eval()
    if aria_experts_fused(hf):
        assert adapter_for(tiny_model("aria_text")).moe[0].layout == "transposed"
    else:
        with pytest.raises(UserError, match=r"grouped GEMMs \(fc1 / fc2\).*upgrade transformers"):
            adapter_for(hf)
        with pytest.raises(pytest.skip.Exception, match="grouped GEMMs"):
            tiny_model("aria_text")
