"""Bad input to the step compiler and the generation loop: a clear UserError (CLI exit 2), nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import trtforge
import trtforge.llm
import trtforge.llm.api
from tests.llm.tiny_models import tiny_model, unsupported_factory
from trtforge.cli.main import main as cli_main
from trtforge.errors import UserError
from trtforge.llm.compile.export import export_step


@pytest.fixture(scope="module")
def step_graph(tmp_path_factory) -> Path:
    """The tiny Llama's slot-layout step graph, step.onnx in a directory of its own."""
    d = tmp_path_factory.mktemp("step")
    r = export_step(tiny_model("llama"), max_seq=32, max_batch=2, max_prefill=8, exporter="legacy", workdir=d)
    onnx.save(r.model, str(d / "step.onnx"))
    return d / "step.onnx"


@pytest.fixture(scope="module")
def llm(step_graph):
    return trtforge.llm.api.load(step_graph)  # the raw loop, which checks each batch against the graph


@pytest.mark.parametrize("shape", [None, "input_ids:1x1:1x4:2x8"])
def test_compile_refuses_a_step_graph_pointing_at_generate(step_graph, tmp_path, capsys, shape):
    """Before: `trtforge compile step.onnx` (a step graph from --save-onnx) went into the encoder compile:
    exit 1 with TensorRT's internal error about the KV-cache update's profile, or with ranges that pass, a
    plain engine without the generation section that tells a step engine (export-triton then wrote it out
    as a batching Triton model). It is recognised by its trtforge.generation metadata and refused, exit 2,
    naming --generate and the commands that run the graph as it is."""
    step = tmp_path / "step.onnx"
    step.write_bytes(step_graph.read_bytes())
    argv = ["compile", str(step), "-o", str(tmp_path / "s.engine")] + (["--shape", shape] if shape else [])
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"'{step}' is a decoder step graph (its 'trtforge.generation' metadata" in err, err
    assert "`trtforge compile MODEL --generate`" in err and f"`trtforge serve {step}`" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.onnx"]
    assert cli_main(["inspect", str(step)]) == 0  # (inspect reads ONNX files through the same reader)


def test_unsupported_family_lists_supported(tmp_path):
    with pytest.raises(UserError, match="llama, mistral, ministral, qwen2.*starcoder2.*gpt2"):
        trtforge.compile(unsupported_factory()[0], output=tmp_path / "x.engine", generate=True)
    assert list(tmp_path.iterdir()) == []


def test_cli_unsupported_family_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    out = tmp_path / "x.engine"
    rc = cli_main(
        [
            "compile",
            "tests.llm.tiny_models:unsupported_factory",
            "--generate",
            "-o",
            str(out),
            "--save-onnx",
            str(tmp_path / "s.onnx"),
        ]
    )
    assert rc == 2
    assert "not supported by --generate" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_prompt_limits(llm):
    with pytest.raises(UserError, match="--max-prefill"):
        llm.generate([list(range(9))], 2)
    with pytest.raises(UserError, match="--max-seq"):
        llm.generate([list(range(8))], 25)
    with pytest.raises(UserError, match="--max-batch"):
        llm.generate([[1], [2], [3]], 2)
    with pytest.raises(UserError, match="outside the vocabulary"):
        llm.generate([[1, 300]], 2)
    with pytest.raises(UserError, match="non-empty"):
        llm.generate([[]], 2)
    with pytest.raises(UserError, match="integer token ids"):
        llm.generate([[1.5, 2]], 2)
    assert llm.generate(np.array([[3, 4]]), 2, stop_at_eos=False) == llm.generate(
        [[3, 4]], 2, stop_at_eos=False
    )


def test_cache_from_another_engine(llm, tmp_path):
    ex = llm.executor
    feeds = {
        "input_ids": np.array([[1]], np.int64),
        "position_ids": np.array([[0]], np.int64),
        "past_lens": np.zeros(1, np.int64),
        "new_lens": np.ones(1, np.int64),
        **ex.new_cache(1),
    }
    ex.run(feeds)
    other = dict(feeds, **{"key_cache.0": np.zeros((1, 2, 64, 16), np.float32)})  # another max_seq
    with pytest.raises(UserError, match="key_cache.0.*another engine"):
        ex.run(other)
    fp16 = dict(feeds, **{"value_cache.1": feeds["value_cache.1"].astype(np.float16)})
    with pytest.raises(UserError, match="value_cache.1.*dtype float16"):
        ex.run(fp16)
    with pytest.raises(UserError, match="past_lens"):
        ex.run(dict(feeds, past_lens=np.array([32], np.int64)))


@pytest.mark.parametrize("max_seq", [2, 3])
def test_a_slot_cache_of_a_few_tokens_exports(tmp_path, max_seq):
    """Before: --max-seq 2 or 3 was an internal error (exit 1): the export's check prefilled 3 tokens and
    decoded a 4th, past the cache ("index 3 is out of bounds for dimension 2 with size 3")."""
    r = export_step(tiny_model("llama"), max_seq=max_seq, max_batch=2, exporter="legacy", workdir=tmp_path)
    assert r.generation["max_seq"] == max_seq


def test_a_cache_of_one_token_is_refused(tmp_path):
    """max_seq 1 holds a prompt token and no new one (it failed inside the export before)."""
    with pytest.raises(UserError, match=r"--max-seq must be >= 2 \(a prompt token and a new one\)"):
        export_step(tiny_model("llama"), max_seq=1, max_batch=2, exporter="legacy", workdir=tmp_path)


