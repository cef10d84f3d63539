"""`trtforge report`: accuracy and latency of torch / ONNX Runtime variants / TensorRT side by side."""

from __future__ import annotations

from typing import Any

import click

from trtforge.cli._options import from_params, option_group
from trtforge.compiler.policy import ExportOptions, PrecisionOptions

EXAMPLES = """\b
MODEL_OR_ENGINE is one of:
  model.onnx               an ONNX file
  model.engine             an engine built by trtforge (its .engine.json beside it)
  pkg.module:factory       a callable returning (nn.Module, example_inputs)
\b
Targets (default: all that apply): torch, torch-cuda, ort, ort-fused, ort-fp16,
ort-bf16, ort-int8, trt, trt-fp16, trt-int8, onnx=PATH (any other ONNX file).
Targets that cannot run here keep their row and say why.
\b
Examples:
  trtforge report trtforge.demo:minilm_factory -o build/report \\
      --data sentences.txt --tokenizer demo --output-name last_hidden_state \\
      --output-name sentence_embedding
  trtforge report model.onnx -o out --targets ort,ort-fp16 --data inputs.npz \\
      --tolerance logits:atol=1e-2,cosine=0.999 --batch 1,8,32 --seq 128
  trtforge report model.engine -o out --check
\b
--data: .npz (input name -> array, leading sample axis), a directory of .npz/.npy,
a text file of sentences (with --tokenizer), or module:function; default:
inputs generated from the model's input specs (token ids within the vocabulary,
0/1 attention masks).
--tolerance [TARGET/]OUTPUT:atol=..,rtol=..,cosine=..,snr=..,top1=.. (an empty
OUTPUT means every output; 'none' disables a check). Repeatable.
Writes OUT/report.html (tables and plots), OUT/report.md and OUT/report.json
(schema: trtforge/reports/report.schema.json).
Exit codes: 0 ok, 2 bad input, 3 with --check when an output fails its tolerance.
"""


class AccuracyCheckFailed(click.ClickException):
    """--check found an output outside its tolerance (exit code 3)."""

    exit_code = 3


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated integers, got '{text}'", param_hint=what
        ) from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected positive integers, got '{text}'", param_hint=what)
    return values


@click.command("report", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False), help="Report directory.")
@click.option(
    "--targets", "targets", multiple=True, metavar="A,B,...", help="Targets to compare. Repeatable."
)
@click.option(
    "--reference", default=None, help="Target the others are compared with (default torch, else ort)."
)
@click.option("--data", default=None, help="Accuracy inputs (see below); default: generated.")
@click.option(
    "--calibration-data", default=None, help="INT8 calibration data (default: --data, else generated)."
)
@option_group(PrecisionOptions, only=("calib_method", "smoothquant", "int8_rest", "tokenizer"))
@click.option("--batch", "batch", default="1,8", show_default=True, help="Batch sizes of the latency sweep.")
@click.option("--seq", "seq", default="128", show_default=True, help="Sequence lengths of the latency sweep.")
@click.option(
    "--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Warm-up runs per point."
)
@click.option(
    "--runs", type=click.IntRange(min=1), default=20, show_default=True, help="Timed runs per point."
)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ORT intra-op and torch threads.")
@click.option("--tolerance", "tolerances", multiple=True, metavar="[T/]OUT:k=v,...", help="Repeatable.")
@option_group(ExportOptions, only=("output_names",), scope="Torch sources (module, factory): ")
@click.option("--check", is_flag=True, help="Exit 3 when a compared output fails its tolerance.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def report_cmd(
    model: str,
    out_dir: str,
    targets: tuple[str, ...],
    reference: str | None,
    data: str | None,
    calibration_data: str | None,
    batch: str,
    seq: str,
    warmup: int,
    runs: int,
    threads: int | None,
    tolerances: tuple[str, ...],
    output_names: tuple[str, ...],
    check: bool,
    no_progress: bool,
    **params: Any,
) -> None:
    """Compare accuracy and latency of MODEL_OR_ENGINE across runtimes and precisions."""
    from pathlib import Path

    from trtforge.reports.api import build_report
    from trtforge.reports.compare import parse_tolerance

    source: object = model
    if not Path(model).exists() and ":" in model:
        from trtforge.compiler.export import load_factory

        source = load_factory(model)
    names = [n for t in targets for n in t.split(",") if n.strip()] or None
    tol = dict(parse_tolerance(t) for t in tolerances)
    policy = from_params(PrecisionOptions, params)
    calib = {"method": policy.calib_method, "smoothquant": policy.smoothquant}
    result = build_report(
        source,
        targets=names,
        data=data,
        out_dir=out_dir,
        reference=reference,
        batch_sizes=_ints(batch, "--batch"),
        seq_lens=_ints(seq, "--seq"),
        warmup=warmup,
        runs=runs,
        tolerances=tol or None,
        progress=not no_progress,
        calibration_data=calibration_data,
        calibration_options=calib,
        int8_rest=policy.int8_rest,
        tokenizer=policy.tokenizer,
        threads=threads,
        output_names=output_names or None,
    )
    from trtforge.reports.cells import headline

    click.echo(headline(result.report))
    for label, path in (
        ("html", result.html_path),
        ("markdown", result.markdown_path),
        ("json", result.json_path),
    ):
        click.echo(f"{label:9s}{path}")
    failed = result.report.summary()["accuracy_failed"]
    if check and failed:
        raise AccuracyCheckFailed(
            f"accuracy check failed: {failed} output(s) outside tolerance (see the report)"
        )
