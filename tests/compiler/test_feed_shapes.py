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


def test_derived_range_narrows_to_what_the_model_runs(tmp_path) -> None:
    # no --shape: the derived MIN x 1x1 is too short for the kernel-10 convolution; compile narrows the
    # range it chose itself (it used to exit 2 asking for --shape) and records the narrowed range
    import trtforge

    module, inputs = _conv_audio()
    printed = []
    result = trtforge.compile(module, inputs, tmp_path / "a.engine", dynamic="batch,seq", log=printed.append)
    profile = result.manifest.records["build"]["profiles"][0]["x"]
    assert profile["min"][0] == 1 and 10 <= profile["min"][1] <= 400 and profile["max"] == [32, 512]
    assert sum("derived profile --shape x:" in line for line in printed) == 2


def test_user_range_the_model_cannot_run_is_not_narrowed(tmp_path) -> None:
    import trtforge
    from trtforge.errors import UserError

    module, inputs = _conv_audio()
    with pytest.raises(UserError, match=r"cannot run at the profile's MIN shapes \(x 1x2\).*--shape x:1x"):
        trtforge.compile(
            module, inputs, tmp_path / "a.engine", dynamic="batch,seq", shapes=["x:1x2:2x400:4x800"]
        )


def test_derived_range_is_not_collapsed_to_the_example_size(tmp_path) -> None:
    # the legacy exporter bakes nn.MultiheadAttention's sequence length into its reshapes: the graph
    # runs at the example's length only, so narrowing would turn a dynamic axis static; refused, saying why
    import torch

    import trtforge
    from trtforge.errors import UserError

    torch.manual_seed(0)

    class Mha(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    with pytest.raises(UserError, match=r"ran at no other size of x axis 1 .*--exporter dynamo"):
        trtforge.compile(
            Mha().eval(),
            (torch.randn(2, 8, 16),),
            tmp_path / "m.engine",
            dynamic="batch,seq",
            exporter="legacy",
        )
    assert not (tmp_path / "m.engine").exists()