def test_bad_compile_options(tmp_path):
    model = tiny_model("gpt2")
    with pytest.raises(UserError, match="exceeds the model's 256 positions"):
        trtforge.compile(model, output=tmp_path / "a.engine", generate=True, max_seq=512)
    with pytest.raises(UserError, match="--max-prefill 40 exceeds --max-seq 32"):
        trtforge.compile(model, output=tmp_path / "a.engine", generate=True, max_seq=32, max_prefill=40)
    with pytest.raises(UserError, match="fp16"):
        trtforge.compile(model, output=tmp_path / "a.engine", generate=True, precision="fp32")
    with pytest.raises(UserError, match="int8 needs calibration prompts"):
        trtforge.compile(model, output=tmp_path / "a.engine", generate=True, precision="int8")
    assert list(tmp_path.iterdir()) == []


def test_load_rejects_non_step_graph_and_engine(tmp_path):
    with pytest.raises(UserError, match="TensorRT engine"):
        trtforge.llm.load(tmp_path / "m.engine")
    plain = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    onnx.save(plain, str(tmp_path / "plain.onnx"))
    with pytest.raises(UserError, match="not a trtforge step graph"):
        trtforge.llm.load(tmp_path / "plain.onnx")


def test_half_precision_model_is_refused(tmp_path):
    with pytest.raises(UserError, match="torch.float16 weights"):
        export_step(tiny_model("llama").half(), max_seq=16, exporter="legacy", workdir=tmp_path)


def test_tiny_cache_compiles_and_generates(tmp_path):
    """--max-seq below the pass verifier's sizes still compiles (checked on valid step feeds instead)."""
    model = tiny_model("gpt2")
    trtforge.compile(
        model,
        output=None,
        generate=True,
        build=False,
        save_onnx=tmp_path / "s.onnx",
        precision="fp32",
        max_seq=4,
        max_batch=1,
        exporter="legacy",
        progress=False,
    )
    with trtforge.llm.load(tmp_path / "s.onnx") as llm:
        assert len(llm.generate([[1, 2]], max_new_tokens=2, stop_at_eos=False)[0]) == 2
        assert len(llm.generate([[1, 2, 3]], max_new_tokens=2, stop_at_eos=False)[0]) == 1  # cache full
        with pytest.raises(UserError, match="maximum sequence length is 4"):
            llm.generate([[1, 2, 3, 4]], max_new_tokens=2)
    with pytest.raises(UserError, match="--max-seq"):
        trtforge.llm.api.load(tmp_path / "s.onnx").generate([[1, 2, 3]], 2)


