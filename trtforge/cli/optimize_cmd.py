"""`trtforge optimize`: run the verified graph passes on an ONNX file and print what each did."""

from __future__ import annotations

from typing import Any

import click

from trtforge._fileio import show_path
from trtforge.cli._options import from_params, option_group, passes_from_params
from trtforge.core.policy import PassOptions, PrecisionOptions

EXAMPLES = """\b
Examples:
  trtforge optimize bert.onnx -o bert.fused.onnx
  trtforge optimize bert.onnx -o out.onnx --passes cleanup,gelu,attention --precision fp16
  trtforge optimize big.onnx -o big.fused.onnx --no-verify --ledger big.passes.json
  trtforge optimize bert.onnx -o bert.fp16.onnx --precision fp16 --keep-fp32 Gelu
  trtforge optimize wav2vec2.onnx -o w2v.fused.onnx --verify-shape input_values:1x16000
\b
Passes (default order): cleanup, layernorm, rmsnorm, gelu, swiglu, qkv, rotary, attention,
gqa, cleanup.
Verification runs ONNX Runtime before and after every pass with generated inputs (small
sizes, or --verify-shape's) and stops with exit code 2 if a pass changes an output; it is
skipped for models whose weights exceed 2 GiB. --precision fp16/bf16 then converts the
fused graph (FP32 islands decided by op type, by values seen on sample data, and by
--keep-fp32).
Attention becomes ONNX Attention (--attention native) only in an FP16/BF16 graph:
TensorRT's fused attention does not build in FP32, so FP32 keeps the decomposed form.
"""


