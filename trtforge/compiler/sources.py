"""The model sources that are not an nn.Module, turned into the same export artifact: an existing
`.onnx` file (checked, not re-exported) and a torch.export `.pt2` archive (converted by the dynamo
exporter, verified on its stored example inputs); and the refusal, with what to do, of anything else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from trtforge._fileio import check_input_file, show_path
from trtforge._usercode import user_code
from trtforge.compiler.export import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    DynamicSpec,
    ExportRecord,
    OnnxArtifact,
    check_opset,
    check_output_names,
    export_failure,
    finish_artifact,
    flatten_outputs,
    refuse_unexportable,
    run_quietly,
    torch_logs_silenced,
)
from trtforge.core import onnx_io
from trtforge.errors import UserError

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pkl")


def unsupported_source(path: Path) -> UserError:
    """The UserError for an existing path that is no model form trtforge compiles, saying what to do."""
    shown = show_path(path)
    if path.suffix.lower() in CHECKPOINT_SUFFIXES:
        return UserError(
            f"'{shown}' is a torch checkpoint: it holds weights (or a pickled module), not the forward's "
            "code and example inputs an export needs. Write a factory returning (model, example_inputs), "
            "e.g. `def make(): m = MyModel(); m.load_state_dict(torch.load(PATH)); return m.eval(), "
            "(torch.randn(1, 3, 224, 224),)`, and pass 'mymodule:make', or save a torch.export archive "
            "(.pt2)."
        )
    if path.is_dir():
        hf = (path / "config.json").is_file()
        causal = " (a Hugging Face causal LM directory compiles with --generate)" if hf else ""
        return UserError(
            f"'{shown}' is a directory{causal}; expected an .onnx or .pt2 file or package.module:factory."
        )
    return UserError(f"'{shown}': unsupported model file; expected .onnx, .pt2 or package.module:factory.")


def _step_graph_refusal(path: Path) -> UserError:
    """A decoder step graph given to the encoder compile: its profiles, cache and generation metadata come
    from `compile MODEL --generate` alone, and ONNX Runtime runs the graph as it is."""
    shown = show_path(path)
    return UserError(
        f"'{shown}' is a decoder step graph (its '{onnx_io.GENERATION_KEY}' metadata says so: `trtforge "
        "compile --generate --save-onnx` or trtforge.llm.compile.export_step wrote it), not an encoder "
        "model; compile builds a step engine only from the model it came from: `trtforge compile MODEL "
        "--generate` (MODEL the Hugging Face causal LM). The step graph runs as it is with ONNX Runtime: "
        f"`trtforge generate {shown}` or `trtforge serve {shown}`."
    )


def from_onnx_file(path: str | os.PathLike[str], *, encoder_only: bool = False) -> OnnxArtifact:
    """Accept an existing ONNX file as the export artifact (checked, not re-exported). `encoder_only` (the
    encoder compile) refuses a decoder step graph, which inspect and report take."""
    p = check_input_file(path, "model file")
    proto = onnx_io.read_onnx(p, external_data=False)
    if encoder_only and any(prop.key == onnx_io.GENERATION_KEY for prop in proto.metadata_props):
        raise _step_graph_refusal(p)
    onnx_io.check_model(p, where=f"ONNX model '{p}'")
    record = ExportRecord(
        source_kind="onnx",
        exporter="none",
        opset=next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
        input_names=[
            i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}
        ],
        output_names=[o.name for o in proto.graph.output],
        external_data=bool(onnx_io.external_data_files(p)),
    )
    return OnnxArtifact(p, record)


def from_pt2(
    path: str | os.PathLike[str],
    workdir: str | os.PathLike[str],
    *,
    dynamic: DynamicSpec = None,
    output_names: Sequence[str] | None = None,
    opset: int | None = None,
    exporter: str = "auto",
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    verify: bool = True,
) -> OnnxArtifact:
    """Export a torch.export archive (`.pt2`) with the dynamo exporter; its stored example inputs
    drive verification and its own dynamic shapes are kept (a .pt2 cannot be re-traced)."""
    import torch

    p = check_input_file(path, "model file")
    if dynamic:
        raise UserError(
            f"'{p}' is a torch.export archive: its dynamic dims were fixed when it was exported. "
            "Drop --dynamic, or re-export with torch.export.export(..., dynamic_shapes=...)."
        )
    if exporter == "legacy":
        raise UserError(
            "a .pt2 archive can only be converted by the dynamo exporter; drop --exporter legacy."
        )
    opset = check_opset(opset)
    try:
        with torch_logs_silenced():
            ep = torch.export.load(str(p))
    except Exception as e:
        raise UserError(f"'{p}' is not a torch.export archive ({type(e).__name__}: {str(e)[:200]}).") from e
    if ep.example_inputs is None:
        raise UserError(f"'{p}' stores no example inputs; save it with torch.export.save after export().")
    args, kwargs = ep.example_inputs
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    with torch.no_grad(), user_code(f"the program in '{p}' on its stored example inputs"):
        reference = flatten_outputs(ep.module()(*args, **kwargs))
    names = list(output_names) if output_names else [f"output_{i}" for i in range(len(reference))]
    check_output_names(names, len(reference), user_inputs)
    out = Path(workdir) / "model.onnx"
    record = ExportRecord(source_kind="pt2", exporter="dynamo", input_names=user_inputs, output_names=names)
    t0 = time.perf_counter()

    def run() -> None:
        program = torch.onnx.export(ep, dynamo=True, output_names=names, opset_version=opset, verbose=False)
        program.save(str(out), external_data=None)

    try:
        run_quietly(run)
    except Exception as e:  # the program's to change (exit 2), unless trtforge's own code failed (a bug)
        refuse_unexportable([e], f"could not convert '{p}' to ONNX: {export_failure(e)}")
    record.seconds = time.perf_counter() - t0
    feeds = dict(zip(user_inputs, [*args, *kwargs.values()]))
    finish_artifact(out, record, feeds, reference, rtol=rtol, atol=atol, verify=verify)
    return OnnxArtifact(out, record)
