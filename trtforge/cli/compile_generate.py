"""`trtforge compile MODEL --generate`: the option group and the dispatch to the decoder step compiler.

compile_cmd adds :func:`generate_options` and hands over to :func:`run_generate` when --generate is
set; only the options that make sense for a step engine are read, the others are refused by name.
"""

from __future__ import annotations

from typing import Any

import click

from trtforge.cli._options import given_flags, read_prompt_ids

# compile options a step engine has no use for (profiles and precision come from --generate's own).
_UNUSED = (
    "shapes",
    "dynamic",
    "output_names",
    "opset",
    "streams",
    "aux_streams",
    "version_compatible",
    "names",
    "attention",
    "keep_fp32",
    "data",
    "calib_cache",
    "accuracy_target",
    "report_dir",
    "timing_cache",
    # the step compile runs its own checks and precision stages: INT8 is SmoothQuant (alpha 0.8) on
    # max-calibrated prompts of token ids (no tokenizer), the rest FP16 with FP32 logits
    "verify",
    "keep_io_types",
    "int8_rest",
    "calib_method",
    "calib_samples",
    "smoothquant",
    "no_smoothquant",
    "tokenizer",
)


def generate_options(fn: Any) -> Any:
    """The --generate option group of `trtforge compile`."""
    options = [
        click.option(
            "--generate",
            is_flag=True,
            help="MODEL is a Hugging Face causal LM (module:factory or save_pretrained dir) of a supported "
            "decoder family (README, 'LLMs (decoders)'; any other is refused naming its model type): build "
            "ONE KV-cache step engine with a prefill and a decode profile "
            "(default precision fp16; int8 = SmoothQuant W8A8 and fp8 = E4M3 W8A8, both calibrated on "
            "--calib-data prompts (fp8: random tokens without); int4 = weight-only, blocks of 128).",
        ),
        click.option(
            "--max-seq",
            type=click.IntRange(min=2),
            default=None,
            help="--generate: KV-cache length per sequence (prompt + new tokens); default: the model's "
            "positions (max_position_embeddings / n_positions), at most 2048. One past the positions the "
            "model is made for (as a static rotary scaling extends them) is refused.",
        ),
        click.option(
            "--max-batch",
            type=click.IntRange(min=1),
            default=8,
            show_default=True,
            help="--generate: most sequences per step.",
        ),
        click.option(
            "--max-prefill",
            type=click.IntRange(min=1),
            default=None,
            help="--generate: longest prompt in one prefill step (default: --max-seq).",
        ),
        click.option(
            "--cache-layout",
            type=click.Choice(["slot", "paged"]),
            default="slot",
            show_default=True,
            help="--generate: KV cache as one [B, Hkv, max_seq, D] slot per sequence, or paged block pools "
            "[num_blocks, block_size, Hkv, D] read through block tables (served by trtforge.llm).",
        ),
        click.option(
            "--block-size",
            type=click.IntRange(min=1),
            default=None,
            help="--generate --cache-layout paged: tokens per cache block (default 16).",
        ),
        click.option(
            "--num-blocks",
            type=click.IntRange(min=2),
            default=None,
            help="--generate --cache-layout paged: most blocks in the engine's pools, one of them the "
            "scratch block (default: max_batch * ceil(max_seq / block_size) + 1).",
        ),
        click.option(
            "--all-logits",
            is_flag=True,
            help="--generate: output logits [B, S, V] of every new position, not only the last.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def run_generate(ctx: click.Context, model: str, params: dict[str, Any]) -> None:
    """Compile MODEL with --generate from compile_cmd's parsed parameters and print the result."""
    from rich.console import Console

    from trtforge.cli._render import (
        generation_line,
        manifest_tables,
        plain,
        print_all,
        stage_summary_table,
        timings_table,
    )
    from trtforge.llm.compile.compile import compile_generate

    given = given_flags(ctx, [name for name in _UNUSED if name in params])
    if given:
        raise click.UsageError(f"{', '.join(given)} cannot be combined with --generate.")
    precision = params.get("mode", "fp16") if given_flags(ctx, ["mode"]) else "fp16"
    if params.get("calib_data") is not None:  # an input the compile session does not see (it gets ids)
        from trtforge._fileio import refuse_overwriting_inputs
        from trtforge.core.manifest import manifest_path_for
        from trtforge.core.onnx_io import external_data_path

        save_onnx = params.get("save_onnx")
        outputs = {"-o (engine)": params["output"], "--save-onnx": save_onnx}
        outputs["--save-onnx's external data file"] = external_data_path(save_onnx) if save_onnx else None
        outputs["the manifest"] = manifest_path_for(params["output"]) if params["output"] else None
        refuse_overwriting_inputs(outputs, {"--calib-data file": params["calib_data"]})
    prompts = read_prompt_ids(params["calib_data"]) if params.get("calib_data") is not None else None
    quiet = bool(params.get("quiet"))
    console = Console(quiet=quiet)
    result = compile_generate(
        model,
        params["output"],
        max_seq=params["max_seq"],
        max_batch=params["max_batch"],
        max_prefill=params["max_prefill"],
        precision=precision,
        all_logits=bool(params.get("all_logits")),
        cache_layout=params.get("cache_layout") or "slot",
        block_size=params.get("block_size"),
        num_blocks=params.get("num_blocks"),
        calib_prompts=prompts,
        exporter=params.get("exporter", "auto"),
        passes=not params.get("no_passes", False),
        save_onnx=params.get("save_onnx"),
        backend=params.get("backend"),
        targets=list(params.get("targets") or []) or None,
        opt_level=params.get("opt_level"),
        workspace_mb=params.get("workspace_mb"),
        force=bool(params.get("force")),
        progress=not quiet,
        log=lambda msg: console.print(f"[dim]•[/dim] {plain(msg)}"),
    )
    summary = stage_summary_table(result.records)
    stages = [summary] if summary else []
    print_all(console, [timings_table(result.timings), *stages, *manifest_tables(result.manifest)])
    console.print(generation_line(result.manifest.generation))
    console.print(f"[green]wrote[/green] {plain(result.engine_path)} and {plain(result.manifest_path)}")


_GENERATE_ONLY = (
    "max_seq",
    "max_batch",
    "max_prefill",
    "all_logits",
    "cache_layout",
    "block_size",
    "num_blocks",
)


def refuse_generate_options(ctx: click.Context) -> None:
    """Without --generate, the step-engine options do not apply: refuse them by name, never drop them."""
    given = given_flags(ctx, _GENERATE_ONLY)
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise click.UsageError(f"{', '.join(given)} only {verb} with --generate (a KV-cache step engine).")
