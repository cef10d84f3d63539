"""compile --generate: FP16 step graph accuracy vs the FP32 model, the two-profile engine, the manifest."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import trtforge
import trtforge.llm
import trtforge.llm.api
from tests.llm.compile.conftest import GRAPH_OPTIONS, compile_graph
from tests.llm.tiny_models import FAMILIES, hf_greedy, prompts, tiny_model
from trtforge.cli.main import main as cli_main
from trtforge.core.manifest import read_manifest

NEW = 24


@pytest.mark.parametrize("family", FAMILIES)
def test_fp16_step_graph_tracks_fp32(family, step_graph):
    """The FP16 step graph against the FP32 model itself: HF greedy, one unpadded prompt at a time (the FP32
    step graph gives its tokens and, within 1e-4, its logits: tests/llm/test_generate.py), teacher-forced."""
    model = tiny_model(family)
    fp16 = trtforge.llm.api.load(step_graph(family, "fp16"))
    assert fp16.executor.cache_dtype == np.float16
    assert fp16.generation["cache"]["dtype"] == "float16"
    batch = prompts(model.config.vocab_size)
    refs = [hf_greedy(model, prompt, NEW) for prompt in batch]
    tokens, ref_logits = [t for t, _ in refs], [logits.numpy() for _, logits in refs]
    low_logits = fp16.score(batch, tokens)  # teacher-forced on the FP32 tokens: same contexts
    agree, clear, cosines = [], [], []
    for ref, low in zip(ref_logits, low_logits):
        assert low.dtype == np.float32
        top2 = np.sort(ref, -1)[:, -2:]
        # a pick whose FP32 margin is within FP16's logit noise (1% of the largest logit) may flip
        clear += list(top2[:, 1] - top2[:, 0] > 1e-2 * np.abs(ref).max())
        agree += list(ref.argmax(-1) == low.argmax(-1))
        cosines += list((ref * low).sum(-1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(low, axis=-1)))
    agree, clear = np.array(agree), np.array(clear)
    assert clear.mean() >= 0.75, f"only {clear.mean():.3f} of the picks are clear of FP16 noise"
    assert agree[clear].all(), f"clear top-1 picks differ at {np.flatnonzero(clear & ~agree)}"
    assert agree.mean() >= 0.98, f"top-1 agreement {agree.mean():.3f}"
    assert min(cosines) >= 0.999, f"min logits cosine {min(cosines):.5f}"


def test_save_pretrained_directory_source(tmp_path):
    """A save_pretrained directory compiles to the graph of the model saved there: its greedy tokens are
    the model's own (HF; the graph compiled from the module gives them too: tests/llm/test_generate.py)."""
    model = tiny_model("qwen2")
    model.save_pretrained(tmp_path / "qwen")
    llm = trtforge.llm.api.load(compile_graph(str(tmp_path / "qwen"), tmp_path / "q.onnx", "fp32"))
    assert llm.generation["model_type"] == "qwen2"
    want = hf_greedy(model, [5, 6, 7], 8)[0]
    assert len(set(want)) > 3, f"degenerate reference output {want}"
    assert llm.generate([[5, 6, 7]], 8, stop_at_eos=False) == [want]


@pytest.mark.parametrize("build", [False, pytest.param(True, marks=pytest.mark.trt_build)])
def test_a_step_graph_past_the_protobuf_limit_is_written_with_its_external_data(
    build, tmp_path, monkeypatch, step_graph
):
    """A step graph of 2 GB or more cannot be one protobuf: compile --generate saved it with onnx.save, which
    raised ValueError ("exceeds maximum protobuf size of 2GB") with or without an engine build. Now it is
    saved as every ONNX file trtforge writes (core.onnx_io.save_onnx: weights in FILE.data beside it past
    EXTERNAL_DATA_THRESHOLD, lowered here to a tiny model's size), --save-onnx written with its data file
    as one group, and the graph runs as the one-file graph does."""
    from trtforge.core import onnx_io

    model = tiny_model("llama")
    batch = prompts(model.config.vocab_size)
    whole = step_graph("llama", "fp16")
    want = trtforge.llm.api.load(whole).generate(batch, NEW, stop_at_eos=False)
    assert not whole.with_name(whole.name + ".data").exists()
    monkeypatch.setattr(onnx_io, "EXTERNAL_DATA_THRESHOLD", 1000)
    out = tmp_path / "big" / "step.onnx"
    out.parent.mkdir()
    engine = tmp_path / "big" / "step.engine" if build else None
    trtforge.compile(model, output=engine, generate=True, build=build, save_onnx=out, **GRAPH_OPTIONS)
    data = out.with_name("step.onnx.data")
    names = {"step.onnx", "step.onnx.data"} | ({"step.engine", "step.engine.json"} if build else set())
    assert {p.name for p in out.parent.iterdir()} == names
    assert out.stat().st_size < data.stat().st_size
    assert onnx_io.external_data_files(out) == [data]
    assert trtforge.llm.api.load(out).generate(batch, NEW, stop_at_eos=False) == want
    if build:
        assert read_manifest(engine).source["onnx_sha256"] == onnx_io.source_sha256(out)


