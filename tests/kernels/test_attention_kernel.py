"""The Triton flash-attention kernel at small sizes, on any machine.

Without CUDA these run in Triton's CPU interpreter (tests/kernels/conftest.py), so CI checks the
kernel's masking, tiling and layout logic; with CUDA they run compiled. The H200 acceptance tests
(large sizes, tolerances, all head dims) are in test_attention_kernel_gpu.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernel (pip install triton)")

from trtforge.kernels.configs import KernelConfig, default_config  # noqa: E402
from trtforge.kernels.flash_attention import flash_attention, packed_qkv_views  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2, torch.float32: 5e-3}


def _reference(q, k, v, mask, causal, scale):
    q, k, v = q.double(), k.double(), v.double()
    keep = torch.ones(q.shape[0], 1, q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
    if causal:
        keep &= torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        keep &= (mask != 0)[:, None, None, :]
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    return (torch.softmax(scores, -1).nan_to_num(0.0) @ v).float()


def _qkv(b, h, s_q, s_kv, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=gen).to(dtype).to(DEVICE) for s in (s_q, s_kv, s_kv)]


@pytest.mark.parametrize("variant", ["tma", "pointer"])
@pytest.mark.parametrize(
    ("b", "h", "s_q", "s_kv", "d", "causal", "masked", "dtype"),
    [
        (2, 2, 7, 7, 32, False, False, torch.float16),
        (1, 2, 129, 129, 80, True, False, torch.bfloat16),
        (2, 1, 70, 150, 96, False, True, torch.float16),
        (2, 2, 129, 129, 64, True, True, torch.float16),
        (1, 1, 1, 1, 128, False, False, torch.float32),
        (1, 1, 200, 100, 64, True, False, torch.float16),
    ],
)
def test_matches_reference(b, h, s_q, s_kv, d, causal, masked, dtype, variant):
    q, k, v = _qkv(b, h, s_q, s_kv, d, dtype, seed=s_q + d)
    mask = None
    if masked:
        mask = torch.ones(b, s_kv, dtype=torch.bool, device=DEVICE)
        mask[0, s_kv // 2 :] = False
        mask[-1, :5] = False
    out = torch.full_like(q, float("nan"))
    flash_attention(
        q, k, v, mask, causal=causal, out=out, variant=variant, config=default_config(d, str(dtype)[6:])
    )
    assert not torch.isnan(out).any()
    err = (out.float() - _reference(q, k, v, mask, causal, d**-0.5)).abs().max().item()
    assert err < TOL[dtype]


@pytest.mark.parametrize(
    "config", [KernelConfig(64, 32, 4, 2), KernelConfig(128, 64, 4, 3, tma=True)], ids=str
)
def test_tile_sizes_smaller_and_larger_than_sequence(config):
    q, k, v = _qkv(1, 2, 100, 100, 64, torch.float16, seed=2)
    mask = torch.tensor([[1] * 90 + [0] * 10], dtype=torch.int32, device=DEVICE)
    out = flash_attention(q, k, v, mask, causal=True, config=config, scale=0.3)
    err = (out.float() - _reference(q, k, v, mask, True, 0.3)).abs().max().item()
    assert err < TOL[torch.float16]


@pytest.mark.parametrize("variant", ["tma", "pointer"])
def test_packed_qkv_in_bshd_out_with_no_copies(variant):
    b, s, h, d = 2, 33, 3, 80
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(b, s, 3 * h * d, generator=gen).half().to(DEVICE)
    q, k, v = packed_qkv_views(qkv, h)
    assert q.data_ptr() == qkv.data_ptr() and k.data_ptr() == qkv.data_ptr() + h * d * 2
    out = torch.full((b, s, h * d), float("nan"), dtype=torch.float16, device=DEVICE)
    flash_attention(
        q,
        k,
        v,
        causal=True,
        out=torch.as_strided(out, (b, h, s, d), (s * h * d, d, h * d, 1)),
        variant=variant,
    )
    ref = _reference(q, k, v, None, True, d**-0.5)
    assert (out.view(b, s, h, d).transpose(1, 2).float() - ref).abs().max().item() < TOL[torch.float16]


def test_rows_that_see_no_key_are_zero():
    q, k, v = _qkv(1, 1, 4, 4, 32, torch.float16, seed=5)
    mask = torch.tensor([[0, 0, 1, 1]], dtype=torch.int64, device=DEVICE)  # left padding
    out = flash_attention(q, k, v, mask, causal=True)
    assert torch.count_nonzero(out[0, 0, :2]) == 0
    assert (out.float() - _reference(q, k, v, mask, True, 32**-0.5)).abs().max().item() < TOL[torch.float16]


def test_packed_width_must_split_into_heads():
    with pytest.raises(ValueError, match="not divisible"):
        packed_qkv_views(torch.empty(1, 4, 100), num_heads=3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"k": (2, 2, 5, 32)}, "k and v must be"),
        ({"mask": (2, 6)}, "key_padding_mask must be"),
        ({"q_dtype": torch.float64}, "share one dtype"),
        ({"q": (2, 2, 5)}, "must be 4-D"),
    ],
)
def test_bad_shapes_and_dtypes_are_rejected(change, message):
    q = torch.zeros(change.get("q", (2, 2, 5, 32)), dtype=change.get("q_dtype", torch.float16))
    k = torch.zeros(change.get("k", (2, 2, 7, 32)), dtype=torch.float16)
    v = torch.zeros(2, 2, 7, 32, dtype=torch.float16)
    mask = torch.ones(change["mask"], dtype=torch.bool) if "mask" in change else None
    out = torch.zeros(2, 2, 5, 32, dtype=torch.float16) if len(q.shape) != 4 else None
    with pytest.raises(ValueError, match=message):
        flash_attention(q, k, v, mask, out=out)
