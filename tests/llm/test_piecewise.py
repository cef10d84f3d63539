"""Piecewise steps (steps with prompt tokens on static, bucket-padded buffers; CUDA graphs on a GPU)
give the eager step's logits and K/V, and their padding touches only the scratch block."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from tests.llm.serving_models import run_to_completion, tiny_llama
from tests.llm.tiny_models import tiny_model
from trtforge.errors import UserError
from trtforge.llm.engine import make_step_loop
from trtforge.llm.executors.piecewise import TOKEN_BUCKETS, PiecewiseStep
from trtforge.llm.executors.torch_exec import TorchExecutor
from trtforge.llm.models.families import adapter_for
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig


class _Lockstep:
    """Runs every step on both executors (the eager one's logits go back), recording the largest
    logit difference relative to the largest logit, and which steps had prompt tokens."""

    def __init__(self, eager: TorchExecutor, pieces: TorchExecutor) -> None:
        self.eager, self.pieces = eager, pieces
        self.max_rel_err = 0.0
        self.prompt_steps = self.mixed_steps = 0
        self.paths: list[str] = []

    def __getattr__(self, name):
        return getattr(self.eager, name)

    def _compare(self, batch, want, got):
        self.paths.append(self.pieces.path_of(batch))
        qlens = batch.query_lens
        self.prompt_steps += int((qlens > 1).any())
        self.mixed_steps += int((qlens > 1).any() and (qlens == 1).any())
        assert got.shape == want.shape and got.dtype == torch.float32
        if want.shape[0]:
            err = float((got.double() - want.double()).abs().max())
            self.max_rel_err = max(self.max_rel_err, err / float(want.abs().max()))
        return want

    def step(self, batch):
        return self._compare(batch, self.eager.step(batch), self.pieces.step(batch))

    def step_async(self, batch, feed):
        return self._compare(batch, self.eager.step_async(batch, feed), self.pieces.step_async(batch, feed))


def _tiny_gpt2():
    import transformers

    torch.manual_seed(3)
    config = transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=256)
    return transformers.GPT2LMHeadModel(config).double().eval()


def _serve(both, *, async_scheduling: bool, seed: int = 0, n: int = 14) -> dict:
    rng = np.random.default_rng(seed)
    config = SchedulerConfig(
        max_num_batched_tokens=48,
        max_prefill_chunk=20,
        max_prefill_tokens_with_decodes=12,
        async_scheduling=async_scheduling,
    )
    sched = make_step_loop(both, config)
    pending = [
        (int(rng.integers(0, 12)), i, rng.integers(3, 290, size=int(rng.integers(1, 50))).tolist())
        for i in range(n)
    ]
    pending.sort()
    step, done = 0, {}
    while pending or sched.has_unfinished():
        while pending and pending[0][0] <= step:
            _, rid, prompt = pending.pop(0)
            sched.add_request(
                rid, prompt, SamplingParams(max_tokens=int(rng.integers(1, 9)), ignore_eos=True)
            )
        done.update({o.request_id: o for o in sched.step() if o.finished})
        step += 1
    assert not [o.error for o in done.values() if o.error is not None]
    return done


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_piecewise_steps_match_eager_steps(family, async_scheduling):
    _piecewise_matches_eager(tiny_llama() if family == "llama" else _tiny_gpt2(), async_scheduling)


def test_piecewise_steps_of_layers_with_their_own_head_counts_match_eager_steps():
    """Laguna's 4, 8 and 2 query heads: each layer's q and attention output a view of its own width on
    the pieces' shared buffers. (Its gate's softplus rounds to float32 even in a float64 model, as
    transformers' does: a last-bit difference between a step's GEMM and its bucket's shows at 1e-7.)"""
    model = tiny_model("laguna", pad_token_id=None).double()  # (token 0's embedding nonzero: padding writes)
    assert adapter_for(model).heads_per_layer == [4, 8, 2]
    _piecewise_matches_eager(model, async_scheduling=False, tol=1e-6)


def _piecewise_matches_eager(model: torch.nn.Module, async_scheduling: bool, tol: float = 1e-12) -> None:
    """Mixed steps served piecewise give the eager steps' logits (within `tol` x 1e3 of the largest) and
    K/V (within `tol`) (:class:`_Lockstep`)."""
    kwargs = {"num_blocks": 64, "block_size": 4, "max_decode_batch": 8}
    eager = TorchExecutor(model, static_decode=False, **kwargs)
    pieces = TorchExecutor(model, static_decode=True, max_graph_tokens=32, **kwargs)
    assert eager._piecewise is None and pieces._piecewise is not None
    both = _Lockstep(eager, pieces)
    _serve(both, async_scheduling=async_scheduling)
    assert both.mixed_steps > 0 and both.prompt_steps > both.mixed_steps
    assert both.max_rel_err < tol * 1e3
    assert set(pieces._piecewise._records) <= {8, 16, 32} and pieces._piecewise._records
    # the same K/V in every real block; bucket padding wrote only the scratch block (the last)
    for a, b in zip((*eager.k_pools, *eager.v_pools), (*pieces.k_pools, *pieces.v_pools)):
        torch.testing.assert_close(b[:-1], a[:-1], rtol=tol, atol=tol)
        assert not a[-1].any() and b[-1].any()


@pytest.mark.parametrize("fill", [True, False], ids=["fill", "nofill"])
def test_the_scheduler_fills_piecewise_steps_with_decodes_to_their_bucket(fill):
    """The piecewise executor tells its buckets (ExecutorFacts.step_token_buckets); with fill_step_buckets
    a step with decodes and prompt tokens left takes prompt tokens up to its bucket (off: 12 prompt
    tokens beside the decodes, padded), and the logits and K/V still equal the eager executor's."""
    import dataclasses

    model = tiny_llama()
    kwargs = {"num_blocks": 64, "block_size": 4, "max_decode_batch": 8}
    eager = TorchExecutor(model, static_decode=False, **kwargs)
    pieces = TorchExecutor(model, static_decode=True, max_graph_tokens=32, **kwargs)
    assert eager.facts.step_token_buckets == () and pieces.facts.step_token_buckets == (8, 16, 32)
    tokens: list[int] = []

    class Filled(_Lockstep):
        facts = dataclasses.replace(pieces.facts, step_token_buckets=() if not fill else (8, 16, 32))

        def _compare(self, batch, want, got):
            if (batch.query_lens > 1).any() and (batch.query_lens == 1).any():
                tokens.append(batch.num_tokens)
            return super()._compare(batch, want, got)

    both = Filled(eager, pieces)
    _serve(both, async_scheduling=False, seed=2)
    assert both.max_rel_err < 1e-9 and len(tokens) > 8 and max(tokens) <= 48
    on_bucket = sum(t in (8, 16, 32) for t in tokens)
    if fill:  # every mixed step but the one taking the last prompt tokens
        assert on_bucket >= len(tokens) - 1, tokens
    else:
        assert on_bucket < len(tokens) // 2, tokens
    for a, b in zip((*eager.k_pools, *eager.v_pools), (*pieces.k_pools, *pieces.v_pools)):
        torch.testing.assert_close(b[:-1], a[:-1], rtol=1e-12, atol=1e-12)


def test_steps_above_the_largest_bucket_run_eagerly():
    model = tiny_llama()
    kwargs = {"num_blocks": 64, "block_size": 4, "static_decode": True}
    small = TorchExecutor(model, max_graph_tokens=12, **kwargs)
    assert small._piecewise.buckets == (8, 12)
    eager = TorchExecutor(model, mixed_graphs=False, **kwargs)
    both = _Lockstep(eager, small)
    _serve(both, async_scheduling=False, seed=1)
    assert both.max_rel_err < 1e-9 and set(small._piecewise._records) <= {8, 12}
    assert set(both.paths) == {"decode", "piecewise", "eager"}  # steps of over 12 tokens ran eagerly


@pytest.mark.parametrize(
    ("one", "piecewise_one", "own"), [(False, False, False), (False, True, True), (True, True, False)]
)
def test_the_capture_stream_settings_choose_the_piecewise_buckets_stream(
    monkeypatch, one, piecewise_one, own
):
    """PIECEWISE_ONE_STREAM (with ONE_CAPTURE_STREAM off) gives the buckets the runner's own stream, one for
    all; otherwise they take the executor's (a fresh stream each, or its one stream for every graph)."""
    from trtforge.llm.executors import torch_exec

    monkeypatch.setattr(torch_exec, "ONE_CAPTURE_STREAM", one)
    monkeypatch.setattr(torch_exec, "PIECEWISE_ONE_STREAM", piecewise_one)
    ex = TorchExecutor(tiny_llama(), num_blocks=16, block_size=4, static_decode=True)
    assert (ex._piecewise._stream is None) == own


def test_token_buckets_and_bad_sizes():
    step = PiecewiseStep(
        None, max_tokens=300, hidden=8, num_heads=2, head_dim=4, dtype=torch.float32,
        device=torch.device("cpu"), scratch_slot=0, graphs=False,
    )  # fmt: skip
    assert step.buckets[-1] == 300 and list(step.buckets) == sorted(set(step.buckets))
    assert [step.bucket(n) for n in (1, 8, 9, 200, 257, 300, 301)] == [8, 8, 16, 256, 300, 300, None]
    assert all(b % 8 == 0 for b in TOKEN_BUCKETS)
    with pytest.raises(UserError, match="max_graph_tokens must be a positive integer"):
        TorchExecutor(tiny_llama(), num_blocks=8, max_graph_tokens=0)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3"])
def test_piecewise_cuda_graphs_match_eager_steps_on_cuda(family):
    """Fused FP16 layers on trtforge's kernels: graphs per token bucket, attention between them (Qwen3's
    q/k head norms and Phi-3's fused projections and partial rotary inside the graphs too)."""
    from tests.llm.tiny_models import tiny_model

    model = tiny_llama() if family == "llama" else tiny_model(family, max_position_embeddings=512)
    base = copy.deepcopy(model).half().to("cuda")
    kwargs = {"num_blocks": 64, "block_size": 16, "max_decode_batch": 8, "static_decode": True}
    eager = TorchExecutor(copy.deepcopy(base), mixed_graphs=False, **kwargs)
    pieces = TorchExecutor(copy.deepcopy(base), max_graph_tokens=64, **kwargs)
    assert pieces.use_cuda_graphs and pieces.fused_refusal is None
    both = _Lockstep(eager, pieces)
    for async_scheduling in (False, True):
        _serve(both, async_scheduling=async_scheduling, seed=2, n=20)
    assert both.mixed_steps > 0
    assert both.max_rel_err < 2e-2
    used = len(pieces._piecewise._records)
    assert used and pieces.num_piecewise_graphs == used * (len(pieces.k_pools) + 1)
    assert pieces.capture_mixed_graphs() == len(pieces._piecewise.buckets) * (len(pieces.k_pools) + 1)
    for a, b in zip((*eager.k_pools, *eager.v_pools), (*pieces.k_pools, *pieces.v_pools)):
        torch.testing.assert_close(b[:-1], a[:-1], rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_engine_outputs_with_piecewise_graphs_equal_solo_runs_on_cuda():
    """Float64 tiny Llama on CUDA (torch kernels, graphs for both kinds of steps): every greedy output
    equals the request run alone."""
    model = tiny_llama().to("cuda")
    try:
        ex = TorchExecutor(model, num_blocks=256, block_size=16, max_graph_tokens=128)
        config = SchedulerConfig(
            max_num_batched_tokens=96, max_prefill_chunk=40, max_prefill_tokens_with_decodes=24
        )
        rng = np.random.default_rng(5)
        prompts = [rng.integers(3, 290, size=int(rng.integers(1, 80))).tolist() for _ in range(24)]
        params = [SamplingParams(max_tokens=int(rng.integers(1, 20)), ignore_eos=True) for _ in prompts]
        sched = make_step_loop(ex, config)
        for i, (p, sp) in enumerate(zip(prompts, params)):
            sched.add_request(i, p, sp)
        done = run_to_completion(sched)
        assert ex.num_piecewise_graphs > 0
        for i, (p, sp) in enumerate(zip(prompts, params)):
            solo = make_step_loop(TorchExecutor(model, num_blocks=64, block_size=16, mixed_graphs=False))
            solo.add_request("s", p, sp)
            assert done[i].output_token_ids == run_to_completion(solo)["s"].output_token_ids, i
    finally:
        tiny_llama().to("cpu")


def test_capture_all_prepares_the_largest_bucket_first():
    """The buckets' graphs share one memory pool: captured largest first, the smaller buckets' temporaries
    reuse the largest one's blocks (smallest first would grow the pool by a segment per bucket)."""
    ex = TorchExecutor(tiny_llama(), num_blocks=8, block_size=4, static_decode=True, max_graph_tokens=300)
    pieces = ex._piecewise
    pieces.capture_all()  # on the CPU: the same pieces, prepared in the same order, without graphs
    assert list(pieces._records) == sorted(pieces.buckets, reverse=True) and pieces.buckets[-1] == 300


class _Temporaries:
    """StepLayers whose every piece allocates (and frees) a `nbytes` temporary on the current stream."""

    num_layers = 2

    def __init__(self, nbytes: int, hidden: int) -> None:
        self.nbytes, self.hidden = nbytes, hidden

    def _scratch(self) -> None:
        torch.empty(self.nbytes, dtype=torch.uint8, device="cuda").fill_(1)

    def embed(self, ids, positions):
        return torch.zeros(ids.shape[0], self.hidden, device="cuda"), None

    def layer_in(self, i, h, extra, slots, out=None):
        self._scratch()
        return out.copy_(h.reshape(out.shape))

    def layer_out(self, i, h, o, out=None):
        self._scratch()
        return out.add_(o.reshape(h.shape))


@pytest.mark.gpu
def test_capture_all_leaves_no_warm_up_temporaries_cached_on_cuda():
    """Each bucket warms up on its own side stream before capture; the caching allocator keeps freed
    blocks per stream and a capture cannot release them, so warm-ups kept cached piled up over the buckets
    (an 8B FP8 model at 8,192-token steps ran out of memory capturing beside its sized pool). After
    capture_all, what the allocator holds unused stays within a couple of temporaries, not one a bucket."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    temp, pool = 64 << 20, torch.cuda.graph_pool_handle()  # one pool for every graph, as the executor's
    step = PiecewiseStep(
        _Temporaries(temp, 8), max_tokens=192, hidden=8, num_heads=2, head_dim=4, dtype=torch.float32,
        device=torch.device("cuda"), scratch_slot=0, graphs=True, pool=lambda: pool,
    )  # fmt: skip
    assert len(step.buckets) >= 5
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    step.capture_all()
    torch.cuda.synchronize()
    unused = (torch.cuda.memory_reserved() - reserved) - (torch.cuda.memory_allocated() - allocated)
    assert step.num_graphs == len(step.buckets) * 3
    assert unused < 3 * temp, f"{unused / 2**20:.0f} MiB cached after capturing {len(step.buckets)} buckets"
