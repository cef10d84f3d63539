"""The TensorRT step executor: manifest validation, the binding plan and its feeds on the CPU against a paged
step engine TensorRT-RTX builds here; execution itself only where a GPU runs TensorRT (`trt_run`).

TensorRT-RTX 1.7.1 cannot deserialize an engine without a GPU (measured: cudaError 35 in
deserialize_cuda_engine), so the engine's I/O is checked through its manifest (recorded from the parsed
TensorRT network at build time) and through the ONNX step graph the engine was built from.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

import trtforge
import trtforge.llm
from tests.llm.tiny_models import tiny_model
from trtforge.cli.main import main as cli_main
from trtforge.errors import UserError
from trtforge.llm.executors import OrtPagedExecutor
from trtforge.llm.executors.base import StepBatch
from trtforge.llm.executors.tensorrt_exec import plan_step, read_step_engine
from trtforge.llm.sched.scheduler import SchedulerConfig
from trtforge.llm.service import engine_config

BLOCK, MAX_BATCH, MAX_PREFILL, MAX_SEQ = 8, 4, 16, 64
POOL_BLOCKS = MAX_BATCH * MAX_SEQ // BLOCK + 1  # the compile default, scratch block included


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny Llama paged step engine (FP16) and the step graph it was built from."""
    d = tmp_path_factory.mktemp("trtstep")
    trtforge.compile(
        tiny_model("llama"),
        output=d / "llm.engine",
        generate=True,
        cache_layout="paged",
        block_size=BLOCK,
        max_seq=MAX_SEQ,
        max_batch=MAX_BATCH,
        max_prefill=MAX_PREFILL,
        exporter="legacy",
        save_onnx=d / "step.onnx",
        progress=False,
    )
    return d / "llm.engine", d / "step.onnx"


def _batch(seqs):
    """StepBatch from (tokens, start position, blocks) per sequence; slots follow the block tables."""
    slots = [
        [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + len(toks))]
        for toks, start, blocks in seqs
    ]
    return StepBatch.build(
        seq_ids=list(range(len(seqs))),
        tokens=[t for t, _, _ in seqs],
        start_positions=[s for _, s, _ in seqs],
        block_tables=[b for _, _, b in seqs],
        slots=slots,
        want_logits=[True] * len(seqs),
    )


PROMPT_A, PROMPT_B = list(range(10, 15)), list(range(40, 51))  # 5 and 11 tokens
BLOCKS = {0: [3], 1: [7, 1], 2: [12, 5], 3: [20]}


def _mixed():
    """Sequences 0 and 1 decode one token each after their prompts; 2 and 3 bring new prompts."""
    return _batch(
        [
            ([77], len(PROMPT_A), BLOCKS[0]),
            ([78], len(PROMPT_B), BLOCKS[1] + [9]),
            (list(range(100, 109)), 0, BLOCKS[2]),
            ([5, 6, 7], 0, BLOCKS[3]),
        ]
    )


@pytest.mark.trt_build
def test_engine_manifest_binds_the_step_graphs_io(built):
    engine, step = built
    spec = read_step_engine(engine)
    assert spec.profiles == {"prefill": 0, "decode": 1}
    assert spec.engine_blocks == POOL_BLOCKS and spec.pool_dims == (BLOCK, 2, 16)
    assert spec.pool_dtype == "float16"
    graph = onnx.load(str(step), load_external_data=False).graph
    assert list(spec.input_names) == [i.name for i in graph.input]
    assert list(spec.output_names) == [o.name for o in graph.output]
    manifest = json.loads(engine.with_name("llm.engine.json").read_text())
    assert {t["name"] for t in manifest["inputs"]} == set(spec.input_names)
    assert {t["name"] for t in manifest["outputs"]} == set(spec.output_names)
    # Every call binds every engine input, within the range of the profile it selects.
    calls = plan_step(spec, _mixed(), POOL_BLOCKS, split=True)
    assert [(c.phase, c.profile, c.rows.tolist()) for c in calls] == [
        ("prefill", 0, [2, 3]),
        ("decode", 1, [0, 1]),
    ]
    for call in calls:
        assert set(call.shapes) == set(spec.input_names)
        profile = manifest["profiles"][call.profile]
        for name, shape in call.shapes.items():
            lo, hi = profile[name]["min"], profile[name]["max"]
            assert all(a <= s <= b for a, s, b in zip(lo, shape, hi)), (call.phase, name, shape)
    assert calls[1].shapes["input_ids"] == (2, 1) and calls[0].shapes["input_ids"] == (2, 9)


