"""The --generate option group of `trtforge compile`: its options are refused without --generate."""

from __future__ import annotations

import pytest

from tests.models import tiny_onnx
from trtforge.cli.main import main


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-seq", "64"], "--max-seq"),
        (["--max-batch", "2"], "--max-batch"),
        (["--max-prefill", "8"], "--max-prefill"),
        (["--all-logits"], "--all-logits"),
    ],
)
def test_step_engine_options_need_generate(tmp_path, capsys, argv, flag) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    rc = main(["compile", str(model), "-o", str(tmp_path / "m.engine"), *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert flag in err and "--generate" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_api_refuses_example_inputs_with_generate(tmp_path) -> None:
    import trtforge

    with pytest.raises(trtforge.UserError, match="pass no example_inputs"):
        trtforge.compile("unused:factory", {"input_ids": [[1]]}, tmp_path / "m.engine", generate=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("message", "worded"),
    [
        (
            "tensor_parallel_size 2 needs the torch executor; executor 'onnxruntime' runs one process. Use "
            "executor='torch'.",
            "--tensor-parallel-size 2 needs the torch executor; executor 'onnxruntime' runs one process. Use "
            "--executor torch.",
        ),
        ("only tensor_parallel_size=1 splits it", "only --tensor-parallel-size 1 splits it"),
        # (generate has no --device: device stays the API's)
        ("tensor_parallel_size <= 1, or device='cpu'", "--tensor-parallel-size <= 1, or device='cpu'"),
        ("quantization='int4-awq': layer 0", "--quantization int4-awq: layer 0"),
        # the API's name beside the flag: the flag once
        ("kv_cache_dtype (--kv-cache-dtype) 'fp8' is", "--kv-cache-dtype 'fp8' is"),
        # Python the user could run stays Python; names the command has no option for stay
        ("from_pretrained(path, kv_cache_dtype='fp8')", "from_pretrained(path, kv_cache_dtype='fp8')"),
        (
            "f(a, g(b), quantization='fp8') or quantization='fp8'",
            "f(a, g(b), quantization='fp8') or --quantization fp8",
        ),
        # a list of them, each worded (the second and third were left as the API's after a comma)
        (
            "kv_cache_dtype='fp8', quantization='fp8' and lm_head_quantization='fp8' do not run",
            "--kv-cache-dtype fp8, --quantization fp8 and --lm-head-quantization fp8 do not run",
        ),
        ("calib_prompts (--calib-data), llm.num_blocks", "calib_prompts (--calib-data), llm.num_blocks"),
    ],
)
def test_api_refusals_are_worded_with_the_commands_flags(message, worded) -> None:
    """`generate --tensor-parallel-size 3` was told about tensor_parallel_size, the API's argument: the
    loader's refusals are worded with the flags of the command's options of the same names."""
    from trtforge.cli._options import as_flags, flags_of
    from trtforge.cli.generate_cmd import generate_cmd

    assert as_flags(message, flags_of(generate_cmd)) == worded
