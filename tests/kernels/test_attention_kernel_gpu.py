"""The Triton flash-attention kernel on a CUDA GPU against torch SDPA computed in FP32.

Run on the H200 with `make test-gpu`. The cases are a combinatorial subset in which every head dim
(32/64/80/96/128), sequence length (1, 7, 129, 1000, 4096), batch size (1..16), dtype, causal flag
and mask kind occurs at least once, causal and masked crossing each head dim.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from trtforge.kernels.configs import KernelConfig, block_d_for, fits, tactic_configs  # noqa: E402

pytestmark = pytest.mark.gpu

F16, B16, F32 = "float16", "bfloat16", "float32"
# (batch, heads, seq_q, seq_kv, head_dim, causal, mask dtype or None, dtype)
CASES = [
    (1, 4, 1, 1, 64, False, None, F16),
    (2, 4, 7, 7, 32, True, None, B16),
    (3, 2, 129, 129, 80, True, "bool", F16),
    (4, 2, 1000, 1000, 96, False, "int64", B16),
    (1, 2, 4096, 4096, 128, True, None, F16),
    (16, 2, 129, 129, 64, False, None, B16),
    (8, 2, 1000, 1000, 128, True, "int32", F16),
    (2, 3, 4096, 4096, 32, False, "int64", B16),
    (5, 2, 7, 129, 80, False, "bool", B16),
    (1, 1, 1000, 7, 96, True, None, F16),
    (2, 8, 129, 1000, 128, False, None, B16),
    (16, 2, 1, 4096, 64, False, "int64", F16),
    (4, 4, 4096, 4096, 96, True, "bool", B16),
    (6, 2, 1000, 1000, 80, False, None, F16),
    (12, 2, 129, 129, 32, True, "int32", F16),
    (3, 2, 7, 7, 128, False, "bool", F16),
    (2, 2, 4096, 4096, 64, True, "int32", B16),
    (7, 2, 1, 1, 96, True, "int64", B16),
    (2, 2, 1000, 129, 32, False, None, F16),
    (2, 2, 129, 129, 64, True, "bool", F32),
]
# Max |out - ref| <= ATOL + RTOL·|ref| (FP16: 10-bit mantissa; BF16: 7-bit; FP32 runs TF32 products).
TOL = {F16: (2e-3, 2e-3), B16: (1.6e-2, 1.6e-2), F32: (5e-3, 5e-3)}


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _reference(q, k, v, mask, causal: bool, scale: float) -> torch.Tensor:
    """SDPA in FP32 (math backend) with the same masking; rows with no visible key -> 0."""
    b, _, s_q, _ = q.shape
    s_kv = k.shape[2]
    keep = torch.ones(b, 1, s_q, s_kv, dtype=torch.bool, device=q.device)
    if causal:
        keep &= torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        keep &= (mask != 0)[:, None, None, :]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=keep, scale=scale
        )
    return out.nan_to_num(0.0)


def _make_mask(b: int, s_kv: int, kind: str | None, gen: torch.Generator) -> torch.Tensor | None:
    """Right padding with a random valid length >= 1 per batch row (the attention_mask of a padded batch)."""
    if kind is None:
        return None
    lengths = torch.randint(1, s_kv + 1, (b,), generator=gen)
    lengths[0] = s_kv
    mask = torch.arange(s_kv)[None, :] < lengths[:, None]
    return mask.to(_dtype(kind)).cuda()


def _inputs(b, h, s_q, s_kv, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(dtype).cuda() for s in (s_q, s_kv, s_kv))
    return q, k, v, gen


def _assert_close(out: torch.Tensor, ref: torch.Tensor, dtype_name: str) -> None:
    assert not torch.isnan(out).any(), "NaN in the kernel output (unwritten or masked-row bug)"
    atol, rtol = TOL[dtype_name]
    err = (out.float() - ref).abs()
    bound = atol + rtol * ref.abs()
    worst = (err - bound).max().item()
    assert worst <= 0, (
        f"max |err| {err.max().item():.3e} exceeds {dtype_name} tolerance (atol {atol}, rtol {rtol})"
    )


@pytest.mark.parametrize("variant", ["tma", "pointer"])
@pytest.mark.parametrize(("b", "h", "s_q", "s_kv", "d", "causal", "mask_kind", "dtype_name"), CASES)
def test_kernel_matches_sdpa_fp32(b, h, s_q, s_kv, d, causal, mask_kind, dtype_name, variant):
    from trtforge.kernels.configs import default_config
    from trtforge.kernels.flash_attention import flash_attention

    q, k, v, gen = _inputs(b, h, s_q, s_kv, d, _dtype(dtype_name), seed=b * 1000 + s_q + d)
    mask = _make_mask(b, s_kv, mask_kind, gen)
    scale = d**-0.5
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    config = default_config(d, dtype_name)
    flash_attention(q, k, v, mask, scale=scale, causal=causal, out=out, config=config, variant=variant)
    _assert_close(out, _reference(q, k, v, mask, causal, scale), dtype_name)


@pytest.mark.parametrize(
    "config",
    [c for c in tactic_configs() if isinstance(c, KernelConfig) and fits(c, block_d_for(80))],
    ids=str,
)
def test_every_tactic_config_is_correct(config):
    """Every TensorRT tactic that fits D=80 (D tile 128) computes the right answer."""
    from trtforge.kernels.flash_attention import flash_attention

    b, h, s, d = 3, 2, 1000, 80
    q, k, v, gen = _inputs(b, h, s, s, d, torch.float16, seed=7)
    mask = _make_mask(b, s, "bool", gen)
    out = flash_attention(q, k, v, mask, causal=True, config=config)
    _assert_close(out, _reference(q, k, v, mask, True, d**-0.5), F16)


@pytest.mark.parametrize("variant", ["tma", "pointer", "auto"])
def test_autotuned_launch_is_correct(variant):
    from trtforge.kernels.flash_attention import flash_attention

    q, k, v, _ = _inputs(2, 4, 1000, 1000, 64, torch.bfloat16, seed=11)
    out = flash_attention(q, k, v, causal=False, variant=variant)
    _assert_close(out, _reference(q, k, v, None, False, 64**-0.5), B16)


def test_left_padding_causal_rows_without_keys_are_zero():
    from trtforge.kernels.flash_attention import flash_attention

    q, k, v, _ = _inputs(2, 2, 129, 129, 64, torch.float16, seed=3)
    mask = torch.ones(2, 129, dtype=torch.int64, device="cuda")
    mask[1, :40] = 0  # left padding: causal rows 0..39 of batch 1 see no real key
    out = flash_attention(q, k, v, mask, causal=True)
    assert torch.count_nonzero(out[1, :, :40]) == 0
    _assert_close(out, _reference(q, k, v, mask, True, 64**-0.5), F16)


@pytest.mark.parametrize("variant", ["tma", "pointer"])
def test_packed_qkv_views_and_bshd_output_without_copies(variant):
    from trtforge.kernels.flash_attention import flash_attention, packed_qkv_views

    b, s, h, d = 3, 1000, 4, 96
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(b, s, 3 * h * d, generator=gen).half().cuda()
    q, k, v = packed_qkv_views(qkv, h)
    out_bsd = torch.full((b, s, h * d), float("nan"), dtype=torch.float16, device="cuda")
    out_view = torch.as_strided(out_bsd, (b, h, s, d), (s * h * d, d, h * d, 1))
    flash_attention(q, k, v, causal=True, out=out_view, variant=variant)
    ref = _reference(q.contiguous(), k.contiguous(), v.contiguous(), None, True, d**-0.5)
    _assert_close(out_bsd.view(b, s, h, d).transpose(1, 2), ref, F16)


@pytest.mark.parametrize("variant", ["tma", "pointer"])
def test_raw_pointers_on_a_foreign_stream(variant):
    """What a plugin's enqueue does: raw pointers, LINEAR buffers, an int stream handle."""
    from trtforge.kernels.configs import default_config
    from trtforge.kernels.flash_attention import DeviceTensor, flash_attention_raw

    b, h, s, d = 2, 4, 129, 128
    q, k, v, gen = _inputs(b, h, s, s, d, torch.bfloat16, seed=9)
    mask = _make_mask(b, s, "int32", gen)
    out = torch.full_like(q, float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def raw(t: torch.Tensor) -> DeviceTensor:
        return DeviceTensor.contiguous(t.data_ptr(), t.dtype, tuple(t.shape))

    flash_attention_raw(
        raw(q), raw(k), raw(v), raw(out), raw(mask),
        scale=0.1, causal=True, stream=stream.cuda_stream, config=default_config(d, B16), variant=variant,
    )  # fmt: skip
    stream.synchronize()
    _assert_close(out, _reference(q, k, v, mask, True, 0.1), B16)
