"""Compile a Triton kernel for sm_90 on a machine without a GPU and say what its code holds.

Triton compiles ahead of time for a named target and its bundled ptxas assembles the PTX, so CI can
check that a kernel's products are wgmma on the operands we meant, its tiles fit in shared memory and
ptxas spills nothing, before the H200 ever runs it. The kernel tests' conftest switches Triton to its
CPU interpreter, under which nothing compiles: each case runs in a child process without it
(:func:`run_in_child`, which calls ``module:function`` through this module's ``__main__``). One child
serves a test process's cases in turn: starting Python with torch and Triton took about half of a
case's CPU time (2.3 of 4.9 s) when each case had a child of its own.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ptxas_path() -> str:
    """Triton's bundled ptxas (the one its compiler targets)."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def needs_ptxas() -> None:
    """Skip, with the reason, where nothing can assemble sm_90 code."""
    pytest.importorskip("triton")
    if not (os.path.exists(ptxas_path()) or shutil.which("ptxas")):
        pytest.skip("Triton's ptxas is not installed: nothing assembles sm_90 here")


def assemble(ptx: str) -> dict:
    """Assemble `ptx` for sm_90a with ``ptxas -v``: its return code, the tail of its report and the
    spill stores it reports per function."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        Path(path).write_text(ptx)
        run = subprocess.run(
            [ptxas_path(), "-v", "-arch=sm_90a", path, "-o", os.devnull], capture_output=True, text=True
        )
    return {
        "ptxas_rc": run.returncode,
        "ptxas": run.stderr[-800:],
        "spills": [int(s) for s in re.findall(r"(\d+) bytes spill stores", run.stderr)],
    }


def count_ops(ptx: str) -> dict[str, int]:
    """How many times each PTX instruction (with its type suffixes) occurs, predicated or not."""
    counts: dict[str, int] = {}
    for op in re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)", ptx, flags=re.M):
        counts[op] = counts.get(op, 0) + 1
    return counts


def inline_ops(ptx: str) -> dict[str, int]:
    """How many times each instruction occurs inside inline-PTX blocks (``{ op ...; op ...; }`` lines,
    which :func:`count_ops` does not see), with ``prmt.b32`` keyed by its selector too."""
    counts: dict[str, int] = {}
    for block in re.findall(r"^\s*\{([^}]*)\}", ptx, flags=re.M):
        for stmt in block.split(";"):
            words = stmt.split()
            if not words or words[0].startswith("."):
                continue
            op = words[0] + (" " + words[-1] if words[0] == "prmt.b32" else "")
            counts[op] = counts.get(op, 0) + 1
    return counts


def compile_sm90(src, options: dict):
    """``triton.compile`` for sm_90 with the kernel's PTX at hand: an entry of a cache restored by
    ``benchmarks/triton_cache.py`` holds the binary alone, so where the cached kernel lacks its PTX it
    is compiled anew."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    if "ptx" in kernel.asm:
        return kernel
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.always_compile = True
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_facts(
    fn, pointers: dict, ints: dict, consts: dict, num_warps: int, num_stages: int, scalars: dict | None = None
) -> dict:
    """Compile the ``@triton.jit`` kernel `fn` for sm_90 as its launcher specializes it: pointers
    (name -> Triton type) 16-byte aligned, the runtime ints divisible by 16 marked so, `consts` as
    constexprs (a constexpr left out: its default), `scalars` (name -> Triton type, e.g. ``"fp32"``) as
    given, every other argument an i32 (an argument a launch passes as None: give it in `consts`).
    Returns the instruction counts (outside and inside inline PTX), the number of 16-byte ``cp.async``
    copies, the shared memory and :func:`assemble`'s facts."""
    from triton.compiler import ASTSource

    names = fn.arg_names
    scalars = scalars or {}
    # constexprs left out take their defaults, as the launcher gives them (not a runtime i32 argument)
    consts = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default} | consts
    sig = {a: "constexpr" if a in consts else pointers.get(a, scalars.get(a, "i32")) for a in names}
    aligned = [a for a in names if a in pointers or (a in ints and a not in consts and ints[a] % 16 == 0)]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    kernel = compile_sm90(src, opts)
    ptx = kernel.asm["ptx"]
    return {
        "counts": count_ops(ptx),
        "inline": inline_ops(ptx),
        "cp_async_16": len(re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)),
        "shared": kernel.metadata.shared,
    } | assemble(ptx)


def _child_env() -> dict[str, str]:
    """This process's environment without ``TRITON_INTERPRET``, with the repository importable."""
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


class _Child:
    """A Python without ``TRITON_INTERPRET`` that calls one ``module:function`` a request: a JSON line
    ``[target, args]`` in, a JSON line ``{"ok": result}`` or ``{"error": traceback}`` out. Its stderr
    (and anything written to its fd 1) goes to a file, so no pipe fills while it compiles."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  (open while the child lives; closed by stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kernels._sm90", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=_child_env(),
            cwd=REPO,
        )

    def call(self, target: str, args: list, timeout: float) -> dict:
        """The reply to one request; the child is stopped if it does not answer within `timeout`."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([target, args]).encode() + b"\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            err = self.stderr()
            self.stop()
            raise AssertionError(f"{target}: the child ended or gave no answer in {timeout} s:\n{err}")
        return json.loads(line)

    def stderr(self) -> str:
        """The last 2,000 characters the child wrote to stderr."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        """End the child (closing its stdin ends its loop) and drop its log."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


_child: _Child | None = None


def _stop_child() -> None:
    """At exit: end this process's shared child (it would also end at its stdin's EOF)."""
    if _child is not None:
        _child.stop()


atexit.register(_stop_child)


def run_in_child(target: str, *args, fresh: bool = False) -> dict:
    """Call ``target`` (``"package.module:function"``) with `args` in a Python without
    ``TRITON_INTERPRET``, and return its JSON result. The child is shared by this process's calls, so a
    target must leave Triton's settings and module globals as it found them; `fresh`: a child of its own
    (for a target that changes them, or that must see a newly started Python)."""
    global _child
    if fresh:
        run = subprocess.run(
            [sys.executable, "-m", "tests.kernels._sm90", target, json.dumps(list(args))],
            capture_output=True,
            text=True,
            env=_child_env(),
            timeout=300,
            cwd=REPO,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        return json.loads(run.stdout.strip().splitlines()[-1])
    if _child is None or _child.proc.poll() is not None:
        if _child is not None:
            _child.stop()
        _child = _Child()
    reply = _child.call(target, list(args), timeout=300)
    assert "ok" in reply, reply["error"][-2000:]
    return reply["ok"]


def _call(target: str, args: list) -> object:
    """``module:function`` called with `args` (in the child)."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)(*args)


def _serve() -> None:
    """The shared child's loop: answer each request line on the original stdout, with fd 1 pointed at
    stderr meanwhile (ptxas, Triton or a print must not mix into the replies)."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        target, args = json.loads(line)
        try:
            reply = {"ok": _call(target, args)}
        except Exception:  # the traceback goes back to the test, which fails with it
            reply = {"error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve()
    else:
        print(json.dumps(_call(sys.argv[1], json.loads(sys.argv[2]))))
