"""`trtforge calibrate`: FP32 ONNX + dataset -> INT8 Q/DQ ONNX (+ a TensorRT-format calibration cache)."""

from __future__ import annotations

from pathlib import Path

import click

from trtforge.cli._options import from_params, given_flags, option_group
from trtforge.core.policy import PrecisionOptions


@click.command(
    "calibrate",
    epilog="""\b
DATA is a .npz (input name -> array, first axis = samples), a directory of .npz/.npy,
a text file of sentences (one per line; needs --tokenizer), or module:function returning
an iterable of input dicts. The data is checked against the model before calibration.
\b
Examples:
  trtforge calibrate model.onnx --data calib.npz -o model.int8.onnx
  trtforge calibrate minilm.onnx --data sentences.txt --tokenizer demo -o minilm.int8.onnx \\
      --method max --smoothquant 0.5 --accuracy-target 0.999
""",
)
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--data", "data", required=True, help="Calibration data (see below).")
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Output ONNX."
)
@option_group(
    PrecisionOptions,
    only=("calib_method", "calib_samples", "tokenizer", "smoothquant", "accuracy_target", "calib_cache"),
    flags={"calib_method": ("--method",), "calib_samples": ("--samples",)},
    more_help={
        "calib_cache": "Default: OUTPUT's name ending .calib.cache (-o m.int8.onnx: m.int8.calib.cache)."
    },
)
@click.option("--percentile", type=float, default=99.99, show_default=True, help="For --method percentile.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Samples per ONNX Runtime run while collecting statistics (memory against speed).",
)
@click.option(
    "--shuffle-seed",
    type=int,
    default=None,
    help="Shuffle the samples with this seed, then take --samples: a random subset of a file or directory. "
    "A module:function is read to its end and all of it shuffled; with --samples it is refused, since it is "
    "read only to its first N samples (it may never end): shuffle in the function instead.",
)
@click.option("--op-types", default="MatMul,Gemm,Conv", show_default=True, help="Op types to quantize.")
@click.option("--exclude", "exclude", multiple=True, help="Node name to keep in float (repeatable).")
@click.option(
    "--real-tokens/--all-tokens",
    "real_tokens",
    default=None,
    help="Statistics over attention_mask == 1 positions only (default: on if the model has attention_mask).",
)
@click.option(
    "--report", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write the record JSON."
)
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary table.")
def calibrate_cmd(
    model,
    data,
    output,
    percentile,
    batch_size,
    shuffle_seed,
    op_types,
    exclude,
    real_tokens,
    report,
    force,
    quiet,
    **params,
) -> None:
    """Calibrate MODEL on DATA and write it with INT8 Q/DQ nodes that TensorRT fuses (the rest stays as
    it is; `compile --precision int8` also converts the rest, see --int8-rest there)."""
    from trtforge._custom_ops import refuse_unknown_to_onnxruntime
    from trtforge._fileio import (
        atomic_outputs,
        atomic_write_text,
        check_distinct_outputs,
        check_output_path,
        json_text,
        refuse_overwriting_inputs,
        show_path,
    )
    from trtforge.calibration.api import calibrate_model
    from trtforge.calibration.cache import Fingerprint, write_calibration_cache
    from trtforge.calibration.data import data_files, input_specs_from_model, load_dataset
    from trtforge.core.onnx_io import (
        check_model,
        external_data_path,
        load_onnx,
        model_files,
        save_onnx_atomic,
    )
    from trtforge.errors import UserError
    from trtforge.numerics.sessions import refuse_unloadable

    opts = from_params(PrecisionOptions, params, mode="int8", calib_data=data)
    method, samples, tokenizer = opts.calib_method, opts.calib_samples, opts.tokenizer
    if method != "percentile" and given_flags(click.get_current_context(), ["percentile"]):
        raise click.UsageError(f"--percentile only applies to --method percentile (got --method {method}).")
    calib_cache = Path(opts.calib_cache) if opts.calib_cache else None

    out = check_output_path(output, force=force, what="output model")
    out_data = check_output_path(external_data_path(out), force=force, what="-o's external data file")
    default_cache = calib_cache is None
    cache_path = out.with_suffix(".calib.cache") if default_cache else calib_cache
    if default_cache:
        check_output_path(cache_path, force=force, what="calibration cache")
    elif not cache_path.exists():  # read when it exists, else written after calibration
        check_output_path(cache_path, force=True, what="--calib-cache file")
    if report is not None:
        check_output_path(report, force=force, what="report")
    onnx_model = load_onnx(model)
    check_model(model, where=f"ONNX model '{show_path(model)}'")
    refuse_unknown_to_onnxruntime(
        onnx_model,
        f"ONNX model '{show_path(model)}'",
        "Calibration runs the graph in ONNX Runtime to measure activations: give ONNX Runtime the op as an "
        "ONNX local function, or calibrate the model without it.",
    )
    refuse_unloadable(
        onnx_model,
        f"ONNX model '{show_path(model)}'",
        "Calibration runs the graph in ONNX Runtime to measure activations: fix the model where it is built "
        "or exported (onnxruntime.InferenceSession must load it).",
    )
    outputs = {"-o": out, "the calibration cache": cache_path, "--report": report}
    check_distinct_outputs(outputs)
    dataset = load_dataset(
        data,
        input_specs_from_model(onnx_model),
        batch_size=batch_size,
        max_samples=samples,
        shuffle_seed=shuffle_seed,
        tokenizer=tokenizer,
        what="--data",
    )
    if tokenizer is not None and not dataset.tokenized:  # (it was taken and did nothing)
        raise UserError(
            f"--tokenizer tokenizes a text file of sentences given as --data, and --data '{data}' is not one "
            "(arrays or a module:function, read as they are): nothing would read it. Drop --tokenizer."
        )
    refuse_overwriting_inputs(  # (after loading: a module:function's module file is known once imported)
        outputs | {"-o's external data file": out_data}, model_files(model) | data_files(data, "--data")
    )
    # The model, its cache and the report appear together or not at all: a --calib-cache that does not
    # exist yet is written by calibrate_model, staged here with the rest (before, it was renamed into
    # place before the model was written, so an interrupted or failed write left a new cache beside the
    # old model, or none, and the next run read it and skipped statistics).
    with atomic_outputs():
        quantized, record = calibrate_model(
            onnx_model,
            dataset,
            method=method,
            percentile=percentile,
            op_types=tuple(t.strip() for t in op_types.split(",") if t.strip()),
            exclude_nodes=tuple(exclude),
            smoothquant=opts.smoothquant,
            accuracy_target=opts.accuracy_target,
            calib_cache=None if default_cache else str(cache_path),
            only_real_tokens=real_tokens,
            progress=not quiet,
        )
        save_onnx_atomic(quantized, out)  # (near 2 GB: weights beside it in OUTPUT.data)
        if default_cache:
            write_calibration_cache(
                cache_path, record.activation_scales, method, Fingerprint(**record.cache["fingerprint"])
            )
            record.cache.update(path=str(cache_path), written=True)
        if report is not None:
            atomic_write_text(report, json_text(record.to_dict()) + "\n")
    if not quiet:
        _summary(record, out)


