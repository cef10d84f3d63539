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
        # (generate's --device, the torch executor's placement, as serve's)
        ("tensor_parallel_size <= 1, or device='cpu'", "--tensor-parallel-size <= 1, or --device cpu"),
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


def test_generate_max_seq_defaults_to_the_models_positions(tmp_path, monkeypatch) -> None:
    """Before: --max-seq defaulted to 2048 whatever the model, so `compile --generate` of a model made for
    256 positions failed with "--max-seq 2048 exceeds..." though no --max-seq was given."""
    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.compile import compile as compile_module

    seen = {}

    class Exported(Exception):
        pass

    def export_step(lm, **kw):  # the export itself is covered elsewhere; here only its max_seq matters
        seen.update(kw)
        raise Exported

    monkeypatch.setattr(compile_module, "export_step", export_step)
    for factory, positions in (("gpt2", 256), ("llama", 256)):
        with pytest.raises(Exported):
            compile_module.compile_generate(tiny_model(factory), tmp_path / "m.engine", progress=False)
        assert seen["max_seq"] == positions
    long = tiny_model("llama", max_position_embeddings=8192)  # more than 2048 positions: the cap
    with pytest.raises(Exported):
        compile_module.compile_generate(long, tmp_path / "m.engine", progress=False)
    assert seen["max_seq"] == 2048
    assert list(tmp_path.iterdir()) == []


def test_generate_max_seq_past_the_models_positions_exits_2_naming_the_option(tmp_path, capsys) -> None:
    out = str(tmp_path / "m.engine")
    rc = main(["compile", "tests.llm.tiny_models:gpt2_factory", "--generate", "-o", out, "--max-seq", "512"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--max-seq 512 exceeds the model's 256 positions" in err and "Pass --max-seq <= 256" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("scaling", "limit"),
    [
        (None, 64),
        ({"rope_type": "linear", "factor": 2.0}, 128),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, 256),
        # (Llama 3.1's shape: max_position_embeddings already the extended length)
        (
            {"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 16}
            | {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
            64,
        ),
    ],
)
def test_a_static_rope_scaling_extends_the_max_seq_limit(scaling, limit) -> None:
    """One rule for compile's --max-seq and the executors' max_model_len (DecoderAdapter.sequence_limit):
    a static rotary scaling extends the model's positions; before, --max-seq stopped at
    max_position_embeddings where the torch executor went on to the scaled length."""
    import transformers

    from trtforge.errors import UserError
    from trtforge.llm.compile.export import check_max_seq, default_max_seq
    from trtforge.llm.models.families import adapter_for

    config = transformers.LlamaConfig(
        vocab_size=120,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **({"rope_scaling": scaling} if scaling else {}),
    )
    adapter = adapter_for(transformers.LlamaForCausalLM(config))
    assert default_max_seq(adapter) == 64  # (the default stays the model's own: the torch executor's too)
    check_max_seq(adapter, limit)
    with pytest.raises(UserError, match=rf"--max-seq {limit + 1} exceeds the model's {limit} positions"):
        check_max_seq(adapter, limit + 1)