@click.command("optimize", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="ONNX file to write.")
@option_group(PassOptions)
@click.option(
    "--ledger",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the pass ledger JSON (with --precision fp16/bf16, the conversion's record and "
    'its check against FP32 under "precision").',
)
@click.option(
    "--verify-shape",
    "verify_shapes",
    multiple=True,
    metavar="NAME:DIMS",
    help="Feed input NAME at DIMS (e.g. input_values:1x16000) when verifying, for a model that cannot run "
    "at the small generated sizes (a convolution front end over audio) or whose behaviour shows only "
    "at longer ones. Repeatable; inputs not named stay generated.",
)
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@option_group(PrecisionOptions, only=("mode", "keep_fp32", "keep_io_types", "data", "tokenizer"))
def optimize_cmd(
    model: str, output: str, ledger: str | None, verify_shapes: tuple[str, ...], force: bool, **params: Any
) -> None:
    """Fuse LayerNorm, GELU, QKV projections and attention in MODEL; every pass verified by execution."""
    from rich.console import Console

    from trtforge._fileio import (
        atomic_outputs,
        atomic_write_text,
        check_distinct_outputs,
        check_output_path,
        json_text,
        refuse_overwriting_inputs,
    )
    from trtforge.cli._render import float_check, plain
    from trtforge.core.onnx_io import (
        check_model,
        external_data_path,
        load_onnx,
        model_files,
        save_onnx_atomic,
    )
    from trtforge.core.policy import check_precision, resolve_attention
    from trtforge.errors import UserError
    from trtforge.passes.pipeline import optimize_model

    passes = passes_from_params(params)
    precision = from_params(PrecisionOptions, params)
    if precision.mode == "int8":
        raise UserError(
            "--precision int8: `optimize` writes float graphs; INT8 needs calibration data, so run "
            "`trtforge calibrate` on the optimized graph, or `trtforge compile --precision int8`."
        )
    check_precision(precision)
    if precision.tokenizer is not None and precision.data is None:  # (it was taken and did nothing)
        raise UserError(
            "--tokenizer tokenizes the text of --precision-data (sentences.txt), which is not given: nothing "
            "would read it. Pass --precision-data with --precision fp16/bf16, or drop --tokenizer."
        )
    attention = resolve_attention(passes, precision)
    out_path = check_output_path(output, force=force)
    out_data = check_output_path(external_data_path(out_path), force=force, what="-o's external data file")
    ledger_path = check_output_path(ledger, force=force, what="ledger") if ledger else None
    check_distinct_outputs({"-o": out_path, "--ledger": ledger_path})
    proto = load_onnx(model)
    check_model(model, where=f"ONNX model '{show_path(model)}'")  # names the file; the pipeline's does not
    feed_shapes = None
    if verify_shapes and not (passes.verify or precision.low_precision()):
        raise UserError(
            "--verify-shape feeds verification and the FP16/BF16 range check, but --no-verify turns "
            "verification off and the graph stays FP32: nothing would read it. Drop one of them."
        )
    if verify_shapes:
        from trtforge.core.shapes import parse_feed_shapes
        from trtforge.core.tensor_spec import graph_inputs

        feed_shapes = parse_feed_shapes(verify_shapes, graph_inputs(proto), "--verify-shape")
    refuse_overwriting_inputs(
        {"-o": out_path, "-o's external data file": out_data, "--ledger": ledger_path},
        model_files(model) | _data_file(precision.data),
    )
    if passes.verify or precision.low_precision():
        from trtforge._custom_ops import refuse_unknown_to_onnxruntime

        refuse_unknown_to_onnxruntime(
            proto,
            f"ONNX model '{show_path(model)}'",
            "optimize runs the graph in ONNX Runtime to verify every pass and to place precision: rewrite it "
            "with --no-verify (and no --precision), or give ONNX Runtime the op as an ONNX local function.",
        )
    result, record = optimize_model(
        proto,
        passes=list(passes.names) if passes.names is not None else None,
        attention=attention,
        verify=passes.verify,
        debug=passes.debug,
        verify_shapes=feed_shapes,
    )
    precision_record = None
    if precision.low_precision():
        from trtforge.passes.precision.cli_options import convert_with_options

        result, precision_record = convert_with_options(
            result,
            precision=precision.mode,
            keep_fp32=precision.keep_fp32,
            keep_io_types=precision.keep_io_types,
            precision_data=precision.data,
            tokenizer=precision.tokenizer,
            feed_shapes=feed_shapes,
        )
    ledger_json = record.to_dict()
    if precision_record is not None:  # (the conversion's record and its check against FP32 with it)
        ledger_json["precision"] = precision_record.to_dict()
    with atomic_outputs():  # the model and its ledger together or not at all
        save_onnx_atomic(result, out_path)
        if ledger_path is not None:
            atomic_write_text(ledger_path, json_text(ledger_json) + "\n")
    console = Console()
    console.print(ledger_table(record))
    if record.opset_changed:
        console.print(f"opset raised {record.opset_before} -> {record.opset_after}")
    if record.verify_skipped_reason:
        console.print(f"[yellow]verification skipped: {plain(record.verify_skipped_reason)}")
    if precision_record is not None and precision_record.status != "converted":  # (an FP16 model as given)
        console.print(plain(precision_record.summary()))
    elif precision_record is not None:
        p = ledger_json["precision"]
        console.print(
            f"{precision.mode}: {p['low_precision_nodes']} nodes converted, {p['fp32_nodes']} kept FP32 "
            f"{p['reason_counts'] or ''}, casts +{p['casts_inserted']}/-{p['casts_removed']}; "
            f"{float_check(p)}"
        )
    console.print(f"wrote {plain(show_path(out_path))}")


def _data_file(data: Any) -> dict[str, Any]:
    from pathlib import Path

    return {"--precision-data": data} if isinstance(data, str) and Path(data).is_file() else {}


def ledger_table(record):
    """The ledger as a rich table: one row per pass."""
    from rich.table import Table

    from trtforge.cli._render import plain

    table = Table(title="passes", show_edge=False)
    for col, justify in (
        ("pass", "left"),
        ("matches", "right"),
        ("nodes", "right"),
        ("seconds", "right"),
        ("max rel err", "right"),
        ("what", "left"),
    ):
        table.add_column(col, justify=justify)
    for p in record.passes:
        err = f"{p.verification.max_rel_error:.1e}" if p.verification else "-"
        what = ", ".join(f"{k}: {v}" for k, v in p.per_rule.items()) or "; ".join(p.notes)
        table.add_row(
            plain(p.name),
            str(p.matches),
            f"{p.nodes_before} -> {p.nodes_after}",
            f"{p.seconds:.2f}",
            err,
            plain(what),
        )
    return table
