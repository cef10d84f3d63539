"""The fused MoE kernels (trtforge.kernels.moe): the alignment against a Python reference (ragged counts,
experts with no tokens, every token to one expert, one token), its static sizes and its freedom from host
reads; the two grouped GEMMs against a float64 reference at token counts across the config table (plain,
gpt-oss's and Llama 4's experts, whose scaled inputs round as the reference rounds them), in Triton's CPU
interpreter without CUDA and for real on a GPU (``-m gpu``); the refusals; every table config compiled for
sm_90 on the CPU; on a GPU, no sync under ``set_sync_debug_mode`` and a CUDA graph replayed under new
routings. The families' blocks against their grouped formulation: tests/llm/models/test_moe_fused.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests._devices import DEVICES, skip_unless_runs_here
from tests._host_sync import no_host_reads
from tests.kernels._sm90 import compile_facts, needs_ptxas, run_in_child

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
_ULP = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-24}  # half an ulp at 1.0


def _reference_alignment(experts: torch.Tensor, num_experts: int, block_m: int):
    """The pair ids in expert order (stable), each expert's run padded with the sentinel to whole blocks;
    each block's expert; the padded count."""
    flat = experts.reshape(-1).tolist()
    sentinel = len(flat)
    ids, blocks = [], []
    for e in range(num_experts):
        run = [p for p, x in enumerate(flat) if x == e]
        run += [sentinel] * (-len(run) % block_m)
        ids += run
        blocks += [e] * (len(run) // block_m)
    return ids, blocks, len(ids)


def _routing(n: int, k: int, num_experts: int, seed: int, skew: float = 0.0) -> torch.Tensor:
    """[n, k] distinct expert ids a token, drawn with expert e's weight exp(-skew * e) (ragged counts)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.exp(-skew * torch.arange(num_experts, dtype=torch.float64)).expand(n, -1)
    return torch.multinomial(w, k, replacement=False, generator=g)


# (name, experts [N, k], E, BLOCK_M)
ALIGN_CASES = [
    ("ragged", _routing(37, 2, 6, seed=1, skew=0.6), 6, 4),
    ("ragged, wide blocks", _routing(50, 3, 8, seed=2, skew=0.4), 8, 16),
    ("experts with no tokens", torch.tensor([[1, 3], [3, 1], [1, 4], [4, 1], [3, 4]]), 7, 4),
    ("every token to one expert", torch.full((11, 1), 2), 4, 4),
    ("every token to the same two", torch.tensor([[0, 3]] * 9), 4, 8),
    ("one token", torch.tensor([[5, 2]]), 8, 16),
    ("counts on whole blocks", torch.tensor([[0, 1], [1, 0], [2, 3], [3, 2]] * 4), 4, 4),
]


@needs_triton
@pytest.mark.parametrize(
    ("name", "experts", "num_experts", "block_m"), ALIGN_CASES, ids=[c[0] for c in ALIGN_CASES]
)
def test_alignment_matches_the_python_reference(monkeypatch, name, experts, num_experts, block_m):
    """Exact ids, block experts and padded count; past the count only sentinels; sizes from N, k, E and
    BLOCK_M alone; no host read of a device value on the way."""
    from trtforge.kernels.moe import align_block_size, sorted_capacity

    with no_host_reads(monkeypatch):
        sorted_ids, block_expert, padded = align_block_size(experts, num_experts, block_m)
    ids, blocks, count = _reference_alignment(experts, num_experts, block_m)
    p = experts.numel()
    cap = sorted_capacity(p, num_experts, block_m)
    assert sorted_ids.dtype == block_expert.dtype == padded.dtype == torch.int32
    assert tuple(sorted_ids.shape) == (cap,) and tuple(block_expert.shape) == (cap // block_m,)
    assert tuple(padded.shape) == (1,) and int(padded) == count
    assert sorted_ids[:count].tolist() == ids
    assert (sorted_ids[count:] == p).all()
    assert block_expert[: count // block_m].tolist() == blocks


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_the_alignment_kernel_gives_the_torch_ops_results(monkeypatch, device):
    """The one-program alignment (decode-sized calls) against the torch ops, bit for bit: expert counts
    not a power of two and past one chunk of experts (600: eight pairs a chunk), every block size, pair
    counts up to the kernel's limit (several chunks, so the running counts carry), skewed and even
    routings; past the limit, or with more experts than it holds, the torch ops run."""
    from trtforge.kernels import moe

    skip_unless_runs_here(device)
    cases = [(1, 8, 128, 16), (3, 2, 6, 4), (64, 8, 128, 64), (128, 8, 128, 128), (256, 4, 600, 16)]
    cases += [(512, 2, 8, 32), (100, 6, 64, 16)]
    for n, k, e, bm in cases:
        for experts in (_routing(n, k, e, seed=n + e, skew=0.3), torch.arange(n * k).reshape(n, k) % e):
            flat = experts.reshape(-1).to(device)
            want = moe._align_by_torch(flat, e, bm)
            got = moe._align_by_kernel(flat, e, bm)
            count = int(want[2])
            assert int(got[2]) == count, (n, k, e, bm)
            assert torch.equal(got[0], want[0]), (n, k, e, bm)
            assert torch.equal(got[1], want[1]), (n, k, e, bm)
    calls = []
    monkeypatch.setattr(moe, "_align_by_kernel", lambda *a: calls.append("kernel") or moe._align_by_torch(*a))
    moe.align_block_size(_routing(64, 8, 128, seed=0).to(device), 128, 16)
    moe.align_block_size(_routing(129, 8, 128, seed=0).to(device), 128, 16)
    moe.align_block_size(_routing(2, 1, 1025, seed=0).to(device), 1025, 16)
    assert calls == ["kernel"]


def test_alignment_sizes_depend_on_n_k_e_and_block_m_only():
    """Every routing of N tokens to k of E experts gets the same output sizes, whose capacity holds the
    padded count of each (random draws, and the worst case: every expert hit one past a whole block)."""
    from trtforge.kernels.moe import align_block_size, sorted_capacity

    for n, k, e, bm in ((1, 2, 8, 16), (7, 2, 4, 16), (40, 4, 16, 32), (300, 2, 8, 64)):
        cap = sorted_capacity(n * k, e, bm)
        routings = [_routing(n, k, e, seed=s, skew=s / 4) for s in range(6)]
        routings.append(torch.arange(n * k).reshape(n, k) % e)  # spread evenly
        for experts in routings:
            sorted_ids, block_expert, padded = align_block_size(experts, e, bm)
            assert tuple(sorted_ids.shape) == (cap,) and tuple(block_expert.shape) == (cap // bm,)
            assert int(padded) <= cap
    # the bound is reached: 4 experts each hit bm + 1 times pad to 2 blocks apiece
    experts = torch.arange(4).repeat_interleave(17)[:, None]
    _, _, padded = align_block_size(experts, 4, 16)
    assert int(padded) == sorted_capacity(68, 4, 16) == 128


def _operands(n, h, i, e, k, dtype, seed, weights_dtype=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g).to(dtype)
    gate_up = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype)
    down = (torch.randn(e, h, i, generator=g) / i**0.5).to(dtype)
    experts = _routing(n, k, e, seed=seed + 1, skew=0.5)
    weights = torch.rand(n, k, generator=g).to(weights_dtype or dtype)
    return x, gate_up, down, weights, experts


def _assert_matches(got, x, gate_up, down, weights, experts) -> None:
    """`got` against the float64 math: per element ``|got - want| <= 2 half-ulps of (|want| + m)`` with m
    the magnitude the rounded intermediate rows reach (``sum_j |w| |down| @ |act * up|``), plus FP32
    summation order."""
    x64, gu, dn, w = x.double().cpu(), gate_up.double().cpu(), down.double().cpu(), weights.double().cpu()
    ex = experts.cpu()
    gate, up = torch.einsum("nh,nkih->nki", x64, gu[ex]).chunk(2, dim=-1)
    inter = torch.nn.functional.silu(gate) * up
    want = torch.einsum("nki,nkhi->nkh", inter, dn[ex])
    want, mag = (want * w[..., None]).sum(1), torch.einsum("nki,nkhi->nkh", inter.abs(), dn[ex].abs())
    _assert_within(got, x, want, (mag * w.abs()[..., None]).sum(1))


def _assert_within(got, x, want, mag) -> None:
    """`got` (x's dtype and shape) within a few of x's rounding units of the float64 `want`, scaled by the
    float64 magnitude `mag` of the sums behind each output (their cancellation can hide error)."""
    tol = 4 * _ULP[x.dtype] * (want.abs() + mag) + 2**-20 * mag + 1e-6
    err = (got.double().cpu() - want).abs()
    assert got.dtype == x.dtype and got.shape == x.shape
    worst = int((err - tol).argmax())
    assert (err <= tol).all(), (
        f"{int((err > tol).sum())} of {err.numel()} outputs off; worst {divmod(worst, err.shape[1])}: "
        f"got {got.flatten()[worst].item()} want {want.flatten()[worst].item()} tol {tol.flatten()[worst]}"
    )


# (N, H, I, E, k): every row of the table by rows per expert (N k / E: 0.5, 2.5 and 2.25 take 16-row
# blocks, 30 take 32, 100 take 64); H and I on and off the tiles (K chunks masked, columns wrapped), k = 1
KERNEL_CASES = [
    (1, 64, 48, 4, 2),
    (5, 40, 32, 6, 3),
    (60, 64, 80, 4, 2),
    (400, 32, 48, 8, 2),
    (9, 64, 64, 4, 1),
]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("n", "h", "i", "e", "k"), KERNEL_CASES, ids=str)
def test_fused_moe_matches_the_float64_math(device, dtype, n, h, i, e, k):
    from trtforge.kernels.moe import fused_moe

    skip_unless_runs_here(device)
    ops = _operands(n, h, i, e, k, dtype, seed=n + h + i + e)
    got = fused_moe(*(t.to(device) for t in ops))
    _assert_matches(got, *ops)


# gpt-oss's experts (transformers' GptOssExperts): x @ W + b, interleaved gate / up columns, the clamped
# SwiGLU; alpha as gpt-oss's config, the limit low enough that the clamps bite on these draws
ALPHA, LIMIT = 1.702, 1.0


def _gpt_oss_operands(n, h, i, e, k, dtype, seed, padded_rows=False):
    """x, gate_up [E, H, 2I], down [E, I, H] (`padded_rows`: views of wider tensors, so their strides
    along K are not their widths), weights, experts, gate_up_bias [E, 2I], down_bias [E, H]."""
    g = torch.Generator().manual_seed(seed)
    pad = 8 if padded_rows else 0
    x = torch.randn(n, h, generator=g).to(dtype)
    gate_up = (2 * torch.randn(e, h, 2 * i + pad, generator=g) / h**0.5).to(dtype)[..., : 2 * i]
    down = (torch.randn(e, i, h + pad, generator=g) / i**0.5).to(dtype)[..., :h]
    experts = _routing(n, k, e, seed=seed + 1, skew=0.5)
    weights = torch.rand(n, k, generator=g).to(dtype)
    gate_up_bias = (0.5 * torch.randn(e, 2 * i, generator=g)).to(dtype)
    down_bias = (0.5 * torch.randn(e, h, generator=g)).to(dtype)
    return x, gate_up, down, weights, experts, gate_up_bias, down_bias


def _gpt_oss_call(x, gate_up, down, weights, experts, gate_up_bias, down_bias, **kw):
    from trtforge.kernels.moe import fused_moe

    return fused_moe(
        x, gate_up, down, weights, experts, transposed=True, interleaved=True, gate_up_bias=gate_up_bias,
        down_bias=down_bias, activation="gpt_oss_swiglu", alpha=ALPHA, limit=LIMIT, **kw,
    )  # fmt: skip


def _assert_gpt_oss_matches(got, x, gate_up, down, weights, experts, gate_up_bias, down_bias) -> None:
    """`got` against transformers' GptOssExperts math in float64, with :func:`_assert_matches`'s bound
    (the magnitude counting the down bias); the clamps must bite on the draw (gate above the limit, up
    beyond +-limit)."""
    x64, gu, dn, w = x.double().cpu(), gate_up.double().cpu(), down.double().cpu(), weights.double().cpu()
    ex, gb, db = experts.cpu(), gate_up_bias.double().cpu(), down_bias.double().cpu()
    pre = torch.einsum("nh,nkhc->nkc", x64, gu[ex]) + gb[ex]
    gate, up = pre[..., ::2], pre[..., 1::2]
    assert (gate > LIMIT).float().mean() > 0.05 and (up.abs() > LIMIT).float().mean() > 0.05
    gate, up = gate.clamp(max=LIMIT), up.clamp(-LIMIT, LIMIT)
    inter = (up + 1) * gate * torch.sigmoid(ALPHA * gate)
    pair = torch.einsum("nki,nkih->nkh", inter, dn[ex]) + db[ex]
    want = (pair * w[..., None]).sum(1)
    mag = torch.einsum("nki,nkih->nkh", inter.abs(), dn[ex].abs()) + db[ex].abs()
    _assert_within(got, x, want, (mag * w.abs()[..., None]).sum(1))


# (N, H, I, E, k, padded rows): 16-, 32- and 64-row blocks; K chunks masked and columns wrapped (H 40,
# I 24); weights whose stride along K is not their width
GPT_OSS_CASES = [
    (5, 40, 24, 6, 3, False),
    (60, 64, 80, 4, 2, True),
    (200, 32, 48, 4, 2, False),
]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("n", "h", "i", "e", "k", "padded"), GPT_OSS_CASES, ids=str)
def test_gpt_oss_experts_match_the_float64_math(device, dtype, n, h, i, e, k, padded):
    """gpt-oss's layout read in place (transposed, interleaved, biased, the clamped SwiGLU)."""
    skip_unless_runs_here(device)
    ops = _gpt_oss_operands(n, h, i, e, k, dtype, seed=n + h, padded_rows=padded)
    got = _gpt_oss_call(*(t.to(device) for t in ops))
    _assert_gpt_oss_matches(got, *ops)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("transposed", "interleaved"), [(True, False), (False, True), (True, True)])
def test_each_layout_option_alone_reads_the_same_experts(device, transposed, interleaved):
    """The layout options are independent: the plain experts rewritten transposed and / or with gate / up
    columns interleaved (SiLU, no biases) give the plain float64 math (K chunks masked, columns wrapped)."""
    from trtforge.kernels.moe import fused_moe

    skip_unless_runs_here(device)
    x, gu, dn, w, ex = _operands(37, 40, 24, 6, 2, torch.float32, seed=4)
    gate_up, down = gu, dn
    if interleaved:  # rows (gate 0, up 0, gate 1, up 1, ...)
        gate_up = torch.stack(gu.chunk(2, dim=1), dim=2).reshape(gu.shape)
    if transposed:
        gate_up, down = gate_up.transpose(1, 2).contiguous(), dn.transpose(1, 2).contiguous()
    on = [t.to(device) for t in (x, gate_up, down, w, ex)]
    _assert_matches(fused_moe(*on, transposed=transposed, interleaved=interleaved), x, gu, dn, w, ex)


def _assert_input_scaled_matches(got, x, gate_up, down, weights, experts) -> None:
    """`got` against Llama 4's experts in float64 from their rounded inputs: each pair's row of x times its
    routing weight rounded to x's dtype as torch rounds it (``(x[t] * w).to(x.dtype)``, what the kernel
    must match bit for bit), then ``down @ (silu(gate) * up)`` summed over the k unweighted; plain layout
    (``[E, 2 I, H]``, ``[E, H, I]``), with :func:`_assert_matches`' bound."""
    rows = (x[:, None, :] * weights[..., None]).to(x.dtype).double().cpu()  # [N, k, H]
    gu, dn, ex = gate_up.double().cpu(), down.double().cpu(), experts.cpu()
    gate, up = torch.einsum("nkh,nkih->nki", rows, gu[ex]).chunk(2, dim=-1)
    inter = torch.nn.functional.silu(gate) * up
    want = torch.einsum("nki,nkhi->nkh", inter, dn[ex]).sum(1)
    _assert_within(got, x, want, torch.einsum("nki,nkhi->nkh", inter.abs(), dn[ex].abs()).sum(1))


# (N, H, I, E, k): one token; ragged counts with expert 2 given none (16-row blocks, K chunks masked and
# columns wrapped at H 40, I 24); k = 1 at 25 rows an expert (32-row blocks)
SCALE_INPUT_CASES = [(1, 40, 24, 4, 2), (23, 40, 24, 6, 2), (100, 32, 48, 4, 1)]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("transposed", [True, False], ids=["transposed", "plain"])
@pytest.mark.parametrize(("n", "h", "i", "e", "k"), SCALE_INPUT_CASES, ids=str)
def test_input_scaled_experts_match_the_float64_math(device, dtype, transposed, n, h, i, e, k):
    """Llama 4's experts (``scale_input``, with its transposed layout; the plain one too, the option being
    independent): the float64 math of the rounded scaled inputs, summed unweighted."""
    from trtforge.kernels.moe import fused_moe

    skip_unless_runs_here(device)
    x, gu, dn, w, _ = _operands(n, h, i, e, k, dtype, seed=n + e)
    ex = _routing(n, k, e - 1, seed=n, skew=0.5)
    ex = ex + (ex >= 2)  # expert 2 gets no token
    w = 2 * w  # weights past 1, as a sigmoid's are not: the rounding of the scaled rows shows either way
    gate_up, down = (
        (gu.transpose(1, 2).contiguous(), dn.transpose(1, 2).contiguous()) if transposed else (gu, dn)
    )
    got = fused_moe(
        *(t.to(device) for t in (x, gate_up, down, w, ex)), transposed=transposed, scale_input=True
    )
    _assert_input_scaled_matches(got, x, gu, dn, w, ex)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_input_scaling_rounds_the_scaled_rows_as_the_reference_does(device):
    """BF16 x scaled by BF16 weights and by float32 ones (promoted: the product rounded to float32, then
    to BF16): the fused call equals fused_moe on the rows pre-scaled by torch with unit weights, bit for bit
    (one token a pair, so each pair's output is one store); and scale_input off weights the outputs, not
    the inputs."""
    from trtforge.kernels.moe import fused_moe

    skip_unless_runs_here(device)
    x, gu, dn, w, ex = _operands(12, 64, 32, 4, 1, torch.bfloat16, seed=9)
    on = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    for weights in (3 * w, 3 * w.float() + 2**-12):
        scaled = (x * weights).to(x.dtype)
        want = fused_moe(*on(scaled, gu, dn, torch.ones_like(weights), ex))
        got = fused_moe(*on(x, gu, dn, weights, ex), scale_input=True)
        assert torch.equal(got, want), weights.dtype
    plain = fused_moe(*on(x, gu, dn, w, ex))
    _assert_matches(plain, x, gu, dn, w, ex)
    assert not torch.equal(plain, fused_moe(*on(x, gu, dn, w, ex), scale_input=True))


@needs_triton
def test_gpt_oss_options_refused_when_inconsistent():
    from trtforge.kernels.moe import fused_moe

    x, gu, dn, w, ex, gb, db = _gpt_oss_operands(3, 32, 8, 4, 2, torch.float32, seed=0)
    swiglu = {"activation": "gpt_oss_swiglu", "alpha": ALPHA, "limit": LIMIT}
    both = {"transposed": True, "interleaved": True, "gate_up_bias": gb, "down_bias": db}
    assert _gpt_oss_call(x[:0], gu, dn, w[:0], ex[:0], gb, db).shape == (0, 32)
    with pytest.raises(ValueError, match=r"gate_up must be torch.float32 \[E, 2 I, 32\]"):
        fused_moe(x, gu, dn, w, ex)  # gpt-oss's weights without transposed
    with pytest.raises(ValueError, match=r"down must be torch.float32 \[4, 8, 32\] \(transposed\)"):
        fused_moe(x, gu, dn.transpose(1, 2), w, ex, **both, **swiglu)
    with pytest.raises(ValueError, match="needs limit as a float"):
        fused_moe(x, gu, dn, w, ex, **both, activation="gpt_oss_swiglu", alpha=ALPHA)
    with pytest.raises(ValueError, match="alpha is a parameter of 'gpt_oss_swiglu', not of 'silu'"):
        fused_moe(x, gu, dn, w, ex, **both, alpha=ALPHA)
    with pytest.raises(ValueError, match="both or neither"):
        fused_moe(x, gu, dn, w, ex, **(both | {"down_bias": None}), **swiglu)
    with pytest.raises(ValueError, match=r"gate_up_bias must be torch.float32 \[4, 16\]"):
        fused_moe(x, gu, dn, w, ex, **(both | {"gate_up_bias": gb[:, :8]}), **swiglu)
    with pytest.raises(ValueError, match=r"down_bias must be torch.float32 \[4, 32\]"):
        fused_moe(x, gu, dn, w, ex, **(both | {"down_bias": db.half()}), **swiglu)
    with pytest.raises(ValueError, match=r"scale_input .* got interleaved=True, biases=True"):
        fused_moe(x, gu, dn, w, ex, **both, **swiglu, scale_input=True)  # no model scales gpt-oss's inputs


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_float32_routing_weights_and_a_config_given(device):
    """BF16 experts with float32 routing weights (Mixtral's): each pair's output weighted in FP32; any
    config of the table gives the same result at one token count (the table is a speed choice only)."""
    from trtforge.kernels.moe import MOE_CONFIGS, fused_moe

    skip_unless_runs_here(device)
    ops = _operands(23, 64, 48, 5, 2, torch.bfloat16, seed=3, weights_dtype=torch.float32)
    on = [t.to(device) for t in ops]
    outs = [fused_moe(*on, config=cfg) for _, cfg in MOE_CONFIGS]
    for got in outs:
        _assert_matches(got, *ops)
        torch.testing.assert_close(got, outs[0], rtol=2**-7, atol=2**-7)


@needs_triton
def test_zero_tokens_and_the_refusals():
    from trtforge.kernels.moe import MoeConfig, MoeTile, fused_moe

    x, gu, dn, w, ex = _operands(3, 32, 16, 4, 2, torch.float32, seed=0)
    assert fused_moe(x[:0], gu, dn, w[:0], ex[:0]).shape == (0, 32)
    with pytest.raises(ValueError, match="activation must be one of"):
        fused_moe(x, gu, dn, w, ex, activation="gelu")
    with pytest.raises(ValueError, match="x must be FP16, BF16 or FP32"):
        fused_moe(x.double(), gu, dn, w, ex)
    with pytest.raises(ValueError, match="gate_up must be"):
        fused_moe(x, gu.half(), dn, w, ex)
    with pytest.raises(ValueError, match=r"down must be torch.float32 \[4, 32, 16\]"):
        fused_moe(x, gu, dn.transpose(1, 2), w, ex)
    with pytest.raises(ValueError, match="weights must be float"):
        fused_moe(x, gu, dn, w[:, :1], ex)
    with pytest.raises(ValueError, match="experts must be integer"):
        fused_moe(x, gu, dn, w, ex.float())
    with pytest.raises(ValueError, match="block_m must be"):
        MoeConfig(8, MoeTile(), MoeTile())


def test_the_table_picks_by_rows_per_expert():
    from trtforge.kernels.moe import moe_config

    """By the rows an expert gets on average (tokens x k / E): Mixtral's (k 2 of 8) and Qwen3-MoE's (8 of
    128) decode steps take 16-row blocks, their prefills 64, their long prefills 128."""
    mixtral = [moe_config(n, 2, 8).block_m for n in (1, 64, 95, 96, 127, 128, 1023, 1024, 4096)]
    assert mixtral == [16, 16, 16, 32, 32, 64, 64, 128, 128]
    qwen3 = [moe_config(n, 8, 128).block_m for n in (1, 256, 383, 384, 511, 512, 4095, 4096)]
    assert qwen3 == [16, 16, 16, 32, 32, 64, 64, 128]


def test_the_launch_path_reads_nothing_back():
    """The source of everything a fused MoE layer call runs on the host holds no host read of a device
    value and no op whose output size is data (the runtime trap above covers the alignment; the kernel
    launches are checked here, where the interpreter itself reads tensors)."""
    import inspect

    from trtforge.kernels import moe

    launch_path = (moe.fused_moe, moe.align_block_size, moe._align_by_torch, moe._align_by_kernel)
    for fn in (*launch_path, moe.sorted_capacity, moe.moe_config):
        src = inspect.getsource(fn)
        for banned in (
            ".item(",
            ".tolist(",
            "bincount",
            "nonzero",
            ".cpu(",
            ".numpy(",
            "synchronize",
            "unique",
        ):
            assert banned not in src, f"{fn.__name__} calls {banned}"


# ---------------------------------------------------------------- sm_90 compile on the CPU


def _compile_facts(block_m: int, tile: dict, gated: bool, dtype: str, form: str = "plain") -> dict:
    """Compile one launch of the kernel for sm_90 as fused_moe specializes it (`form`): Mixtral's H and I
    in the plain layout (Bias, alpha and limit None), gpt-oss-20b's (H = I = 2880) in gpt-oss's
    (transposed, interleaved, biased, the clamped SwiGLU), Llama 4 Scout's (H 5120, I 8192) in its own
    (transposed, inputs scaled, outputs unweighted)."""
    import torch

    from trtforge.kernels import moe

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    tile = vars(moe.for_dtype(moe.MoeTile(**tile), torch_dtype, block_m))

    gpt_oss, llama4 = form == "gpt_oss", form == "llama4"
    h, i = {"plain": (4096, 14336), "gpt_oss": (2880, 2880), "llama4": (5120, 8192)}[form]
    cols, depth = (i, h) if gated else (h, i)
    elem = f"*{dtype}"
    pointers = {"A": elem, "W": elem, "Out": elem, "RoutingW": f"*{dtype}" if llama4 else "*fp32"}
    pointers |= {"SortedIds": "*i32", "BlockExpert": "*i32", "Padded": "*i32"}
    # the stride along W[e]'s K axis: its width (x2 gated) when transposed, else K
    stride_wn = cols * (2 if gated else 1) if form != "plain" else depth
    ints = {"N": cols, "K": depth, "stride_am": depth, "stride_we": 2 * i * h, "stride_wn": stride_wn}
    ints |= {"stride_om": cols, "num_pairs": 2, "row_blocks": 2}
    consts = {
        "ROW_DIV": 2 if gated else 1,
        "GATED": gated,
        "ACT": "gpt_oss_swiglu" if gpt_oss else "silu",
        "ROUTED": not gated and not llama4,
        "EVEN_K": depth % tile["block_k"] == 0,
        "DOT_F32": False,
        "PRECISION": "ieee" if dtype == "fp32" else "tf32",
        "BLOCK_M": block_m,
        "BLOCK_N": tile["block_n"],
        "BLOCK_K": tile["block_k"],
    }
    scalars = {}
    if gpt_oss:
        pointers["Bias"] = elem
        scalars = {"alpha": "fp32", "limit": "fp32"}
        consts |= {"W_KN": True, "INTERLEAVED": gated, "HAS_BIAS": True}
    else:
        consts |= {"Bias": None, "alpha": None, "limit": None}
    if llama4:
        consts |= {"W_KN": True, "SCALE_INPUT": gated}
    return compile_facts(
        moe._moe_gemm_kernel, pointers, ints, consts, tile["num_warps"], tile["num_stages"], scalars
    )


def _compile_table(dtype: str, form: str = "plain") -> list[dict]:
    """Every launch of the table compiled in one child process (:func:`_table`'s order)."""
    return [_compile_facts(block_m, tile, gated, dtype, form) for block_m, tile, gated in _table()]


def _table() -> list[tuple[int, dict, bool]]:
    from trtforge.kernels.moe import MOE_CONFIGS

    return [
        (c.block_m, tile.__dict__, gated)
        for _, c in MOE_CONFIGS
        for tile, gated in ((c.up, True), (c.down, False))
    ]


def test_every_table_config_compiles_for_sm90_to_bf16_wgmma_without_spills():
    """Each launch of each config in the table: BF16 products on the tensor cores with FP32 sums (wgmma
    at 64-row blocks; below a warpgroup's 64 rows Triton takes mma.sync), the tiles in shared memory, no
    ptxas spills."""
    needs_ptxas()
    for (block_m, tile, gated), facts in zip(_table(), run_in_child(f"{__name__}:_compile_table", "bf16")):
        where = f"block_m {block_m} {tile} gated {gated}"
        assert facts["ptxas_rc"] == 0, (where, facts["ptxas"])
        mma = {op for op in facts["counts"] if op.startswith(("wgmma.mma_async", "mma.sync"))}
        assert mma and all(".f32.bf16.bf16" in op for op in mma), (where, mma)
        if block_m >= 64:
            assert all(op.startswith("wgmma") for op in mma), (where, mma)
        assert not any(facts["spills"]), (where, facts["ptxas"])
        assert facts["shared"] <= 232448, where


def test_float32_multiplies_in_ieee_float32_and_fits():
    """An FP32 model's products: FP32 FMAs, not TF32 tensor-core products (which round the inputs to 10
    mantissa bits); every table config, as :func:`for_dtype` launches it for FP32, in shared memory
    without spills."""
    needs_ptxas()
    for (block_m, tile, gated), facts in zip(_table(), run_in_child(f"{__name__}:_compile_table", "fp32")):
        where = f"block_m {block_m} {tile} gated {gated}"
        assert facts["ptxas_rc"] == 0, (where, facts["ptxas"])
        assert not any("tf32" in op for op in facts["counts"]), (where, sorted(facts["counts"]))
        assert any(op.startswith("fma.rn.f32") for op in facts["counts"]), where
        assert not any(facts["spills"]) and facts["shared"] <= 232448, (where, facts["shared"])


@pytest.mark.parametrize("form", ["gpt_oss", "llama4"])
def test_transposed_launches_compile_for_sm90_without_spills(form):
    """The launches of every table config in BF16 for the transposed experts read in place: gpt-oss-20b's
    (interleaved gate / up, biases, the clamped SwiGLU) and Llama 4 Scout's (the gate_up rows scaled by
    their routing weights and rounded to BF16 before the dot, the down outputs unweighted). BF16
    tensor-core products with FP32 sums (wgmma at 64-row blocks), no spills, in shared memory."""
    needs_ptxas()
    compiled = run_in_child(f"{__name__}:_compile_table", "bf16", form)
    for (block_m, tile, gated), facts in zip(_table(), compiled):
        where = f"{form} block_m {block_m} {tile} gated {gated}"
        assert facts["ptxas_rc"] == 0, (where, facts["ptxas"])
        mma = {op for op in facts["counts"] if op.startswith(("wgmma.mma_async", "mma.sync"))}
        assert mma and all(".f32.bf16.bf16" in op for op in mma), (where, mma)
        if block_m >= 64:
            assert all(op.startswith("wgmma") for op in mma), (where, mma)
        assert not any(facts["spills"]), (where, facts["ptxas"])
        assert facts["shared"] <= 232448, where


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1, 7, 64, 300, 2000])
def test_gpu_matches_at_wider_shapes(dtype, n):
    """E 64, k 6 (Qwen-like) and E 8, k 2 (Mixtral-like) at a 512-wide model, every row of the table."""
    from trtforge.kernels.moe import fused_moe

    for e, k in ((64, 6), (8, 2)):
        ops = _operands(n, 512, 384, e, k, dtype, seed=n + e)
        _assert_matches(fused_moe(*(t.cuda() for t in ops)), *ops)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1, 7, 300, 2000])
