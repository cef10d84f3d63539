"""The house's layer rules (README "Layout"): every import in trtforge runs downhill.

Each module belongs to one room (its longest listed prefix); a room may import only the rooms it
lists. Lazy (function-level) and TYPE_CHECKING imports count: a lazy uphill import is still a
dependency. An import counts for the module it names, not for the packages above it. Shims of old
import paths (a module that only calls ``trtforge._compat.moved``) are exempt: they are aliases.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_import_graph import ROOT, import_graph

BASE = (
    "trtforge.errors",
    "trtforge._fileio",
    "trtforge._usercode",
    "trtforge._custom_ops",
    "trtforge._compat",
    "trtforge._lazy",
)

# room -> module prefixes (the longest matching prefix decides a module's room)
ROOMS: dict[str, tuple[str, ...]] = {
    "base": BASE,
    "core": ("trtforge.core",),
    "kernels": ("trtforge.kernels",),
    "numerics": ("trtforge.numerics",),
    "plugins": ("trtforge.plugins",),
    "passes": ("trtforge.passes",),
    "calibration": ("trtforge.calibration",),
    "runtime": ("trtforge.runtime",),
    "reports": ("trtforge.reports",),
    "compiler": ("trtforge.compiler",),
    "llm.ground": (
        "trtforge.llm.contract",
        "trtforge.llm.vocab",
        "trtforge.llm.prompts",
        "trtforge.llm.sampling",
        "trtforge.llm.penalties",
        "trtforge.llm.structured",
        "trtforge.llm.host_to_device",
        "trtforge.llm.executors.base",
    ),
    "llm.models": ("trtforge.llm.models",),
    "llm.quant": ("trtforge.llm.quant",),
    "llm.sched": ("trtforge.llm.sched",),
    "llm.executors": ("trtforge.llm.executors",),
    "llm.compile": ("trtforge.llm.compile",),
    "llm.spec": ("trtforge.llm.spec",),
    "llm": ("trtforge.llm",),
    "llm.report": ("trtforge.llm.report",),
    "cli": ("trtforge.cli",),
    "front": ("trtforge", "trtforge.demo"),
}

_ENCODER = {"base", "core", "kernels", "numerics", "plugins", "passes", "calibration", "runtime"}
ALLOWED: dict[str, set[str]] = {
    "base": {"base"},
    "core": {"base"},
    "kernels": {"base", "core"},
    "numerics": {"base", "core"},
    "plugins": {"base", "core", "kernels"},
    "calibration": {"base", "core", "numerics"},
    "passes": {"base", "core", "numerics", "plugins", "calibration"},
    "runtime": {"base", "core", "kernels", "plugins"},
    "compiler": _ENCODER,
    # A report compiles and exports the model for its targets: the encoder wing's top floor.
    "reports": _ENCODER | {"compiler"},
    "llm.ground": {"base", "core"},
    "llm.models": {"base", "core", "kernels", "llm.ground"},
    "llm.quant": {"base", "core", "kernels", "llm.ground", "llm.models"},
    "llm.sched": {"base", "llm.ground"},
    "llm.executors": {
        "base",
        "core",
        "kernels",
        "plugins",
        "numerics",
        "runtime",
        "llm.ground",
        "llm.models",
        "llm.quant",
    },
    "llm.compile": _ENCODER | {"compiler", "llm.ground", "llm.models"},
    # speculative decoding's proposers (a draft model runs on an executor over its own block manager)
    "llm.spec": {"base", "core", "llm.ground", "llm.models", "llm.sched", "llm.executors"},
    "llm": {
        "base",
        "core",
        "kernels",
        "numerics",
        "runtime",
        "llm.ground",
        "llm.models",
        "llm.quant",
        "llm.sched",
        "llm.executors",
        "llm.spec",
    },
    # The LLM comparison report measures every serving and step-graph variant and renders with the
    # encoder report's machinery: the top floor of both wings.
    "llm.report": _ENCODER
    | {"compiler", "reports", "llm.ground", "llm.models", "llm.sched", "llm.executors"}
    | {"llm.compile", "llm"},
    "cli": set(ROOMS),
    "front": set(ROOMS),
}


def room_of(module: str) -> str:
    """The room of a dotted module name: the room of its longest listed prefix."""
    best, length = None, -1
    for room, prefixes in ROOMS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > length:
                best, length = room, len(p)
    if best is None:
        raise AssertionError(f"{module} is in no room of tests/test_layers.py: give it one")
    return best


def is_shim(path: Path) -> bool:
    """A module whose code is only ``moved(__name__, ...)`` (plus its docstring and the import)."""
    body = [
        n
        for n in ast.parse(path.read_text(encoding="utf-8")).body
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    ]
    if len(body) != 2 or not isinstance(body[0], ast.ImportFrom) or body[0].module != "trtforge._compat":
        return False
    call = body[1].value if isinstance(body[1], ast.Expr) else None
    return isinstance(call, ast.Call) and getattr(call.func, "id", "") == "moved"


def uphill(root: Path, package: str = "trtforge") -> list[str]:
    graph = import_graph(root, package, parents=False)
    found = []
    for mod, targets in sorted(graph.items()):
        path = root.joinpath(*mod.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if is_shim(path):
            continue
        src = room_of(mod)
        for target, line in sorted(targets.items()):
            dst = room_of(target)
            if dst != src and dst not in ALLOWED[src]:
                found.append(f"{mod} ({src}) -> {target} ({dst}), line {line}")
    return found


def test_every_import_runs_downhill():
    found = uphill(ROOT)
    assert not found, "uphill imports (tests/test_layers.py has the rules):\n  " + "\n  ".join(found)


def test_rules_are_a_hierarchy():
    """No two rooms may import each other: the rules themselves have no cycle."""
    for a, allowed in ALLOWED.items():
        for b in allowed - {a}:
            assert a not in ALLOWED[b] or b in ("cli", "front") or a in ("cli", "front"), (a, b)


@pytest.mark.parametrize(
    ("where", "line", "expect"),
    [
        ("trtforge/core/manifest.py", "from trtforge.compiler.build import BuildOptions", "core"),
        ("trtforge/runtime/engine.py", "from trtforge.compiler import pipeline", "runtime"),
        ("trtforge/llm/executors/torch_exec.py", "from trtforge.llm.compile import export", "llm.executors"),
        ("trtforge/kernels/gemv.py", "    from trtforge.llm.models import families", "kernels"),
        ("trtforge/compiler/pipeline.py", "from trtforge.llm import service", "compiler"),
        ("trtforge/compiler/build.py", "from trtforge.reports.api import build_report", "compiler"),
        ("trtforge/llm/sched/scheduler.py", "from trtforge.llm.executors import torch_exec", "llm.sched"),
    ],
)
def test_an_uphill_import_is_caught(tmp_path, where, line, expect):
    """Mutation check: copy the package, add one uphill import (lazy ones too), see the rule fail."""
    import shutil

    shutil.copytree(ROOT / "trtforge", tmp_path / "trtforge")
    target = tmp_path / where
    target.write_text(
        target.read_text(encoding="utf-8")
        + f"\n\ndef _mutant():\n{line if line.startswith(' ') else '    ' + line}\n"
    )
    found = uphill(tmp_path)
    assert any(f.startswith(where[:-3].replace("/", ".") + f" ({expect})") for f in found), found


def test_every_package_says_what_lives_there_and_what_it_may_import():
    """Each folder's ``__init__`` docstring names its contents and its imports (README "Layout")."""
    missing = []
    for init in sorted((ROOT / "trtforge").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        if not doc:
            missing.append(f"{init.relative_to(ROOT)}: no docstring")
        elif "import" not in doc:
            missing.append(f"{init.relative_to(ROOT)}: the docstring does not say what it may import")
    assert not missing, "\n".join(missing)
