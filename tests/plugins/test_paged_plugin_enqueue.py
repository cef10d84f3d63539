"""PagedAttentionPlugin.enqueue on the CPU: the Triton interpreter runs its kernels, with raw pointers
mapped back to the torch tensors they came from (the interpreter cannot read raw device pointers).

Checks the plumbing the GPU test (test_paged_plugin_enqueue_gpu.py) checks on the H200, at small
sizes: input order, the slot-mapping write into pools [num_blocks, block_size, Hkv, D], the decode
path with a split-KV workspace and the ragged chunked-prefill path.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is needed to run the kernels (pip install triton)")

from tests.kernels.decode_reference import reference_decode  # noqa: E402
from tests.plugins.test_paged_plugin_enqueue_gpu import _close, _step  # noqa: E402
from trtforge.kernels import device_tensor  # noqa: E402
from trtforge.kernels.device_tensor import DeviceTensor, pool_heads_major  # noqa: E402

if torch.cuda.is_available():
    pytest.skip("the GPU test covers enqueue on CUDA", allow_module_level=True)


@pytest.fixture
def pointers(monkeypatch):
    """data_ptr -> tensor; DeviceTensor views resolve to those tensors (the workspace to strided views)."""
    table: dict[int, torch.Tensor] = {}

    class _Resolved:
        @staticmethod
        def contiguous(ptr, dtype, shape):
            t = table[int(ptr)]
            assert t.dtype == dtype and tuple(t.shape) == tuple(shape), (t.dtype, t.shape, dtype, shape)
            return t

        def __init__(self, ptr, dtype, shape, strides):
            self.base = table[int(ptr)].view(dtype)

        def view(self, shape, strides, offset=0, dtype=None):
            base = self.base if dtype is None else self.base.view(dtype)
            return torch.as_strided(base, shape, strides, offset)

    monkeypatch.setattr(device_tensor, "DeviceTensor", _Resolved)
    return table


@pytest.mark.parametrize(("tactic", "dtype"), [(0, torch.float16), (3, torch.bfloat16)])
def test_enqueue_decode(pointers, tactic, dtype):
    lens = [4, 17, 300, 64]
    q, k_pool, v_pool, table, out, lens_t, _ = _step(
        tactic, dtype, 4, 8, 2, 1, 64, 16, lens, [1] * 4, seed=tactic, device="cpu", pointers=pointers
    )
    _close(out, reference_decode(q, k_pool, v_pool, lens_t, table), dtype)


def test_enqueue_ragged_prefill(pointers):
    q_lens, lens = [6, 2, 4, 1], [6, 19, 104, 65]
    q, k_pool, v_pool, table, out, lens_t, _ = _step(
        0, torch.float16, 4, 8, 2, 6, 64, 64, lens, q_lens, seed=5, device="cpu", pointers=pointers
    )
    for i, m in enumerate(q_lens):
        ref = reference_decode(q[i : i + 1, :, :m], k_pool, v_pool, lens_t[i : i + 1], table[i : i + 1])
        _close(out[i : i + 1, :, :m], ref, torch.float16)
        assert torch.isnan(out[i, :, m:]).all()  # padding rows are left unwritten


def test_pool_heads_major_is_the_same_view_for_device_tensors_and_torch():
    pool = torch.empty(5, 16, 2, 64, dtype=torch.float16)
    raw = DeviceTensor.contiguous(pool.data_ptr(), pool.dtype, tuple(pool.shape))
    view, ref = pool_heads_major(raw), pool_heads_major(pool)
    assert view.shape == tuple(ref.shape) == (5, 2, 16, 64)
    assert view.strides == ref.stride() and view.data_ptr() == ref.data_ptr()
    with pytest.raises(ValueError, match="block_size, Hkv, D"):
        pool_heads_major(torch.empty(5, 16, 2))