def test_gpu_input_scaled_experts_match_at_wider_shapes(dtype, n):
    """Llama 4-like blocks (E 16, k 1 as Scout's; E 8, k 2) at a 512-wide model, transposed and inputs
    scaled, every row of the table."""
    from trtforge.kernels.moe import fused_moe

    for e, k in ((16, 1), (8, 2)):
        x, gu, dn, w, ex = _operands(n, 512, 384, e, k, dtype, seed=n + e)
        on = [t.cuda() for t in (x, gu.transpose(1, 2).contiguous(), dn.transpose(1, 2).contiguous(), w, ex)]
        _assert_input_scaled_matches(fused_moe(*on, transposed=True, scale_input=True), x, gu, dn, w, ex)


@pytest.mark.gpu
def test_gpu_fused_moe_never_syncs():
    """torch's own check: any synchronizing CUDA call in a fused MoE layer call raises."""
    from trtforge.kernels.moe import fused_moe

    ops = [t.cuda() for t in _operands(33, 256, 128, 8, 2, torch.bfloat16, seed=5)]
    fused_moe(*ops)  # compile first (Triton's launcher may query the device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused_moe(*ops)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_gpu_graph_replays_follow_new_routings():
    """One captured fused MoE call replayed under routings written into its input buffers after capture
    (ragged, every token to one expert, the capture's routing reversed): each replay gives the eager
    call's result for that routing, bit for bit."""
    from trtforge.kernels.moe import fused_moe

    n, h, i, e, k = 24, 256, 128, 8, 2
    x, gu, dn, w, ex = (t.cuda() for t in _operands(n, h, i, e, k, torch.bfloat16, seed=7))
    bufs = [x.clone(), w.clone(), ex.clone()]
    fused_moe(bufs[0], gu, dn, bufs[1], bufs[2])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(bufs[0], gu, dn, bufs[1], bufs[2])
    g = torch.Generator().manual_seed(9)
    routings = [
        _routing(n, k, e, seed=11, skew=1.5).cuda(),
        torch.tensor([[3, 5]] * n, device="cuda"),
        ex.flip(0),
    ]
    for experts in routings:
        new_x = torch.randn(n, h, generator=g).to(torch.bfloat16).cuda()
        new_w = torch.rand(n, k, generator=g).to(torch.bfloat16).cuda()
        for buf, value in zip(bufs, (new_x, new_w, experts)):
            buf.copy_(value)
        graph.replay()
        want = fused_moe(new_x, gu, dn, new_w, experts)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        _assert_matches(out, new_x, gu, dn, new_w, experts)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1, 7, 300, 2000])
