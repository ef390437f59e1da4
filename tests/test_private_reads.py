"""Tests observe the SDK through its public face (``Session.status()``, ``instrument.testing``,
reports, exporters' output); every private name a test still touches is listed in
``ALLOWED`` with its reason, and a new one fails this test.

The rule, applied to the syntax tree of every ``tests/*.py`` file and of every string in them
that parses as a Python program containing an ``import`` (the programs tests run in a child
process), counts one *private access* for each:

- attribute ``a._x`` (one leading underscore, not a dunder), read or written, unless the chain
  starts at ``self`` or ``cls`` (a test's own class), or at a name the file binds by importing
  something other than ``instrument`` or ``exporters`` (``torch._C``, ``os._exit``: not ours),
  or ``_x`` is a named tuple's public method (``_replace``, ``_asdict``, ``_fields``, ``_make``);
- ``setattr`` / ``getattr`` / ``delattr`` / ``hasattr`` (``monkeypatch.setattr`` included) given
  a literal name ``"_x"``: the same access spelt as a string;
- ``from instrument... import _x`` / ``from exporters... import _x`` where ``_x`` is not a module
  (a name kept inside its module).

A module whose own name starts with ``_`` (``instrument/_torch.py``, ``exporters/_format.py``)
is private to the packages, not to their tests: its public names are the rooms' interface to
one another, which unit tests call and fault-injection tests replace; moving such a module
changes a test's import line, not its body. So ``from instrument import _torch`` and
``_torch.ProfilerWindow`` count nothing, ``_torch._LIVE`` counts one.

``ALLOWED`` maps ``(file, source text of the access)`` to ``(how many, why)``: the count must
match exactly, so a new access fails here, and so does a stale entry once an access is gone.
"""

from __future__ import annotations

import ast
import collections
import sys
import textwrap
from pathlib import Path

from tests._proc import REPO

OURS = ("instrument", "exporters")
NAMED_TUPLE = frozenset({"_replace", "_asdict", "_fields", "_make"})
BY_NAME = frozenset({"setattr", "getattr", "delattr", "hasattr"})
# a test's own class, and the standard library's modules (a program in a string may be a
# fragment whose imports are in another string)
NOT_OURS = frozenset({"self", "cls", "torch", *sys.stdlib_module_names})

ALLOWED: dict[tuple[str, str, str], tuple[int, str]] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(package: str, name: str) -> bool:
    base = Path(REPO, *package.split("."), name)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _foreign_names(tree: ast.AST) -> set[str]:
    """Names the program binds by importing something that is not ours."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in OURS:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in OURS:
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _accesses(tree: ast.AST) -> list[tuple[str, str]]:
    """(kind, source text) of each private access in ``tree``: ``read`` (a value read),
    ``call`` (a private function called, or imported to be), ``patch`` (replaced: an
    assignment, ``setattr``)."""
    foreign = _foreign_names(tree) | NOT_OURS
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            text = ast.unparse(node)
            if (
                node.attr not in NAMED_TUPLE
                and _root(node.value) not in foreign
                and not _is_module(*text.rsplit(".", 1))  # exporters._format: a module
            ):
                if not isinstance(node.ctx, ast.Load):
                    kind = "patch"
                else:
                    kind = "call" if id(node) in called else "read"
                found.append((kind, text))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            key = node.args[1]
            if (
                name in BY_NAME
                and isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and _private(key.value)
                and _root(node.args[0]) not in foreign
            ):
                kind = "patch" if name in ("setattr", "delattr") else "read"
                found.append((kind, f"{ast.unparse(node.args[0])}.{key.value}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in OURS:
                for alias in node.names:
                    if _private(alias.name) and not _is_module(node.module, alias.name):
                        found.append(("call", f"from {node.module} import {alias.name}"))
    return found


def _programs(tree: ast.AST) -> list[ast.AST]:
    """The strings of a test file that parse as a program with an import."""
    programs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "import" in node.value and "\n" in node.value:
                try:
                    programs.append(ast.parse(textwrap.dedent(node.value)))
                except SyntaxError:
                    continue
    return programs


def private_accesses() -> collections.Counter[tuple[str, str, str]]:
    """How many times each (file, kind, source text) occurs in the tests."""
    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for path in sorted(Path(REPO, "tests").glob("*.py")):
        if path.name == Path(__file__).name:  # its examples of the rule
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for part in (tree, *_programs(tree)):
            counts.update((path.name, kind, text) for kind, text in _accesses(part))
    return counts


def test_the_rule_sees_each_form_and_skips_what_is_not_ours():
    program = textwrap.dedent(
        """
        import os, torch
        from instrument import _torch, decorator, state
        from instrument.lifetime import _builtin_kwargs
        from exporters._format import fit

        class Fake:
            def go(self):
                return self._sock
        os._exit(0)
        torch.autograd.profiler._is_profiler_enabled
        report._replace(steps=())
        _torch.ProfilerWindow
        sess._stops.draining
        decorator._IDLE
        monkeypatch.setattr(state, "_write", None)
        monkeypatch.setattr(torch, "_x", None)
        """
    )
    assert sorted(_accesses(ast.parse(program))) == [
        ("call", "from instrument.lifetime import _builtin_kwargs"),
        ("patch", "state._write"),
        ("read", "decorator._IDLE"),
        ("read", "sess._stops"),
    ]


def test_private_accesses_in_tests_are_the_allowed_ones():
    found = private_accesses()
    allowed = {key: count for key, (count, _why) in ALLOWED.items()}
    new = {k: n for k, n in found.items() if n > allowed.get(k, 0)}
    stale = {k: n for k, n in allowed.items() if found.get(k, 0) < n}
    assert not new and not stale, (
        f"{sum(found.values())} private accesses in tests, {sum(allowed.values())} allowed.\n"
        f"new (read the SDK's public face instead: Session.status(), instrument.testing; or "
        f"add to ALLOWED with the reason): {new}\n"
        f"stale (fewer than ALLOWED says: lower the entry): {stale}"
    )
