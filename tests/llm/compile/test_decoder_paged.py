"""The paged step graph: HF logits through pools with randomly placed blocks, and the slot mask contract."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.llm.tiny_models import HOSTILE_SHAPES, hf_greedy, prompts, tiny_model
from trtforge.errors import UserError
from trtforge.llm.compile.export import export_step
from trtforge.llm.executors import OrtPagedExecutor
from trtforge.llm.executors.base import StepBatch

NEW_TOKENS = 12
BLOCK = 4


def _export(model, tmp_path, exporter="legacy"):
    result = export_step(
        model, max_seq=64, max_batch=4, max_prefill=32, exporter=exporter, workdir=tmp_path,
        cache_layout="paged", block_size=BLOCK,
    )  # fmt: skip
    assert result.exporter == exporter and result.fallback_reason is None
    path = tmp_path / "step.onnx"
    onnx.save(result.model, str(path))
    return path, result


def _assert_hf_greedy(ex, model, family):
    """Greedy decoding of ragged prompts through `ex` (stale pool garbage, scattered blocks) gives HF's
    logits and tokens at every step."""
    rng = np.random.default_rng(7)
    ex.pools = {n: rng.standard_normal(p.shape).astype(p.dtype) for n, p in ex.pools.items()}  # stale garbage
    batch = prompts(model.config.vocab_size)
    refs = [hf_greedy(model, p, NEW_TOKENS) for p in batch]
    need = [-(-(len(p) + NEW_TOKENS) // BLOCK) for p in batch]
    placement = rng.permutation(ex.facts.num_blocks)[: sum(need)].tolist()  # scattered, in no order
    tables = [placement[sum(need[:b]) : sum(need[: b + 1])] for b in range(len(batch))]

    def slots(b, start, n):
        return [tables[b][p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + n)]

    tokens, starts = [list(p) for p in batch], [0] * len(batch)
    for step in range(NEW_TOKENS):
        sb = StepBatch.build(
            seq_ids=list(range(len(batch))),
            tokens=tokens,
            start_positions=starts,
            block_tables=tables,
            slots=[slots(b, starts[b], len(t)) for b, t in enumerate(tokens)],
            want_logits=[True] * len(batch),
        )
        logits = ex.step(sb)
        for b, (want_ids, want_logits) in enumerate(refs):
            err = float(np.abs(logits[b] - want_logits[step].numpy()).max())
            assert err <= 1e-4, f"{family} row {b} step {step}: max abs err {err}"
            assert int(logits[b].argmax()) == want_ids[step]
        starts = [s + len(t) for s, t in zip(starts, tokens)]
        tokens = [[want_ids[step]] for want_ids, _ in refs]


@pytest.mark.parametrize(
    ("family", "exporter"),
    [
        ("llama", "legacy"),
        ("gpt2", "legacy"),
        ("qwen3", "legacy"),
        ("phi3", "legacy"),
        ("gpt_neox", "legacy"),
        ("phi", "legacy"),
        pytest.param("llama", "dynamo", marks=pytest.mark.slow),
    ],
)
def test_paged_graph_matches_hf_logits_with_random_block_placement(family, exporter, tmp_path):
    model = tiny_model(family)
    path, result = _export(model, tmp_path, exporter)
    nodes = result.model.graph.node
    layers = result.generation["num_layers"]
    assert sum(n.op_type == "ScatterND" for n in nodes) == 2 * layers
    assert sum(n.op_type == "Attention" for n in nodes) == layers
    assert sum(n.op_type == "Gather" and n.input[1] == "block_tables" for n in nodes) == 2 * layers
    assert "TensorScatter" not in {n.op_type for n in nodes}
    cache = result.generation["cache"]
    assert cache["layout"] == "paged" and cache["block_size"] == BLOCK
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, family)


@pytest.mark.parametrize(("family", "overrides"), HOSTILE_SHAPES)
def test_paged_graph_matches_hf_on_hostile_qwen3_and_phi3_shapes(family, overrides, tmp_path):
    """head_dim other than hidden / heads, GQA ratios 1 and 4, tied embeddings (HOSTILE_SHAPES)."""
    model = tiny_model(family, seed=5, **overrides)
    path, result = _export(model, tmp_path)
    assert result.generation["head_dim"] == model.model.layers[0].self_attn.head_dim
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, family)


def test_paged_graph_refuses_bad_layout_options(tmp_path):
    model = tiny_model("llama")
    with pytest.raises(UserError, match="cache_layout"):
        export_step(model, max_seq=16, exporter="legacy", workdir=tmp_path, cache_layout="ring")
    with pytest.raises(UserError, match="block_size"):
        export_step(model, max_seq=16, workdir=tmp_path, cache_layout="paged", block_size=0)


def test_paged_executor_refuses_a_slot_graph(tmp_path):
    model = tiny_model("llama").train()
    model.model.layers.eval()  # a train-mode model holding eval-mode layers keeps each one's mode
    result = export_step(model, max_seq=16, max_batch=2, exporter="legacy", workdir=tmp_path)
    assert model.training and not model.model.layers[0].training and not model.model.layers[0].mlp.training
    path = tmp_path / "slot.onnx"
    onnx.save(result.model, str(path))
    with pytest.raises(UserError, match="paged"):
        OrtPagedExecutor(path)


def test_executor_copies_blocks_before_writing_and_keeps_pools(tmp_path):
    path, _ = _export(tiny_model("llama"), tmp_path)
    ex = OrtPagedExecutor(path, num_blocks=12)
    rng = np.random.default_rng(3)
    ex.pools = {n: rng.standard_normal(p.shape).astype(p.dtype) for n, p in ex.pools.items()}
    before = {n: p.copy() for n, p in ex.pools.items()}
    # copy block 3 -> 5 (copy-on-write), then write two tokens into block 5's first two slots
    batch = StepBatch.build(["a"], [[7, 8]], [0], [[5]], [[5 * BLOCK, 5 * BLOCK + 1]], [True], [(3, 5)])
    ex.step(batch)
    for name, pool in ex.pools.items():
        assert np.array_equal(pool[5, 2:], before[name][3, 2:]), name
        assert not np.array_equal(pool[5, :2], before[name][3, :2]), name
        untouched = [b for b in range(ex.facts.num_blocks + 1) if b != 5]
        assert np.array_equal(pool[untouched], before[name][untouched]), name
    with pytest.raises(UserError, match="max_model_len"):
        OrtPagedExecutor(path, max_model_len=65)
    with pytest.raises(UserError, match="num_blocks"):
        OrtPagedExecutor(path, num_blocks=0)


@pytest.mark.parametrize(
    ("family", "overrides", "exporter"),
    [
        ("llama", {}, "legacy"),
        ("qwen2", {}, "legacy"),
        ("gpt2", {}, "legacy"),
        ("qwen3", {}, "legacy"),
        ("phi3", {}, "legacy"),
        ("gpt_neox", {"use_parallel_residual": False}, "legacy"),
        ("phi", {"qk_layernorm": True}, "legacy"),
        ("mistral", {"sliding_window": 4096}, "legacy"),  # a window longer than max_seq masks nothing
        # Laguna's 4, 8 and 2 query heads (each layer's node its own num_heads) and its gate; no window
        ("laguna", {"layer_types": ["full_attention"] * 3}, "legacy"),
        pytest.param("llama", {}, "dynamo", marks=pytest.mark.slow),
    ],
)
def test_optimize_paged_strategy_fuses_every_layer_and_generates_the_same(
    family, overrides, exporter, tmp_path
):
    """`optimize --attention paged` on the paged step graph: one PagedAttention node per layer, ORT
    (exact) agrees with the original (the pass manager's check and ours on valid ragged feeds), and
    greedy generation through the optimized graph gives HF's tokens."""
    from trtforge.llm.compile.export import example_feeds
    from trtforge.numerics.sessions import exact_session
    from trtforge.passes.pipeline import optimize_model

    model = tiny_model(family, **overrides)
    _, result = _export(model, tmp_path, exporter)
    out, ledger = optimize_model(result.model, attention="paged", debug=True)
    layers = result.generation["num_layers"]
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("PagedAttention") == layers
    assert not {"ScatterND", "Attention"} & set(ops)
    assert ledger.matches("attention") == layers
    for record in ledger.to_dict()["passes"]:
        assert record["verification"]["max_abs_error"] <= 1e-4, record["name"]
    for batch, seq in ((3, 5), (2, 1)):  # ragged right-padded prefill (scratch slot), then decode shapes
        feeds = {k: v.numpy() for k, v in example_feeds(result.generation, batch=batch, seq=seq).items()}
        before = exact_session(result.model).run(None, feeds)
        after = exact_session(out).run(None, feeds)
        for name, x, y in zip([o.name for o in out.graph.output], before, after):
            assert np.abs(x - y).max() <= 1e-4, name
    path = tmp_path / "optimized.onnx"
    onnx.save(out, str(path))
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, family)