def test_cli_generate_option_errors(tmp_path, capsys):
    out = tmp_path / "x.engine"
    bad = tmp_path / "ids.txt"
    bad.write_text("1 2 three\n")
    base = ["compile", "tests.llm.tiny_models:llama_factory", "--generate", "-o", str(out)]
    assert cli_main([*base, "--precision", "int8", "--calib-data", str(bad)]) == 2
    assert "space-separated token ids" in capsys.readouterr().err
    assert cli_main([*base, "--shape", "input_ids:1x1:1x1:1x1"]) == 2
    assert "--shape cannot be combined with --generate" in capsys.readouterr().err
    assert cli_main(["compile", str(bad), "--generate", "-o", str(out)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.txt"]


@pytest.mark.parametrize(
    "args",
    [
        ["--smoothquant", "0.5"],
        ["--no-smoothquant"],
        ["--calib-method", "entropy"],
        ["--calib-samples", "2"],
        ["--int8-rest", "fp32"],
        ["--tokenizer", "demo"],
        ["--low-precision-io"],  # (named by the pair's first spelling, --keep-io-types)
        ["--no-verify"],  # (--verify)
    ],
)
def test_cli_generate_refuses_the_encoder_precision_options(args, tmp_path, capsys):
    """These were read by nothing on the --generate path: `--smoothquant 0.5` built the alpha 0.8 INT8
    step engine as if it had not been given. Refused by name now, before the model loads."""
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3\n")
    out = tmp_path / "x.engine"
    base = ["compile", str(tmp_path / "missing-model"), "--generate", "-o", str(out)]
    assert cli_main([*base, "--precision", "int8", "--calib-data", str(ids), *args]) == 2
    flag = {"--low-precision-io": "--keep-io-types", "--no-verify": "--verify"}.get(args[0], args[0])
    assert f"{flag} cannot be combined with --generate" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.txt"]


def test_cli_generate_fp32_points_at_what_writes_the_fp32_step_graph(tmp_path, capsys):
    """The refusal offered "(build=False, save_onnx)", which no compile option gives: it names the call."""
    out = tmp_path / "x.engine"
    argv = ["compile", str(tmp_path / "missing-model"), "--generate", "--precision", "fp32", "-o", str(out)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "use --precision fp16 (default) or bf16" in err
    assert "trtforge.compile(model, None, generate=True, build=False, save_onnx='step.onnx'" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option", ["--save-onnx", "-o"])
def test_cli_generate_never_writes_over_its_calib_data(option, tmp_path, capsys):
    """--save-onnx ids.txt --force wrote the step graph over the --calib-data file it had just read."""
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3\n")
    args = ["--save-onnx", str(ids)] if option == "--save-onnx" else []
    out = ids if option == "-o" else tmp_path / "x.engine"
    argv = ["compile", "tests.llm.tiny_models:llama_factory", "--generate", "-o", str(out), "--force"]
    argv += ["--max-seq", "32", "--max-batch", "2", "--precision", "int8", "--calib-data", str(ids)]
    assert cli_main([*argv, *args]) == 2
    assert f"'{ids}' is the --calib-data file" in capsys.readouterr().err
    assert ids.read_text() == "1 2 3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.txt"]


# _broken_dir's edits of config.json: what -> (key, value)
_CONFIG_EDITS = {
    "heads as text": ("num_attention_heads", "4"),
    "zero heads": ("num_attention_heads", 0),
    "no layers": ("num_hidden_layers", 0),
    "negative hidden": ("hidden_size", -32),
    "kv heads": ("num_key_value_heads", 3),
    "activation": ("hidden_act", "swoosh"),
    "negative eps": ("rms_norm_eps", -1.0),
    "100000 layers": ("num_hidden_layers", 100000),
    "huge hidden": ("hidden_size", 10**6),
    "fewer layers": ("num_hidden_layers", 1),
    "rope type": ("rope_parameters", {"rope_type": "bogus", "rope_theta": 10000.0}),
    "pad outside": ("pad_token_id", 10**9),
    "no positions": ("max_position_embeddings", 0),
}


# _broken_dir's edits of one weight of model.safetensors: what -> the stored tensor from the good one
_WEIGHT_EDITS = {
    "weight shape": lambda t: t[:, : t.shape[1] // 2].contiguous(),
    "integer weight": lambda t: (t * 100).to(torch.int32),
    # (with a quantization_config whose quant_method transformers does not know: _QUANTIZED)
    "unknown quantization": lambda t: (t * 100).to(torch.int8),
    "nan weight": lambda t: torch.full_like(t, float("nan")),
}


# _broken_dir's quantization_config beside a weight _WEIGHT_EDITS stores as integers
_QUANTIZED = {"unknown quantization": {"quant_method": "int8_custom", "bits": 8}}


def _broken_dir(tmp_path, what: str):
    """A save_pretrained directory of a tiny Llama with `what` broken."""
    d = tmp_path / what
    tiny_model("llama", **({"attention_bias": True} if what == "biases off" else {})).save_pretrained(d)
    if what == "biases off":
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(config | {"attention_bias": False}))
    elif what == "generation not json":
        (d / "generation_config.json").write_text('{"eos_token_id": [0, 2')
    elif what == "generation eos":
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": ["x"]}))
    elif what == "generation eos outside":
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5000]}))
    elif what == "config":
        (d / "config.json").write_text("{not json")
    elif what == "weights":
        weights = d / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    elif what == "no weights":
        (d / "model.safetensors").unlink()
    elif what in _WEIGHT_EDITS:
        from safetensors.torch import load_file, save_file

        tensors = load_file(d / "model.safetensors")
        name = "model.layers.0.self_attn.q_proj.weight"
        tensors[name] = _WEIGHT_EDITS[what](tensors[name])
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
        if what in _QUANTIZED:
            config = json.loads((d / "config.json").read_text())
            (d / "config.json").write_text(json.dumps(config | {"quantization_config": _QUANTIZED[what]}))
    elif what == "layers unset" or what in _CONFIG_EDITS:
        config = json.loads((d / "config.json").read_text())
        if what == "layers unset":  # LlamaConfig's default is 32 layers; the file holds 2
            del config["num_hidden_layers"]
        else:
            key, value = _CONFIG_EDITS[what]
            config[key] = value
        (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("config", r"config\.json' is not a Hugging Face config transformers can read"),
        ("weights", r"cannot load the weights in .*SafetensorError"),
        ("no weights", r"cannot load the weights in .*no file named model\.safetensors"),
        # before: huggingface_hub's StrictDataclassFieldValidationError / a ZeroDivisionError (exit 1), and
        # a model of 32 layers, 30 of them random, silently compiled
        # (and the reason, on the validation error's second line: before, the message ended at "field
        # 'num_attention_heads':")
        ("heads as text", r"config\.json' is not a Hugging Face config .*'num_attention_heads': .*expected"),
        ("zero heads", r"config\.json' is not a Hugging Face config .*ZeroDivisionError"),
        # (since refused before the model is built: the weights' layer names say 2 layers)
        (
            "layers unset",
            r"config\.json': num_hidden_layers=32 \(not in config\.json: transformers' default for llama\), "
            r"but the weights in '.*' hold 2 layer\(s\) \(model\.layers\.0 to model\.layers\.1\)",
        ),
        # before: transformers built the whole model (100000 layers: ~20 GB and minutes; hidden 10**6:
        # terabytes) before reporting the missing or mismatched weights; now refused from the safetensors
        # header alone
        (
            "100000 layers",
            r"config\.json': num_hidden_layers=100000, but the weights in '.*' hold 2 layer\(s\) "
            r"\(model\.layers\.0 to model\.layers\.1\); transformers would build all 100000 layers",
        ),
        (
            "huge hidden",
            r"config\.json' makes a model far larger than its weights: hidden_size=1000000, vocab_size=300 "
            r"and num_hidden_layers=2 make at least 1,000,300,000,000 parameters, but the weight files in "
            r"'.*' hold \d[\d,]* values",
        ),
        # before: an IndexError (exit 1: "internal error"), a tensor shape blamed on the weight files, and
        # a KV head count the attention cannot share out blamed on them too (or, with weights of that
        # shape, a RuntimeError from the executor's step)
        ("no layers", r"llama config: num_hidden_layers must be .* >= 1, got 0\."),
        ("negative hidden", r"llama config: hidden_size must be .* >= 1, got -32\."),
        ("kv heads", r"llama config: num_key_value_heads=3 does not divide num_attention_heads=4;"),
        # before: generate printed "0 0 0" (NaN logits) and compile failed on an unfaithful export
        ("negative eps", r"llama config: rms_norm_eps must be a number >= 0, got -1\.0\."),
        # before: "cannot load the weights ... (KeyError: 'swoosh')"
        ("activation", r"config\.json': hidden_act='swoosh' is no activation transformers knows"),
        # before: "cannot load the weights ... (RuntimeError: You set `ignore_mismatched_sizes` to `False`,
        # thus raising an error. For details look at the above report!)", with no report above it
        (
            "weight shape",
            r"tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' is stored with shape \[64, 32\], "
            r"config\.json makes it \[64, 64\]\.",
        ),
        # before: the integers were cast to floats without a word (the engine built and generate ran)
        ("integer weight", r"stores tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' as I32, an integer"),
        # before: transformers skipped the unknown method with a warning, the integer check trusted the
        # quantization_config, and the int8 weights ran as floats (exit 0, nonsense tokens)
        (
            "unknown quantization",
            r"config\.json': quantization_config\.quant_method='int8_custom' is no quantization method "
            r"transformers knows \(.*gptq.*\); it would load",
        ),
        # before: transformers dropped the stored layer 1 (or every attention bias) with a warning its
        # silenced verbosity kept unprinted, and compiled a model other than the checkpoint's (exit 0)
        (
            "fewer layers",
            r"the weights in '[^']*' hold tensors its config\.json has no place for: "
            r"\['model\.layers\.1\.input_layernorm\.weight', .*\(and \d+ more\); .*num_hidden_layers=1",
        ),
        (
            "biases off",
            r"has no place for: \['model\.layers\.0\.self_attn\.k_proj\.bias', .*attention_bias, mlp_bias",
        ),
        # before: "cannot load the weights ... (KeyError: 'bogus')" and "(AssertionError: Padding_idx must be
        # within num_embeddings)", blaming the weight files for config.json's key
        (
            "rope type",
            r"llama config: rope_parameters\.rope_type must be one of \[.*'yarn'\], got 'bogus'\.",
        ),
        (
            "pad outside",
            r"config\.json': pad_token_id=1000000000 lies outside the vocabulary of vocab_size=300 ids",
        ),
        # before: compile --generate made a step graph of 2 tokens (the default max_seq, at most the model's
        # positions); generate said the prompt was too long for a context of 0 tokens
        ("no positions", r"llama config: max_position_embeddings must be null or an integer >= 1, got 0\."),
        # before: transformers took it for no file, and its stop ids were dropped without a word (exit 0)
        (
            "generation not json",
            r"generation_config\.json' is not a generation config transformers can read \(OSError: ",
        ),
        # before: ValueError from int('x') while the adapter listed the stop ids: an internal error (exit 1)
        (
            "generation eos",
            r"generation_config\.json': eos_token_id must be a token id \(an integer\), a list of them or "
            r"null; got \['x'\]\.",
        ),
        # before: generate ran on NaN logits; compile failed its export check (exit 1, no weight named)
        ("nan weight", r"parameter 'model\.layers\.0\.self_attn\.q_proj\.weight' holds NaN\. Expected"),
    ],
)
def test_broken_save_pretrained_directory_exits_2(what, message, tmp_path, capsys, request):
    import transformers

    # (transformers' own warning of a pad_token_id outside the vocabulary goes to the stderr its handler took
    # at its first message, in a worker maybe an earlier test's closed capture: "--- Logging error ---")
    verbosity = transformers.logging.get_verbosity()
    request.addfinalizer(lambda: transformers.logging.set_verbosity(verbosity))
    transformers.logging.set_verbosity_error()
    d = _broken_dir(tmp_path, what)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for argv in (
        ["generate", str(d), "--prompt-ids", "1 2 3", "--executor", "torch"],
        ["compile", str(d), "--generate", "-o", str(tmp_path / "x.engine")],
    ):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and re.search(message, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_generation_config_stop_id_outside_the_vocabulary_is_reported(tmp_path, capsys):
    """generation_config.json's eos_token_id outside the vocabulary: generate runs (as transformers' own
    generate does, never stopping there) and says so, naming the file and the id. Before, the id was
    dropped from the stop ids without a word (transformers warns only of config.json's)."""
    d = _broken_dir(tmp_path, "generation eos outside")
    assert (
        cli_main(["generate", str(d), "--prompt-ids", "1 2 3", "--executor", "torch", "--max-tokens", "2"])
        == 0
    )
    err = " ".join(capsys.readouterr().err.split())
    assert re.search(
        r"warning: '[^']*/generation_config\.json': eos_token_id \[5000\] lie\(s\) outside the vocabulary "
        r"of vocab_size=300 ids",
        err,
    ), err


class _RunsCode:
    """Unpickled, calls os.system: what a hostile pytorch_model.bin asks the unpickler to do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _bin_dir(tmp_path: Path, what: str) -> Path:
    """A tiny Llama's save_pretrained directory whose weights are pytorch_model.bin, with `what` broken."""
    from safetensors.torch import load_file

    d = tmp_path / what
    tiny_model("llama").save_pretrained(d)
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    weights = d / "pytorch_model.bin"
    name = "model.layers.0.self_attn.q_proj.weight"
    if what == "runs code":
        torch.save({**tensors, name: _RunsCode(tmp_path / "ran")}, weights)
    elif what == "runs code, legacy format":
        torch.save({name: _RunsCode(tmp_path / "ran")}, weights, _use_new_zipfile_serialization=False)
    elif what == "a list":
        torch.save(list(tensors.values()), weights)
    elif what == "a number in the dict":
        torch.save({**tensors, name: 3}, weights)
    else:
        torch.save(
            {**tensors, name: _WEIGHT_EDITS[what](tensors[name])} if what in _WEIGHT_EDITS else tensors,
            weights,
        )
    if what in _CONFIG_EDITS:
        key, value = _CONFIG_EDITS[what]
        (d / "config.json").write_text(json.dumps(json.loads((d / "config.json").read_text()) | {key: value}))
    if what == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif what == "empty":
        weights.write_bytes(b"")
    elif what == "index naming a missing shard":
        weights.rename(d / "pytorch_model-00001-of-00001.bin")
        index = {"weight_map": dict.fromkeys(tensors, "pytorch_model-00002-of-00002.bin")}
        (d / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    elif what == "index not json":
        weights.rename(d / "pytorch_model-00001-of-00001.bin")
        (d / "pytorch_model.bin.index.json").write_text('{"weight_map": ')
    return d


@pytest.mark.parametrize(
    ("what", "message"),
    [
        # before: transformers' own weights-only load refused it (it ran no code), in a message naming the
        # directory, cut after torch's advice to load the file again with weights_only=False
        (
            "runs code",
            r"'[^']*/pytorch_model\.bin' is not a plain checkpoint: its pickle asks for what torch's "
            r"weights-only unpickler refuses \(Trying to load unsupported GLOBAL posix\.system",
        ),
        (
            "runs code, legacy format",
            r"pytorch_model\.bin' is not a plain checkpoint: .*GLOBAL posix\.system",
        ),
        (
            "truncated",
            r"cannot read the weights in '[^']*/pytorch_model\.bin' \(RuntimeError: PytorchStreamReader "
            r"failed reading zip archive.*the file is truncated or damaged",
        ),
        (
            "empty",
            r"cannot read the weights in '[^']*/pytorch_model\.bin' \(EOFError\); the file is truncated",
        ),
        # before: "cannot load the weights in DIR (TypeError: cannot convert dictionary update sequence ...)"
        ("a list", r"'[^']*/pytorch_model\.bin' holds a list, not a state dict \(tensor name -> tensor\)"),
        (
            "a number in the dict",
            r"pytorch_model\.bin' holds 'model\.layers\.0\.self_attn\.q_proj\.weight': int in its state dict",
        ),
        # before: the integers were cast to floats without a word (safetensors files were checked, .bin not)
        (
            "integer weight",
            r"pytorch_model\.bin' stores tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' as "
            r"torch\.int32, an integer type",
        ),
        (
            "index naming a missing shard",
            r"cannot read '[^']*/pytorch_model-00002-of-00002\.bin': No such file or directory",
        ),
        ("index not json", r"pytorch_model\.bin\.index\.json' is not the index save_pretrained writes"),
        # before: left to transformers, which built all 100000 layers (gigabytes, minutes) before reporting
        # the missing weights; now refused from the pickles' meta tensors, as from safetensors headers
        (
            "100000 layers",
            r"config\.json': num_hidden_layers=100000, but the weights in '.*' hold 2 layer\(s\)",
        ),
        ("huge hidden", r"config\.json' makes a model far larger than its weights: hidden_size=1000000"),
    ],
)
def test_a_broken_or_hostile_bin_checkpoint_exits_2_naming_the_file(what, message, tmp_path, capsys):
    """pytorch_model.bin checkpoints are read by torch's weights-only unpickler onto the meta device before
    transformers loads them: a pickle asking to run code runs none and is refused naming the file, as is a
    damaged one or one holding anything but tensors."""
    d = _bin_dir(tmp_path, what)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for argv in (
        ["generate", str(d), "--prompt-ids", "1 2 3", "--executor", "torch"],
        ["compile", str(d), "--generate", "-o", str(tmp_path / "x.engine")],
    ):
        assert cli_main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())  # (rich wraps the message)
        assert "Traceback" not in err and re.search(message, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "ran").exists()


def test_a_plain_bin_checkpoint_loads_and_old_torch_is_refused(tmp_path, monkeypatch):
    """A pytorch_model.bin as save_pretrained wrote it loads as its safetensors twin does; with a torch
    whose weights-only unpickler can be made to run code (< 2.6, CVE-2025-32434) it is refused naming the
    file, before anything unpickles it."""
    from torch.torch_version import TorchVersion

    from trtforge.llm.models.loader import load_causal_lm

    d = _bin_dir(tmp_path, "plain")
    ref = tiny_model("llama")
    model = load_causal_lm(str(d))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.5.1"))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("unpickled with an unsafe torch"))
    with pytest.raises(
        UserError, match=r"pytorch_model\.bin' is a pickled \(\.bin\) checkpoint, and torch 2\.5\.1"
    ):
        load_causal_lm(str(d))


@pytest.mark.parametrize("eos", [2.7, "5", True])
def test_a_stop_id_that_is_not_an_integer_is_refused_by_name(eos):
    """An nn.Module whose generation config holds a stop id int() would misread (2.7 as 2, "5", true as 1),
    which transformers does not validate: refused naming the key."""
    from trtforge.llm.models.families import adapter_for

    model = tiny_model("llama")
    model.generation_config.eos_token_id = [eos]
    with pytest.raises(
        UserError, match=r"generation config eos_token_id \(generation_config\.json\) must be"
    ):
        adapter_for(model).spec  # noqa: B018 - the spec lists the stop ids


def test_a_model_of_impossible_sizes_is_refused_naming_the_config_key(tmp_path):
    """An nn.Module whose config no weights fix: no layers (GPT-2's key spelled as its config spells it),
    KV heads that do not divide the query heads (transformers builds both). Before: an IndexError (exit 1)
    and a RuntimeError deep in the export or the executor's first step."""
    import transformers as tf

    from trtforge.llm.executors.torch_exec import TorchExecutor

    empty = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=0, n_head=4)).eval()
    uneven = tiny_model("llama", num_key_value_heads=3)
    for model, message in (
        (empty, r"gpt2 config: n_layer must be .* >= 1, got 0\."),
        (uneven, r"llama config: num_key_value_heads=3 does not divide num_attention_heads=4;"),
    ):
        with pytest.raises(UserError, match=message):
            export_step(model, max_seq=32, exporter="legacy", workdir=tmp_path)
        with pytest.raises(UserError, match=message):
            TorchExecutor(model, num_blocks=8, block_size=4)
    assert list(tmp_path.iterdir()) == []


