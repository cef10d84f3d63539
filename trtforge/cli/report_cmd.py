"""`trtforge report`: accuracy and latency of torch / ONNX Runtime variants / TensorRT side by side."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from trtforge._fileio import show_path
from trtforge.cli._options import from_params, given_flags, option_group
from trtforge.core.policy import ExportOptions, PrecisionOptions
from trtforge.errors import UserError
from trtforge.reports.results import FAILED, NOT_RUN, OK, Report

# How reports/api.py words a target that could not run the accuracy inputs.
REJECTED = "accuracy inputs rejected or run failed"

EXAMPLES = """\b
MODEL_OR_ENGINE is one of:
  model.onnx               an ONNX file
  model.engine             an engine built by trtforge (its .engine.json beside it)
  pkg.module:factory       a callable returning (nn.Module, example_inputs)
\b
Targets (default: all that apply): torch, torch-cuda, ort, ort-fused, ort-fp16,
ort-bf16, ort-int8, trt, trt-fp16, trt-int8, onnx=PATH (any other ONNX file; a
comma in PATH is kept unless a target name follows it; --targets onnx=PATH alone
takes PATH whole).
Targets that cannot run here keep their row and say why. A model with nothing
INT8 quantizes drops ort-int8/trt-int8 from the default targets (noted); named
with --targets they fail.
\b
Examples:
  trtforge report trtforge.demo:minilm_factory -o build/report \\
      --data sentences.txt --tokenizer demo --output-name last_hidden_state \\
      --output-name sentence_embedding
  trtforge report model.onnx -o out --targets ort,ort-fp16 --data inputs.npz \\
      --tolerance logits:atol=1e-2,cosine=0.999 --batch 1,8,32 --seq 128
  trtforge report model.engine -o out --check
  trtforge report ./llama-dir --generate -o out --text eval.txt \\
      --variants fp8,int4-awq,kv-fp8,onnx-int8,onnx-fp8,onnx-int4
