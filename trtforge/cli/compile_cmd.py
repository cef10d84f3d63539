"""`trtforge compile`: model -> ONNX -> engine + manifest, with per-stage times."""

from __future__ import annotations

import click

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
@click.option("--save-onnx", type=click.Path(dir_okay=False), default=None, help="Also write the final ONNX.")
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
def compile_cmd(
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
    save_onnx: str | None,
    force: bool,
    quiet: bool,
) -> None:
    """Compile MODEL into a TensorRT engine (OUT.engine) plus its manifest (OUT.engine.json)."""
    from rich.console import Console

    from trtforge.cli._render import manifest_tables, print_all, timings_table
    from trtforge.compiler.pipeline import compile_model

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
        save_onnx=save_onnx,
        force=force,
        progress=not quiet,
        log=lambda msg: console.print(f"[dim]•[/dim] {msg}"),
    )
    print_all(console, [timings_table(result.timings), *manifest_tables(result.manifest)])
    console.print(f"[green]wrote[/green] {result.engine_path} and {result.manifest_path}")