def test_the_kv_head_key_is_named_as_the_config_stores_it():
    """Falcon keeps its KV heads in ``num_kv_heads`` (``num_key_value_heads`` is a property over it): the
    message names the key a user finds in config.json."""
    import transformers as tf

    from trtforge.llm.models.base import check_config_sizes

    falcon = tf.FalconConfig(
        hidden_size=32, num_attention_heads=4, num_kv_heads=3, new_decoder_architecture=True
    )
    message = r"falcon config: num_kv_heads=3 does not divide num_attention_heads=4;"
    with pytest.raises(UserError, match=message):
        check_config_sizes(falcon)
    with pytest.raises(UserError, match=r"gpt2 config: n_layer must be"):
        check_config_sizes(tf.GPT2Config(n_layer=0))


@pytest.mark.parametrize(
    ("family", "overrides", "message"),
    [
        ("llama", {"rope_theta": -5.0}, r"llama config: rope_theta must be a finite number > 0"),
        ("llama", {"rope_theta": 0}, r"llama config: rope_theta must be a finite number > 0 .*got 0\."),
        (
            "llama",
            {"rope_scaling": {"rope_type": "linear", "factor": -2.0}},
            r"llama config: rope_parameters\.factor must be a finite number > 0 .*got -2\.0\.",
        ),
        (
            "llama",
            {"rope_scaling": {"rope_type": "linear", "factor": 0}},
            r"llama config: rope_parameters\.factor must be a finite number > 0",
        ),
        (
            "phi",
            {"partial_rotary_factor": 0},
            r"phi config: partial_rotary_factor must be a number in \(0, 1\]",
        ),
        (
            "gpt_neox",
            {"rotary_pct": 1.5},
            r"gpt_neox config: rotary_pct must be a number in \(0, 1\] .*got 1\.5",
        ),
        (
            "llama",
            {"intermediate_size": 0},
            r"llama config: intermediate_size must be null or an integer >= 1",
        ),
        (
            "llama",
            {"intermediate_size": -3},
            r"llama config: intermediate_size must be null or an integer >= 1",
        ),
    ],
)
def test_impossible_rotary_and_mlp_settings_are_refused_naming_the_key(tmp_path, family, overrides, message):
    """config.json values no model can run with: a RoPE base or scaling factor <= 0 (NaN or infinite
    frequencies), a partial_rotary_factor outside (0, 1], an MLP of intermediate_size < 1. Refused by name
    before any weight is read (before: loaded, then NaN logits or a shape error deep in the model)."""
    import transformers as tf

    from trtforge.llm.models.base import check_config_sizes
    from trtforge.llm.models.loader import load_causal_lm

    config = tf.AutoConfig.for_model(family, **overrides)
    with pytest.raises(UserError, match=message):
        check_config_sizes(config)
    config.save_pretrained(tmp_path)  # (no weights: the refusal comes before they are read)
    with pytest.raises(UserError, match=message):
        load_causal_lm(str(tmp_path))


