"""`trtforge compile`: model -> ONNX -> engine + manifest, with per-stage times."""

from __future__ import annotations

from typing import Any

import click

from trtforge.cli._options import fields_of, from_params, option_group, passes_from_params
from trtforge.cli.compile_generate import generate_options, refuse_generate_options
from trtforge.compiler.build import BuildOptions
from trtforge.core.policy import ExportOptions, PassOptions, PrecisionOptions

EXAMPLES = """\b
MODEL is one of:
  model.onnx               an ONNX file (external data beside it is fine)
  model.pt2                a torch.export archive with example inputs
  pkg.module:factory       a callable returning (nn.Module, example_inputs); the
                           current directory is importable
\b
Examples:
  trtforge compile model.onnx -o model.engine
  trtforge compile mypkg.bert:make -o bert.engine --dynamic batch,seq \\
      --shape input_ids:1x1:8x128:32x512 --shape attention_mask:1x1:8x128:32x512
  trtforge compile model.onnx -o model.engine --streams 4 --target SM89
  trtforge compile model.onnx -o model.engine --precision fp16 --keep-fp32 Gelu
  trtforge compile model.onnx -o model.engine --precision int8 --int8-rest fp16 \\
      --calib-data sentences.txt --tokenizer demo --calib-method entropy
  trtforge compile ./llama-dir --generate -o llm.engine --max-seq 4096 --max-batch 8
\b
Stages: export -> fusion passes (verified by ONNX Runtime; --no-passes to skip) ->
precision (fp16/bf16 casts, or INT8 Q/DQ calibrated on --calib-data) -> build.
Attention is fused into TensorRT's attention layer when the graph is FP16/BF16
(--attention native); an FP32 graph keeps the decomposed form (TensorRT's fused
attention does not build in FP32). Verification is skipped above 2 GiB of weights.
\b
Dynamic inputs without --shape get derived ranges (dim 0: 1..32, others 1..512,
opt from the example inputs, else 8 and 128), within the model's known limits (a Hugging Face
config's positions or image size, a position table in the graph); they are
printed so you can paste and adjust them. A --shape beyond a known limit is
refused. Before the build the graph runs in ONNX Runtime at each profile's MIN
and MAX (skipped above 2 GiB of weights): a range it cannot run exits 2.
Export options (--dynamic, --output-name, --opset, --exporter) and options of
another precision are refused where they do not apply.
"""


@click.command("compile", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Engine file to write.")
@option_group(BuildOptions)
@option_group(ExportOptions, scope="Torch sources (module, factory, .pt2): ")
@option_group(PassOptions, exclude=("debug",))
@click.option("--no-passes", is_flag=True, help="Skip the fusion passes.")
@option_group(
    PrecisionOptions,
    more_help={
        "calib_data": "With --generate: a text file of token-id prompts (one prompt per line, "
        "space-separated ids, no tokenizer; at most 1,024 prompts), required by --precision int8 and "
        "optional for fp8 (random tokens without); refused with the other precisions.",
    },
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Also write an accuracy/latency report (HTML, Markdown, JSON) of the model's variants here.",
)
@click.option("--save-onnx", type=click.Path(dir_okay=False), default=None, help="Also write the final ONNX.")
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@generate_options
@click.pass_context
def compile_cmd(
    ctx: click.Context,
    model: str,
    output: str,
    no_passes: bool,
    report_dir: str | None,
    save_onnx: str | None,
    force: bool,
    quiet: bool,
    generate: bool,
    **params: Any,
) -> None:
    """Compile MODEL into a TensorRT engine (OUT.engine) plus its manifest (OUT.engine.json)."""
    if generate:
        from trtforge.cli.compile_generate import run_generate

        return run_generate(ctx, model, ctx.params)
    refuse_generate_options(ctx)
    from rich.console import Console

    from trtforge.cli._render import manifest_tables, plain, print_all, stage_summary_table, timings_table
    from trtforge.compiler.pipeline import compile_model

    pass_options = passes_from_params(params, no_passes)
    precision = from_params(PrecisionOptions, params, progress=not quiet)
    export = from_params(ExportOptions, params)
    build = from_params(BuildOptions, params, progress=not quiet)
    console = Console(stderr=False, quiet=quiet)
    if report_dir is not None:
        _check_report_dir(report_dir, output, save_onnx, precision.calib_cache, build.timing_cache)
    result = compile_model(
        model,
        output=output,
        **fields_of(export),
        **fields_of(build),
        passes=pass_options,
        precision=precision,
        save_onnx=save_onnx,
        force=force,
        log=lambda msg: console.print(f"[dim]•[/dim] {plain(msg)}"),
    )
    summary = stage_summary_table(result.records)
    print_all(
        console,
        [timings_table(result.timings), *([summary] if summary else []), *manifest_tables(result.manifest)],
    )
    console.print(f"[green]wrote[/green] {plain(result.engine_path)} and {plain(result.manifest_path)}")
    if report_dir is not None:
        _write_report(model, result, report_dir, export.output_names or (), precision, quiet, console)


def _check_report_dir(
    report_dir: str, output: str, save_onnx: Any, calib_cache: Any, timing_cache: Any
) -> None:
    """Refuse a --report directory that is an existing file or one of the compile's own output files
    before anything is built: the report is written last, so it failed only after the engine was out."""
    from trtforge._fileio import check_distinct_outputs
    from trtforge.core.manifest import manifest_path_for
    from trtforge.reports.api import check_out_dir

    check_out_dir(report_dir)
    check_distinct_outputs(
        {
            "-o (engine)": output,
            "the manifest": manifest_path_for(output),
            "--save-onnx": save_onnx,
            "--calib-cache": calib_cache,
            "--timing-cache": timing_cache,
            "--report": report_dir,
        }
    )


def _write_report(model, result, report_dir, output_names, precision, quiet, console) -> None:
    """The compile's companion report: the source model's variants (and the engine where it can run),
    with this compile's INT8 settings."""
    from trtforge._usercode import load_factory
    from trtforge.cli._render import plain
    from trtforge.reports.api import build_report

    if model.lower().endswith(".onnx"):
        source = model
    elif model.lower().endswith(".pt2"):
        source = str(result.engine_path)
    else:
        source = load_factory(model)
    report = build_report(
        source,
        out_dir=report_dir,
        output_names=list(output_names) or None,
        tokenizer=precision.tokenizer,
        calibration_data=precision.calib_data,
        calibration_options={"method": precision.calib_method, "smoothquant": precision.smoothquant},
        int8_rest=precision.int8_rest,
        progress=not quiet,
    )
    console.print(f"[green]report[/green] {plain(report.html_path)}")
