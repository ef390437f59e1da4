"""Tests observe the SDK through its public face (``Session.status()``, ``instrument.testing``,
reports, exporters' output); every private name a test still touches is listed in
``ALLOWED`` with its reason, and a new one fails this test.

The rule, applied to the syntax tree of every ``tests/*.py`` file and of every multi-line string
in them that parses as a Python program containing an ``import`` (the programs tests run in a
child process; a template that parses only once filled in is not read), counts one *private
access* for each:

- attribute ``a._x`` (one leading underscore, not a dunder), read or written, unless the chain
  starts at ``self`` or ``cls`` (a test's own class), at a name the file binds by importing
  something other than ``instrument`` or ``exporters``, or at ``torch`` or a standard-library
  module's name (``torch._C``, ``os._exit``: not ours; a program in a string may be a fragment
  whose imports are in another), or ``_x`` is a named tuple's public method (``_replace``,
  ``_asdict``, ``_fields``, ``_make``);
- ``setattr`` / ``getattr`` / ``delattr`` / ``hasattr`` (``monkeypatch.setattr`` included) given
  a literal name ``"_x"``: the same access spelt as a string;
- ``from instrument... import _x`` / ``from exporters... import _x`` where ``_x`` is not a module
  (a name kept inside its module), recorded as ``import _x`` (a module's move to another
  package leaves the entry as it is).

A module whose own name starts with ``_`` (``instrument/_torch.py``, ``exporters/_format.py``)
is private to the packages, not to their tests: its public names are the rooms' interface to
one another, which unit tests call and fault-injection tests replace; moving such a module
changes a test's import line, not its body. So ``from instrument import _torch`` and
``_torch.ProfilerWindow`` count nothing, ``_torch._LIVE`` counts one.

Each access is a ``read`` (a value read), a ``call`` (a private function called, or imported to
be) or a ``patch`` (replaced: an assignment, ``setattr``). ``ALLOWED`` maps ``(file, kind,
source text)`` to ``(how many, why)``: the count must match exactly, so a new access fails
here, and so does a stale entry once an access is gone. When this was written, tests held 185
private accesses by this rule (124 reads, 42 calls, 19 patches), most of them reads of a
session's parts and of the decorator's flags; what is left is below, each with its reason.
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

# A test that reaches inside names what no public face shows; grouped by why.
_TORCH_OBJECT = (
    "the window's own torch profiler object: the only place that shows what torch's stop was "
    "asked (no device-wide synchronisation) and what it recorded past the window's end"
)
_CLOCK = "the decorator's clock, scripted: exact durations through each call form"
_RACE = "the interleaving under test is forced by wrapping or holding the private step it names"
_UNIT = "unit test of this private function: its rule, fed edge cases directly"
_RAWTRACES = "this process's raw-trace bookkeeping, emptied under a temporary directory"
_HELPER = "a fresh shared analysis helper per test (a helper given up stays given up)"

ALLOWED: dict[tuple[str, str, str], tuple[int, str]] = {
    # -- reads
    ("test_analysis.py", "read", "window._prof"): (
        1,
        "torch's key_averages() of the same window: the reference our analysis must agree with",
    ),
    ("test_analysis_process.py", "read", "helper._lock"): (
        1,
        "a window ending while the helper is stopped: its request lock held, as then",
    ),
    ("test_call_forms.py", "read", "decorator._BLOCK_NAMES"): (
        1,
        "the bound of the block-name cache (memory): no call shows it",
    ),
    ("test_call_forms.py", "read", "decorator._returns_none"): (1, _UNIT),
    ("test_cuda.py", "read", "sess._stops"): (1, _TORCH_OBJECT),
    ("test_cuda.py", "read", "deferred_window._prof"): (1, _TORCH_OBJECT),
    ("test_deferred_stop.py", "read", "window._prof"): (3, _TORCH_OBJECT),
    ("test_deferred_stop.py", "read", "state._write"): (1, _RACE),
    ("test_first_window.py", "read", "sess._planner"): (
        1,
        "the slow-step rule's own sample: which steps entered its median shows nowhere else",
    ),
    ("test_metrics.py", "read", "metrics._fold"): (1, _UNIT),
    ("test_never_crash.py", "read", "_torch._orphans"): (
        2,
        "a range that outlived its window is kept, never ended in C++, and freed once no "
        "profiler is on: only the kept list shows it (memory, no crash)",
    ),
    ("test_never_crash.py", "read", "_torch._range_lock"): (1, _RACE),
    ("test_otel.py", "read", "exporter._own"): (
        1,
        "with the OpenTelemetry SDK disabled the exporter builds no provider of its own",
    ),
    ("test_prometheus_endpoint.py", "read", "exporter._server"): (
        1,
        "the endpoint's socket, swapped for one whose accept() fails once",
    ),
    ("test_session.py", "read", "s._windows"): (
        6,
        "a session that records its warm-up, as one with a device does, on a CPU-only machine; "
        "and its window object, whose torch profiler shows what the warm-up recorded",
    ),
    ("test_session.py", "read", "state.ambient._windows"): (
        2,
        "the ambient session made to record its warm-up, and its window object (as above)",
    ),
    ("test_session.py", "read", "window._prof"): (1, _TORCH_OBJECT),
    ("test_trace_before_next_start.py", "read", "reporting._PENDING"): (
        3,
        "windows whose trace is still being written: none held once reports are built, and "
        "one seeded before a fork (the child must not wait for it)",
    ),
    ("test_trace_before_next_start.py", "read", "reporting._PENDING_LOCK"): (1, _RACE),
    # -- calls of private functions
    ("test_analysis_process.py", "call", "import _command"): (
        1,
        "the helper's command line and environment, checked before any helper starts",
    ),
    ("test_layers.py", "call", "import _command"): (
        1,
        "the helper started exactly as in production, to see which package face it imports",
    ),
    ("test_analysis_process.py", "call", "helper._start"): (
        1,
        "the helper started by itself, to ask whether its imports reached torch",
    ),
    ("test_first_window.py", "call", "_torch._inductor_left_alone"): (1, _RACE),
    ("test_health.py", "call", "import _window_attributes"): (
        1,
        "the window span's attributes without an OpenTelemetry SDK pipeline",
    ),
    ("test_slow_step.py", "call", "import _window_attributes"): (
        1,
        "the window span's attributes without an OpenTelemetry SDK pipeline",
    ),
    ("test_html_report.py", "call", "cli._reports"): (
        1,
        "the page's rank table against the CLI's own reading of the same directory",
    ),
    ("test_html_report.py", "call", "traces._side"): (
        2,
        "the page's diff against the CLI's own reading of the same two inputs",
    ),
    ("test_json_lines.py", "call", "import _builtin_kwargs"): (
        1,
        "what the environment gives the built-in exporters, without a session's run",
    ),
    ("test_trigger_never_kills.py", "call", "triggers._system_handler"): (
        3,
        "the C-level handler under a Python one (faulthandler): signal.getsignal cannot see it",
    ),
    # -- patches
    ("test_analysis_process.py", "patch", "analysis_process._shared"): (3, _HELPER),
    ("test_call_forms.py", "patch", "decorator._BLOCK_NAMES_MAX"): (
        1,
        "the block-name cache's bound, made small",
    ),
    ("test_call_forms.py", "patch", "decorator._now"): (2, _CLOCK),
    ("test_metrics.py", "patch", "decorator._now"): (2, _CLOCK),
    ("test_deferred_stop.py", "patch", "state._write"): (1, _RACE),
    ("test_exporters.py", "patch", "r.ranges._data"): (
        1,
        "the report's read-only mapping refuses a write to its private store too",
    ),
    ("test_otel.py", "patch", "exporter._meter_provider"): (
        1,
        "an in-memory metric reader in place of the exporter's OTLP one",
    ),
    ("test_rawtraces.py", "patch", "rawtraces._dir"): (1, _RAWTRACES),
    ("test_rawtraces.py", "patch", "rawtraces._live"): (1, _RAWTRACES),
    ("test_rawtraces.py", "patch", "rawtraces._cleaned"): (1, _RAWTRACES),
    ("test_rawtraces.py", "patch", "rawtraces._warned"): (1, _RAWTRACES),
    ("test_rawtraces.py", "patch", "rawtraces._owner"): (1, _RAWTRACES),
    ("test_trace_before_next_start.py", "patch", "reporting._let_the_queue_refill"): (
        2,
        "a slow export worker, so that the race under test is real",
    ),
}


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
                        found.append(("call", f"import {alias.name}"))
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
        from instrument.runtime import _torch, decorator, state
        from instrument.runtime.lifetime import _builtin_kwargs
        from instrument.base.formatting import fit

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
        decorator._returns_none(f)
        s._record_warmup = True
        """
    )
    assert sorted(_accesses(ast.parse(program))) == [
        ("call", "decorator._returns_none"),
        ("call", "import _builtin_kwargs"),
        ("patch", "s._record_warmup"),
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
