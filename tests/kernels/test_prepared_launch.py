"""Launches prepared once and repeated per layer (prepared_launch.py): each layer's result equals the
one-shot entry point's on that layer's tensors; on CUDA, later layers launch the compiled kernel
directly, except where a pointer loses the alignment the kernel was compiled for or a launch hook
is set. Without CUDA the kernels run in Triton's interpreter (every launch goes through it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernel (pip install triton)")

from tests.kernels.decode_reference import paged_from_contiguous  # noqa: E402
from trtforge.kernels.chunked_prefill import (  # noqa: E402
    chunked_prefill_attention,
    prepare_chunked_prefill_varlen,
)
from trtforge.kernels.decode_attention import (  # noqa: E402
    DecodeConfig,
    decode_attention,
    prepare_paged_decode,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CUDA = DEVICE == "cuda"


def _layers(gen, n, b, hkv, d, lens, page, dtype=torch.float16):
    """`n` layers' pools of one geometry, all read through one block table (randomly placed blocks)."""
    s_max = max(lens) + 3
    k = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    k_pool, v_pool, table = paged_from_contiguous(k, v, seq_lens, page, gen)
    pools = [(k_pool, v_pool)]
    for _ in range(n - 1):
        new = [torch.randn(p.shape, generator=gen).to(dtype).to(DEVICE) for p in (k_pool, v_pool)]
        pools.append((new[0], new[1]))
    return pools, seq_lens, table


def _counts(launch):
    return launch.full_launches, launch.bound_launches


@pytest.mark.parametrize(
    ("config", "rows"),
    [
        (DecodeConfig(num_splits=4), slice(3, 6)),  # split, reduced in the last program (fused)
        (DecodeConfig(num_splits=1), None),  # one split: the output directly
        (DecodeConfig(num_splits=3, fused=False), slice(0, 3)),  # split, then the reduce kernel
    ],
    ids=["fused", "direct", "reduce-kernel"],
)
def test_prepared_decode_gives_decode_attention_on_every_layer(config, rows):
    gen = torch.Generator().manual_seed(1)
    b, hq, hkv, d, page, layers = 3, 8, 2, 64, 16, 3
    pools, seq_lens, table = _layers(gen, layers, b, hkv, d, [37, 5, 70], page)
    t = b if rows is None else 8
    qs = [torch.randn(t, hq, d, generator=gen).half().to(DEVICE) for _ in range(layers)]
    outs = [torch.full((t, hq, d), float("nan"), dtype=torch.float16, device=DEVICE) for _ in range(layers)]
    launch = prepare_paged_decode(qs[0], *pools[0], seq_lens, table, outs[0], config=config, rows=rows)
    pick = slice(None) if rows is None else rows
    for i, ((k_pool, v_pool), q, out) in enumerate(zip(pools, qs, outs)):
        scale = d**-0.5 * (1 + i / 4)
        launch(q, k_pool, v_pool, out, scale)
        want = decode_attention(
            q[pick].unsqueeze(2), k_pool, v_pool, seq_lens, table, scale=scale, config=config
        ).squeeze(2)
        torch.testing.assert_close(out[pick], want, atol=0, rtol=0)
        if rows is not None:  # rows outside the decode rows are left alone
            assert torch.isnan(out[: rows.start]).all() and torch.isnan(out[rows.stop :]).all()
    assert _counts(launch) == ((1, layers - 1) if CUDA else (layers, 0))


def test_prepared_varlen_prefill_gives_the_batched_chunked_prefill_on_every_layer():
    gen = torch.Generator().manual_seed(2)
    hq, hkv, d, page, layers = 4, 2, 32, 16, 3
    ctx, q_lens = [40, 9, 70], [12, 9, 30]  # prefixes of 28, 0 and 40 cached keys
    pools, seq_lens, table = _layers(gen, layers, len(ctx), hkv, d, ctx, page)
    starts = [0, 12, 21]
    q_starts = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    q_len_t = torch.tensor(q_lens, dtype=torch.int32, device=DEVICE)
    qs = [torch.randn(sum(q_lens), hq, d, generator=gen).half().to(DEVICE) for _ in range(layers)]
    outs = [torch.empty_like(q) for q in qs]
    launch = prepare_chunked_prefill_varlen(
        qs[0], *pools[0], seq_lens, table, q_starts, q_len_t, max(q_lens), out=outs[0], window=20
    )
    for (k_pool, v_pool), q, out in zip(pools, qs, outs):
        launch(q, k_pool, v_pool, out, 0.3)
        for b, (s, n) in enumerate(zip(starts, q_lens)):
            want = chunked_prefill_attention(
                q[s : s + n].permute(1, 0, 2)[None], k_pool, v_pool, seq_lens[b : b + 1], table[b : b + 1],
                scale=0.3, window=20,
            )  # fmt: skip
            torch.testing.assert_close(out[s : s + n], want[0].permute(1, 0, 2), atol=0, rtol=0)
    assert _counts(launch) == ((1, layers - 1) if CUDA else (layers, 0))


