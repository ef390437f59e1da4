"""The code stays clean under the linter and the type checker the project configures
(``[tool.ruff]`` and ``[tool.mypy]`` in pyproject.toml; both come with the dev extra): a
finding, or a file `ruff format` would change, fails the suite with the tool's own report."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests._proc import REPO


def _tool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


# mypy's whole-program check (~15 s of one core, torch's stubs included) reads only the SDK's
# files: ``tests/conftest.py`` starts it as the run starts (``start_early``), at the lowest
# priority, so that it takes the core the other tests leave idle; its test reads the result.
_EARLY: dict[str, tuple[subprocess.Popen, str]] = {}
MYPY_TEST = "test_mypy_finds_nothing_in_the_sdk"


def start_early(items) -> None:
    """Start mypy (into a cache directory of its own, as its test does) if its test runs."""
    if any(item.name == MYPY_TEST and item.module is sys.modules[__name__] for item in items):
        cache = tempfile.mkdtemp(prefix="mypy-cache-")
        proc = subprocess.Popen(
            [sys.executable, "-m", "mypy", "--cache-dir", cache],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=(lambda: os.nice(19)) if hasattr(os, "nice") else None,
        )
        _EARLY["mypy"] = (proc, cache)


def stop_early() -> None:
    """At the run's end: a check started early whose test never ran is ended."""
    for proc, cache in _EARLY.values():
        proc.kill()
        proc.wait()
        shutil.rmtree(cache, ignore_errors=True)
    _EARLY.clear()


def test_ruff_finds_nothing():
    out = _tool("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_would_change_nothing():
    out = _tool("ruff", "format", "--check", "--no-cache", ".")
    assert out.returncode == 0, (
        out.stdout + out.stderr + "\nrun `ruff format .` and commit the result"
    )


def test_mypy_finds_nothing_in_the_sdk(tmp_path):
    # the files, the Python version and the settings come from pyproject.toml
    early = _EARLY.pop("mypy", None)
    if early is None:  # not started with the run (the test run on its own, say)
        out = _tool("mypy", "--cache-dir", str(tmp_path / "cache"))
        returncode, stdout, stderr = out.returncode, out.stdout, out.stderr
    else:
        proc, cache = early
        try:
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            proc.kill()
            shutil.rmtree(cache, ignore_errors=True)
        returncode = proc.returncode
    assert returncode == 0, stdout + stderr
    assert "Success" in stdout


# A function longer than this is hard to read in one go (issue 16's rule; today's longest but
# the one below is 60 lines); an exception names its reason here.
FUNCTION_LINES = 60
LONGER_ON_PURPOSE = {
    # one loop over every host event of a window (100k+): closing a frame is inlined because a
    # call per event would cost more than the loop's own work
    ("instrument/analysis/analyze.py", "_walk_thread"): 70,
}

# A class is judged by its decision points, not its lines (which count its docstrings and
# comments too: a line limit taxes documentation, and one set at today's longest class pinned
# it). Decision points: each ``if``/``elif``, loop, ``except``, conditional expression,
# comprehension ``for``/``if``, ``match`` case, and each ``and``/``or`` beyond the first operand,
# in the class's methods (nested functions included). Today the most branched classes are
# window.Windows (67), sessions.Session (53), planner.WindowPlanner (48): 90 leaves room to
# grow, while two rooms merged into one (Windows and Stops: 102) fail.
CLASS_DECISIONS = 90
# The session keeps only the lock, the stepping and the API (issue 16); its parts live in their
# rooms (planner, window, stops, reporting, state, lifetime). Session has 53 today: 70 leaves
# room for the API to grow, while any room moved back in (Stops' 35, WindowPlanner's 48) fails.
SESSION_DECISIONS = 70

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.IfExp, ast.match_case)


def decisions(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The decision points of one function's own body (a nested function counts for itself)."""
    count = 0
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, _BRANCHES):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        todo.extend(ast.iter_child_nodes(node))
    return count


def class_decisions(cls: ast.ClassDef) -> int:
    return sum(
        decisions(node)
        for node in ast.walk(cls)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


def _sdk_trees():
    for package in ("instrument", "exporters"):
        for path in sorted((Path(REPO) / package).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def test_the_decision_count_sees_each_kind_of_branch():
    code = """
def f(xs):
    if xs and xs[0] or not xs:
        pass
    elif len(xs) > 3:
        pass
    for x in xs:
        while x:
            x = x - 1 if x else 0
    try:
        pass
    except ValueError:
        pass
    def inner():
        if xs:
            pass
    return [x for x in xs if x]
"""
    (f,) = ast.parse(code).body
    # if, 2 for the and/or, elif, for, while, the conditional, except, the comprehension's
    # for and if (inner's own if is not f's)
    assert decisions(f) == 10


def test_functions_stay_short_and_classes_simple():
    found = []
    for rel, tree in _sdk_trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = LONGER_ON_PURPOSE.get((rel, node.name), FUNCTION_LINES)
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{rel}: {node.name} is {lines} lines (at most {limit})")
            elif isinstance(node, ast.ClassDef):
                points = class_decisions(node)
                if points > CLASS_DECISIONS:
                    found.append(
                        f"{rel}: class {node.name} has {points} decision points "
                        f"(at most {CLASS_DECISIONS})"
                    )
    assert not found, "split these, or say in LONGER_ON_PURPOSE why not:\n" + "\n".join(found)


def test_the_session_keeps_only_the_lock_stepping_and_the_api():
    (session,) = [  # wherever its module lives
        node
        for rel, tree in _sdk_trees()
        if rel.startswith("instrument/")
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.name == "Session"
        and not any(isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases)
    ]  # (state.Session is a protocol naming it)
    points = class_decisions(session)
    assert points <= SESSION_DECISIONS, (
        f"Session has {points} decision points (at most {SESSION_DECISIONS}): move a "
        "responsibility out to its room"
    )
