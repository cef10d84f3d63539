"""`trtforge generate`: continue prompts with a step engine (TensorRT), a step graph (ONNX Runtime) or a HF
model (torch), streaming."""

from __future__ import annotations

import re
from typing import Any

import click

from trtforge.cli._speculative import (
    check_draft_tokenizer_option,
    speculative_config,
    speculative_options,
)
from trtforge.cli.torch_options import (
    executor_option,
    resolve_executor,
    torch_executor_kwargs,
    torch_executor_options,
)

EXAMPLES = """\b
Examples:
  trtforge generate step.onnx --prompt-ids "1 15 27" --max-tokens 32
  trtforge generate llm.engine --prompt-ids "1 15 27" --max-tokens 32
  trtforge generate step.onnx --prompt-ids "1 2 3" --prompt-ids "4 5" --temperature 0.8 --top-p 0.9 --seed 1
  trtforge generate ./llama-dir --prompt "Once upon a time"
  trtforge generate mypkg.models:make_llama --prompt-ids "1 2 3" --num-blocks 128
  trtforge generate ./llama-dir --prompt "x" --tokenizer ./llama-dir --temperature 0.7 --n 2 --seed 3
  trtforge generate ./llama-dir --prompt "{" --tokenizer ./llama-dir --json-schema item.schema.json
  trtforge generate ./llama-dir --prompt "def f(x):" --speculative-model ./draft-dir
  trtforge generate ./llama-dir --prompt "x" --quantization int4-awq --calib-data prompts.txt
  trtforge generate ./llama-dir --prompt "x" --quantization fp8 --lm-head-quantization fp8
  trtforge generate ./llama-dir --prompt "x" --tensor-parallel-size 2
  trtforge generate step.onnx --prompt-ids "1 2 3" --logit-bias 13=-100 --logit-bias 42=5
\b
MODEL: a paged step engine from `trtforge compile --generate --cache-layout paged`
(TensorRT, on a GPU it supports), a step graph written by `trtforge compile --generate
--save-onnx` or trtforge.llm.compile.export_step (slot or paged cache layout), a Hugging Face
save_pretrained directory, or module:factory (both run by the torch executor). Each prompt's new
tokens are printed on one line as they are generated (token ids, or text when there is a tokenizer:
--tokenizer DIR, else MODEL's own directory);
prompts run batched together.
"""


# digits of a --prompt-ids id at most: far past any vocabulary (the vocabulary check names such an id),
# and int() is never asked to convert more than Python's 4,300 digits (a ValueError, exit 1)
MAX_ID_DIGITS = 30


def _parse_ids(text: str) -> list[int]:
    """``--prompt-ids TEXT`` as token ids; UserError naming the flag (and the start of TEXT) otherwise."""
    from trtforge.errors import UserError, shown

    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if not parts or not all(re.fullmatch(rf"\d{{1,{MAX_ID_DIGITS}}}", p) for p in parts):
        raise UserError(
            f"--prompt-ids {shown(text)}: expected token ids >= 0 (up to {MAX_ID_DIGITS} digits each) "
            'separated by spaces or commas, e.g. "1 2 3".'
        )
    return [int(p) for p in parts]