def test_an_empty_batch_prepares_a_launch_that_does_nothing():
    gen = torch.Generator().manual_seed(3)
    pools, _, _ = _layers(gen, 1, 1, 2, 32, [5], 16)
    q = torch.zeros(0, 4, 32, dtype=torch.float16, device=DEVICE)
    none = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    table = torch.zeros(0, 1, dtype=torch.int32, device=DEVICE)
    launch = prepare_paged_decode(q, *pools[0], none, table, q, config=DecodeConfig())
    launch(q, *pools[0], q, 1.0)
    prefill = prepare_chunked_prefill_varlen(q, *pools[0], none, table, none, none, 0, out=q)
    prefill(q, *pools[0], q, 1.0)
    assert _counts(launch) == _counts(prefill) == (0, 0)


@pytest.mark.gpu
def test_a_pointer_off_the_compiled_alignment_goes_through_triton():
    """A q 2 bytes off 16-byte alignment (same shape and strides) cannot use the kernel compiled for
    aligned pointers: that launch goes through the JITFunction and is still right."""
    gen = torch.Generator().manual_seed(4)
    b, hq, hkv, d = 2, 4, 2, 64
    pools, seq_lens, table = _layers(gen, 1, b, hkv, d, [33, 80], 16)
    q = torch.randn(b, hq, d, generator=gen).half().to(DEVICE)
    out = torch.empty_like(q)
    config = DecodeConfig(num_splits=2)
    launch = prepare_paged_decode(q, *pools[0], seq_lens, table, out, config=config)
    launch(q, *pools[0], out, 0.125)
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEVICE)
    shifted = buf[1:].view(q.shape)
    shifted.copy_(q)
    assert shifted.data_ptr() % 16 != 0
    launch(shifted, *pools[0], out, 0.125)
    assert _counts(launch) == (2, 0)
    want = decode_attention(q.unsqueeze(2), *pools[0], seq_lens, table, scale=0.125, config=config)
    torch.testing.assert_close(out, want.squeeze(2), atol=0, rtol=0)
    launch(q, *pools[0], out, 0.125)
    assert _counts(launch) == (2, 1)


@pytest.mark.gpu
def test_launch_hooks_still_see_every_launch():
    """With a launch hook set (a profiler's), launches go through the JITFunction, which calls it."""
    import triton

    gen = torch.Generator().manual_seed(5)
    pools, seq_lens, table = _layers(gen, 1, 2, 2, 64, [20, 50], 16)
    q = torch.randn(2, 4, 64, generator=gen).half().to(DEVICE)
    out = torch.empty_like(q)
    launch = prepare_paged_decode(q, *pools[0], seq_lens, table, out, config=DecodeConfig(num_splits=2))
    launch(q, *pools[0], out, 0.125)
    seen = []
    chain = triton.knobs.runtime.launch_enter_hook  # Triton 3.6: a chain of hooks, never None
    chain.add(seen.append)
    try:
        launch(q, *pools[0], out, 0.125)
        launch(q, *pools[0], out, 0.125)
    finally:
        chain.remove(seen.append)
    assert len(seen) == 2 and _counts(launch) == (3, 0)


@pytest.mark.gpu
def test_binding_can_be_turned_off(monkeypatch):
    """TRTFORGE_BIND_LAUNCHES=0: every launch goes through the JITFunction (to measure what binding saves)."""
    monkeypatch.setenv("TRTFORGE_BIND_LAUNCHES", "0")
    gen = torch.Generator().manual_seed(6)
    pools, seq_lens, table = _layers(gen, 2, 2, 2, 64, [20, 50], 16)
    q = torch.randn(2, 4, 64, generator=gen).half().to(DEVICE)
    out = torch.empty_like(q)
    launch = prepare_paged_decode(q, *pools[0], seq_lens, table, out, config=DecodeConfig(num_splits=2))
    for k_pool, v_pool in pools:
        launch(q, k_pool, v_pool, out, 0.125)
    assert _counts(launch) == (2, 0)
