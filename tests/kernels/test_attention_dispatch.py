"""How the launch API picks a kernel, on any machine: eligibility for the Hopper kernel, the
timing-based choice and its cache, and the fallbacks. The GPU is replaced by stand-ins (capability,
timings, the Hopper launch); the portable kernel really runs (Triton's interpreter without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from trtforge.kernels import flash_attention as kernel  # noqa: E402
from trtforge.kernels.configs import hopper_configs  # noqa: E402
from trtforge.kernels.device_tensor import DeviceTensor  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_plans(monkeypatch):
    """Each test starts without remembered Hopper launches (the stand-ins differ between tests)."""
    monkeypatch.setattr(kernel, "_HOPPER_PLANS", {})


@pytest.fixture
def sm90(monkeypatch):
    """A CUDA machine with an sm_90 GPU and a proven Triton, as far as the eligibility check sees."""
    monkeypatch.setattr(kernel, "_HOPPER_TRITON", True)
    monkeypatch.setattr(kernel, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    capability = {"value": (9, 0)}
    monkeypatch.setattr(kernel, "_capability", lambda device: capability["value"])
    return capability


def _qkv(d=64, dtype=torch.float16, s=100):
    return [torch.zeros(2, 4, s, d, dtype=dtype) for _ in range(4)]


def test_hopper_eligibility(sm90):
    q, k, v, out = _qkv()
    assert kernel._hopper_eligible(q, k, v, out, None)
    qkv = torch.zeros(2, 100, 3 * 4 * 64, dtype=torch.bfloat16)
    assert kernel._hopper_eligible(*kernel.packed_qkv_views(qkv, 4), out.bfloat16(), None)
    assert kernel._hopper_eligible(
        *(DeviceTensor.contiguous(t.data_ptr(), t.dtype, tuple(t.shape)) for t in _qkv()), None
    )
    assert not kernel._hopper_eligible(q, k, v, out, torch.ones(2, 100, dtype=torch.bool))  # mask
    assert not kernel._hopper_eligible(*_qkv(d=80), None)  # head dim
    assert not kernel._hopper_eligible(*_qkv(dtype=torch.float32), None)  # dtype
    odd = torch.zeros(2, 4, 100, 65, dtype=torch.float16)[..., 1:]  # 2-byte offset, 130-byte rows
    assert not kernel._hopper_eligible(odd, k, v, out, None)
    for cap in ((8, 0), (10, 0)):
        sm90["value"] = cap
        assert not kernel._hopper_eligible(q, k, v, out, None)


def test_hopper_eligibility_needs_a_proven_triton(sm90, monkeypatch):
    monkeypatch.setattr(kernel, "_HOPPER_TRITON", False)
    assert not kernel._hopper_eligible(*_qkv(), None)


def test_fastest_runs_each_candidate_untimed_first_and_keeps_the_first_of_equals(monkeypatch):
    log = []
    times = {"a": 2.0, "b": 1.0, "c": 1.0}

    def do_bench(fn, **kw):
        name = fn()  # one timed run stands for the benchmark
        log.append(f"timed {name}")
        return times[name]

    monkeypatch.setattr(kernel.triton.testing, "do_bench", do_bench)
    cands = {n: (lambda n=n: log.append(f"run {n}") or n) for n in times}
    assert kernel._fastest(cands) == "b"
    assert log == ["run a", "run a", "timed a", "run b", "run b", "timed b", "run c", "run c", "timed c"]


def test_auto_launch_times_once_and_runs_the_winner(monkeypatch):
    launched, timed = [], []
    monkeypatch.setattr(kernel, "_hopper_eligible", lambda *a: True)
    monkeypatch.setattr(kernel, "_launch_hopper", lambda *a: launched.append(a[-1]))
    winner = hopper_configs(64)[1]

    def fastest(cands):
        timed.append(list(cands))
        return winner

    monkeypatch.setattr(kernel, "_fastest", fastest)
    q, k, v, out = _qkv(s=37)
    monkeypatch.setattr(kernel, "_VARIANT_CHOICE", {})
    kernel.flash_attention(q, k, v, out=out)
    kernel.flash_attention(q, k, v, out=out)
    assert len(timed) == 1 and timed[0] == [*hopper_configs(64, causal=False), "tma", "pointer"]
    assert not any(c.pairs for c in timed[0][:-2])  # blocks are unequal only when causal
    assert launched == [winner, winner]


def test_portable_winner_and_mask_fall_back_to_the_portable_kernel(monkeypatch):
    launched = []
    monkeypatch.setattr(kernel, "_launch_hopper", lambda *a: launched.append(a[-1]))
    monkeypatch.setattr(kernel, "_fastest", lambda cands: "pointer")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 64, generator=gen).half() for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    monkeypatch.setattr(kernel, "_VARIANT_CHOICE", {})
    with monkeypatch.context() as m:
        m.setattr(kernel, "_hopper_eligible", lambda *a: True)
        out = kernel.flash_attention(q, k, v)  # the timing says the portable kernel: it runs
    assert not launched and (out.float() - ref).abs().max() < 3e-3
    out = kernel.flash_attention(q, k, v, torch.ones(1, 37, dtype=torch.bool), config=hopper_configs(64)[0])
    assert not launched and (out.float() - ref).abs().max() < 3e-3  # a Hopper tactic with a mask
    with pytest.raises(ValueError, match="key-padding mask"):
        kernel.flash_attention(q, k, v, torch.ones(1, 37, dtype=torch.bool), variant="hopper")


def test_a_repeated_call_reuses_its_decision_and_a_new_geometry_decides_again(monkeypatch):
    """The fast path: the same shapes, strides, dtypes, alignment and options skip the checks."""
    launched, checked = [], []
    monkeypatch.setattr(kernel, "_hopper_eligible", lambda *a: checked.append(1) or True)
    monkeypatch.setattr(kernel, "_launch_hopper", lambda *a: launched.append((a[5], a[-1])))
    winner = hopper_configs(64)[2]
    monkeypatch.setattr(kernel, "_fastest", lambda cands: winner)
    monkeypatch.setattr(kernel, "_VARIANT_CHOICE", {})
    q, k, v, out = _qkv(s=37)
    for _ in range(3):
        kernel.flash_attention(q, k, v, out=out)
    assert launched == [(False, winner)] * 3 and len(checked) == 1
    kernel.flash_attention(q, k, v, out=out, causal=True)  # another option: decided anew
    assert len(checked) == 2 and launched[-1][0] is True
    wide = torch.zeros(2, 37, 4, 64, dtype=torch.float16).transpose(1, 2)  # other strides
    kernel.flash_attention(q, k, v, out=wide)
    assert len(checked) == 3
    fixed = hopper_configs(64)[0]
    kernel.flash_attention(q, k, v, out=out, config=fixed)
    kernel.flash_attention(q, k, v, out=out, config=fixed)
    assert len(checked) == 4 and launched[-2:] == [(False, fixed)] * 2
    with pytest.raises(ValueError, match="out must be"):  # a bad call is never served from the plans
        kernel.flash_attention(q, k, v, out=out[:, :, :5])
