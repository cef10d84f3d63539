"""`trtforge serve`: an OpenAI-compatible HTTP server over a model (flags spelled as vLLM's)."""

from __future__ import annotations

import sys
from pathlib import Path
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
  trtforge serve ./llama-dir
  trtforge serve ./llama-dir --port 8000 --api-key sk-local --chat-template chat.jinja
  trtforge serve ./llama-dir --chat-template tool_use
  trtforge serve llm.engine --tokenizer ./llama-dir --served-model-name llama
  trtforge serve ./llama-dir --speculative-method ngram --num-speculative-tokens 4
  trtforge serve ./llama-dir --quantization fp8 --kv-cache-dtype fp8
\b
Then any OpenAI client works against it:
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "llama-dir", "prompt": "def read_json(path):", "max_tokens": 32}'
\b
MODEL: a Hugging Face save_pretrained directory or module:factory (torch executor), a step graph
(.onnx of either cache layout, ONNX Runtime; a slot graph's batch is its --max-batch) or a paged step
engine (.engine, TensorRT). The tokenizer comes from
MODEL's directory unless --tokenizer names one. Endpoints: /v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics (Prometheus). SIGTERM drains requests in flight (up to
--shutdown-grace seconds; new ones get 503) and exits 0; a second signal stops at once (exit 143).
An engine that stops on its own (a lost executor) turns /health to 503 and exits 1.
"""


def _at_most(bound: str) -> Any:
    """A click callback refusing a value past ``trtforge.llm.sched.request.<bound>`` by the option's name
    (imported when the option is given: the scheduler's module is not for `trtforge --help` to load)."""

    def check(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
        from trtforge.errors import shown
        from trtforge.llm.sched import request

        most = getattr(request, bound)
        if value is not None and value > most:
            raise click.BadParameter(
                f"{shown(value)} is more than {most:,}, the most it can be (buffers and CUDA graphs are "
                "sized by it).",
                ctx,
                param,
            )
        return value

    return check


def _check_prefill_cap(batched: int | None, prefill: int | None) -> None:
    """Refuse a --max-prefill-tokens-with-decodes above the step's --max-num-batched-tokens (given or
    default): a step never holds more tokens than that, so the cap asked for could never be reached (it
    was taken silently and ran as the smaller budget)."""
    from trtforge.errors import UserError
    from trtforge.llm.sizing import DEFAULT_MAX_NUM_BATCHED_TOKENS

    budget = DEFAULT_MAX_NUM_BATCHED_TOKENS if batched is None else batched
    if prefill is None or prefill <= budget:
        return
    which = f"--max-num-batched-tokens {budget}" + (" (its default)" if batched is None else "")
    raise UserError(
        f"--max-prefill-tokens-with-decodes {prefill} exceeds {which}: a step takes at most "
        f"--max-num-batched-tokens tokens, prompt tokens included, so no step could take {prefill}. Lower "
        f"--max-prefill-tokens-with-decodes to at most {budget}, or raise --max-num-batched-tokens to "
        f"{prefill} or more."
    )


@click.command("serve", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on: 0.0.0.0 for every IPv4 interface, :: (or [::]) for every IPv6 one.",
)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on /v1 endpoints.")
@click.option(
    "--allowed-origins",
    "allowed_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Origin (scheme://host[:port], or '*') whose web pages may call the server from a browser (CORS); "
    "repeat for more. Default: none.",
)
@click.option("--tokenizer", default=None, help="Tokenizer directory (default: MODEL's own).")
@click.option(
    "--chat-template",
    default=None,
    metavar="FILE|NAME",
    help="Jinja chat template file, or the name of one of the tokenizer's named chat templates (default: "
    "the tokenizer's own; of named ones, 'default').",
)
@click.option(
    "--served-model-name",
    "served_names",
    multiple=True,
    help="Model name(s) clients use, the first answering requests for any of them (default: MODEL's last "
    "path part, 'llama-dir' for ./llama-dir, which /v1/models lists; requests may also name MODEL as "
    "typed, as vLLM serves it, and are answered as 'llama-dir').",
)
@click.option(
    "--gpu-memory-utilization",
    default=0.9,
    show_default=True,
    type=float,
    help="A fraction in (0, 1]: the share of the GPU memory left after the weights, a step's activations "
    "and the CUDA graphs that the KV pool takes (torch executor on a GPU; on the CPU the pool takes 10% of "
    "the available RAM, at most 2 GiB).",
)
@click.option(
    "--max-num-seqs",
    default=None,
    type=click.IntRange(1),
    callback=_at_most("MAX_NUM_SEQS"),
    help="Sequences per batch (default 256; a step engine's or slot graph's own --max-batch). More raise "
    "throughput on short requests where the KV pool holds them (an 8B model on an H200: 512 gave 5% more "
    "at 128 in / 128 out), at some latency per token.",
)
@click.option(
    "--max-num-batched-tokens",
    default=None,
    type=click.IntRange(1),
    callback=_at_most("MAX_BATCHED_TOKENS"),
    help="Tokens per step (default 4096). More make fewer, larger prompt steps (more output per second on "
    "long prompts) and a larger activation peak and CUDA graphs, which the KV pool then lacks (the sizing "
    "measures both and prints them).",
)
@click.option(
    "--max-prefill-tokens-with-decodes",
    default=None,
    type=click.IntRange(1),
    callback=_at_most("MAX_BATCHED_TOKENS"),
    help="Prompt tokens a step takes while requests decode (default 1024; at most --max-num-batched-tokens, "
    "a larger value is refused). It bounds the time between a running request's tokens; raising it toward "
    "--max-num-batched-tokens trades that for throughput (an "
    "8B model on an H200, 2048 in / 128 out: 4096 gave 3.5% more output tokens a second at 3.4x the time "
    "between tokens; in FP8, 8192 with --max-num-batched-tokens 8192 gave about 17% more at 6x).",
)
@click.option(
    "--max-model-len",
    default=None,
    type=click.IntRange(2),
    help="Longest prompt + output; default: an engine's or step graph's --max-seq, else the positions the "
    "model is made for (as compile --generate's --max-seq, without its 2048 cap: the KV cache is paged); "
    "a longer one is refused.",
)
@click.option(
    "--max-waiting",
    default=256,
    show_default=True,
    type=click.IntRange(0),
    help="Sequences that may wait beyond --max-num-seqs; past that requests get 429.",
)
@click.option(
    "--num-blocks",
    default=None,
    type=click.IntRange(1),
    help="KV-cache blocks, of 16 tokens each on the torch executor (a step graph's or engine's own size "
    "otherwise). Default: sized to the machine (the startup line says how). The pool bounds every "
    "sequence's length: one of fewer tokens than --max-model-len is refused, one shorter than the model's "
    "context is warned of.",
)
@click.option(
    "--request-timeout",
    default=None,
    type=click.FloatRange(0, min_open=True),
    help="Seconds a request may take from its admission to its last token, waiting in the queue "
    "included; past them it gets 504 (a stream: an error event, then [DONE]). Default: no limit.",
)
@click.option(
    "--max-request-bytes",
    default=16 * 2**20,
    show_default=True,
    type=click.IntRange(1),
    help="Largest request body accepted; larger ones get 413 before they are parsed.",
)
@click.option(
    "--body-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds a request's body may take to arrive; a slower one gets 408 and frees its intake slot "
    "(a client trickling bytes would otherwise hold it for as long as it likes).",
)
@click.option(
    "--head-timeout",
    default=20.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds a connection's request line and headers may take to arrive; past them it is closed (a "
    "408 if part of them came): a client that connects and sends nothing, or trickles its headers, would "
    "otherwise hold its connection for ever.",
)
@click.option(
    "--send-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds a streamed response may wait for its client to read (its socket's buffers full); past "
    "them the request is cancelled, its KV blocks freed and its connection closed (a client that never "
    "reads held them for ever).",
)
@click.option(
    "--max-intake",
    default=None,
    type=click.IntRange(1),
    help="Requests whose bodies are read, parsed and tokenized at once (default: 4 per CPU, 8 to 64); "
    "more wait with their bodies unread, so many large bodies are never all in memory together.",
)
@click.option(
    "--shutdown-grace",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds SIGTERM waits for requests in flight.",
)
@executor_option
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@speculative_options
@torch_executor_options
def serve_cmd(
    model: str,
    host: str,
    port: int,
    api_key: str | None,
    allowed_origins: tuple[str, ...],
    tokenizer: str | None,
    chat_template: str | None,
    served_names: tuple[str, ...],
    gpu_memory_utilization: float,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_prefill_tokens_with_decodes: int | None,
    max_model_len: int | None,
    max_waiting: int,
    num_blocks: int | None,
    request_timeout: float | None,
    max_request_bytes: int,
    body_timeout: float,
    head_timeout: float,
    send_timeout: float,
    max_intake: int | None,
    shutdown_grace: float,
    executor: str,
    device: str | None,
    dtype: str,
    tensor_parallel_size: int,
    kv_cache_dtype: str,
    calib_data: str | None,
    log_level: str,
    speculative_method: str | None,
    speculative_model: str | None,
    num_speculative_tokens: int | None,
    quantization: str | None,
    lm_head_quantization: str | None,
) -> None:
    """Serve MODEL over OpenAI's HTTP API."""
    import dataclasses

    from trtforge.cli._options import arguments_as_flags
    from trtforge.errors import UserError
    from trtforge.llm import from_pretrained, load, sizing
    from trtforge.llm.server.run import ServeOptions, _imports, listen, run
    from trtforge.llm.text import (
        chat_template_by_name,
        check_chat_template,
        check_text,
        model_tokenizer,
        read_chat_template,
    )

    check_text(model, "MODEL")
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it ([::1])
        host = host[1:-1]
    _imports()  # before the model loads: a missing extra is said at once
    sizing.check_utilization(gpu_memory_utilization)
    _check_prefill_cap(max_num_batched_tokens, max_prefill_tokens_with_decodes)
    file = chat_template is not None and _is_template_file(chat_template)
    template = read_chat_template(chat_template) if file else None
    options = ServeOptions(  # checked here, before the model loads (minutes for a large one)
        host=host,
        port=port,
        api_key=api_key,
        allowed_origins=allowed_origins,
        served_model_names=served_names,
        chat_template=template,
        max_waiting=max_waiting,
        request_timeout=request_timeout,
        max_request_bytes=max_request_bytes,
        body_timeout=body_timeout,
        head_timeout=head_timeout,
        send_timeout=send_timeout,
        max_intake=max_intake,
        shutdown_grace=shutdown_grace,
        log_level=log_level,
    )
    tok = model_tokenizer(model, tokenizer)
    if tok is None:
        raise UserError(
            f"'{model}' holds no tokenizer; name one with --tokenizer DIR (the server returns text)."
        )
    if chat_template is not None and not file:  # a name: one of the tokenizer's, checked before the load
        template = chat_template_by_name(tok, chat_template)
        options = dataclasses.replace(options, chat_template=template)
    if template is None:  # the tokenizer's own renders every chat: a broken one is refused now, not per chat
        check_chat_template(tok, f"--tokenizer '{tokenizer}'" if tokenizer else f"the tokenizer in '{model}'")
    executor = resolve_executor(model, executor)
    config = sizing.default_scheduler_config(None, max_num_seqs)
    if max_num_batched_tokens is not None:
        config = dataclasses.replace(config, max_num_batched_tokens=max_num_batched_tokens)
    if max_prefill_tokens_with_decodes is not None:
        config = dataclasses.replace(config, max_prefill_tokens_with_decodes=max_prefill_tokens_with_decodes)
    limits = (max_num_seqs, max_num_batched_tokens, max_prefill_tokens_with_decodes)
    if executor != "torch" and all(x is None for x in limits):
        # a step engine's profiles, a slot graph's export sizes bound the batch: their own limits are the
        # defaults (256 sequences, the server's default, made a slot graph of --max-batch 8 refuse to load)
        config = None
    sizes = {
        "num_blocks": num_blocks,
        "max_model_len": max_model_len,
        "config": config,
        "gpu_memory_utilization": gpu_memory_utilization,
        "speculative": speculative_config(speculative_method, speculative_model, num_speculative_tokens),
    }
    check_draft_tokenizer_option(sizes["speculative"], tok, tokenizer, model)
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
    if executor != "torch" and tensor_parallel_size != 1:
        raise UserError(
            f"--tensor-parallel-size applies to the torch executor; '{model}' runs on {executor}."
        )
    # a port in use is said now, not after the model loads (minutes for a large one)
    sock = listen(host, port)
    try:
        with arguments_as_flags():  # the loader's refusals name its arguments: here, the flags that set them
            if executor == "torch":
                llm = from_pretrained(model, **sizes, **torch_kw)
            else:
                llm = load(model, executor, **sizes, **torch_kw)
    except BaseException:
        sock.close()
        raise
    sized = getattr(llm, "pool_size", None)
    if sized is not None:  # the startup line: the pool and what its sizing set aside (graphs included)
        print(
            f"trtforge serve: KV pool of {sized.num_blocks:,} blocks "
            f"({sized.num_blocks * sized.block_bytes / 2**30:.2f} GiB) = {sized.how}",
            file=sys.stderr,
            flush=True,
        )
    facts = llm.executor.facts
    try:
        _check_pool_length(max_model_len, num_blocks, facts.num_blocks, facts.block_size, facts.max_model_len)
    except BaseException:
        sock.close()
        llm.close()
        raise
    name = Path(model.rstrip("/")).name or model
    run(llm, tok, name, options, aliases=tuple(dict.fromkeys([model, model.rstrip("/") or model])), sock=sock)


def _check_pool_length(
    asked: int | None, num_blocks: int | None, blocks: int, block_size: int, context: int
) -> None:
    """UserError naming --max-model-len when the KV pool (`blocks` blocks of `block_size` tokens; given as
    --num-blocks `num_blocks`, else sized) holds fewer tokens than the `asked` length; a warning when no
    length was asked and it holds fewer than the `context` the model runs. The scheduler cuts every
    sequence to what the pool holds, and the server told only its clients, as "this model's maximum
    context length": `serve --max-model-len 2048 --num-blocks 1` served 16 tokens without a word."""
    import warnings

    from trtforge.errors import TrtforgeWarning, UserError

    capacity = blocks * block_size
    wanted = context if asked is None else asked
    if capacity >= wanted:
        return
    pool = f"--num-blocks {num_blocks}" if num_blocks is not None else "sized to this machine"
    holds = (
        f"the KV pool ({pool}: {blocks:,} block(s) of {block_size} tokens) holds {capacity:,} tokens of a "
        "sequence"
    )
    need = -(-wanted // block_size)
    if asked is not None:
        raise UserError(
            f"--max-model-len {asked}: {holds}; give --num-blocks {need:,} or more, or --max-model-len "
            f"{capacity:,} or less."
        )
    warnings.warn(
        f"{holds}, fewer than the model's context of {context:,}: requests are limited to {capacity:,} "
        "tokens (prompt + output; clients are told it is the model's maximum context length). Give "
        f"--num-blocks {need:,} or more for the whole context, or --max-model-len {capacity:,} to make the "
        "limit explicit.",
        TrtforgeWarning,
        stacklevel=2,
    )


def _is_template_file(value: str) -> bool:
    """Whether ``--chat-template VALUE`` names a file (it exists, or reads as a path: a separator, a suffix
    or empty) rather than one of the tokenizer's named templates (``default``, ``tool_use``)."""
    import os

    return value == "" or os.path.isfile(value) or "/" in value or os.sep in value or Path(value).suffix != ""
