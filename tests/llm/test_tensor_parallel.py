"""Tensor parallelism on the CPU: two gloo ranks in worker processes against one process, token for token.

Each engine here starts two worker processes (each imports torch and transformers: ~10-25 s on the
2-core CI machine), so the engines are few and shared: one tiny random Llama (GQA) engine serves the
equality test and then the worker-death test, which ends it (run in another order, a second one
starts); the trained code model gets one more, and four other families one each (TP_FAMILIES: what the
worker processes run that the thread ranks do not). Every other split family runs on two thread ranks in
this process. The refusals run before any worker starts.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.llm.tiny_models import TP_REFUSED, prompts, tiny_model
from trtforge.errors import UserError
from trtforge.llm import SamplingParams, SchedulerConfig, from_pretrained
from trtforge.llm.engine import EngineClosedError
from trtforge.llm.models.base import SUPPORTED

MODEL = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "code-llama-21m"
GQA = {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96}


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama", **GQA)


class _SharedTP2:
    """The tiny model over two gloo ranks (at most 2 sequences at once, so a burst waits), started on
    first use and shared. A test that ends its engine takes it (:meth:`take`): the next test to ask starts a
    new one. In file order one engine serves both tests; in any other order each still gets a live one."""

    def __init__(self, tiny) -> None:
        self.tiny, self.live, self.made = tiny, None, []

    def get(self):
        if self.live is None:
            config = SchedulerConfig(max_num_seqs=2)
            self.live = from_pretrained(self.tiny, num_blocks=64, tensor_parallel_size=2, config=config)
            self.made.append(self.live)
        return self.live

    def take(self):
        llm, self.live = self.get(), None
        return llm


@pytest.fixture(scope="module")
def shared_tp2(tiny):
    shared = _SharedTP2(tiny)
    yield shared
    for llm in shared.made:
        llm.close()


@pytest.fixture
def tp2(shared_tp2):
    """The shared live engine."""
    return shared_tp2.get()


@pytest.fixture
def tp2_to_end(shared_tp2):
    """The shared engine, for a test that ends it (later tests get a new one)."""
    return shared_tp2.take()


def test_tp2_greedy_equals_tp1_on_a_gqa_llama(tiny, tp2):
    ps = prompts(tiny.config.vocab_size)
    with from_pretrained(tiny, num_blocks=64) as one:
        want = one.generate(ps, max_new_tokens=16, stop_at_eos=False)
    got = tp2.generate(ps, max_new_tokens=16, stop_at_eos=False)
    assert got == want
    facts = tp2.executor.facts
    assert (facts.tensor_parallel_size, facts.num_kv_heads) == (2, 2)
    # each rank's pools hold one of the two KV heads: half the bytes each
    assert [f.num_kv_heads for f in tp2.executor.rank_facts] == [1, 1]
    assert facts.kv_pool_bytes == 2 * tp2.executor.rank_facts[0].kv_pool_bytes


def test_a_dead_worker_fails_every_request_and_the_engine_stops(tp2_to_end):
    """SIGKILL rank 1 while two requests run and four wait: all six end with an error naming the dead
    rank, within seconds, and the engine refuses new work."""
    tp2 = tp2_to_end
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    handles = [tp2.submit([1, 2, 3, i], params) for i in range(6)]
    first = iter(handles[0])
    next(first)  # the engine is stepping
    victim = tp2.executor._procs[1]
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    completions = [h.completion(timeout=30) for h in handles]
    assert time.monotonic() - t0 < 15
    for c in completions:
        assert c.finish_reason == "error"
        assert isinstance(c.error, EngineClosedError)
        assert "rank 1" in str(c.error) and "died" in str(c.error), str(c.error)
    assert any(len(c.token_ids) < 200 for c in completions)
    with pytest.raises(EngineClosedError, match="rank 1"):
        tp2.submit([1, 2], params)
    t1 = time.monotonic()
    tp2.close()
    assert time.monotonic() - t1 < 10
    assert not any(p.is_alive() for p in tp2.executor._procs)


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_tp2_greedy_equals_tp1_on_code_llama_21m():
    """The trained model (8 heads, 2 KV heads): loaded by each worker from its directory."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    ps = [tok.encode(t) for t in ("def read_json(path):\n", "import os\nclass Cache:\n    def ")]
    with from_pretrained(str(MODEL), num_blocks=32) as one:
        want = one.generate(ps, max_new_tokens=24, stop_at_eos=False)
    with from_pretrained(str(MODEL), num_blocks=32, tensor_parallel_size=2) as two:
        assert two.executor.facts.tensor_parallel_size == 2
        got = two.generate(ps, max_new_tokens=24, stop_at_eos=False)
    assert got == want


