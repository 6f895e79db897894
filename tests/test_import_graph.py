"""The package has no import circle.

A circle among top-level imports makes a module's names depend on which module of the
circle was imported first (a half-initialised module hands out what it has so far). A
circle closed by a lazy import (inside a function) or a ``TYPE_CHECKING`` import runs,
but still ties the modules' jobs together: muongen.train.step imported
muongen.train.graphs inside a method, and graphs imported step back for its type hints
(issue 52). So two checks: none among the package's top-level imports (module bodies,
their ``if``/``try`` blocks included), and none even counting the imports inside
functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import muongen

PACKAGE = Path(muongen.__file__).parent


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(node: ast.AST):
    """The import statements of a module body, in its if/try/with blocks too, but not
    inside functions or classes."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from top_level_imports(child)


def all_imports(node: ast.AST):
    """Every import statement of a module, lazy ones inside functions too."""
    return (n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))


def import_graph(root: Path = PACKAGE, imports=top_level_imports) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules its ``imports`` name
    (``from a.b import c`` names ``a.b.c`` where that is a module, else ``a.b``)."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_pkg = path.name == "__init__.py"
        edges = set()
        for imp in imports(ast.parse(path.read_text(), str(path))):
            if isinstance(imp, ast.Import):
                targets = [a.name for a in imp.names]
            else:
                base = imp.module or ""
                if imp.level:  # relative: up from this module's package
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (imp.level - 1)]
                    base = ".".join([*pkg, base] if base else pkg)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in imp.names
                ]
            edges |= {t for t in targets if t in paths and t != name}
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert "muongen.train.step" in graph and "muongen.train.graphs" in graph
    assert circles(graph) == []


def test_no_circle_even_through_lazy_imports():
    """Not even a lazy import closes a circle anywhere in the package: fails on the step of
    before issue 52 (step -> graphs lazily, graphs -> step for type checking), and on the
    first forms of the URL checkpoints (checkpoint -> storage.publish lazily), the
    leaderboard (compare <-> leaderboard) and the local sweep (chain <-> sweep)."""
    graph = import_graph(imports=all_imports)
    assert "muongen.train.graphs" in graph["muongen.train.step"]
    assert circles(graph) == []


def test_the_walk_finds_a_circle(tmp_path):
    """The checker itself: a circle through a TYPE_CHECKING import and a relative import
    is found, a lazy import inside a function is not an edge."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import thing\n"
    )
    (pkg / "c.py").write_text("def f():\n    import pkg.a\n")
    (pkg / "sub" / "d.py").write_text("from . import b\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.c"] == set()
    assert graph["pkg.sub.d"] == {"pkg.sub.b"}
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]
    (pkg / "sub" / "b.py").write_text("def g():\n    from pkg.c import f\n")
    assert circles(import_graph(pkg)) == []
    (pkg / "c.py").write_text("def f():\n    import pkg.a\n")
    assert circles(import_graph(pkg, all_imports)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