@pytest.mark.trt_build
@pytest.mark.parametrize(
    "factory",
    [
        "llama_factory",
        "gpt2_factory",
        "qwen3_factory",
        "phi3_factory",
        "starcoder2_factory",
        "ministral_factory",
        "gpt_neox_factory",
        "phi_factory",
        "gemma_factory",
        "olmo2_factory",
        "granite_factory",
        "opt_factory",
        "gpt_neo_factory",
        "gpt_bigcode_factory",
        "gemma3_text_factory",
        "gemma2_factory",
        "stablelm_factory",
        "smollm3_factory",
        "gptj_factory",
        "codegen_factory",
        "falcon_factory",
        "falcon_40b_factory",
        "falcon_serial_factory",
        "mixtral_factory",
        "qwen2_moe_factory",  # the shared expert and a dense layer among the MoE ones
        "glm4_moe_factory",  # sigmoid routing with a selection bias over expert groups (Sigmoid, masks)
        "cohere2_factory",
        "bloom_factory",  # ALiBi: every layer's attention spelled out (no IAttention)
        "gpt_oss_factory",  # attention sinks: every layer's attention spelled out, the gpt-oss experts
        "llama4_factory",  # chunked attention: a chunk mask into IAttention, sigmoid top-1 routing
    ],
)
def test_cli_builds_one_engine_with_prefill_and_decode_profiles(factory, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[3]))
    engine = tmp_path / "llm.engine"
    rc = cli_main(
        [
            "compile",
            f"tests.llm.tiny_models:{factory}",
            "--generate",
            "-o",
            str(engine),
            "--max-seq",
            "64",
            "--max-batch",
            "4",
            "--max-prefill",
            "16",
            "--exporter",
            "legacy",
            "--save-onnx",
            str(tmp_path / "s.onnx"),
            "-q",
        ]
    )
    assert rc == 0
    manifest = read_manifest(engine)
    g = manifest.generation
    layers = g["num_layers"]
    census = manifest.records["build"]["layer_types"]
    assert census.get("KV_CACHE_UPDATE") == 2 * layers  # K and V of every layer
    # one IAttention per layer, but soft-capped ones (ONNX Attention's softcap: refused by TensorRT's parser),
    # ALiBi ones (their biases spelled out as plain ops) and those with attention sinks (likewise)
    layers_attn = zip(g["attn_softcaps"], g["alibi_slopes"], g["attn_sinks"])
    spelled = sum(c is not None or s is not None or k is not None for c, s, k in layers_attn)
    assert census.get("ATTENTION_OUTPUT", 0) == layers - spelled
    assert not [w for w in manifest.records["build"]["warnings"] if "Unused Input" in w]
    assert g["cache"] == g["cache"] | {"layout": "slot", "dtype": "float16"}
    assert g["profiles"] == {"prefill": 0, "decode": 1}
    prefill, decode = manifest.profiles
    assert prefill["input_ids"].max == [4, 16] and decode["input_ids"].max == [4, 1]
    assert prefill["key_cache.0"].max == [4, g["num_kv_heads"], 64, g["head_dim"]]
    assert {t.name: t.dtype for t in manifest.inputs}["value_cache.0"] == "float16"
    assert {t.name: t.dtype for t in manifest.outputs}["logits"] == "float32"
    assert json.loads(engine.with_name("llm.engine.json").read_text())["generation"]["max_seq"] == 64


