"""Torch paged executor: reference paged attention vs dense attention, and model logits vs transformers."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.llm.paged_metadata import mixed_metadata
from tests.llm.serving_models import tiny_llama
from tests.llm.tiny_models import KERNEL_FAMILIES, MOE_FAMILIES
from trtforge.errors import UserError
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.paged_attention import paged_attention_reference
from trtforge.llm.executors.torch_exec import TorchExecutor


def _dense(q, k, v, scale, window):
    """q [S, Hq, D] at the last S positions of k/v [L, Hkv, D]; plain loops, float64."""
    s_q, hq, _ = q.shape
    length, hkv, _ = k.shape
    out = torch.empty_like(q)
    for i in range(s_q):
        p = length - s_q + i
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(hq):
            kh = h // (hq // hkv)
            w = torch.softmax((k[lo : p + 1, kh] @ q[i, h]) * scale, dim=0)
            out[i, h] = w @ v[lo : p + 1, kh]
    return out


@pytest.mark.parametrize("window", [None, 7])
def test_paged_reference_matches_dense_attention_on_a_mixed_batch(window):
    g = torch.Generator().manual_seed(0)
    bs, hq, hkv, d, nblocks = 4, 4, 2, 8, 40
    k_pool = torch.randn(nblocks, bs, hkv, d, generator=g, dtype=torch.float64)
    v_pool = torch.randn(nblocks, bs, hkv, d, generator=g, dtype=torch.float64)
    ctx_lens, q_lens = [9, 5, 13, 1, 22], [1, 5, 6, 1, 1]
    meta, tables = mixed_metadata("cpu", g, bs, nblocks, ctx_lens, q_lens)
    qsl = meta.query_start_loc_host
    q = torch.randn(int(qsl[-1]), hq, d, generator=g, dtype=torch.float64)
    out = paged_attention_reference(q, k_pool, v_pool, meta, d**-0.5, window)
    for b, (c, t) in enumerate(zip(ctx_lens, tables)):
        k = k_pool[t].reshape(-1, hkv, d)[:c]
        v = v_pool[t].reshape(-1, hkv, d)[:c]
        lo, hi = qsl[b], qsl[b + 1]
        torch.testing.assert_close(
            out[lo:hi], _dense(q[lo:hi], k, v, d**-0.5, window), rtol=1e-10, atol=1e-10
        )


def _tiny(model_type: str, **overrides):
    import transformers

    torch.manual_seed(1)
    common = {
        "vocab_size": 120,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "initializer_range": 0.2,
    } | overrides
    if model_type == "mistral":
        cfg, cls = transformers.MistralConfig(sliding_window=6, **common), transformers.MistralForCausalLM
    elif model_type == "qwen2":
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    elif model_type == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=120, n_positions=256)
        cfg.initializer_range = 0.2
        cls = transformers.GPT2LMHeadModel
    elif model_type == "qwen3":
        cfg, cls = transformers.Qwen3Config(**({"head_dim": 8} | common)), transformers.Qwen3ForCausalLM
    elif model_type in (
        "gpt_neo",
        "gpt_bigcode",
        "gemma",
        "olmo2",
        "granite",
        "gpt_neox",
        "phi",
        "stablelm",
        "smollm3",
        "gemma3_text",
        "gemma2",
        "gptj",
        "codegen",
        "falcon",
        "falcon_40b",
        "falcon_serial",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "olmoe",
        "granitemoe",
        "granitemoeshared",
        "gpt_oss",
    ):
        from tests.llm.tiny_models import tiny_model

        return tiny_model(model_type, seed=1, vocab_size=120, **overrides).to(torch.float64).eval()
    elif model_type == "opt":
        opt = {"vocab_size": 120, "hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "init_std": 0.2}
        cfg = transformers.OPTConfig(num_attention_heads=4, max_position_embeddings=256, **(opt | overrides))
        cls = transformers.OPTForCausalLM
    elif model_type == "phi3":  # partial rotary (Phi-4-mini's 3/4) and a window shorter than the prompt
        phi3 = {"pad_token_id": 0, "partial_rotary_factor": 0.75, "sliding_window": 7}
        cfg, cls = transformers.Phi3Config(**(phi3 | common)), transformers.Phi3ForCausalLM
    else:
        return tiny_llama()
    return cls(cfg).to(torch.float64).eval()


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("llama", {}),
        ("mistral", {}),
        ("qwen2", {}),
        ("qwen3", {}),
        ("phi3", {}),
        ("gpt2", {}),
        ("opt", {}),
        ("opt", {"do_layer_norm_before": False, "word_embed_proj_dim": 24}),  # OPT-350m's form
        ("gpt_neo", {}),  # a local layer of 5 keys, shorter than the prompt
        ("gpt_bigcode", {}),
        ("gpt_bigcode", {"multi_query": False}),
        ("gemma", {}),  # head_dim 24 of hidden 64 / 4 heads
        ("gemma", {"head_dim": 12, "num_key_value_heads": 1}),  # Gemma 2B's one KV head
        ("olmo2", {}),
        ("granite", {}),  # every multiplier far from 1
        ("gpt_neox", {}),  # MHA, parallel residual, rotary on 1/4 of each head
        ("gpt_neox", {"use_parallel_residual": False, "rotary_pct": 0.5}),
        ("gpt_neox", {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25}}),
        ("phi", {}),  # GQA 4/2, rotary on 0.4 of each head
        ("phi", {"qk_layernorm": True, "partial_rotary_factor": 0.75}),
        ("phi", {"qk_layernorm": True, "num_key_value_heads": 4}),  # MHA
        ("gemma3_text", {}),  # sliding (window 4) then full layer, a RoPE base each, soft-capped logits
        ("gemma2", {}),  # sliding then full layer, attention scores soft-capped at 3, logits at 8
        (  # one KV head, the scores capped at 2, the logits not at all
            "gemma2",
            {"num_key_value_heads": 1, "attn_logit_softcapping": 2.0, "final_logit_softcapping": None},
        ),
        (  # one KV head, full then sliding layers, a linear-scaled global RoPE (Gemma 3 4B's form)
            "gemma3_text",
            {
                "num_key_value_heads": 1,
                "num_hidden_layers": 3,
                "sliding_window": 6,
                "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                },
            },
        ),
        ("stablelm", {}),  # per-head q/k LayerNorm, q/k/v biases, rotary on 1/4 of each head, sequential
        ("stablelm", {"use_parallel_residual": True, "partial_rotary_factor": 0.5}),
        ("stablelm", {"qk_layernorm": False, "use_qkv_bias": False, "use_parallel_residual": True}),
        ("stablelm", {"num_key_value_heads": 4, "partial_rotary_factor": 1.0}),  # MHA, full rotary
        ("smollm3", {}),  # layer 1 of 2 NoPE
        ("smollm3", {"num_hidden_layers": 3, "no_rope_layers": [0, 1, 0]}),  # NoPE around a RoPE layer
        # a window on the NoPE layer (layer_types' default with use_sliding_window)
        ("smollm3", {"sliding_window": 5, "use_sliding_window": True, "num_hidden_layers": 3}),
        # hostile shapes: head_dim not hidden/heads, MHA (GQA ratio 1) and ratio 4, tied embeddings
        ("qwen3", {"head_dim": 12, "num_key_value_heads": 4, "tie_word_embeddings": True}),
        (
            "qwen3",
            {
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "use_sliding_window": True,
                "sliding_window": 5,
                "max_window_layers": 1,
            },
        ),
        ("phi3", {"head_dim": 12, "num_key_value_heads": 4, "tie_word_embeddings": True}),
        ("phi3", {"num_attention_heads": 8, "num_key_value_heads": 2, "partial_rotary_factor": 1.0}),
        ("gptj", {}),  # interleaved rotary on half of each head, one LayerNorm, LM-head bias
        ("gptj", {"rotary_dim": 16, "n_head": 4}),  # every channel of each head rotated
        ("codegen", {}),  # the per-shard fused projection, 2 heads a shard
        ("falcon", {}),  # falcon-7b: multi-query, parallel, one LayerNorm
        ("falcon_40b", {}),  # 2 KV groups, ln_attn and ln_mlp
        ("falcon_40b", {"num_ln_in_parallel_attn": 1, "num_attention_heads": 8}),  # Falcon2-11B's one norm
        ("falcon_serial", {}),  # per-head fused QKV with biases, post_attention_layernorm
        ("falcon", {"parallel_attn": False}),  # multi-query, serial
        # sparse MoE MLPs, each expert on its own tokens: 4 experts, top-2 (every routing form below)
        ("mixtral", {}),  # renormalized float32 routing weights
        ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 3, "sliding_window": 5}),
        ("qwen2_moe", {}),  # the gated shared expert; layer 1 of 3 dense
        ("qwen2_moe", {"norm_topk_prob": True, "decoder_sparse_step": 2, "mlp_only_layers": []}),
        ("qwen3_moe", {}),  # per-head q/k norms; the middle layer of 3 sparse
        ("qwen3_moe", {"num_experts_per_tok": 1, "decoder_sparse_step": 1}),  # top-1: every layer sparse
        ("olmoe", {}),  # whole-projection q/k norms, clip_qkv
        ("olmoe", {"clip_qkv": None, "norm_topk_prob": True, "num_key_value_heads": 4}),
        ("granitemoe", {}),  # top-k of the logits, then a softmax over the k; Granite's multipliers
        ("granitemoeshared", {"num_experts_per_tok": 1}),  # top-1 (weight 1) with the shared MLP
        ("gpt_oss", {}),  # attention sinks, sliding (window 4) and full layers, the clamped SwiGLU experts
        ("gpt_oss", {"num_experts_per_tok": 1, "sliding_window": 3, "num_key_value_heads": 1}),
        # (HunYuan-MoE, ERNIE 4.5-MoE, GLM-4.5, dots.llm1, FlexOLMo, K-EXAONE: test_config_variants runs
        # these chunked paged steps on their config draws)
    ],
)
def test_chunked_paged_steps_reproduce_transformers_logits(model_type, overrides):
    model = _tiny(model_type, **overrides)
    if "head_dim" in overrides:
        attn = model.model.layers[0].self_attn
        assert attn.head_dim == overrides["head_dim"], "the config's head_dim did not reach the model"
    if overrides.get("tie_word_embeddings"):
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ex = TorchExecutor(model, num_blocks=16, block_size=4)
    ids = torch.randint(0, model.config.vocab_size, (1, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits[0]
    blocks = [11, 3, 7, 0, 14]  # scattered on purpose
    got = []
    for lo, hi in ((0, 6), (6, 15), (15, 16), (16, 17), (17, 19)):  # prompt chunks, then decode-sized steps
        slots = [blocks[p // 4] * 4 + p % 4 for p in range(lo, hi)]
        batch = StepBatch.build(["s"], [ids[0, lo:hi].tolist()], [lo], [blocks], [slots], [True])
        got.append(ex.step(batch)[0])
    expected = ref[[5, 14, 15, 16, 18]].float()
    torch.testing.assert_close(torch.stack(got), expected, rtol=1e-5, atol=1e-5)


def test_unsupported_models_and_bad_sizes_are_user_errors():
    import transformers

    config = {"num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}
    diffllama = transformers.DiffLlamaForCausalLM(  # no adapter: refused saying why
        transformers.DiffLlamaConfig(**config, vocab_size=50)
    )
    why = "DiffLlama's differential attention subtracts a second softmax map"
    with pytest.raises(UserError, match=f"family 'diffllama' .*not supported by the torch executor.*{why}"):
        TorchExecutor(diffllama, num_blocks=4)
    bare = transformers.LlamaModel(tiny_llama().config)  # no lm_head: was an AttributeError
    with pytest.raises(UserError, match="LlamaModel has no lm_head: the torch executor needs the causal-LM"):
        TorchExecutor(bare, num_blocks=4)
    gpt2 = _tiny("gpt2")  # learned positions cannot run past n_positions: was an IndexError mid-generation
    with pytest.raises(UserError, match="max_model_len 300 exceeds the 256 learned positions"):
        TorchExecutor(gpt2, num_blocks=4, max_model_len=300)
    with pytest.raises(UserError, match="max_model_len 300 exceeds the 256 learned positions"):
        TorchExecutor(_tiny("opt"), num_blocks=4, max_model_len=300)  # (OPT's table holds 2 more rows)
    gptj = _tiny("gptj")  # GPT-J's sinusoid table has n_positions rows: past them HF's forward fails too
    with pytest.raises(UserError, match="max_model_len 300 exceeds the 256 rows of the rotary table of this"):
        TorchExecutor(gptj, num_blocks=4, max_model_len=300)
    with pytest.raises(UserError, match="max_model_len must be a positive integer"):
        TorchExecutor(tiny_llama(), num_blocks=4, max_model_len=-1)
    with pytest.raises(UserError, match="num_blocks must be a positive integer"):
        TorchExecutor(tiny_llama(), num_blocks=0)
    with pytest.raises(UserError, match="block_size must be a positive integer, got True"):
        TorchExecutor(tiny_llama(), num_blocks=4, block_size=True)


def test_sizes_take_numpy_integers_as_the_other_executors_do():
    """errors.is_int, the API's one rule for an integer option: the ONNX Runtime and TensorRT executors
    take np.int64 sizes; the torch executor refused them ("num_blocks must be a positive integer, got 8")."""
    ex = TorchExecutor(
        tiny_llama(), num_blocks=np.int64(8), block_size=np.int64(4), max_model_len=np.int64(32)
    )
    facts = ex.facts
    assert (facts.num_blocks, facts.block_size, facts.max_model_len) == (8, 4, 32)
    assert all(type(v) is int for v in (facts.num_blocks, facts.block_size, facts.max_model_len))


@pytest.mark.parametrize(
    ("scaling", "reach", "where"),
    [
        (None, 64, "max_position_embeddings in its config; its rotary is not scaled"),
        (
            {"rope_type": "linear", "factor": 2.0},
            128,
            "max_position_embeddings 64 x the factor 2 of its linear",
        ),
        (
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
            256,
            "original_max_position_embeddings 64 x the factor 4 of its yarn",
        ),
        ({"rope_type": "dynamic", "factor": 2.0}, None, None),  # (its base grows with the length: no limit)
        (  # (Llama 3.1's shape: max_position_embeddings already the extended length)
            {"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 16},
            64,
            "max_position_embeddings in its config (llama3 rotary scaling included)",
        ),
    ],
)
def test_a_rotary_max_model_len_past_the_positions_the_model_is_made_for_is_refused(scaling, reach, where):
    """Before: a rotary model took any max_model_len (`trtforge serve --max-model-len 100000` started on a
    2048-position model) and ran into positions it never saw; a rotary scaling extends the limit."""
    import transformers

    kw = {"rope_scaling": scaling} if scaling else {}
    if scaling and scaling["rope_type"] == "llama3":
        kw["rope_scaling"] = scaling | {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = transformers.LlamaConfig(
        vocab_size=120,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **kw,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    if reach is None:
        assert TorchExecutor(model, num_blocks=4, max_model_len=100_000).facts.max_model_len == 100_000
        return
    assert TorchExecutor(model, num_blocks=4, max_model_len=reach).facts.max_model_len == reach
    refused = rf"max_model_len {reach + 1} exceeds the {reach} positions .*{re.escape(where)}"
    with pytest.raises(UserError, match=refused):
        TorchExecutor(model, num_blocks=4, max_model_len=reach + 1)


def test_static_shape_decode_gives_the_same_tokens_as_the_eager_path():
    from tests.llm.serving_models import run_to_completion
    from trtforge.llm.engine import make_step_loop
    from trtforge.llm.sampling import SamplingParams

    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 300, size=int(rng.integers(1, 40))).tolist() for _ in range(11)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 12)), ignore_eos=True) for _ in prompts]
    outs = []
    for static in (False, True):
        ex = TorchExecutor(
            tiny_llama(), num_blocks=128, block_size=4, static_decode=static, max_decode_batch=8
        )
        sched = make_step_loop(ex)
        for i, (p, sp) in enumerate(zip(prompts, params)):
            sched.add_request(i, p, sp)
        outs.append({k: v.output_token_ids for k, v in run_to_completion(sched).items()})
    assert outs[0] == outs[1]
    assert ex.static_decode and not ex.use_cuda_graphs  # on the CPU the static path runs without graphs
    assert ex._static, "no decode step took the static path"


@pytest.mark.gpu
@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_cuda_graph_decode_matches_eager_on_cuda(family):
    from tests.llm.serving_models import run_to_completion
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.engine import make_step_loop
    from trtforge.llm.sampling import SamplingParams

    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 300, size=int(rng.integers(1, 60))).tolist() for _ in range(20)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 30)), ignore_eos=True) for _ in prompts]
    outs, graphs = [], 0
    other = None if family == "llama" else tiny_model(family, max_position_embeddings=512).double()
    if family in MOE_FAMILIES:  # FP32: the fused MoE kernels (which CUDA graphs can hold) take no float64
        other = other.float()
    for static in (False, True):
        model = (tiny_llama() if other is None else other).to("cuda")
        ex = TorchExecutor(model, num_blocks=256, block_size=16, static_decode=static)
        sched = make_step_loop(ex)
        for i, (p, sp) in enumerate(zip(prompts, params)):
            sched.add_request(i, p, sp)
        outs.append({k: v.output_token_ids for k, v in run_to_completion(sched).items()})
        graphs = ex.num_cuda_graphs
        tiny_llama().to("cpu")
    assert outs[0] == outs[1]
    assert ex.cuda_graphs_refusal is None and graphs > 0  # gpt-oss too: its experts run the fused kernels


@pytest.mark.gpu
def test_async_scheduling_with_cuda_graphs_gives_the_synchronous_outputs_on_cuda():
    """On the device for real: ids fed from the device between the staged copy and the graph replay,
    double-buffered staging, pinned token copies; greedy and seeded sampling, staggered arrivals."""
    from trtforge.llm.engine import make_step_loop
    from trtforge.llm.sampling import SamplingParams
    from trtforge.llm.sched.scheduler import SchedulerConfig

    rng = np.random.default_rng(9)
    reqs = []
    for i in range(40):
        sampling = {"temperature": 0.9, "top_p": 0.95, "seed": i} if i % 3 == 0 else {}
        params = SamplingParams(max_tokens=int(rng.integers(1, 40)), ignore_eos=True, **sampling)
        reqs.append(
            (
                int(rng.integers(0, 30)),
                i,
                rng.integers(0, 300, size=int(rng.integers(1, 60))).tolist(),
                params,
            )
        )
    outs, graphs = [], 0
    model = tiny_llama().to("cuda")
    try:
        for async_scheduling in (False, True):
            ex = TorchExecutor(model, num_blocks=256, block_size=16, static_decode=True, max_decode_batch=32)
            config = SchedulerConfig(max_num_seqs=32, max_prefill_chunk=32, async_scheduling=async_scheduling)
            sched = make_step_loop(ex, config)
            assert sched.async_scheduling is async_scheduling
            step, pending, done = 0, sorted(reqs, key=lambda r: r[0]), {}
            while pending or sched.has_unfinished():
                while pending and pending[0][0] <= step:
                    _, rid, prompt, params = pending.pop(0)
                    sched.add_request(rid, prompt, params)
                done.update({o.request_id: o.output_token_ids for o in sched.step() if o.finished})
                step += 1
            outs.append(done)
            graphs = ex.num_cuda_graphs
            assert sched.memory_stats().free_blocks == 256
    finally:
        tiny_llama().to("cpu")
    assert outs[0] == outs[1] and len(outs[0]) == 40
    assert graphs > 0


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.float16, 3e-2)])
def test_float32_and_float16_pools_track_the_float64_logits(dtype, tol):
    import copy

    model = copy.deepcopy(tiny_llama())
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids).logits[0, [7, 11]].float()
    ex = TorchExecutor(model, num_blocks=8, block_size=4, dtype=dtype)
    assert ex.k_pools[0].dtype == dtype
    blocks = [5, 2, 6]
    got = []
    for lo, hi in ((0, 8), (8, 12)):
        slots = [blocks[p // 4] * 4 + p % 4 for p in range(lo, hi)]
        got.append(
            ex.step(StepBatch.build(["s"], [ids[0, lo:hi].tolist()], [lo], [blocks], [slots], [True]))[0]
        )
    torch.testing.assert_close(torch.stack(got), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_step_async_takes_fed_ids_from_the_previous_tokens(static):
    """Decode and mixed steps whose ids come from a token tensor give the logits of the true ids."""
    import dataclasses

    from trtforge.llm.executors.base import TokenFeed

    plain, fed = (
        TorchExecutor(tiny_llama(), num_blocks=16, block_size=4, static_decode=static) for _ in "ab"
    )
    tables = {"a": [0, 1], "b": [2, 5], "c": [3, 4], "d": [6]}

    def batch(rows):  # rows: (sequence, its new tokens, first position)
        seqs = [r[0] for r in rows]
        slots = [
            [tables[s][p // 4] * 4 + p % 4 for p in range(start, start + len(t))] for s, t, start in rows
        ]
        return StepBatch.build(
            seqs,
            [r[1] for r in rows],
            [r[2] for r in rows],
            [tables[s] for s in seqs],
            slots,
            [True] * len(rows),
        )

    prefill = batch([("a", [5, 6, 7, 8, 9], 0), ("b", [10, 11, 12], 0), ("c", [1, 2, 3, 4, 5, 6], 0)])
    assert torch.equal(plain.step(prefill), fed.step_async(prefill, None))
    previous = torch.tensor([40, 41, 42, 43])
    decode = batch([("a", [41], 5), ("b", [43], 3), ("c", [40], 6)])
    placeholders = dataclasses.replace(decode, input_ids=np.array([0, 0, 40]))
    feed = TokenFeed(rows=np.array([0, 1]), sources=np.array([1, 3]), tokens=previous)
    assert torch.equal(plain.step(decode), fed.step_async(placeholders, feed))
    assert placeholders.input_ids.tolist() == [0, 0, 40], "the batch's own array was written"
    mixed = batch([("a", [42], 6), ("b", [40], 4), ("d", [7, 8, 9], 0)])
    placeholders = dataclasses.replace(mixed, input_ids=np.array([0, 0, 7, 8, 9]))
    feed = TokenFeed(rows=np.array([0, 1]), sources=np.array([2, 0]), tokens=previous)
    assert torch.equal(plain.step(mixed), fed.step_async(placeholders, feed))
    assert bool(fed._static) == static


def _dynamic_llama(max_positions: int = 8):
    """A float64 Llama with dynamic NTK rotary whose original length is short, so prompts cross it."""
    import transformers

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(
        vocab_size=120,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=0.2,
        rope_scaling={"rope_type": "dynamic", "factor": 4.0},
    )
    model = transformers.LlamaForCausalLM(cfg).to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _hf_alone(model, prompt: list[int], new: int):
    """HF greedy on a fresh copy (its dynamic rotary keeps state across calls): tokens, logits [new, V]."""
    import copy

    from tests.llm.tiny_models import hf_greedy

    return hf_greedy(copy.deepcopy(model), prompt, new)


@pytest.mark.parametrize("static", [False, True])  # static decode falls back to eager steps
def test_dynamic_rotary_gives_each_batched_sequence_its_logits_when_run_alone(static):
    model = _dynamic_llama()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 120, (n,), generator=g).tolist() for n in (3, 13, 6)]
    new = 7  # the short prompts cross max_position_embeddings (8) while decoding
    expected = [_hf_alone(model, p, new) for p in prompts]
    ex = TorchExecutor(model, num_blocks=24, block_size=4, max_model_len=32, static_decode=static)
    assert (
        ex.facts.kv_depends_on_prompt_len and not ex.static_decode and ex.path_of(_decode_batch()) == "eager"
    )
    # by default the trained length (8) times the scaling factor (4): dynamic scaling's point
    assert TorchExecutor(model, num_blocks=4, block_size=4).facts.max_model_len == 32
    blocks = [list(range(i * 8, i * 8 + 8)) for i in range(len(prompts))]
    seqs = [list(p) for p in prompts]
    got: list[list[torch.Tensor]] = [[] for _ in prompts]
    starts = [0] * len(prompts)
    for _ in range(new):  # step 0 prefills every prompt in one batch, then all decode together
        tokens = [s[st:] for s, st in zip(seqs, starts)]
        slots = [[t[p // 4] * 4 + p % 4 for p in range(st, len(s))] for t, s, st in zip(blocks, seqs, starts)]
        batch = StepBatch.build(range(len(seqs)), tokens, starts, blocks, slots, [True] * len(seqs))
        logits = ex.step(batch)
        for b, row in enumerate(logits):
            got[b].append(row)
            starts[b] = len(seqs[b])
            seqs[b].append(int(row.argmax()))
    for b, (tokens, ref) in enumerate(expected):
        assert seqs[b][len(prompts[b]) :] == tokens, f"sequence {b}"
        torch.testing.assert_close(torch.stack(got[b]), ref, rtol=1e-6, atol=1e-6)


def _decode_batch() -> StepBatch:
    return StepBatch.build(["s"], [[5]], [3], [[0]], [[3]], [True])


@pytest.mark.parametrize(
    ("num_blocks", "chunk"),
    [(64, 512), (64, 4), (11, 512)],  # one-step prompts; prompts cut into 4-token chunks; preemptions
)
def test_dynamic_rotary_batched_serving_matches_transformers_alone(num_blocks, chunk):
    """A prompt's tokens rotate by the whole prompt's length however the scheduler cuts or recomputes it;
    prompts sharing a prefix do not share its blocks (their keys differ)."""
    from trtforge.llm import service
    from trtforge.llm.sched.scheduler import SchedulerConfig

    model = _dynamic_llama()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 120, (n,), generator=g).tolist() for n in (2, 11, 5, 9)]
    prompts.append([*prompts[1][:10], 7, 8, 9])  # shares 10 tokens (2 blocks) with prompt 1
    config = SchedulerConfig(max_prefill_chunk=chunk, max_num_batched_tokens=max(chunk, 16))
    llm = service.from_pretrained(model, num_blocks=num_blocks, block_size=4, max_model_len=40, config=config)
    got = llm.generate(prompts, max_new_tokens=12, stop_at_eos=False)
    assert got == [_hf_alone(model, p, 12)[0] for p in prompts]
    stats = llm.stats
    assert stats.prefix_hit_tokens == 0
    assert (stats.preemptions > 0) == (num_blocks == 11)