def test_rotary_settings_left_null_or_per_layer_type_pass_and_a_bad_layer_type_is_named():
    """Null values mean default, a layer type's null rope_parameters entry is NoPE: both pass, as every
    supported family's default config does; a bad base under a layer type names that type."""
    import transformers as tf

    from trtforge.llm.models.base import SUPPORTED, check_config_sizes

    for family in SUPPORTED:
        check_config_sizes(tf.AutoConfig.for_model(family))
    check_config_sizes(tf.AutoConfig.for_model("phi", partial_rotary_factor=1.0))
    gemma = tf.AutoConfig.for_model("gemma3_text")
    gemma.rope_parameters = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": None,
    }
    check_config_sizes(gemma)
    gemma.rope_parameters["sliding_attention"] = {"rope_type": "default", "rope_theta": float("nan")}
    with pytest.raises(
        UserError, match=r"gemma3_text config: rope_parameters\.sliding_attention\.rope_theta must"
    ):
        check_config_sizes(gemma)


def test_a_window_below_one_is_refused_by_name_where_the_attention_applies_none(tmp_path):
    """Llama's attention applies no window; a config's sliding_window below 1 is refused as the nonsense it
    is (before: "shorter than --max-seq 32 ... Pass --max-seq <= -4")."""
    from trtforge.llm.executors.torch_exec import TorchExecutor

    model = tiny_model("llama")
    model.config.sliding_window = -4
    message = r"llama config: sliding_window must be null or an integer >= 1, got -4"
    with pytest.raises(UserError, match=message):
        export_step(model, max_seq=32, exporter="legacy", workdir=tmp_path)
    with pytest.raises(UserError, match=message):
        TorchExecutor(model, num_blocks=8, block_size=4, max_model_len=32)


