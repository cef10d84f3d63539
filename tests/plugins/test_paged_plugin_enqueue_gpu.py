"""The PagedAttention plugin's enqueue on a real GPU, with a stand-in for the TensorRT bindings.

No machine here runs TensorRT with a GPU, so TensorRT never calls the plugin in our tests. This
proves, on the H200: given the descriptors, raw pointers (pools [num_blocks, block_size, Hkv, D],
the pool outputs aliasing the pool inputs), a workspace and a stream handle,
``PagedAttentionPlugin.enqueue`` writes the new rows at their slot_mapping slots and computes the
attention of FP32 SDPA: decode steps (split-KV kernel) for every tactic, and ragged right-padded
prefill steps (chunked-prefill kernel) whose padding rows write to a scratch block.
"""

from __future__ import annotations

import enum
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.kernels.decode_reference import paged_from_contiguous, reference_decode  # noqa: E402
from trtforge.plugins.attention.paged_plugin import (  # noqa: E402
    paged_plugin_classes,
    paged_tactic_count,
    paged_workspace_bytes,
)
from trtforge.plugins.attention.spec import PagedAttentionAttrs  # noqa: E402

pytestmark = pytest.mark.gpu


class _DataType(enum.Enum):
    HALF = 1
    BF16 = 2
    INT32 = 3


class _Base:
    def __init__(self) -> None:
        pass


class _StandInBackend:
    name = "stand-in"

    def __init__(self, trt: types.SimpleNamespace) -> None:
        self.trt = trt


_TRT = types.SimpleNamespace(
    **{n: type(n, (_Base,), {}) for n in ("IPluginV3", "IPluginV3OneCore", "IPluginV3OneBuildV2")},
    IPluginV3OneRuntime=type("IPluginV3OneRuntime", (_Base,), {}),
    IPluginCreatorV3One=type("IPluginCreatorV3One", (_Base,), {}),
    DataType=_DataType,
    TensorFormat=types.SimpleNamespace(LINEAR="linear"),
)
_BACKEND = _StandInBackend(_TRT)
_TYPES = {torch.float16: _DataType.HALF, torch.bfloat16: _DataType.BF16, torch.int32: _DataType.INT32}


def _desc(t: torch.Tensor) -> types.SimpleNamespace:
    return types.SimpleNamespace(type=_TYPES[t.dtype], dims=tuple(t.shape), format="linear")


def _slots(table, lens, q_lens, s_q, page, scratch, device):
    """Flat slots of each row's new tokens (positions lens - q_lens ..); padding rows -> the scratch block."""
    out = torch.empty(len(lens), s_q, dtype=torch.int32)
    for b, (n, m) in enumerate(zip(lens.tolist(), q_lens.tolist())):
        for i in range(s_q):
            pos = n - m + i
            out[b, i] = int(table[b, pos // page]) * page + pos % page if i < m else scratch * page
    return out.to(device)


def _step(tactic, dtype, b, hq, hkv, s_q, d, page, lens, q_lens, seed, device="cuda", pointers=None):
    """Run enqueue on one step and check the pool writes; returns (q, k_pool, v_pool, table, out, lens,
    q_lens). `pointers` (a dict) collects data_ptr -> tensor for a CPU stand-in of DeviceTensor."""
    plugin_cls, _ = paged_plugin_classes(_BACKEND)
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens, dtype=torch.int32, device=device)
    q_lens = torch.tensor(q_lens, dtype=torch.int32, device=device)
    s_max = -(-int(lens.max()) // page) * page
    k = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(device)
    v = torch.randn(b, hkv, s_max, d, generator=gen).to(dtype).to(device)
    k_pool, v_pool, table = paged_from_contiguous(k, v, lens, page, gen)
    scratch = min(set(range(k_pool.shape[0])) - set(table.flatten().tolist()))
    slots = _slots(table.cpu(), lens.cpu(), q_lens.cpu(), s_q, page, scratch, device)
    q = torch.randn(b, hq, s_q, d, generator=gen).to(dtype).to(device)
    k_new = torch.randn(b, hkv, s_q, d, generator=gen).to(dtype).to(device)
    v_new = torch.randn(b, hkv, s_q, d, generator=gen).to(dtype).to(device)
    out = torch.full_like(q, float("nan"))
    workspace = torch.empty(paged_workspace_bytes(b, hq, hkv, 1, d), dtype=torch.uint8, device=device)
    ins = [q, k_new, v_new, k_pool, v_pool, table, slots, lens, q_lens]
    outs = [out, k_pool, v_pool]  # aliased: the same memory as inputs 3 and 4
    plugin = plugin_cls(PagedAttentionAttrs(num_heads=hq, kv_num_heads=hkv, scale=d**-0.5), tactic)
    if pointers is not None:
        pointers.update({t.data_ptr(): t for t in [*ins, *outs, workspace]})
    stream = torch.cuda.Stream() if device == "cuda" else None
    plugin.enqueue(
        [_desc(t) for t in ins], [_desc(t) for t in outs], [t.data_ptr() for t in ins],
        [t.data_ptr() for t in outs], workspace.data_ptr(), stream.cuda_stream if stream else 0,
    )  # fmt: skip
    if stream is not None:
        stream.synchronize()
    for i, (n, m) in enumerate(zip(lens.tolist(), q_lens.tolist())):
        for j in range(m):
            pos = n - m + j
            blk = int(table[i, pos // page])
            assert torch.equal(k_pool[blk, pos % page], k_new[i, :, j])
            assert torch.equal(v_pool[blk, pos % page], v_new[i, :, j])
    return q, k_pool, v_pool, table, out, lens, q_lens


def _close(out, ref, dtype):
    atol = 1.6e-2 if dtype == torch.bfloat16 else 2e-3
    assert not torch.isnan(out).any()
    assert ((out.float() - ref).abs() - (atol + atol * ref.abs())).max().item() <= 0


@pytest.mark.parametrize("tactic", range(paged_tactic_count() + 1))
def test_enqueue_decode_every_tactic(tactic):
    dtype = torch.bfloat16 if tactic % 2 else torch.float16
    lens = [4, 17, 1000, 3000, 64]
    q, k_pool, v_pool, table, out, lens_t, _ = _step(
        tactic, dtype, 5, 16, 4, 1, 128, 16, lens, [1] * 5, seed=tactic
    )
    _close(out, reference_decode(q, k_pool, v_pool, lens_t, table), dtype)


@pytest.mark.parametrize(("page", "dtype"), [(16, torch.float16), (64, torch.bfloat16)])
def test_enqueue_ragged_prefill(page, dtype):
    """S_q = 6, rows of 6, 2, 4, 1 and 3 real tokens over prefixes of 0 .. 1000 (GQA 4)."""
    q_lens = [6, 2, 4, 1, 3]
    lens = [6, 19, 1004, 65, 3]
    q, k_pool, v_pool, table, out, lens_t, _ = _step(0, dtype, 5, 16, 4, 6, 128, page, lens, q_lens, 5)
    for i, m in enumerate(q_lens):
        ref = reference_decode(q[i : i + 1, :, :m], k_pool, v_pool, lens_t[i : i + 1], table[i : i + 1])
        _close(out[i : i + 1, :, :m], ref, dtype)
