"""The engine manifest (`model.engine.json`): what an engine is, where it came from, how it was built.

Written next to every engine; read back by `trtforge inspect`, the runtime (which checks the sha256,
backend and version before deserializing) and the Triton exporter. Schema id: ``trtforge.manifest/1``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtforge._fileio import atomic_write_text, sha256_bytes, sha256_file
from trtforge.errors import UserError

MANIFEST_FORMAT = "trtforge.manifest/1"
MANIFEST_SUFFIX = ".json"


@dataclass
class TensorSpec:
    """One engine input or output: name, numpy dtype name, shape with -1 for dynamic dims."""

    name: str
    dtype: str
    shape: list[int]


@dataclass
class ShapeRange:
    """min/opt/max shape of one input within one optimization profile."""

    min: list[int]
    opt: list[int]
    max: list[int]


@dataclass
class Manifest:
    """Everything recorded about one engine file. Fields map 1:1 to the JSON document."""

    engine_file: str
    engine_sha256: str
    engine_bytes: int
    backend: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    profiles: list[dict[str, ShapeRange]]
    source: dict[str, Any]
    trtforge_version: str
    build_options: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=lambda: {"mode": "fp32"})
    plugins: list[dict[str, Any]] = field(default_factory=list)
    streams: int = 1
    records: dict[str, Any] = field(default_factory=dict)
    # Decoder step engines only (compile --generate): model shape, cache layout, phases -> profiles.
    generation: dict[str, Any] | None = None
    format: str = MANIFEST_FORMAT

    def to_json(self) -> str:
        """Serialize to indented JSON."""
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = "manifest") -> Manifest:
        """Parse a manifest dict, raising UserError naming the first missing or malformed field."""
        if d.get("format") != MANIFEST_FORMAT:
            raise UserError(f"{where}: format is {d.get('format')!r}, expected {MANIFEST_FORMAT!r}.")
        try:
            return cls(
                engine_file=d["engine_file"],
                engine_sha256=d["engine_sha256"],
                engine_bytes=int(d["engine_bytes"]),
                backend=dict(d["backend"]),
                inputs=[TensorSpec(**t) for t in d["inputs"]],
                outputs=[TensorSpec(**t) for t in d["outputs"]],
                profiles=[{k: ShapeRange(**v) for k, v in p.items()} for p in d["profiles"]],
                source=dict(d["source"]),
                trtforge_version=d["trtforge_version"],
                build_options=dict(d.get("build_options", {})),
                timings=dict(d.get("timings", {})),
                precision=dict(d.get("precision", {"mode": "fp32"})),
                plugins=list(d.get("plugins", [])),
                streams=int(d.get("streams", 1)),
                records=dict(d.get("records", {})),
                generation=dict(d["generation"]) if d.get("generation") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: malformed manifest ({type(e).__name__}: {e}).") from e


def manifest_path_for(engine_path: str | os.PathLike[str]) -> Path:
    """`model.engine` -> `model.engine.json`."""
    p = Path(engine_path)
    return p.with_name(p.name + MANIFEST_SUFFIX)


def write_manifest(manifest: Manifest, engine_path: str | os.PathLike[str]) -> Path:
    """Write the manifest beside the engine, atomically; returns its path."""
    path = manifest_path_for(engine_path)
    atomic_write_text(path, manifest.to_json())
    return path


def read_manifest(engine_path: str | os.PathLike[str]) -> Manifest:
    """Load the manifest that belongs to `engine_path` (UserError if absent or malformed)."""
    path = manifest_path_for(engine_path)
    if not path.is_file():
        raise UserError(
            f"engine '{engine_path}' has no manifest '{path}'. trtforge writes one beside every engine it "
            "builds; rebuild with `trtforge compile`, or keep the .engine.json next to the .engine file."
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"manifest '{path}' is not valid JSON: {e}.") from e
    return Manifest.from_dict(data, where=str(path))


def verify_engine_file(engine_path: str | os.PathLike[str], manifest: Manifest) -> bytes:
    """Read the engine bytes and check size and sha256 against the manifest; returns the bytes."""
    p = Path(engine_path)
    if not p.is_file():
        raise UserError(f"engine file '{p}' does not exist.")
    data = p.read_bytes()
    if len(data) != manifest.engine_bytes or sha256_bytes(data) != manifest.engine_sha256:
        raise UserError(
            f"engine '{p}' does not match its manifest: {len(data)} bytes with sha256 "
            f"{sha256_bytes(data)[:16]}…, manifest says {manifest.engine_bytes} bytes, "
            f"{manifest.engine_sha256[:16]}…. The file was truncated or modified; rebuild it."
        )
    return data


__all__ = [
    "MANIFEST_FORMAT",
    "Manifest",
    "ShapeRange",
    "TensorSpec",
    "manifest_path_for",
    "read_manifest",
    "sha256_file",
    "verify_engine_file",
    "write_manifest",
]
