"""`trtforge inspect`: summarize an ONNX model or an engine's manifest."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import click


def io_entry(name: str, dtype: str, shape: Any, symbols: Any = ()) -> dict[str, Any]:
    """One input or output in `inspect --json`, the same for an ONNX model and an engine: name, dtype,
    shape (a list of ints, -1 a dynamic axis; null where an ONNX input records no shape at all) and
    symbols (each axis's name where it is dynamic and named, else null)."""
    if shape is None:
        return {"name": name, "dtype": dtype, "shape": None, "symbols": None}
    dims = [int(d) for d in shape]
    named = list(symbols or ())
    return {
        "name": name,
        "dtype": dtype,
        "shape": dims,
        "symbols": [named[a] if a < len(named) and d < 0 and named[a] else None for a, d in enumerate(dims)],
    }


def _parses_as_onnx(path: Path) -> bool:
    """Whether `path`, named otherwise than .onnx and with no engine manifest beside it (model.onnx.bak,
    model.pb), holds an ONNX model: it was read as an engine and refused for its missing manifest."""
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        return False
    try:
        m = onnx.load(str(path), format="protobuf", load_external_data=False)  # (not by the suffix: .json)
    except (DecodeError, ValueError, OSError):  # (not a ModelProto: what is refused as an engine below)
        return False
    return m.ir_version > 0 and len(m.graph.node) > 0 and len(m.opset_import) > 0


def summarize_onnx(path: Path) -> dict[str, Any]:
    """I/O, opsets, op histogram and weight size of an ONNX file (external data not loaded), in the
    shape `inspect --json` shares with an engine (see INSPECT_JSON)."""
    import onnx

    from trtforge.compiler.sources import from_onnx_file
    from trtforge.core.onnx_io import check_model
    from trtforge.core.tensor_spec import value_spec

    from_onnx_file(path)  # validates with clear errors
    m = onnx.load(str(path), load_external_data=False)
    check_model(path, where=f"ONNX model '{path}'")
    inits = {t.name for t in m.graph.initializer}

    def spec(v: Any) -> dict[str, Any]:
        t = value_spec(v)
        return io_entry(t.name, t.dtype, t.shape if t.rank_known else None, t.symbols)

    weight_bytes = 0
    weight_dtypes: Counter[str] = Counter()
    for t in m.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        weight_bytes += n * dtype.itemsize
        weight_dtypes[dtype.name] += 1
    opsets = {o.domain: o.version for o in m.opset_import}
    inner = _subgraph_ops(m.graph)
    return {
        "kind": "onnx",
        "path": str(path),
        "opset": opsets.get("", opsets.get("ai.onnx")),
        "precision": None,  # (a compile's choice; the weights' types are in weight_dtypes)
        "inputs": [spec(i) for i in m.graph.input if i.name not in inits],
        "outputs": [spec(o) for o in m.graph.output],
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
        "opsets": opsets,
        "nodes": len(m.graph.node),
        "ops": dict(Counter(n.op_type for n in m.graph.node)),
        "subgraph_nodes": sum(inner.values()),
        "subgraph_ops": dict(inner),
        "initializers": len(m.graph.initializer),
        "weight_bytes": weight_bytes,
        "weight_dtypes": dict(weight_dtypes),
    }


def _subgraph_ops(graph: Any) -> Counter[str]:
    """Op counts of the bodies of `graph`'s control-flow nodes (If branches, Loop and Scan bodies, and
    theirs in turn): nodes the top-level histogram does not list, where a model's work can sit whole."""
    import onnx

    counts: Counter[str] = Counter()
    for node in graph.node:
        for attr in node.attribute:
            bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else []
            bodies += list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
            for body in bodies:
                counts.update(n.op_type for n in body.node)
                counts.update(_subgraph_ops(body))
    return counts


def summarize_engine(engine: Path, manifest: Any) -> dict[str, Any]:
    """An engine's `inspect --json`: the keys it shares with an ONNX model's (see INSPECT_JSON) first,
    then every key of its manifest (model.engine.json) as it is."""
    from trtforge._fileio import show_path
    from trtforge.core.manifest import manifest_path_for, recorded_symbols

    d = json.loads(manifest.to_json())
    where = f"manifest '{show_path(manifest_path_for(engine))}'"

    def entries(kind: str) -> list[dict[str, Any]]:
        named = recorded_symbols(d["records"], kind, where)
        return [io_entry(t["name"], t["dtype"], t["shape"], named.get(t["name"])) for t in d[kind]]

    source = d.get("source") or {}
    common = {
        "kind": "engine",
        "path": str(engine),
        "opset": source.get("opset"),
        "precision": d.get("precision"),
        "inputs": entries("inputs"),
        "outputs": entries("outputs"),
    }
    return common | {k: v for k, v in d.items() if k not in common}


INSPECT_JSON = """\b
Examples:
  trtforge inspect model.onnx
  trtforge inspect model.engine --json
\b
--json prints one object; an ONNX model and an engine share these keys:
  kind       "onnx" or "engine"
  path       the file inspected (an engine's, also when FILE is its manifest)
  opset      the default-domain ONNX opset (an engine's: its source graph's)
  precision  an engine's precision record (mode, float, int8_rest, ...);
             null for an ONNX model (its weights' types: weight_dtypes)
  inputs,    each {name, dtype, shape, symbols}: shape a list of ints,
  outputs    -1 for a dynamic axis (null: no shape recorded); symbols the
             dynamic axes' names (null where static or unnamed)
An ONNX model adds producer, opsets, nodes, ops (the top-level graph's),
subgraph_nodes, subgraph_ops (inside If/Loop/Scan bodies, nested ones too),
initializers, weight_bytes, weight_dtypes; an engine adds every key of its
manifest (engine_sha256, backend, profiles, source, build_options, records,
generation, ...).
Numbers JSON cannot hold (NaN, infinity: a manifest record's) print as null.
"""


@click.command("inspect", epilog=INSPECT_JSON, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def inspect_cmd(file: str, as_json: bool) -> None:
    """Summarize FILE: an ONNX model (I/O, opset, op histogram) or an engine (its manifest)."""
    from rich.console import Console

    from trtforge._fileio import json_text, settle_commit
    from trtforge.cli._render import generation_line, manifest_tables, onnx_tables, print_all
    from trtforge.core.manifest import manifest_path_for, read_engine
    from trtforge.errors import UserError

    path = Path(file)
    settle_commit(path, manifest_path_for(path))  # (a commit onto it a kill stopped decides what is there)
    # (an engine whose manifest is here is read on: its error says the engine is what is missing)
    if not path.exists() and (path.suffix.lower() == ".onnx" or not manifest_path_for(path).is_file()):
        raise UserError(f"'{path}' does not exist.")
    console = Console()
    engine = path.with_suffix("") if path.name.endswith(".engine.json") else path
    if path.suffix.lower() == ".onnx" or (not manifest_path_for(engine).exists() and _parses_as_onnx(path)):
        summary = summarize_onnx(path)
        if as_json:
            click.echo(json_text(summary))
        else:
            print_all(console, onnx_tables(summary))
        return
    manifest, _ = read_engine(engine)
    if as_json:
        click.echo(json_text(summarize_engine(engine, manifest)))
    else:
        print_all(console, manifest_tables(manifest, engine))
        if manifest.generation is not None:  # a decoder step engine (compile --generate)
            console.print(generation_line(manifest.generation))
        console.print("[green]engine bytes match the manifest sha256[/green]")