def test_an_indivisible_count_names_the_sizes_that_divide_it():
    from trtforge.llm.models.parallel import check_divisible

    with pytest.raises(UserError, match=r"does not divide m's KV heads \(6\).*\(e\.g\. 2, 3, 6\)\.$"):
        check_divisible("m", {"KV heads": 6}, 4)
    with pytest.raises(UserError, match=r"\(1\).*With 1 KV heads, only tensor_parallel_size=1 splits it\.$"):
        check_divisible("m", {"KV heads": 1}, 2)  # multi-query: no size above 1 divides it


def test_indivisible_heads_are_refused_before_any_worker_starts(tiny):
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"tensor_parallel_size 4 does not divide .*KV heads.*\(2\)"):
        from_pretrained(tiny, num_blocks=16, tensor_parallel_size=4)
    with pytest.raises(UserError, match=r"tensor_parallel_size 3 does not divide .*attention heads.*\(4\)"):
        from_pretrained(tiny, num_blocks=16, tensor_parallel_size=3)
    # what the adapter refuses (a family it does not split, an MLP width) is refused here too
    with pytest.raises(UserError, match="not supported for gptj"):
        from_pretrained(tiny_model("gptj"), num_blocks=16, tensor_parallel_size=2)
    with pytest.raises(UserError, match=r"tensor_parallel_size 2 does not divide .*MLP width.*\(97\)"):
        from_pretrained(tiny_model("llama", intermediate_size=97), num_blocks=16, tensor_parallel_size=2)
    for bad in (0, -2, 2.0, "2"):
        with pytest.raises(UserError, match="tensor_parallel_size must be an integer"):
            from_pretrained(tiny, num_blocks=16, tensor_parallel_size=bad)
    assert time.monotonic() - t0 < 5  # no process was spawned


def test_refusals_of_the_adapter_and_the_device():
    from trtforge.llm.executors.tensor_parallel import pick_device
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.models.parallel import TensorParallel

    with pytest.raises(UserError, match="not supported for gpt_bigcode"):
        adapter_for(tiny_model("gpt_bigcode")).shard(TensorParallel(0, 2))
    with pytest.raises(UserError, match="intermediate_size"):
        adapter_for(tiny_model("llama", intermediate_size=97)).shard(TensorParallel(0, 2))
    if torch.cuda.device_count() < 8:
        with pytest.raises(UserError, match="one GPU per rank"):
            pick_device("cuda", 8)
    cpus = len(os.sched_getaffinity(0))
    assert pick_device("cpu", cpus) == ("cpu", "gloo")
    with pytest.raises(UserError, match=rf"tensor_parallel_size {cpus + 1}: on the CPU .* gives {cpus}"):
        pick_device("cpu", cpus + 1)


