"""A warning about the JSON-lines path is one the user can act on (issue 29, item 6).

It pointed at ``torch-profiled:0:`` (no such file), and for some bad paths said only that "a
metrics record was not appended". A real program with a bad ``PROFILED_JSON_PATH`` each: one
warning, at a real file and line, naming the path, why it failed and what happens now; and a
filter on the warning's module silences it.
"""

from __future__ import annotations

import os
import re

import pytest

from tests import _proc

PROGRAM = r"""
import torch
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

for _ in range(20):
    work(torch.zeros(2))
print("done")
"""

LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+): ExporterWarning: (?P<message>.*)$")


def _env(json_path: str) -> dict[str, str]:
    return _proc.sdk_env(
        PROFILED_EXPORTERS="json",
        PROFILED_JSON_PATH=json_path,
        PROFILED_SAMPLE_RATE="0",  # metrics records only: no profiler window
        PROFILED_METRICS="1",
    )


def _setup(tmp_path, case: str) -> tuple[str, str]:
    """A bad path of kind ``case`` and what the warning must say about it."""
    if case == "directory":
        (tmp_path / "reports").mkdir()
        return "reports", "is a directory"
    if case == "under a file":
        (tmp_path / "f").write_text("x")
        return "f/sub/m.jsonl", f"{str(tmp_path / 'f')!r} is a regular file, not a directory"
    if case == "a file as its directory":
        (tmp_path / "f").write_text("x")
        return "f/m.jsonl", f"{str(tmp_path / 'f')!r} is a regular file, not a directory"
    assert case == "fifo"
    os.mkfifo(tmp_path / "pipe")
    return str(tmp_path / "pipe"), "is a named pipe (FIFO)"


CASES = ["directory", "under a file", "a file as its directory", "fifo"]


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """Every program of this module (each its own process in a directory set up by
    ``_setup``, as before), run two at a time as the module starts; a test reads its own."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        ahead.bad_paths = {}  # key -> the path and what the warning must say about it

        def add(key, case, *options):
            cwd = ahead.directory(key)
            if cwd is not None:
                path, why = ahead.bad_paths[key] = _setup(cwd, case)
                ahead.add(key, *options, "prog.py", env=_env(path), files={"prog.py": PROGRAM})

        for case in CASES:
            add(f"test_a_bad_json_path_warns_once_at_a_real_line_saying_why[{case}]", case)
        add(
            "test_the_warnings_module_is_a_real_one_that_a_filter_can_name",
            "directory",
            *("-W", "ignore:::exporters.json_lines"),
        )
        yield ahead


@pytest.mark.parametrize("case", CASES)
def test_a_bad_json_path_warns_once_at_a_real_line_saying_why(ahead, request, case):
    out, _tmp_path = ahead[request.node.name]  # PROGRAM with the bad path ``_setup`` made
    path, why = ahead.bad_paths[request.node.name]
    assert out.returncode == 0 and out.stdout == "done\n", out.stderr
    found = [m for line in out.stderr.splitlines() if (m := LOCATION.match(line))]
    assert len(found) == 1, out.stderr  # once, however many records
    where, message = found[0], found[0]["message"]
    assert where["file"] != "torch-profiled" and os.path.isfile(where["file"])
    assert int(where["line"]) > 0
    assert repr(path) in message and why in message
    assert "PROFILED_JSON_PATH" in message and "'-' for standard output" in message
    assert "nor are later ones" in message or "Later ones are tried again" in message


def test_the_warnings_module_is_a_real_one_that_a_filter_can_name(ahead, request):
    out, _tmp_path = ahead[request.node.name]  # a directory as the path; -W ignore:::...
    assert out.returncode == 0 and out.stdout == "done\n", out.stderr
    assert "ExporterWarning" not in out.stderr, out.stderr
