"""`trtforge export-triton`: engine -> Triton Inference Server model repository."""

from __future__ import annotations

import click

EXAMPLES = """\b
Examples:
  trtforge export-triton bert.engine -o model_repository
  trtforge export-triton bert.engine -o repo --name bert --max-batch 16 \\
      --instances 2 --preferred-batch-size 8 --max-queue-delay-us 100
  trtforge export-triton bert-v2.engine -o repo --name bert --version 2
\b
Writes REPO/NAME/config.pbtxt and REPO/NAME/VERSION/model.plan (VERSION 1 unless
--version), then prints the config. An existing REPO/NAME is replaced only with --force
(whole: every version goes). Without it the engine is added as a new VERSION beside the
versions there when the config.pbtxt it needs is the one there (Triton serves every
version of a model with one config, and by default only the highest); else the export is
refused. The model or version appears complete or not at all: a failed or interrupted
export leaves the repository as it was. Triton must run the engine's TensorRT version on
a GPU of the compute capability it was built for. A decoder step engine (compile
--generate) is refused: Triton runs each request as one step, with no KV cache between
steps nor sampling; serve it with `trtforge serve`.
\b
Concurrent instances of a dynamic-shape engine need one optimization profile each: build
with `trtforge compile --streams N` and pass --instances N (each instance gets its own
profile). Without --no-validate the config is parsed with tritonclient's protobuf
(pip install "tritonclient[grpc]").
"""


@click.command("export-triton", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("engine", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", "repo", required=True, type=click.Path(file_okay=False), help="Model repository."
)
@click.option("--name", default=None, help="Model name (default: the engine file's stem).")
@click.option(
    "--max-batch",
    type=click.IntRange(min=0),
    default=None,
    help=(
        "max_batch_size (0 disables batching). Triton batches requests along axis 0 of every input and "
        "output. Default: the largest batch every profile allows, or 0 with a note where axis 0 is not "
        "the batch everywhere (static, or named otherwise in the model: [seq, batch, ...]); a value > 0 is "
        "refused where axis 0 cannot be the batch, and taken as your word where only its name is unlike "
        "a batch's."
    ),
)
@click.option(
    "--instances",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Model instances (execution contexts) on the GPU.",
)
@click.option(
    "--dynamic-batching/--no-dynamic-batching",
    default=None,
    help="Triton's dynamic batcher (default: on when max batch > 1).",
)
@click.option(
    "--preferred-batch-size",
    "preferred",
    multiple=True,
    type=int,
    help="Batch size the dynamic batcher aims for. Repeatable.",
)
@click.option(
    "--max-queue-delay-us",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Dynamic batcher: microseconds a request may wait for others to batch with.",
)
@click.option(
    "--version",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Model version: the engine goes to REPO/NAME/VERSION/model.plan.",
)
@click.option("--force", is_flag=True, help="Replace an existing model directory (all its versions).")
@click.option("--no-validate", is_flag=True, help="Skip parsing the config with tritonclient's protobuf.")
def export_triton_cmd(
    engine: str,
    repo: str,
    name: str | None,
    max_batch: int | None,
    instances: int,
    dynamic_batching: bool | None,
    preferred: tuple[int, ...],
    max_queue_delay_us: int,
    version: int,
    force: bool,
    no_validate: bool,
) -> None:
    """Export ENGINE (with its .engine.json manifest) as a Triton model."""
    from trtforge._fileio import show_path
    from trtforge.compiler.triton import TritonOptions, export_triton

    result = export_triton(
        engine,
        repo,
        TritonOptions(
            name=name,
            max_batch=max_batch,
            instances=instances,
            dynamic_batching=dynamic_batching,
            preferred_batch_sizes=list(preferred),
            max_queue_delay_us=max_queue_delay_us,
            force=force,
            validate=not no_validate,
            version=version,
        ),
    )
    click.echo(result.config_text)
    if result.note:
        click.secho(f"note: {result.note}", fg="yellow", err=True)
    state = "validated with tritonclient's model_config protobuf" if result.validated else "NOT validated"
    if result.added_version:
        where = f"version {result.version} into {show_path(result.model_dir)}, its config.pbtxt unchanged"
    else:
        where = show_path(result.model_dir)
    click.secho(f"wrote {where} (max_batch_size {result.max_batch_size}; {state})", fg="green")
