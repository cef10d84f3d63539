"""compile hands the build profile's OPT shapes to the graph stages: a model that cannot run at the
small generated sizes (Wav2Vec2-style convolution over raw samples) is verified and FP16-checked there."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trt_build


def _conv_audio():
    import torch

    torch.manual_seed(0)

    class Frontend(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(1, 8, kernel_size=10, stride=5)
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.conv(x.unsqueeze(1))).transpose(1, 2)
            return self.proj(h)

    return Frontend().eval(), (torch.randn(2, 400),)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_conv_frontend_compiles_with_verification_at_the_profile_opt(tmp_path, precision: str) -> None:
    import trtforge

    module, inputs = _conv_audio()
    result = trtforge.compile(
        module,
        inputs,
        tmp_path / "a.engine",
        dynamic="batch,seq",
        shapes=["x:1x20:2x400:4x800"],
        precision=precision,
    )
    ledger = result.manifest.records["passes"]
    assert ledger["passes"] and all(p["verification"] is not None for p in ledger["passes"])
    if precision == "fp16":
        assert "400" in result.manifest.records["fp16"]["data_source"]
