"""The layers of ``instrument``, read from the source (fast) and checked in real processes.

    instrument/__init__, __main__, testing, integrations/   the public face
    instrument/cli/        the torch-profiled command
    instrument/runtime/    the profiled process         instrument/export/   a stopped window to
                                                                             the exporters
    instrument/analysis/   torch-free: a window's events -> a report's numbers
    exporters/             console, trace file, json, otel, prometheus, html, memory
    instrument/base/       torch-free leaf: the report (the contract), settings, warnings, files

Each layer imports only the layers below it (``IMPORTS``); the runtime and the export plumbing
import each other's modules (sessions, windows and stops hand their windows to the export; the
report builder reads the runtime's state and ledger), never in a cycle. Every import counts:
at module level, inside a function (it runs when the function does) and under ``if
TYPE_CHECKING:`` (a cycle there is a cycle of the design, even if Python never runs it).
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import tomllib

from tests import _proc
from tests.test_layering import _module_name, find_cycles

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("instrument", "exporters")

LAYERS = (
    "instrument.base",
    "instrument.analysis",
    "instrument.runtime",
    "instrument.export",
    "instrument.cli",
    "exporters",
)
# what each layer may import of instrument and exporters (third-party and the standard
# library aside); the public face (instrument/__init__, __main__, testing, integrations) may
# import any layer
IMPORTS = {
    "instrument.base": {"instrument.base"},
    "instrument.analysis": {"instrument.base", "instrument.analysis"},
    "exporters": {"instrument.base", "exporters"},
    "instrument.runtime": {
        "instrument.base",
        "instrument.analysis",
        "instrument.runtime",
        "instrument.export",
        "exporters",
    },
    "instrument.export": {
        "instrument.base",
        "instrument.analysis",
        "instrument.runtime",
        "instrument.export",
        "exporters",
    },
    # ``instrument`` itself: ``__version__``
    "instrument.cli": {
        "instrument",
        "instrument.base",
        "instrument.analysis",
        "instrument.runtime",
        "instrument.cli",
        "exporters",
    },
}
FACE = ("instrument", "instrument.__main__", "instrument.testing", "instrument.integrations")
# (and the modules of instrument.integrations)
# each with a module it must hold (the walk below found the package's modules)
TORCH_FREE = {
    "instrument.base": "instrument.base.report",
    "instrument.analysis": "instrument.analysis.analyze",
    "instrument.cli": "instrument.cli.inputs",
}

# Import edges that would close a cycle, each with its reason. None: where a module must name a
# type whose module imports it, it names it by a protocol (``state.Session``, ``state.Stops``).
ALLOWED_CYCLE_EDGES: dict[tuple[str, str], str] = {}


# ---------------------------------------------------------------- reading the source


def source_files() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module ``module`` imports, at any depth and under ``if TYPE_CHECKING:`` too:
    ``from pkg import name`` is ``pkg.name`` where that module is ``known``, else ``pkg``."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    found.discard(module)
    return found


def dependency_graph() -> dict[str, set[str]]:
    """Module -> the modules of ``instrument`` and ``exporters`` it imports (the implicit
    import of a package's ``__init__`` by its modules left out)."""
    files = source_files()
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps = imports_of(tree, name, path.name == "__init__.py", set(files))
        graph[name] = {d for d in deps if d in files}
    return graph


def layer_of(module: str) -> str | None:
    """The layer a module belongs to (None: the public face)."""
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


# ---------------------------------------------------------------- the rules, on the source


def test_the_reader_sees_lazy_typing_and_relative_imports_and_the_cycle_finder_their_cycles():
    code = (
        "from typing import TYPE_CHECKING\n"
        "from .b import x\n"
        "from . import c\n"
        "if TYPE_CHECKING:\n"
        "    from ..base.report import WindowReport\n"
        "def f():\n"
        "    import exporters.console\n"
    )
    known = {"p.runtime.b", "p.runtime.c", "p.base.report", "exporters.console"}
    assert imports_of(ast.parse(code), "p.runtime.a", False, known) == {
        "typing",
        "p.runtime.b",
        "p.runtime.c",
        "p.base.report",
        "exporters.console",
    }
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("instrument.runtime.state") == "instrument.runtime"
    assert layer_of("instrument.testing") is None and layer_of("exporters.otel") == "exporters"


def test_every_module_of_instrument_lives_in_a_layer_or_is_the_public_face():
    """A new module goes into the layer it belongs to (the face: the public API only)."""
    stray = [
        m
        for m in source_files()
        if layer_of(m) is None and m not in FACE and not m.startswith("instrument.integrations.")
    ]
    assert not stray, f"modules outside the layers: {stray}"


def test_each_layer_imports_only_the_layers_below_it():
    """The base imports nothing of the other layers; the analysis only the base; exporters only
    the base (never torch or instrument's internals); nothing below the command imports it."""
    wrong = []
    for module, deps in sorted(dependency_graph().items()):
        layer = layer_of(module)
        if layer is None:
            continue
        for dep in sorted(deps):
            target = layer_of(dep) or ("instrument" if dep == "instrument" else dep)
            if target not in IMPORTS[layer]:
                wrong.append(f"{module} ({layer}) imports {dep}")
    assert not wrong, "imports against the layers:\n  " + "\n  ".join(wrong)


def test_no_import_cycle_even_through_type_checking_imports():
    graph = dependency_graph()
    stale = [edge for edge in ALLOWED_CYCLE_EDGES if edge[1] not in graph.get(edge[0], ())]
    assert not stale, f"these imports are gone: remove them from ALLOWED_CYCLE_EDGES: {stale}"
    for source, target in ALLOWED_CYCLE_EDGES:
        graph[source] = graph[source] - {target}
    cycles = find_cycles(graph)
    found = "\n".join(
        "  "
        + ", ".join(c)
        + ": "
        + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        for c in cycles
    )
    assert not cycles, "import cycles (modules that import each other):\n" + found
    # each allowed edge does close a cycle (else it needs no allowance)
    for source, target in ALLOWED_CYCLE_EDGES:
        with_edge = {**graph, source: graph[source] | {target}}
        assert find_cycles(with_edge), (source, target)


def test_pyproject_ships_every_package():
    """setuptools installs the packages it is told about, not the folders on disk."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["packages"]
    on_disk = sorted(
        _module_name(p)
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("__init__.py")
        if "__pycache__" not in p.parts
    )
    assert sorted(declared) == on_disk


# ---------------------------------------------------------------- the rules, in real processes

LOADED = (
    "import importlib, json, pkgutil, sys\n"
    "package = importlib.import_module(sys.argv[1])\n"
    "for m in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
    "    importlib.import_module(m.name)\n"
    "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
    "('torch', 'instrument'))))\n"
)


@pytest.mark.parametrize("package", sorted(TORCH_FREE))
def test_the_torch_free_layers_import_no_torch(package):
    """Every module of the base, the analysis and the command, imported in a fresh process:
    no torch (the command starts without torch's seconds; the helper process never has it)."""
    out = _proc.run("-c", LOADED, package)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert TORCH_FREE[package] in loaded, loaded
    assert not [m for m in loaded if m.split(".")[0] == "torch"], loaded
    if package != "instrument.cli":  # (the command reads a setting or two of the runtime's)
        above = [m for m in loaded if m.startswith(("instrument.export", "instrument.cli"))]
        assert not above, above


def test_the_analysis_helper_process_runs_the_real_package_face_and_no_torch(tmp_path):
    """The helper starts as it always does (``_command``: its flags, environment and ``/`` as
    its directory), with no stand-in for ``instrument/__init__``: the face is lazy. Then it
    shapes and analyzes a small trace, and says what it imported."""
    from instrument.export.analysis_process import _command

    trace = tmp_path / "window.pt.trace.json"
    trace.write_text(
        json.dumps(
            {
                "baseTimeNanoseconds": 1_765_000_000_000_000_000,
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "mm",
                        "pid": 1,
                        "tid": 1,
                        "ts": 10.0,
                        "dur": 5.0,
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    argv, env = _command()
    report = (
        "import json, sys\n"
        "from instrument.export.analysis_process import shape_and_analyze\n"
        f"analysis = shape_and_analyze({str(trace)!r}, frozenset({{'mm'}}), {{}}, None)\n"
        "import instrument\n"
        "print(json.dumps({'face': instrument.__file__, 'analysis': type(analysis).__module__,\n"
        "    'modules': sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'instrument'))}), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [*argv[:-1], argv[-1] + report],
        env=env,
        cwd="/",
        stdin=subprocess.DEVNULL,  # the helper's loop ends at once: its input is closed
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stderr.decode().strip().splitlines()[-1])
    assert said["face"] == str(ROOT / "instrument" / "__init__.py"), said
    assert said["analysis"] == "instrument.analysis.analyze", said
    assert not [m for m in said["modules"] if m.split(".")[0] == "torch"], said
