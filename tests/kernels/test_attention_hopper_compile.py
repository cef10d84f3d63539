"""The Hopper kernel compiles for sm_90a on a machine without a GPU (CI), for every config.

Triton compiles ahead of time for a named target, and its bundled ptxas assembles the result, so
CI catches Gluon API drift, layout errors and register blow-ups before the H200 runs the kernel
(tests/kernels/test_attention_hopper_gpu.py). Checked: the products are wgmma (Hopper tensor-core
instructions, not the mma.sync fallback), warp specialization reallocates registers (setmaxnreg),
and ptxas reports no more than a few bytes of spills. Each case compiles in a child process: the
plugin tests' conftest switches Triton to its CPU interpreter, under which nothing compiles.
"""

from __future__ import annotations

import pytest

from tests.kernels._sm90 import assemble, compile_sm90, run_in_child
from trtforge.kernels.configs import (
    HOPPER_TRITON_RELEASES,
    SHARED_MEMORY_PER_BLOCK,
    HopperConfig,
    hopper_configs,
    hopper_shared_bytes,
    hopper_triton_supported,
)

CASES = [(d, c, c.pairs or i % 2 == 1) for d in (64, 128) for i, c in enumerate(hopper_configs(d))]


def _compile(config, head_dim: int, causal: bool, dtype: str = "fp16", chunk: bool = False):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from trtforge.kernels import flash_attention_hopper as kh

    g = {"fp16": gl.float16, "bf16": gl.bfloat16}[dtype]
    sig = {}
    boxes = {"desc_q": 64, "desc_k": config.block_n, "desc_v": config.block_n, "desc_o": 64}
    for name, rows in boxes.items():
        layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], g)
        sig[name] = f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}],{layout!r}>"
    sig.update(dict.fromkeys(kh._INT_ARGS, "i32"), qk_scale="fp32")
    consts = {
        "NUM_WG": config.num_wg,
        "HEAD_DIM": head_dim,
        "BLOCK_N": config.block_n,
        "STAGES": config.stages,
        "Q_BUFS": config.q_bufs,
        "CAUSAL": causal,
        "PINGPONG": config.pingpong,
        "PAIRS": config.pairs,
        "SPLIT_Q": config.split_q,
        "O_IN_K": config.o_in_k,
        "CHUNK": chunk,
    }
    sig.update(dict.fromkeys(consts, "constexpr"))
    src = GluonASTSource(fn=kh._attn_fwd_ws, signature=sig, constexprs=consts)
    options = {"num_warps": 4, "maxnreg": kh._MAXNREG[config.num_wg]}
    return compile_sm90(src, options)


def _check_case(d: int, fields: dict, causal: bool, chunk: bool = False) -> dict:
    """Compile one case and assemble it with ptxas; the facts the test asserts."""
    kernel = _compile(HopperConfig(**fields), d, causal, "bf16" if causal else "fp16", chunk)
    ptx = kernel.asm["ptx"]
    return {
        "wgmma": "wgmma.mma_async" in ptx,
        "mma_sync": "mma.sync" in ptx,
        "setmaxnreg": "setmaxnreg.inc" in ptx and "setmaxnreg.dec" in ptx,
        "shared": kernel.metadata.shared,
    } | assemble(ptx)


@pytest.mark.parametrize(("d", "config", "causal"), CASES, ids=str)
def test_compiles_for_sm90a_with_wgmma_and_register_reallocation(d, config, causal):
    triton = pytest.importorskip("triton")
    if not hopper_triton_supported(triton.__version__):
        pytest.skip(
            f"the Hopper kernel is proven on Triton {HOPPER_TRITON_RELEASES}; this is {triton.__version__}"
        )
    facts = run_in_child(f"{__name__}:_check_case", d, config.__dict__, causal)
    assert facts["wgmma"] and not facts["mma_sync"], "products must be Hopper wgmma"
    assert facts["setmaxnreg"], "warp specialization must reallocate registers"
    assert facts["shared"] <= hopper_shared_bytes(config, d) <= SHARED_MEMORY_PER_BLOCK
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    assert facts["spills"] and max(facts["spills"]) <= 64, facts["ptxas"]


# (with 3 consumer warpgroups, at D=64, CHUNK's offset spills 300 bytes: serving's chunks take 2)
CHUNK_CASES = [(d, c) for d in (64, 128) for c in hopper_configs(d, causal=True) if c.num_wg == 2]


@pytest.mark.parametrize(("d", "config"), CHUNK_CASES, ids=str)
def test_the_chunk_variant_compiles_as_the_plain_kernel_does(d, config):
    """CHUNK (grouped-query heads, a causal mask from a chunk's cached keys on: serving's long prompt
    chunks) keeps wgmma, register reallocation and the spill bound on two consumer warpgroups."""
    triton = pytest.importorskip("triton")
    if not hopper_triton_supported(triton.__version__):
        pytest.skip(
            f"the Hopper kernel is proven on Triton {HOPPER_TRITON_RELEASES}; this is {triton.__version__}"
        )
    facts = run_in_child(f"{__name__}:_check_case", d, config.__dict__, True, True)
    assert facts["wgmma"] and not facts["mma_sync"] and facts["setmaxnreg"]
    assert facts["ptxas_rc"] == 0, facts["ptxas"]
    assert facts["spills"] and max(facts["spills"]) <= 64, facts["ptxas"]


def test_descriptor_cache_is_keyed_on_address_shape_and_strides():
    """Launch descriptors are reused for the same buffer and never keep a tensor alive."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton.experimental.gluon")
    from trtforge.kernels.device_tensor import DeviceTensor
    from trtforge.kernels.flash_attention_hopper import _desc

    qkv = torch.zeros(2, 100, 3 * 4 * 64, dtype=torch.float16)
    q = qkv.view(2, 100, 3, 4, 64)[:, :, 0].transpose(1, 2)
    d = _desc(q, 64, 64)
    assert _desc(q, 64, 64) is d
    assert isinstance(d.base, DeviceTensor) and d.base.ptr == q.data_ptr()
    assert (
        d.shape == [2, 4, 100, 64]
        and d.strides == [100 * 768, 64, 768, 1]
        and d.block_shape == [1, 1, 64, 64]
    )
    assert _desc(q.contiguous(), 64, 64) is not d  # other address and strides
    assert _desc(q, 128, 64) is not d and _desc(q, 128, 64).block_shape == [1, 1, 128, 64]


def test_hopper_kernel_is_gated_on_proven_triton_releases():
    assert hopper_triton_supported("3.6.0") and hopper_triton_supported("3.6.1")
    assert not hopper_triton_supported("3.9.0") and not hopper_triton_supported("3.5.1")


def test_o_in_k_needs_one_k_tile_row_block_per_warpgroup():
    """o_in_k stages each warpgroup's 64 output rows in the last K tile: BLOCK_N must hold them all."""
    assert HopperConfig(2, 128, 3, o_in_k=True).o_in_k
    with pytest.raises(ValueError, match="BLOCK_N 128 must be at least 192 for 3 warpgroups"):
        HopperConfig(3, 128, 4, o_in_k=True)