@click.command("generate", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option(
    "--prompt-ids", "prompt_ids", multiple=True, help='A prompt as token ids, e.g. "1 2 3" (repeatable).'
)
@click.option("--prompt", "prompts", multiple=True, help="A prompt as text (repeatable; needs a tokenizer).")
@click.option(
    "--tokenizer",
    default=None,
    help="Hugging Face tokenizer directory for --prompt and the output (default: MODEL's own, if any).",
)
@click.option("--max-tokens", default=16, show_default=True, type=int, help="New tokens per prompt at most.")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option(
    "--top-k", default=0, show_default=True, type=int, help="Keep the k likeliest tokens (0 = all)."
)
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Nucleus sampling mass in (0, 1].")
@click.option("--seed", default=None, type=int, help="Sampling seed (each prompt gets its own stream).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the model's end-of-sequence token.")
@click.option("--n", "n", default=1, show_default=True, type=int, help="Independent samples per prompt.")
@click.option(
    "--logprobs",
    default=None,
    type=int,
    help="Print each token's logprob and the N likeliest (0: the sampled token's only), as JSON lines.",
)
@click.option("--presence-penalty", default=0.0, show_default=True, type=float, help="In [-2, 2].")
@click.option("--frequency-penalty", default=0.0, show_default=True, type=float, help="In [-2, 2].")
@click.option("--repetition-penalty", default=1.0, show_default=True, type=float, help="> 0; 1 disables it.")
@click.option("--min-p", default=0.0, show_default=True, type=float, help="In [0, 1]; 0 disables it.")
@click.option(
    "--logit-bias",
    "logit_bias",
    multiple=True,
    metavar="ID=BIAS",
    callback=lambda ctx, param, value: _parse_logit_bias(value),
    help=(
        "Add BIAS (a number in [-100, 100]) to token ID's logit before sampling, as OpenAI's logit_bias "
        "(repeatable): --logit-bias 13=-100 bans token 13, --logit-bias 13=100 all but forces it, small "
        "values (+-1..5) nudge it. Greedy decoding takes the biased argmax."
    ),
)
@click.option(
    "--json-schema",
    "json_schema",
    default=None,
    metavar="FILE",
    help="A JSON Schema file: the output is JSON valid against it (needs a tokenizer).",
)
@executor_option
@click.option(
    "--num-blocks",
    default=None,
    type=click.IntRange(1),
    help="KV-cache blocks in the pool (slot graphs: rows).",
)
@click.option(
    "--stop",
    "stops",
    multiple=True,
    help="Stop at this text (repeatable; matched on the decoded text and not printed; needs a tokenizer).",
)
@speculative_options
@torch_executor_options
def generate_cmd(
    model: str,
    prompt_ids: tuple[str, ...],
    prompts: tuple[str, ...],
    tokenizer: str | None,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    ignore_eos: bool,
    n: int,
    logprobs: int | None,
    presence_penalty: float,
    frequency_penalty: float,
    repetition_penalty: float,
    min_p: float,
    logit_bias: dict[int, float] | None,
    json_schema: str | None,
    executor: str,
    num_blocks: int | None,
    tensor_parallel_size: int,
    device: str | None,
    dtype: str,
    kv_cache_dtype: str,
    calib_data: str | None,
    stops: tuple[str, ...],
    speculative_method: str | None,
    speculative_model: str | None,
    num_speculative_tokens: int | None,
    quantization: str | None,
    lm_head_quantization: str | None,
) -> None:
    """Generate continuations of prompts with MODEL, printing tokens as they come."""
    from trtforge.errors import UserError
    from trtforge.llm import SamplingParams, load
    from trtforge.llm.text import check_text, encode_prompt, model_tokenizer

    if not prompt_ids and not prompts:
        raise UserError('give at least one prompt: --prompt-ids "1 2 3" or --prompt TEXT.')
    for p in prompts:
        check_text(p, "--prompt")
    if tokenizer is not None:
        tok = _tokenizer(tokenizer)
    else:  # the model directory's own (a save_pretrained directory holds its tokenizer)
        tok = model_tokenizer(check_text(model, "MODEL"), None) if prompts else None
    for text in stops:
        if not text:  # it would match before any text: the server refuses it too
            raise UserError("--stop '': a stop text must be non-empty.")
        check_text(text, "--stop")
    if stops and tok is None and not prompts:
        tok = model_tokenizer(model, None)
    if stops and tok is None:
        raise UserError(f"--stop matches text: it needs a tokenizer (--tokenizer DIR; '{model}' holds none).")
    if prompts and tok is None:
        raise UserError(
            f"--prompt gives text, but '{model}' holds no tokenizer: name one with --tokenizer DIR (or give "
            "token ids with --prompt-ids)."
        )
    rows = [_parse_ids(p) for p in prompt_ids] + [encode_prompt(tok, p, "--prompt") for p in prompts]
    _check_n(n, len(rows))
    params = _sampling_params(
        SamplingParams,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        ignore_eos=ignore_eos,
        n=n,
        logprobs=logprobs,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        repetition_penalty=repetition_penalty,
        min_p=min_p,
        logit_bias=logit_bias,
        response_format=_response_format(json_schema) if json_schema is not None else None,
    )
    if json_schema is not None and tok is None:
        raise UserError("--json-schema constrains text: it needs the model's tokenizer (--tokenizer DIR).")
    executor = resolve_executor(model, executor)
    torch_kw = torch_executor_kwargs(
        executor,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        calib_data=calib_data,
        tensor_parallel_size=tensor_parallel_size,
        lm_head_quantization=lm_head_quantization,
        device=device,
        dtype=dtype,
    )
    spec = speculative_config(speculative_method, speculative_model, num_speculative_tokens)
    check_draft_tokenizer_option(spec, tok, tokenizer, model)
    with _load(load, model, executor, num_blocks, spec, torch_kw) as llm:
        _check_vocabulary(rows, len(prompt_ids), llm.executor.facts.input_vocab_size, tokenizer)
        _check_bias_vocabulary(logit_bias, llm.executor.facts.vocab_size)
        if num_blocks is not None:
            _check_pool_holds(llm.executor.facts, num_blocks, max(len(r) for r in rows))
        _check_lengths(rows, len(prompt_ids), llm.engine.max_model_len)
        handles = _submit(llm.engine, tok, rows, params, json_schema)
        for number, h in enumerate(handles, 1):
            printer, used = _Printer(tok, stops), None
            for count, token in enumerate(h, 1):
                if printer.emit([token]).stopped:
                    h.cancel()  # its blocks return; the tokens already sampled are not printed
                    used = count
                    break
            printer.close()
            completion = h.completion()
            _note_context_cut(number, completion, max_tokens, llm.engine.max_model_len, llm.executor.facts)
            if json_schema is not None and used is None:
                _note_json_cut(number, completion, tok, max_tokens)
            if logprobs is not None:
                _print_logprobs(completion, used)


def _submit(engine: Any, tok: Any, rows: list[list[int]], params: Any, json_schema: str | None) -> list[Any]:
    """Every prompt's samples queued in `engine`; a schema the grammar compiler refuses is a UserError
    naming ``--json-schema FILE`` (the engine's message named ``response_format``, a server's field)."""
    from trtforge.errors import UserError, shown
    from trtforge.llm.structured import GrammarError

    try:
        if json_schema is not None:
            engine.enable_structured_output(tok)
        return [h for r in rows for h in engine.submit_n(r, params)]
    except UserError as exc:
        grammar = isinstance(exc, GrammarError) or isinstance(exc.__cause__, GrammarError)
        if json_schema is None or not grammar:
            raise
        why = str(exc).removeprefix("response_format: ")
        raise UserError(f"--json-schema {shown(json_schema)}: {why.rstrip()}") from exc


def _sampling_params(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)`` (SamplingParams), its refusal of a field worded as the flag that set it: the
    message named ``SamplingParams.top_p``, a name the command line never showed."""
    from trtforge.errors import UserError

    try:
        return cls(**fields)
    except UserError as exc:
        text = str(exc)
        for name in fields:
            prefix = f"SamplingParams.{name} "
            if text.startswith(prefix):
                flag = "--json-schema" if name == "response_format" else "--" + name.replace("_", "-")
                rest = text[len(prefix) :].replace("must be None or ", "must be ", 1)  # (None: leave it out)
                raise UserError(f"{flag} {rest}.") from exc
        raise


def _check_vocabulary(rows: list[list[int]], given_ids: int, vocab: int, tokenizer: str | None) -> None:
    """UserError naming --prompt-ids (the first `given_ids` rows) or the tokenizer for a token id past
    the model's vocabulary (the engine's message named an internal request id)."""
    from trtforge.errors import UserError

    for i, row in enumerate(rows):
        bad = [t for t in row if t >= vocab]
        if not bad:
            continue
        if i < given_ids:
            raise UserError(
                f"--prompt-ids: token id {bad[0]} is outside the model's vocabulary of {vocab} ids "
                f"(0..{vocab - 1})."
            )
        source = f"--tokenizer '{tokenizer}'" if tokenizer is not None else "the model's tokenizer"
        raise UserError(
            f"--prompt: {source} gave token id {bad[0]}, outside the model's vocabulary of {vocab} ids "
            f"(0..{vocab - 1}): it is not this model's tokenizer."
        )


def _parse_logit_bias(values: tuple[str, ...]) -> dict[int, float] | None:
    """``--logit-bias ID=BIAS`` flags as {id: bias} (None when none); click.BadParameter (exit 2) naming
    the flag for a malformed or repeated entry (the range is SamplingParams', worded as the flag)."""
    from trtforge.errors import shown
    from trtforge.llm.sampling import LOGIT_BIAS_LIMIT, token_id_of

    out: dict[int, float] = {}
    for text in values:
        key, sep, value = text.partition("=")
        try:
            bias: float | None = float(value)
        except ValueError:
            bias = None
        in_range = bias is not None and -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT  # (NaN is not)
        token = token_id_of(key.strip())
        if not sep or token is None or not in_range:
            raise click.BadParameter(
                f"{shown(text)}: expected ID=BIAS, a token id >= 0 and a number in [-{LOGIT_BIAS_LIMIT:g}, "
                f"{LOGIT_BIAS_LIMIT:g}], e.g. 13=-100 (bans token 13) or 13=100 (all but forces it)",
                param_hint="'--logit-bias'",
            )
        if token in out:
            raise click.BadParameter(
                f"{shown(text)}: token {token} is biased twice; give each token id once",
                param_hint="'--logit-bias'",
            )
        out[token] = bias
    return out or None


def _check_bias_vocabulary(bias: dict[int, float] | None, vocab: int) -> None:
    """UserError naming --logit-bias for a token id past the model's vocabulary (the engine's message
    named an internal request id)."""
    from trtforge.errors import UserError

    bad = [t for t in bias or () if t >= vocab]
    if bad:
        raise UserError(
            f"--logit-bias: token id {bad[0]} is outside the model's vocabulary of {vocab} ids "
            f"(0..{vocab - 1})."
        )


def _check_n(n: int, prompts: int) -> None:
    """UserError naming --n outside [1, MAX_N], or past MAX_N sequences over all prompts: every sample is
    queued at once as its own sequence and printed on its own line, so --n 10**23 would fill the memory
    for hours rather than fail."""
    from trtforge.errors import UserError
    from trtforge.llm.sampling import MAX_N

    why = (
        "Each sample is its own sequence, all queued at once (a few KB of memory each before it runs, then "
        "its own KV-cache blocks) and printed on its own line"
    )
    if not 1 <= n <= MAX_N:
        raise UserError(
            f"--n {n}: expected 1 to {MAX_N:,} samples per prompt. {why}; for more, run again with another "
            "--seed."
        )
    if n * prompts > MAX_N:
        raise UserError(
            f"--n {n} x {prompts} prompts is {n * prompts:,} sequences, more than {MAX_N:,} in one run. "
            f"{why}; give fewer prompts or samples per run."
        )


def _load(load: Any, model: str, executor: str, num_blocks: int | None, spec: Any, torch_kw: dict) -> Any:
    """`llm.load`, with a --num-blocks pool too large to allocate, or whose size overflows the allocator's
    integers, refused as the user's number (not the allocator's trace as an internal error)."""
    from trtforge.cli._options import arguments_as_flags
    from trtforge.errors import UserError
    from trtforge.llm.service import PoolAllocationError, allocation_failure

    def refused(detail: str) -> UserError:
        return UserError(
            f"--num-blocks {num_blocks}: the KV-cache pool of that many blocks cannot be allocated on this "
            f"machine ({detail}); give fewer blocks, or leave --num-blocks out to size the pool to the "
            "machine."
        )

    try:
        with arguments_as_flags():  # the loader's refusals name its arguments: here, the flags that set them
            return load(model, executor, num_blocks=num_blocks, speculative=spec, **torch_kw)
    except PoolAllocationError as exc:  # the torch executor's refusal, worded for the API
        raise refused(exc.detail) from exc
    except (MemoryError, RuntimeError, TypeError, OverflowError) as exc:
        if num_blocks is None or not allocation_failure(exc):
            raise
        raise refused(str(exc).strip().splitlines()[0][:200]) from exc


def _check_pool_holds(facts: Any, num_blocks: int, longest: int) -> None:
    """UserError naming --num-blocks when the pool it sized is what keeps the longest prompt out (the
    engine's own refusal speaks of a maximum sequence length the user never set)."""
    from trtforge.errors import UserError

    capacity = facts.num_blocks * facts.block_size
    if capacity < facts.max_model_len and longest >= capacity:
        need = longest // facts.block_size + 1  # the prompt and one new token
        raise UserError(
            f"--num-blocks {num_blocks}: {facts.num_blocks} block(s) of {facts.block_size} tokens hold "
            f"{capacity} tokens of a sequence, and a prompt has {longest} (plus at least one new token); "
            f"give --num-blocks {need} or more, or leave it out."
        )


def _check_lengths(rows: list[list[int]], given_ids: int, max_model_len: int) -> None:
    """UserError naming --prompt-ids (the first `given_ids` rows) or --prompt for a prompt that leaves no
    room for a new token in `max_model_len` (the engine's message named an internal request id, 'req-0')."""
    from trtforge.errors import UserError

    for i, row in enumerate(rows):
        if len(row) >= max_model_len:
            flag, number, given = (
                ("--prompt-ids", i, given_ids)
                if i < given_ids
                else ("--prompt", i - given_ids, len(rows) - given_ids)
            )
            which = flag if given == 1 else f"{flag} #{number + 1}"
            raise UserError(
                f"{which}: {len(row):,} tokens, but the model's context length is {max_model_len:,} tokens, "
                "the prompt and at least one new token; give a shorter prompt."
            )


def _note_context_cut(number: int, completion: Any, max_tokens: int, max_model_len: int, facts: Any) -> None:
    """Say on stderr when output `number` ended at the longest sequence the engine runs (`max_model_len`)
    before --max-tokens: the line is shorter than asked for, and the user should know it was not the
    model's choice. Where the KV-cache pool (`facts`' blocks) is what holds sequences shorter than the
    model's context, the note names the pool and --num-blocks, not a context length the model lacks."""
    made = len(completion.token_ids)
    if completion.finish_reason != "length" or made >= max_tokens:
        return
    if max_model_len == facts.num_blocks * facts.block_size < facts.max_model_len:
        limit = (
            f"the KV-cache pool's capacity ({facts.num_blocks} block(s) of {facts.block_size} tokens: "
            f"{max_model_len} tokens, prompt included; the model's context is {facts.max_model_len}; "
            "--num-blocks sets the pool)"
        )
    else:
        limit = f"the model's context length ({max_model_len} tokens, prompt included)"
    click.echo(
        f"note: output {number} stopped after {made} new tokens at {limit}, "
        f"before --max-tokens {max_tokens}.",
        err=True,
    )


def _note_json_cut(number: int, completion: Any, tok: Any, max_tokens: int) -> None:
    """Say on stderr when output `number` of a --json-schema run is not the complete JSON the schema asks
    for: its tokens ran out (--max-tokens, or the context) mid-value, and the line alone read as the
    model's answer (exit 0, no word)."""
    import json

    if completion.finish_reason != "length":
        return
    try:
        json.loads(tok.decode(list(completion.token_ids), skip_special_tokens=True))
        return  # complete at the limit, its end not generated yet
    except ValueError:
        pass
    why = (
        f"--max-tokens {max_tokens} ran out before the schema's value ended; give a larger --max-tokens"
        if len(completion.token_ids) >= max_tokens
        else "the sequence's length limit (the note above) came before the schema's value ended"
    )
    click.echo(f"note: output {number} is incomplete JSON: {why}.", err=True)


def _response_format(path: str) -> dict[str, Any]:
    """``--json-schema FILE`` as an OpenAI json_schema response format (UserError naming the file: a
    missing, non-JSON or absurdly nested file is the user's to fix, not a traceback)."""
    import json
    import sys

    from trtforge.errors import UserError

    try:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as exc:
        raise UserError(f"--json-schema {path!r}: cannot read it ({exc.strerror or exc}).") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--json-schema {path!r} is not a JSON file: {exc}.") from exc
    except ValueError:  # valid JSON, but an integer past int()'s digit limit (it was an internal error)
        raise UserError(
            f"--json-schema {path!r} holds an integer of more than {sys.get_int_max_str_digits():,} digits; "
            "expected a JSON Schema of ordinary numbers."
        ) from None
    except RecursionError:  # json's parser recurses once per level: a hostile file nests thousands deep
        raise UserError(
            f"--json-schema {path!r} nests its JSON deeper than the parser's {sys.getrecursionlimit()} "
            "levels; expected a JSON Schema object of ordinary depth."
        ) from None
    if not isinstance(schema, (dict, bool)):
        raise UserError(f"--json-schema {path!r}: a JSON Schema is an object, got {type(schema).__name__}.")
    return {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}


def _print_logprobs(completion: Any, used: int | None = None) -> None:
    """One JSON line with the completion's per-token logprobs (and top alternatives): of its first `used`
    tokens where a --stop text ended it (the engine may have sampled past the stop before it was
    cancelled; those tokens are not the output)."""
    import json

    rows = [
        {"token": lp.token_id, "logprob": lp.logprob, "rank": lp.rank, "top": [list(t) for t in lp.top]}
        for lp in (completion.logprobs or ())[:used]
    ]
    click.echo(json.dumps({"logprobs": rows}))


class _Printer:
    """Writes one prompt's tokens on one line as they arrive: ids, or text as it becomes final
    (:class:`trtforge.llm.text.TextStream`: a character split across tokens waits, a --stop text
    ends the line and is not printed)."""

    def __init__(self, tok: Any, stops: tuple[str, ...] = ()) -> None:
        from trtforge.llm.text import TextStream

        self.count = 0  # the output is decoded on its own, as `tok.decode(output_ids)` reads it
        self.text = TextStream(tok, [], stops) if tok is not None else None

    @property
    def stopped(self) -> bool:
        return self.text is not None and self.text.stopped is not None

    def emit(self, tokens: list[int]) -> _Printer:
        if self.text is None:
            text = "".join(f"{' ' if self.count or i else ''}{t}" for i, t in enumerate(tokens))
            click.echo(text, nl=False)
            self.count += len(tokens)
        else:
            click.echo(self.text.push(tokens), nl=False)
        return self

    def close(self) -> None:
        if self.text is not None:
            click.echo(self.text.finish(), nl=False)
        click.echo("")


def _tokenizer(name: str) -> Any:
    """The --tokenizer directory's tokenizer, read offline as serve reads it (a name that is no local
    directory is refused at once, not looked up on the Hugging Face Hub for a minute of retries);
    ``demo`` is the bundled MiniLM tokenizer."""
    from trtforge.calibration.data import DEMO_TOKENIZER, resolve_tokenizer
    from trtforge.llm.text import load_tokenizer

    return resolve_tokenizer(name) if name == DEMO_TOKENIZER else load_tokenizer(name)