def test_a_shard_holds_its_share_and_the_row_parallel_bias_once():
    """Rank 1 of 2 of a model with q/k/v biases (qwen2), in this process (slicing only, no collective):
    its heads' rows and bias slices, o_proj's and down_proj's input columns, its half of the vocabulary,
    the embedding whole; sharding the same model again changes nothing."""
    from trtforge.llm import sizing
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.models.parallel import RowParallelLinear, TensorParallel, VocabParallelHead

    whole = tiny_model("qwen2", **GQA)
    part = tiny_model("qwen2", **GQA)
    adapter = adapter_for(part)
    adapter.shard(TensorParallel(1, 2))
    assert (adapter.num_heads, adapter.num_kv_heads) == (2, 1)
    d = adapter.head_dim
    a, w = part.model.layers[0].self_attn, whole.model.layers[0].self_attn
    assert torch.equal(a.q_proj.weight, w.q_proj.weight[2 * d : 4 * d])
    assert torch.equal(a.k_proj.bias, w.k_proj.bias[d : 2 * d])
    assert isinstance(a.o_proj, RowParallelLinear)
    assert torch.equal(a.o_proj.weight, w.o_proj.weight[:, 2 * d : 4 * d])
    m, wm = part.model.layers[0].mlp, whole.model.layers[0].mlp
    assert torch.equal(m.down_proj.weight, wm.down_proj.weight[:, 48:])
    head = part.lm_head
    assert isinstance(head, VocabParallelHead) and head.weight.shape[0] == 150
    assert torch.equal(head.weight, whole.lm_head.weight[150:])
    again = adapter_for(part)  # a second executor's adapter over the same shard: this rank's heads
    assert (again.num_heads, again.num_kv_heads) == (2, 1)
    again.shard(TensorParallel(1, 2))  # already sharded for this rank: nothing changes
    assert (again.num_heads, again.num_kv_heads) == (2, 1)
    with pytest.raises(ValueError, match="already sharded as rank 1 of 2"):
        again.shard(TensorParallel(0, 2))
    # the pool sizing reads the same adapter: a rank's block holds its half of the KV heads
    assert 2 * sizing.model_kv_block_bytes(part, 16, 2) == sizing.model_kv_block_bytes(whole, 16, 2)
    assert part.model.layers[0].self_attn.q_proj.weight.shape[0] == 2 * d
    assert torch.equal(part.model.embed_tokens.weight, whole.model.embed_tokens.weight)  # replicated


def test_cli_refuses_tensor_parallelism_off_the_torch_executor(tmp_path, capsys):
    from trtforge.cli.main import main

    step = tmp_path / "step.onnx"
    step.write_bytes(b"")
    assert main(["generate", str(step), "--prompt-ids", "1 2", "--tensor-parallel-size", "2"]) == 2
    assert "needs the torch executor" in capsys.readouterr().err


class _Hub:
    """Two threads standing in for two ranks: a collective swaps their tensors at a barrier."""

    def __init__(self, world: int) -> None:
        import threading

        self.barrier, self.slots = threading.Barrier(world), [None] * world

    def exchange(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = t.clone()
        self.barrier.wait(timeout=60)  # a rank that failed breaks the barrier: no test hangs
        got = list(self.slots)
        self.barrier.wait(timeout=60)  # nobody overwrites a slot before everyone has read them
        return got


def _thread_rank(rank: int, world: int, hub: _Hub):
    from trtforge.llm.models.parallel import TensorParallel

    class ThreadRank(TensorParallel):
        def all_reduce(self, t):
            return t.copy_(torch.stack(hub.exchange(self.rank, t)).sum(0))

        def gather_columns(self, t, width):
            return torch.cat(hub.exchange(self.rank, t), dim=-1)[..., :width]

    return ThreadRank(rank, world)


def _locked(lock, kernel, args, kwargs):
    with lock:
        return kernel(*args, **kwargs)


def _on_ranks(world: int, fn):
    """fn(rank, tp) on `world` threads at once (their collectives meet in a hub); results by rank."""
    from concurrent.futures import ThreadPoolExecutor

    hub = _Hub(world)
    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(fn, r, _thread_rank(r, world, hub)) for r in range(world)]
        return [f.result(timeout=120) for f in futures]


