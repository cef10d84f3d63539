"""`trtforge inspect`: summarize an ONNX model or an engine's manifest."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import click


def summarize_onnx(path: Path) -> dict[str, Any]:
    """I/O, opsets, op histogram and weight size of an ONNX file (external data not loaded)."""
    import onnx

    from trtforge.compiler.sources import from_onnx_file
    from trtforge.core.onnx_io import check_model
    from trtforge.core.tensor_spec import is_dynamic, value_spec

    from_onnx_file(path)  # validates with clear errors
    m = onnx.load(str(path), load_external_data=False)
    check_model(path, where=f"ONNX model '{path}'")
    inits = {t.name for t in m.graph.initializer}

    def spec(v: Any) -> dict[str, str]:
        t = value_spec(v)
        dims = ", ".join(t.symbol(a) or ("?" if is_dynamic(d) else str(d)) for a, d in enumerate(t.shape))
        return {"name": t.name, "dtype": t.dtype, "shape": f"[{dims}]"}

    weight_bytes = 0
    for t in m.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        weight_bytes += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return {
        "path": str(path),
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
        "opsets": {o.domain: o.version for o in m.opset_import},
        "inputs": [spec(i) for i in m.graph.input if i.name not in inits],
        "outputs": [spec(o) for o in m.graph.output],
        "nodes": len(m.graph.node),
        "ops": dict(Counter(n.op_type for n in m.graph.node)),
        "initializers": len(m.graph.initializer),
        "weight_bytes": weight_bytes,
    }


@click.command("inspect", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def inspect_cmd(file: str, as_json: bool) -> None:
    """Summarize FILE: an ONNX model (I/O, opset, op histogram) or an engine (its manifest).

    \b
    Examples:
      trtforge inspect model.onnx
      trtforge inspect model.engine --json
    """
    from rich.console import Console

    from trtforge.cli._render import generation_line, manifest_tables, onnx_tables, print_all
    from trtforge.core.manifest import manifest_path_for, read_manifest, verify_engine_file
    from trtforge.errors import UserError

    path = Path(file)
    # (an engine whose manifest is here is read on: its error says the engine is what is missing)
    if not path.exists() and (path.suffix.lower() == ".onnx" or not manifest_path_for(path).is_file()):
        raise UserError(f"'{path}' does not exist.")
    console = Console()
    if path.suffix.lower() == ".onnx":
        summary = summarize_onnx(path)
        if as_json:
            click.echo(json.dumps(summary, indent=2))
        else:
            print_all(console, onnx_tables(summary))
        return
    engine = path.with_suffix("") if path.name.endswith(".engine.json") else path
    manifest = read_manifest(engine)
    verify_engine_file(engine, manifest)
    if as_json:
        click.echo(manifest.to_json())
    else:
        print_all(console, manifest_tables(manifest, engine))
        if manifest.generation is not None:  # a decoder step engine (compile --generate)
            console.print(generation_line(manifest.generation))
        console.print("[green]engine bytes match the manifest sha256[/green]")