\b
--generate: MODEL is a causal LM (save_pretrained dir or module:factory). Its
variants are compared with the reference (bf16 on a GPU, fp32 on the CPU):
perplexity on --text (--windows windows of --window-len tokens from the text's
second half, the same for every variant; of a larger text only its first 16 MiB,
or as much as the windows need, is read, in whole lines), greedy top-1
agreement, KV bytes per token, and TTFT / inter-token latency / throughput at
each --batch through the serving engine. Variants: fp32, bf16, fp16, fp8, int4-awq, int4-rtn,
fp8+head-fp8, int4-awq+head-fp8 (the LM head in FP8 too), kv-fp8, fp8+kv-fp8
(llm.from_pretrained(quantization=..., lm_head_quantization=..., kv_cache_dtype=...))
and the step graphs onnx-fp32, onnx-int8, onnx-fp8, onnx-int4 (exact ONNX Runtime,
quality only). A variant this trtforge or machine cannot run keeps its row with
the reason.
\b
--data: .npz (input name -> array, leading sample axis), a directory of .npz/.npy,
a text file of sentences (with --tokenizer), or module:function; default:
inputs generated from the model's input specs (token ids within the vocabulary,
0/1 attention masks). A --tokenizer without a text --data or --calibration-data
would tokenize nothing: it is refused (exit 2).
--tolerance [TARGET/]OUTPUT:atol=..,rtol=..,cosine=..,snr=..,top1=.. (an empty
OUTPUT means every output; 'none' disables a check). Repeatable.
Writes OUT/report.html (tables and plots), OUT/report.md and OUT/report.json
(schema: trtforge/reports/report.schema.json). An OUT holding only an earlier
report is replaced whole (staged beside it, then swapped in): a failed or
interrupted run leaves the earlier report as it was. An OUT holding other files
too keeps them; the three files are replaced together.
Exit codes (so a report can gate CI): 0 ok; 2 bad input, including --data the
reference target rejects, --calib-data that does not fit the model, or a torch
module the exporters refuse
(nothing is written then: an earlier report stays), an engine that does not match
its manifest, and a --reference this machine cannot run (the message names the
targets that can); 3 when the reference or any target
that can run on this machine fails, a latency point fails to run (one outside the
model's limits is "not_run"), an output fails its tolerance, or nothing was
compared with the reference. Targets this machine cannot run (no GPU, no TensorRT
runtime: status "not_run") are not failures, but a check that compared nothing
fails. --no-check: exit 0 whatever the results, once the report is written.
"""


class AccuracyCheckFailed(click.ClickException):
    """A runnable target failed, an output is outside its tolerance, or nothing was compared (exit 3)."""

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
@click.option(
    "-o",
    "--output",
    "--out-dir",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Report directory.",
)
@click.option(
    "--targets", "targets", multiple=True, metavar="A,B,...", help="Targets to compare. Repeatable."
)
@click.option(
    "--reference",
    default=None,
    help="Target the others are compared with (default torch, else ort); it must run here.",
)
@click.option("--data", default=None, help="Accuracy inputs (see below); default: generated.")
@option_group(
    PrecisionOptions,
    only=("calib_data", "calib_method", "smoothquant", "int8_rest", "tokenizer"),
    flags={"calib_data": ("--calib-data", "--calibration-data")},
    more_help={"calib_data": "Default: --data, else generated."},
)
@click.option("--batch", "batch", default="1,8", show_default=True, help="Batch sizes of the latency sweep.")
@click.option("--seq", "seq", default="128", show_default=True, help="Sequence lengths of the latency sweep.")
@click.option(
    "--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Warm-up runs per point."
)
@click.option(
    "--runs", type=click.IntRange(min=1), default=20, show_default=True, help="Timed runs per point."
)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ORT intra-op and torch threads.")
@click.option(
    "--tolerance",
    "tolerances",
    multiple=True,
    metavar="[T/]OUT:k=v,...",
    help="Accuracy limits of output OUT (of target T), e.g. logits:atol=1e-2,cosine=0.999; see below. "
    "Repeatable.",
)
@option_group(ExportOptions, only=("output_names",), scope="Torch sources (module, factory): ")
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="Exit 3 when the reference or a target runnable here fails (a latency point too), an output "
    "fails its tolerance, or nothing was compared.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--generate", is_flag=True, help="MODEL is a causal LM: compare its precision variants (below)."
)
@click.option(
    "--text", type=click.Path(dir_okay=False), default=None, help="--generate: text for perplexity."
)
@click.option(
    "--variants",
    multiple=True,
    metavar="A,B,...",
    help="--generate: variants (default: all). Repeatable.",
)
@click.option(
    "--windows", type=click.IntRange(min=1), default=8, show_default=True, help="--generate: windows."
)
@click.option(
    "--window-len",
    type=click.IntRange(min=2),
    default=256,
    show_default=True,
    help="--generate: window tokens.",
)
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="--generate: prompt chunk tokens.",
)
@click.option(
    "--prompt-len",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="--generate: speed prompts.",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(min=2),
    default=32,
    show_default=True,
    help="--generate: tokens per request.",
)
@click.option("--device", default=None, help="--generate: torch device (default: cuda if present, else cpu).")
@click.pass_context
def report_cmd(
    ctx: click.Context,
    model: str,
    out_dir: str,
    targets: tuple[str, ...],
    reference: str | None,
    data: str | None,
    batch: str,
    seq: str,
    warmup: int,
    runs: int,
    threads: int | None,
    tolerances: tuple[str, ...],
    output_names: tuple[str, ...],
    check: bool,
    no_progress: bool,
    generate: bool,
    **params: Any,
) -> None:
    """Compare accuracy and latency of MODEL_OR_ENGINE across runtimes and precisions."""
    _refuse_other_mode(ctx, generate)
    if generate:
        return _run_generate(ctx, model, out_dir, batch, threads, check, not no_progress, params)

    from trtforge.compiler.sources import CHECKPOINT_SUFFIXES, unsupported_source
    from trtforge.reports.api import build_report
    from trtforge.reports.compare import parse_tolerance
    from trtforge.reports.targets import split_targets

    source: object = model
    # module:factory, not a missing file whose path holds a colon ('runs:v1/model.onnx' is a path)
    if not Path(model).exists() and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", model):
        from trtforge._usercode import load_factory
        from trtforge.compiler.export import check_forward

        source = load_factory(model)
        check_forward(*source)  # a factory whose model fails on its own inputs is the user's to fix
    elif Path(model).suffix.lower() in CHECKPOINT_SUFFIXES or Path(model).is_dir():
        raise unsupported_source(Path(model))
    elif Path(model).is_file() and Path(model).suffix.lower() not in (".onnx", ".pt2"):  # (.pt2: load_source)
        from trtforge.core.manifest import read_engine

        read_engine(model)  # refuse a tampered engine, as inspect does
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise UserError(f"-o '{out_dir}' exists and is not a directory.")
    names = split_targets(targets) or None
    tol: dict[str, dict[str, float | None]] = {}
    for text in tolerances:  # the same key twice adds up (a later value of one field wins), never drops
        key, fields = parse_tolerance(text)
        tol.setdefault(key, {}).update(fields)
    calibration_data = params.pop("calib_data")  # (the report's INT8 targets take it, not the policy)
    policy = from_params(PrecisionOptions, params)
    calib = {"method": policy.calib_method, "smoothquant": policy.smoothquant}
    with _unexportable(model):
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
            check_report=lambda report: _refuse_rejected_data(report, data),
        )
    from trtforge.reports.cells import headline

    click.echo(headline(result.report))
    for note in result.report.notes:
        click.echo(f"note: {note}")
    for label, path in (
        ("html", result.html_path),
        ("markdown", result.markdown_path),
        ("json", result.json_path),
    ):
        click.echo(f"{label:9s}{show_path(path)}")
    problems = _failures(result.report)
    if check and problems:
        raise AccuracyCheckFailed("; ".join(problems) + " (see the report)")


@contextlib.contextmanager
def _unexportable(model: str) -> Iterator[None]:
    """A torch module the exporters refuse (ModelNotExportable) is bad input: every target starts from
    its export, so nothing could be compared. Said as one paragraph naming MODEL and the exporters'
    reason, exit 2, nothing written (before: every target "failed", and the report exited 3)."""
    from trtforge.errors import ModelNotExportable

    try:
        yield
    except ModelNotExportable as e:
        raise ModelNotExportable(
            f"'{model}': {e} Every target of a report starts from that ONNX export, so nothing was "
            "compared and no report was written."
        ) from e


def _refuse_rejected_data(report: Report, data: str | None) -> None:
    """The reference target refusing the user's --data is a bad input, not a failed target: a UserError
    before the report is written (an earlier report in -o stays as it was)."""
    ref = next((t for t in report.targets if t.name == report.reference), None)
    if data is None or ref is None or ref.status != FAILED or not (ref.reason or "").startswith(REJECTED):
        return
    reason = (ref.reason or "")[len(REJECTED) :].strip(" :")
    raise UserError(
        f"--data '{data}' does not fit the model: the reference target '{ref.name}' rejected it ({reason})."
    )


def _failures(report: Report) -> list[str]:
    """What makes the report fail: runnable targets that failed, outputs outside their tolerance."""
    failed = [t.name for t in report.targets if t.status == FAILED]
    problems = [f"target(s) failed: {', '.join(failed)}"] if failed else []
    n = report.summary()["accuracy_failed"]
    if n:
        mismatched = [f"{r.target}/{r.output}: {r.reason}" for r in report.accuracy if r.status == FAILED]
        problems.append(
            f"accuracy check failed: {n} output(s) outside tolerance or not comparable"
            + (f" ({'; '.join(mismatched)})" if mismatched else "")
        )
    crashed = [p for p in report.latency if p.status == FAILED]  # (a point it cannot take is "not_run")
    if crashed:
        points = ", ".join(
            f"{p.target} batch {p.batch}" + ("" if p.seq is None else f" seq {p.seq}") for p in crashed
        )
        first = (crashed[0].reason or "")[:200]
        problems.append(f"latency point(s) failed: {points} (first: {first})")
    ref = next((t for t in report.targets if t.name == report.reference), None)
    if report.is_lm and ref is not None and ref.status == NOT_RUN:  # (one that failed is named above)
        problems.append(
            f"the reference '{ref.name}' was not measured ({ref.reason}), so nothing was compared with it"
        )
    if not report.is_lm and not any(r.status == OK for r in report.accuracy):
        problems.append(f"nothing was compared with the reference '{report.reference}'" + _why_none(report))
    return problems


def _why_none(report: Report) -> str:
    """Why no target's outputs were compared with the reference (a check of nothing fails)."""
    ref = next((t for t in report.targets if t.name == report.reference), None)
    if ref is not None and ref.status == NOT_RUN:
        return f": it cannot run here ({ref.reason})"
    others = [t for t in report.targets if t.name != report.reference]
    if not others:
        return ": it is the only target"
    why = [f"{t.name}: {t.reason}" for t in others if t.status == NOT_RUN] or [
        f"{r.target}: {r.reason}" for r in report.accuracy if r.reason
    ]
    return f" ({'; '.join(why)})" if why else ""


_LM_ONLY = ("text", "variants", "windows", "window_len", "chunk", "prompt_len", "new_tokens", "device")
_ENCODER_ONLY = (
    "targets", "reference", "data", "calib_data", "calib_method", "smoothquant", "no_smoothquant",
    "int8_rest", "seq", "warmup", "runs", "tolerances", "output_names",
)  # fmt: skip


def _refuse_other_mode(ctx: click.Context, generate: bool) -> None:
    """Options of the other kind of report are refused by name, never dropped."""
    given = given_flags(ctx, _ENCODER_ONLY if generate else _LM_ONLY)
    if given:
        where = "an output comparison (no --generate)" if generate else "--generate (a causal LM report)"
        verb = "applies" if len(given) == 1 else "apply"
        raise click.UsageError(f"{', '.join(given)} only {verb} to {where}.")
    if generate and not ctx.params.get("text"):
        raise UserError("--generate needs --text FILE: the text the variants' perplexity is measured on.")


def _run_generate(
    ctx: click.Context,
    model: str,
    out_dir: str,
    batch: str,
    threads: int | None,
    check: bool,
    progress: bool,
    params: dict,
) -> None:
    """`report MODEL --generate`: the LLM variant report."""
    from trtforge.llm.report import build_llm_report
    from trtforge.reports.cells import headline

    p = ctx.params  # (build_llm_report refuses an -o that names a file before any work)
    tokenizer = from_params(PrecisionOptions, params).tokenizer
    result = build_llm_report(
        model,
        text=p["text"],
        out_dir=out_dir,
        variants=p["variants"] or None,  # (repeatable: a second --variants replaced the first)
        tokenizer=tokenizer,
        windows=p["windows"],
        window_len=p["window_len"],
        chunk=p["chunk"],
        batch_sizes=_ints(batch, "--batch"),
        prompt_len=p["prompt_len"],
        new_tokens=p["new_tokens"],
        device=p["device"],
        threads=threads,
        progress=progress,
    )
    click.echo(headline(result.report))
    for note in result.report.notes:
        click.echo(f"note: {note}")
    for label, path in (
        ("html", result.html_path),
        ("markdown", result.markdown_path),
        ("json", result.json_path),
    ):
        click.echo(f"{label:9s}{show_path(path)}")
    problems = _failures(result.report)
    if check and problems:
        raise AccuracyCheckFailed("; ".join(problems) + " (see the report)")
