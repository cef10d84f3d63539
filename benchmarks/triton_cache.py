"""Triton's kernel cache as one small archive, so a device call can start with last call's kernels compiled.

A fresh device machine compiles every Triton kernel again: the GPU suite took 250 s cold against 61 s warm
(BENCHMARKS.md, session 24), an 8B benchmark's sizing 94 s against 22 (session 35). The cache itself was
83 MB gzipped after the suite, over what a call may carry. Most of it is intermediate IR (LLVM IR alone
was 80% of the bytes in a CPU compile of the INT4 and Hopper attention kernels). A cache hit loads only
the metadata JSON, the group JSON and the binary (``triton.compiler.compiler.compile`` ->
``CompiledKernel``; a group's missing children are skipped by ``FileCacheManager.get_group``). So
``save`` keeps those and the compiled launchers, drops the IR, and writes xz, whose window shares the
near-identical binaries of a kernel's specializations (38 kernels: 6.7 MB gzipped whole, 0.44 MB so).

    python3 benchmarks/triton_cache.py save OUT.txz     # on the device, at the end of a call
    python3 benchmarks/triton_cache.py load IN.txz      # on the device, before the first kernel
    python3 benchmarks/triton_cache.py stats            # bytes by kind of file in the cache

A kernel loaded this way has no ``asm["ptx"]``: code that reads a kernel's PTX compiles it with
``TRITON_ALWAYS_COMPILE=1`` (``tests/kernels/_sm90.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

# What a cache hit never reads: the IR Triton keeps beside each binary for debugging and `asm`.
DROPPED_SUFFIXES = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".hsaco_ir")
DEFAULT_MAX_MIB = 56


def cache_dir(given: str | None = None) -> Path:
    """The cache Triton uses here: `given`, else ``TRITON_CACHE_DIR``, else Triton's default."""
    if given:
        return Path(given)
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    return Path.home() / ".triton" / "cache"


def kept(path: Path) -> bool:
    """Whether `path` (a file in the cache) travels: not IR, not a lock, not a half-written temporary."""
    name = path.name
    return not (name.endswith(DROPPED_SUFFIXES) or name == "lock" or ".tmp." in name)


def save(root: Path, out: Path, max_mib: float = DEFAULT_MAX_MIB) -> dict:
    """Write the cache's kept files under `root` to `out` (xz tar, written to a temporary and renamed);
    refuse (nothing written, ValueError) when the archive would exceed `max_mib`. Returns counts."""
    if not root.is_dir():
        raise ValueError(f"no Triton cache at {root} (set TRITON_CACHE_DIR or pass --cache-dir)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and kept(p))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:xz", preset=6) as tar:
            for p in files:
                tar.add(p, arcname=str(p.relative_to(root)), recursive=False)
        size = os.path.getsize(tmp)
        if size > max_mib * 2**20:
            raise ValueError(f"the archive is {size / 2**20:.1f} MiB, over --max-mib {max_mib}: not kept")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    entries = len({p.relative_to(root).parts[0] for p in files})
    return {"entries": entries, "files": len(files), "bytes": size}


def load(archive: Path, root: Path) -> dict:
    """Extract `archive` (from :func:`save`) into the cache `root`; members that would land outside it,
    links and devices are refused by tarfile's ``data`` filter. A group file names its children by
    absolute path, so they are pointed at `root`: the cache may have been saved from another directory.
    Returns counts."""
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        tar.extractall(root, filter="data")
    for m in members:
        path = root / m.name
        if m.isfile() and path.name.startswith("__grp__"):
            _repoint_group(path)
    return {"entries": len({Path(m.name).parts[0] for m in members}), "files": len(members)}


def _repoint_group(path: Path) -> None:
    """Rewrite a group file's ``child_paths`` to the files beside it (written to a temporary, renamed)."""
    group = json.loads(path.read_text())
    children = group.get("child_paths")
    if not isinstance(children, dict):
        raise ValueError(f"{path}: a Triton group file without child_paths")
    group["child_paths"] = {name: str(path.parent / Path(p).name) for name, p in children.items()}
    tmp = path.with_name(path.name + ".tmp.restore")
    tmp.write_text(json.dumps(group))
    os.replace(tmp, path)


def stats(root: Path) -> dict:
    """Bytes by file suffix in the cache `root`, and how many of them :func:`save` keeps."""
    by_kind: Counter = Counter()
    kept_bytes = 0
    for p in root.rglob("*"):
        if p.is_file():
            size = p.stat().st_size
            by_kind[p.suffix or p.name] += size
            kept_bytes += size if kept(p) else 0
    return {"bytes_by_kind": dict(by_kind.most_common()), "kept_bytes": kept_bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("verb", choices=["save", "load", "stats"])
    parser.add_argument("archive", nargs="?", help="the .txz to write (save) or read (load)")
    parser.add_argument("--cache-dir", help="Triton's cache (default: $TRITON_CACHE_DIR, else Triton's own)")
    parser.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB, help="save: refuse above this size")
    args = parser.parse_args(argv)
    root = cache_dir(args.cache_dir)
    if args.verb != "stats" and not args.archive:
        parser.error(f"{args.verb} needs the archive's path")
    try:
        if args.verb == "save":
            got = save(root, Path(args.archive), args.max_mib)
            mib = got["bytes"] / 2**20
            print(f"triton_cache: saved {got['entries']} kernels, {mib:.2f} MiB -> {args.archive}")
        elif args.verb == "load":
            got = load(Path(args.archive), root)
            print(f"triton_cache: loaded {got['entries']} kernels into {root}")
        else:
            print(stats(root))
    except (ValueError, OSError, tarfile.TarError, json.JSONDecodeError) as exc:
        print(f"triton_cache: {args.verb}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
