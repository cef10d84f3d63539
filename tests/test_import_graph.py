"""No import cycles among trtforge modules, counting lazy (function-level) and TYPE_CHECKING imports.

An edge A -> B is any `import`/`from ... import` in A's source that names module B, or a package
B that holds it (Python runs a package's ``__init__`` before its submodules). An import of one of A's
own parent packages is not an edge: that package has always finished running before A starts, and
every submodule depends on it anyway, so counting it would make every package facade a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under root/package."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: Path, package: str, parents: bool = True) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line number}, over every import statement in the package.

    With ``parents`` an import also counts as one of every package above its target (their
    ``__init__`` runs first: what a cycle check needs); without, only the module named.
    """
    mods = _modules(root, package)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        own_parents = set(_parents(mod))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from P import n` imports submodule P.n when there is one, else a name defined in P.
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                target = known(name)
                if target is None:
                    continue
                for t in [*_parents(target), target] if parents else [target]:
                    if t != mod and t not in own_parents and t in mods:
                        graph[mod].setdefault(t, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(graph: dict[str, dict[str, int]], comp: list[str]) -> str:
    inside = set(comp)
    return "\n".join(
        f"  {a} -> {b} (line {line})" for a in comp for b, line in sorted(graph[a].items()) if b in inside
    )


def test_no_import_cycles_in_trtforge():
    graph = import_graph(ROOT, "trtforge")
    assert graph.get("trtforge.runtime.session")  # the scan saw the code
    found = cycles(graph)
    assert not found, "import cycles among trtforge modules:\n" + "\n".join(
        _describe(graph, c) for c in found
    )


def test_scanner_sees_lazy_type_checking_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg import VERSION\nA = 1\ndef f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n"
    )
    (pkg / "c.py").write_text("def g():\n    import pkg.a\n")
    (pkg / "d.py").write_text("from pkg.sub import b\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg"] == {"pkg.a": 1}
    assert graph["pkg.a"] == {"pkg.sub": 4, "pkg.sub.b": 4}  # `from pkg import VERSION`: own parent
    assert graph["pkg.sub.b"] == {"pkg.c": 3}
    assert graph["pkg.d"] == {"pkg.sub": 1, "pkg.sub.b": 1}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