def test_int8_calibration_prompt_outside_the_vocabulary_is_named(llm):
    """The id itself is named (before: only the prompt's length, which was within the limit)."""
    from trtforge.llm.compile.int8 import prompt_dataset

    generation = llm.generation
    vocab = generation["vocab_size"]
    with pytest.raises(UserError, match=rf"prompt 1 \(--calib-data.*ids \[{vocab}, -1\] outside the model's"):
        prompt_dataset(onnx.ModelProto(), generation, [[1, 2], [1, vocab, -1]])  # checked before the model


def test_int8_calibration_prompts_share_one_zeroed_kv_cache(tmp_path):
    """The prefill samples of `compile --generate --precision int8/fp8` feed a zeroed KV cache; 256 prompts
    hold one of them, not one each (before: a cache per prompt, GBs for a real model's few dozen)."""
    import tracemalloc

    from trtforge.llm.compile.int8 import prompt_dataset

    r = export_step(
        tiny_model("llama"), max_seq=256, max_batch=2, max_prefill=8, exporter="legacy", workdir=tmp_path
    )
    cache = r.generation["cache"]
    one = len(cache["inputs"]) * int(np.prod(cache["shape"][1:])) * 4  # a prompt's caches, in bytes
    tracemalloc.start()
    try:
        data = prompt_dataset(r.model, r.generation, [[1, 2, 3]] * 256)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * one, (peak, one)
    batch = next(iter(data))
    for name in cache["inputs"]:
        assert batch[name].shape == (1, *cache["shape"][1:]) and not batch[name].any()


