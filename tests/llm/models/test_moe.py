"""Sparse mixture-of-experts families (llm.models.moe, llm.models.mixtral, llm.models.granite): the step graph
of each family against transformers' generate (Mixtral also runs in tiny_models.FAMILIES), ragged batches
on the torch executor, both formulations against each other, and the refusals: the paths MoE MLPs have none
of yet (quantization, tensor parallelism; CUDA graphs where the fused MoE kernels cannot run), the MoE
families not implemented, experts in a layout other than transformers 5's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import trtforge.llm.api
from tests.llm.tiny_models import MOE_CLASSES, MOE_FAMILIES, aria_runs_here, hf_greedy, prompts, tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import adapter_for

NEW_TOKENS = 16


def hf_mlp(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' own MLP output of a decoder layer on its normed input `x`: ``mlp``, or GraniteMoE's
    ``block_sparse_moe`` plus GraniteMoeShared's ``shared_mlp`` (as its decoder layer adds them), or Llama 4's
    ``feed_forward``; gpt-oss's and Llama 4's MoE blocks return the router scores beside their output."""
    if hasattr(layer, "mlp") or hasattr(layer, "feed_forward"):
        out = layer.mlp(x) if hasattr(layer, "mlp") else layer.feed_forward(x)
        return (out[0] if isinstance(out, tuple) else out).reshape(x.shape)
    out = layer.block_sparse_moe(x)
    shared = getattr(layer, "shared_mlp", None)
    return out if shared is None else out + shared(x)


# (mixtral: tiny_models.FAMILIES, both exporters; Param2-MoE and Sarvam-MoE: GLM-4.5's classes, whose graph
# glm4_moe exports)
@pytest.mark.parametrize("family", [f for f in MOE_FAMILIES[1:] if f not in ("param2moe", "sarvam_moe")])
def test_moe_step_graph_matches_hf_generate(family, tmp_path):
    """The exported step graph (the dense formulation: TopK and every expert masked by the routing
    weights) in exact ONNX Runtime gives transformers' greedy tokens and logits."""
    model = tiny_model(family)
    result = export_step(model, max_seq=48, max_batch=4, max_prefill=24, exporter="legacy", workdir=tmp_path)
    g = result.generation
    assert "moe" in g["mlp_kinds"] and g["moe"]["num_experts"] == 4 and g["moe"]["top_k"] == 2
    scoring = "Sigmoid" if "sigmoid" in g["moe"]["routing"] else "Softmax"
    assert {"TopK", scoring} <= {n.op_type for n in result.model.graph.node}
    onnx.save(result.model, str(tmp_path / "step.onnx"))
    llm = trtforge.llm.api.load(tmp_path / "step.onnx")
    batch = prompts(model.config.vocab_size, lens=(1, 5, 17))
    got, got_logits = llm.generate(batch, max_new_tokens=NEW_TOKENS, stop_at_eos=False, return_logits=True)
    for b, prompt in enumerate(batch):
        want, want_logits = hf_greedy(model, prompt, NEW_TOKENS)
        assert len(set(want)) > 3, f"degenerate reference output {want}"
        assert got[b] == want, f"row {b} (prompt length {len(prompt)})"
        assert np.abs(got_logits[b] - want_logits.numpy()).max() <= 1e-4


