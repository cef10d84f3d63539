"""Hostile input to the decoder-LLM commands (`generate`, `compile --generate`, `report --generate`): each
exits 2 with one message naming what is wrong, no traceback, nothing left behind. Same harness as
test_bad_inputs (its `workdir` fixture and snapshot rule)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.test_bad_inputs import Setup, assert_exits_2_cleanly, workdir  # noqa: F401 - a fixture

GENERATE = ["compile", "tests.llm.tiny_models:llama_factory", "--generate", "--max-seq", "64", "-q"]
GENERATE += ["-o", "s.engine"]


TRAINED = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "code-llama-21m"
REPORT = ["report", str(TRAINED), "--generate", "-o", "rep", "--no-progress", "--variants", "fp32"]
REPORT += ["--windows", "1", "--window-len", "16", "--batch", "1", "--prompt-len", "4", "--new-tokens", "2"]
TINY_IDS = ["generate", "tests.llm.tiny_models:llama_factory", "--prompt-ids", "1 2"]
TP_QUANT = ["--tensor-parallel-size", "2", "--quantization", "fp8", "--lm-head-quantization", "fp8"]
MPT_NO_ALIBI = "tests.llm.tiny_models:mpt_no_alibi_factory"
TP_NGRAM = ["--tensor-parallel-size", "2", "--speculative-method", "ngram"]


def _paged_graph(d: Path) -> str:
    """The tiny Llama's paged step graph (blocks of 8 tokens), written into `d`."""
    import onnx

    from tests.llm.tiny_models import tiny_model
    from trtforge.llm.compile.export import export_step

    work = d.parent / "export"
    work.mkdir()
    exp = export_step(
        tiny_model("llama"), max_seq=64, max_batch=2, exporter="legacy", workdir=work, cache_layout="paged"
    )
    onnx.save(exp.model, str(d / "paged.onnx"))
    return "paged.onnx"


def _damaged_metadata(text: str) -> Setup:
    """The tiny Llama's slot step graph as step.onnx, its generation metadata replaced by `text`; the
    command generates from it."""

    def setup(d: Path) -> list[str]:
        import onnx

        from tests.llm.tiny_models import tiny_model
        from trtforge.llm.compile.export import export_step
        from trtforge.llm.contract import METADATA_KEY

        work = d.parent / "export"
        work.mkdir()
        model = tiny_model("llama")
        proto = export_step(model, max_seq=16, max_batch=1, exporter="legacy", workdir=work).model
        next(p for p in proto.metadata_props if p.key == METADATA_KEY).value = text
        onnx.save(proto, str(d / "step.onnx"))
        return ["generate", "step.onnx", "--prompt-ids", "1 2", "--max-tokens", "1"]

    return setup


def _file(name: str, content: bytes, *argv: str) -> Setup:
    """Write `content` to `name` in the work directory; the command is `argv`."""

    def setup(d: Path) -> list[str]:
        (d / name).write_bytes(content)
        return list(argv)

    return setup


