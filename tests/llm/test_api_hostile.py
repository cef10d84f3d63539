"""Hostile arguments to the public LLM API (`trtforge.llm`): each is refused up front with a UserError
naming the argument, never a hang, a deep torch trace or silently wrong output."""

from __future__ import annotations

import re

import pytest

from tests.cli.test_generate_speculative import (
    NEEDS_TRAINED,
    TARGET,
    draft_with_tokenizer,
    permute_regular_ids,
    rename_pad,
    swap_two_regular_ids,
)
from trtforge.errors import UserError
from trtforge.llm import SamplingParams


def test_sampling_params_refuses_n_past_its_bound() -> None:
    """Before: accepted, and generate() built 10**23 requests in SamplingParams.expand (never returned)."""
    with pytest.raises(UserError, match=r"SamplingParams\.n must be an integer in \[1, 65536\]"):
        SamplingParams(n=10**23)
    assert len(SamplingParams(n=2**16, temperature=1.0).expand()) == 2**16


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda llm: llm.load(""), r"the model to load is an empty path \(''\)"),
        (lambda llm: llm.load(b""), r"the model to load is an empty path \(''\)"),
        (lambda llm: llm.load("", executor="tensorrt"), r"the model to load is an empty path \(''\)"),
        (lambda llm: llm.from_pretrained(""), r"the model is an empty path \(''\)"),
        (lambda llm: llm.from_pretrained("", tensor_parallel_size=2), r"the model is an empty path"),
        (
            lambda llm: llm.from_pretrained("x:y", speculative={"method": "draft", "model": ""}),
            r"speculative 'model' is an empty path \(''\)",
        ),
    ],
)
def test_an_empty_model_path_is_named_empty(call, message) -> None:
    """Before: Path('') is '.', and the message said "'.' is a directory", a path never given."""
    import trtforge.llm

    with pytest.raises(UserError, match=message):
        call(trtforge.llm)


@pytest.mark.parametrize("size", [0, -2, "2", 2.0, True])
def test_load_refuses_a_tensor_parallel_size_that_is_no_size_by_its_range(size) -> None:
    """Before: a step graph or engine said "tensor_parallel_size 0 needs the torch executor" (or '2', a
    string), as if the value were fine and only the executor wrong."""
    import trtforge.llm

    with pytest.raises(UserError, match=r"^tensor_parallel_size must be an integer >= 1 .*, got "):
        trtforge.llm.load("step.onnx", tensor_parallel_size=size)


@NEEDS_TRAINED
def test_from_pretrained_refuses_a_draft_with_another_tokenizer(tmp_path) -> None:
    """The API refuses what the CLI refuses, before either model's weights load (before: accepted)."""
    import trtforge.llm

    draft = draft_with_tokenizer(tmp_path / "draft", permute_regular_ids)
    with pytest.raises(
        UserError, match=r"have different tokenizers: 4094 of the target's 4094 regular token ids"
    ):
        trtforge.llm.from_pretrained(str(TARGET), speculative={"method": "draft", "model": str(draft)})


@NEEDS_TRAINED
@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (rename_pad, r"differ at 1 id\(s\) \(1 of added .*id 1 is '<\|pad\|>' in the target, '<\|padding"),
        (swap_two_regular_ids, r"differ at 2 id\(s\) \(0 of added .*id 301 is 'ro' in the target, 'Ġin'"),
    ],
    ids=["added token renamed", "two regular ids swapped"],
)
def test_a_nearly_identical_draft_tokenizer_warns(tmp_path, edit, said) -> None:
    """Added tokens only, or a few regular ones (under 1% of the vocabulary): a legitimate pair, warned."""
    from trtforge.llm.spec.tokenizers import DraftTokenizerWarning
    from trtforge.llm.text import check_draft_directories

    draft = draft_with_tokenizer(tmp_path / "draft", edit)
    with pytest.warns(DraftTokenizerWarning, match=said):
        check_draft_directories(TARGET, draft)