def test_gpu_gpt_oss_experts_match_at_wider_shapes(dtype, n):
    """gpt-oss-like blocks (E 32, k 4; padded weight rows at E 8, k 2) at a 512-wide model, every row of
    the table."""
    for e, k, padded in ((32, 4, False), (8, 2, True)):
        ops = _gpt_oss_operands(n, 512, 384, e, k, dtype, seed=n + e, padded_rows=padded)
        _assert_gpt_oss_matches(_gpt_oss_call(*(t.cuda() for t in ops)), *ops)


@pytest.mark.gpu
def test_gpu_gpt_oss_graph_replays_follow_new_routings():
    """A captured gpt-oss fused call (never syncing) replayed under new routings gives the eager call's
    bits and the float64 math."""
    n, h, i, e, k = 24, 256, 128, 8, 4
    x, gu, dn, w, ex, gb, db = (t.cuda() for t in _gpt_oss_operands(n, h, i, e, k, torch.bfloat16, seed=7))
    bufs = [x.clone(), w.clone(), ex.clone()]
    _gpt_oss_call(bufs[0], gu, dn, bufs[1], bufs[2], gb, db)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _gpt_oss_call(bufs[0], gu, dn, bufs[1], bufs[2], gb, db)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _gpt_oss_call(bufs[0], gu, dn, bufs[1], bufs[2], gb, db)
    g = torch.Generator().manual_seed(9)
    routings = [_routing(n, k, e, seed=11, skew=1.5).cuda(), torch.tensor([[3, 5, 0, 7]] * n, device="cuda")]
    for experts in [*routings, ex.flip(0)]:
        new_x = torch.randn(n, h, generator=g).to(torch.bfloat16).cuda()
        new_w = torch.rand(n, k, generator=g).to(torch.bfloat16).cuda()
        for buf, value in zip(bufs, (new_x, new_w, experts)):
            buf.copy_(value)
        graph.replay()
        want = _gpt_oss_call(new_x, gu, dn, new_w, experts, gb, db)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        _assert_gpt_oss_matches(out, new_x, gu, dn, new_w, experts, gb, db)


