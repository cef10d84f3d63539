"""The warp-specialized Hopper kernel (kernel_hopper.py) on the H200 against SDPA computed in FP32.

Run with `make test-gpu`; skipped on GPUs other than sm_90. Every config of both head dims, causal
and not, ragged lengths (1, 7, 129, 1000, 4096, S_q != S_kv), FP16 and BF16, the packed-QKV layout,
the dispatch from the public launch API and the plugin's enqueue with a Hopper tactic.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.kernels.test_attention_kernel_gpu import B16, F16, _assert_close, _inputs, _reference  # noqa: E402
from trtforge.kernels.configs import HopperConfig, hopper_configs, hopper_triton_supported  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_sm90():
    import triton

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel needs an sm_90 GPU (H100/H200)")
    if not hopper_triton_supported(triton.__version__):
        pytest.skip(f"the Hopper kernel is gated off on Triton {triton.__version__} (proven on 3.6)")


CONFIGS = [(d, c) for d in (64, 128) for c in hopper_configs(d)]
# (batch, heads, seq_q, seq_kv)
SHAPES = [
    (2, 3, 1000, 1000),
    (1, 2, 7, 7),
    (3, 2, 129, 129),
    (1, 1, 1, 1),
    (2, 2, 300, 1000),
    (2, 2, 1000, 300),
]


@pytest.mark.parametrize(("d", "config"), CONFIGS, ids=lambda x: str(x))
@pytest.mark.parametrize("causal", [False, True])
def test_every_config_matches_sdpa(d, config, causal):
    from trtforge.kernels.flash_attention_hopper import launch

    for i, (b, h, s_q, s_kv) in enumerate(SHAPES):
        dtype_name = (F16, B16)[i % 2]
        q, k, v, _ = _inputs(b, h, s_q, s_kv, d, getattr(torch, dtype_name), seed=i + d)
        out = torch.full_like(q, float("nan"))
        launch(q, k, v, out, d**-0.5, causal, config)
        torch.cuda.synchronize()
        _assert_close(out, _reference(q, k, v, None, causal, d**-0.5), dtype_name)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequence_and_packed_layout(d, causal):
    from trtforge.kernels.flash_attention import flash_attention, packed_qkv_views

    q, k, v, _ = _inputs(2, 2, 4096, 4096, d, torch.float16, seed=d)
    out = flash_attention(q, k, v, causal=causal, config=hopper_configs(d)[0])
    _assert_close(out, _reference(q, k, v, None, causal, d**-0.5), F16)

    b, s, h = 2, 1000, 4
    qkv = torch.randn(b, s, 3 * h * d, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).cuda()
    q, k, v = packed_qkv_views(qkv, h)
    flat = torch.full((b, s, h * d), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = flat.view(b, s, h, d).transpose(1, 2)  # write straight into [B, S, H*D]
    flash_attention(q, k, v, causal=causal, out=out, variant="hopper")
    _assert_close(out, _reference(q, k, v, None, causal, d**-0.5), B16)


def test_autotuned_dispatch_picks_a_kernel_and_is_correct():
    from trtforge.kernels import flash_attention as kernel

    q, k, v, _ = _inputs(4, 8, 2048, 2048, 128, torch.bfloat16, seed=5)
    out = kernel.flash_attention(q, k, v, causal=True)
    _assert_close(out, _reference(q, k, v, None, True, 128**-0.5), B16)
    choice = kernel._VARIANT_CHOICE[kernel._choice_key(q, 128, True, None, 2048, 2048)]
    assert isinstance(choice, HopperConfig) or choice in ("tma", "pointer")


def test_mask_falls_back_and_hopper_variant_refuses_it():
    from trtforge.kernels.flash_attention import flash_attention

    q, k, v, _ = _inputs(2, 2, 129, 129, 64, torch.float16, seed=9)
    mask = torch.ones(2, 129, dtype=torch.bool, device="cuda")
    mask[1, 100:] = False
    out = flash_attention(q, k, v, mask, config=hopper_configs(64)[0])  # runs the portable kernel
    _assert_close(out, _reference(q, k, v, mask, False, 0.125), F16)
    with pytest.raises(ValueError, match="key-padding mask"):
        flash_attention(q, k, v, mask, variant="hopper")


def test_plugin_enqueue_with_a_hopper_tactic():
    from tests.plugins.test_attention_plugin_enqueue_gpu import _BACKEND, _desc
    from trtforge.kernels.configs import tactic_configs
    from trtforge.plugins.attention.plugin import plugin_classes
    from trtforge.plugins.attention.spec import FlashAttentionAttrs

    plugin_cls, _ = plugin_classes(_BACKEND)
    plugin = plugin_cls(FlashAttentionAttrs(num_heads=4, scale=0.125, causal=True))
    tactic = 1 + tactic_configs().index(hopper_configs(64)[0])
    plugin.set_tactic(tactic)
    q, k, v, _ = _inputs(2, 4, 1000, 1000, 64, torch.float16, seed=2)
    out = torch.full_like(q, float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    ins = [q, k, v]
    plugin.enqueue([_desc(t) for t in ins], [_desc(out)], [t.data_ptr() for t in ins], [out.data_ptr()], 0,
                   stream.cuda_stream)  # fmt: skip
    stream.synchronize()
    _assert_close(out, _reference(q, k, v, None, True, 0.125), F16)


RELAUNCH = [(128, c) for c in hopper_configs(128) if c.o_in_k or c == hopper_configs(128)[0]]
RELAUNCH += [(64, c) for c in hopper_configs(64) if c.pairs]


@pytest.mark.parametrize(("d", "config"), RELAUNCH, ids=lambda x: str(x))
def test_direct_relaunch_across_shapes_and_output_layouts(d, config):
    """After the first launch the compiled kernel is called directly (no JIT binding): other
    shapes and output strides must still come out right, from one compiled kernel."""
    from trtforge.kernels import flash_attention_hopper as kernel_hopper

    for i, (b, h, s) in enumerate([(2, 4, 1000), (1, 3, 333), (3, 2, 64), (2, 4, 1000)]):
        q, k, v, _ = _inputs(b, h, s, s, d, torch.float16, seed=i)
        flat = torch.full((b, s, h * d), float("nan"), dtype=torch.float16, device="cuda")
        out = flat.view(b, s, h, d).transpose(1, 2) if i % 2 else torch.full_like(q, float("nan"))
        kernel_hopper.launch(q, k, v, out, d**-0.5, True, config)
        torch.cuda.synchronize()
        _assert_close(out, _reference(q, k, v, None, True, d**-0.5), F16)
    keys = [key for key in kernel_hopper._COMPILED if key[:4] == (config, torch.float16, d, True)]
    assert len(keys) == 1