@NEEDS_TRAINED
def test_tokenizers_that_agree_compare_equal(tmp_path) -> None:
    from trtforge.llm.spec.tokenizers import compare_vocabularies
    from trtforge.llm.text import load_tokenizer

    same = draft_with_tokenizer(tmp_path / "draft", lambda tok: None)  # loaded, not skipped as same files
    assert compare_vocabularies(load_tokenizer(TARGET), load_tokenizer(same)) == ([], [])


FACTORY = "tests.llm.tiny_models:llama_factory"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_size": 0}, r"block_size must be an integer >= 1, got 0"),  # was ZeroDivisionError
        ({"block_size": "16"}, r"block_size must be an integer >= 1, got '16'"),  # was TypeError from //
        ({"block_size": 1.5}, r"block_size must be an integer >= 1, got 1\.5"),  # was "num_blocks 43776.0"
        ({"num_blocks": 10**30}, r"num_blocks 10{30}: the KV-cache pool of that many blocks cannot be alloc"),
        ({"device": "bogus"}, r"device 'bogus': .*expected 'cpu', 'cuda' or 'cuda:N'"),  # RuntimeError
        ({"device": ""}, r"device '': Device string must not be empty"),
        ({"device": "x" * 10**6}, r"device 'x{40}…' \(1,000,000 characters\): .* string: 'x{40}…' \(1,00"),
        ({"device": 5}, r"device must be a string or torch\.device, got int 5"),
        ({"device": "meta"}, r"device 'meta': the torch executor runs on cpu or cuda"),  # was accepted
        ({"dtype": "bogus"}, r"dtype must be None or a floating torch\.dtype .* got 'bogus'"),  # to()'s dump
        ({"dtype": 5}, r"dtype must be None or a floating torch\.dtype"),
        ({"max_model_len": 1}, r"max_model_len must be None or an integer >= 2"),  # was accepted, unusable
        ({"max_model_len": -1}, r"max_model_len must be None or an integer >= 2"),  # spoke of RAM
        ({"tensor_parallel_size": True}, r"tensor_parallel_size must be an integer >= 1 .*got True"),
        (  # was RuntimeError from torch's embedding ("Expected tensor for argument #1 'indices'")
            {"kv_cache_dtype": "fp8", "calib_prompts": [[1.5]]},
            r"calib_prompts\[0\] holds float 1\.5; expected None or a list of prompts",
        ),
        (  # was ValueError: invalid literal for int()
            {"kv_cache_dtype": "fp8", "calib_prompts": "1 2 3"},
            r"calib_prompts must be a list of token-id lists, got str",
        ),
        ({"kv_cache_dtype": "fp8", "calib_prompts": 5}, r"calib_prompts must be a list .*got int"),
        (  # static buffers and CUDA graphs are sized by it: 10**23 failed inside the allocator on CUDA
            {"max_num_seqs": 10**23},
            r"max_num_seqs must be an integer in \[1, 65,536\], got 100000000000000000000000",
        ),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else "",
)
def test_from_pretrained_refuses_options_by_name(options, message) -> None:
    import trtforge.llm

    with pytest.raises(UserError, match=message):
        trtforge.llm.from_pretrained(FACTORY, **options)


def test_calib_prompts_hold_at_most_what_calib_data_may() -> None:
    """One limit for the API and the CLI (before: --calib-data stopped at 1,024 prompts while calib_prompts
    took any number, each a forward pass and, for compile --generate int8/fp8, a zeroed KV cache)."""
    import trtforge
    import trtforge.llm
    from trtforge.llm.prompts import MAX_CALIB_PROMPTS

    many = [[1, 2]] * (MAX_CALIB_PROMPTS + 1)
    said = r"calib_prompts holds 1,025 prompts; calibration takes at most 1,024: pass calib_prompts\[:1024\]"
    # (the count is checked first: without the limit each call fails fast on another refusal)
    with pytest.raises(UserError, match=said):
        trtforge.llm.from_pretrained(FACTORY, calib_prompts=many)
    with pytest.raises(UserError, match=said):
        trtforge.compile(FACTORY, None, generate=True, build=False, precision="fp16", calib_prompts=many)


def test_from_pretrained_takes_a_dtype_by_name() -> None:
    import torch

    import trtforge.llm

    with trtforge.llm.from_pretrained(FACTORY, dtype="float64", num_blocks=8) as llm:
        assert llm.executor.dtype == torch.float64


