"""`trtforge compile`: model -> ONNX -> engine + manifest, with per-stage times."""

from __future__ import annotations

import click

from trtforge.cli._options import smoothquant_options
from trtforge.cli.compile_generate import generate_options

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
opt from the example inputs); they are printed so you can paste and adjust them.
"""


@click.command("compile", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Engine file to write.")
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="NAME:MIN:OPT:MAX",
    help="Profile range of a dynamic input, dims as 1x16 (like trtexec). Repeatable.",
)
@click.option(
    "--dynamic", default=None, metavar="AXES", help="For module/factory: dynamic axes, e.g. batch,seq."
)
@click.option(
    "--output-name", "output_names", multiple=True, help="Name ONNX outputs in order (module/factory)."
)
@click.option(
    "--exporter", type=click.Choice(["auto", "dynamo", "legacy"]), default="auto", show_default=True
)
@click.option("--opset", type=int, default=None, help="ONNX opset for export (default: the exporter's).")
@click.option("--opt-level", type=click.IntRange(0, 5), default=None, help="Builder optimization level 0-5.")
@click.option("--workspace", "workspace_mb", type=click.IntRange(min=1), default=None, help="Workspace MiB.")
@click.option("--timing-cache", type=click.Path(dir_okay=False), default=None, help="Timing cache to reuse.")
@click.option(
    "--streams",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Copies of each profile, so N execution contexts can run concurrently.",
)
@click.option(
    "--aux-streams", type=click.IntRange(min=0), default=None, help="Max auxiliary streams per context."
)
@click.option(
    "--target", "targets", multiple=True, metavar="SMxx", help="TensorRT-RTX target compute capability."
)
@click.option(
    "--backend",
    type=click.Choice(["tensorrt", "tensorrt_rtx"]),
    default=None,
    help="Force a backend (default: $TRTFORGE_BACKEND, else tensorrt, else tensorrt_rtx).",
)
@click.option(
    "--version-compatible",
    is_flag=True,
    help="Datacenter TensorRT: an engine later TensorRT versions can load (lean-runtime ops only).",
)
@click.option(
    "--passes",
    default=None,
    metavar="LIST",
    help="Comma-separated fusion passes (default: the full pipeline; see `trtforge optimize -h`).",
)
@click.option("--no-passes", is_flag=True, help="Skip the fusion passes.")
@click.option(
    "--attention",
    type=click.Choice(["native", "plugin", "none"]),
    default=None,
    help="Attention lowering (default: native for fp16/bf16 graphs, none for fp32).",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Check every pass with ONNX Runtime (skipped automatically above 2 GiB of weights).",
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "bf16", "int8"]),
    default="fp32",
    show_default=True,
    help="Compute precision written into the graph.",
)
@click.option(
    "--keep-fp32",
    "keep_fp32",
    multiple=True,
    metavar="NODE_OR_OPTYPE",
    help="Keep this node or op type in FP32 (fp16/bf16). Repeatable.",
)
@click.option(
    "--keep-io-types/--low-precision-io",
    default=True,
    show_default=True,
    help="Graph inputs/outputs stay FP32.",
)
@click.option(
    "--precision-data", default=None, metavar="DATA", help="Sample inputs for the FP16 range check."
)
@click.option(
    "--calib-data",
    default=None,
    metavar="DATA",
    help="INT8 calibration data: .npz, directory, sentences.txt (+ --tokenizer), module:function.",
)
@click.option(
    "--calib-method",
    type=click.Choice(["max", "percentile", "entropy", "mse"]),
    default="entropy",
    show_default=True,
)
@click.option(
    "--calib-samples", type=click.IntRange(min=1), default=None, help="Calibrate on at most N samples."
)
@click.option(
    "--calib-cache",
    type=click.Path(dir_okay=False),
    default=None,
    help="TensorRT-format calibration cache: read if it exists (skips statistics), else written.",
)
@click.option(
    "--accuracy-target", type=float, default=None, help="INT8: fall back layers until cosine >= this."
)
@smoothquant_options("INT8: ")
@click.option(
    "--int8-rest",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    default="fp16",
    show_default=True,
    help="INT8: precision of what stays unquantized.",
)
@click.option("--tokenizer", default=None, help="Tokenizer for text data: a local HF path, or 'demo'.")
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
    shapes: tuple[str, ...],
    dynamic: str | None,
    output_names: tuple[str, ...],
    exporter: str,
    opset: int | None,
    opt_level: int | None,
    workspace_mb: int | None,
    timing_cache: str | None,
    streams: int,
    aux_streams: int | None,
    targets: tuple[str, ...],
    backend: str | None,
    version_compatible: bool,
    passes: str | None,
    no_passes: bool,
    attention: str | None,
    verify: bool,
    precision: str,
    keep_fp32: tuple[str, ...],
    keep_io_types: bool,
    precision_data: str | None,
    calib_data: str | None,
    calib_method: str,
    calib_samples: int | None,
    calib_cache: str | None,
    accuracy_target: float | None,
    smoothquant: float | None,
    no_smoothquant: bool,
    int8_rest: str,
    tokenizer: str | None,
    report_dir: str | None,
    save_onnx: str | None,
    force: bool,
    quiet: bool,
    generate: bool,
    **generate_kw: object,
) -> None:
    """Compile MODEL into a TensorRT engine (OUT.engine) plus its manifest (OUT.engine.json)."""
    if generate:
        from trtforge.cli.compile_generate import run_generate

        return run_generate(ctx, model, ctx.params)
    from rich.console import Console

    from trtforge.cli._render import manifest_tables, print_all, stage_summary_table, timings_table
    from trtforge.compiler.pipeline import compile_model
    from trtforge.compiler.stages import PassOptions, PrecisionOptions

    if no_passes and (passes or attention):
        raise click.UsageError("--no-passes cannot be combined with --passes or --attention.")
    pass_options = (
        None
        if no_passes
        else PassOptions(
            names=[p.strip() for p in passes.split(",") if p.strip()] if passes else None,
            attention=attention,
            verify=verify,
        )
    )
    precision_options = PrecisionOptions(
        mode=precision,
        keep_fp32=keep_fp32,
        keep_io_types=keep_io_types,
        data=precision_data,
        int8_rest=int8_rest,
        calib_data=calib_data,
        calib_method=calib_method,
        calib_samples=calib_samples,
        calib_cache=calib_cache,
        accuracy_target=accuracy_target,
        smoothquant=None if no_smoothquant else smoothquant,
        tokenizer=tokenizer,
        progress=not quiet,
    )
    console = Console(stderr=False, quiet=quiet)
    result = compile_model(
        model,
        output=output,
        dynamic=dynamic,
        output_names=list(output_names) or None,
        opset=opset,
        exporter=exporter,
        shapes=list(shapes) or None,
        opt_level=opt_level,
        workspace_mb=workspace_mb,
        timing_cache=timing_cache,
        streams=streams,
        aux_streams=aux_streams,
        targets=list(targets) or None,
        backend=backend,
        version_compatible=version_compatible,
        passes=pass_options,
        precision=precision_options,
        save_onnx=save_onnx,
        force=force,
        progress=not quiet,
        log=lambda msg: console.print(f"[dim]•[/dim] {msg}"),
    )
    summary = stage_summary_table(result.records)
    print_all(
        console,
        [timings_table(result.timings), *([summary] if summary else []), *manifest_tables(result.manifest)],
    )
    console.print(f"[green]wrote[/green] {result.engine_path} and {result.manifest_path}")
    if report_dir is not None:
        _write_report(model, result, report_dir, output_names, tokenizer, quiet, console)


def _write_report(model, result, report_dir, output_names, tokenizer, quiet, console) -> None:
    """The compile's companion report: the source model's variants (and the engine where it can run)."""
    from trtforge.compiler.export import load_factory
    from trtforge.reports.api import build_report

    if model.endswith(".onnx"):
        source = model
    elif model.endswith(".pt2"):
        source = str(result.engine_path)
    else:
        source = load_factory(model)
    report = build_report(
        source,
        out_dir=report_dir,
        output_names=list(output_names) or None,
        tokenizer=tokenizer,
        progress=not quiet,
    )
    console.print(f"[green]report[/green] {report.html_path}")
