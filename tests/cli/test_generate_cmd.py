"""`trtforge generate`: paged and slot step graphs, the torch executor, sampling options, bad input."""

from __future__ import annotations

import onnx
import pytest

from tests.llm.tiny_models import hf_greedy, tiny_model
from trtforge.cli.main import main
from trtforge.llm.compile.export import export_step


def _graph(d, **kw):
    r = export_step(tiny_model("llama"), max_seq=64, max_batch=4, exporter="legacy", workdir=d, **kw)
    path = d / "step.onnx"
    onnx.save(r.model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    return _graph(tmp_path_factory.mktemp("gen"), cache_layout="paged", block_size=8)


def _lines(capsys):
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return [[int(t) for t in line.split()] for line in out.out.splitlines()]


def test_greedy_ids_match_hf_on_both_executors(paged, capsys):
    model = tiny_model("llama")
    want = [hf_greedy(model, p, 7)[0] for p in ([1, 2, 3], [4, 5])]
    args = ["--prompt-ids", "1 2 3", "--prompt-ids", "4,5", "--max-tokens", "7", "--ignore-eos"]
    assert main(["generate", paged, *args]) == 0
    assert _lines(capsys) == want
    assert main(["generate", "tests.llm.tiny_models:llama_factory", *args, "--num-blocks", "16"]) == 0
    assert _lines(capsys) == want


@pytest.mark.parametrize(
    "family", ["gptj", "codegen", "falcon", "falcon_40b", "falcon_serial", "cohere2", "olmo3"]
)
def test_family_factories_generate_hf_greedy_ids(family, capsys):
    """`generate` on the torch executor serves GPT-J, CodeGen, Falcon's three layer forms, Cohere 2 and
    OLMo 3 (module:factory models): HF's greedy ids, batched."""
    model = tiny_model(family)
    want = [hf_greedy(model, p, 7)[0] for p in ([1, 2, 3], [4, 5, 6, 7, 8])]
    args = ["--prompt-ids", "1 2 3", "--prompt-ids", "4 5 6 7 8", "--max-tokens", "7", "--ignore-eos"]
    assert main(["generate", f"tests.llm.tiny_models:{family}_factory", *args, "--num-blocks", "16"]) == 0
    assert _lines(capsys) == want


def test_seeded_sampling_repeats_and_differs_from_greedy(paged, capsys):
    args = ["generate", paged, "--prompt-ids", "9 8 7", "--max-tokens", "12", "--ignore-eos"]
    assert main(args) == 0
    greedy = _lines(capsys)
    sampling = ["--temperature", "1.0", "--top-k", "50", "--top-p", "0.95", "--seed", "3"]
    assert main(args + sampling) == 0
    first = _lines(capsys)
    assert main(args + sampling) == 0
    assert _lines(capsys) == first != greedy
    assert len(first[0]) == 12


def test_slot_graph_is_served_greedy_and_sampled(tmp_path, capsys):
    slot = _graph(tmp_path)
    args = ["generate", slot, "--prompt-ids", "1 2 3", "--max-tokens", "5", "--ignore-eos"]
    assert main(args) == 0
    assert _lines(capsys) == [hf_greedy(tiny_model("llama"), [1, 2, 3], 5)[0]]
    sampling = ["--temperature", "1.0", "--top-p", "0.9", "--seed", "2", "--prompt-ids", "4 5"]
    assert main(args + sampling) == 0
    first = _lines(capsys)
    assert main(args + sampling) == 0
    assert _lines(capsys) == first and [len(line) for line in first] == [5, 5]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "at least one prompt"),
        (["--prompt-ids", "1 x"], "--prompt-ids"),
        (["--prompt-ids", ""], "--prompt-ids"),
        (["--prompt", "hello"], "--tokenizer"),
        (["--prompt-ids", "1 2", "--temperature", "-1"], "temperature"),
        (["--prompt-ids", "1 2", "--top-p", "0"], "--top-p must be a number in (0, 1]"),
        (["--prompt-ids", "1 2", "--max-tokens", "0"], "--max-tokens must be an integer >= 1"),
        (["--prompt-ids", "1 999"], "--prompt-ids: token id 999 is outside the model's vocabulary of 300"),
        # before: "request 'req-0': the prompt has 80 tokens but the maximum sequence length is 64"
        (["--prompt-ids", " ".join(["5"] * 80)], "--prompt-ids: 80 tokens, but the model's context length"),
        (["--prompt-ids", "1 2", "--num-blocks", "0"], "--num-blocks"),
        # before: the tokenizer's special tokens alone ([CLS] [SEP]) were generated from
        (["--prompt", " ", "--tokenizer", "demo"], "--prompt ' ' is empty"),
        (["--prompt-ids", "1 2", "--top-k", "-1"], "--top-k must be an integer >= 0"),
        (["--prompt-ids", "1 2", "--top-p", "1.5"], "--top-p must be a number in (0, 1], got 1.5"),
        (["--prompt-ids", "1 2", "--max-tokens", "-3"], "--max-tokens must be an integer >= 1, got -3"),
    ],
)
def test_bad_input_exits_2_with_a_message(paged, capsys, argv, message):
    assert main(["generate", paged, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_output_cut_by_the_context_length_is_noted_on_stderr(paged, capsys):
    args = ["generate", paged, "--prompt-ids", "1 2 3", "--ignore-eos"]
    assert main([*args, "--max-tokens", "100"]) == 0
    out = capsys.readouterr()
    assert len(out.out.split()) == 64 - 3  # the graph's max_seq holds the prompt and 61 new tokens
    assert "output 1 stopped after 61 new tokens at the model's context length (64 tokens" in out.err
    assert "--max-tokens 100" in out.err
    assert main([*args, "--max-tokens", "5"]) == 0
    assert "context length" not in capsys.readouterr().err


def test_an_output_cut_by_a_small_kv_pool_names_the_pool_not_the_context(paged, capsys):
    """--num-blocks 2 of 8 tokens hold 16 of a sequence: the note named a "context length (16 tokens)"
    the 64-position model does not have."""
    args = ["generate", paged, "--prompt-ids", "1 2 3", "--ignore-eos", "--num-blocks", "2"]
    assert main([*args, "--max-tokens", "40"]) == 0
    out = capsys.readouterr()
    assert len(out.out.split()) == 16 - 3
    assert "output 1 stopped after 13 new tokens at the KV-cache pool's capacity (2 block(s) of 8" in out.err
    assert "--num-blocks" in out.err and "the model's context length" not in out.err


def test_missing_or_non_step_model_exits_2(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "none.onnx"), "--prompt-ids", "1"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", str(tmp_path), "--prompt-ids", "1"]) == 2
    assert "config.json" in capsys.readouterr().err


def wide_vocab_factory():
    """A tiny Llama whose vocabulary covers the demo (MiniLM) tokenizer's ids."""
    return tiny_model("llama", vocab_size=30522), None


def test_text_prompt_is_tokenized_and_the_output_decoded(paged, capsys):
    from trtforge.calibration.data import resolve_tokenizer

    tok = resolve_tokenizer("demo")
    args = ["--prompt", "the cat sat", "--tokenizer", "demo", "--max-tokens", "6", "--ignore-eos"]
    assert main(["generate", "tests.cli.test_generate_cmd:wide_vocab_factory", *args]) == 0
    out = capsys.readouterr()
    ids = tok("the cat sat")["input_ids"]
    want = tok.decode(hf_greedy(wide_vocab_factory()[0], ids, 6)[0], skip_special_tokens=True)
    assert out.out == want + "\n" and want.strip()
    assert main(["generate", paged, *args]) == 2  # MiniLM ids exceed the 300-token vocabulary
    assert "--tokenizer 'demo' gave token id" in capsys.readouterr().err


def test_text_prompt_with_undecodable_bytes_exits_2_with_one_message(paged, capsys):
    bad = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # what a shell argument of latin-1 gives
    assert main(["generate", paged, "--prompt", bad, "--tokenizer", "demo"]) == 2
    err = capsys.readouterr().err
    assert "--prompt is not valid UTF-8" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_tokenizer_comes_from_the_model_directory(capsys):
    from tests.llm.server.harness import MODEL

    if not MODEL.is_dir():
        pytest.skip(f"the trained model is absent: {MODEL}")
    args = ["generate", str(MODEL), "--prompt", "def read_json(path):", "--max-tokens", "8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.strip() and not out.strip().isdigit()


def test_logprobs_of_a_line_ended_by_a_stop_text_end_at_the_token_completing_it(capsys):
    """Before: the logprobs line listed the tokens the engine sampled past the stop before it was
    cancelled (`def f(` --stop ':' printed 'x)' and the logprobs of 'x', '):' and a third token)."""
    import json

    from tests.llm.server.harness import MODEL
    from trtforge.llm.text import load_tokenizer

    if not MODEL.is_dir():
        pytest.skip(f"the trained model is absent: {MODEL}")
    tok = load_tokenizer(str(MODEL))
    args = ["generate", str(MODEL), "--prompt", "def read_json(path):", "--max-tokens", "24"]
    args += ["--logprobs", "0"]
    assert main(args) == 0
    whole, line = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)
    ids = [row["token"] for row in json.loads(line)["logprobs"]]
    stop = whole[8:12]
    assert main([*args, "--stop", stop]) == 0
    text, line = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)
    assert text == whole[: whole.index(stop)]
    got = [row["token"] for row in json.loads(line)["logprobs"]]
    need = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
    assert got == ids[:need]


def test_stop_text_ends_the_line_and_is_not_printed(capsys):
    from tests.llm.server.harness import MODEL

    if not MODEL.is_dir():
        pytest.skip(f"the trained model is absent: {MODEL}")
    args = ["generate", str(MODEL), "--prompt", "def read_json(path):", "--max-tokens", "24"]
    assert main(args) == 0
    whole = capsys.readouterr().out.rstrip("\n")
    stop = whole[8:12]
    assert main([*args, "--stop", stop]) == 0
    assert capsys.readouterr().out.rstrip("\n") == whole[: whole.index(stop)]
    assert main([*args, "--stop", b"\xff".decode("utf-8", "surrogateescape")]) == 2
    assert "--stop is not valid UTF-8" in capsys.readouterr().err


def test_the_cli_executor_flags_name_the_librarys_choices():
    """generate and serve share --executor, --quantization and --lm-head-quantization
    (cli.torch_options, kept light): their choices are the library's, and auto picks by MODEL's kind."""
    from trtforge.cli import torch_options
    from trtforge.cli.torch_options import EXECUTORS, LM_HEAD_QUANTIZATIONS, QUANTIZATIONS, resolve_executor
    from trtforge.llm import service
    from trtforge.llm.executors import kv_cache
    from trtforge.llm.quant import apply

    assert EXECUTORS == service.EXECUTORS and QUANTIZATIONS == apply.QUANTIZATIONS
    assert LM_HEAD_QUANTIZATIONS == apply.LM_HEAD_QUANTIZATIONS
    assert torch_options.KV_CACHE_DTYPES == kv_cache.KV_CACHE_DTYPES
    models = ("m.engine", "step.onnx", "llama-dir", "pkg.mod:make")
    assert [resolve_executor(m, "auto") for m in models] == ["tensorrt", "onnxruntime", "torch", "torch"]
    assert resolve_executor("step.onnx", "torch") == "torch"


def test_the_cli_takes_every_kv_cache_dtype_name_the_library_takes(capsys):
    """from_pretrained(kv_cache_dtype="fp8_e4m3") (vLLM's spelling) was served while `--kv-cache-dtype
    fp8_e4m3` exited 2 ("not one of 'auto', 'fp8'"): the flag's choices were a second list. Now the same
    names, with the same meaning: the same tokens as --kv-cache-dtype fp8."""
    from trtforge.cli.main import main

    args = ["generate", "tests.llm.tiny_models:llama_factory", "--prompt-ids", "1 2 3", "--max-tokens", "4"]
    outs = []
    for name in ("fp8", "fp8_e4m3", "float8_e4m3fn"):
        assert main([*args, "--num-blocks", "16", "--kv-cache-dtype", name]) == 0, capsys.readouterr().err
        outs.append(capsys.readouterr().out)
    assert outs[0].strip() and outs[1:] == outs[:1] * 2


@pytest.mark.parametrize(("gpu", "where", "dtype"), [(True, "cuda", "bfloat16"), (False, "cpu", "float32")])
def test_the_torch_executor_runs_on_a_gpu_in_bfloat16_where_there_is_one(monkeypatch, gpu, where, dtype):
    """`generate DIR` passed no device, so on a GPU machine the torch executor ran on the CPU in FP32
    (tens of times slower, and --quantization fp8 refused there), where `serve` put it on the GPU in
    bfloat16. Both now read --device and --dtype with one default (llm.service.placement)."""
    import torch

    from trtforge.cli.torch_options import torch_executor_kwargs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    common = {"quantization": None, "kv_cache_dtype": "auto", "calib_data": None, "tensor_parallel_size": 1}
    kw = torch_executor_kwargs("torch", **common)
    assert (kw["device"], kw["dtype"]) == (where, getattr(torch, dtype))
    kw = torch_executor_kwargs("torch", **common, device="cpu", dtype="bfloat16")
    assert (kw["device"], kw["dtype"]) == ("cpu", torch.bfloat16)
    assert "device" not in torch_executor_kwargs("onnxruntime", **common)


def test_generate_takes_device_and_dtype_for_the_torch_executor_only(paged, capsys):
    """--device/--dtype place the torch executor's model (bfloat16 on the CPU gives tokens too); a
    step graph or engine refuses them by flag, and a GPU this machine lacks is refused naming --device."""
    import torch

    args = ["--prompt-ids", "1 2 3", "--max-tokens", "4", "--ignore-eos"]
    factory = ["generate", "tests.llm.tiny_models:llama_factory", *args, "--num-blocks", "16"]
    assert main([*factory, "--device", "cpu", "--dtype", "bfloat16"]) == 0
    assert len(_lines(capsys)[0]) == 4
    for flags, named in ((["--device", "cpu"], "--device"), (["--dtype", "float16"], "--dtype")):
        assert main(["generate", paged, *args, *flags]) == 2
        err = capsys.readouterr().err
        assert f"{named} applies to the torch executor" in err and "Traceback" not in err
    if not torch.cuda.is_available():
        assert main([*factory, "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "--device 'cuda'" in err and "CUDA device" in err and "Traceback" not in err


def test_load_refuses_device_and_dtype_for_a_step_graph(paged):
    """llm.load(step.onnx, device=...) had no such keyword; now it takes the torch executor's placement
    and refuses it, by name, for graphs and engines (they run where ONNX Runtime or TensorRT runs)."""
    from trtforge.errors import UserError
    from trtforge.llm import load

    with pytest.raises(UserError, match="device='cpu' applies to the torch executor"):
        load(paged, device="cpu")
    with pytest.raises(UserError, match="dtype='bfloat16' applies to the torch executor"):
        load(paged, dtype="bfloat16")


@pytest.mark.gpu
def test_generate_runs_the_torch_executor_on_the_gpu_in_bfloat16(monkeypatch, capsys):
    """On a GPU machine `generate DIR` serves on CUDA in bfloat16 by default (it ran on the CPU in FP32):
    the model's weights are where the executor runs, and the tokens come out."""
    import torch

    import trtforge.llm.service as service

    seen = {}
    real = service.from_pretrained

    def spy(*args, **kwargs):
        llm = real(*args, **kwargs)
        seen["param"] = next(llm.executor.model.parameters())
        return llm

    monkeypatch.setattr(service, "from_pretrained", spy)
    args = ["generate", "tests.llm.tiny_models:llama_factory", "--prompt-ids", "1 2 3", "--max-tokens", "4"]
    assert main([*args, "--num-blocks", "16", "--ignore-eos"]) == 0, capsys.readouterr().err
    assert len(_lines(capsys)[0]) == 4
    assert seen["param"].device.type == "cuda" and seen["param"].dtype == torch.bfloat16