def test_from_pretrained_refuses_a_module_that_is_no_transformers_model() -> None:
    """Before: AttributeError: 'Linear' object has no attribute 'config', from deep in the adapter."""
    import torch

    import trtforge.llm

    with pytest.raises(UserError, match=r"with its \.config\), got a Linear without one"):
        trtforge.llm.from_pretrained(torch.nn.Linear(2, 2))


@pytest.fixture(scope="module")
def llm():
    import trtforge.llm

    with trtforge.llm.from_pretrained(FACTORY, num_blocks=32) as served:
        yield served


def test_a_temperature_too_small_to_scale_by_samples_greedily(llm) -> None:
    """Before: logits / 1e-320 overflowed to inf, inf - inf is NaN, and the sampler returned tokens
    0, 1, 2, ... (silently wrong) with NaN logprobs. Below 1e-5 a request is greedy, as in vLLM."""
    import math

    prompt = [[5, 6, 7, 5, 6, 7]]
    greedy = llm.generate(prompt, SamplingParams(max_tokens=8))
    assert llm.generate(prompt, SamplingParams(max_tokens=8, temperature=1e-320, seed=1)) == greedy
    assert llm.generate(prompt, SamplingParams(max_tokens=8, temperature=1e-6, seed=1)) == greedy
    done = llm.completions(prompt, SamplingParams(max_tokens=3, temperature=1e-320, logprobs=2, seed=1))
    assert all(math.isfinite(lp.logprob) for lp in done[0].logprobs)
    assert [lp.logprob for lp in done[0].logprobs] == [
        lp.logprob for lp in llm.completions(prompt, SamplingParams(max_tokens=3, logprobs=2))[0].logprobs
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (  # before: TypeError: object of type 'NoneType' has no len()
            lambda llm: llm.completions(None),
            r"prompts must be a list of token-id lists, e\.g\. \[\[1, 2, 3\]\], got NoneType",
        ),
        (lambda llm: llm.engine.generate(5), r"prompts must be a list of token-id lists.*got int"),
        (  # before: accepted; "no" is truthy, so it stopped at EOS
            lambda llm: llm.generate([[1, 2]], max_new_tokens=2, stop_at_eos="no"),
            r"stop_at_eos must be True or False, got 'no'",
        ),
        (  # before: "... integer token ids, got list" (the list was right, its element was not)
            lambda llm: llm.generate([[1, 2.0]]),
            r"prompts\[0\]: .*flat sequence of integer token ids, got float 2\.0 at position 1",
        ),
        (lambda llm: llm.generate([[1, True]]), r"got bool True at position 1"),
        (lambda llm: llm.generate([[300]]), r"token id 300 is outside the vocabulary \[0, 300\)"),
        (lambda llm: llm.generate([[]]), r"the prompt is empty"),
        (lambda llm: llm.generate([]), r"prompts must be a non-empty list of token-id lists"),
        (lambda llm: llm.generate(""), r"prompts must be a non-empty list of token-id lists"),
        (lambda llm: llm.generate([[1]], max_new_tokens=0), r"SamplingParams\.max_tokens must be an integer"),
    ],
)
def test_generate_refuses_bad_inputs_by_name(llm, call, message) -> None:
    with pytest.raises(UserError, match=message):
        call(llm)


@pytest.fixture(scope="module")
def paged_graph(tmp_path_factory) -> str:
    """The tiny Llama's paged step graph (ONNX Runtime)."""
    import onnx

    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.compile.export import export_step

    d = tmp_path_factory.mktemp("paged")
    (d / "export").mkdir()
    options = {"max_seq": 64, "max_batch": 2, "exporter": "legacy", "cache_layout": "paged"}
    exp = export_step(tiny_model("llama"), workdir=d / "export", **options)
    onnx.save(exp.model, str(d / "paged.onnx"))
    return str(d / "paged.onnx")