def _summary(record, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from trtforge.cli._render import plain

    t = Table(title=f"INT8 calibration -> {plain(out)}", show_header=False)
    t.add_row("method", record.method + (f" ({record.percentile})" if record.percentile else ""))
    t.add_row("samples / batches", f"{record.samples} / {record.batches}  ({plain(record.source)})")
    t.add_row("seconds (statistics)", f"{record.seconds:.1f} ({record.statistics_seconds:.1f})")
    t.add_row("real tokens only", str(record.only_real_tokens))
    t.add_row("MatMuls in INT8", f"{record.matmuls_quantized} / {record.matmuls_total}")
    t.add_row("quantized by op", ", ".join(f"{k} {v}" for k, v in sorted(record.quantized_by_op.items())))
    t.add_row("activations / weights", f"{record.tensors_quantized} / {record.weights_quantized}")
    if record.dropped_values:
        t.add_row("non-finite/mask values ignored", str(record.dropped_values))
    if record.smoothquant:
        t.add_row(
            "smoothquant",
            f"alpha {record.smoothquant['alpha']}, {record.smoothquant['matmuls_smoothed']} MatMuls",
        )
    if record.accuracy:
        a = record.accuracy
        t.add_row(
            "accuracy (held-out cosine)",
            f"all INT8 {a['all_quantized']['mean']:.5f} -> {a['final']['mean']:.5f}",
        )
        t.add_row("returned to float", plain(", ".join(f["node"] for f in record.fallback) or "none"))
    skipped = [d for d in record.decisions if not d["quantized"]]
    if skipped:
        t.add_row("kept in float", f"{len(skipped)} ({', '.join(sorted({d['rule'] for d in skipped}))})")
    cache = record.cache
    how = "read" if cache.get("read") else "written"
    t.add_row("calibration cache", f"{plain(cache.get('path'))} ({how})")
    Console(stderr=True).print(t)
