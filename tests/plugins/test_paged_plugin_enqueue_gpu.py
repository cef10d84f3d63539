"""The PagedAttention plugin's enqueue on a real GPU, with a stand-in for the TensorRT bindings.

No machine here runs TensorRT with a GPU, so TensorRT never calls the plugin in our tests. This
proves, on the H200: given the descriptors, raw pointers (the pool outputs aliasing the pool
inputs), a workspace and a stream handle, ``PagedAttentionPlugin.enqueue`` writes the new rows into
their slots and computes the attention of FP32 SDPA, for every tactic.
"""

from __future__ import annotations

import enum
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.plugins.decode_reference import paged_from_contiguous, reference_decode  # noqa: E402
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


@pytest.mark.parametrize("tactic", range(paged_tactic_count() + 1))
def test_enqueue_every_tactic(tactic):
    plugin_cls, _ = paged_plugin_classes(_BACKEND)
    b, hq, hkv, s_q, d, page = 5, 16, 4, 4, 128, 16
    dtype = torch.bfloat16 if tactic % 2 else torch.float16
    gen = torch.Generator().manual_seed(tactic)
    lens = torch.tensor([4, 17, 1000, 3000, 64], dtype=torch.int32, device="cuda")
    k = torch.randn(b, hkv, 3008, d, generator=gen).to(dtype).cuda()
    v = torch.randn(b, hkv, 3008, d, generator=gen).to(dtype).cuda()
    k_pool, v_pool, table = paged_from_contiguous(k, v, lens, page, gen)
    q = torch.randn(b, hq, s_q, d, generator=gen).to(dtype).cuda()
    k_new = torch.randn(b, hkv, s_q, d, generator=gen).to(dtype).cuda()
    v_new = torch.randn(b, hkv, s_q, d, generator=gen).to(dtype).cuda()
    out = torch.full_like(q, float("nan"))
    workspace = torch.empty(paged_workspace_bytes(b, hq, hkv, s_q, d), dtype=torch.uint8, device="cuda")
    ins = [q, k_new, v_new, k_pool, v_pool, table, lens]
    outs = [out, k_pool, v_pool]  # aliased: the same memory as inputs 3 and 4
    plugin = plugin_cls(PagedAttentionAttrs(num_heads=hq, kv_num_heads=hkv, scale=d**-0.5), tactic)
    stream = torch.cuda.Stream()
    plugin.enqueue(
        [_desc(t) for t in ins], [_desc(t) for t in outs], [t.data_ptr() for t in ins],
        [t.data_ptr() for t in outs], workspace.data_ptr(), stream.cuda_stream,
    )  # fmt: skip
    stream.synchronize()
    for i, n in enumerate(lens.tolist()):
        for j in range(s_q):
            pos = n - s_q + j
            blk = int(table[i, pos // page])
            assert torch.equal(k_pool[blk, :, pos % page], k_new[i, :, j])
            assert torch.equal(v_pool[blk, :, pos % page], v_new[i, :, j])
    ref = reference_decode(q, k_pool, v_pool, lens, table)
    atol = 1.6e-2 if dtype == torch.bfloat16 else 2e-3
    assert not torch.isnan(out).any()
    assert ((out.float() - ref).abs() - (atol + atol * ref.abs())).max().item() <= 0