@pytest.mark.parametrize("tokens", [1, 5], ids=["gemv", "gemm"])
def test_fused_layers_add_the_residual_once_per_group(tokens, monkeypatch):
    """The CUDA path's fused layer (residuals folded into the o_proj/down_proj GEMMs, Triton kernels; here
    in Triton's CPU interpreter) on two ranks equals the unsharded one: rank 0 folds the residual, the
    all-reduce sums, and the vocab-parallel head gathers. One token takes the GEMV kernels, five the GEMMs."""
    import copy

    pytest.importorskip("triton")
    import threading

    from trtforge.llm.executors import fused_layers
    from trtforge.llm.executors.fused_layers import FusedLayers
    from trtforge.llm.models.families import adapter_for

    lock = threading.Lock()  # Triton's interpreter patches module globals during a launch: one at a time
    for name in ("rms_norm", "silu_mul", "gemv_residual", "norm_gemv", "norm_gate_up_silu"):
        kernel = getattr(fused_layers, name)
        monkeypatch.setattr(fused_layers, name, lambda *a, _k=kernel, **kw: _locked(lock, _k, a, kw))
    whole = tiny_model("llama", **GQA).half()
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, 64, generator=g).half()
    o = torch.randn(tokens, 4 * 16, generator=g).half()
    fused = FusedLayers(adapter_for(whole))
    want, want_logits = fused.finish(0, h, o), fused.logits(h).float()

    def rank(r, tp):
        part = copy.deepcopy(whole)
        adapter = adapter_for(part)
        adapter.shard(tp)
        layers = FusedLayers(adapter, tp)
        return layers.finish(0, h, o[:, r * 32 : (r + 1) * 32]), layers.logits(h).float()

    for got, got_logits in _on_ranks(2, rank):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(got_logits, want_logits, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("starcoder2", {}),
        ("seed_oss", {"attention_out_bias": True, "mlp_bias": True, "head_dim": 16}),
        ("arcee", {}),
    ],
)
def test_row_parallel_bias_is_added_once(family, overrides):
    """starcoder2 (biased o_proj and c_proj), Seed-OSS (its output bias apart from the q/k/v biases) and
    Arcee (a non-gated up/down MLP): the adapter's block on two ranks equals the whole block."""
    import copy

    from trtforge.llm.models.families import adapter_for

    whole = tiny_model(family, **GQA, **overrides)
    assert (whole.model.layers[0].self_attn.o_proj.bias is not None) == (family != "arcee")
    g = torch.Generator().manual_seed(0)
    h, o = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    with torch.no_grad():
        want = adapter_for(whole).finish_block(0, h, o)

    def rank(r, tp):
        part = copy.deepcopy(whole)
        adapter = adapter_for(part)
        adapter.shard(tp)
        with torch.no_grad():
            return adapter.finish_block(0, h, o[:, r * 32 : (r + 1) * 32])

    for got in _on_ranks(2, rank):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_tp2_on_two_gpus_matches_one_gpu_with_fused_layers_and_graphs():
    """Two GPUs, NCCL, BF16: the fused layers (residual folded on rank 0), the Triton kernels and the
    decode CUDA graphs (all-reduce and all-gather captured) give the one-GPU executor's logits, step after
    step (teacher-forced with its greedy tokens, so a BF16 near-tie cannot fork the two)."""
    import copy

    from trtforge.llm.executors.base import StepBatch
    from trtforge.llm.executors.tensor_parallel import TensorParallelExecutor
    from trtforge.llm.executors.torch_exec import TorchExecutor

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this host has {torch.cuda.device_count()}")
    model = tiny_model("llama", **GQA)
    one = TorchExecutor(copy.deepcopy(model), 16, 16, device="cuda:0", dtype=torch.bfloat16)
    assert one.fused_refusal is None and one.use_cuda_graphs
    two = TensorParallelExecutor(model, 2, num_blocks=16, device="cuda", dtype=torch.bfloat16)
    try:
        assert two.facts.tensor_parallel_size == 2 and two.backend == "nccl"
        ps = prompts(model.config.vocab_size, lens=(5, 9))
        tables = [[0], [1, 2]]  # sequence b grows past its first block

        def slots(b, positions):
            return [tables[b][p // 16] * 16 + p % 16 for p in positions]

        batch = StepBatch.build(
            ["a", "b"], ps, [0, 0], tables, [slots(0, range(5)), slots(1, range(9))], [True, True]
        )
        lens = [5, 9]
        for step in range(10):
            want = one.step(batch).float()
            got = two.step(batch).float().to(want.device)
            cos = torch.nn.functional.cosine_similarity(want, got, dim=-1)
            assert cos.min() > 0.999, (step, cos)
            assert (want - got).abs().max() < 0.05 * want.abs().max(), step
            nxt = want.argmax(-1).tolist()
            new_slots = [slots(b, [n]) for b, n in enumerate(lens)]
            batch = StepBatch.build(["a", "b"], [[t] for t in nxt], lens, tables, new_slots, [True, True])
            lens = [n + 1 for n in lens]
    finally:
        two.close()


@pytest.mark.trt_build
def test_tensorrt_onnx_parser_imports_a_dist_collective_node():
    """The fact a per-rank step engine would rest on (not built yet, see README "Tensor parallelism"):
    TensorRT's ONNX parser maps a ``DistCollective`` node (all-reduce, sum, 2 ranks) to an
    IDistCollectiveLayer, and the builder builds it (here TensorRT-RTX, on the CPU). Running it needs a
    GPU per rank and ``IExecutionContext.set_communicator`` with an NCCL communicator."""
    from onnx import TensorProto, helper

    from trtforge.core.backend import get_backend

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    node = helper.make_node(
        "DistCollective", ["x"], ["y"], collective_operation="all_reduce", reduce_op="sum", root=-1, nb_rank=2
    )
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 23)]
    )
    backend = get_backend()
    if "DistCollective" not in backend.parser_supports(["DistCollective"]):
        pytest.skip(
            f"{backend.name} {backend.version} has no DistCollective importer (TensorRT >= 10.16 has)"
        )
    builder = backend.create_builder()
    network = backend.create_network(builder)
    parser = backend.create_parser(network)
    assert parser.parse(model.SerializeToString()), [
        str(parser.get_error(i)) for i in range(parser.num_errors)
    ]
    layer = network.get_layer(0)
    assert layer.type == backend.trt.LayerType.DIST_COLLECTIVE and layer.num_ranks == 2
    assert builder.build_serialized_network(network, builder.create_builder_config()) is not None