@pytest.mark.trt_build
def test_feeds_are_the_onnxruntime_executors(built):
    """One mapping: the TRT plan's feeds equal the ORT executor's feeds of the same sequences."""
    engine, step = built
    spec = read_step_engine(engine)
    ort = OrtPagedExecutor(step, num_blocks=POOL_BLOCKS - 1)
    batch = _mixed()
    (whole,) = plan_step(spec, batch, POOL_BLOCKS, split=False)
    assert whole.phase == "prefill"
    want = ort.feeds(batch)
    assert whole.feeds.keys() == want.keys()
    for name, value in want.items():
        assert value.dtype == whole.feeds[name].dtype and np.array_equal(value, whole.feeds[name]), name
    decodes = _batch([([77], 5, BLOCKS[0]), ([78], 11, BLOCKS[1] + [9])])
    (dec,) = plan_step(spec, decodes, POOL_BLOCKS, split=False)
    assert dec.phase == "decode" and dec.profile == 1
    for name, value in ort.feeds(decodes).items():
        assert np.array_equal(value, dec.feeds[name]), name
    # Split calls: the decode rows' feeds equal those of a batch holding only them (table width kept).
    _, split_dec = plan_step(spec, batch, POOL_BLOCKS, split=True)
    for name, value in ort.feeds(decodes).items():
        got = split_dec.feeds[name]
        if name == "block_tables":
            assert not got[:, value.shape[1] :].any()
            got = got[:, : value.shape[1]]
        assert np.array_equal(value, got), name


def _run(session, pools, feeds, names):
    outs = dict(zip(names, session.run(None, {**feeds, **pools})))
    return outs["logits"], {k: outs[k.replace("_pool.", "_pool_out.")] for k in pools}


@pytest.mark.trt_build
def test_split_prefill_and_decode_calls_equal_one_call(built):
    """The executor's overlap claim, checked by execution in exact ORT: the prefill and the decode call of a
    mixed step write disjoint slots, so either order over shared pools gives the single call's results."""
    engine, step = built
    spec = read_step_engine(engine)
    ort = OrtPagedExecutor(step, num_blocks=POOL_BLOCKS - 1)
    ort.step(_batch([(PROMPT_A, 0, BLOCKS[0]), (PROMPT_B, 0, BLOCKS[1])]))  # seqs 0 and 1 in the pools
    start = {k: v.copy() for k, v in ort.pools.items()}
    batch = _mixed()
    ref = ort.step(batch)
    names = [o.name for o in ort.session.get_outputs()]
    calls = plan_step(spec, batch, POOL_BLOCKS, split=True)
    for order in (calls, calls[::-1]):
        pools, logits = dict(start), np.zeros_like(ref)
        for call in order:
            out, pools = _run(ort.session, pools, call.feeds, names)
            logits[call.rows] = out  # one logits row per sequence, sequences in batch order
        np.testing.assert_allclose(logits, ref, rtol=0, atol=2e-3)
        assert (logits.argmax(-1) == ref.argmax(-1)).all()
        for name, pool in pools.items():  # every block but the scratch one
            np.testing.assert_allclose(pool[:-1], ort.pools[name][:-1], rtol=0, atol=2e-3)


@pytest.mark.trt_build
def test_plan_refuses_shapes_outside_the_profiles(built):
    spec = read_step_engine(built[0])
    five = _batch([([i], 3, [i]) for i in range(5)])
    with pytest.raises(UserError, match=r"'input_ids' as \[5, 1\].*max_num_seqs <= max_batch 4"):
        plan_step(spec, five, POOL_BLOCKS, split=True)
    long = _batch([(list(range(17)), 0, [1, 2, 3])])
    with pytest.raises(UserError, match=r"\[1, 17\].*max_prefill_chunk <= max_prefill 16"):
        plan_step(spec, long, POOL_BLOCKS, split=False)
    with pytest.raises(UserError, match="'key_pool.0'"):
        plan_step(spec, _mixed(), POOL_BLOCKS + 1, split=False)


def _edit(built, tmp_path, change):
    engine = tmp_path / "bad.engine"
    shutil.copy(built[0], engine)
    doc = json.loads(built[0].with_name("llm.engine.json").read_text())
    change(doc)
    engine.with_name("bad.engine.json").write_text(json.dumps(doc))
    return engine


def _pool_dtype(doc):
    next(t for t in doc["inputs"] if t["name"] == "key_pool.0")["dtype"] = "float32"


