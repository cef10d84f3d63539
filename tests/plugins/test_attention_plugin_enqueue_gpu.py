"""The plugin's enqueue path on a real GPU, with a stand-in for the TensorRT bindings.

No machine here has datacenter TensorRT with a GPU it runs on, so TensorRT itself never calls this
plugin in our tests. What this proves on the H200: given the descriptors, raw pointers and stream
handle TensorRT would pass, ``FlashAttentionPlugin.enqueue`` (the real class body, built on stand-in
base classes) computes correct attention for every tactic, both layouts and with a mask.
"""

from __future__ import annotations

import enum
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from trtforge.kernels.configs import tactic_configs  # noqa: E402
from trtforge.plugins.attention.plugin import plugin_classes  # noqa: E402
from trtforge.plugins.attention.spec import FlashAttentionAttrs  # noqa: E402

pytestmark = pytest.mark.gpu


class _DataType(enum.Enum):
    HALF = 1
    BF16 = 2
    FLOAT = 3
    BOOL = 4
    INT32 = 5
    INT64 = 6


class _Base:
    def __init__(self) -> None:
        pass


class _StandInBackend:
    """Hashable like a real Backend (plugin_classes caches per backend)."""

    name = "stand-in"

    def __init__(self, trt: types.SimpleNamespace) -> None:
        self.trt = trt


def _fake_backend() -> _StandInBackend:
    trt = types.SimpleNamespace(
        IPluginV3=type("IPluginV3", (_Base,), {}),
        IPluginV3OneCore=type("IPluginV3OneCore", (_Base,), {}),
        IPluginV3OneBuild=type("IPluginV3OneBuild", (_Base,), {}),
        IPluginV3OneRuntime=type("IPluginV3OneRuntime", (_Base,), {}),
        IPluginCreatorV3One=type("IPluginCreatorV3One", (_Base,), {}),
        DataType=_DataType,
        TensorFormat=types.SimpleNamespace(LINEAR="linear"),
        DimensionOperation=types.SimpleNamespace(FLOOR_DIV="floor_div"),
    )
    return _StandInBackend(trt)


_BACKEND = _fake_backend()
_TRT_TYPES = {torch.float16: _DataType.HALF, torch.bfloat16: _DataType.BF16, torch.int64: _DataType.INT64}


def _desc(t: torch.Tensor) -> types.SimpleNamespace:
    return types.SimpleNamespace(type=_TRT_TYPES[t.dtype], dims=tuple(t.shape), format="linear")


def _reference(q, k, v, mask, causal, scale):
    keep = torch.ones(q.shape[0], 1, q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
    if causal:
        keep &= torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        keep &= (mask != 0)[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=keep, scale=scale
    )
    return out.nan_to_num(0.0)


@pytest.mark.parametrize("tactic", range(len(tactic_configs()) + 1))
def test_enqueue_bhsd_every_tactic(tactic):
    plugin_cls, _ = plugin_classes(_BACKEND)
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=4, scale=0.125, causal=True))
    plugin.set_tactic(tactic)
    gen = torch.Generator().manual_seed(tactic)
    q, k, v = (torch.randn(2, 4, 300, 64, generator=gen).half().cuda() for _ in range(3))
    mask = torch.ones(2, 300, dtype=torch.int64, device="cuda")
    mask[1, 250:] = 0
    out = torch.full_like(q, float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    ins = [q, k, v, mask]
    plugin.enqueue(
        [_desc(t) for t in ins],
        [_desc(out)],
        [t.data_ptr() for t in ins],
        [out.data_ptr()],
        0,
        stream.cuda_stream,
    )
    stream.synchronize()
    ref = _reference(q, k, v, mask, True, 0.125)
    assert (out.float() - ref).abs().max().item() < 4e-3


def test_enqueue_packed_layout_writes_bs_hd():
    plugin_cls, _ = plugin_classes(_BACKEND)
    heads, d, b, s = 3, 80, 2, 129
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=heads, scale=d**-0.5, causal=False, layout="bs3hd"))
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(b, s, 3 * heads * d, generator=gen).to(torch.bfloat16).cuda()
    out = torch.full((b, s, heads * d), float("nan"), dtype=torch.bfloat16, device="cuda")
    plugin.enqueue([_desc(qkv)], [_desc(out)], [qkv.data_ptr()], [out.data_ptr()], 0, 0)
    torch.cuda.synchronize()
    q, k, v = qkv.view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4)
    ref = _reference(q, k, v, None, False, d**-0.5)
    got = out.view(b, s, heads, d).transpose(1, 2)
    assert (got.float() - ref).abs().max().item() < 3e-2