def test_int8_smoothquant_step_graph(tmp_path, step_graph):
    """W8A8 on every projection, calibrated on prompts; cache write and attention stay in float."""
    import onnx

    model = tiny_model("llama")
    calib = prompts(300, lens=(5, 9, 17, 3, 12, 20, 7, 30), seed=5)
    fp32 = trtforge.llm.api.load(step_graph("llama", "fp32"))
    trtforge.compile(
        model,
        None,
        generate=True,
        build=False,
        save_onnx=tmp_path / "int8.onnx",
        precision="int8",
        calib_prompts=calib,
        **GRAPH_OPTIONS,
    )
    graph = onnx.load(str(tmp_path / "int8.onnx"))
    consumers = {i for n in graph.graph.node if n.op_type == "DequantizeLinear" for i in n.output}
    matmuls = [n for n in graph.graph.node if n.op_type == "MatMul"]
    assert matmuls and all(any(i in consumers for i in n.input) for n in matmuls)
    assert not any(
        i in consumers
        for n in graph.graph.node
        if n.op_type in ("Attention", "TensorScatter")
        for i in n.input
    )
    int8 = trtforge.llm.api.load(tmp_path / "int8.onnx")
    batch = prompts(model.config.vocab_size)
    tokens, ref = fp32.generate(batch, NEW, stop_at_eos=False, return_logits=True)
    low = int8.score(batch, tokens)
    cos = np.concatenate(
        [(r * q).sum(-1) / np.linalg.norm(r, axis=-1) / np.linalg.norm(q, axis=-1) for r, q in zip(ref, low)]
    )
    # Measured on this random-weight model: mean cosine 0.978, top-1 agreement 0.74 (its logits are
    # nearly flat, so top-1 flips easily); a broken quantization gives cosine far below 0.95.
    assert cos.mean() >= 0.95, f"mean logits cosine {cos.mean():.4f}"


def test_paged_step_graph_generates_the_slot_graphs_tokens(tmp_path, step_graph):
    """cache_layout="paged" through trtforge.compile: block pools, same greedy tokens as the slot graph."""
    model = tiny_model("llama")
    slot = trtforge.llm.api.load(step_graph("llama", "fp32"))
    assert slot.executor.cache_dtype == np.float32
    trtforge.compile(
        model,
        generate=True,
        build=False,
        save_onnx=tmp_path / "paged.onnx",
        precision="fp32",
        cache_layout="paged",
        block_size=4,  # prompts + NEW tokens span several blocks
        **GRAPH_OPTIONS,
    )
    import onnx

    from trtforge.llm.contract import generation_metadata

    cache = generation_metadata(onnx.load(str(tmp_path / "paged.onnx")), "paged.onnx")["cache"]
    assert cache | {"layout": "paged", "block_size": 4} == cache and "num_blocks" not in cache
    paged = trtforge.llm.load(tmp_path / "paged.onnx")
    batch = prompts(model.config.vocab_size)
    want = slot.generate(batch, NEW, stop_at_eos=False)
    assert paged.generate(batch, max_new_tokens=NEW, stop_at_eos=False) == want


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--generate", "--block-size", "8"], "--block-size"),
        (["--generate", "--cache-layout", "slot", "--num-blocks", "9"], "--num-blocks"),
        (["--cache-layout", "paged"], "--cache-layout"),
        (["--block-size", "8"], "--block-size"),
    ],
)
def test_cache_layout_options_are_refused_where_they_do_not_apply(args, flag, tmp_path, capsys):
    rc = cli_main(["compile", "tests.llm.tiny_models:llama_factory", "-o", str(tmp_path / "x.engine"), *args])
    assert rc == 2
    assert flag in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_paged_refuses_int8_and_a_pool_size_without_a_build(tmp_path):
    from trtforge.errors import UserError

    model, out = tiny_model("llama"), tmp_path / "p.onnx"
    common = {"generate": True, "build": False, "save_onnx": out, "cache_layout": "paged", "progress": False}
    with pytest.raises(UserError, match="int8 --cache-layout paged"):
        trtforge.compile(model, precision="int8", calib_prompts=[[1, 2]], **common)
    with pytest.raises(UserError, match="--num-blocks"):
        trtforge.compile(model, num_blocks=9, **common)
    with pytest.raises(UserError, match="--block-size"):
        trtforge.compile(model, block_size=0, **common)
    # (before: 10**23 was an OverflowError in the export, 65 a block no sequence of 64 tokens fills)
    for size in (65, 10**23):
        with pytest.raises(UserError, match=rf"--block-size {size} exceeds the KV-cache length 64"):
            trtforge.compile(model, block_size=size, max_seq=64, **common)
    assert not out.exists()