def test_a_gemma_3_multimodal_directory_is_refused_pointing_at_the_text_model(tmp_path, capsys):
    """A save_pretrained directory of Gemma3ForConditionalGeneration ('gemma3'): exit 2, naming the text
    model (Gemma3ForCausalLM, 'gemma3_text') as what to load instead."""
    import transformers as tf

    text = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 14}
    tf.Gemma3Config(text_config=text, vision_config=vision).save_pretrained(tmp_path / "g3")
    assert cli_main(["compile", str(tmp_path / "g3"), "--generate", "-o", str(tmp_path / "x.engine")]) == 2
    err = capsys.readouterr().err
    assert "holds a 'gemma3' model" in err and "Gemma3ForCausalLM" in err, err
    assert not (tmp_path / "x.engine").exists()


def test_checkpoints_smaller_than_a_plain_one_pass_the_config_against_weights_check(tmp_path):
    """The early refusal of a config.json far larger than its weights (read from the safetensors headers)
    passes checkpoints that legitimately hold fewer tensors or bytes than a plain float one: tied
    embeddings, MoE, sharded (an index), weights packed as 4-bit quantization packs them (int32, 8 values
    each, with quantization_config), and the trained models."""
    import transformers as tf
    from safetensors.torch import load_file, save_file

    from trtforge.llm.models.loader import _refuse_config_beyond_weights

    dirs = []
    for name, model, shard in (
        ("tied", tiny_model("llama", tie_word_embeddings=True), None),
        ("moe", tiny_model("mixtral"), None),
        ("sharded", tiny_model("llama"), "20KB"),
        ("packed", tiny_model("llama"), None),
    ):
        d = tmp_path / name
        model.save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
        dirs.append(d)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    packed = tmp_path / "packed"
    tensors = load_file(packed / "model.safetensors")
    for name in [n for n in tensors if ".layers." in n and n.endswith("proj.weight")]:
        w = tensors.pop(name)
        tensors[name.replace(".weight", ".qweight")] = torch.zeros(
            w.shape[1] // 8, w.shape[0], dtype=torch.int32
        )
    save_file(tensors, packed / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((packed / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": -1}
    (packed / "config.json").write_text(json.dumps(config))
    shared = sorted((Path(__file__).resolve().parents[2] / "../shared/models").glob("code-llama-*"))
    for d in dirs + shared:
        _refuse_config_beyond_weights(d, tf.AutoConfig.from_pretrained(str(d), local_files_only=True), {})


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ("{not json", r"\(JSONDecodeError: "),
        ("{}", r"\(KeyError: 'weight_map'\)"),
        ('{"weight_map": [1]}', r"\(AttributeError: "),
        ('{"weight_map": {"lm_head.weight": 5}}', r"names a shard by a value that is not a string"),
    ],
)
def test_a_damaged_safetensors_index_exits_2_naming_it(index, message, tmp_path, capsys):
    """model.safetensors.index.json is read (for the .bin files beside it, the config against the weights)
    before transformers reads it, as pytorch_model.bin.index.json is: a damaged one is refused naming it.
    Before, its JSONDecodeError, KeyError, AttributeError or TypeError was an internal error (exit 1)."""
    d = tmp_path / "hf"
    tiny_model("llama").save_pretrained(d, max_shard_size="20KB")
    (d / "model.safetensors.index.json").write_text(index)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for argv in (
        ["generate", str(d), "--prompt-ids", "1 2 3", "--executor", "torch"],
        ["compile", str(d), "--generate", "-o", str(tmp_path / "x.engine")],
    ):
        assert cli_main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())  # (rich wraps the message)
        assert "Traceback" not in err, err
        assert re.search(r"model\.safetensors\.index\.json' (is not the index|names a shard)", err), err
        assert re.search(message, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_the_config_against_weights_check_lets_only_a_damaged_file_pass_unread(tmp_path, monkeypatch):
    """The early header read leaves a weight file safetensors cannot read to transformers' load (which
    names it); any other error there is a fault of trtforge's and is raised, not taken for a damaged file
    (the check skipped without a word)."""
    import safetensors
    import transformers as tf

    from trtforge.llm.models.loader import _refuse_config_beyond_weights

    d = tmp_path / "hf"
    tiny_model("llama").save_pretrained(d)
    config = tf.AutoConfig.from_pretrained(str(d), local_files_only=True)
    weights = d / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:1000])
    _refuse_config_beyond_weights(d, config, {})  # (SafetensorError: left to transformers)
    weights.write_bytes(good)

    def broken(*args, **kwargs):
        raise RuntimeError("a fault in the header read")

    monkeypatch.setattr(safetensors, "safe_open", broken)
    with pytest.raises(RuntimeError, match="a fault in the header read"):
        _refuse_config_beyond_weights(d, config, {})