def test_a_workers_refusal_at_start_reaches_the_caller_and_no_worker_is_left(tmp_path):
    """GPT-J is not split: from a directory (the driver reads only its config), each worker's adapter
    refuses it; the caller gets that UserError itself."""
    import multiprocessing

    tiny_model("gptj").save_pretrained(tmp_path)
    before = set(multiprocessing.active_children())  # another test's shared engine may be alive here
    with pytest.raises(UserError, match="not supported for gptj"):
        from_pretrained(str(tmp_path), num_blocks=16, tensor_parallel_size=2)

    def left() -> set:
        return set(multiprocessing.active_children()) - before

    # the workers were stopped (terminated, then killed) before the error returned; under a loaded machine
    # the kernel may take a moment to reap a killed one, so allow that, but no longer
    deadline = time.monotonic() + 10.0
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left()


# Starts a tensor-parallel engine of two workers on the marking factory and is killed (SIGKILL) right after
# the second worker process started, printing each worker's process id first.
_DRIVER_KILLED_AT_START = """
import os, signal, sys
import multiprocessing.context as context
from trtforge.llm import from_pretrained
real, started = context.SpawnProcess.start, []
def start(self):
    real(self)
    print(self.pid, flush=True)
    started.append(self.pid)
    if len(started) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
context.SpawnProcess.start = start
from_pretrained("tests.llm.tiny_models:marking_llama_factory", num_blocks=16, tensor_parallel_size=2)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the workers' states in /proc")
def test_workers_of_a_driver_killed_as_they_start_end_before_loading_the_model(tmp_path):
    """`trtforge generate --tensor-parallel-size 2` killed (SIGKILL, the OOM killer) while its workers were
    starting: each worker ends at once. Before, the kernel's parent-death signal, set up only after a
    worker had imported torch, never came for a driver that died before; each worker joined the others,
    loaded its share of the model (gigabytes of GPU memory a run started again at once found taken) and
    only then found its driver gone."""
    import subprocess
    import sys

    from tests.compiler.test_kill import _env

    loaded = tmp_path / "loaded"
    env = dict(_env(tmp_path / "tmp"), TRTFORGE_TEST_LOADED=str(loaded))
    driver = subprocess.run(
        [sys.executable, "-c", _DRIVER_KILLED_AT_START], env=env, capture_output=True, text=True, timeout=120
    )
    assert driver.returncode == -signal.SIGKILL, driver.stderr
    workers = [int(pid) for pid in driver.stdout.split()]
    assert len(workers) == 2, driver.stdout

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # (a zombie has ended)
        except OSError:
            return False

    deadline = time.monotonic() + 120
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not any(alive(pid) for pid in workers), "a worker outlived its driver by two minutes"
        assert not list(tmp_path.glob("loaded.*")), "an orphaned worker loaded the model"
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# the split families whose two gloo worker processes run what the thread ranks below do not: OLMo 2's
# ShardedRMSNorm (one more all-reduce a layer, inside the q/k norms), Phi-3's fused qkv_proj and gate_up_proj,
# GPT-NeoX's per-head fused query_key_value (MHA) and parallel residual, BLOOM's ALiBi slopes (each rank's
# heads', kept by the executor's adapter over the worker's shard); each engine starts two workers
# (~20 s on a 2-core machine), so the rest of the families run on thread ranks
# (test_every_split_family_is_greedy_on_two_thread_ranks_as_on_one)
TP_FAMILIES = ("olmo2", "phi3", "gpt_neox", "bloom")


@pytest.mark.parametrize("family", TP_FAMILIES)
def test_tp2_greedy_equals_tp1_on_split_families(family):
    """Two gloo ranks against one process, token for token, on a tiny random model of `family` (heads and
    KV heads divisible by 2)."""
    model = tiny_model(family)
    ps = prompts(model.config.vocab_size)
    with from_pretrained(model, num_blocks=64) as one:
        want = one.generate(ps, max_new_tokens=12, stop_at_eos=False)
    with from_pretrained(model, num_blocks=64, tensor_parallel_size=2) as two:
        assert [f.num_kv_heads for f in two.executor.rank_facts] == [one.executor.facts.num_kv_heads // 2] * 2
        got = two.generate(ps, max_new_tokens=12, stop_at_eos=False)
    assert got == want


# the split forms tiny_model builds under names of their own (Falcon's MHA forms, per head; falcon-40b's
# grouped query_key_value with 2 and 4 KV groups: one and two whole groups a rank), with their overrides
SPLIT_FORMS = {
    "falcon_rw": {},
    "falcon_serial": {},
    "falcon_40b": {},
    "falcon_40b-4kv": {"num_attention_heads": 8, "num_kv_heads": 4},
    "opt-350m": {"do_layer_norm_before": False, "word_embed_proj_dim": 32},
    "gpt_bigcode-mha": {"multi_query": False},
    "stablelm-parallel": {"use_parallel_residual": True},
    "gpt_neox-serial": {"use_parallel_residual": False},
}


def _base(family: str) -> str:
    """The tiny_models family of a family or split form ("falcon_40b-4kv": falcon_40b; "gpt-sw3" itself)."""
    return family if family in SUPPORTED else family.split("-")[0]


@pytest.mark.parametrize("family", [*(f for f in SUPPORTED if f not in TP_REFUSED), *SPLIT_FORMS])
def test_every_split_family_is_greedy_on_two_thread_ranks_as_on_one(family):
    """Every family tensor parallelism splits (the Llama-style ones too; tests/llm/models' TP_REFUSED are
    the others), in this process: two sharded torch executors on two threads (their collectives meet in a
    hub) run a prefill of two prompts and greedy decode steps; their tokens are the unsharded executor's,
    token for token, and their logits its logits. Gemma (head_dim 24), Gemma 2 (windows, soft-caps), Gemma
    3, StableLM and Cohere (per-head q/k norms: shared, a norm a head, a weight row a head), OLMo 2 / 3
    (whole-projection RMSNorm), Phi (fc1/fc2, biases), Nemotron (up/down), GLM (fused gate_up) among them,
    and Falcon's split forms (:data:`SPLIT_FORMS`)."""
    import copy

    from trtforge.llm.executors.base import StepBatch
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model = tiny_model(_base(family), **SPLIT_FORMS.get(family, {}))
    with torch.no_grad():  # biases off their zero init, so that one added on every rank (or lost) shows
        generator = torch.Generator().manual_seed(1)
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.2)
    ps = prompts(model.config.vocab_size, lens=(5, 9))
    tables = [[0], [1, 2]]

    def slots(b, positions):
        return [tables[b][p // 16] * 16 + p % 16 for p in positions]

    def greedy(executor):
        new = [slots(0, range(5)), slots(1, range(9))]
        batch = StepBatch.build(["a", "b"], ps, [0, 0], tables, new, [True, True])
        lens, tokens, logits = [5, 9], [], []
        for _ in range(10):
            with torch.no_grad():
                out = executor.step(batch).float()
            nxt = out.argmax(-1).tolist()
            tokens.append(nxt)
            logits.append(out)
            new = [slots(b, [n]) for b, n in enumerate(lens)]
            batch = StepBatch.build(["a", "b"], [[t] for t in nxt], lens, tables, new, [True, True])
            lens = [n + 1 for n in lens]
        return tokens, logits

    want_tokens, want_logits = greedy(TorchExecutor(copy.deepcopy(model), 8, 16))
    sharded = _on_ranks(
        2, lambda r, tp: greedy(TorchExecutor(copy.deepcopy(model), 8, 16, tensor_parallel=tp))
    )
    for tokens, logits in sharded:
        assert tokens == want_tokens
        for step, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
            torch.testing.assert_close(
                got, want, atol=1e-4, rtol=1e-4, msg=lambda m, s=step: f"step {s}: {m}"
            )


@pytest.mark.parametrize(
    ("family", "per_layer"),
    [("gpt_neox", 1), ("phi", 1), ("cohere", 1), ("falcon_40b", 1), ("stablelm-parallel", 1), ("llama", 2)],
)
def test_a_parallel_residual_block_reduces_once_a_layer(family, per_layer):
    """GPT-NeoX, Phi, Cohere, Falcon-40b and StableLM's parallel form add the attention's and the MLP's
    row-parallel products to one input, so one all-reduce of their sum serves both (a sequential block,
    Llama's, needs one after each); counted on two thread ranks over one prefill step."""
    import copy

    from trtforge.llm.executors.base import StepBatch
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model = tiny_model(_base(family), **SPLIT_FORMS.get(family, {}))
    counts = [0, 0]

    def step(rank, tp):
        reduce = tp.all_reduce

        class Counting(type(tp)):
            def all_reduce(self, t):
                counts[self.rank] += 1
                return reduce(t)

        executor = TorchExecutor(copy.deepcopy(model), 8, 16, tensor_parallel=Counting(tp.rank, tp.world))
        batch = StepBatch.build(["a"], [[1, 2, 3, 4, 5]], [0], [[0]], [list(range(5))], [True])
        with torch.no_grad():
            return executor.step(batch).float()

    logits = _on_ranks(2, step)
    torch.testing.assert_close(logits[0], logits[1])
    assert counts == [per_layer * model.config.num_hidden_layers] * 2


def test_a_fused_projection_split_takes_each_ranks_heads():
    """Phi-3's qkv_proj ([q | k | v] by heads) and GPT-NeoX's query_key_value ([heads, 3, D]): each rank's
    shard holds exactly the rows of its heads, as slicing the unfused q, k and v projections by heads gives
    (the fused gate_up_proj likewise: its share of gate, then of up); BLOOM's its heads' ALiBi slopes."""
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.models.parallel import TensorParallel

    whole = tiny_model("phi3", num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    d, heads, kv = 16, 4, 2
    wq, wk, wv = whole.model.layers[0].self_attn.qkv_proj.weight.detach().split([heads * d, kv * d, kv * d])
    gate, up = whole.model.layers[0].mlp.gate_up_proj.weight.detach().chunk(2)
    for rank in range(2):
        part = tiny_model("phi3", num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        adapter_for(part).shard(TensorParallel(rank, 2))
        got = part.model.layers[0].self_attn.qkv_proj.weight
        q, k, v = got.split([heads // 2 * d, kv // 2 * d, kv // 2 * d])
        assert torch.equal(q, wq.unflatten(0, (heads, d))[2 * rank : 2 * rank + 2].flatten(0, 1))
        assert torch.equal(k, wk.unflatten(0, (kv, d))[rank])
        assert torch.equal(v, wv.unflatten(0, (kv, d))[rank])
        g, u = part.model.layers[0].mlp.gate_up_proj.weight.chunk(2)
        assert torch.equal(g, gate.chunk(2)[rank]) and torch.equal(u, up.chunk(2)[rank])

    whole = tiny_model("gpt_neox", num_attention_heads=4)
    attn = whole.gpt_neox.layers[0].attention
    d = int(attn.head_size)
    fused = attn.query_key_value.weight.detach().unflatten(0, (4, 3, d))  # [heads, q/k/v, D, hidden]
    unfused = [
        fused[:, j].flatten(0, 1) for j in range(3)
    ]  # the separate q, k and v weights a model would have
    bias = attn.query_key_value.bias.detach().unflatten(0, (4, 3, d))
    for rank in range(2):
        part = tiny_model("gpt_neox", num_attention_heads=4)
        adapter_for(part).shard(TensorParallel(rank, 2))
        got = part.gpt_neox.layers[0].attention.query_key_value
        mine = got.weight.unflatten(0, (2, 3, d))
        for j in range(3):
            assert torch.equal(mine[:, j].flatten(0, 1), unfused[j][2 * rank * d : (2 * rank + 2) * d])
        assert torch.equal(got.bias.unflatten(0, (2, 3, d)), bias[2 * rank : 2 * rank + 2])

    # BLOOM's [heads, 3, D] likewise, and its ALiBi slopes: each rank its heads', also in an adapter made
    # later of the shard (the executor's)
    whole = tiny_model("bloom")
    slopes = adapter_for(whole).alibi_slopes[0]
    w = whole.transformer.h[0].self_attention.query_key_value.weight.detach()
    for rank in range(2):
        part = tiny_model("bloom")
        adapter = adapter_for(part)
        adapter.shard(TensorParallel(rank, 2))
        for a in (adapter, adapter_for(part)):
            assert a.num_heads == 2 and torch.equal(a.alibi_slopes[1], slopes[2 * rank : 2 * rank + 2])
        got = part.transformer.h[0].self_attention.query_key_value.weight
        assert torch.equal(got, w.unflatten(0, (4, -1))[2 * rank : 2 * rank + 2].flatten(0, 1))


def test_the_split_families_refusals_name_the_family_and_the_reason():
    """What tensor parallelism does not split is refused by name with the reason (the q/k norm over a whole
    projection of another kind than OLMo 2's RMSNorm; Falcon's layouts; GPT-BigCode; MoE MLPs; BLOOM's
    slow_but_exact slices) before any weight changes, and heads, KV heads and MLP widths the ranks do not
    divide are refused for every family."""
    from torch import nn

    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.models.parallel import TensorParallel

    model = tiny_model("olmo2")
    model.model.layers[1].self_attn.q_norm = nn.LayerNorm(64)  # a whole-width norm of another kind
    before = model.model.layers[0].self_attn.q_proj.weight.shape
    with pytest.raises(
        UserError, match=r"olmo2 model Olmo2ForCausalLM: layer 1's q_norm \(LayerNorm.*couples"
    ):
        adapter_for(model).shard(TensorParallel(0, 2))
    assert model.model.layers[0].self_attn.q_proj.weight.shape == before  # nothing was split
    cases = {
        "falcon": "not supported for falcon models .*multi-query form .*single KV head cannot be split",
        "gpt_bigcode": "not supported for gpt_bigcode models .*multi-query form .*cannot be split",
        "mixtral": "tensor parallelism .*the mixtral model .*sparse mixture-of-experts",
    }
    for family, why in cases.items():
        with pytest.raises(UserError, match=why):
            adapter_for(tiny_model(family)).check_shard(2)
    slow = tiny_model("bloom", pretraining_tp=2, slow_but_exact=True)
    with pytest.raises(
        UserError, match="bloom model BloomForCausalLM: .*slow_but_exact with pretraining_tp=2"
    ):
        adapter_for(slow).check_shard(2)
    indivisible = {
        "gemma": (
            {"num_attention_heads": 3, "num_key_value_heads": 3},
            r"gemma model .*attention heads.*\(3\)",
        ),
        "gpt_neox": (
            {"num_attention_heads": 4, "intermediate_size": 91},
            r"gpt_neox model .*MLP width.*\(91\)",
        ),
        "phi3": ({"num_attention_heads": 4, "num_key_value_heads": 1}, r"phi3 model .*KV heads.*\(1\)"),
        "glm": ({"intermediate_size": 33}, r"glm model .*MLP width.*\(33\)"),
    }
    for family, (overrides, why) in indivisible.items():
        with pytest.raises(UserError, match=rf"tensor_parallel_size 2 does not divide {why}"):
            adapter_for(tiny_model(family, **overrides)).check_shard(2)