def test_optimize_paged_strategy_refuses_sliding_window_layers(tmp_path):
    """A window shorter than max_seq: every layer is refused with its reason (from the step graph's
    metadata, or from the mask's lower bound when the metadata is gone), and the graph is unchanged."""
    from trtforge.passes.pipeline import optimize_model

    _, result = _export(tiny_model("mistral", sliding_window=8), tmp_path)
    stripped = onnx.ModelProto()
    stripped.CopyFrom(result.model)
    del stripped.metadata_props[:]
    for graph, reason in ((result.model, "sliding window of 8 tokens"), (stripped, "bounds key positions")):
        out, ledger = optimize_model(graph, passes=["attention"], attention="paged", debug=True)
        assert [n.op_type for n in out.graph.node].count("Attention") == 2
        attention = next(p for p in ledger.to_dict()["passes"] if p["name"] == "attention")
        assert attention["matches"] == 0
        assert len([r for r in attention["rejected"] if reason in r]) == 2, attention["rejected"]


def test_optimize_paged_strategy_refuses_a_step_graph_whose_metadata_is_damaged(tmp_path):
    """Metadata that is not a JSON object was read as no metadata, so a window the paged kernels cannot
    mask went unrefused when the mask's bound was not found either; now it is a UserError naming the key."""
    from trtforge.errors import UserError
    from trtforge.passes.pipeline import optimize_model

    _, result = _export(tiny_model("mistral", sliding_window=8), tmp_path)
    for text, what in (('{"sliding_windows": [8, 8', "not valid JSON"), ("[8, 8]", "not a JSON object")):
        damaged = onnx.ModelProto()
        damaged.CopyFrom(result.model)
        next(p for p in damaged.metadata_props if p.key == "trtforge.generation").value = text
        with pytest.raises(UserError, match=f"'trtforge.generation' metadata is {what}"):
            optimize_model(damaged, passes=["attention"], attention="paged", debug=True)


