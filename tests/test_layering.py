"""The house's layering, read from the source: no import cycle among the SDK's modules.

Every ``import`` / ``from ... import`` of a module of ``instrument`` or ``exporters`` counts,
at module level or inside a function (a lazy import is still a dependency), except under
``if TYPE_CHECKING:`` (annotations only). A cycle means two rooms that each need the other:
the data path (call -> range -> session -> window -> report -> pipeline -> exporters) runs one
way.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("instrument", "exporters")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """What ``module`` imports, outside ``if TYPE_CHECKING:`` blocks: ``a.b`` for ``import a.b``,
    ``a.b:c`` for ``from a.b import c`` (``c`` a submodule or a name of ``a.b``)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            # ``from pkg import name``: the submodule ``pkg.name`` where there is one (resolved
            # by the caller, which knows the files), else the package's own namespace
            found.update(f"{target}:{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def dependency_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps = {_resolve(d, files) for d in _imports(tree, name, path.name == "__init__.py")}
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _resolve(imported: str, files: dict[str, Path]) -> str:
    """``pkg:sub`` -> ``pkg.sub`` where that module exists, else ``pkg`` (a name defined there).

    Importing ``pkg.mod`` also runs ``pkg/__init__``; that implicit edge is left out: a package's
    ``__init__`` re-exporting its rooms is its public face, not a dependency of the rooms."""
    target, _, name = imported.partition(":")
    return f"{target}.{name}" if name and f"{target}.{name}" in files else target


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                connect(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def _edges_within(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    return [f"{a} -> {b}" for a in members for b in sorted(graph[a]) if b in members]


def test_the_checker_finds_a_cycle_through_a_lazy_import_but_not_a_type_checking_one():
    lazy = ast.parse("def f():\n    from .b import x\n")
    typed = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    assert _imports(lazy, "p.a", False) == {"p.b:x"}
    assert _imports(typed, "p.b", False) == {"typing:TYPE_CHECKING"}
    files = {"p": Path("p/__init__.py"), "p.b": Path("p/b.py"), "p.b.x": Path("p/b/x.py")}
    assert _resolve("p.b:x", files) == "p.b.x" and _resolve("p:Thing", files) == "p"
    assert find_cycles({"p.a": {"p.b"}, "p.b": set()}) == []
    assert find_cycles({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == [["p.a", "p.b", "p.c"]]


def test_no_import_cycle_among_the_sdks_modules():
    graph = dependency_graph()
    assert "instrument.sessions" in graph and "exporters.console" in graph
    cycles = find_cycles(graph)
    found = "\n".join(f"  {', '.join(c)}: {'; '.join(_edges_within(graph, c))}" for c in cycles)
    assert not cycles, "import cycles (each a set of modules that import each other):\n" + found