def _torch_route(logits, k, order, renormalize, bias, norm_eps, norm_min, scale):
    """SparseMoe.route's float32 math after the logits (llm.models.moe), on the CPU."""
    logits = logits.float()
    if order in ("topk_softmax", "topk_sigmoid"):
        top, experts = torch.topk(logits, k, dim=-1)
        weights = torch.softmax(top, dim=-1) if order == "topk_softmax" else torch.sigmoid(top)
    else:
        scores = torch.sigmoid(logits) if order == "sigmoid_topk" else torch.softmax(logits, dim=-1)
        choice = scores if bias is None else scores + bias.float()
        experts = torch.topk(choice, k, dim=-1).indices
        weights = scores.gather(-1, experts)
    if renormalize:
        total = weights.sum(dim=-1, keepdim=True) + norm_eps
        weights = weights / (total.clamp(min=norm_min) if norm_min is not None else total)
    return weights * scale, experts


def _choice_scores(logits, order, bias):
    """The float32 scores the top k are chosen by (the logits where chosen first; plus the bias)."""
    logits = logits.float()
    if order in ("topk_softmax", "topk_sigmoid"):
        return logits
    scores = torch.sigmoid(logits) if order == "sigmoid_topk" else torch.softmax(logits, dim=-1)
    return scores if bias is None else scores + bias.float()


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_the_router_kernel_gives_the_torch_routing(device):
    """route_topk against the torch routing of every order, with and without renormalization, a selection
    bias, the eps / min of the sum and a scale, from float32 and BF16 logits, expert counts not a power of
    two: the same experts in the same order, weights within 16 float32 ulps (the softmax's and the
    renormalization's sums run in another order; 4 failed on CUDA with Triton's approximate exp, since
    replaced by libdevice's), in the dtype asked; the refusals."""
    from trtforge.kernels.moe import ROUTE_ORDERS, route_topk

    skip_unless_runs_here(device)
    g = torch.Generator().manual_seed(11)
    cases = [(5, 8, 2), (9, 60, 4), (3, 128, 8), (4, 6, 6)]
    for (n, e, k), order in [(c, o) for c in cases for o in ROUTE_ORDERS]:
        for dtype, renorm, bias, eps, lo, scale in (
            (torch.float32, True, False, 0.0, None, 1.0),
            (torch.bfloat16, False, False, 0.0, None, 1.0),
            (torch.float32, True, True, 1e-20, 0.3, 2.5),
        ):
            if bias and order in ("topk_softmax", "topk_sigmoid"):
                continue  # (a selection bias comes with the score-first orders only)
            logits = (torch.randn(n, e, generator=g) * 3).to(dtype)
            b = torch.randn(e, generator=g) if bias else None
            want_w, want_e = _torch_route(logits, k, order, renorm, b, eps, lo, scale)
            out = torch.float32 if dtype == torch.float32 else torch.bfloat16
            got_w, got_e = route_topk(
                logits.to(device), k, order, renormalize=renorm, out_dtype=out,
                bias=None if b is None else b.to(device), norm_eps=eps, norm_min=lo, scale=scale,
            )  # fmt: skip
            where = (n, e, k, order, dtype, renorm, bias)
            assert got_w.dtype == out and got_e.dtype == torch.int64 and got_w.shape == (n, k), where
            # the same experts, or where choice scores tie (BF16 logits do) others of the same score
            assert torch.equal(got_e.cpu(), want_e) or torch.equal(
                _choice_scores(logits, order, b).gather(1, got_e.cpu()),
                _choice_scores(logits, order, b).gather(1, want_e),
            ), where
            tol = 16 * 2**-23 * want_w.abs() + 1e-30 if out == torch.float32 else 2**-8 * want_w.abs()
            assert ((got_w.float().cpu() - want_w.to(out).float()).abs() <= tol).all(), where
    with pytest.raises(ValueError, match="order must be one of"):
        route_topk(torch.zeros(2, 4), 2, "softmax", renormalize=False, out_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"k must be in 1..4"):
        route_topk(torch.zeros(2, 4), 5, "softmax_topk", renormalize=False, out_dtype=torch.float32)