def test_llama4_paged_graph_matches_hf_and_the_paged_strategy_refuses_its_chunked_layers(tmp_path):
    """Llama 4's chunked layers in the paged step graph (chunks of 8: the prompts and generations cross
    several) give HF's greedy logits in ONNX Runtime; `optimize --attention paged` fuses its one full layer
    and refuses its two chunked layers by their chunk, read from the graph's metadata (the paged kernels
    have no chunk mask), with the pass manager's check exact, whole pipeline or the attention pass alone."""
    from trtforge.passes.pipeline import optimize_model

    model = tiny_model("llama4_text")
    path, result = _export(model, tmp_path)
    assert result.generation["attention_chunks"] == [8, None, 8]
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, "llama4_text")
    chunked = "attends in chunks of 8 positions (attention_chunk_size, shorter than the step graph's max_seq"
    for passes in (None, ["attention"]):
        out, ledger = optimize_model(result.model, passes=passes, attention="paged", debug=True)
        ops = [n.op_type for n in out.graph.node]
        assert (ops.count("PagedAttention"), ops.count("Attention")) == (1, 2), passes
        records = ledger.to_dict()["passes"]
        attention = next(p for p in records if p["name"] == "attention")
        assert len([r for r in attention["rejected"] if chunked in r]) == 2, attention["rejected"]
        assert all(r["verification"]["max_abs_error"] <= 1e-4 for r in records), records


def test_the_paged_strategy_alone_on_an_exported_graph_fuses_and_serializes(tmp_path):
    """`optimize --passes attention --attention paged` on the step graph as exported (no cleanup first, so
    its values carry no types): the rewrite's new values of unknown element type are left untyped rather
    than failing serialization, every layer fuses, ORT (exact) agrees, and greedy decoding gives HF's."""
    from trtforge.passes.pipeline import optimize_model

    model = tiny_model("smollm3")
    _, result = _export(model, tmp_path)
    out, ledger = optimize_model(result.model, passes=["attention"], attention="paged")
    assert [n.op_type for n in out.graph.node].count("PagedAttention") == result.generation["num_layers"]
    assert ledger.to_dict()["passes"][0]["verification"]["max_abs_error"] <= 1e-4
    path = tmp_path / "optimized.onnx"
    onnx.save(out, str(path))
    _assert_hf_greedy(OrtPagedExecutor(path, num_blocks=40), model, "smollm3")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_optimize_paged_strategy_fuses_the_fp16_graph_compile_saves(family, tmp_path):
    """The FP16 paged step graph `compile --generate --cache-layout paged --save-onnx` writes (passes
    run, then FP16): one PagedAttention per layer, the attention pass's ORT check exact, and the pool
    outputs keep their names and the graph its generation metadata."""
    from trtforge.llm.compile.compile import compile_generate
    from trtforge.llm.compile.export import example_feeds
    from trtforge.llm.contract import generation_metadata
    from trtforge.numerics.sessions import exact_session
    from trtforge.passes.pipeline import optimize_model

    saved = tmp_path / "step_fp16.onnx"
    compile_generate(
        tiny_model(family), None, build=False, save_onnx=saved, precision="fp16", max_seq=64,
        max_batch=4, exporter="legacy", cache_layout="paged", block_size=16,
    )  # fmt: skip
    original = onnx.load(str(saved))
    out, ledger = optimize_model(original, attention="paged", debug=True)
    generation = generation_metadata(out, str(saved))
    layers = generation["num_layers"]
    assert [n.op_type for n in out.graph.node].count("PagedAttention") == layers
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    attention = next(p for p in ledger.to_dict()["passes"] if p["name"] == "attention")
    assert attention["matches"] == layers and attention["verification"]["max_abs_error"] == 0.0
    feeds = {k: v.numpy() for k, v in example_feeds(generation, batch=3, seq=5).items()}
    feeds = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    for name, x, y in zip(
        [o.name for o in out.graph.output],
        exact_session(original).run(None, feeds),
        exact_session(out).run(None, feeds),
    ):
        assert np.isfinite(x).all() and np.abs(x.astype(np.float32) - y.astype(np.float32)).max() <= 1e-2, (
            name
        )