def _custom_code_dir(tmp_path: Path, what: str) -> tuple[Path, Path]:
    """A directory whose `what` ("model" or "tokenizer") names its own Python code (auto_map), which would
    create the returned marker file when run."""
    d, marker = tmp_path / what, tmp_path / "ran"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    if what == "model":
        tiny_model("llama").save_pretrained(d)
        config = json.loads((d / "config.json").read_text())
        config |= {
            "model_type": "customlm",
            "auto_map": {"AutoConfig": "configuration_customlm.CustomConfig"},
        }
        (d / "config.json").write_text(json.dumps(config))
        (d / "configuration_customlm.py").write_text(
            code + "from transformers import LlamaConfig as CustomConfig\n"
        )
    else:
        d.mkdir(parents=True)
        auto_map = {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]}
        (d / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "CustomTokenizer", "auto_map": auto_map})
        )
        (d / "tokenization_custom.py").write_text(
            code + "from transformers import PreTrainedTokenizer as CustomTokenizer\n"
        )
    return d, marker


@pytest.mark.parametrize("what", ["model", "tokenizer"])
def test_a_checkpoint_with_its_own_code_is_refused_without_running_it(what, tmp_path, monkeypatch, capsys):
    """A model or tokenizer directory naming its own code (config.json's or tokenizer_config.json's
    auto_map, for a class transformers does not implement): refused (exit 2) without asking and without
    running it. Before, transformers asked on stdin whether to run the code ("y" ran it: the marker)."""
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "y")
    d, marker = _custom_code_dir(tmp_path, what)
    if what == "model":
        argv = ["generate", str(d), "--prompt-ids", "1 2 3", "--executor", "torch"]
        message = r"config\.json' names its own Python code \(auto_map: .*configuration_customlm.*\) "
        message += r"for model_type "
        message += (
            r"'customlm', which transformers does not implement; trtforge never runs a checkpoint's code"
        )
    else:
        argv = ["generate", "tests.llm.tiny_models:llama_factory", "--prompt", "hi", "--tokenizer", str(d)]
        message = r"cannot load the tokenizer in '[^']*tokenizer' \(ValueError: .*contains custom code"
    assert cli_main([*argv, "--max-tokens", "2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and re.search(message, err), err
    assert not asked and not marker.exists()


def test_the_calibration_tokenizer_and_the_tensor_parallel_check_run_no_code_of_the_directory(
    tmp_path, monkeypatch
):
    """The other readers of a user's directory (calibration's tokenizer, tensor parallelism's check of the
    config before its workers start) run none of its own code either, nor ask whether to."""
    from trtforge.calibration.sources import resolve_tokenizer
    from trtforge.llm.executors.tensor_parallel import check_model

    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "y")
    tokenizer, marker = _custom_code_dir(tmp_path / "t", "tokenizer")
    with pytest.raises(UserError, match=r"cannot load tokenizer '[^']*' \(.*contains custom code"):
        resolve_tokenizer(tokenizer)
    model, model_marker = _custom_code_dir(tmp_path / "m", "model")
    check_model(str(model), 2)  # (an unreadable config: left to the workers' loader, which refuses it)
    assert not asked and not marker.exists() and not model_marker.exists()


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "falcon", "bloom", "mixtral"])
def test_a_bidirectional_config_is_refused_by_every_consumer(family, tmp_path, capsys):
    """config.is_causal false: transformers' mask functions make the model bidirectional (every token
    attending to later ones), which causal generation cannot reproduce: refused naming the key by the
    adapters (one check for every family) and so by generate and compile --generate. Before, it ran
    causally and gave other tokens than transformers' (exit 0)."""
    from trtforge.llm.models.families import adapter_for

    model = tiny_model(family)
    model.config.is_causal = False
    with pytest.raises(UserError, match=rf"this {model.config.model_type} model .*sets is_causal=False \("):
        adapter_for(model)
    if family != "llama":
        return
    model.save_pretrained(tmp_path / "hf")
    for argv in (
        ["generate", str(tmp_path / "hf"), "--prompt-ids", "1 2 3", "--executor", "torch"],
        ["compile", str(tmp_path / "hf"), "--generate", "-o", str(tmp_path / "x.engine")],
    ):
        assert cli_main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "Traceback" not in err and "is_causal=False (bidirectional attention" in err, err
    assert not (tmp_path / "x.engine").exists()


@pytest.fixture(scope="module")
def bf16_graphs(tmp_path_factory) -> dict[str, Path]:
    """`trtforge compile MODEL --generate --precision bf16 --save-onnx` step graphs, slot and paged."""
    d = tmp_path_factory.mktemp("bf16")
    graphs = {}
    for layout in ("slot", "paged"):
        graphs[layout] = d / f"{layout}.onnx"
        trtforge.compile(
            tiny_model("llama"), None, generate=True, build=False, save_onnx=graphs[layout], precision="bf16",
            cache_layout=layout, max_seq=32, max_batch=2, max_prefill=8, exporter="legacy", progress=False,
        )  # fmt: skip
    return graphs


def test_a_bf16_step_graph_is_refused_by_the_onnxruntime_executor_by_name(bf16_graphs, capsys):
    """Before: ONNX Runtime's "NOT_IMPLEMENTED : Could not find an implementation for Mul(14) node" (its
    CPU provider has no bfloat16 kernels), from llm.load, the raw loop and `trtforge generate` (exit 1, a
    traceback). Now one paragraph naming the graph, why and what runs it instead (CLI exit 2)."""
    message = (
        r"step graph '[^']*{}' is BF16 \(compiled with --precision bf16\), and ONNX Runtime's CPU execution "
        r"cannot run BF16 graphs.*--precision fp16.*torch executor.*TensorRT step engine"
    )
    for path in bf16_graphs.values():
        want = message.format(re.escape(path.name))
        for load in (trtforge.llm.load, trtforge.llm.api.load):
            with pytest.raises(UserError, match=want):
                load(path)
        assert cli_main(["generate", str(path), "--prompt-ids", "1 2 3"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "Traceback" not in err and "NOT_IMPLEMENTED" not in err and re.search(want, err), err
