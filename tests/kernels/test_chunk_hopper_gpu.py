"""Long prompt chunks on the warp-specialized Hopper kernel (H200): grouped-query heads and causal masks
aligned to the last keys (a chunk after its cached prefix), against FP32 SDPA, and the serving launch
over a paged pool against the varlen kernel it replaces."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.gpu


def _hopper_or_skip():
    import triton

    from trtforge.kernels.configs import HOPPER_TRITON_RELEASES, hopper_triton_supported

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel needs an sm_90 GPU")
    if not hopper_triton_supported(triton.__version__):
        pytest.skip(f"the Hopper kernel is proven on Triton {HOPPER_TRITON_RELEASES}: {triton.__version__}")


def _sdpa(q, k, v, scale, offset):
    """FP32 reference: query row i sees keys j <= i + offset; kv heads repeated over their group."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s_q, s_kv = q.shape[2], k.shape[2]
    rows, cols = torch.arange(s_q, device=q.device), torch.arange(s_kv, device=q.device)
    keep = cols[None, :] <= rows[:, None] + offset
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k, v, attn_mask=keep, scale=scale)


SHAPES = [(300, 300), (1086, 1086), (962, 2048), (257, 1500), (64, 64), (1, 700), (1000, 1003)]


@pytest.mark.parametrize(("s_q", "s_kv"), SHAPES, ids=str)
@pytest.mark.parametrize("d", [64, 128])
def test_grouped_heads_and_bottom_right_causal_mask_match_sdpa(s_q, s_kv, d):
    from trtforge.kernels import flash_attention_hopper as fh
    from trtforge.kernels.configs import hopper_configs

    _hopper_or_skip()
    gen = torch.Generator().manual_seed(s_q + s_kv + d)
    hq, hkv = 8, 2
    q = torch.randn(1, hq, s_q, d, generator=gen).bfloat16().cuda()
    k = torch.randn(1, hkv, s_kv, d, generator=gen).bfloat16().cuda()
    v = torch.randn(1, hkv, s_kv, d, generator=gen).bfloat16().cuda()
    ref = _sdpa(q, k, v, d**-0.5, s_kv - s_q)
    for config in hopper_configs(d, causal=True):
        out = torch.full_like(q, float("nan"))
        fh.launch(q, k, v, out, d**-0.5, True, config, q_offset=s_kv - s_q)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), config
        err = ((out.float() - ref).abs() - (1.6e-2 + 1.6e-2 * ref.abs())).max().item()
        assert err <= 0, (config, err)


def test_the_offset_and_groups_leave_the_default_launch_unchanged():
    """q_offset 0 and one kv head per query head are the kernel's old semantics: the same bits."""
    from trtforge.kernels import flash_attention_hopper as fh
    from trtforge.kernels.configs import hopper_configs

    _hopper_or_skip()
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 700, 128, generator=gen).half().cuda() for _ in range(3))
    config = hopper_configs(128, causal=True)[0]
    a, b = torch.empty_like(q), torch.empty_like(q)
    fh.launch(q, k, v, a, 0.1, True, config)
    fh.launch(q, k, v, b, 0.1, True, config, q_offset=0)
    torch.cuda.synchronize()
    torch.testing.assert_close(a.float(), _sdpa(q, k, v, 0.1, 0), atol=2e-3, rtol=2e-3)
    assert torch.equal(a, b)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-pool", "fp8-pool"])
@pytest.mark.parametrize("page", [16, 64])
def test_serving_launch_matches_the_varlen_kernel(page, fp8):
    """prepare_chunked_prefill_hopper over chunks of a flat [T, Hq, D] query (a fresh one, one after
    its cached keys, one ragged against the page) with their blocks scattered in the pool, against
    the varlen kernel on the same pool; rows outside the chunks stay untouched. FP8 pools (E4M3 codes
    with a K and a V scale, as served) are gathered widened to BF16 and give the varlen kernel's output."""
    from trtforge.kernels.chunked_prefill import (
        hopper_chunks_eligible,
        prepare_chunked_prefill_hopper,
        prepare_chunked_prefill_varlen,
    )

    _hopper_or_skip()
    gen = torch.Generator().manual_seed(page)
    hq, hkv, d = 32, 8, 128
    spans = [(0, 700, 700), (700, 962, 2048), (1662, 300, 1237), (1962, 400, 5000)]  # (row, tokens, keys)
    need = [-(-ctx // page) for _, _, ctx in spans]
    nblocks = sum(need) + 7
    perm = torch.randperm(nblocks, generator=gen)
    tables, used = [], 0
    for n in need:
        tables.append(perm[used : used + n])
        used += n
    width = max(need)
    table = torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables]).int().cuda()
    k_pool = torch.randn(nblocks, page, hkv, d, generator=gen).bfloat16().cuda()
    v_pool = torch.randn(nblocks, page, hkv, d, generator=gen).bfloat16().cuda()
    k_scale, v_scale = (0.05, 0.02) if fp8 else (1.0, 1.0)
    if fp8:  # codes of k / k_scale and v / v_scale, as the cache writes store them
        from trtforge.kernels.kv_quant import FP8_KV_DTYPE

        k_pool = (k_pool.float() / k_scale).to(FP8_KV_DTYPE)
        v_pool = (v_pool.float() / v_scale).to(FP8_KV_DTYPE)
    t = spans[-1][0] + spans[-1][1] + 5  # 5 rows (decode rows, say) belong to no chunk
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).bfloat16().cuda()
    q = qkv[:, : hq * d].view(t, hq, d)  # the projection's view, rows (hq + 2 hkv) * d apart
    assert hopper_chunks_eligible(q, k_pool, None) and not hopper_chunks_eligible(q, k_pool, 128)
    starts, lens_q, ctx = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in zip(*spans))
    want = torch.zeros(t, hq, d, dtype=torch.bfloat16, device="cuda")
    prepare_chunked_prefill_varlen(q, k_pool, v_pool, ctx, table, starts, lens_q, 962, out=want)(
        q, k_pool, v_pool, want, d**-0.5 * k_scale, v_scale
    )
    pages = torch.cat(tables).int().cuda()
    got = torch.zeros_like(want)
    launch = prepare_chunked_prefill_hopper(q, k_pool, v_pool, spans, pages)
    for _ in range(2):  # a second layer's call reuses the gather scratch
        launch(q, k_pool, v_pool, got, d**-0.5 * k_scale, v_scale)
    torch.cuda.synchronize()
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)
    assert not got[-5:].any()
    with pytest.raises(ValueError, match="pages"):
        prepare_chunked_prefill_hopper(q, k_pool, v_pool, spans, pages[:-1])