@pytest.mark.parametrize(
    ("options", "message"),
    [  # before: OverflowError: Python int too large to convert to C long (numpy's prod of the pool shape)
        ({"num_blocks": 10**30}, r"num_blocks=10{30} needs 7\.63e\+24 GiB of KV pools .* more than this"),
        ({"gpu_memory_utilization": float("nan")}, r"--gpu-memory-utilization must be a fraction in"),
    ],
)
def test_load_refuses_options_by_name(paged_graph, options, message) -> None:
    import trtforge.llm

    with pytest.raises(UserError, match=message):
        trtforge.llm.load(paged_graph, **options)


def test_text_stop_strings_are_refused_by_the_token_engine_not_ignored() -> None:
    """SamplingParams.stop holds text; the engine speaks token ids and has no tokenizer. Before, a Python
    API user's stop strings were accepted and silently never matched: the output ran past them."""
    from tests.llm.serving_models import make_executor
    from trtforge.llm.engine import LLMEngine

    with LLMEngine(make_executor(num_blocks=64)) as engine:
        with pytest.raises(
            UserError,
            match=r"SamplingParams\.stop holds text stop strings \['\\n'\].*"
            r"stop_sequences",
        ):
            engine.submit([1, 2, 3], SamplingParams(stop="\n", max_tokens=4))
        with pytest.raises(UserError, match=r"prompts\[1\]: .*SamplingParams\.stop"):
            engine.generate([[1, 2], [3, 4]], [SamplingParams(), SamplingParams(stop=["x"])])
        out = engine.generate([[1, 2, 3]], SamplingParams(stop_sequences=[[5, 6]], max_tokens=3))[0]
        assert out.error is None and len(out.token_ids) <= 3


@pytest.mark.parametrize("max_model_len", [0, 2.5, "64", "abc", 65])
def test_paged_graph_refuses_max_model_len_as_slot_graphs_and_engines_do(paged_graph, max_model_len) -> None:
    """One rule for every step graph's and engine's max_model_len: an integer in [2, max_seq]. Before, the
    paged ONNX Runtime executor read ``int(max_model_len or max_seq)``: 0 served at max_seq, 2.5 at 2 and
    "64" at 64 (the slot graph and the engine refused them), and "abc" raised a bare ValueError."""
    import trtforge.llm

    got = re.escape(repr(max_model_len))
    message = rf"^max_model_len must be an integer in \[2, 64\] \(.*\), got {got}\.$"
    with pytest.raises(UserError, match=message):
        trtforge.llm.load(paged_graph, max_model_len=max_model_len)


def test_from_pretrained_takes_numpy_integers_as_every_integer_option_does() -> None:
    """An integer option of the API takes a NumPy integer (``errors.is_int``: SamplingParams, load's
    num_blocks). from_pretrained checked its sizes with a copy that took Python ints only and refused
    ``num_blocks=np.int64(16)`` as "must be an integer >= 1, got 16"."""
    import numpy as np

    import trtforge.llm

    sizes = {"num_blocks": 16, "block_size": 4, "max_model_len": 32, "tensor_parallel_size": 1}
    params = SamplingParams(max_tokens=3)
    outs = []
    for wrap in (int, np.int64):
        kwargs = {k: wrap(v) for k, v in sizes.items()}
        with trtforge.llm.from_pretrained("tests.llm.tiny_models:llama_factory", **kwargs) as llm:
            outs.append(llm.generate([[1, 2, 3]], params)[0])
    assert len(outs[0]) == 3 and outs[1] == outs[0]


def test_a_stop_token_id_the_model_never_samples_is_refused_as_the_server_refuses_it() -> None:
    """The server answered 400 for stop_token_ids past the model's logits ("the model never samples
    it"); the engine, under the Python API and generate, took them and the stop silently never fired."""
    from tests.llm.serving_models import make_executor
    from trtforge.llm.engine import LLMEngine

    executor = make_executor(num_blocks=64)
    vocab = executor.facts.vocab_size
    with LLMEngine(executor) as engine:
        with pytest.raises(
            UserError, match=rf"stop_token_ids holds token id {vocab}, outside .* \[0, {vocab}\)"
        ):
            engine.submit([1, 2, 3], SamplingParams(stop_token_ids=[5, vocab], max_tokens=2))
        out = engine.generate([[1, 2, 3]], SamplingParams(stop_token_ids=[vocab - 1], max_tokens=2))[0]
        assert out.error is None