def _compile_small_kernels() -> list[dict]:
    """The alignment and router kernels compiled for sm_90 (one child process): the alignment at 128 and
    600 experts, the router in each order with a bias, renormalization and a min, E 128 and k 8."""
    from trtforge.kernels import moe

    out = []
    pointers = {"Experts": "*i64", "SortedIds": "*i32", "BlockExpert": "*i32", "Padded": "*i32"}
    for e_pow2 in (128, 1024):
        consts = {"BLOCK_M": 16, "E_POW2": e_pow2, "CHUNK": 8192 // e_pow2, "FILL": 1024}
        ints = {"P": 64, "E": e_pow2, "CAP": 1024, "NUM_BLOCKS": 64}
        out.append(compile_facts(moe._align_kernel, pointers, ints, consts, num_warps=4, num_stages=1))
    pointers = {"Logits": "*bf16", "Bias": "*fp32", "Weights": "*fp32", "Experts": "*i64"}
    scalars = {"NORM_EPS": "fp32", "NORM_MIN": "fp32", "SCALE": "fp32"}
    for order in range(len(moe.ROUTE_ORDERS)):
        consts = {"K": 8, "K_POW2": 8, "E_POW2": 128, "ORDER": order, "HAS_BIAS": True, "RENORM": True}
        consts |= {"HAS_MIN": True, "LIBDEVICE": True}
        ints = {"E": 128, "stride_row": 128}
        out.append(compile_facts(moe._route_kernel, pointers, ints, consts, 4, 1, scalars=scalars))
    return out


def test_the_alignment_and_router_kernels_compile_for_sm90_without_spills():
    """The decode-path kernels beside the GEMMs (:func:`_align_kernel`, :func:`_route_kernel` with
    libdevice's expf) assemble for sm_90 and spill nothing."""
    needs_ptxas()
    for i, facts in enumerate(run_in_child(f"{__name__}:_compile_small_kernels")):
        assert facts["ptxas_rc"] == 0, (i, facts["ptxas"])
        assert not any(facts["spills"]), (i, facts["ptxas"])