def test_the_tiny_moe_configs_exercise_what_the_families_differ_in():
    """Routing forms, the shared expert, dense layers among sparse ones, and every expert hit (of the
    families whose config class this transformers has: test-floor's 5.17 lacks Param2-MoE's and
    Sarvam-MoE's)."""
    import transformers

    here = [f for f in MOE_FAMILIES if hasattr(transformers, MOE_CLASSES[f][0])]
    here = [f for f in here if f != "aria_text" or aria_runs_here()]  # (5.17: refused)
    kinds = {f: adapter_for(tiny_model(f)).spec for f in here}
    assert kinds["qwen2_moe"].mlp_kinds == ["moe", "dense", "moe"]
    assert kinds["qwen3_moe"].mlp_kinds == ["dense", "moe", "dense"]
    assert kinds["qwen2_moe"].moe["shared_expert_size"] == 96
    assert kinds["mixtral"].moe["renormalize"] and kinds["mixtral"].moe["float32_weights"]
    assert kinds["qwen3_moe"].moe["renormalize"] and not kinds["olmoe"].moe["renormalize"]
    assert {f for f in here if kinds[f].moe["routing"] == "topk_softmax"} == {
        "aria_text",
        "granitemoe",
        "granitemoeshared",
        "granitemoe_swa",
        "gpt_oss",
    } & set(here)
    assert {f for f in here if kinds[f].moe["layout"] == "gpt_oss"} == {"gpt_oss"}
    assert kinds["granitemoeshared"].moe["shared_expert_size"] == 96
    # HunYuan-MoE's shared MLP, ERNIE 4.5-MoE's and GLM-4.5's shared experts and dense first layers;
    # their selection biases, GLM-4.5's sigmoid scores over expert groups and its routed scale
    hunyuan = kinds["hunyuan_v1_moe"].moe
    assert hunyuan["shared_expert_size"] == 64 and hunyuan["renormalize"]
    assert kinds["ernie4_5_moe"].mlp_kinds == kinds["glm4_moe"].mlp_kinds == ["dense", "moe", "moe"]
    assert kinds["ernie4_5_moe"].moe["shared_expert_size"] == 128
    biased = {f for f in here if kinds[f].moe["selection_bias"]}
    glm_kin = {"param2moe", "sarvam_moe", "solar_open", "hy_v3", "afmoe", "beam", "laguna"} & set(here)
    newer = {"minimax_m2", "minicpm5_moe", "kolibri1"} & set(here)  # (MiniMax-M2's on its block)
    assert biased == {"ernie4_5_moe", "glm4_moe", "dots1", "exaone_moe", *glm_kin, *newer}
    glm = kinds["glm4_moe"].moe
    assert glm["routing"] == "sigmoid_topk" and glm["expert_groups"] == [2, 1] and glm["scale"] == 2.5
    assert glm["float32_weights"] and glm["shared_expert_size"] == 64
    assert kinds["flex_olmo"].moe["renormalize"] and kinds["flex_olmo"].moe["shared_expert_size"] is None
    dots = kinds["dots1"]  # (GLM-4.5's routing without groups, not renormalized)
    assert dots.moe["routing"] == "sigmoid_topk" and dots.moe["expert_groups"] is None
    assert not dots.moe["renormalize"] and dots.mlp_kinds == ["dense", "moe", "moe"]
    assert kinds["granitemoe"].moe["shared_expert_size"] is None
    # Solar Open: no dense layer; Mellum's dense layer 0; Cohere 2-MoE's sigmoid router and averaged shared
    # expert (the only family that averages)
    assert kinds["solar_open"].mlp_kinds == ["moe"] * 3
    assert kinds["mellum"].mlp_kinds == ["dense", "moe", "moe"]
    cohere = kinds["cohere2_moe"].moe
    assert cohere["routing"] == "topk_sigmoid" and cohere["renormalize"]
    assert cohere["shared_expert_size"] == 64
    assert {f for f in here if kinds[f].moe["shared_average"]} == {"cohere2_moe"}
    # Kolibri-1: the only family choosing its experts by the logits (plus the bias), not the scores
    assert {f for f in here if kinds[f].moe["choose_by_logits"]} == {"kolibri1"} & set(here)
    # HY V3: GLM-4.5's routing without groups, its bias on the block; Flint: float32 sigmoid scores, no bias,
    # its shared expert, dense layer 0 by mlp_only_layers
    if "hy_v3" in here:
        hy = kinds["hy_v3"]
        assert hy.moe["routing"] == "sigmoid_topk" and hy.moe["expert_groups"] is None
        assert hy.moe["renormalize"] and hy.moe["scale"] == 2.5 and hy.mlp_kinds == ["dense", "moe", "moe"]
    if "aria_text" in here:  # (its experts transposed; the top-k softmax in the model's dtype)
        aria = kinds["aria_text"].moe
        assert aria["layout"] == "transposed" and aria["routing"] == "topk_softmax"
        assert aria["shared_expert_size"] == 64
    if "afmoe" in here:  # (its bias the block's expert_bias; its router's gate Linear)
        afmoe = kinds["afmoe"]
        assert afmoe.moe["selection_bias"] and afmoe.moe["scale"] == 2.5
        assert afmoe.moe["expert_groups"] is None
        assert afmoe.mlp_kinds == ["dense", "moe", "moe"]
    if "beam" in here:  # (GLM-4.5's routing, its SwiGLU in float32 and its scale on the experts' sum)
        beam = kinds["beam"].moe
        assert beam["expert_groups"] == [2, 1] and beam["scale"] == 2.5 and beam["shared_expert_size"] is None
        assert {f for f in here if kinds[f].moe["float32_glu"]} == {"beam"}
    # (Beam's and Laguna's routed scale on the experts' sum, not the weights)
    assert {f for f in here if kinds[f].moe["scale_output"]} == {"beam", "laguna"} & set(here)
    if "llama4_text" in here:  # (the top-k logits' sigmoid scaling each expert's input; a shared expert)
        llama4 = kinds["llama4_text"]
        assert llama4.moe["routing"] == "topk_sigmoid" and llama4.moe["layout"] == "transposed"
        assert llama4.moe["shared_expert_size"] == 64 and not llama4.moe["renormalize"]
        assert {f for f in here if kinds[f].moe["scale_input"]} == {"llama4_text"}
        assert llama4.mlp_kinds == ["dense", "moe", "moe"]
    if "flint" in here:
        flint = kinds["flint"]
        assert flint.moe["routing"] == "sigmoid_topk" and flint.moe["shared_expert_size"] == 96
        assert flint.mlp_kinds == ["dense", "moe", "moe"] and all(s is not None for s in flint.attn_sinks)
    # (GraniteMoeShared's shared_intermediate_size 0: its layers' shared_mlp is None, no shared expert)
    assert (
        adapter_for(tiny_model("granitemoeshared", shared_intermediate_size=0)).spec.moe["shared_expert_size"]
        is None
    )
    for family in here:
        adapter = adapter_for(tiny_model(family))
        x = torch.randn(40, adapter.config.hidden_size, generator=torch.Generator().manual_seed(0))
        moe = next(m for m in adapter.moe if m is not None)
        _, experts = moe.route(x)
        assert set(experts.flatten().tolist()) == set(range(moe.num_experts)), family
        # routing margins wide enough that no pick is a near tie (among the scores the top k are chosen
        # by: plus the selection bias, within the groups kept)
        lin = moe.router_linear
        logits = torch.nn.functional.linear(x.to(lin.weight.dtype), lin.weight, getattr(lin, "bias", None))
        scores = torch.sigmoid(logits) if moe.routing == "sigmoid_topk" else torch.softmax(logits, -1)
        choice = moe._choice(scores.float()).sort(-1).values
        assert (choice[:, -2] - choice[:, -3]).min() > 1e-4, family


