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


# Longer than these is hard to read in one go (issue 16); an exception names its reason here.
FUNCTION_LINES = 60
CLASS_LINES = 260
LONGER_ON_PURPOSE = {
    # one loop over every host event of a window (100k+): closing a frame is inlined because a
    # call per event would cost more than the loop's own work
    ("instrument/analysis/analyze.py", "_walk_thread"): 70,
}


def test_functions_and_classes_stay_short():
    too_long = []
    for package in ("instrument", "exporters"):
        for path in sorted((Path(REPO) / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    limit = FUNCTION_LINES
                elif isinstance(node, ast.ClassDef):
                    limit = CLASS_LINES
                else:
                    continue
                limit = LONGER_ON_PURPOSE.get((rel, node.name), limit)
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    too_long.append(f"{rel}: {node.name} is {lines} lines (at most {limit})")
    assert not too_long, "split these, or say in LONGER_ON_PURPOSE why not:\n" + "\n".join(too_long)


def test_the_session_module_keeps_only_the_lock_stepping_and_the_api():
    # "about 300 lines" (issue 16)
    # the rest lives in its rooms (planner, window, stops, reporting, state, lifetime)
    lines = (
        (Path(REPO) / "instrument" / "runtime" / "profiling_session.py")
        .read_text(encoding="utf-8")
        .count("\n")
    )
    assert lines <= 315, (
        f"instrument/runtime/profiling_session.py has {lines} lines; move a responsibility out"
    )
