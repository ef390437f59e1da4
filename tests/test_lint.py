"""The code stays clean under the linter and the type checker the project configures
(``[tool.ruff]`` and ``[tool.mypy]`` in pyproject.toml; both come with the dev extra): a
finding, or a file `ruff format` would change, fails the suite with the tool's own report."""

from __future__ import annotations

import subprocess
import sys

from tests._proc import REPO


def _tool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


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
    out = _tool("mypy", "--cache-dir", str(tmp_path / "cache"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout
