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
        for dep in sorted(graph.get(node, ())):
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
    assert "instrument.runtime.profiling_session" in graph and "exporters.console" in graph
    cycles = find_cycles(graph)
    found = "\n".join(f"  {', '.join(c)}: {'; '.join(_edges_within(graph, c))}" for c in cycles)
    assert not cycles, "import cycles (each a set of modules that import each other):\n" + found


# ---------------------------------------------------------------- the command imports no torch

# The command's rooms: every import in them counts, a lazy one too (it runs when a command
# does). The rest of what they reach counts at module level: a runtime function's lazy import
# (``collectives._wrap`` reaching ``state``) runs only in a profiled program.
CLI_ROOMS = (
    "instrument",
    "instrument.__main__",
    "instrument.cli",
    "instrument.cli.inputs",
    "instrument.cli.diff",
    "instrument.cli.gate",
    "instrument.cli.metrics_summary",
    "instrument.cli.html_command",
    "instrument.cli.settings_table",
)
# the package face binds its public names in _load_runtime, at a program's first use of one
FACE_LOADER = "_load_runtime"


def _top_level_imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """``_imports`` of the statements that run at import: not inside a function or class."""
    body = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return _imports(ast.Module(body=body, type_ignores=[]), module, is_package)


def _without(tree: ast.Module, function: str) -> ast.Module:
    body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == function)]
    return ast.Module(body=body, type_ignores=[])


def torch_reached_by_the_command() -> dict[str, list[str]]:
    """Module -> the torch modules it imports, for every module the command can import."""
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    found: dict[str, list[str]] = {}
    todo, seen = list(CLI_ROOMS), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        path = files[name]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        if name == "instrument":
            deps = _imports(_without(tree, FACE_LOADER), name, is_package)
        elif name in CLI_ROOMS:
            deps = _imports(tree, name, is_package)
        else:
            deps = _top_level_imports(tree, name, is_package)
        torch = sorted(d for d in deps if d.partition(":")[0].partition(".")[0] == "torch")
        if torch:
            found[name] = torch
        todo.extend(_resolve(d, files) for d in deps)
    assert "instrument.analysis.analyze" in seen and "instrument.runtime.triggers" in seen, sorted(
        seen
    )
    return found


def test_the_command_and_the_package_face_reach_no_torch():
    """``torch-profiled`` (``instrument.cli``, ``python -m instrument``) and ``import
    instrument`` import no torch, read from the source (tests/test_cli_start.py runs them):
    a module-level ``import torch`` anywhere they reach would cost every command ~1-3 s."""
    assert torch_reached_by_the_command() == {}


def test_the_torch_check_sees_a_lazy_import_in_the_command_and_a_module_level_one_beyond():
    lazy = ast.parse("import os\ndef f():\n    import torch\nclass C:\n    import json\n")
    assert _top_level_imports(lazy, "p.a", False) == {"os", "json"}
    assert _imports(lazy, "p.a", False) == {"os", "torch", "json"}
    face = ast.parse(f"from . import a\ndef {FACE_LOADER}():\n    from .b import c\n")
    assert _imports(_without(face, FACE_LOADER), "p", True) == {"p:a"}