CASES: dict[str, tuple[Setup, str]] = {
    "generate --json-schema nested past the parser's depth": (
        _file(
            "deep.json",
            b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
            *("generate", "step.onnx", "--prompt-ids", "1 2", "--json-schema", "deep.json"),
        ),
        r"--json-schema 'deep\.json' nests its JSON deeper than the parser's \d+ levels",
    ),
    # before: int()'s ValueError past 4,300 digits, an internal error (exit 1) with its trace
    "generate --json-schema with a 5,000-digit integer": (
        _file(
            "big.json",
            b'{"type": "string", "maxLength": ' + b"9" * 5000 + b"}",
            *("generate", "step.onnx", "--prompt-ids", "1 2", "--json-schema", "big.json"),
        ),
        r"--json-schema 'big\.json' holds an integer of more than 4,300 digits",
    ),
    # before: fp8 calibrated on random tokens instead, as if no --calib-data had been given
    "compile --generate fp8 --calib-data of blank lines": (
        _file("blank.txt", b"\n  \n\n", *GENERATE, "--precision", "fp8", "--calib-data", "blank.txt"),
        r"--calib-data 'blank\.txt' holds no prompts \(it is empty or blank\)",
    ),
    # before: every line was read and calibrated on (a zeroed KV cache per prompt for compile --generate)
    "compile --generate fp8 --calib-data of 1,025 prompts": (
        _file("many.txt", b"1 2 3\n" * 1025, *GENERATE, "--precision", "fp8", "--calib-data", "many.txt"),
        r"--calib-data 'many\.txt' holds more than 1,024 prompts; calibration takes at most 1,024: pass a "
        r"file of at most that many, e\.g\. `head -n 1024 many\.txt`",
    ),
    "generate --kv-cache-dtype fp8 --calib-data of 1,025 prompts": (
        _file(
            "many.txt",
            b"1 2\n\n" * 1025,
            *("generate", "tests.llm.tiny_models:llama_factory", "--prompt-ids", "1 2"),
            *("--kv-cache-dtype", "fp8", "--calib-data", "many.txt"),
        ),
        r"--calib-data 'many\.txt' holds more than 1,024 prompts",
    ),
    # before: "calibration prompt 1: expected 1..8 token ids ...", naming neither option, after the export
    "compile --generate int8 --calib-data with a prompt longer than --max-prefill": (
        _file(
            "long.txt",
            b"1 2 3\n" + b"5 " * 9 + b"\n",
            *GENERATE,
            *("--precision", "int8", "--max-prefill", "8", "--calib-data", "long.txt"),
        ),
        r"calibration prompt 1 \(--calib-data, blank lines skipped\) has 9 token ids; each runs as one "
        r"prefill of the step graph, which takes 1\.\.8 \(--max-prefill",
    ),
    "compile --generate fp8 --calib-data with ids outside the vocabulary": (
        _file("oov.txt", b"1 2 99999\n", *GENERATE, "--precision", "fp8", "--calib-data", "oov.txt"),
        r"calibration prompt 0 \(--calib-data, blank lines skipped\) holds token ids \[99999\] outside the "
        r"model's vocabulary 0\.\.\d+",
    ),
    "compile --generate fp8 --calib-data ''": (
        lambda d: [*GENERATE, "--precision", "fp8", "--calib-data", ""],
        r"--calib-data '': the path is empty",
    ),
    "generate --kv-cache-dtype fp8 --calib-data empty": (
        _file(
            "empty.txt",
            b"",
            *("generate", "tests.llm.tiny_models:llama_factory", "--prompt-ids", "1 2"),
            *("--kv-cache-dtype", "fp8", "--calib-data", "empty.txt"),
        ),
        r"--calib-data 'empty\.txt' holds no prompts",
    ),
    # before: "'nodir' is not a model file ...", after the target had loaded, not naming the flag
    "generate --speculative-model missing": (
        lambda d: [*TINY_IDS, "--speculative-model", "nodir"],
        r"--speculative-model 'nodir' does not exist; expected the draft model's save_pretrained directory",
    ),
    "generate --speculative-model ''": (  # before: "'.' is a directory without config.json"
        lambda d: [*TINY_IDS, "--speculative-model", ""],
        r"--speculative-model '': the path is empty",
    ),
    "generate --speculative-model a file": (
        _file("draft.bin", b"x", *TINY_IDS, "--speculative-model", "draft.bin"),
        r"--speculative-model 'draft\.bin' is a file; expected",
    ),
    # before: never finished (SamplingParams.expand built 10**23 requests, filling the memory)
    "generate --n 10**23": (
        lambda d: [*TINY_IDS, "--n", str(10**23), "--temperature", "1"],
        r"--n 10{23}: expected 1 to 65,536 samples per prompt\. Each sample is its own sequence",
    ),
    "generate --n 40000 x 2 prompts": (
        lambda d: [*TINY_IDS, "--prompt-ids", "3", "--n", "40000"],
        r"--n 40000 x 2 prompts is 80,000 sequences, more than 65,536 in one run",
    ),
    "generate --n 65537": (
        lambda d: [*TINY_IDS, "--n", "65537"],
        r"--n 65537: expected 1 to 65,536 samples per prompt",
    ),
    # before: "request 'req-0': token id ... outside the vocabulary", an id the user never gave
    "generate --prompt-ids past the vocabulary": (
        lambda d: [*TINY_IDS[:-1], "1 " + "9" * 20],
        r"--prompt-ids: token id 9{20} is outside the model's vocabulary of 300 ids \(0\.\.299\)",
    ),
    # before: int()'s ValueError past 4,300 digits, an internal error (exit 1) with its trace
    "generate --prompt-ids of a 5,000-digit id": (
        lambda d: [*TINY_IDS[:-1], "1 " + "9" * 5000],
        r"--prompt-ids '1 9{38}…' \(5,002 characters\): expected token ids >= 0 \(up to 30 digits",
    ),
    # before: "SamplingParams.seed must be ...", a name the command line never showed
    "generate --seed 2**63": (
        lambda d: [*TINY_IDS, "--seed", str(2**63)],
        r"--seed must be an integer in \[-9,223,372,036,854,775,808, 9,223,372,036,854,775,807\] "
        r"\(any int64\)",
    ),
    "generate --temperature nan": (
        lambda d: [*TINY_IDS, "--temperature", "nan"],
        r"--temperature must be a finite number >= 0 \(0 means greedy\), got nan",
    ),
    # before: "'.' is a directory without config.json", a path the user never gave
    "generate MODEL ''": (
        lambda d: ["generate", "", "--prompt-ids", "1 2"],
        r"MODEL is empty \(''\); expected a model file, a directory or package\.module:factory \(see "
        r"`trtforge generate -h`\)",
    ),
    "compile MODEL '' --generate": (
        lambda d: ["compile", "", "--generate", "-o", "s.engine"],
        r"MODEL is empty \(''\).*`trtforge compile -h`",
    ),
    "compile MODEL ''": (lambda d: ["compile", "", "-o", "s.engine"], r"MODEL is empty \(''\)"),
    # before: "directory 'notes.txt' does not exist", of a file the user can see there
    "compile --generate -o under a file": (
        _file("notes.txt", b"a user's notes\n", *GENERATE[:-1], "notes.txt/s.engine"),
        r"cannot write output engine 'notes\.txt/s\.engine': directory 'notes\.txt' is a file, not a "
        r"directory\.",
    ),
    # before: an OverflowError in the export's slot arithmetic (past int64) or a 422 TB allocation (2**40),
    # each an internal error with its trace; 1,000 built a pool of blocks no sequence could fill
    **{
        f"compile --generate --block-size {size}": (
            lambda d, size=size: [*GENERATE, "--cache-layout", "paged", "--block-size", size],
            rf"--block-size {size[:6]}.* exceeds the KV-cache length 64 \(--max-seq\).*--block-size <= 64\.",
        )
        for size in (str(10**23), str(2**40), "65")
    },
    "report MODEL '' --generate": (
        _file("text.txt", b"x = 1\n" * 50, "report", "", "--generate", "--text", "text.txt", "-o", "rep"),
        r"MODEL is empty \(''\).*`trtforge report -h`",
    ),
    "serve MODEL ''": (lambda d: ["serve", ""], r"MODEL is empty \(''\)"),
    # before: ignored (exit 0, nothing stopped); the server refuses an empty stop string
    "generate (trained) --stop ''": (
        lambda d: ["generate", str(TRAINED), "--prompt", "x", "--max-tokens", "2", "--stop", ""],
        r"--stop '': a stop text must be non-empty",
    ),
    # before: "request 'req-1': the prompt has 4000 tokens ...", a request id the command line never showed
    "generate (trained) a second --prompt past the context": (
        lambda d: ["generate", str(TRAINED), "--prompt", "x", "--prompt", "x = 1\n" * 1000],
        r"--prompt #2: 4,000 tokens, but the model's context length is 2,048 tokens",
    ),
    # before: "response_format: the JSON schema cannot ...", a server's field the command line never showed
    "generate (trained) --json-schema the grammar compiler refuses": (
        _file(
            "bad.json",
            b'{"type": "foo"}',
            *("generate", str(TRAINED), "--prompt", "x", "--max-tokens", "2", "--json-schema", "bad.json"),
        ),
        r"--json-schema 'bad\.json': the JSON schema cannot be compiled to a grammar: .*Unsupported type",
    ),
    # before: the allocator's trace as an internal error (torch: RuntimeError / TypeError; ORT: OverflowError)
    # before: the engine's "maximum sequence length is 48", a length the user never set
    "generate --num-blocks too few for the prompt": (
        lambda d: [*TINY_IDS[:-1], " ".join(["5"] * 100), "--num-blocks", "3"],
        r"--num-blocks 3: 3 block\(s\) of 16 tokens hold 48 tokens of a sequence, and a prompt has 100 .*"
        r"give --num-blocks 7 or more",
    ),
    # before: "num_blocks must be a positive integer", the API argument's name
    "generate --num-blocks 0": (
        lambda d: [*TINY_IDS, "--num-blocks", "0"],
        r"Invalid value for '--num-blocks': 0 is not in the range x>=1",
    ),
    # before: "tensor_parallel_size 2 needs the torch executor ... Use executor='torch'.", the API's names
    "generate --tensor-parallel-size with another executor": (
        lambda d: [*TINY_IDS, "--tensor-parallel-size", "2", "--executor", "onnxruntime"],
        r"--tensor-parallel-size 2 needs the torch executor .*\. Use --executor torch\.",
    ),
    "generate --tensor-parallel-size with speculative decoding": (
        lambda d: [*TINY_IDS, *TP_NGRAM],
        r"speculative decoding does not run with --tensor-parallel-size > 1 yet",
    ),
    "generate --tensor-parallel-size with --kv-cache-dtype fp8": (
        lambda d: [*TINY_IDS, "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8"],
        r"error: --kv-cache-dtype fp8 does not run with --tensor-parallel-size > 1 yet; pass "
        r"--tensor-parallel-size 1 or drop it\.",
    ),
    "generate --tensor-parallel-size with --quantization and --lm-head-quantization": (
        lambda d: [*TINY_IDS, *TP_QUANT],
        r"error: --quantization fp8 and --lm-head-quantization fp8 do not run with --tensor-parallel-size "
        r"> 1 yet; pass --tensor-parallel-size 1 or drop them\.",
    ),
    # before: "--kv-cache-dtype fp8 and quantization='fp8' and lm_head_quantization='fp8'"
    "generate --tensor-parallel-size with three precision options": (
        lambda d: [*TINY_IDS, *TP_QUANT, "--kv-cache-dtype", "fp8"],
        r"error: --kv-cache-dtype fp8, --quantization fp8 and --lm-head-quantization fp8 do not run with "
        r"--tensor-parallel-size > 1 yet; pass --tensor-parallel-size 1 or drop them\.",
    ),
    "serve --tensor-parallel-size with speculative decoding": (
        lambda d: ["serve", TINY_IDS[1], "--tokenizer", str(TRAINED), "--device", "cpu", *TP_NGRAM],
        r"speculative decoding does not run with --tensor-parallel-size > 1 yet",
    ),
    "generate --num-blocks past RAM (torch)": (
        lambda d: [*TINY_IDS, "--num-blocks", str(10**15)],
        r"--num-blocks 1000000000000000: the KV-cache pool of that many blocks cannot be allocated",
    ),
    "generate --num-blocks past int64 (torch)": (
        lambda d: [*TINY_IDS, "--num-blocks", str(10**23)],
        r"--num-blocks 10{23}: the KV-cache pool of that many blocks cannot be allocated",
    ),
    "generate --num-blocks past int64 (onnxruntime)": (
        lambda d: ["generate", _paged_graph(d), "--prompt-ids", "1 2", "--num-blocks", str(10**23)],
        r"--num-blocks 10{23}: the KV-cache pool of that many blocks cannot be allocated",
    ),
    # before: decoded with replacement characters, and a perplexity of garbage reported (exit 0)
    "report --generate --text binary": (
        _file("junk.bin", bytes(range(256)) * 64, *REPORT, "--text", "junk.bin"),
        r"--text 'junk\.bin' holds NUL bytes \(the first at offset 0\): a binary file, not text",
    ),
    "report --generate --text not UTF-8": (
        _file("latin1.txt", "café = 1\n".encode("latin-1") * 500, *REPORT, "--text", "latin1.txt"),
        r"--text 'latin1\.txt' is not UTF-8 text \(byte 0xe9 at offset 3\)",
    ),
    # before: every variant failed to load (torch's error in the report), exit 3 with the report written
    "report --generate --device bogus": (
        lambda d: [*REPORT, "--text", str(TRAINED.parent / "eval_stdlib.txt"), "--device", "bogus"],
        r"--device 'bogus': .*expected 'cpu', 'cuda' or 'cuda:N'",
    ),
    "report --generate --device cuda:7": (
        lambda d: [*REPORT, "--text", str(TRAINED.parent / "eval_stdlib.txt"), "--device", "cuda:7"],
        r"--device 'cuda:7': this machine has \d usable CUDA device\(s\)",
    ),
    # before: torch's parse error under the API's name ("device 'bogus'"), not the flag's
    "serve --device bogus": (
        lambda d: ["serve", str(TRAINED), "--device", "bogus"],
        r"--device 'bogus': .*expected 'cpu', 'cuda' or 'cuda:N'",
    ),
    "serve --device cuda:7": (
        lambda d: ["serve", str(TRAINED), "--device", "cuda:7"],
        r"--device 'cuda:7': this machine has \d usable CUDA device\(s\)",
    ),
    # before: cut 10**8 windows and ran them as one batch, killed for memory (exit 137)
    # before: every variant's run failed on the embedding lookup ("IndexError: index out of range in
    # self" in the report), exit 3
    "report --generate --tokenizer of a larger vocabulary": (
        lambda d: [
            *("report", "tests.llm.tiny_models:llama_factory", *REPORT[2:]),
            *("--text", str(TRAINED.parent / "eval_stdlib.txt"), "--tokenizer", str(TRAINED)),
        ],
        r"--text: --tokenizer '[^']*code-llama-21m' gave token id \d+, outside the model's vocabulary of "
        r"300 ids \(0\.\.299\): it is not this model's tokenizer",
    ),
    "report --generate --windows past RAM": (
        lambda d: [*REPORT, "--text", str(TRAINED.parent / "eval_stdlib.txt"), "--windows", str(10**8)],
        r"--windows 100000000 x --window-len 16 x the vocabulary's 4096 logits take .* GiB, more than this "
        r"machine's .* GiB of available RAM",
    ),
    # before: built the speed prompts and a KV pool for them: never finished (killed by `timeout`)
    "report --generate --batch past memory": (
        lambda d: [
            *(*REPORT, "--text", str(TRAINED.parent / "eval_stdlib.txt")),
            *("--batch", "1,65536", "--prompt-len", "2000"),
        ],
        r"variant fp32 \(4 bytes a KV element\) needs .* GiB at once \(.* GiB of KV cache for --batch 65536 "
        r"requests of --prompt-len 2000 \+ --new-tokens 2 tokens at once, .*\), more than this machine's .* "
        r"GiB of available RAM; lower --batch or --prompt-len",
    ),
    # before: found only when writing, after every variant had run (here: the model's error came first)
    "report --generate -o under a file": (
        _file(
            "text.txt",
            b"def f(x):\n    return x\n" * 50,
            *("report", "no-such-model", "--generate", "--text", "text.txt", "-o", "text.txt/rep"),
        ),
        r"cannot create report directory 'text\.txt/rep': 'text\.txt' is a file, not a directory",
    ),
    # MPT asking for learned positions instead of ALiBi, which transformers' MPT ignores (it applies ALiBi
    # anyway): refused by name before anything is exported or served
    "compile --generate mpt without ALiBi": (
        lambda d: ["compile", MPT_NO_ALIBI, "--generate", "--max-seq", "64", "-q", "-o", "s.engine"],
        r"mpt model MptForCausalLM: its config sets attn_config.alibi=False \(learned positions",
    ),
    # before: json's JSONDecodeError (a truncated or hand-edited graph), an internal error with its trace
    "generate a step graph whose metadata is not JSON": (
        _damaged_metadata('{"max_seq": 16, "cache'),
        r"step graph 'step\.onnx': its 'trtforge\.generation' metadata is not valid JSON "
        r"\(Unterminated string",
    ),
    # before: AttributeError: 'list' object has no attribute 'get', an internal error with its trace
    "generate a step graph whose metadata is not an object": (
        _damaged_metadata("[16, 1]"),
        r"step graph 'step\.onnx': its 'trtforge\.generation' metadata is not a JSON object "
        r"\(it is '\[16, 1\]'\)",
    ),
    "generate mpt without ALiBi": (
        lambda d: ["generate", MPT_NO_ALIBI, "--prompt-ids", "1 2"],
        r"mpt model MptForCausalLM: its config sets attn_config.alibi=False \(learned positions",
    ),
}


