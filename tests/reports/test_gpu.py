"""PyTorch eager on CUDA as a report target, with CUDA peak memory (H200 via the device tool)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_torch_cuda_target(tmp_path):
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).eval()
    from trtforge.reports.api import build_report

    build = build_report(
        (module, (torch.randn(2, 64),)),
        targets=["torch", "torch-cuda", "ort"],
        out_dir=tmp_path,
        batch_sizes=(1, 64),
        warmup=2,
        runs=5,
        progress=False,
    )
    result = build.report
    cuda = next(t for t in result.targets if t.name == "torch-cuda")
    assert cuda.status == "ok", cuda.reason
    assert cuda.device == "cuda"
    rows = {r.target: r for r in result.accuracy}
    assert rows["torch-cuda"].passed is True, rows["torch-cuda"].checks
    assert rows["torch-cuda"].max_abs < 1e-4
    points = [p for p in result.latency if p.target == "torch-cuda"]
    assert [p.status for p in points] == ["ok", "ok"]
    assert all(p.memory_method.startswith("torch.cuda") and p.peak_memory_bytes > 0 for p in points)
    # the module went back to the CPU after the CUDA run
    assert next(module.parameters()).device.type == "cpu"
    assert build.html_path.is_file()