@pytest.mark.trt_build
@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3"])
def test_cli_builds_the_paged_step_engine(family, tmp_path, monkeypatch, step_graph):
    """--cache-layout paged: per layer one IAttention and two ScatterND (K, V) into the block pools."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[3]))
    engine, step = tmp_path / "paged.engine", tmp_path / "step.onnx"
    common = ["--max-seq", "64", "--max-batch", "4", "--max-prefill", "16", "--exporter", "legacy", "-q"]
    paged = ["--cache-layout", "paged", "--block-size", "8", "--save-onnx", str(step)]
    source = f"tests.llm.tiny_models:{family}_factory"
    rc = cli_main(["compile", source, "--generate", "-o", str(engine), *common, *paged])
    assert rc == 0
    manifest = read_manifest(engine)
    g = manifest.generation
    layers = g["num_layers"]
    census = manifest.records["build"]["layer_types"]
    assert census.get("ATTENTION_OUTPUT") == layers
    assert census.get("SCATTER") == 2 * layers
    assert "KV_CACHE_UPDATE" not in census
    assert not [w for w in manifest.records["build"]["warnings"] if "Unused Input" in w]
    blocks = 4 * 64 // 8 + 1  # default pool: every row at max_seq, plus the scratch block
    assert g["cache"] == g["cache"] | {"layout": "paged", "block_size": 8, "num_blocks": blocks}
    assert manifest.build_options | {"cache_layout": "paged", "block_size": 8} == manifest.build_options
    prefill, decode = manifest.profiles
    pool = [blocks, 8, g["num_kv_heads"], g["head_dim"]]
    assert prefill["key_pool.0"].max == pool and decode["value_pool.1"].max == pool
    assert prefill["block_tables"].max == [4, 8] and decode["slot_mapping"].max == [4, 1]
    slot = trtforge.llm.api.load(step_graph(family, "fp16"))
    want = slot.generate([[1, 2, 3]], max_new_tokens=4)
    assert trtforge.llm.load(step).generate([[1, 2, 3]], max_new_tokens=4) == want


def _build_tiny_step_engine(model, engine):
    """A small step engine of `model` at `engine` (TensorRT-RTX build on this machine)."""
    trtforge.compile(
        model, output=engine, generate=True, max_seq=32, max_batch=2, max_prefill=16, exporter="legacy",
        progress=False,
    )  # fmt: skip


@pytest.mark.trt_build
def test_attention_no_fused_kernel_takes_is_built_decomposed(tmp_path):
    """Head dim 8 (hidden 32): TensorRT-RTX has no fused attention kernel for it and failed the build
    ("Attention operation was not supported by a dedicated kernel"); the attention is then marked
    decomposable and the engine builds."""
    engine = tmp_path / "hd8.engine"
    model = tiny_model("llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    _build_tiny_step_engine(model, engine)
    build = read_manifest(engine).records["build"]
    assert len(build["attention_decomposed"]) == model.config.num_hidden_layers


@pytest.mark.trt_build
@pytest.mark.parametrize("layout", ["slot", "paged"])
def test_max_batch_1_with_short_prompts_builds(layout, tmp_path):
    """--max-batch 1 with a prefill of up to 32 tokens failed TensorRT-RTX's build (Myelin: "Graph contains
    more than one op named ..._iota") when the prefill profile's batch was fixed at 1; it takes up to 2
    rows now (opt 1), the decode profile stays at 1, and the TensorRT executor reads the manifest."""
    from trtforge.llm.executors.tensorrt_exec import read_step_engine

    engine = tmp_path / "b1.engine"
    trtforge.compile(
        tiny_model("llama"), output=engine, generate=True, max_seq=16, max_batch=1, exporter="legacy",
        cache_layout=layout, progress=False,
    )  # fmt: skip
    m = read_manifest(engine)
    prefill, decode = (m.profiles[m.generation["profiles"][ph]]["input_ids"] for ph in ("prefill", "decode"))
    assert (prefill.min, prefill.opt, prefill.max) == ([1, 1], [1, 16], [2, 16])
    assert (decode.min, decode.opt, decode.max) == ([1, 1], [1, 1], [1, 1])
    if layout == "paged":
        assert read_step_engine(engine).ranges["prefill"]["input_ids"].max == [2, 16]


@pytest.mark.trt_build
def test_head_dim_not_a_multiple_of_8_fails_the_build_saying_so(tmp_path):
    from trtforge.errors import BuildError

    engine = tmp_path / "hd12.engine"
    model = tiny_model("llama", hidden_size=48, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(BuildError, match="head_dim 12 is not a multiple of 8.*torch executor"):
        _build_tiny_step_engine(model, engine)
    assert not list(tmp_path.iterdir()), "a failed build leaves no output"


@pytest.mark.trt_build
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "SM999"], r"--target 'SM999': not a compute capability .* expected one or more of"),
        (["--opt-level", "9"], r"--opt-level"),
    ],
)
def test_generate_builder_options_are_refused_before_the_model_loads(args, message, tmp_path, capsys):
    """A missing model directory would be the first error if the model were read before the options."""
    out = tmp_path / "x.engine"
    rc = cli_main(["compile", str(tmp_path / "no_such_model"), "--generate", "-o", str(out), *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(message, err, re.S), err
    assert not list(tmp_path.iterdir())
