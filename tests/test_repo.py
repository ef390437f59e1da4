"""The repository's promises to a new user: the two README commands, the demo, the layout."""

from __future__ import annotations

import gzip
import json
import os
import re

import pytest

from tests import _early, _proc
from tests._proc import REPO


def _readme_commands() -> list[str]:
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)[:2]


def test_readme_opens_with_demo_and_test_commands_and_ci_runs_the_second():
    demo, tests = _readme_commands()
    assert "examples/01_matmul_bias.py" in demo
    assert "pytest" in tests
    assert "constraints.txt" in demo and "constraints.txt" in tests
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    command_lines = [ln for ln in ci.splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    # the README's test command last; before it only the services the tests start: Debian's
    # Prometheus server, Debian's Chromium (the HTML report) and Arize Phoenix (the end-to-end
    # OpenTelemetry test)
    assert command_lines[-1] == tests

    def installs_a_service(line: str) -> bool:
        line = line.strip()
        return (
            "phoenix" in line.lower()
            or "prometheus" in line
            or "chromium" in line
            or line in ("apt-get update -q", "fi")
        )

    assert all(installs_a_service(ln) for ln in command_lines[:-1]), command_lines
    assert "torch==2.13.0" in open(os.path.join(REPO, "constraints.txt")).read()


def test_layout_and_typing_marker():
    for path in (
        "pyproject.toml",
        "instrument",
        "exporters",
        "tests",
        "examples",
        "bench",
        "CHANGELOG.md",
        "README.md",
        "BENCHMARKS.md",
        "docs/configuration.md",
        "bench/README.md",
        "instrument/py.typed",
        "exporters/py.typed",
    ):
        assert os.path.exists(os.path.join(REPO, path)), path
    changelog = open(os.path.join(REPO, "CHANGELOG.md")).read()
    assert "## [Unreleased]" in changelog


def test_public_names():
    import exporters
    import instrument

    for name in ("profiled", "session", "configure", "step", "shutdown", "Schedule"):
        assert name in instrument.__all__ and hasattr(instrument, name)
    for name in (
        "Exporter",
        "ExportResult",
        "ConsoleExporter",
        "TraceFileExporter",
        "InMemoryExporter",
    ):
        assert name in exporters.__all__ and hasattr(exporters, name)


def test_every_env_variable_is_documented_and_the_readme_links_its_page():
    from instrument.runtime.config import ENV_VARS

    configuration = open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8").read()
    for var in ENV_VARS:
        assert f"| `{var}` |" in configuration, var
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert "](docs/configuration.md)" in readme


def test_the_readme_is_short_and_links_every_docs_page():
    """What a newcomer reads in one sitting: the two commands on the first screen, then a short
    tour; the reference lives in docs/, each page linked from the README, and each page's
    links to the repository's files resolve."""
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    lines = readme.splitlines()
    assert len(lines) <= 300, len(lines)
    first_screen = "\n".join(lines[:40])
    demo, tests = _readme_commands()
    assert demo in first_screen and tests in first_screen
    pages = sorted(n for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md"))
    assert "configuration.md" in pages and "README.md" in pages
    for name in pages:
        if name != "README.md":
            assert f"](docs/{name})" in readme, name
    for path in ["README.md", *(os.path.join("docs", n) for n in pages), "bench/README.md"]:
        text = open(os.path.join(REPO, path), encoding="utf-8").read()
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(path), target))
            assert os.path.exists(resolved), f"{path} links {target}, which does not exist"


def test_the_bench_index_names_every_script_and_no_script_is_named_after_an_issue():
    bench = os.path.join(REPO, "bench")
    index = open(os.path.join(bench, "README.md"), encoding="utf-8").read()
    scripts = [n for n in os.listdir(bench) if n.endswith((".py", ".sh"))]
    scripts += [f"gpu/{n}" for n in os.listdir(os.path.join(bench, "gpu"))]
    assert scripts
    for name in scripts:
        assert f"`{name}`" in index, name
        assert not re.search(r"issues?_?\d", name), name
    # the GPU shell scripts in one place
    assert not [n for n in os.listdir(bench) if n.endswith(".sh")]


_early.add(
    __name__,
    "test_seed_demo_runs_and_writes_loadable_traces",
    os.path.join(REPO, "examples", "01_matmul_bias.py"),
    env=_proc.sdk_env(),
    timeout=300,
)


def test_seed_demo_runs_and_writes_loadable_traces(request):
    out, tmp_path = _early.result(request)  # examples/01_matmul_bias.py, from an empty directory
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("matmul_bias ") == 2  # the two sizes are announced on stdout
    tables = out.stderr.count("@profiled range")
    assert tables == 2, out.stderr
    assert out.stderr.count("Self CPU time total:") == 2
    assert "no table" not in out.stderr
    # the FLOPs line under each table: 2*n^3 per call (the bias add is not a FLOP counted)
    per_call = re.findall(r"^  matmul_bias: ([\d.]+) ([kMG])FLOP per call", out.stderr, re.M)
    assert [float(v) * {"k": 1e3, "M": 1e6, "G": 1e9}[u] for v, u in per_call] == pytest.approx(
        [2 * 64**3, 2 * 1024**3], rel=0.01
    )
    files = sorted(os.listdir(tmp_path / "profiled_traces"))
    assert len(files) == 2 and all(f.endswith(".pt.trace.json.gz") for f in files)
    for name in files:
        raw = gzip.open(tmp_path / "profiled_traces" / name, "rt").read()
        trace = json.loads(raw)
        assert trace["traceEvents"]
        assert any(
            e.get("cat") == "user_annotation" and e.get("name") == "matmul_bias"
            for e in trace["traceEvents"]
        )
        assert trace["distributedInfo"]["rank"] == 0
        assert re.search(r'"rank":\s+(\d+)', raw)
        assert f"Trace: ./profiled_traces/{name}" in out.stderr