# the cases that read TRAINED
ON_TRAINED = ("report", "serve --device", "serve --tensor", "generate (trained)")
NEEDS_TRAINED = pytest.mark.skipif(not TRAINED.is_dir(), reason=f"the trained model is absent: {TRAINED}")


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[NEEDS_TRAINED] if c.startswith(ON_TRAINED) else [], id=c) for c in CASES],
)
def test_llm_hostile_input_exits_2_cleanly(
    case: str,
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert_exits_2_cleanly(*CASES[case], workdir, capfd)


@pytest.mark.parametrize("name", ["gpt2", "tok-dir"])
def test_generate_tokenizer_is_a_local_directory(
    name: str,
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--tokenizer names a directory, read offline as serve reads it: a Hub name or a directory without
    tokenizer files is one message naming it (before: the Hub was asked, a minute of retries offline,
    and the message was the Hub client's, cut mid-word over several lines)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (before the fix: fail at once rather than retry)

    def setup(d: Path) -> list[str]:
        (d / "tok-dir").mkdir()
        return ["generate", "step.onnx", "--prompt", "x", "--tokenizer", name]

    message = rf"'{name}' holds no tokenizer \(tokenizer\.json, .*--tokenizer DIR"
    assert_exits_2_cleanly(setup, message, workdir, capfd)


def test_generate_refuses_more_cpu_ranks_than_cpus(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before: a module:factory model's heads are checked only inside the workers, so every one of
    --tensor-parallel-size N worker processes started first (N = 1,000,000 started processes until
    killed)."""
    import os

    ranks = len(os.sched_getaffinity(0)) + 1
    argv = ["generate", "tests.llm.tiny_models:llama_factory", "--prompt-ids", "1 2"]
    argv += ["--tensor-parallel-size", str(ranks)]
    # (and before: the message named the API's tensor_parallel_size, not the flag)
    message = rf"--tensor-parallel-size {ranks}: on the CPU each rank is a worker process .*; use "
    message += r"--tensor-parallel-size <= \d+\."
    assert_exits_2_cleanly(lambda d: argv, message, workdir, capfd)


@pytest.mark.trt_build
@pytest.mark.parametrize(
    ("options", "tensor"),
    [
        (["--cache-layout", "paged", "--num-blocks", str(10**12)], "key_pool.0"),
        (["--cache-layout", "paged", "--num-blocks", str(10**20)], "key_pool.0"),
        (["--max-batch", str(10**9)], "key_cache.0"),
    ],
)
def test_compile_generate_refuses_a_range_tensorrt_cannot_hold(
    options: list[str],
    tensor: str,
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before: TensorRT's profile refused the pool range with a RuntimeError (10**12 blocks: "inconsistent")
    or a TypeError (10**20: past int64), shown as an internal error with its trace; 10**9 sequences failed
    in the builder after the export, with exit 1."""
    message = rf"input '{re.escape(tensor)}' would hold [\d,]+ elements at its (opt|max) shape"
    assert_exits_2_cleanly(
        lambda d: [*GENERATE, *options], message + r".*--num-blocks, --max-batch", workdir, capfd
    )


def test_a_calib_data_file_of_exactly_the_most_prompts_is_read_whole(tmp_path):
    """The bound is on prompts, not lines: 1,024 prompts with blank lines between them are all read."""
    from trtforge.cli._options import read_prompt_ids
    from trtforge.llm.prompts import MAX_CALIB_PROMPTS

    path = tmp_path / "calib.txt"
    path.write_text("".join(f"{i} {i + 1}\n\n" for i in range(MAX_CALIB_PROMPTS)))
    prompts = read_prompt_ids(str(path))
    assert MAX_CALIB_PROMPTS == 1024 and len(prompts) == 1024 and prompts[-1] == [1023, 1024]
