"""One compile session for both paths (encoder `compile_model`, decoder `compile_generate`).

A session owns what every compile does around its own stages: the output checks (settle a publisher that
died here, no clobbering without force, outputs distinct from each other and from the files read), a work
directory removed on every exit, timed stages whose seconds and records land in the manifest, and the
publish step: `--save-onnx`, the engine and its manifest land together through the crash-safe commit
(`trtforge.core.manifest.publish_engine`), or not at all.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtforge._fileio import (
    as_path,
    atomic_outputs,
    check_distinct_outputs,
    check_output_path,
    refuse_overwriting_inputs,
    sha256_bytes,
    work_directory,
)
from trtforge.core.manifest import Manifest, manifest_path_for, publish_engine, resolve_pending
from trtforge.core.onnx_io import external_data_path
from trtforge.core.version import __version__
from trtforge.errors import UserError

if TYPE_CHECKING:
    import onnx

Log = Callable[[str], None]
PathArg = str | os.PathLike[str] | None


@dataclass
class CompileResult:
    """What `trtforge.compile` produced: file paths, the manifest, per-stage seconds and records."""

    engine_path: Path | None
    manifest_path: Path | None
    manifest: Manifest | None
    timings: dict[str, float]
    records: dict[str, Any] = field(default_factory=dict)
    onnx_path: Path | None = None


def source_files(model: Any) -> dict[str, str | os.PathLike[str] | None]:
    """The files a model source is read from, by what they are: an ONNX file and its external data, a .pt2,
    the files of a save_pretrained directory, or the module file of an (already imported) factory."""
    import sys

    if isinstance(model, (str, os.PathLike)) and Path(model).is_file():
        from trtforge.core import onnx_io

        return onnx_io.model_files(model) if str(model).lower().endswith(".onnx") else {"input model": model}
    if isinstance(model, (str, os.PathLike)) and Path(model).is_dir():
        from trtforge._fileio import show_path

        where = f"of the model directory '{show_path(model)}'"
        return {f"file '{p.name}' {where}": p for p in Path(model).iterdir() if p.is_file()}
    if isinstance(model, str) and ":" in model:
        module = sys.modules.get(model.split(":", 1)[0])
        if getattr(module, "__file__", None):
            return {"factory's module": module.__file__}
    return {}


class CompileSession:
    """Checked outputs, a work directory, timed stages and the publish of one compile; see the module doc.

    Use as a context manager (the work directory exists inside it only). `build=False` writes only the
    ONNX (`save_onnx` is then required). `caches` (option -> path) are files the build reads and rewrites
    on purpose (timing and calibration caches): checked writable and distinct from the outputs, never
    refused for existing.
    """

    def __init__(
        self,
        output: PathArg,
        *,
        save_onnx: PathArg = None,
        force: bool = False,
        build: bool = True,
        caches: Mapping[str, PathArg] | None = None,
        log: Log | None = None,
    ):
        if build and (output is None or not os.fspath(as_path(output, "output (the engine path)"))):
            raise UserError("an output engine path is required (output=... / -o OUT.engine).")
        if not build and save_onnx is None:
            raise UserError("without an engine build there is nothing to write: pass save_onnx.")
        self.log: Log = log or (lambda _msg: None)
        self.save_onnx = save_onnx
        self.force = force
        self.out: Path | None = None
        if build:
            resolve_pending(output)  # a compile killed while publishing here: settle it before deciding
            self.out = check_output_path(output, force=force, what="output engine")  # type: ignore[arg-type]
            if not self.out.exists():  # (an existing file may be an input: that refusal says more)
                self._check_engine_name()
            check_output_path(manifest_path_for(self.out), force=force, what="output manifest")
        save_onnx_data = None
        if save_onnx is not None:
            check_output_path(save_onnx, force=force, what="--save-onnx file")
            # (a large model's weights go beside it, named before it is known whether they will)
            save_onnx_data = external_data_path(os.fspath(as_path(save_onnx, "--save-onnx file")))
            check_output_path(save_onnx_data, force=force, what="--save-onnx's external data file")
        for what, path in (caches or {}).items():
            if path is not None:
                check_output_path(path, force=True, what=f"{what} file")
        self.outputs: dict[str, PathArg] = {
            "-o (engine)": self.out,
            "the manifest": manifest_path_for(self.out) if self.out is not None else None,
            "--save-onnx": save_onnx,
            "--save-onnx's external data file": save_onnx_data,
        }
        check_distinct_outputs(self.outputs | dict(caches or {}))
        self.timings: dict[str, float] = {}
        self.records: dict[str, Any] = {}
        self._workdir: Path | None = None
        self._cleanup = contextlib.ExitStack()

    def refuse_overwriting(
        self, inputs: Mapping[str, PathArg], rewritten: Mapping[str, PathArg] | None = None
    ) -> None:
        """UserError when an output (or a `rewritten` cache) is one of the files the compile reads."""
        refuse_overwriting_inputs(self.outputs | dict(rewritten or {}), dict(inputs))
        self._check_engine_name()

    def _check_engine_name(self) -> None:
        """UserError for an output engine named as an ONNX model or a manifest, which inspect, report and
        optimize would then read as one (a protobuf error about an engine)."""
        out = self.out
        if out is not None and out.suffix.lower() in (".onnx", ".json"):
            kind = "an ONNX model" if out.suffix.lower() == ".onnx" else "a manifest"
            raise UserError(
                f"output engine '{out}' is named as {kind} ({out.suffix}), which inspect, report "
                "and optimize would read it as; name the engine .engine (or .plan), and pass --save-onnx "
                "FILE.onnx (save_onnx=) to keep the graph too."
            )

    @property
    def workdir(self) -> Path:
        """The session's temporary directory (inside the `with` block only)."""
        if self._workdir is None:
            raise RuntimeError("CompileSession.workdir is used outside its `with` block")
        return self._workdir

    def __enter__(self) -> CompileSession:
        self._cleanup = contextlib.ExitStack()
        try:  # (an interrupt raised here would skip __exit__: the directory is let go of here instead)
            self._workdir = self._cleanup.enter_context(work_directory("trtforge-"))
        except BaseException:
            self._cleanup.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._workdir = None
        self._cleanup.close()

    @contextlib.contextmanager
    def stage(self, name: str, message: str | None = None) -> Iterator[None]:
        """Time the block as stage `name` (its seconds land in `timings`), logging `message` first."""
        if message:
            self.log(message)
        t = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - t

    def manifest(self, data: bytes, **fields: Any) -> Manifest:
        """The manifest of engine bytes `data`: the session's engine name, hash, size, version, timings and
        records, plus the path's own `fields` (backend, I/O, profiles, source, options, ...)."""
        if self.out is None:
            raise RuntimeError("CompileSession.manifest needs a session that builds an engine")
        return Manifest(
            engine_file=self.out.name,
            engine_sha256=sha256_bytes(data),
            engine_bytes=len(data),
            trtforge_version=__version__,
            timings=self.timings,
            records=self.records,
            **fields,
        )

    def publish(
        self, data: bytes, manifest: Manifest, onnx: Callable[[Path], Any] | None = None
    ) -> CompileResult:
        """Write `--save-onnx` (by `onnx(path)`), the engine and its manifest together: the crash-safe
        commit of `publish_engine`, with the ONNX in the same uninterruptible step, or nothing. Without
        force, an output another run wrote meanwhile is refused then, not overwritten."""
        assert self.out is not None
        with atomic_outputs():
            if self.save_onnx is not None and onnx is not None:
                onnx(Path(self.save_onnx))
            manifest_path = publish_engine(self.out, data, manifest, replace=self.force)
        return CompileResult(
            self.out, manifest_path, manifest, self.timings, self.records, self._onnx_result()
        )

    def publish_onnx(self, model: onnx.ModelProto) -> CompileResult:
        """A session without an engine build: write the final ONNX `model` to `--save-onnx` atomically,
        with its external data file beside it as one group where it is too large for one protobuf
        (:func:`~trtforge.core.onnx_io.save_onnx_atomic`)."""
        from trtforge.core.onnx_io import save_onnx_atomic

        assert self.save_onnx is not None
        save_onnx_atomic(model, self.save_onnx)
        return CompileResult(None, None, None, self.timings, self.records, self._onnx_result())

    def _onnx_result(self) -> Path | None:
        return Path(self.save_onnx) if self.save_onnx is not None else None


__all__ = ["CompileResult", "CompileSession", "source_files"]