def _pool_shape(doc):
    next(t for t in doc["outputs"] if t["name"] == "value_pool_out.1")["shape"] = [-1, 4, 2, 16]


def _drop_input(doc):
    """A consistent manifest of an engine without slot_mapping (its profile ranges dropped too)."""
    doc["inputs"] = [t for t in doc["inputs"] if t["name"] != "slot_mapping"]
    for profile in doc["profiles"]:
        profile.pop("slot_mapping", None)


def _decode_batch(doc):
    doc["profiles"][1]["input_ids"]["max"] = [8, 1]


@pytest.mark.trt_build
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("generation"), "no `generation` section"),
        (lambda d: d["generation"]["cache"].update(layout="slot"), "'slot' KV cache"),
        (
            lambda d: d["generation"]["cache"].pop("num_blocks"),
            r"lacks the integer fields \['cache.num_blocks'\]",
        ),
        (
            lambda d: d["generation"].update(profiles={"prefill": 0, "decode": 0}),
            "distinct prefill and decode",
        ),
        (_pool_dtype, "tensor 'key_pool.0' is float32"),
        (_pool_shape, r"tensor 'value_pool_out.1' is float16 \[-1, 4, 2, 16\]"),
        (_drop_input, r"missing \['slot_mapping'\]"),
        (_decode_batch, r"profile 1 \(decode\) gives 'input_ids'"),
    ],
)
def test_manifest_errors_are_user_errors_before_any_gpu_work(built, tmp_path, change, message, capsys):
    engine = _edit(built, tmp_path, change)
    with pytest.raises(UserError, match=message):
        read_step_engine(engine)
    with pytest.raises(UserError, match=message):
        trtforge.llm.load(engine)
    assert cli_main(["generate", str(engine), "--prompt-ids", "1 2 3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--generate --cache-layout paged" in err


@pytest.mark.trt_build
def test_load_checks_limits_then_stops_at_the_gpu_gate(built):
    from trtforge.core.backend import get_backend

    engine, _ = built
    with pytest.raises(UserError, match=r"\{'max_num_seqs': 16\} exceeds the step engine's limits"):
        trtforge.llm.load(engine, config=SchedulerConfig(max_num_seqs=16))
    with pytest.raises(UserError, match="max_num_seqs 5 exceeds the step engine's max batch 4"):
        trtforge.llm.load(engine, max_num_seqs=5)
    with pytest.raises(UserError, match="onnxruntime executor runs the step graph"):
        trtforge.llm.load(engine, executor="onnxruntime")
    with pytest.raises(UserError, match="tensorrt executor runs a step engine"):
        trtforge.llm.load(built[1], executor="tensorrt")
    caps = get_backend().capabilities
    if caps.can_run:
        pytest.skip("a GPU TensorRT runs on is present: test_tensorrt_executor_matches_onnxruntime loads it")
    with pytest.raises(UserError, match="cannot run engines here"):
        trtforge.llm.load(engine)
    # sizes as NumPy integers pass the limits as they do for a step graph (errors.is_int); before, the
    # engine's check took Python ints only: "num_blocks must be an integer in [1, 32] ..., got np.int64(8)"
    with pytest.raises(UserError, match="cannot run engines here"):
        trtforge.llm.load(engine, num_blocks=np.int64(8), max_model_len=np.int64(16))


@pytest.mark.trt_build
def test_loading_a_step_engine_reads_its_manifest_once(built, monkeypatch):
    """load() -> limits -> TrtPagedExecutor -> runtime load: one read of the manifest, passed down (it was
    read three times). Counted wherever read_manifest was imported; here the load stops at the GPU gate,
    after every manifest check, and on a GPU it opens the engine."""
    import sys

    import trtforge.runtime.engine  # (imported lazily by the executor: its name is patched too)
    from trtforge.core import manifest as manifest_module
    from trtforge.core.backend import get_backend

    original, reads = manifest_module.read_manifest, []

    def counting(path):
        reads.append(path)
        return original(path)

    holders = [m for m in list(sys.modules.values()) if getattr(m, "read_manifest", None) is original]
    assert "trtforge.core.manifest" in {m.__name__ for m in holders}  # (rt.load reads it by read_engine)
    for module in holders:
        monkeypatch.setattr(module, "read_manifest", counting)
    engine, _ = built
    if get_backend().capabilities.can_run:
        trtforge.llm.load(engine).close()
    else:
        with pytest.raises(UserError, match="cannot run engines here"):
            trtforge.llm.load(engine)
    assert len(reads) == 1, reads


# Publishes the engine ARGV[1] with its manifest to ARGV[2] as compile does (publish_engine) and is killed
# (SIGKILL) right after its os.replace onto ARGV[3], the commit point's record: nothing renamed yet.
_PUBLISHER = """
import os, signal, sys
from pathlib import Path
from trtforge.core.manifest import publish_engine, read_manifest
real = os.replace
def replace(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if Path(dst) == Path(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
publish_engine(sys.argv[2], Path(sys.argv[1]).read_bytes(), read_manifest(sys.argv[1]))
"""


@pytest.mark.trt_build
def test_a_step_engine_killed_at_its_commit_point_is_read_whole(built, tmp_path):
    """`compile --generate --cache-layout paged -o llm.engine` killed (SIGKILL) at its commit point, its
    pair not yet renamed into place: the step-engine reader (`trtforge generate llm.engine`, llm.load)
    finishes the publish, as every engine reader does. Before, it looked for the engine before reading the
    manifest (whose reader settles the pair) and said the engine did not exist."""
    import os
    import subprocess
    import sys

    from tests.compiler.test_kill import _env
    from trtforge._fileio import temp_name

    engine, _ = built
    out = tmp_path / "d" / "llm.engine"
    out.parent.mkdir()
    argv = [sys.executable, "-c", _PUBLISHER, str(engine), str(out), str(temp_name(out, "commit"))]
    writer = subprocess.run(argv, env=_env(tmp_path / "tmp"), capture_output=True, text=True, timeout=120)
    assert writer.returncode == -9, writer.stderr
    assert not out.exists() and os.path.lexists(temp_name(out, "commit"))
    spec = read_step_engine(out)
    assert spec.engine_blocks == POOL_BLOCKS
    assert sorted(os.listdir(out.parent)) == ["llm.engine", "llm.engine.json"]
    assert out.read_bytes() == engine.read_bytes()


def test_engine_config_lowers_defaults_and_refuses_explicit_excess():
    limits = {"max_num_seqs": 4, "max_prefill_chunk": 16}
    cfg = engine_config(None, limits)
    assert (cfg.max_num_seqs, cfg.max_prefill_chunk) == (4, 16)
    kept = engine_config(SchedulerConfig(max_num_seqs=3, watermark=0.1), limits)
    assert (kept.max_num_seqs, kept.max_prefill_chunk, kept.watermark) == (3, 16, 0.1)
    with pytest.raises(UserError, match="max_prefill_chunk"):
        engine_config(SchedulerConfig(max_prefill_chunk=32), limits)


@pytest.mark.trt_build
@pytest.mark.trt_run
def test_tensorrt_executor_matches_onnxruntime(built):
    """On a GPU TensorRT runs on: the same steps through the engine and through its step graph in ORT."""
    from trtforge.llm.executors.tensorrt_exec import TrtPagedExecutor

    engine, step = built
    trt_ex = TrtPagedExecutor(engine)
    ort = OrtPagedExecutor(step, num_blocks=trt_ex.facts.num_blocks)
    same = ("num_blocks", "block_size", "vocab_size", "max_model_len", "eos_token_ids", "num_layers")
    same += ("num_kv_heads", "head_dim")
    f = trt_ex.facts
    assert {k: getattr(f, k) for k in same} == {k: getattr(ort.facts, k) for k in same}
    pool_sets = 1 if trt_ex.in_place else 2  # separate pool outputs are double-buffered
    assert f.kv_pool_bytes == pool_sets * (f.num_blocks + 1) * f.block_size * f.kv_bytes_per_token
    first = _batch([(PROMPT_A, 0, BLOCKS[0]), (PROMPT_B, 0, BLOCKS[1])])
    for batch in (first, _mixed()):
        got, want = trt_ex.step(batch).float().cpu().numpy(), ort.step(batch)
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-2)
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.75
    prompts = [PROMPT_A, PROMPT_B, [1, 2, 3]]
    with trtforge.llm.load(engine) as llm, trtforge.llm.load(step, num_blocks=trt_ex.facts.num_blocks) as ref:
        got, want = llm.generate(prompts, max_new_tokens=8), ref.generate(prompts, max_new_tokens=8)
        assert [g[0] for g in got] == [w[0] for w in want]  # later tokens may part on FP16 near-ties
        agree = [a == b for g, w in zip(got, want) for a, b in zip(g, w)]
        assert np.mean(agree) >= 0.75, (got, want)
        assert llm.memory_stats().free_blocks == llm.executor.facts.num_blocks
