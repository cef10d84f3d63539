"""Does a kernel edit leave the INT4 tensor-core GEMV's default code alone? Compile its launched forms for
sm_90 on this machine (no GPU needed: Triton's bundled ptxas) from the working tree and from a git revision,
and compare registers, spills and the PTX less its debug lines.

    PYTHONPATH=. python3 benchmarks/ptx_diff_int4_mma.py --rev HEAD

Why: session 21 moved the loop constants of every form above the PDL wait while adding an opt-in branch;
under gate_up's register cap the spill went from 16 bytes to 204 and the 8B INT4 single stream from 2.05 to
2.88 ms/token, unseen until a GPU ran it (BENCHMARKS.md, session 22). Exit status 1 when a form's PTX differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.kernels._sm90 import assemble  # (ptxas -v on sm_90a: its report and the spill bytes)

REPO = Path(__file__).resolve().parents[1]
KERNEL = "trtforge/kernels/int4_mma.py"
# (name, norm, gated, residual, K) at Llama-3-8B shapes, as the decode layer launches them
FORMS = (
    ("qkv", True, False, False, 4096),
    ("gate_up", True, True, False, 4096),
    ("down", False, False, True, 14336),
)


def load(path: Path, name: str):
    """The kernel module at `path`, imported under `name` (beside the installed trtforge)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def compile_form(mod, norm: bool, gated: bool, res: bool, k: int, bf16: bool = True) -> dict:
    """The form's launch for sm_90 as :func:`launch` makes it (the module's knobs, PDL on): registers,
    spill bytes and the PTX without debug lines."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = mod._int4_mma_kernel
    dt = "bf16" if bf16 else "fp16"
    ptrs = {"X": f"*{dt}", "Wm": "*i32", "Scales": "*fp16", "Offsets": "*fp16", "Out": f"*{dt}",
            "Res": f"*{dt}", "NormW": f"*{dt}"}  # fmt: skip
    warps, u = mod.launch_rule(k, gated, norm)
    consts = {"NORM": norm, "GATED": gated, "HAS_RES": res, "NW": warps, "R": 2 if gated else 1, "BF16": bf16,
              "KW": k // 2 if norm else 0, "U": u, "PDL": bool(mod.EARLY_WEIGHTS)}  # fmt: skip
    names = fn.arg_names
    if "FIRST_EARLY" in names:
        consts["FIRST_EARLY"] = bool(getattr(mod, "FIRST_LOADS_EARLY", False))
    if "ONE_PASS" in names:
        consts["ONE_PASS"] = bool(getattr(mod, "ONE_PASS_NORM", False)) and k <= mod.ONE_PASS_MAX_K
    for param in fn.params:  # (a revision's other opt-in constexprs: their defaults, as launch leaves them)
        if param.is_constexpr and param.has_default and param.name not in consts:
            consts[param.name] = param.default
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "fp32" if a == "eps" else "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in ptrs}
    options = {"num_warps": warps}
    cap = mod.MAXNREG or (mod.GATED_MAXNREG if gated else None)
    if cap:
        options["maxnreg"] = cap
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    facts = assemble(ptx)
    if facts["ptxas_rc"]:
        raise RuntimeError(f"ptxas failed on {mod.__name__}: {facts['ptxas']}")
    regs = re.findall(r"Used (\d+) registers", facts["ptxas"])
    code = []
    in_debug = False
    for line in ptx.splitlines():
        if line.startswith("\t.section") and "debug" in line:
            in_debug = True
        if in_debug or re.match(r"\s*(\.loc|\.file|//)", line) or re.match(r"\s*\$L__", line):
            continue
        code.append(re.sub(r"int4_mma\w*", "K", line))
    return {
        "registers": int(regs[0]) if regs else None,
        "spill": max(facts["spills"], default=0),
        "code": code,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="git revision to compare the working tree's kernel against")
    args = ap.parse_args()
    old_src = subprocess.run(
        ["git", "show", f"{args.rev}:{KERNEL}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        old_path = Path(tmp) / "int4_mma_rev.py"
        old_path.write_text(old_src)
        old = load(old_path, "trtforge.kernels.int4_mma_rev")
        new = load(REPO / KERNEL, "trtforge.kernels.int4_mma_tree")
        differs = 0
        for name, norm, gated, res, k in FORMS:
            a, b = compile_form(old, norm, gated, res, k), compile_form(new, norm, gated, res, k)
            same = a["code"] == b["code"]
            differs += not same
            print(
                f"{name:8s} {args.rev}: {a['registers']} registers, {a['spill']} B spilled | tree: "
                f"{b['registers']} registers, {b['spill']} B spilled | PTX {'same' if same else 'DIFFERS'}"
            )
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