def test_the_spec_lists_by_layer_what_the_moe_layers_do_not_share():
    """HunYuan's per-layer ``moe_topk``: the spec names each layer's top-k, not only the first's."""
    varied = adapter_for(tiny_model("hunyuan_v1_moe", num_hidden_layers=3, moe_topk=[1, 3, 2])).spec.moe
    assert varied["top_k"] == 1 and varied["by_layer"] == {"top_k": [1, 3, 2]}
    assert "by_layer" not in adapter_for(tiny_model("hunyuan_v1_moe")).spec.moe
    mixed = adapter_for(tiny_model("qwen2_moe")).spec.moe  # (a dense layer between two alike MoE layers)
    assert "by_layer" not in mixed


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_grouped_and_dense_formulations_agree_with_the_hf_block(family):
    """Each formulation of each MoE layer against transformers' own block (its eager experts)."""
    model = tiny_model(family).double()
    adapter = adapter_for(model)
    x = torch.randn(2, 9, adapter.config.hidden_size, generator=torch.Generator().manual_seed(1)).double()
    for i, moe in enumerate(adapter.moe):
        if moe is None:
            continue
        with torch.no_grad():
            want = hf_mlp(adapter.layers[i], x)
            for formulation in ("grouped", "dense"):
                adapter.moe_formulation = formulation
                torch.testing.assert_close(adapter.mlp(i, x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "family", ["mixtral", "qwen2_moe", "granitemoeshared", "gpt_oss", "glm4_moe", "llama4_text"]
)
def test_a_ragged_batch_on_the_torch_executor_matches_transformers(family):
    """Three sequences in each step (prompt chunks of different lengths, then decodes together): each
    row's logits are transformers' for its sequence alone, whichever tokens share the experts."""
    model = tiny_model(family, seed=2).double()
    ex = TorchExecutor(model, num_blocks=32, block_size=4)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (11, 3, 7)]
    tables = [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19]]
    with torch.no_grad():
        want = [model(torch.tensor([s])).logits[0] for s in seqs]
    cuts = [(0, 6, 0, 2, 0, 7), (6, 10, 2, 3, 7, 7), (10, 11, None, None, None, None)]
    for lo0, hi0, lo1, hi1, lo2, hi2 in cuts:
        spans = [(0, lo0, hi0), (1, lo1, hi1), (2, lo2, hi2)]
        spans = [(b, lo, hi) for b, lo, hi in spans if lo is not None and hi > lo]
        slots = [[tables[b][p // 4] * 4 + p % 4 for p in range(lo, hi)] for b, lo, hi in spans]
        batch = StepBatch.build(
            [str(b) for b, _, _ in spans],
            [seqs[b][lo:hi] for b, lo, hi in spans],
            [lo for _, lo, _ in spans],
            [tables[b] for b, _, _ in spans],
            slots,
            [True] * len(spans),
        )
        got = ex.step(batch)
        for row, (b, _, hi) in enumerate(spans):
            torch.testing.assert_close(got[row], want[b][hi - 1].float(), rtol=1e-5, atol=1e-5)


def test_moe_executor_captures_cuda_graphs_only_where_the_fused_moe_kernels_run():
    """A MoE model the fused MoE kernels cannot run (here: float64) captures no CUDA graphs and says why;
    one they can run has no refusal (tests/llm/models/test_moe_fused.py: the reasons, the GPU runs)."""
    ex = TorchExecutor(tiny_model("mixtral").double(), num_blocks=8, block_size=4, static_decode=True)
    assert not ex.use_cuda_graphs
    assert ex.facts.cuda_graphs_refusal.startswith("MoE MLPs: each step routes its tokens")
    assert TorchExecutor(tiny_model("mixtral"), num_blocks=8, block_size=4).facts.cuda_graphs_refusal is None
    dense = TorchExecutor(tiny_model("llama"), num_blocks=8, block_size=4)
    assert dense.facts.cuda_graphs_refusal is None


@pytest.mark.parametrize("family", ["granitemoe", "granitemoeshared"])
def test_granite_moe_blocks_count_as_moe_mlps(family):
    """GraniteMoE's blocks (``block_sparse_moe``, a ``router`` rather than a ``gate``) count as MoE MLPs
    wherever a path checks for them: the fused layers gate on has_moe, the CUDA graphs on the fused MoE
    kernels, which run them (and refuse them in float64, saying why)."""
    model = tiny_model(family)
    assert adapter_for(model).has_moe
    assert all(m.fused_refusal() is None for m in adapter_for(model).moe if m is not None)
    ex = TorchExecutor(model.double(), num_blocks=8, block_size=4, static_decode=True)
    assert ex.facts.cuda_graphs_refusal.startswith("MoE MLPs: each step routes its tokens")


def test_paths_without_moe_support_refuse_moe_models_by_name(tmp_path):
    from trtforge.llm import from_pretrained
    from trtforge.llm.compile.compile import compile_generate
    from trtforge.llm.models.parallel import TensorParallel
    from trtforge.llm.quant import quantize_model

    model = tiny_model("qwen2_moe")
    moe = "qwen2_moe model Qwen2MoeForCausalLM has sparse mixture-of-experts MLPs"
    for method in ("fp8", "int4-rtn"):
        with pytest.raises(UserError, match=f"{moe}.*MoE MLPs have no such path yet"):
            quantize_model(model, method)
    with pytest.raises(UserError, match=f"quantization='fp8'.*{moe}"):
        from_pretrained(model, quantization="fp8", num_blocks=4)
    with pytest.raises(UserError, match=f"tensor parallelism .*{moe}"):
        adapter_for(model).shard(TensorParallel(0, 2))
    for precision in ("int8", "fp8", "int4"):
        calib = [[1, 2, 3]] if precision != "int4" else None
        with pytest.raises(UserError, match=f"--generate --precision {precision}: the {moe}"):
            compile_generate(
                model, None, precision=precision, calib_prompts=calib, build=False, save_onnx=tmp_path / "s"
            )
    assert not (tmp_path / "s").exists()


def test_experts_in_another_layout_are_refused():
    """Per-expert Linear modules (transformers 4's layout, never built by transformers 5) are refused by
    name rather than read wrong."""
    model = tiny_model("mixtral")
    block = model.model.layers[0].mlp
    block.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(4)])
    with pytest.raises(UserError, match="mixtral model MixtralForCausalLM: its experts .*fused 3-D"):
        TorchExecutor(model, num_blocks=4)


class _Unsupported(torch.nn.Module):
    """A causal LM of `model_type` as the family check sees it (its config's model_type)."""

    def __init__(self, model_type: str) -> None:
        import transformers as tf

        super().__init__()
        self.config = tf.AutoConfig.for_model(model_type)


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        ("phimoe", "SparseMixer"),
        ("deepseek_v3", "multi-head latent attention"),
        ("deepseek_v2", "multi-head latent attention"),
        ("jetmoe", "mixture of attention experts"),
        ("dbrx", "p-norm"),
    ],
)
def test_moe_families_not_implemented_are_refused_naming_what_sets_them_apart(model_type, why):
    model = _Unsupported(model_type)
    with pytest.raises(UserError, match=f"model family '{model_type}' .*not supported.*{why}"):
        adapter_for(model)


@pytest.mark.parametrize(
    ("family", "float32_router"),
    [
        ("mixtral", False),
        ("qwen2_moe", False),
        ("granitemoe", False),
        ("hunyuan_v1_moe", False),
        ("hunyuan_v1_moe", True),
        ("ernie4_5_moe", True),
        ("glm4_moe", True),
        ("cohere2_moe", False),  # (its sigmoid and renormalization in BF16)
        ("minimax_m2", False),  # (its logits in BF16, the sigmoid scores and weights in float32)
        ("hy_v3", True),  # (its float32 router; the shared expert added in float32)
        ("afmoe", False),  # (its router's logits in BF16, scored in float32)
        ("aria_text", False),
        ("llama4_text", False),  # (its sigmoid weights rounded to BF16 before they scale the experts' inputs)
        # (not Flint: transformers' eager Flint attention upcasts q, k to float32 for the scores, which
        # trtforge's BF16 reference attention takes in BF16; its float32 router is GLM-4.5's case)
    ],
)
def test_bfloat16_routing_weights_keep_each_familys_dtype(family, float32_router):
    """In BF16 the routing weights' dtype shows: Mixtral's stay float32 (each expert's output weighted in
    float32, then rounded), Qwen's are rounded to BF16 first. A BF16 prefill's logits are transformers'
    bit for bit (the other dtype moves them by a BF16 step or more). `float32_router`: the routers kept
    float32 in a BF16 model, as transformers builds HunYuan-MoE's ``wg`` and keeps ERNIE 4.5-MoE's and
    GLM-4.5's gate weight and selection bias (HunYuan's logits and weights then float32, ERNIE's weights
    cast to BF16, GLM's kept float32)."""
    model = tiny_model(family, seed=1).to(torch.bfloat16).eval()
    if float32_router:
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if hasattr(layer.mlp, "experts") and gate is not None:
                gate.float()
    ids = torch.randint(0, 300, (19,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids[None]).logits[0, -1].float()
    ex = TorchExecutor(model, num_blocks=8, block_size=4)
    batch = StepBatch.build(["s"], [ids.tolist()], [0], [list(range(5))], [list(range(19))], [True])
    torch.testing.assert_close(ex.step(batch)[0], want, rtol=0, atol=0)
